"""Columns -> report, shared by both ways in: per-segment sums, releasable bytes, the
per-device figures and the total, the worst segments, the conservation check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..allocator.config import AllocatorConfig, ConfigError
from ..allocator.rules import page_size
from .report import (
    N_WORST,
    ConservationViolation,
    FragmentationReport,
    MemoryFigures,
    PoolKey,
    SegmentFigures,
    SegmentSummary,
    _pool_name,
)


@dataclass(frozen=True)
class _Columns:
    """What both paths extract: per-segment columns (sums over each segment's blocks included)
    plus the inactive and pending-free blocks, in file order."""

    device: np.ndarray
    address: np.ndarray
    total_size: np.ndarray
    allocated: np.ndarray
    requested: np.ndarray
    n_blocks: np.ndarray
    stream: np.ndarray
    is_small: np.ndarray
    is_expandable: np.ndarray
    pool_id: np.ndarray
    free: np.ndarray  # per segment: sum, largest and count of inactive blocks
    largest_free: np.ndarray
    n_free: np.ndarray
    free_sq: np.ndarray  # f64: the exact sum of squared inactive sizes, rounded once
    pending_free: np.ndarray  # per segment: sum and count of active_pending_free blocks
    n_pending: np.ndarray
    free_segment: np.ndarray  # inactive blocks: segment row, offset in segment, size
    free_offset: np.ndarray
    free_size: np.ndarray
    pend_segment: np.ndarray  # active_pending_free blocks, the same way
    pend_offset: np.ndarray
    pend_size: np.ndarray
    releasable: np.ndarray | None = None  # per segment, where a path computed it already


def _block_sums(
    free_segment: np.ndarray,
    free_size: np.ndarray,
    pend_segment: np.ndarray,
    pend_size: np.ndarray,
    n: int,
) -> dict[str, np.ndarray]:
    """The per-segment block sums of `_Columns`, from the block lists (the numpy paths)."""
    fstarts = _starts(free_segment)
    pstarts = _starts(pend_segment)
    ones = np.ones(len(free_segment), dtype=np.int64)
    return {
        "free": _group(free_segment, fstarts, free_size, n, np.add),
        "largest_free": _group(free_segment, fstarts, free_size, n, np.maximum),
        "n_free": _group(free_segment, fstarts, ones, n, np.add),
        "free_sq": _free_sq(free_segment, fstarts, free_size, n),
        "pending_free": _group(pend_segment, pstarts, pend_size, n, np.add),
        "n_pending": _group(
            pend_segment, pstarts, np.ones(len(pend_segment), dtype=np.int64), n, np.add
        ),
    }


def _settings(settings: Any) -> tuple[AllocatorConfig, bool]:
    """The recorded allocator settings; a malformed settings string falls back to the dict.

    Parsed configs are remembered by the settings' repr (a sampler analyses the same settings
    twice a second, and parsing costs more than analysing a small snapshot).
    """
    if not isinstance(settings, Mapping):
        return _DEFAULT_CONFIG, False
    key = repr(settings)
    config = _CONFIGS.get(key)
    if config is None:
        try:
            config = AllocatorConfig.from_settings(settings)
        except ConfigError:
            rest = {k: v for k, v in settings.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
            config = AllocatorConfig.from_settings(rest)
        if len(_CONFIGS) >= 64:
            _CONFIGS.clear()
        _CONFIGS[key] = config
    return config, config.expandable_segments


_DEFAULT_CONFIG = AllocatorConfig()
_CONFIGS: dict[str, AllocatorConfig] = {}


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


def _reduce(
    cols: _Columns,
    settings: Any,
    devices: tuple[int, ...],
    parsed: tuple[AllocatorConfig, bool] | None = None,
) -> FragmentationReport:
    """The report; `parsed` is `_settings(settings)` where the caller needed it already."""
    config, expandable_mode = parsed or _settings(settings)
    n = len(cols.total_size)
    if not expandable_mode and not isinstance(settings, Mapping):
        expandable_mode = bool(cols.is_expandable.any())
    releasable = cols.releasable
    if releasable is None:
        # Whole segments come back when nothing in them is allocated (empty_cache syncs first)
        releasable = np.where(cols.allocated == 0, cols.total_size, 0)
        for row in np.flatnonzero(cols.is_expandable).tolist():
            page = page_size(bool(cols.is_small[row]), config.large_segment_size)
            releasable[row] = _expandable_releasable(cols, row, page)
    c = SegmentFigures(
        device=cols.device,
        address=cols.address,
        total_size=cols.total_size,
        allocated=cols.allocated,
        pending_free=cols.pending_free,
        requested=cols.requested,
        free=cols.free,
        largest_free=cols.largest_free,
        free_sq=cols.free_sq,
        releasable=releasable,
        n_blocks=cols.n_blocks,
        stream=cols.stream,
        is_small=cols.is_small,
        is_expandable=cols.is_expandable,
        pool_id=cols.pool_id,
    )
    present = [int(c.device[0])] if n and (c.device == c.device[0]).all() else c.device.tolist()
    dev_ids = sorted({*devices, *present})
    stuck = c.stuck_free
    default_pool = ~c.pool_id.any(axis=1)
    conserved = c.allocated + c.pending_free + c.free == c.total_size
    rel_default = np.where(default_pool, releasable, 0)
    # every integer figure is a column sum: one reduction per device for all of them
    sums = np.stack(
        [
            c.total_size,
            c.allocated,
            c.pending_free,
            c.free,
            c.requested,
            c.n_blocks,
            np.where((c.allocated > 0) & ~c.is_expandable, c.free, 0),
            rel_default,
            releasable - rel_default,
            np.where(c.is_expandable & default_pool, stuck, 0),
            cols.n_free,
            cols.n_pending,
        ]
    )
    by_device: dict[int, MemoryFigures] = {}
    if len(dev_ids) == 1:
        kw = _figures(c, None, sums, conserved, stuck)
        by_device[dev_ids[0]] = MemoryFigures(device=dev_ids[0], **kw)
        total = MemoryFigures(device=None, **kw)
    else:
        for d in dev_ids:
            rows = np.flatnonzero(c.device == d)
            by_device[d] = MemoryFigures(device=d, **_figures(c, rows, sums, conserved, stuck))
        total = _total(list(by_device.values()), c)
    return FragmentationReport(
        total=total,
        devices=by_device,
        per_segment=c,
        allocator_settings=settings if isinstance(settings, Mapping) else None,
        config=config,
        expandable_mode=expandable_mode,
        _free_segment=cols.free_segment,
        _free_offset=cols.free_offset,
        _free_size=cols.free_size,
        _pend_segment=cols.pend_segment,
        _pend_offset=cols.pend_offset,
        _pend_size=cols.pend_size,
    )


def _expandable_releasable(cols: _Columns, row: int, page: int) -> int:
    """Whole pages inside the free runs of one mapped run, once pending frees complete (2.13).

    Pages are counted from the run's start, which is a page boundary of its reservation.
    """
    runs = sorted(
        [
            *_blocks_of(cols.free_segment, cols.free_offset, cols.free_size, row),
            *_blocks_of(cols.pend_segment, cols.pend_offset, cols.pend_size, row),
        ]
    )
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


def _blocks_of(
    seg: np.ndarray, offset: np.ndarray, size: np.ndarray, row: int
) -> list[tuple[int, int]]:
    """(offset, size) of one segment's blocks; `seg` is ascending, so two binary searches."""
    lo, hi = np.searchsorted(seg, [row, row + 1])
    return list(zip(offset[lo:hi].tolist(), size[lo:hi].tolist(), strict=True))


