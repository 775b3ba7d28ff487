"""Columns -> report, shared by both ways in: per-segment sums, releasable bytes, the
per-device figures and the total, the worst segments, the conservation check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.rules import page_size
from gpumemviz.analysis.fragmentation._util import blocks_of, pool_name
from gpumemviz.analysis.fragmentation.pools import pool_figures
from gpumemviz.analysis.fragmentation.report import (
    N_WORST,
    ConservationViolation,
    FragmentationReport,
    MemoryFigures,
    PoolFigures,
    PoolKey,
    SegmentSummary,
)
from gpumemviz.analysis.fragmentation.settings import parse_settings
from gpumemviz.analysis.fragmentation.tables import FreeBlocks, SegmentFigures

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import JsonDict

#: The rows of `_Columns.sums`, one value per segment: each integer figure of a device is the
#: sum of one row over the device's segments.
SUM_ROWS = (
    "total_size",
    "allocated",
    "pending_free",
    "free",
    "requested",
    "n_blocks",
    "free_trapped",  # free in non-expandable segments that still hold an allocated block
    "releasable_now",  # what empty_cache returns: default pool, private pools taken as released
    "releasable_private",  # the same in private pools in use (only once the pool is released)
    "stuck_expandable",  # free that stays in partial pages of expandable segments
    "n_free",
    "n_pending",
)


@dataclass(frozen=True)
class _Columns:
    """What both ways in give: per-segment columns, the summable ones as the rows of `sums`,
    plus the inactive and pending-free blocks in file order (for can_fit)."""

    sums: np.ndarray  # (len(SUM_ROWS), n) int64
    device: np.ndarray
    address: np.ndarray
    stream: np.ndarray
    is_small: np.ndarray
    is_expandable: np.ndarray
    pool_id: np.ndarray
    released: np.ndarray  # bool: empty_cache may release the segment's pool now
    largest_free: np.ndarray
    free_sq: np.ndarray  # f64: the exact sum of squared inactive sizes, rounded once
    releasable: np.ndarray
    stuck: np.ndarray  # free + pending_free - releasable: what empty_cache leaves
    bad_rows: np.ndarray  # segments whose blocks do not add up to total_size
    one_device: bool  # every segment on the same device
    default_pools: bool  # every segment on stream 0 in the default pool
    free_segment: np.ndarray  # inactive blocks: segment row, offset in segment, size
    free_offset: np.ndarray
    free_size: np.ndarray
    pend_segment: np.ndarray  # active_pending_free blocks, the same way
    pend_offset: np.ndarray
    pend_size: np.ndarray

    def row(self, name: str) -> np.ndarray:
        row: np.ndarray = self.sums[_ROW[name]]
        return row


_ROW = {name: i for i, name in enumerate(SUM_ROWS)}


def make_columns(
    *,
    device: np.ndarray,
    address: np.ndarray,
    total_size: np.ndarray,
    allocated: np.ndarray,
    requested: np.ndarray,
    n_blocks: np.ndarray,
    stream: np.ndarray,
    is_small: np.ndarray,
    is_expandable: np.ndarray,
    pool_id: np.ndarray,
    free_segment: np.ndarray,
    free_offset: np.ndarray,
    free_size: np.ndarray,
    pend_segment: np.ndarray,
    pend_offset: np.ndarray,
    pend_size: np.ndarray,
    config: AllocatorConfig,
    released: np.ndarray | None = None,
) -> _Columns:
    """`_Columns` from plain per-segment columns and the inactive and pending-free blocks;
    `released` marks the segments whose pool empty_cache may release (default: the default
    pool's; `pools.released_mask`)."""
    n = len(total_size)
    fstarts, pstarts = _starts(free_segment), _starts(pend_segment)
    free = _group(free_segment, fstarts, free_size, n, np.add)
    pend = _group(pend_segment, pstarts, pend_size, n, np.add)
    # Whole segments come back when nothing in them is allocated (empty_cache syncs first).
    releasable = np.where(allocated == 0, total_size, 0)
    for row in np.flatnonzero(is_expandable).tolist():
        page = page_size(bool(is_small[row]), config.large_segment_size)
        runs = [
            *blocks_of(free_segment, free_offset, free_size, row),
            *blocks_of(pend_segment, pend_offset, pend_size, row),
        ]
        releasable[row] = _whole_pages(runs, page)
    stuck = np.maximum(free + pend - releasable, 0)
    default_pool = ~np.asarray(pool_id.any(axis=1), dtype=bool)
    released = default_pool if released is None else released
    rel_now = np.where(released, releasable, 0)
    sums = np.stack(
        [
            total_size,
            allocated,
            pend,
            free,
            requested,
            n_blocks,
            np.where((allocated > 0) & ~is_expandable, free, 0),
            rel_now,
            releasable - rel_now,
            np.where(is_expandable & released, stuck, 0),
            _group(free_segment, fstarts, np.ones(len(free_segment), np.int64), n, np.add),
            _group(pend_segment, pstarts, np.ones(len(pend_segment), np.int64), n, np.add),
        ]
    ).astype(np.int64, copy=False)
    return _Columns(
        sums=sums,
        device=device,
        address=address,
        stream=stream,
        is_small=is_small,
        is_expandable=is_expandable,
        pool_id=pool_id,
        released=released,
        largest_free=_group(free_segment, fstarts, free_size, n, np.maximum),
        free_sq=_free_sq(free_segment, fstarts, free_size, n),
        releasable=releasable,
        stuck=stuck,
        bad_rows=np.flatnonzero(allocated + pend + free != total_size),
        one_device=not n or not (device != device[0]).any(),
        default_pools=not (stream.any() or pool_id.any()),
        free_segment=free_segment,
        free_offset=free_offset,
        free_size=free_size,
        pend_segment=pend_segment,
        pend_offset=pend_offset,
        pend_size=pend_size,
    )


# --------------------------------------------------------------------------------------------
# Shared: columns -> report


def _starts(seg: np.ndarray) -> np.ndarray:
    """Where each segment's run of blocks begins in `seg` (ascending: blocks come in file order)."""
    if not len(seg):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1])))


