"""Holders: which lines of the user's code hold (or asked for) the most memory.

A holder (formerly a *site*) is the first frame outside torch and the interpreter
(`frames.user_frame`). Live holders
group the allocated blocks of a snapshot; trace holders group the `alloc` entries of the recorded
history, so a line that allocated and freed a lot shows up even when it holds nothing at the end.
The report, `gpumemviz diff` and the panel all rank holders this way.

`holder_rows` answers "who holds it" along one of `HOLDER_KEYS`: the user's frame, the whole
call path, the `user_metadata` torch recorded with the block's alloc entry, the `annotate`
entries naming the block, its stream or its pool. Every allocated block lands in exactly one
row (key None where the block lacks that information), so the rows' bytes sum to allocated.
The metadata of a live block comes from the trace: the last ``alloc`` entry at its address not
followed by a free (and the ``annotate`` entries after it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpumemviz.analysis.frames import (
    UserFrames,
    format_frame,
    frame_fields,
    is_interpreter_frame,
    is_torch_frame,
)
from gpumemviz.io import SnapshotLike, as_snapshot
from gpumemviz.snapshot import ACTIONS, ALLOCATED, Snapshot
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.schema import TorchDict
from gpumemviz.snapshot.tables import Trace

__all__ = [
    "HOLDER_KEYS",
    "NOT_RECORDED",
    "NO_STACK",
    "NO_USER_FRAME",
    "N_TOP",
    "UNKNOWN_LINE",
    "CallPaths",
    "Holder",
    "HolderKey",
    "HolderRow",
    "call_path",
    "frame_key",
    "holder_rows",
    "live_holders",
    "live_links",
    "metadata_text",
    "trace_holders",
]

N_TOP = 10
NO_STACK = "(no stack recorded)"
NO_USER_FRAME = "(no frame outside torch)"  # e.g. the autograd engine's own thread
UNKNOWN_LINE = -1  # a site's key line where the frame's line is not an int (`frames.UNKNOWN`)


@dataclass(frozen=True, eq=False)
class Holder:
    """One allocation site and what it accounts for.

    `key` is `(filename, line, name)` of the user's frame (`frames.frame_fields`; a line that
    is not an int is `UNKNOWN_LINE`), or `(label, 0, "")` for the two catch-alls (`NO_STACK`,
    `NO_USER_FRAME`). `indices` are the blocks (live holders: indices
    into `Snapshot.blocks`) or trace entries (trace holders: indices into that device's trace)
    that make up `bytes`.
    """

    key: tuple[str, int, str]
    label: str
    frame: TorchDict | None
    bytes: int
    count: int
    indices: np.ndarray

    def to_dict(self) -> dict[str, str | int | None]:
        """JSON-ready: label, filename, line, name, bytes, count (line None where unknown)."""
        filename, line, name = self.key
        return {
            "label": self.label,
            "filename": filename if self.frame is not None else None,
            "line": line if self.frame is not None and line != UNKNOWN_LINE else None,
            "name": name if self.frame is not None else None,
            "bytes": self.bytes,
            "count": self.count,
        }


def _group(
    frames_of: Sequence[list[TorchDict]], rows: np.ndarray, nbytes: np.ndarray, top: int | None
) -> list[Holder]:
    """Group `rows` (with `nbytes` each) by the user frame of `frames_of[row]`."""
    by_list: dict[int, int] = {}  # id(frames list) -> group; frames lists are shared
    keys: dict[tuple[str, int, str], int] = {}
    info: list[tuple[tuple[str, int, str], str, TorchDict | None]] = []
    group = np.empty(len(rows), np.int64)
    user_frame = UserFrames()  # each distinct frame judged once: traces share their frames
    for j, r in enumerate(rows.tolist()):
        fr = frames_of[r]
        g = by_list.get(id(fr))
        if g is None:
            f = user_frame(fr) if fr else None
            if f is not None:
                filename, line, name = frame_fields(f)
                key = (filename, UNKNOWN_LINE if line is None else line, name)
                label = format_frame(f)
            else:
                label = NO_USER_FRAME if fr else NO_STACK
                key = (label, 0, "")
            g = keys.get(key)
            if g is None:
                g = keys[key] = len(info)
                info.append((key, label, f))
            by_list[id(fr)] = g
        group[j] = g
    totals = np.zeros(len(info), np.int64)
    np.add.at(totals, group, nbytes)  # exact int64 sums (bincount's weights are float64)
    counts = np.bincount(group, minlength=len(info))
    order = sorted(range(len(info)), key=lambda g: (-int(totals[g]), info[g][0]))
    if top is not None:
        order = order[:top]
    member = np.argsort(group, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [
        Holder(
            key=info[g][0],
            label=info[g][1],
            frame=info[g][2],
            bytes=int(totals[g]),
            count=int(counts[g]),
            indices=rows[member[starts[g] : starts[g + 1]]],
        )
        for g in order
    ]


def live_holders(
    snapshot: SnapshotLike, *, device: int | None = None, top: int | None = N_TOP
) -> list[Holder]:
    """The allocated blocks grouped by allocation site, most bytes first.

    Parameters
    ----------
    snapshot : Snapshot, torch dict or list, path or bytes
        Anything `gpumemviz.io.as_snapshot` accepts.
    device : int, optional
        Only this device's blocks (default: all devices).
    top : int or None
        How many holders to return (None: all).

    Returns
    -------
    list of Holder
        `bytes` is the sum of the block sizes (active_allocated blocks only: pending frees are
        already released by the user); ties are broken by the site key, so the order is stable.
    """
    snap: Snapshot = as_snapshot(snapshot)
    b = snap.blocks
    mask = b.state == ALLOCATED
    if device is not None:
        mask &= snap.segments.device[b.segment] == device
    rows = np.flatnonzero(mask)
    return _group(snap.block_frames(), rows, b.size[rows], top)


def trace_holders(
    snapshot: SnapshotLike, *, device: int | None = None, top: int | None = N_TOP
) -> list[Holder]:
    """The trace's `alloc` entries grouped by allocation site: bytes asked for over the trace.

    Parameters
    ----------
    snapshot : Snapshot, torch dict or list, path or bytes
        Anything `gpumemviz.io.as_snapshot` accepts.
    device : int, optional
        Which device's trace (default: the device with the longest trace).
    top : int or None
        How many holders to return (None: all).

    Returns
    -------
    list of Holder
        `bytes` sums the entries' `size` (the requested, unrounded bytes torch records);
        `indices` are entry indices in that trace. Empty without recorded history.
    """
    snap: Snapshot = as_snapshot(snapshot)
    if device is None:
        device = max(snap.traces, key=lambda d: (len(snap.traces[d]), -d), default=None)
    trace = snap.traces.get(device) if device is not None else None
    if trace is None or not len(trace):
        return []
    rows = np.flatnonzero(trace.action == ACTIONS.index("alloc"))
    return _group(trace.frames(), rows, trace.size[rows], top)


# ------------------------------------------------------------------------------ holder_rows

#: What `holder_rows` (and `Findings.holders`) group the allocated blocks by.
HOLDER_KEYS = ("frame", "call_path", "user_metadata", "annotation", "stream", "pool")

#: A row's key: "file:line" (frame), a tuple of them from the outermost user frame in
#: (call_path), the metadata text (user_metadata, annotation), the stream, the ``(a, b)`` pool
#: id; None where the block lacks that information.
HolderKey = str | tuple[str, ...] | int | tuple[int, int] | None

NOT_RECORDED = "(not recorded)"  # the label of a None key


@dataclass(frozen=True, eq=False)
class HolderRow:
    """One row of `holder_rows`: the allocated blocks whose `by` is `key`.

    `blocks` are the rows of the grouped state's `Snapshot.blocks` that make up `bytes` (their
    sizes, as `allocated` counts them) and `count`.
    """

    by: str
    key: HolderKey
    bytes: int
    count: int
    blocks: np.ndarray

    @property
    def label(self) -> str:
        """The key for humans: a call path reads "train.py:9 > model.py:3", a pool "pool (1, 0)",
        a None key `NOT_RECORDED`."""
        k = self.key
        if k is None:
            return NOT_RECORDED
        if self.by == "call_path" and isinstance(k, tuple):
            return " > ".join(map(str, k))
        if self.by == "pool" and isinstance(k, tuple):
            return "default pool" if k == (0, 0) else f"pool ({k[0]}, {k[1]})"
        if self.by == "stream":
            return f"stream {k}"
        return str(k)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: key (a tuple as a list), label, bytes, count."""
        key = list(self.key) if isinstance(self.key, tuple) else self.key
        return {"key": key, "label": self.label, "bytes": self.bytes, "count": self.count}


