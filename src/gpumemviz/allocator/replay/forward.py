"""One recorded trace entry applied forwards at its recorded address: `apply_step`.

The recording (recording.py) applies entries forwards to move between checkpoints, and the
backward walk (reconstruct.py) uses the same moves to prove that a forward pass would retrace
it exactly; both need the one definition here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumemviz.allocator.replay.layout import ALLOCATED, PENDING_FREE, Layout, LayoutError
from gpumemviz.allocator.rules import is_small, page_size, should_split

if TYPE_CHECKING:
    from gpumemviz.allocator.replay.steps import Rules, Step

__all__ = ["apply_step", "pool_ahead"]


def pool_ahead(steps: Sequence[Step], i: int, rules: Rules) -> bool:
    """Small pool? for a new mapped range: the alloc that caused the map follows it."""
    for j in range(i + 1, len(steps)):
        if steps[j][0] == "alloc":
            return is_small(rules.round(steps[j][2]))
    return steps[i][2] % page_size(False) != 0


def apply_step(lay: Layout, steps: Sequence[Step], i: int, rules: Rules) -> int:
    """Apply step `i` forwards at its recorded address.

    Parameters
    ----------
    lay
        The layout before the step (changed in place).
    steps
        The whole trace (a new mapping's pool is read from the alloc that follows it).
    i
        Which step.
    rules
        Rounding and max_split_size: an alloc's block is the request rounded, or the whole
        free block where torch would not split it.

    Returns
    -------
    int
        The change in allocated bytes.

    Raises
    ------
    LayoutError
        When the step does not fit the layout.
    """
    action, addr, size, stream = steps[i]
    if action == "alloc":
        seg, start, end = lay.free_region(addr)
        if start != addr:
            raise LayoutError(f"no free block starts at {addr:#x}")
        rounded = rules.round(size)
        split = should_split(
            end - start,
            rounded,
            small=seg.small,
            expandable=seg.expandable,
            max_split_size=rules.max_split_size,
        )
        bsize = rounded if split else end - start
        lay.carve(addr, bsize, ALLOCATED, size, "alloc")
        return bsize
    if action == "free_requested":
        return -lay.set_state(addr, PENDING_FREE, "free_requested", only=ALLOCATED)
    if action == "free_completed":
        was, size_was = lay.release(addr, "free_completed")
        return -size_was if was == ALLOCATED else 0
    if action == "segment_alloc":
        lay.add_segment(addr, size, stream, size == page_size(True), "segment_alloc")
    elif action == "segment_free":
        lay.remove_segment(addr, size, "segment_free")
    elif action == "segment_map":
        lay.map_range(addr, size, stream, pool_ahead(steps, i, rules), "segment_map")
    elif action == "segment_unmap":
        lay.unmap_range(addr, size, "segment_unmap")
    return 0