def _group(
    seg: np.ndarray, starts: np.ndarray, values: np.ndarray, n: int, ufunc: np.ufunc
) -> np.ndarray:
    """Reduce `values` per segment (zero where a segment has none)."""
    out = np.zeros(n, dtype=values.dtype)
    if len(starts):
        out[seg[starts]] = ufunc.reduceat(values, starts)
    return out


def _free_sq(seg: np.ndarray, starts: np.ndarray, size: np.ndarray, n: int) -> np.ndarray:
    """Per-segment sum of squared free block sizes, as float64.

    Squares of real block sizes overflow int64 (an 80 GiB block squared is 2^72), so the sum is
    taken exactly in units of 512 bytes (every real size is a multiple) and scaled by 2^18,
    exactly; odd sizes fall back to Python integers. Either way the result is the exact sum
    rounded once, so both paths give the same bits.
    """
    if not len(size):
        return np.zeros(n, dtype=np.float64)
    units = size >> 9
    if not np.any(size & 511) and int(size.max()) < (1 << 40):
        exact = _group(seg, starts, units * units, n, np.add)
        if int(exact.max()) < (1 << 62):
            return exact.astype(np.float64) * float(1 << 18)
    out = [0] * n
    for s, sz in zip(seg.tolist(), size.tolist(), strict=True):
        out[s] += sz * sz
    return np.array([float(v) for v in out], dtype=np.float64)


def reduce_columns(
    cols: _Columns,
    settings: object,
    devices: tuple[int, ...],
    parsed: tuple[AllocatorConfig, bool] | None = None,
    pools_in_use: bool | frozenset[tuple[int, int]] = True,
) -> FragmentationReport:
    """The report; `parsed` is `parse_settings(settings)` where the caller needed it already;
    `pools_in_use` is the assumption `cols.released` was made with."""
    config, expandable_mode = parsed or parse_settings(settings)
    if not expandable_mode and not isinstance(settings, Mapping):
        expandable_mode = bool(cols.is_expandable.any())
    row = cols.row
    c = SegmentFigures(
        device=cols.device,
        address=cols.address,
        total_size=row("total_size"),
        allocated=row("allocated"),
        pending_free=row("pending_free"),
        requested=row("requested"),
        free=row("free"),
        largest_free=cols.largest_free,
        free_sq=cols.free_sq,
        releasable=cols.releasable,
        n_blocks=row("n_blocks"),
        stream=cols.stream,
        is_small=cols.is_small,
        is_expandable=cols.is_expandable,
        pool_id=cols.pool_id,
    )
    n = len(cols.address)
    if cols.one_device:
        dev_ids = sorted({*devices, *([int(cols.device[0])] if n else [])})
    else:
        dev_ids = sorted({*devices, *cols.device.tolist()})
    by_device: dict[int, MemoryFigures] = {}
    if len(dev_ids) == 1:
        kw = _figures(c, cols, None)
        by_device[dev_ids[0]] = MemoryFigures(device=dev_ids[0], **kw)
        total = MemoryFigures(device=None, **kw)
    else:
        for d in dev_ids:
            by_device[d] = MemoryFigures(device=d, **_figures(c, cols, d))
        total = _total(list(by_device.values()), c)
    return FragmentationReport(
        total=total,
        devices=by_device,
        per_segment=c,
        allocator_settings=settings if isinstance(settings, Mapping) else None,
        config=config,
        expandable_mode=expandable_mode,
        pools_in_use=pools_in_use,
        free_blocks=FreeBlocks(
            segment=cols.free_segment,
            offset=cols.free_offset,
            size=cols.free_size,
            pending_segment=cols.pend_segment,
            pending_offset=cols.pend_offset,
            pending_size=cols.pend_size,
        ),
    )