def _figures(
    c: SegmentFigures,
    rows: np.ndarray | None,
    sums: np.ndarray,
    conserved: np.ndarray,
    stuck: np.ndarray,
) -> dict[str, Any]:
    """The figures of the segments in `rows` (None: all), as MemoryFigures keyword arguments."""
    if rows is None:
        col = sums.sum(axis=1).tolist()
        lfree = c.largest_free
        sumsq = float(c.free_sq.sum())
    else:
        col = sums[:, rows].sum(axis=1).tolist()
        lfree = c.largest_free[rows]
        sumsq = float(c.free_sq[rows].sum())
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
        "largest_free_by_pool": _largest_by_pool(c, rows),
        "worst_segments": _worst(c, rows, stuck),
        "violations": _violations(c, rows, conserved),
    }


def _total(figs: list[MemoryFigures], c: SegmentFigures) -> MemoryFigures:
    free = sum(f.free for f in figs)
    largest = max((f.largest_free for f in figs), default=0)
    sumsq = float(c.free_sq.sum())
    by_pool: dict[PoolKey, int] = {}
    worst: list[SegmentSummary] = []
    violations: list[ConservationViolation] = []
    for f in figs:
        by_pool.update(f.largest_free_by_pool)
        worst.extend(f.worst_segments)
        violations.extend(f.violations)
    worst.sort(key=lambda s: (-s.stuck_free, s.index))

    def add(name: str) -> int:
        return sum(getattr(f, name) for f in figs)

    return MemoryFigures(
        device=None,
        reserved=add("reserved"),
        allocated=add("allocated"),
        active=add("active"),
        requested=add("requested"),
        pending_free=add("pending_free"),
        internal_waste=add("internal_waste"),
        free=free,
        free_trapped=add("free_trapped"),
        free_stuck=add("free_stuck"),
        free_stuck_expandable=add("free_stuck_expandable"),
        releasable=add("releasable"),
        releasable_private=add("releasable_private"),
        largest_free=largest,
        external_fragmentation=_ext(largest, free),
        fragmentation_sq=_frag_sq(sumsq, free),
        segments=add("segments"),
        blocks=add("blocks"),
        blocks_allocated=add("blocks_allocated"),
        blocks_pending_free=add("blocks_pending_free"),
        blocks_free=add("blocks_free"),
        largest_free_by_pool=by_pool,
        worst_segments=tuple(worst[:N_WORST]),
        violations=tuple(violations),
    )