def frame_key(frame: TorchDict) -> str:
    """A frame as a holder key: "filename:line" (the whole filename; "?" for an unknown line).

    >>> frame_key({"filename": "/w/train.py", "line": 88, "name": "step"})
    '/w/train.py:88'
    """
    filename, line, _ = frame_fields(frame)
    return f"{filename}:{'?' if line is None else line}"


def call_path(frames: Sequence[TorchDict]) -> tuple[str, ...] | None:
    """The user frames of a stack (outside torch and the interpreter) as `frame_key`s, from the
    outermost in; None when no frame is the user's.

    >>> call_path([{"filename": "/x/site-packages/torch/nn/m.py", "line": 1, "name": "f"},
    ...            {"filename": "model.py", "line": 3, "name": "forward"},
    ...            {"filename": "train.py", "line": 9, "name": "<module>"}])
    ('train.py:9', 'model.py:3')
    """
    path = tuple(
        frame_key(f)
        for f in reversed(frames)
        if not is_interpreter_frame(f) and not is_torch_frame(f)
    )
    return path or None


class CallPaths:
    """`call_path` over many stacks that share their frame dicts (a fresh list per block over a
    few hundred distinct frames, as torch writes them): each distinct frame object is judged
    and keyed once, then a stack's path is read at C speed by its frames' identities. The
    finder holds every frame it judged, so an identity is never reused while it lives.

    >>> a = {"filename": "/x/site-packages/torch/nn/m.py", "line": 1, "name": "f"}
    >>> b = {"filename": "train.py", "line": 9, "name": "step"}
    >>> paths = CallPaths()
    >>> paths([a, b]), paths([a]), paths([b, a, b])
    (('train.py:9',), None, ('train.py:9', 'train.py:9'))
    """

    def __init__(self) -> None:
        self._judged: list[object] = []  # every frame keyed: its identity stays its own
        self._key: dict[int, str] = {}  # id -> its `frame_key`; "" for torch's, the interpreter's

    def __call__(self, frames: Sequence[TorchDict]) -> tuple[str, ...] | None:
        """`call_path(frames)`."""
        key = self._key
        try:
            path = tuple(filter(None, map(key.__getitem__, map(id, reversed(frames)))))
        except KeyError:  # a frame not seen before: judge the stack's new ones
            for f in frames:
                if id(f) not in key:
                    user = not is_interpreter_frame(f) and not is_torch_frame(f)
                    key[id(f)] = frame_key(f) if user else ""
                    self._judged.append(f)
            path = tuple(filter(None, map(key.__getitem__, map(id, reversed(frames)))))
        return path or None


