"""Private pools in the model: `torch.cuda.MemPool` and CUDA-graph pools.

torch routes the allocations of matching streams to a pool's own small and large BlockPools
between `beginAllocateToPool` and `endAllocateToPool` (`torch.cuda.use_mem_pool`, graph
capture); a pool's memory goes back to the device only once its `use_count` is 0 and an
empty_cache or the OOM path's release runs. The rules, with the torch source they follow, are
in docs/allocator.md, Private pools. `PoolsMixin` is mixed into `model.CachingAllocator`; the
hot path (`malloc`) only asks `if self._alloc_to:` when no pool is in use.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gpumemviz.allocator.blocks import BlockPool, ModelBlock, PrivatePool
from gpumemviz.allocator.state import AllocatorState
from gpumemviz.snapshot.escaping import short_repr

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchDict

__all__ = ["DEFAULT_POOL", "PoolId", "PoolsMixin"]

PoolId = tuple[int, int]
DEFAULT_POOL: PoolId = (0, 0)
StreamFilter = Callable[[int], bool]


def _as_pool_id(pool_id: object) -> PoolId:
    if (
        isinstance(pool_id, tuple)
        and len(pool_id) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in pool_id)
    ):
        return (pool_id[0], pool_id[1])
    raise ValueError(f"a pool id is a tuple of two ints, got {short_repr(pool_id)}")


def _filter(streams: Collection[int] | StreamFilter | None) -> StreamFilter:
    if streams is None:
        return lambda s: True
    if callable(streams):
        return streams
    chosen = frozenset(streams)
    return chosen.__contains__


class PoolsMixin(AllocatorState):
    """MemPool and CUDA-graph pools of a `CachingAllocator`."""

    def _init_pools(self) -> None:
        self._pools: dict[PoolId, PrivatePool] = {}  # torch's graph_pools
        self._alloc_to: list[tuple[PoolId, StreamFilter]] = []  # captures_underway
        self._use_on_oom: list[PoolId] = []  # use_on_oom_pools, in the order they were set
        self._capture_deferred: list[ModelBlock] = []  # needs_events_deferred_until_no_capture
        self._next_ids = [1, 1]  # the next graph pool (n, 0) and MemPool (0, n) numbers

    # ------------------------------------------------------------------ public API

    def new_pool_id(self, graph: bool = False) -> PoolId:
        """A fresh pool id as torch hands them out: ``(0, n)`` for a MemPool, ``(n, 0)`` for a
        CUDA graph's pool (`graph_pool_handle`)."""
        k = 0 if graph else 1
        n = self._next_ids[k]
        self._next_ids[k] = n + 1
        return (n, 0) if graph else (0, n)

    def create_pool(
        self,
        pool_id: PoolId | None = None,
        *,
        use_on_oom: bool = False,
        no_split: bool = False,
    ) -> PoolId:
        """`torch.cuda.MemPool(use_on_oom=..., no_split=...)`: create the pool (or take one
        more reference to it: `createOrIncrefPool`) and return its id."""
        pid = self.new_pool_id() if pool_id is None else _as_pool_id(pool_id)
        if pid == DEFAULT_POOL:
            raise ValueError("create_pool: (0, 0) is the default pool, not a private one")
        self._create_or_incref(pid)
        pp = self._pools[pid]
        if use_on_oom:
            pp.use_on_oom = True
            if pid not in self._use_on_oom:
                self._use_on_oom.append(pid)
        if no_split:  # setNoSplit only ever turns it on
            pp.small.no_split = pp.large.no_split = True
        return pid

    def begin_allocate_to_pool(
        self, pool_id: PoolId, streams: Collection[int] | StreamFilter | None = None
    ) -> None:
        """`beginAllocateToPool`: route mallocs on `streams` (all when None; or a predicate)
        to the pool, creating it or taking a reference; the newest routing wins (LIFO)."""
        pid = _as_pool_id(pool_id)
        if any(p == pid for p, _ in self._alloc_to):
            raise ValueError("beginAllocateToPool: already recording to mempool_id")
        self._create_or_incref(pid)
        self._alloc_to.append((pid, _filter(streams)))

    def end_allocate_to_pool(self, pool_id: PoolId) -> None:
        """`endAllocateToPool`: stop routing to the pool (its reference stays: `release_pool`).

        Once no routing is left, the frees deferred during it wait on their events.
        """
        pid = _as_pool_id(pool_id)
        for i, (p, _) in enumerate(self._alloc_to):
            if p == pid:
                del self._alloc_to[i]
                break
        else:
            raise ValueError("endAllocatePool: not currently recording to mempool_id")
        if not self._alloc_to and self._capture_deferred:
            deferred, self._capture_deferred = self._capture_deferred, []
            for b in deferred:
                del self._pending[b.ptr]
                self._free_deferred(b)

    def release_pool(self, pool_id: PoolId) -> None:
        """`releasePool` (a graph reset, a MemPool deleted, `use_mem_pool` exiting): one
        reference fewer; at 0 the pool is freeable."""
        pp = self._get_pool(_as_pool_id(pool_id))
        if pp.use_count <= 0:
            raise ValueError(f"release_pool: pool {pp.id} has no reference left")
        pp.use_count -= 1

    @contextmanager
    def use_mem_pool(
        self, pool_id: PoolId, streams: Collection[int] | StreamFilter | None = None
    ) -> Iterator[PoolId]:
        """`torch.cuda.use_mem_pool`: begin allocating to the pool; on exit end and release."""
        pid = _as_pool_id(pool_id)
        self.begin_allocate_to_pool(pid, streams)
        try:
            yield pid
        finally:
            self.end_allocate_to_pool(pid)
            self.release_pool(pid)

    def pool_use_count(self, pool_id: PoolId) -> int:
        """`MemPool.use_count()`."""
        return self._get_pool(_as_pool_id(pool_id)).use_count

    @property
    def pool_ids(self) -> list[PoolId]:
        """The private pools the allocator holds (freeable ones included), sorted."""
        return sorted(self._pools)

    def pool_snapshot(self, pool_id: PoolId) -> list[TorchDict]:
        """`MemPool.snapshot()`: the snapshot's segments of that pool."""
        pid = _as_pool_id(pool_id)
        segs: list[TorchDict] = self.snapshot(include_traces=False, record=False)["segments"]
        return [s for s in segs if s["segment_pool_id"] == pid]

    def pool_reserved(self) -> dict[PoolId, int]:
        """Reserved bytes per pool: the default pools as (0, 0), then each private pool."""
        out = {pid: pp.reserved for pid, pp in self._pools.items()}
        return {DEFAULT_POOL: self._total - sum(out.values()), **out}

    # ------------------------------------------------------------------ internals

    def _create_or_incref(self, pid: PoolId) -> None:
        pp = self._pools.get(pid)
        if pp is None:
            self._pools[pid] = PrivatePool(pid)
        else:
            if pp.use_count <= 0:
                raise ValueError(f"pool {pid} was released: it cannot be used again")
            pp.use_count += 1

    def _get_pool(self, pid: PoolId) -> PrivatePool:
        pp = self._pools.get(pid)
        if pp is None:
            raise ValueError(f"no private pool {pid} on this allocator")
        return pp

    def _route(self, small: bool, stream: int) -> BlockPool:
        """`get_pool` while some routing is on: the newest matching one, else the default."""
        for pid, accepts in reversed(self._alloc_to):
            if accepts(stream):
                pp = self._pools[pid]
                return pp.small if small else pp.large
        return self._small if small else self._large

    def _mempool_fallback(self, stream: int, size: int, small: bool) -> ModelBlock | None:
        """`try_mempool_fallback`: a default-pool malloc whose cudaMalloc failed takes a free
        block of a `use_on_oom` pool (best fit, expandable segments off, oversize rules on)."""
        mss = self._mss
        for pid in self._use_on_oom:
            pp = self._pools.get(pid)
            if pp is None:
                continue
            pool = pp.small if small else pp.large
            blocks = pool.blocks
            if self._gc:
                pool.gc_count += 1
            i = bisect_left(blocks, (stream, size))
            while i < len(blocks) and blocks[i][0] == stream and blocks[i][3].seg is not None:
                i += 1
            if i == len(blocks) or blocks[i][0] != stream:
                continue
            b = blocks[i][3]
            if size < mss <= b.size or (size >= mss and b.size >= size + self._mnsr):
                continue
            del blocks[i]
            return b
        return None

    def _release_private_pools(self) -> None:
        """The private-pool half of `release_cached_blocks`: each freeable pool (use_count 0)
        frees its whole free segments and pages; one holding no memory left is forgotten."""
        for pid, pp in list(self._pools.items()):
            if pp.use_count != 0:
                continue
            self._release_blocks(pp.small)
            self._release_blocks(pp.large)
            if pp.malloc_count == 0:
                del self._pools[pid]
                if pid in self._use_on_oom:
                    self._use_on_oom.remove(pid)

    def _private_free_bytes(self) -> int:
        """What torch's OOM message calls "allocated in private pools": the bytes of the
        private pools' free (cached) blocks."""
        return sum(
            k[1]
            for pp in self._pools.values()
            for pool in (pp.small, pp.large)
            for k in pool.blocks
        )

    def _private_block_pools(self) -> list[BlockPool]:
        return [pool for pp in self._pools.values() for pool in (pp.small, pp.large)]
