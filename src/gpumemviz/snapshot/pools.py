"""What a segment's ``segment_pool_id`` says about its pool, for the analysis and the map.

PyTorch numbers private pools from two counters (c10/cuda/CUDACachingAllocator.cpp,
``MemPool::MemPool`` and ``MemPool::graph_pool_handle``): a pool a user makes, with
``torch.cuda.MemPool()`` or ``torch.cuda.graph_pool_handle()``, is ``(0, n)``; the pool a CUDA
graph makes for itself when it is captured without a ``pool=`` is ``(n, 0)``. ``(0, 0)`` is the
default pool. A snapshot cannot tell a ``MemPool`` from a ``graph_pool_handle()`` (both
``(0, n)``); they are labelled "MemPool", the name of the class both ids come from.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_POOL",
    "POOL_KINDS",
    "pool_kind",
    "pool_label",
]

DEFAULT_POOL = (0, 0)

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