def metadata_text(value: object) -> str | None:
    """``user_metadata`` (or an annotation) as one text: a string as recorded (torch's default
    "" is none), a dict (newer torch) as sorted JSON; None where nothing was recorded.

    >>> metadata_text(""), metadata_text("fwd"), metadata_text({"phase": "fwd", "layer": 2})
    (None, 'fwd', '{"layer": 2, "phase": "fwd"}')
    """
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and not value:
        return None
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):  # keys of mixed types: still one stable text
        return repr(value)


def live_links(trace: Trace, upto: int | None = None) -> tuple[dict[int, int], dict[int, object]]:
    """Which trace entry made each live block, and its newest annotation.

    Returns ``(alloc, notes)``: address -> index of the ``alloc`` entry of the block still
    allocated there after entry `upto` (None: the whole trace), and address -> the
    ``user_metadata`` of the newest ``annotate`` entry naming the block there (an annotation
    outlives its alloc entry falling out of the ring; a new alloc at the address clears it).

    >>> t = Trace.from_entries([
    ...     {"action": "alloc", "addr": 512, "size": 8, "stream": 0, "user_metadata": "fwd"},
    ...     {"action": "annotate", "addr": 512, "size": 0, "stream": 0, "user_metadata": "w"},
    ...     {"action": "alloc", "addr": 1024, "size": 8, "stream": 0},
    ...     {"action": "free_requested", "addr": 1024, "size": 8, "stream": 0}])
    >>> live_links(t), live_links(t, upto=0)
    (({512: 0}, {512: 'w'}), ({512: 0}, {}))
    """
    names = trace.action_names
    n = len(trace) if upto is None else min(upto + 1, len(trace))
    code = {name: c for c, name in enumerate(names)}
    alloc = code["alloc"]
    frees = {code["free_requested"], code["free_completed"]}
    note = code.get("annotate", -1)
    alloc_at: dict[int, int] = {}
    notes: dict[int, object] = {}
    meta = trace.values("user_metadata") if note >= 0 else []
    for i, (a, x) in enumerate(
        zip(trace.action[:n].tolist(), trace.addr[:n].tolist(), strict=True)
    ):
        if a == alloc:
            alloc_at[x] = i
            notes.pop(x, None)
        elif a in frees:
            alloc_at.pop(x, None)
            notes.pop(x, None)
        elif a == note:
            notes[x] = meta[i]
    return alloc_at, notes


