"""Private pools in the analysis: the in-use assumption, and the figures of each pool.

A snapshot records which pool each segment is in (``segment_pool_id``) but not whether the pool
is still in use (its use count: a live MemPool, a graph not yet reset). empty_cache releases a
private pool's free segments only once its use count is 0 (docs/private-pools.md), so the
analysis assumes every private pool is in use unless told otherwise (`snapshot.pools`:
`normalize_in_use`, `released_mask`, which the map's rows share).
"""

from __future__ import annotations

import numpy as np

from gpumemviz.analysis.fragmentation.report import PoolFigures
from gpumemviz.snapshot.pools import (
    PoolsInUse,
    normalize_in_use,
    pool_kind,
    pool_label,
    released_mask,
)

__all__ = ["ASSUMED_IN_USE", "PoolsInUse", "normalize_in_use", "pool_figures", "released_mask"]

#: Shown wherever private pools' figures are (inspect, the HTML report), under the default
#: assumption.
ASSUMED_IN_USE = (
    "private pools are assumed in use (a snapshot does not record a pool's use count): "
    "empty_cache() returns their free segments only after the pool is released (MemPool "
    "deleted, CUDA graph reset)"
)


def pool_figures(
    device: np.ndarray,
    pool_id: np.ndarray,
    sums: dict[str, np.ndarray],
    largest_free: np.ndarray,
    released: np.ndarray,
) -> tuple[PoolFigures, ...]:
    """One `PoolFigures` per (device, pool) of the given segments, by device, then the default
    pool first and the private ones by id.

    `sums` holds per-segment columns: total_size, allocated, pending_free, free, releasable
    (whole bytes empty_cache returns once the pool may be released); `released` is
    `released_mask` of the same segments.
    """
    if not len(device):
        return ()
    if not pool_id.any() and not (device != device[0]).any():  # the common case: one pool
        uniq = np.array([[int(device[0]), 0, 0]], dtype=np.int64)
        order = np.arange(len(device))
        starts = np.zeros(1, dtype=np.int64)
    else:
        keys = np.column_stack([device, pool_id])
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        order = np.argsort(inverse.reshape(-1), kind="stable")  # segments pool by pool
        starts = np.searchsorted(inverse.reshape(-1)[order], np.arange(len(uniq)))

    def add(values: np.ndarray, ufunc: np.ufunc = np.add) -> list[int]:
        """Per pool, exactly (int64, no float weights)."""
        out = ufunc.reduceat(np.asarray(values, dtype=np.int64)[order], starts)
        return [int(v) for v in out.tolist()]

    rel = sums["releasable"]
    now = add(np.where(released, rel, 0))
    later = add(np.where(released, 0, rel))
    reserved, allocated = add(sums["total_size"]), add(sums["allocated"])
    pending, free = add(sums["pending_free"]), add(sums["free"])
    count = add(np.ones(len(device), dtype=np.int64))
    largest = add(largest_free, np.maximum)
    first = order[starts]  # a segment of each pool: its `released` is the pool's
    out: list[PoolFigures] = []
    for i, (d, a, b) in enumerate(uniq.tolist()):
        pid = (int(a), int(b))
        out.append(
            PoolFigures(
                device=int(d),
                pool_id=pid,
                kind=pool_kind(pid),
                label=pool_label(pid),
                in_use=pid == (0, 0) or not bool(released[first[i]]),
                reserved=reserved[i],
                allocated=allocated[i],
                pending_free=pending[i],
                free=free[i],
                largest_free=largest[i],
                releasable=now[i],
                releasable_after_release=later[i],
                segments=count[i],
            )
        )
    out.sort(key=lambda p: (p.device, p.pool_id != (0, 0), p.pool_id))
    return tuple(out)
