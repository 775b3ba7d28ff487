"""Private pools in the analysis: the in-use assumption, and the figures of each pool.

A snapshot records which pool each segment is in (``segment_pool_id``) but not whether the pool
is still in use (its use count: a live MemPool, a graph not yet reset). empty_cache releases a
private pool's free segments only once its use count is 0 (torch-allocator.md, 2.14), so the
analysis assumes every private pool is in use unless told otherwise (`normalize_in_use`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..snapshot.pools import pool_kind, pool_label
from .report import PoolFigures

#: Shown wherever private pools' figures are (inspect, the HTML report), under the default
#: assumption.
ASSUMED_IN_USE = (
    "private pools are assumed in use (a snapshot does not record a pool's use count): "
    "empty_cache() returns their free segments only after the pool is released (MemPool "
    "deleted, CUDA graph reset)"
)

#: What `fragmentation(..., pools_in_use=)` takes: True (every private pool in use), False
#: (every one released) or the ids of the pools in use.
PoolsInUse = bool | Iterable[tuple[int, int]]


def normalize_in_use(pools_in_use: object) -> bool | frozenset[tuple[int, int]]:
    """True, False, or a frozenset of (int, int) pool ids; a one-line ValueError otherwise.

    >>> normalize_in_use(True), sorted(normalize_in_use([(0, 1), [0, 2]]))
    (True, [(0, 1), (0, 2)])
    """
    if isinstance(pools_in_use, bool):
        return pools_in_use
    bad = ValueError(
        "pools_in_use must be True, False or a collection of pool ids such as [(0, 1)], got "
        f"{pools_in_use!r:.80}"
    )
    if isinstance(pools_in_use, str | bytes) or not isinstance(pools_in_use, Iterable):
        raise bad
    out: set[tuple[int, int]] = set()
    for p in pools_in_use:
        if not (
            isinstance(p, tuple | list)
            and len(p) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in p)
        ):
            raise bad
        out.add((int(p[0]), int(p[1])))
    return frozenset(out)


def released_mask(pool_id: np.ndarray, in_use: bool | frozenset[tuple[int, int]]) -> np.ndarray:
    """Per segment: does empty_cache release it now? Default pool: yes; a private pool: when
    the assumption takes it as released."""
    default = ~np.asarray(pool_id.any(axis=1), dtype=bool)
    if in_use is True:
        return default
    if in_use is False:
        return np.ones(len(pool_id), dtype=bool)
    used = np.zeros(len(pool_id), dtype=bool)
    for a, b in in_use:
        used |= (pool_id[:, 0] == a) & (pool_id[:, 1] == b)
    out: np.ndarray = default | ~used
    return out


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
        inverse = np.zeros(len(device), dtype=np.int64)
    else:
        keys = np.column_stack([device, pool_id])
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
    k = len(uniq)

    def add(values: np.ndarray) -> list[int]:
        out = np.zeros(k, dtype=np.int64)
        np.add.at(out, inverse, values)
        return [int(v) for v in out.tolist()]

    rel = sums["releasable"]
    now = add(np.where(released, rel, 0))
    later = add(np.where(released, 0, rel))
    reserved, allocated = add(sums["total_size"]), add(sums["allocated"])
    pending, free = add(sums["pending_free"]), add(sums["free"])
    count = add(np.ones(len(device), dtype=np.int64))
    largest = np.zeros(k, dtype=np.int64)
    np.maximum.at(largest, inverse, largest_free)
    first = np.zeros(k, dtype=np.int64)  # a segment of each pool: its `released` is the pool's
    first[inverse[::-1]] = np.arange(len(device))[::-1]
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
                largest_free=int(largest[i]),
                releasable=now[i],
                releasable_after_release=later[i],
                segments=count[i],
            )
        )
    out.sort(key=lambda p: (p.device, p.pool_id != (0, 0), p.pool_id))
    return tuple(out)