def holder_rows(
    snapshot: SnapshotLike,
    by: str = "frame",
    *,
    device: int | None = None,
    traces: Mapping[int, Trace] | None = None,
    upto: int | None = None,
) -> list[HolderRow]:
    """Who holds the allocated bytes, grouped `by` one of `HOLDER_KEYS`, most bytes first.

    Parameters
    ----------
    snapshot : Snapshot, torch dict or list, path or bytes
        The state whose allocated blocks are grouped.
    by : str
        ``"frame"`` (the innermost user frame, `frame_key`), ``"call_path"`` (`call_path`),
        ``"user_metadata"`` (of the block's alloc entry), ``"annotation"`` (the newest
        ``annotate`` entry naming the block), ``"stream"`` or ``"pool"`` (its segment's).
    device : int, optional
        Only this device's blocks (default: all).
    traces : {int: Trace}, optional
        The traces the metadata is read from (default: the snapshot's own); with `upto`,
        only their entries up to that index count (the state replayed to that entry).
    upto : int, optional
        The last trace entry the state includes.

    Returns
    -------
    list of HolderRow
        Every allocated block is in exactly one row (key None: not recorded), so the bytes
        sum to allocated; ties are broken by the key, so the order is stable.

    Raises
    ------
    ValueError
        `by` is not one of `HOLDER_KEYS`.

    Examples
    --------
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "blocks": [
    ...     {"size": 1 << 20, "state": "active_allocated", "requested_size": 1 << 20,
    ...      "frames": [{"filename": "train.py", "line": 9, "name": "step"}]},
    ...     {"size": 512, "state": "active_allocated", "requested_size": 512, "frames": []},
    ...     {"size": (1 << 20) - 512, "state": "inactive", "requested_size": 0}]}
    >>> [(r.key, r.bytes, r.count) for r in holder_rows([seg])]
    [('train.py:9', 1048576, 1), (None, 512, 1)]
    >>> [(r.label, r.bytes) for r in holder_rows([seg], "pool")]
    [('default pool', 1049088)]
    """
    if by not in HOLDER_KEYS:
        raise ValueError(f"holders by {short_repr(by)}: by is one of {', '.join(HOLDER_KEYS)}")
    snap: Snapshot = as_snapshot(snapshot)
    b = snap.blocks
    mask = b.state == ALLOCATED
    if device is not None:
        mask &= snap.segments.device[b.segment] == device
    rows = np.flatnonzero(mask)
    keys = _keys(snap, rows, by, snap.traces if traces is None else traces, upto)
    return _rows(by, keys, rows, b.size[rows])


