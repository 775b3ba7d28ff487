"""The snapshot data model: PyTorch allocator state as numpy columns, with frozen views for humans.

Every other module reads snapshots through this one. Rows stay in the file's order, so
`Snapshot.from_torch(d).to_torch() == d` for every modern file: each row remembers its key set
(its "layout") and any key we do not know, and frames lists are referenced, never copied.
Building columns never creates one Python object per block, so a 10^6-block file stays cheap.
"""

from __future__ import annotations

import functools
import gc
import itertools
import reprlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

import numpy as np

from .units import format_size

__all__ = [
    "ACTIONS",
    "ALLOCATED",
    "INACTIVE",
    "PENDING_FREE",
    "STATE_NAMES",
    "Block",
    "BlockTable",
    "Segment",
    "SegmentTable",
    "Snapshot",
    "SnapshotError",
    "Trace",
    "validate",
]


# What `from_columns` accepts for a column: a numpy array, or any sequence numpy converts.
IntColumn = Sequence[int] | np.ndarray
BoolColumn = Sequence[bool] | np.ndarray


class SnapshotError(ValueError):
    """A snapshot that cannot be read or is inconsistent; the message says what and where."""


INACTIVE, ALLOCATED, PENDING_FREE = 0, 1, 2
STATE_NAMES = ("inactive", "active_allocated", "active_pending_free")
_STATE_CODE = {name: code for code, name in enumerate(STATE_NAMES)}
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
)

# Key order of a torch 2.11 dict; rows built by `from_columns` use these layouts.
# The first segment keys are int columns of SegmentTable under the same names.
_SEG_INT_KEYS = (
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
)
_SEG_KEYS = (
    *_SEG_INT_KEYS,
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
)
_BLOCK_KEYS = ("address", "size", "requested_size", "state", "frames")
_TRACE_KEYS = (
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "compile_context",
    "user_metadata",
    "frames",
    "device_free",
)
_TOP_KEYS = ("segments", "device_traces", "allocator_settings", "external_annotations")
_SMALL_SEGMENT = 2 << 20  # a small-pool segment is exactly 2 MiB (reference §3.9, rule 4)


# ---------------------------------------------------------------------------------------------
# Row shapes: which keys each row had, in which order, and the values of keys we do not model.


@dataclass(frozen=True)
class _Shape:
    """Key layouts of a table's rows: `code[i]` indexes `layouts`; `extra[i]` holds unknown keys."""

    layouts: tuple[tuple[str, ...], ...]
    code: np.ndarray | None  # None: every row has layouts[0]
    extra: Mapping[int, Mapping[str, Any]]

    @staticmethod
    def uniform(keys: tuple[str, ...]) -> _Shape:
        return _Shape((keys,), None, {})

    @staticmethod
    def of(rows: Sequence[dict], known: tuple[str, ...]) -> _Shape:
        """Record each row's key tuple; keep the values of keys outside `known`."""
        index: dict[tuple[str, ...], int] = {}
        codes = [index.setdefault(k, len(index)) for k in map(tuple, rows)]
        layouts = tuple(index)
        known_set = frozenset(known)
        odd = {c for c, keys in enumerate(layouts) if not known_set.issuperset(keys)}
        extra: dict[int, dict[str, Any]] = {}
        if odd:
            for i, c in enumerate(codes):
                if c in odd:
                    extra[i] = {k: v for k, v in rows[i].items() if k not in known_set}
        if len(layouts) <= 1:
            return _Shape(layouts or (known,), None, extra)
        dtype = np.uint8 if len(layouts) < 256 else np.uint32
        return _Shape(layouts, _readonly(np.array(codes, dtype=dtype)), extra)

    def has(self, key: str, n: int) -> np.ndarray:
        """Boolean mask of the rows whose layout includes `key`."""
        with_key = [c for c, keys in enumerate(self.layouts) if key in keys]
        if self.code is None:
            return np.full(n, bool(with_key))
        return np.isin(self.code, with_key)

    def build(self, n: int, values: Mapping[str, Any]) -> list[dict]:
        """Rebuild the row dicts; `values[key]` is a list (or a callable of the row indices)."""
        out: list[Any] = [None] * n
        groups = [(0, None)] if self.code is None else []
        if self.code is not None:
            for c in range(len(self.layouts)):
                idx = np.flatnonzero(self.code == c)
                if idx.size:
                    groups.append((c, idx))
        with no_gc():
            for c, idx in groups:
                keys = self.layouts[c]
                cols = []
                rows = range(n) if idx is None else idx.tolist()
                for k in keys:
                    if k in values:
                        v = values[k]
                        if callable(v):
                            cols.append(v(idx))
                        else:
                            cols.append(v if idx is None else [v[i] for i in rows])
                    else:
                        cols.append([self.extra[i][k] for i in rows])
                built = _row_builder(keys)(cols) if cols else [{} for _ in rows]
                if idx is None:
                    out = built
                else:
                    for i, row in zip(rows, built, strict=True):
                        out[i] = row
            return out


_KNOWN_KEYS = frozenset(_SEG_KEYS + _BLOCK_KEYS + _TRACE_KEYS)