def _ext(largest: int, free: int) -> float:
    return 0.0 if free <= 0 else 1.0 - largest / free


def _frag_sq(sumsq: float, free: int) -> float:
    return 0.0 if free <= 0 else 1.0 - sumsq / (float(free) * float(free))


def _largest_by_pool(c: SegmentFigures, rows: np.ndarray | None) -> dict[PoolKey, int]:
    idx = np.flatnonzero(c.free > 0) if rows is None else rows[c.free[rows] > 0]
    if not len(idx):
        return {}
    keys = (c.device[idx], c.stream[idx], c.pool_id[idx, 0], c.pool_id[idx, 1])
    small = c.is_small[idx]
    lfree = c.largest_free[idx]
    out: dict[PoolKey, int] = {}
    uniform = not (keys[1].any() or keys[2].any() or keys[3].any())  # stream 0, default pool
    if uniform and (rows is not None or not (keys[0] != keys[0][0]).any()):
        d, s, pa, pb = (int(k[0]) for k in keys)
        for flag in (False, True):
            sel = lfree[small == flag]
            if len(sel):
                out[PoolKey(d, s, _pool_name(flag), (pa, pb))] = int(sel.max())
        return out
    best: dict[tuple, int] = {}  # plain tuples first: one PoolKey per pool, not per segment
    rows_keys = zip(*(k.tolist() for k in keys), small.tolist(), strict=True)
    for key, v in zip(rows_keys, lfree.tolist(), strict=True):
        if v > best.get(key, -1):
            best[key] = v
    for (d, s, pa, pb, flag), v in best.items():
        out[PoolKey(d, s, _pool_name(flag), (pa, pb))] = v
    return out


def _worst(
    c: SegmentFigures, rows: np.ndarray | None, stuck_all: np.ndarray
) -> tuple[SegmentSummary, ...]:
    idx = np.arange(len(c)) if rows is None else rows
    stuck = stuck_all[idx]
    nz = np.flatnonzero(stuck > 0)
    if not len(nz):
        return ()
    if len(nz) > N_WORST:
        part = np.argpartition(-stuck[nz], N_WORST - 1)[:N_WORST]
        nz = nz[part]
    chosen = sorted(idx[nz].tolist(), key=lambda i: (-int(stuck_all[i]), i))
    return tuple(_summary(c, i, int(stuck_all[i])) for i in chosen)


def _summary(c: SegmentFigures, i: int, stuck: int) -> SegmentSummary:
    free = int(c.free[i])
    rel = int(c.releasable[i])
    return SegmentSummary(
        index=i,
        device=int(c.device[i]),
        address=int(c.address[i]),
        total_size=int(c.total_size[i]),
        allocated=int(c.allocated[i]),
        pending_free=int(c.pending_free[i]),
        free=free,
        largest_free=int(c.largest_free[i]),
        releasable=rel,
        stuck_free=stuck,
        stream=int(c.stream[i]),
        pool=_pool_name(bool(c.is_small[i])),
        is_expandable=bool(c.is_expandable[i]),
        n_blocks=int(c.n_blocks[i]),
    )


def _violations(
    c: SegmentFigures, rows: np.ndarray | None, conserved: np.ndarray
) -> tuple[ConservationViolation, ...]:
    idx = np.arange(len(c)) if rows is None else rows
    bad = idx[~conserved[idx]]
    return tuple(
        ConservationViolation(
            index=int(i),
            device=int(c.device[i]),
            address=int(c.address[i]),
            total_size=int(c.total_size[i]),
            blocks_sum=int(c.allocated[i] + c.pending_free[i] + c.free[i]),
        )
        for i in bad.tolist()
    )
