"""Holders: which lines of the user's code hold (or asked for) the most memory.

A holder (formerly a *site*) is the first frame outside torch and the interpreter
(`frames.user_frame`). Live holders
group the allocated blocks of a snapshot; trace holders group the `alloc` entries of the recorded
history, so a line that allocated and freed a lot shows up even when it holds nothing at the end.
The report, `gpumemviz diff` and the panel all rank holders this way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpumemviz.analysis.frames import UserFrames, format_frame, frame_fields
from gpumemviz.io import SnapshotLike, as_snapshot
from gpumemviz.snapshot import ACTIONS, ALLOCATED, Snapshot
from gpumemviz.snapshot.schema import TorchDict

__all__ = [
    "NO_STACK",
    "NO_USER_FRAME",
    "N_TOP",
    "UNKNOWN_LINE",
    "Holder",
    "live_holders",
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
