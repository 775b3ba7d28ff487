"""Giving cached memory back to the device in the model: release, release-and-retry, GC.

torch's `release_block`, `release_blocks`, `release_cached_blocks` (empty_cache and the last
retry of a malloc), `release_available_cached_blocks` (oversize segments, with
max_split_size) and `garbage_collect_cached_blocks` (with garbage_collection_threshold); the
private pools' part of a release is in pools.py.
`ReleaseMixin` is mixed into `model.CachingAllocator`.
"""

from __future__ import annotations

from bisect import bisect_left

from gpumemviz.allocator import stats as S
from gpumemviz.allocator.blocks import BlockPool, ModelBlock
from gpumemviz.allocator.rules import UNLIMITED
from gpumemviz.allocator.state import AllocatorState
from gpumemviz.allocator.trace import SEGMENT_FREE

__all__ = ["ReleaseMixin"]


class ReleaseMixin(AllocatorState):
    """The release and garbage-collection paths of a `CachingAllocator`."""

    def _release_block(self, b: ModelBlock) -> None:
        """`release_block`: cudaFree a whole free non-expandable segment."""
        st = self.stats
        st.num_device_free += 1
        if self._record:
            self._emit(SEGMENT_FREE, b.ptr, b.size, b.stream)
        self._total -= b.size
        pool = b.pool
        if pool.owner is not None:
            pool.owner.malloc_count -= 1
            pool.owner.reserved -= b.size
        p = pool.index
        st.dec(S.SEGMENT, p, 1)
        st.dec(S.RESERVED_BYTES, p, b.size)
        if b.size >= self._mss:
            st.dec1(S.OVERSIZE_SEGMENTS)
        pool.remove(b)

    def _release_blocks(self, pool: BlockPool) -> None:
        """`release_blocks`: free whole free segments, then unmap free expandable pages."""
        to_unmap = []
        for k in list(pool.blocks):
            b = k[3]
            if b.seg is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self._release_block(b)
        for b in to_unmap:
            self._unmap_block(b)
            if not b.mapped and b.prev is None and b.next is None:
                pool.remove_unmapped(b)  # release_expandable_segment: no trace entry

    def _release_cached_blocks(self) -> None:
        """`release_cached_blocks` (empty_cache and the last retry): large pool, then small
        (not while allocations are routed to a pool), then the freeable private pools."""
        if not self._alloc_to:
            self._synchronize_and_free_events()
            self._release_blocks(self._large)
            self._release_blocks(self._small)
        if self._pools:
            self._release_private_pools()

    def _release_available(self, pool: BlockPool, stream: int, size: int) -> bool:
        """`release_available_cached_blocks`: free oversize segments (only with max_split_size)."""
        mss = self._mss
        if mss == UNLIMITED:
            return False
        key = max(size, mss)
        blocks = pool.blocks
        i = bisect_left(blocks, (stream, key))
        if i == len(blocks) or blocks[i][0] != stream or blocks[i][3].seg is not None:
            if i == 0:
                return False
            released = 0
            i -= 1
            while released < key and blocks[i][1] >= mss and blocks[i][0] == stream:
                cur = blocks[i][3]
                first = i == 0
                if not first:
                    i -= 1
                if cur.seg is None:
                    released += cur.size
                    self._release_block(cur)
                if first:
                    break
            return released >= key
        self._release_block(blocks[i][3])
        return True

    def _garbage_collect(self) -> None:
        """`garbage_collect_cached_blocks`: free the oldest whole segments."""
        assert self._allowed is not None
        threshold = int(self._gc_threshold * self._allowed)
        if self._total <= threshold:
            return
        target = self._total - threshold
        pool = self._large
        now = pool.gc_count
        total_age = 0
        count = 0
        for k in pool.blocks:
            b = k[3]
            if b.prev is None and b.next is None:
                total_age += now - b.gc_base
                count += 1
        if count == 0:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for k in list(pool.blocks):
                b = k[3]
                if b.prev is None and b.next is None and b.seg is None:
                    age = now - b.gc_base
                    if age >= age_threshold:
                        freed = True
                        reclaimed += b.size
                        total_age -= age
                        count -= 1
                        self._release_block(b)
