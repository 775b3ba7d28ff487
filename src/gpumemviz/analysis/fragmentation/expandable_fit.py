"""Where an allocation lands in expandable mode, for `fit.can_fit`: the expandable-size walk
among cached blocks (`expandable_walk`) and the pages `find_expandable_block` and `map_block`
would map (`pages_to_map`), on the mapped runs a snapshot records."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator.rules import page_size
from gpumemviz.analysis.fragmentation._util import blocks_of
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.analysis.fragmentation.tables import FreeBlocks, SegmentFigures

__all__ = ["expandable_walk", "pages_to_map"]


def expandable_walk(c: SegmentFigures, free: FreeBlocks, cand: np.ndarray) -> int:
    """The expandable-size walk: prefer blocks that cannot grow over a growable (tail) block.

    A block's "expandable size" is its size plus the unmapped range after it: for the last free
    block of a mapped run, the gap to the next run of the same stream and pool, or (after the
    last run) the rest of the reservation, which the snapshot does not record and which counts
    as unbounded. The walk moves on while the next candidate's expandable size is smaller.
    `cand` are rows of `free`, in best-fit order.
    """

    def grows(k: int) -> float:
        i = int(cand[k])
        row = int(free.segment[i])
        size = int(free.size[i])
        if int(free.offset[i]) + size != int(c.total_size[row]):
            return float(size)
        nxt = _next_run(c, row)
        end = int(c.address[row] + c.total_size[row])
        return float("inf") if nxt is None else float(size + int(c.address[nxt]) - end)

    pick = 0
    here = grows(0)
    while pick + 1 < len(cand) and c.is_expandable[free.segment[cand[pick + 1]]]:
        there = grows(pick + 1)
        if not there < here:
            break
        pick += 1
        here = there
    return pick


def _next_run(c: SegmentFigures, row: int) -> int | None:
    """The next mapped run above `row` of the same device, stream and pool, if any."""
    same = np.flatnonzero(
        c.is_expandable
        & (c.device == c.device[row])
        & (c.stream == c.stream[row])
        & (c.is_small == c.is_small[row])
        & (c.pool_id[:, 0] == c.pool_id[row, 0])
        & (c.pool_id[:, 1] == c.pool_id[row, 1])
        & (c.address > c.address[row])
    )
    return None if not len(same) else int(same[np.argmin(c.address[same])])


def pages_to_map(
    c: SegmentFigures,
    free: FreeBlocks,
    large_segment_size: int,
    rounded: int,
    stream: int,
    device: int,
    small: bool,
    flushed: bool = False,
    pool_id: tuple[int, int] = (0, 0),
) -> tuple[int, str]:
    """Bytes an expandable allocation maps, as `find_expandable_block` and `map_block` do.

    The unmapped ranges of the stream's pool are tried in address order: the gaps between its
    mapped runs (one reservation, starting at the lowest run, is assumed: the snapshot does not
    record reservations), then the space after the last run. A range is taken when, counted
    from the free block just before it and through every free block and unmapped range after
    it, there are `rounded` bytes in a row; then only the missing part is mapped, in whole pages
    (docs/allocator.md, Expandable segments). `flushed`: the layout after the allocator's own
    flush, which completes the pending frees and unmaps every whole free page first, so the
    tail it grows shrinks. `large_segment_size` is the recorded setting's (`page_size`).
    """
    page = page_size(small, large_segment_size)
    rows = np.flatnonzero(
        (c.device == device)
        & (c.stream == stream)
        & (c.is_small == small)
        & c.is_expandable
        & (c.pool_id[:, 0] == pool_id[0])
        & (c.pool_id[:, 1] == pool_id[1])
    )
    rows = rows[np.argsort(c.address[rows], kind="stable")].tolist()
    runs: list[tuple[int, int, int, int]] = []  # (address, total, free head, free tail)
    for row in rows:
        runs.extend(_flushed_pieces(c, free, row, page) if flushed else [_run_shape(c, free, row)])
    base = int(c.address[rows[0]]) if rows else 0
    found = _first_fit(runs, base, rounded, page)
    if found is not None:
        mapped, tail, gap_at = found
        where = (
            f"after the {format_size(tail)} free tail at 0x{gap_at - tail:x}"
            if tail
            else f"at 0x{gap_at:x} of its reservation"
        )
        return mapped, f"{mapped // page} more {format_size(page)} page(s) mapped {where}"
    need = -(-rounded // page) * page
    return need, f"{need // page} {format_size(page)} page(s) of a new expandable segment"


def _first_fit(
    runs: list[tuple[int, int, int, int]], base: int, rounded: int, page: int
) -> tuple[int, int, int] | None:
    """`find_expandable_block` over mapped runs (address, total, free head, free tail) of one
    reservation from `base`: (bytes mapped, free tail used, address of the unmapped range), or
    None when no unmapped range of the reservation serves (a new reservation then)."""
    if not runs:
        return None
    # the reservation in address order: ("gap", size) and ("run", total, head, tail)
    items: list[tuple[str, float, int, int]] = []
    at = base
    for addr, total, head, tail in runs:
        if addr > at:
            items.append(("gap", float(addr - at), 0, 0))
        items.append(("run", float(total), head, tail))
        at = addr + total
    items.append(("gap", float("inf"), 0, 0))
    ends = []  # address of each item's end
    at = base
    for _kind, size, _, _ in items:
        at = at + int(size) if size != float("inf") else at
        ends.append(at)
    for g, (kind, _, _, _) in enumerate(items):
        if kind != "gap":
            continue
        tail = items[g - 1][3] if g and items[g - 1][0] == "run" else 0
        have, mapped = tail, 0
        for kind2, size, head, _ in items[g:]:
            if have >= rounded:
                break
            if kind2 == "gap":
                take = min(size, rounded - have)
                pages = -(-int(take) // page) * page
                mapped += pages
                have += pages
            else:
                have += head
                if head != size:
                    break
        if have >= rounded:
            return mapped, tail, ends[g - 1] if g else base
    return None


def _flushed_pieces(
    c: SegmentFigures, free: FreeBlocks, row: int, page: int
) -> list[tuple[int, int, int, int]]:
    """A mapped run after the flush: its free and pending-free ranges lose their whole pages,
    which splits it into mapped pieces (address, total, free head, free tail)."""
    start = int(c.address[row])
    total = int(c.total_size[row])
    blocks = sorted(
        [
            *blocks_of(free.segment, free.offset, free.size, row),
            *blocks_of(free.pending_segment, free.pending_offset, free.pending_size, row),
        ]
    )
    ranges: list[list[int]] = []  # merged free ranges, offsets in the run
    for off, size in blocks:
        if ranges and ranges[-1][1] == off:
            ranges[-1][1] = off + size
        else:
            ranges.append([off, off + size])
    pieces: list[tuple[int, int, int, int]] = []
    lo = head = 0  # the current piece's start and free head (offsets in the run)
    for b, e in ranges:
        ub, ue = -(-b // page) * page, e // page * page
        if ub >= ue:  # no whole page inside: the range stays mapped
            if b == lo:
                head = e - b
            continue
        if ub > lo:  # a piece ends here, with the sliver [b, ub) as its free tail
            pieces.append((start + lo, ub - lo, head, ub - b))
        lo, head = ue, e - ue
    if lo < total:
        last_b, last_e = ranges[-1] if ranges else (0, 0)
        pieces.append((start + lo, total - lo, head, total - last_b if last_e == total else 0))
    return pieces


def _run_shape(c: SegmentFigures, free: FreeBlocks, row: int) -> tuple[int, int, int, int]:
    """A mapped run's address, total size, free head and free tail."""
    sel = np.flatnonzero(free.segment == row)
    total = int(c.total_size[row])
    offs = free.offset[sel]
    sizes = free.size[sel]
    lead = int(sizes[offs == 0].sum())
    tail = int(sizes[offs + sizes == total].sum())
    return int(c.address[row]), total, lead, tail