def _whole_pages(runs: list[tuple[int, int]], page: int) -> int:
    """Whole pages inside the free runs of one mapped run, once pending frees complete
    (docs/allocator.md, Expandable segments).

    `runs` are (offset, size) of its free and pending-free blocks; adjacent ones merge. Pages
    are counted from the run's start, which is a page boundary of its reservation.
    """
    runs.sort()
    out = 0
    i = 0
    while i < len(runs):
        begin, end = runs[i][0], runs[i][0] + runs[i][1]
        i += 1
        while i < len(runs) and runs[i][0] == end:  # a pending block next to a free one
            end += runs[i][1]
            i += 1
        out += max(end // page * page - -(-begin // page) * page, 0)
    return out


def _figures(c: SegmentFigures, cols: _Columns, device: int | None) -> JsonDict:
    """The figures of one device's segments (None: all), as MemoryFigures keyword arguments."""
    if device is None:
        rows = None
        col = cols.sums.sum(axis=1).tolist()
        lfree = cols.largest_free
        sumsq = float(cols.free_sq.sum())
        bad = cols.bad_rows
    else:
        rows = np.flatnonzero(cols.device == device)
        col = cols.sums[:, rows].sum(axis=1).tolist()
        lfree = cols.largest_free[rows]
        sumsq = float(cols.free_sq[rows].sum())
        bad = cols.bad_rows[cols.device[cols.bad_rows] == device]
    (
        reserved,
        allocated,
        pending,
        free,
        requested,
        n_blocks,
        trapped,
        rel,
        rel_private,
        sliver,
        n_free_blocks,
        n_pending,
    ) = col
    largest = int(lfree.max()) if len(lfree) else 0
    return {
        "reserved": reserved,
        "allocated": allocated,
        "active": allocated + pending,
        "requested": requested,
        "pending_free": pending,
        "internal_waste": allocated - requested,
        "free": free,
        "free_trapped": trapped,
        "free_stuck": max(free + pending - rel, 0),
        "free_stuck_expandable": sliver,
        "releasable": rel,
        "releasable_private": rel_private,
        "largest_free": largest,
        "external_fragmentation": _ext(largest, free),
        "fragmentation_sq": _frag_sq(sumsq, free),
        "segments": len(lfree),
        "blocks": n_blocks,
        "blocks_allocated": n_blocks - n_free_blocks - n_pending,
        "blocks_pending_free": n_pending,
        "blocks_free": n_free_blocks,
        "largest_free_by_pool": _largest_by_pool(c, rows, cols.default_pools),
        "worst_segments": _worst(c, rows, cols.stuck),
        "violations": _violations(c, bad),
        "pools": _pools(c, cols, rows),
    }


def _pools(c: SegmentFigures, cols: _Columns, rows: np.ndarray | None) -> tuple[PoolFigures, ...]:
    """The figures of each pool of the given segments (None: all)."""

    def pick(a: np.ndarray) -> np.ndarray:
        return a if rows is None else a[rows]

    sums = {
        "total_size": pick(c.total_size),
        "allocated": pick(c.allocated),
        "pending_free": pick(c.pending_free),
        "free": pick(c.free),
        "releasable": pick(cols.releasable),
    }
    return pool_figures(
        pick(c.device), pick(c.pool_id), sums, pick(cols.largest_free), pick(cols.released)
    )


def _total(figs: list[MemoryFigures], c: SegmentFigures) -> MemoryFigures:
    """All devices together: the byte and block counts add up; the rest is derived again."""
    summed = {name: sum(getattr(f, name) for f in figs) for name in _SUMMED}
    largest = max((f.largest_free for f in figs), default=0)
    by_pool: dict[PoolKey, int] = {}
    worst: list[SegmentSummary] = []
    violations: list[ConservationViolation] = []
    pools: list[PoolFigures] = []
    for f in figs:
        pools.extend(f.pools)
        by_pool.update(f.largest_free_by_pool)
        worst.extend(f.worst_segments)
        violations.extend(f.violations)
    worst.sort(key=lambda s: (-s.stuck_free, s.index))
    return MemoryFigures(
        device=None,
        **summed,
        largest_free=largest,
        external_fragmentation=_ext(largest, summed["free"]),
        fragmentation_sq=_frag_sq(float(c.free_sq.sum()), summed["free"]),
        largest_free_by_pool=by_pool,
        worst_segments=tuple(worst[:N_WORST]),
        violations=tuple(violations),
        pools=tuple(pools),
    )


# the MemoryFigures fields that add up over devices (everything but the derived ones)
_SUMMED = tuple(
    f.name
    for f in fields(MemoryFigures)
    if f.name
    not in {
        "device",
        "largest_free",
        "external_fragmentation",
        "fragmentation_sq",
        "largest_free_by_pool",
        "worst_segments",
        "violations",
        "pools",
    }
)


def _ext(largest: int, free: int) -> float:
    return 0.0 if free <= 0 else 1.0 - largest / free


def _frag_sq(sumsq: float, free: int) -> float:
    return 0.0 if free <= 0 else 1.0 - sumsq / (float(free) * float(free))


def _largest_by_pool(
    c: SegmentFigures, rows: np.ndarray | None, default_pools: bool
) -> dict[PoolKey, int]:
    """The largest inactive block of each (device, stream, pool) holding free bytes."""
    free = c.free if rows is None else c.free[rows]
    lfree = c.largest_free if rows is None else c.largest_free[rows]
    small = c.is_small if rows is None else c.is_small[rows]
    device = c.device if rows is None else c.device[rows]
    out: dict[PoolKey, int] = {}
    if not len(free):
        return out
    has_free = free > 0
    if default_pools and (rows is not None or not (device != device[0]).any()):
        d = int(device[0])  # one device, stream 0, the default pool: two maxima
        for flag in (False, True):
            sel = has_free & (small == flag)
            if sel.any():
                out[PoolKey(d, 0, pool_name(flag), (0, 0))] = int(lfree[sel].max())
        return out
    idx = np.flatnonzero(has_free) if rows is None else rows[has_free]
    keys = (c.device[idx], c.stream[idx], c.pool_id[idx, 0], c.pool_id[idx, 1], c.is_small[idx])
    # plain tuples first: one PoolKey per pool, not per segment
    best: dict[tuple[int, int, int, int, bool], int] = {}
    rows_keys = zip(*(k.tolist() for k in keys), strict=True)
    for key, v in zip(rows_keys, c.largest_free[idx].tolist(), strict=True):
        if v > best.get(key, -1):
            best[key] = v
    for (d, s, pa, pb, flag), v in best.items():
        out[PoolKey(d, s, pool_name(flag), (pa, pb))] = v
    return out


def _worst(
    c: SegmentFigures, rows: np.ndarray | None, stuck_all: np.ndarray
) -> tuple[SegmentSummary, ...]:
    """The N_WORST segments by free bytes that empty_cache cannot return (ties: file order)."""
    idx = np.flatnonzero(stuck_all) if rows is None else rows[stuck_all[rows] > 0]
    if not len(idx):
        return ()
    if len(idx) > N_WORST:
        idx = idx[np.argpartition(-stuck_all[idx], N_WORST - 1)[:N_WORST]]
    chosen = sorted(zip((-stuck_all[idx]).tolist(), idx.tolist(), strict=True))
    return tuple(_summary(c, i, -neg) for neg, i in chosen)


def _summary(c: SegmentFigures, i: int, stuck: int) -> SegmentSummary:
    return SegmentSummary(
        index=i,
        device=c.device.item(i),
        address=c.address.item(i),
        total_size=c.total_size.item(i),
        allocated=c.allocated.item(i),
        pending_free=c.pending_free.item(i),
        free=c.free.item(i),
        largest_free=c.largest_free.item(i),
        releasable=c.releasable.item(i),
        stuck_free=stuck,
        stream=c.stream.item(i),
        pool=pool_name(c.is_small.item(i)),
        is_expandable=c.is_expandable.item(i),
        n_blocks=c.n_blocks.item(i),
        pool_id=(c.pool_id.item(i, 0), c.pool_id.item(i, 1)),
    )


def _violations(c: SegmentFigures, bad: np.ndarray) -> tuple[ConservationViolation, ...]:
    return tuple(
        ConservationViolation(
            index=i,
            device=c.device.item(i),
            address=c.address.item(i),
            total_size=c.total_size.item(i),
            blocks_sum=c.allocated.item(i) + c.pending_free.item(i) + c.free.item(i),
        )
        for i in bad.tolist()
    )
