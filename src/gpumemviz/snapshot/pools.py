"""What a segment's ``segment_pool_id`` says about its pool, for the analysis and the map.

PyTorch numbers private pools from two counters (docs/private-pools.md, Pool ids): a pool a
user makes, with
``torch.cuda.MemPool()`` or ``torch.cuda.graph_pool_handle()``, is ``(0, n)``; the pool a CUDA
graph makes for itself when it is captured without a ``pool=`` is ``(n, 0)``. ``(0, 0)`` is the
default pool. A snapshot does not record whether a private pool is still in use (its use count),
which decides whether empty_cache may release it: `normalize_in_use` reads the assumption the
analysis and the map take (all in use by default), `released_mask` applies it. A snapshot
cannot tell a ``MemPool`` from a ``graph_pool_handle()`` (both
``(0, n)``); they are labelled "MemPool", the name of the class both ids come from.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gpumemviz.snapshot.escaping import short_repr

__all__ = [
    "DEFAULT_POOL",
    "POOL_KINDS",
    "PoolsInUse",
    "normalize_in_use",
    "pool_kind",
    "pool_label",
    "released_mask",
]

DEFAULT_POOL = (0, 0)

#: What `fragmentation(..., pools_in_use=)` and `build_rows(..., pools_in_use=)` take: True
#: (every private pool in use), False (every one released) or the ids of the pools in use.
PoolsInUse = bool | Iterable[tuple[int, int]]

#: `pool_kind` values: the default pool, a CUDA graph's own pool, a user-made pool
#: (MemPool or graph_pool_handle), a private pool of another shape.
POOL_KINDS = ("default", "graph", "mempool", "private")


def pool_kind(pool_id: tuple[int, int]) -> str:
    """Which of `POOL_KINDS` a pool id names.

    >>> [pool_kind(p) for p in [(0, 0), (3, 0), (0, 2), (1, 1)]]
    ['default', 'graph', 'mempool', 'private']
    """
    a, b = pool_id
    if a == 0 and b == 0:
        return "default"
    if b == 0 and a > 0:
        return "graph"
    if a == 0 and b > 0:
        return "mempool"
    return "private"


def pool_label(pool_id: tuple[int, int]) -> str:
    """The pool's name for people: "default pool", "CUDA graph pool (3, 0)", "MemPool (0, 2)"
    or "private pool (a, b)".

    >>> pool_label((0, 2)), pool_label((3, 0)), pool_label((0, 0))
    ('MemPool (0, 2)', 'CUDA graph pool (3, 0)', 'default pool')
    """
    a, b = pool_id
    kind = pool_kind(pool_id)
    if kind == "default":
        return "default pool"
    name = {"graph": "CUDA graph pool", "mempool": "MemPool"}.get(kind, "private pool")
    return f"{name} ({a}, {b})"


def normalize_in_use(pools_in_use: object) -> bool | frozenset[tuple[int, int]]:
    """True, False, or a frozenset of (int, int) pool ids; a one-line ValueError otherwise.

    >>> normalize_in_use(True), sorted(normalize_in_use([(0, 1), [0, 2]]))
    (True, [(0, 1), (0, 2)])
    """
    if isinstance(pools_in_use, bool):
        return pools_in_use
    bad = ValueError(
        "pools_in_use must be True, False or a collection of pool ids such as [(0, 1)], got "
        f"{short_repr(pools_in_use)}"
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
