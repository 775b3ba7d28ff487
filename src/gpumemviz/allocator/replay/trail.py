"""What the backward walk leaves for the recording: `Trail`.

Reconstruction (reconstruct.py) undoes every trace entry from the last to the first, so it
passes through the layout after every entry. With a `Trail` it keeps what the recording
(recording.py) needs from those layouts: the change in allocated bytes and the segment count
after each entry, and copy-on-write checkpoints for seeking. Those are the forward pass's own
figures only if applying each entry forwards undoes exactly what the walk did; the walk checks
that per entry (`exact`), and the recording runs its forward pass only where a check fails.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator.replay.forward import apply_step
from gpumemviz.allocator.replay.layout import Layout, LayoutError, Seg

if TYPE_CHECKING:
    from gpumemviz.allocator.replay.steps import Rules, Step

__all__ = ["MAX_SPACING", "Trail", "spacing"]

#: The widest spacing of layout checkpoints, in entries (a jump applies at most this many).
MAX_SPACING = 4096

_Window = list[tuple[int, int, bool, bool, list[tuple[int, ...]]]]


def spacing(lay: Layout, every: int) -> int:
    """Entries until the next checkpoint: `every`, or more where a checkpoint is heavy.

    A checkpoint costs its segment table, and the segments changed since the last one are
    copied (copy-on-write); spacing them by twice that weight keeps the checkpoints' memory
    a small constant per entry, and at most `MAX_SPACING` entries keep a jump fast.
    """
    weight = len(lay.segs) + sum(len(seg.blocks) for seg in lay.owned)
    return max(every, min(2 * weight, MAX_SPACING))


def _bounds(lay: Layout, addr: int, size: int) -> tuple[int, int]:
    """Indices into `lay.bases` of every segment a segment entry at [addr, +size) can touch:
    from the last one starting below addr to the one starting at addr + size."""
    lo = max(bisect.bisect_right(lay.bases, addr - 1) - 1, 0)
    return lo, bisect.bisect_right(lay.bases, addr + size)


def _contents(segs: Sequence[Seg]) -> _Window:
    return [(s.address, s.stream, s.small, s.expandable, list(map(tuple, s.blocks))) for s in segs]


class Trail:
    """Per entry of an `n`-entry trace, what the backward walk saw after it.

    `alloc_delta[i]` is the change in allocated bytes entry i makes forwards, `reserved_delta[i]`
    the change in reserved bytes, `nsegs[i]` the segment count after it (filled by `finish`
    from the counts the walk noted at segment entries, `seg_at` / `seg_count`: no other entry
    changes it); `checkpoints[k]` is
    the layout before entry `checkpoint_at[k]` (ascending, the first at entry 0). `exact`
    stays True while every entry applied forwards gives back the layout the walk undid it
    from; where it is False the figures are not the forward pass's and must not be used.
    """

    __slots__ = (
        "alloc_delta",
        "checkpoint_at",
        "checkpoints",
        "every",
        "exact",
        "next_at",
        "nsegs",
        "reserved_delta",
        "seg_at",
        "seg_count",
    )

    def __init__(self, n: int, every: int):
        self.every = every
        self.exact = True
        # C arrays while filling: 8 bytes an entry as numpy's, but item assignment is faster
        self.alloc_delta = array("q", bytes(8 * n))
        self.reserved_delta = array("q", bytes(8 * n))
        self.seg_at: list[int] = []  # each segment entry, from the last
        self.seg_count: list[int] = []  # the segment count after it
        self.nsegs = np.zeros(n, np.int64)
        self.checkpoints: list[Layout] = []
        self.checkpoint_at: list[int] = []
        self.next_at = n - every  # the next checkpoint: the layout before this entry

    @classmethod
    def filled(
        cls, alloc_delta: np.ndarray, reserved_delta: np.ndarray, nsegs: np.ndarray, start: Layout
    ) -> Trail:
        """An exact trail of figures found without walking (lives.py), its one checkpoint the
        start (a recording makes the others when first asked)."""
        trail = cls(0, 1)
        trail.alloc_delta = array("q", np.ascontiguousarray(alloc_delta, np.int64).tobytes())
        trail.reserved_delta = array("q", np.ascontiguousarray(reserved_delta, np.int64).tobytes())
        trail.nsegs = np.asarray(nsegs, np.int64)
        trail.checkpoints = [start.copy()]
        trail.checkpoint_at = [0]
        return trail

    def checkpoint(self, lay: Layout, i: int) -> None:
        """Keep `lay`, the layout before entry i, as a checkpoint (the walk calls this once
        i reaches `next_at`, and at 0)."""
        self.checkpoints.append(lay.copy())
        self.checkpoint_at.append(i)
        self.next_at = i - spacing(lay, self.every)

    def finish(self, start_count: int) -> None:
        """Put the checkpoints in ascending order (the walk made them from the last), and fill
        `nsegs`: after an entry, the count after the last segment entry up to it, or
        `start_count` (the segments before the first entry) where there is none."""
        self.checkpoints.reverse()
        self.checkpoint_at.reverse()
        at = np.array(self.seg_at[::-1], np.int64)
        counts = np.array([start_count, *self.seg_count[::-1]], np.int64)
        n = len(self.nsegs)
        self.nsegs = counts[np.searchsorted(at, np.arange(n), side="right")]

    @staticmethod
    def window(lay: Layout, addr: int, size: int) -> _Window:
        """The segments a segment entry at [addr, +size) can touch, as comparable values."""
        lo, hi = _bounds(lay, addr, size)
        return _contents([lay.segs[b] for b in lay.bases[lo:hi]])

    def check_segment_step(
        self, lay: Layout, before: _Window, steps: Sequence[Step], i: int, rules: Rules
    ) -> None:
        """Clear `exact` unless entry i, applied forwards to `lay` (the walk just undid it),
        gives back `before` (`window` of the layout after it).

        Forwards, the entry reads and moves only segments in that window, so it is applied to a
        copy of just those.
        """
        _, addr, size, _ = steps[i]
        lo, hi = _bounds(lay, addr, size)
        part = Layout()
        for b in lay.bases[lo:hi]:
            part.bases.append(b)
            part.segs[b] = part_seg = lay.segs[b].copy()
            part.owned.add(part_seg)
        try:
            apply_step(part, steps, i, rules)
        except LayoutError:
            self.exact = False
            return
        if _contents([part.segs[b] for b in part.bases]) != before:
            self.exact = False