def _keys(
    snap: Snapshot, rows: np.ndarray, by: str, traces: Mapping[int, Trace], upto: int | None
) -> list[HolderKey]:
    seg = snap.blocks.segment[rows]
    if by == "stream":
        streams: list[HolderKey] = snap.segments.stream[seg].tolist()
        return streams
    if by == "pool":
        return [(int(a), int(c)) for a, c in snap.segments.pool_id[seg].tolist()]
    if by in ("frame", "call_path"):
        frames = snap.block_frames()
        finder = UserFrames()
        paths = CallPaths()
        seen: dict[int, HolderKey] = {}  # id(frames list) -> key: lists are shared
        out: list[HolderKey] = []
        for r in rows.tolist():
            fr = frames[r]
            if id(fr) in seen:
                out.append(seen[id(fr)])
                continue
            k: HolderKey = None
            if fr and by == "frame":
                f = finder(fr)
                k = None if f is None else frame_key(f)
            elif fr:
                k = paths(fr)
            seen[id(fr)] = k
            out.append(k)
        return out
    devices = snap.segments.device[seg].tolist()
    addrs = snap.blocks.address[rows].tolist()
    links: dict[int, tuple[dict[int, int], dict[int, object], list[object]]] = {}
    out = []
    for d, x in zip(devices, addrs, strict=True):
        got = links.get(d)
        if got is None:
            trace = traces.get(d)
            meta = trace.values("user_metadata") if trace is not None else []
            if trace is None or not _recorded(trace, by, meta):  # every key None: no walk
                got = links[d] = ({}, {}, [])
            else:
                alloc_at, notes = live_links(trace, upto)
                got = links[d] = (alloc_at, notes, meta)
        alloc_at, notes, meta = got
        if by == "annotation":
            out.append(metadata_text(notes.get(x)))
        else:
            e = alloc_at.get(x)
            out.append(None if e is None else metadata_text(meta[e]))
    return out


def _recorded(trace: Trace, by: str, meta: list[object]) -> bool:
    """Whether `trace` holds anything `by` reads: an ``annotate`` entry, or user_metadata
    (older torch records neither; walking the trace would only give every block None).

    >>> t = Trace.from_entries([{"action": "alloc", "addr": 0, "size": 8, "stream": 0}])
    >>> _recorded(t, "user_metadata", t.values("user_metadata")), _recorded(t, "annotation", [])
    (False, False)
    """
    if not len(trace):
        return False
    if by == "annotation":
        return "annotate" in trace.action_names
    if meta.count(None) + meta.count("") == len(meta):  # at C speed: torch's "nothing" only
        return False
    return any(metadata_text(m) is not None for m in meta)


def _rows(by: str, keys: list[HolderKey], rows: np.ndarray, nbytes: np.ndarray) -> list[HolderRow]:
    index: dict[HolderKey, int] = {}
    group = np.fromiter((index.setdefault(k, len(index)) for k in keys), np.int64, len(keys))
    names = list(index)
    totals = np.zeros(len(names), np.int64)
    np.add.at(totals, group, nbytes)  # exact int64 sums
    counts = np.bincount(group, minlength=len(names))
    order = sorted(
        range(len(names)), key=lambda g: (-int(totals[g]), names[g] is None, repr(names[g]))
    )
    member = np.argsort(group, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [
        HolderRow(
            by=by,
            key=names[g],
            bytes=int(totals[g]),
            count=int(counts[g]),
            blocks=rows[member[starts[g] : starts[g + 1]]],
        )
        for g in order
    ]