@functools.lru_cache(maxsize=64)
def _row_builder(keys: tuple[str, ...]) -> Callable[[list[list]], list[dict]]:
    """A function turning columns into row dicts for one key layout.

    A dict display is ~2x faster than dict(zip(...)) on 10^6 rows, so layouts made only of our
    own key names get a compiled comprehension (the names are our constants, never file text);
    layouts with unknown keys use dict(zip(...)).
    """
    if not _KNOWN_KEYS.issuperset(keys) or len(set(keys)) != len(keys):
        return lambda cols: [dict(zip(keys, vals, strict=True)) for vals in zip(*cols, strict=True)]
    names = [f"v{i}" for i in range(len(keys))]
    display = ", ".join(f"{k!r}: {v}" for k, v in zip(keys, names, strict=True))
    src = f"lambda cols: [{{{display}}} for ({', '.join(names)},) in zip(*cols)]"
    return eval(src, {"__builtins__": {"zip": zip}})  # keys checked above: our constants only


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC while millions of containers are built (it would rescan them: ~3x
    slower); io and the replay timeline use it too."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def type_phrase(x: Any) -> str:
    """'a list', 'an int': how error messages name a value's type."""
    name = type(x).__name__
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def one_line(text: str) -> str:
    """`text` fit for a one-line message: newlines and other unprintables escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 80, 80


def short_repr(x: Any) -> str:
    """A bounded, one-line repr for error messages: never recurses deep, never runs long."""
    try:
        return one_line(_SHORT.repr(x))
    except Exception:  # a value whose repr fails must not hide the real error
        return f"<{type(x).__name__}>"


def _index(i: int, n: int, what: str, plural: str) -> int:
    """`i` as a row index into `n` rows (negative counts from the end), or IndexError."""
    if not -n <= i < n:
        raise IndexError(f"{what} {i} out of range ({n} {plural})")
    return i % n


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _int_column(values: list, what: str, where: Any) -> np.ndarray:
    """Turn a list of Python ints into int64; name the first row that is not an int."""
    if not values:
        return np.zeros(0, np.int64)
    try:
        col = np.array(values)
    except (ValueError, TypeError, OverflowError, RecursionError):
        col = None
    if col is None or col.ndim != 1 or col.dtype.kind not in "iu" or col.dtype == np.uint64:
        for i, v in enumerate(values):
            if type(v) is not int or not -(2**63) <= v < 2**63:
                raise SnapshotError(f"{where(i)}: {what} is {short_repr(v)}, not a 64-bit integer")
        raise SnapshotError(f"{where(0)}: {what} column is not integer")  # pragma: no cover
    return col.astype(np.int64, copy=False)


# ---------------------------------------------------------------------------------------------
# Tables and views


@dataclass(frozen=True, eq=False)
class SegmentTable:
    """One row per segment (an expandable segment: one row per mapped run), in file order."""

    device: np.ndarray
    address: np.ndarray
    total_size: np.ndarray
    allocated_size: np.ndarray
    active_size: np.ndarray
    requested_size: np.ndarray
    stream: np.ndarray
    is_small: np.ndarray
    is_expandable: np.ndarray
    pool_id: np.ndarray  # (n, 2)
    block_start: np.ndarray
    block_count: np.ndarray

    def __len__(self) -> int:
        return len(self.address)


@dataclass(frozen=True, eq=False)
class BlockTable:
    """One row per block, segment by segment, in address order inside a segment."""

    segment: np.ndarray
    address: np.ndarray
    size: np.ndarray
    requested_size: np.ndarray
    state: np.ndarray  # u1 codes into STATE_NAMES

    def __len__(self) -> int:
        return len(self.size)


@dataclass(frozen=True)
class Block:
    """A block, for humans. `requested_size` is stale on inactive blocks (reference §3.4)."""

    index: int
    segment: int
    address: int
    size: int
    requested_size: int
    state: str
    frames: tuple[dict, ...]


@dataclass(frozen=True)
class Segment:
    """A segment with its blocks, for humans."""

    index: int
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str
    pool_id: tuple[int, int]
    is_expandable: bool
    frames: tuple[dict, ...]
    blocks: tuple[Block, ...]

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.address + self.total_size


@dataclass(frozen=True, eq=False)
class Trace:
    """One device's trace: numpy columns plus the entries' frames and strings, kept as given.

    `action` indexes `action_names`, whose first entries are `ACTIONS`; unknown actions follow.
    `addr`, `size`, `stream`, `time_us` and `device_free` are -1 where an entry lacks the key.
    """

    action: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    time_us: np.ndarray
    device_free: np.ndarray
    action_names: tuple[str, ...] = ACTIONS
    _objects: Mapping[str, list | None] = field(default_factory=dict, repr=False)
    _shape: _Shape = field(default=_Shape.uniform(_TRACE_KEYS[:5]), repr=False)

    def __len__(self) -> int:
        return len(self.action)

    @classmethod
    def empty(cls) -> Trace:
        """A trace with no entries (history was off, or another device)."""
        z = _readonly(np.zeros(0, np.int64))
        return cls(_readonly(np.zeros(0, np.uint8)), z, z, z, z, z)

    @classmethod
    def from_entries(cls, entries: Sequence[dict], where: str = "trace") -> Trace:
        """Build from torch's list of trace-entry dicts (any generation; unknown keys kept)."""
        if not isinstance(entries, list | tuple):
            raise SnapshotError(f"{where} is {type_phrase(entries)}, not a list")
        if not entries:
            return cls.empty()
        for i, e in enumerate(entries):
            if type(e) is not dict:
                raise SnapshotError(f"{where}, entry {i} is {type_phrase(e)}, not a dict")
        shape = _Shape.of(entries, _TRACE_KEYS)

        def at(i: int) -> str:
            return f"{where}, entry {i}"

        try:
            names = list(map(itemgetter("action"), entries))
        except KeyError:
            i = next(i for i, e in enumerate(entries) if "action" not in e)
            raise SnapshotError(f"{at(i)} has no action") from None
        table = {a: c for c, a in enumerate(ACTIONS)}
        if set(map(type, names)) - {str}:
            i = next(i for i, name in enumerate(names) if type(name) is not str)
            raise SnapshotError(f"{at(i)}: action {short_repr(names[i])} is not a string")
        for name in sorted(set(names) - table.keys()):
            table[name] = len(table)
        if len(table) > 255:
            raise SnapshotError(f"{where}: more than 255 distinct actions")
        action_names = tuple(table)
        action = np.fromiter(map(table.__getitem__, names), np.uint8, len(names))
        cols = {
            k: _readonly(_int_column([e.get(k, -1) for e in entries], k, at))
            for k in ("addr", "size", "stream", "time_us", "device_free")
        }
        present = set().union(*shape.layouts)
        objects = {
            k: ([e.get(k) for e in entries] if k in present else None)
            for k in ("frames", "compile_context", "user_metadata")
        }
        return cls(
            _readonly(action), **cols, action_names=action_names, _objects=objects, _shape=shape
        )

    @classmethod
    def from_columns(
        cls,
        *,
        action: IntColumn,
        addr: IntColumn,
        size: IntColumn,
        stream: IntColumn,
        time_us: IntColumn | None = None,
        device_free: IntColumn | None = None,
        frames: list | None = None,
    ) -> Trace:
        """Build from columns (the allocator model's fast path); `action` indexes `ACTIONS`.

        Entries become `{action, addr, size, stream[, time_us][, frames]}`; an `oom` entry
        carries `device_free` instead of `addr`, as torch writes it.
        """
        act = np.asarray(action, np.uint8)
        n = len(act)
        if act.size and act.max() >= len(ACTIONS):
            raise SnapshotError(f"trace: action code {int(act.max())} is not in ACTIONS")

        def col(v: Any) -> np.ndarray:
            a = np.full(n, -1, np.int64) if v is None else np.asarray(v, np.int64).copy()
            if a.shape != (n,):
                raise SnapshotError(f"trace: column of length {len(a)}, expected {n}")
            return _readonly(a)

        base = ["action", "addr", "size", "stream"]
        if time_us is not None:
            base.append("time_us")
        if frames is not None:
            base.append("frames")
        oom = ACTIONS.index("oom")
        layouts = (tuple(base), tuple(k if k != "addr" else "device_free" for k in base))
        is_oom = act == oom
        if is_oom.any():
            shape = _Shape(layouts, _readonly(is_oom.astype(np.uint8)), {})
        else:
            shape = _Shape.uniform(layouts[0])
        objects = {"frames": list(frames) if frames is not None else None}
        columns = [col(v) for v in (addr, size, stream, time_us, device_free)]
        return cls(_readonly(act.copy()), *columns, _objects=objects, _shape=shape)

    def _values(self) -> dict[str, Any]:
        names = self.action_names
        vals: dict[str, Any] = {
            "action": lambda idx: [names[c] for c in _take(self.action, idx)],
        }
        for k in ("addr", "size", "stream", "time_us", "device_free"):
            vals[k] = _taker(getattr(self, k))
        for k, v in self._objects.items():
            if v is not None:
                vals[k] = v
        return vals

    def frames(self) -> list:
        """Each entry's stack (shared, not copied); `[]` where the entry has no `frames` key."""
        f = self._objects.get("frames")
        if f is None:
            return [[]] * len(self)
        return [x if x is not None else [] for x in f]

    def entries(self) -> list[dict]:
        """The torch list of entry dicts (frames and strings shared, not copied)."""
        return self._shape.build(len(self), self._values())

    def entry(self, i: int) -> dict:
        """Entry `i` as torch writes it."""
        i = _index(i, len(self), "trace entry", "entries")
        c = 0 if self._shape.code is None else int(self._shape.code[i])
        vals = self._values()
        out = {}
        for k in self._shape.layouts[c]:
            if k not in vals:
                out[k] = self._shape.extra[i][k]
            elif callable(vals[k]):
                out[k] = vals[k](np.array([i]))[0]
            else:
                out[k] = vals[k][i]
        return out


