"""Allocation stacks for the hover: each distinct frames list of a snapshot formatted once.

A snapshot shares one frames list between the blocks allocated at the same place, so keying the
formatted stack on the list's identity costs one format per call site, not per block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import numpy as np

from gpumemviz.analysis.frames import filter_frames, format_frame, user_frame_index

if TYPE_CHECKING:
    from gpumemviz.snapshot import Snapshot
    from gpumemviz.snapshot.schema import TorchDict, TorchList

__all__ = ["HEAD_LINES", "MAX_LINES", "Stacks", "stack_lines"]

MAX_LINES = 12  # frames shown per stack, innermost first
HEAD_LINES = 3  # innermost frames kept when the user's frame lies deeper than MAX_LINES


class Hover(TypedDict):
    """One block's stack as the hover shows it: its lines, and which is the user's."""

    lines: list[str]
    user: int | None


def stack_lines(frames: list[TorchDict]) -> tuple[list[str], int | None]:
    """The lines a hover shows for one stack, and the index of the user's line among them.

    Interpreter frames are dropped (`frames.filter_frames`). When the first frame outside torch
    lies deeper than `MAX_LINES` (C++ frames of a ``stacks="all"`` recording come first), the
    innermost `HEAD_LINES`, a "…" line, and the stack from the user's frame on are shown.

    Examples
    --------
    >>> cpp = [{"filename": "/x/torch/lib/libc10.so", "line": 0, "name": f"f{i}"}
    ...        for i in range(20)]
    >>> user = {"filename": "/home/me/train.py", "line": 9, "name": "step"}
    >>> lines, i = stack_lines([*cpp, user])
    >>> lines[:4], i, lines[i]
    (['libc10.so:0:f0', 'libc10.so:0:f1', 'libc10.so:0:f2', '…'], 4, 'train.py:9:step')
    """
    kept = filter_frames(frames)
    user = user_frame_index(kept)
    if user is None or user < MAX_LINES:
        lines = [format_frame(f) for f in kept[:MAX_LINES]]
        return lines, user if user is not None and user < len(lines) else None
    head = [format_frame(f) for f in kept[:HEAD_LINES]]
    tail = [format_frame(f) for f in kept[user : user + MAX_LINES - HEAD_LINES - 1]]
    return [*head, "…", *tail], HEAD_LINES + 1


class Stacks:
    """The stacks of one snapshot's blocks, by (segment, block within the segment).

    Examples
    --------
    >>> from gpumemviz.snapshot import Snapshot
    >>> f = [{"filename": "/x/torch/nn/modules/linear.py", "line": 1, "name": "forward"},
    ...      {"filename": "/home/me/train.py", "line": 9, "name": "step"}]
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "small", "blocks": [{"size": 2 << 20, "requested_size": 8,
    ...        "state": "active_allocated", "frames": f}]}
    >>> Stacks(Snapshot.from_torch([seg])).for_block(0, 0)
    {'lines': ['linear.py:1:forward', 'train.py:9:step'], 'user': 1}
    """

    def __init__(self, snap: Snapshot) -> None:
        self._snap = snap
        self._frames: TorchList | None = None  # each block's frames, as the file has them
        self._start = np.asarray(snap.segments.block_start, np.int64)
        self._cache: dict[int, tuple[list[TorchDict], Hover | None]] = {}

    def for_block(self, segment: int, j: int) -> Hover | None:
        """``{"lines": [...], "user": index or None}`` for block ``j`` of ``segment``; None
        when the block has no recorded stack (or only interpreter frames)."""
        if self._frames is None:
            self._frames = self._snap.block_frames()
        frames = self._frames[int(self._start[segment]) + j]
        if not frames:
            return None
        hit = self._cache.get(id(frames))
        if hit is None or hit[0] is not frames:
            lines, user = stack_lines(frames)
            stack: Hover | None = {"lines": lines, "user": user} if lines else None
            hit = (frames, stack)  # the list is kept alive, so its id stays unique
            self._cache[id(frames)] = hit
        return hit[1]