def _legacy_frames(extra: Mapping[str, Any] | None) -> list | None:
    """The frames of a torch 2.0 block: its `history[0]` (reference §3.4), None without one."""
    history = extra.get("history") if extra else None
    if isinstance(history, list) and history and isinstance(history[0], dict):
        frames = history[0].get("frames")
        return frames if isinstance(frames, list) else None
    return None


def _take(col: np.ndarray, idx: np.ndarray | None) -> list:
    return (col if idx is None else col[idx]).tolist()


def _taker(col: np.ndarray):
    return lambda idx: _take(col, idx)


def _empty_lists(n: int):
    """A fresh [] per row: rows built by `from_columns` have no frames, and must not share one."""
    return lambda idx: [[] for _ in range(n if idx is None else len(idx))]


# ---------------------------------------------------------------------------------------------
# The snapshot


@dataclass(frozen=True, eq=False)
class Snapshot:
    """PyTorch caching-allocator state (segments, blocks, traces) as numpy columns.

    Build one with `Snapshot.from_torch(dict_or_list)`, `Snapshot.from_columns(...)` or
    `gpumemviz.load_snapshot(path)`; `to_torch()` gives the dict back. Frames lists, settings and
    annotations are shared with the source dict, not copied: treat them as read-only.
    """

    segments: SegmentTable
    blocks: BlockTable
    traces: Mapping[int, Trace]
    allocator_settings: dict | None = None
    external_annotations: list | None = None
    _seg_frames: list | None = field(default=None, repr=False)
    _seg_shape: _Shape = field(default=_Shape.uniform(_SEG_KEYS), repr=False)
    _blk_frames: list | None = field(default=None, repr=False)
    _blk_shape: _Shape = field(default=_Shape.uniform(_BLOCK_KEYS), repr=False)
    _top_keys: tuple[str, ...] = field(default=_TOP_KEYS, repr=False)
    _top_extra: Mapping[str, Any] = field(default_factory=dict, repr=False)

    # -- sizes and views ------------------------------------------------------------------------

    @property
    def n_segments(self) -> int:
        return len(self.segments)

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def devices(self) -> tuple[int, ...]:
        """Devices that hold a segment or a trace entry, ascending."""
        seen = set(np.unique(self.segments.device).tolist())
        seen.update(d for d, t in self.traces.items() if len(t))
        return tuple(sorted(seen))

    def __repr__(self) -> str:
        reserved = int(self.segments.total_size.sum())
        n_trace = sum(len(t) for t in self.traces.values())
        return (
            f"<Snapshot devices={list(self.devices)} segments={self.n_segments} "
            f"blocks={self.n_blocks} trace_entries={n_trace} reserved={format_size(reserved)}>"
        )

    def block(self, i: int) -> Block:
        """Block `i` (in table order) as a frozen value."""
        i = _index(i, self.n_blocks, "block", "blocks")
        b = self.blocks
        frames = self._blk_frames[i] if self._blk_frames is not None else None
        if frames is None:
            frames = _legacy_frames(self._blk_shape.extra.get(i))
        return Block(
            index=i,
            segment=int(b.segment[i]),
            address=int(b.address[i]),
            size=int(b.size[i]),
            requested_size=int(b.requested_size[i]),
            state=STATE_NAMES[int(b.state[i])],
            frames=tuple(frames or ()),
        )

    def block_frames(self) -> list:
        """Each block's allocation stack, in table order: the file's frames list (shared, not
        copied), a torch 2.0 block's `history[0]` frames, or `[]` when none was recorded.

        One list for all blocks, so stack analysis (sites, hover) costs no per-block objects.
        """
        n = self.n_blocks
        base = self._blk_frames
        out = [[]] * n if base is None else [f if f is not None else [] for f in base]
        for i, extra in self._blk_shape.extra.items():
            if base is None or base[i] is None:
                legacy = _legacy_frames(extra)
                if legacy is not None:
                    out[i] = legacy
        return out

    def map_objects(self, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Snapshot:
        """A snapshot whose Python objects (everything that is not a numpy column) went
        through `fn`; the columns are shared.

        `fn` gets one plain dict and returns one of the same shape: ``seg_frames`` and
        ``blk_frames`` (a frames list per row, or None), ``seg_extra`` and ``blk_extra``
        ({row: {unknown key: value}}, torch 2.0 `history` included), ``traces`` ({device:
        {"objects": {frames/compile_context/user_metadata: per-entry list or None},
        "extra": {entry: {key: value}}, "action_names": [str]}}), ``allocator_settings``,
        ``external_annotations`` and ``top_extra``. This is how path redaction rewrites every
        string of a 10^6-block snapshot without building its dicts.
        """
        payload: dict[str, Any] = {
            "seg_frames": self._seg_frames,
            "blk_frames": self._blk_frames,
            "seg_extra": dict(self._seg_shape.extra),
            "blk_extra": dict(self._blk_shape.extra),
            "traces": {
                d: {
                    "objects": dict(t._objects),
                    "extra": dict(t._shape.extra),
                    "action_names": list(t.action_names),
                }
                for d, t in self.traces.items()
            },
            "allocator_settings": self.allocator_settings,
            "external_annotations": self.external_annotations,
            "top_extra": dict(self._top_extra),
        }
        out = fn(payload)
        traces = {
            d: replace(
                t,
                action_names=tuple(out["traces"][d]["action_names"]),
                _objects=out["traces"][d]["objects"],
                _shape=replace(t._shape, extra=out["traces"][d]["extra"]),
            )
            for d, t in self.traces.items()
        }
        return replace(
            self,
            traces=traces,
            allocator_settings=out["allocator_settings"],
            external_annotations=out["external_annotations"],
            _seg_frames=out["seg_frames"],
            _seg_shape=replace(self._seg_shape, extra=out["seg_extra"]),
            _blk_frames=out["blk_frames"],
            _blk_shape=replace(self._blk_shape, extra=out["blk_extra"]),
            _top_extra=out["top_extra"],
        )

    def segment(self, i: int) -> Segment:
        """Segment `i` (in file order) with its blocks, as a frozen value."""
        i = _index(i, self.n_segments, "segment", "segments")
        s = self.segments
        start, count = int(s.block_start[i]), int(s.block_count[i])
        frames = self._seg_frames[i] if self._seg_frames is not None else None
        return Segment(
            index=i,
            device=int(s.device[i]),
            address=int(s.address[i]),
            total_size=int(s.total_size[i]),
            allocated_size=int(s.allocated_size[i]),
            active_size=int(s.active_size[i]),
            requested_size=int(s.requested_size[i]),
            stream=int(s.stream[i]),
            segment_type="small" if s.is_small[i] else "large",
            pool_id=(int(s.pool_id[i, 0]), int(s.pool_id[i, 1])),
            is_expandable=bool(s.is_expandable[i]),
            frames=tuple(frames or ()),
            blocks=tuple(self.block(j) for j in range(start, start + count)),
        )

    def where(self, seg: int) -> str:
        """'segment 3 (device 0, 0x7f5d00000000)': how messages name a segment."""
        s = self.segments
        return f"segment {seg} (device {int(s.device[seg])}, {int(s.address[seg]):#x})"

    # -- torch dicts ----------------------------------------------------------------------------

    @classmethod
    def from_torch(cls, obj: dict | list) -> Snapshot:
        """Read a torch snapshot: the `_snapshot()` dict of any generation, or a segment list.

        Checks only what building the columns needs; `validate` checks the rest.

        Parameters
        ----------
        obj : dict or list
            `torch.cuda.memory._snapshot()` (2.0 legacy blocks with `history` included), or
            the bare list `torch.cuda.memory_snapshot()` returns.

        Returns
        -------
        Snapshot

        Examples
        --------
        >>> snap = Snapshot.from_torch([{"device": 0, "address": 4096, "total_size": 2097152,
        ...     "stream": 0, "segment_type": "small", "blocks": [
        ...     {"size": 512, "state": "active_allocated", "requested_size": 100},
        ...     {"size": 2096640, "state": "inactive", "requested_size": 0}]}])
        >>> snap.n_blocks, snap.block(1).address, snap.to_torch()["device_traces"]
        (2, 4608, [[]])
        """
        with no_gc():  # the source dict may hold 10^7 objects: a full GC pass costs ~0.5 s
            return _from_torch(cls, obj)

    def to_torch(self) -> dict:
        """The torch dict: `from_torch(d).to_torch() == d` for dicts; a bare list gains
        `device_traces` (one empty list per device) so PyTorch's tools accept it."""
        with no_gc():
            return self._to_torch()

    def _to_torch(self) -> dict:
        seg_lists = self._block_dicts()
        seg_rows = self._segment_dicts(seg_lists)
        n_dev = max(self.traces, default=-1) + 1
        if not self.traces and self.n_segments:
            n_dev = int(self.segments.device.max()) + 1
        traces = [
            self.traces[d].entries() if d in self.traces else [] for d in range(max(n_dev, 0))
        ]
        keys = self._top_keys
        if "device_traces" not in keys:
            keys = ("segments", "device_traces", *(k for k in keys if k != "segments"))
        known = {
            "segments": seg_rows,
            "device_traces": traces,
            "allocator_settings": self.allocator_settings,
            "external_annotations": self.external_annotations,
        }
        return {k: known[k] if k in known else self._top_extra[k] for k in keys}

    def _block_dicts(self) -> list[list[dict]]:
        b = self.blocks
        n = len(b)
        frames = self._blk_frames
        vals: dict[str, Any] = {
            "address": _taker(b.address),
            "size": _taker(b.size),
            "requested_size": _taker(b.requested_size),
            "state": lambda idx: [STATE_NAMES[c] for c in _take(b.state, idx)],
            "frames": frames if frames is not None else _empty_lists(n),
        }
        rows = self._blk_shape.build(n, vals)
        starts = self.segments.block_start.tolist()
        counts = self.segments.block_count.tolist()
        return [rows[a : a + c] for a, c in zip(starts, counts, strict=True)]

    def _segment_dicts(self, block_lists: list[list[dict]]) -> list[dict]:
        s = self.segments
        n = len(s)
        frames = self._seg_frames
        vals: dict[str, Any] = {k: _taker(getattr(s, k)) for k in _SEG_INT_KEYS}
        vals["segment_type"] = lambda idx: [
            "small" if x else "large" for x in _take(s.is_small, idx)
        ]
        vals["segment_pool_id"] = lambda idx: list(map(tuple, _take(s.pool_id, idx)))
        vals["is_expandable"] = _taker(s.is_expandable)
        vals["frames"] = frames if frames is not None else _empty_lists(n)
        vals["blocks"] = block_lists
        return self._seg_shape.build(n, vals)

    # -- columns --------------------------------------------------------------------------------

    @classmethod
    def from_columns(
        cls,
        *,
        device: IntColumn,
        address: IntColumn,
        total_size: IntColumn,
        stream: IntColumn,
        is_small: BoolColumn,
        block_count: IntColumn,
        size: IntColumn,
        requested_size: IntColumn,
        state: IntColumn,
        is_expandable: BoolColumn | None = None,
        pool_id: Sequence[tuple[int, int]] | np.ndarray | None = None,
        segment_frames: list | None = None,
        block_frames: list | None = None,
        traces: Mapping[int, Trace] | None = None,
        allocator_settings: dict | None = None,
        external_annotations: list | None = None,
    ) -> Snapshot:
        """Build from columns without any dict walk (the allocator model's fast path).

        Segment columns have one row per segment, block columns one row per block, segment by
        segment, in address order. Block addresses, `block_start`, each block's segment and
        the segments' allocated/active/requested sums are derived, so they are consistent.

        Parameters
        ----------
        device, address, total_size, stream : int arrays, one per segment
        is_small : bool array, one per segment (`segment_type == "small"`)
        block_count : int array, one per segment; sums to the number of blocks
        size, requested_size : int arrays, one per block
        state : int array of state codes (`INACTIVE`, `ALLOCATED`, `PENDING_FREE`), one per block
        is_expandable : bool array, default all False
        pool_id : (n, 2) int array, default all (0, 0)
        segment_frames, block_frames : lists of frames lists, default all []
        traces : {device: Trace}, default one empty trace per device up to the highest
        allocator_settings, external_annotations : kept as given (None: left out of `to_torch`)

        Returns
        -------
        Snapshot

        Examples
        --------
        >>> snap = Snapshot.from_columns(device=[0], address=[1 << 20], total_size=[2 << 20],
        ...     stream=[0], is_small=[True], block_count=[2], size=[512, (2 << 20) - 512],
        ...     requested_size=[500, 0], state=[ALLOCATED, INACTIVE])
        >>> snap.segment(0).allocated_size, snap.block(1).address - snap.block(0).address
        (512, 512)
        """
        seg_cols = {
            "device": device,
            "address": address,
            "total_size": total_size,
            "stream": stream,
            "block_count": block_count,
        }
        cols = {k: np.asarray(v, np.int64) for k, v in seg_cols.items()}
        n = len(cols["address"])
        small = np.asarray(is_small, bool)
        exp = np.zeros(n, bool) if is_expandable is None else np.asarray(is_expandable, bool)
        pool = np.zeros((n, 2), np.int64) if pool_id is None else np.asarray(pool_id, np.int64)
        for k, v in [*cols.items(), ("is_small", small), ("is_expandable", exp)]:
            if v.shape != (n,):
                raise SnapshotError(f"from_columns: {k} has shape {v.shape}, expected ({n},)")
        if pool.shape != (n, 2):
            raise SnapshotError(f"from_columns: pool_id has shape {pool.shape}, expected ({n}, 2)")
        sz = np.asarray(size, np.int64)
        m = len(sz)
        req = np.asarray(requested_size, np.int64)
        st = np.asarray(state, np.uint8)
        if req.shape != (m,) or st.shape != (m,):
            raise SnapshotError(f"from_columns: block columns differ in length ({m} sizes)")
        if int(cols["block_count"].sum()) != m:
            raise SnapshotError(
                f"from_columns: block_count sums to {int(cols['block_count'].sum())}, "
                f"but there are {m} blocks"
            )
        if m and st.max() > PENDING_FREE:
            raise SnapshotError(f"from_columns: unknown state code {int(st.max())}")
        frame_lists = (("segment_frames", segment_frames, n), ("block_frames", block_frames, m))
        for name, lst, want in frame_lists:
            if lst is not None and len(lst) != want:
                raise SnapshotError(f"from_columns: {name} has {len(lst)} rows, expected {want}")
        if traces is None:
            top = int(cols["device"].max()) + 1 if n else 0
            traces = {d: Trace.empty() for d in range(top)}
        return _assemble(
            cls,
            seg={**cols, "is_small": small, "is_expandable": exp, "pool_id": pool},
            blk={"size": sz, "requested_size": req, "state": st},
            blk_address=None,
            traces=dict(traces),
            allocator_settings=allocator_settings,
            external_annotations=external_annotations,
            seg_frames=None if segment_frames is None else list(segment_frames),
            blk_frames=None if block_frames is None else list(block_frames),
            seg_shape=_Shape.uniform(_SEG_KEYS),
            blk_shape=_Shape.uniform(_BLOCK_KEYS),
            seg_sums=None,
            top_keys=tuple(
                k
                for k in _TOP_KEYS
                if k not in ("allocator_settings", "external_annotations")
                or (allocator_settings if k == "allocator_settings" else external_annotations)
                is not None
            ),
            top_extra={},
        )


def _assemble(
    cls: type[Snapshot],
    *,
    seg: dict[str, np.ndarray],
    blk: dict[str, np.ndarray],
    blk_address: np.ndarray | tuple[np.ndarray, np.ndarray] | None,
    traces: dict[int, Trace],
    allocator_settings: dict | None,
    external_annotations: list | None,
    seg_frames: list | None,
    blk_frames: list | None,
    seg_shape: _Shape,
    blk_shape: _Shape,
    seg_sums: dict[str, np.ndarray | None] | None,
    top_keys: tuple[str, ...],
    top_extra: Mapping[str, Any],
) -> Snapshot:
    """Derive block_start, segment index, computed addresses and sums; freeze everything."""
    count = seg["block_count"]
    n, m = len(count), len(blk["size"])
    start = np.zeros(n, np.int64)
    if n:
        np.cumsum(count[:-1], out=start[1:])
    segment = np.repeat(np.arange(n, dtype=np.int64), count)
    size = blk["size"]
    state = blk["state"]
    excl = np.zeros(m, np.int64)  # bytes before each block inside the whole table
    if m:
        np.cumsum(size[:-1], out=excl[1:])
    computed = seg["address"][segment] + excl - (excl[start[segment]] if m else 0)
    if blk_address is None:  # torch computes them the same way (reference §3.4)
        blk_address = computed
    elif isinstance(blk_address, tuple):
        given, has = blk_address
        blk_address = np.where(has, given, computed)
    sums = {}
    cs = np.zeros(m + 1, np.int64)
    for name, mask in (
        ("allocated_size", state == ALLOCATED),
        ("active_size", state != INACTIVE),
        ("requested_size", state != INACTIVE),
    ):
        w = blk["requested_size"] if name == "requested_size" else size
        np.cumsum(np.where(mask, w, 0), out=cs[1:])
        derived = cs[start + count] - cs[start]
        given = None if seg_sums is None else seg_sums.get(name)
        sums[name] = derived if given is None else given
    segments = SegmentTable(
        device=_readonly(seg["device"]),
        address=_readonly(seg["address"]),
        total_size=_readonly(seg["total_size"]),
        allocated_size=_readonly(sums["allocated_size"]),
        active_size=_readonly(sums["active_size"]),
        requested_size=_readonly(sums["requested_size"]),
        stream=_readonly(seg["stream"]),
        is_small=_readonly(seg["is_small"]),
        is_expandable=_readonly(seg["is_expandable"]),
        pool_id=_readonly(seg["pool_id"]),
        block_start=_readonly(start),
        block_count=_readonly(count),
    )
    blocks = BlockTable(
        segment=_readonly(segment),
        address=_readonly(blk_address),
        size=_readonly(size),
        requested_size=_readonly(blk["requested_size"]),
        state=_readonly(state),
    )
    return cls(
        segments=segments,
        blocks=blocks,
        traces=traces,
        allocator_settings=allocator_settings,
        external_annotations=external_annotations,
        _seg_frames=seg_frames,
        _seg_shape=seg_shape,
        _blk_frames=blk_frames,
        _blk_shape=blk_shape,
        _top_keys=top_keys,
        _top_extra=top_extra,
    )


# ---------------------------------------------------------------------------------------------
# Reading torch dicts


def _seg_where(segs: list, i: int) -> str:
    s = segs[i]
    if type(s) is dict:
        dev, addr = s.get("device", "?"), s.get("address")
        dev = dev if type(dev) is int or dev == "?" else short_repr(dev)
        a = f"{addr:#x}" if type(addr) is int else short_repr(addr)
        return f"segment {i} (device {dev}, {a})"
    return f"segment {i}"


def _from_torch(cls: type[Snapshot], obj: Any) -> Snapshot:
    top_extra: dict[str, Any] = {}
    if type(obj) is list:
        segs, raw_traces, settings, notes = obj, None, None, None
        top_keys: tuple[str, ...] = ("segments", "device_traces")
    elif isinstance(obj, dict):
        if "segments" not in obj:
            keys = ", ".join(map(short_repr, list(obj)[:8])) or "none"
            raise SnapshotError(f"not a snapshot: a dict without 'segments' (keys: {keys})")
        segs = obj["segments"]
        raw_traces = obj.get("device_traces")
        settings = obj.get("allocator_settings")
        notes = obj.get("external_annotations")
        top_keys = tuple(obj)
        top_extra = {k: v for k, v in obj.items() if k not in _TOP_KEYS}
        if type(segs) is not list:
            raise SnapshotError(f"'segments' is {type_phrase(segs)}, not a list")
        if settings is not None and not isinstance(settings, dict):
            raise SnapshotError(f"'allocator_settings' is {type_phrase(settings)}, not a dict")
        if notes is not None and not isinstance(notes, list):
            raise SnapshotError(f"'external_annotations' is {type_phrase(notes)}, not a list")
    else:
        raise SnapshotError(
            f"not a snapshot: {type_phrase(obj)} (expected the dict of "
            "torch.cuda.memory._snapshot() or the list of torch.cuda.memory_snapshot())"
        )

    if set(map(type, segs)) - {dict}:
        i = next(i for i, s in enumerate(segs) if type(s) is not dict)
        raise SnapshotError(f"segment {i} is {type_phrase(segs[i])}, not a dict")
    seg_shape = _Shape.of(segs, _SEG_KEYS)
    n = len(segs)
    for k in ("address", "total_size", "blocks"):
        if not seg_shape.has(k, n).all():
            i = next(i for i, s in enumerate(segs) if k not in s)
            raise SnapshotError(f"{_seg_where(segs, i)} has no {k}")

    def seg_at(i: int) -> str:
        return _seg_where(segs, i)

    blists = list(map(itemgetter("blocks"), segs))
    if set(map(type, blists)) - {list}:
        i = next(i for i, bl in enumerate(blists) if type(bl) is not list)
        raise SnapshotError(f"{seg_at(i)}: blocks is {type_phrase(blists[i])}, not a list")
    count = np.fromiter(map(len, blists), np.int64, n)

    seg: dict[str, np.ndarray] = {"block_count": count}
    for k, default in (("device", 0), ("address", None), ("total_size", None), ("stream", 0)):
        seg[k] = _int_column([s.get(k, default) for s in segs], k, seg_at)
    types = [s.get("segment_type") for s in segs]
    if set(map(type, types)) - {str, type(None)} or set(types) - {"small", "large", None}:
        i = next(i for i, t in enumerate(types) if t not in ("small", "large", None))
        raise SnapshotError(f"{seg_at(i)}: unknown segment_type {short_repr(types[i])}")
    small = np.array([t == "small" for t in types], bool)
    if None in set(types):  # torch < 2.0 lists: a small segment is exactly 2 MiB
        small |= np.array([t is None for t in types], bool) & (seg["total_size"] == _SMALL_SEGMENT)
    seg["is_small"] = small
    seg["is_expandable"] = np.array([bool(s.get("is_expandable", False)) for s in segs], bool)
    seg["pool_id"] = _pool_column(segs, seg_at)
    sums: dict[str, np.ndarray | None] = {}
    for k in ("allocated_size", "active_size", "requested_size"):
        has = seg_shape.has(k, n)
        if has.all():
            sums[k] = _int_column(list(map(itemgetter(k), segs)), k, seg_at)
        elif has.any():
            raise SnapshotError(f"{seg_at(int(np.flatnonzero(~has)[0]))} has no {k}")
        else:
            sums[k] = None
    seg_frames = [s.get("frames") for s in segs] if seg_shape.has("frames", n).any() else None

    blocks = list(itertools.chain.from_iterable(blists))
    blk, blk_address, blk_frames, blk_shape = _block_columns(blocks, count, segs)
    traces = _trace_columns(raw_traces)
    return _assemble(
        cls,
        seg=seg,
        blk=blk,
        blk_address=blk_address,
        traces=traces,
        allocator_settings=settings,
        external_annotations=notes,
        seg_frames=seg_frames,
        blk_frames=blk_frames,
        seg_shape=seg_shape,
        blk_shape=blk_shape,
        seg_sums=sums,
        top_keys=top_keys,
        top_extra=top_extra,
    )


def _pool_column(segs: list, seg_at) -> np.ndarray:
    ids = [s.get("segment_pool_id", (0, 0)) for s in segs]
    if not ids:
        return np.zeros((0, 2), np.int64)
    try:
        pool = np.array(ids)
    except (ValueError, TypeError, OverflowError, RecursionError):
        pool = None
    if (
        pool is None
        or pool.dtype.kind not in "iu"
        or pool.dtype == np.uint64
        or pool.shape != (len(ids), 2)
    ):
        for i, p in enumerate(ids):
            if not (
                isinstance(p, tuple | list)
                and len(p) == 2
                and all(type(x) is int and -(2**63) <= x < 2**63 for x in p)
            ):
                raise SnapshotError(
                    f"{seg_at(i)}: segment_pool_id {short_repr(p)} is not a pair of 64-bit ints"
                )
    return np.asarray(pool, np.int64)


def _block_columns(
    blocks: list, count: np.ndarray, segs: list
) -> tuple[
    dict[str, np.ndarray], np.ndarray | tuple[np.ndarray, np.ndarray] | None, list | None, _Shape
]:
    """Block columns. The common case (every block has exactly torch's five keys) costs a few
    C-level passes; anything else (legacy `history`, unknown keys) takes the general path."""
    m = len(blocks)
    seg_of = np.repeat(np.arange(len(count)), count)
    start = np.concatenate([[0], np.cumsum(count)])

    def at(j: int) -> str:
        s = int(seg_of[j])
        return f"{_seg_where(segs, s)}: block {j - int(start[s])}"

    if set(map(type, blocks)) - {dict}:
        j = next(j for j, b in enumerate(blocks) if type(b) is not dict)
        raise SnapshotError(f"{at(j)} is {type_phrase(blocks[j])}, not a dict")
    fast = m > 0 and not np.any(np.fromiter(map(len, blocks), np.int64, m) != len(_BLOCK_KEYS))
    if fast:
        try:
            cols = {k: list(map(itemgetter(k), blocks)) for k in _BLOCK_KEYS}
            shape = _Shape.uniform(_BLOCK_KEYS)
        except KeyError:
            fast = False
    if not fast:
        shape = _Shape.of(blocks, _BLOCK_KEYS)
        for k in ("size", "state"):
            if not shape.has(k, m).all():
                j = next(j for j, b in enumerate(blocks) if k not in b)
                raise SnapshotError(f"{at(j)} has no {k}")
        cols = {k: [b.get(k) for b in blocks] for k in _BLOCK_KEYS}
    size = _int_column(cols["size"], "size", at)
    req_has = shape.has("requested_size", m)
    req_list = cols["requested_size"]
    if not req_has.all():  # torch 1.x blocks: {size, state}; the whole block counts as requested
        req_list = [s if r is None else r for r, s in zip(req_list, size.tolist(), strict=True)]
    requested = _int_column(req_list, "requested_size", at)
    try:
        state = np.fromiter(map(_STATE_CODE.__getitem__, cols["state"]), np.uint8, m)
    except (KeyError, TypeError):
        j = next(
            j for j, s in enumerate(cols["state"]) if type(s) is not str or s not in _STATE_CODE
        )
        raise SnapshotError(f"{at(j)} has unknown state {short_repr(cols['state'][j])}") from None
    addr_has = shape.has("address", m)
    address: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None
    if addr_has.all():
        address = _int_column(cols["address"], "address", at)
    elif addr_has.any():  # some blocks without an address: `_assemble` fills those in
        fill = [a if a is not None else 0 for a in cols["address"]]
        address = (_int_column(fill, "address", at), addr_has)
    frames = cols["frames"] if shape.has("frames", m).any() else None
    return {"size": size, "requested_size": requested, "state": state}, address, frames, shape


def _trace_columns(raw: Any) -> dict[int, Trace]:
    if raw is None:
        return {}
    if type(raw) is not list:
        raise SnapshotError(f"'device_traces' is {type_phrase(raw)}, not a list")
    return {d: Trace.from_entries(t, f"device_traces[{d}]") for d, t in enumerate(raw)}


# ---------------------------------------------------------------------------------------------
# Validation


def _check_settings(settings: dict | None) -> None:
    """The allocator_settings shape the analyses rely on (roundup_power2_divisions)."""
    rd = (settings or {}).get("roundup_power2_divisions")
    if rd is None:
        return
    if type(rd) is not dict:
        raise SnapshotError(
            f"allocator_settings: roundup_power2_divisions is {type_phrase(rd)}, not a dict"
        )
    for k, v in rd.items():
        if not (type(k) is int or (type(k) is str and k.isascii() and k.isdigit())):
            raise SnapshotError(
                f"allocator_settings: roundup_power2_divisions key {short_repr(k)} is not an "
                "interval (a non-negative integer)"
            )
        if not (type(v) is int and 0 <= v < 1 << 64 and v & (v - 1) == 0):
            raise SnapshotError(
                f"allocator_settings: roundup_power2_divisions[{short_repr(k)}] is "
                f"{short_repr(v)}, not 0 or a power of 2"
            )


def validate(snapshot: Snapshot) -> None:
    """Check that a snapshot is self-consistent; raise `SnapshotError` at the first problem.

    Vectorised over the columns: block sizes sum to total_size, blocks are contiguous from
    the segment address, allocated/active/requested sums match the blocks, sizes are not
    negative, and segments of a device do not overlap.

    Examples
    --------
    >>> snap = Snapshot.from_torch([{"address": 0, "total_size": 1024, "blocks": [
    ...     {"size": 512, "state": "inactive"}]}])
    >>> try:
    ...     validate(snap)
    ... except SnapshotError as e:
    ...     print(e)
    segment 0 (device 0, 0x0): blocks sum to 512 bytes but total_size is 1024
    """
    s, b = snapshot.segments, snapshot.blocks
    m = len(b)
    _check_settings(snapshot.allocator_settings)

    def first(mask: np.ndarray) -> int | None:
        hit = np.flatnonzero(mask)
        return int(hit[0]) if hit.size else None

    j = first(b.size <= 0)
    if j is not None:
        seg = int(b.segment[j])
        raise SnapshotError(
            f"{snapshot.where(seg)}: block {j - int(s.block_start[seg])} has size {int(b.size[j])}"
        )
    i = first(s.total_size <= 0)
    if i is not None:
        raise SnapshotError(f"{snapshot.where(i)}: total_size is {int(s.total_size[i])}")
    cs = np.zeros(m + 1, np.int64)
    end = s.block_start + s.block_count
    np.cumsum(b.size, out=cs[1:])
    block_sum = cs[end] - cs[s.block_start]
    i = first(block_sum != s.total_size)
    if i is not None:
        raise SnapshotError(
            f"{snapshot.where(i)}: blocks sum to {int(block_sum[i])} bytes but total_size is "
            f"{int(s.total_size[i])}"
        )
    offset = cs[:-1] - cs[s.block_start[b.segment]] if m else cs[:0]
    j = first(b.address != s.address[b.segment] + offset)
    if j is not None:
        seg = int(b.segment[j])
        raise SnapshotError(
            f"{snapshot.where(seg)}: block {j - int(s.block_start[seg])} is at "
            f"{int(b.address[j]):#x}, expected {int(s.address[seg] + offset[j]):#x} "
            "(blocks must be contiguous)"
        )
    for name, mask, w in (
        ("allocated_size", b.state == ALLOCATED, b.size),
        ("active_size", b.state != INACTIVE, b.size),
        ("requested_size", b.state != INACTIVE, b.requested_size),
    ):
        np.cumsum(np.where(mask, w, 0), out=cs[1:])
        got = cs[end] - cs[s.block_start]
        i = first(got != getattr(s, name))
        if i is not None:
            raise SnapshotError(
                f"{snapshot.where(i)}: {name} is {int(getattr(s, name)[i])} but its blocks "
                f"give {int(got[i])}"
            )
    order = np.lexsort((s.address, s.device))
    if len(order) > 1:
        dev, lo, hi = s.device[order], s.address[order], s.address[order] + s.total_size[order]
        k = first((dev[1:] == dev[:-1]) & (lo[1:] < hi[:-1]))
        if k is not None:
            a, c = int(order[k]), int(order[k + 1])
            raise SnapshotError(f"{snapshot.where(c)} overlaps {snapshot.where(a)}")
