"""Expandable segments in the model: reserve address space, map and unmap its pages.

With `expandable_segments:True` a pool's memory is one `Reservation` per stream, mapped page by
page at the lowest address that fits (torch's `try_allocate_expandable_block`) and unmapped by
`release_blocks`. `ExpandableMixin` is mixed into `model.CachingAllocator`.
"""

from __future__ import annotations

from bisect import bisect_left

from gpumemviz.allocator import stats as S
from gpumemviz.allocator.addresses import check_address
from gpumemviz.allocator.blocks import BlockPool, ModelBlock, Reservation, link, try_merge
from gpumemviz.allocator.rules import page_size, reservation_size
from gpumemviz.allocator.state import AllocatorState
from gpumemviz.allocator.trace import SEGMENT_MAP, SEGMENT_UNMAP

__all__ = ["ExpandableMixin"]


class ExpandableMixin(AllocatorState):
    """The expandable-segment paths of a `CachingAllocator`."""

    def _try_allocate_expandable(
        self, pool: BlockPool, stream: int, size: int
    ) -> ModelBlock | None:
        """`try_allocate_expandable_block`: map pages at the lowest address that fits."""
        c = self._find_expandable_block(pool, stream, size)
        if not c.mapped and not self._map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None
            if not self._map_block(nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt
        pool.remove(c)
        return c

    def _find_expandable_block(self, pool: BlockPool, stream: int, size: int) -> ModelBlock:
        """`find_expandable_block`: first unmapped range (with a free block before it) that fits."""

        def allocatable(b: ModelBlock | None) -> bool:
            return b is not None and not b.allocated and b.event_count == 0 and not b.stream_uses

        um = pool.unmapped
        i = bisect_left(um, (stream,))
        while i < len(um) and um[i][0] == stream:
            c = um[i][2]
            if allocatable(c.prev):
                c = c.prev  # type: ignore[assignment]
            nbytes = 0
            b: ModelBlock | None = c
            while nbytes < size and allocatable(b):
                assert b is not None
                nbytes += b.size
                b = b.next
            if nbytes >= size:
                return c
            i += 1
        es = self._new_reservation(stream, pool.small)
        check_address(es.base, es.size)
        c = ModelBlock(es.base, es.size, stream, pool, es, False)
        pool.insert_unmapped(c)
        return c

    def _map_block(self, b: ModelBlock, size: int) -> bool:
        """`map_block`: back [ptr, ptr+size) with whole pages; merge with free neighbours."""
        es = b.seg
        assert es is not None and not b.mapped
        page = es.page
        begin = (b.ptr - es.base) // page
        end = -(-(b.ptr + size - es.base) // page)
        nbytes = (end - begin) * page
        if nbytes == 0 or self._total + nbytes > self.capacity:
            return False  # cuMemCreate: out of memory
        pool = b.pool
        pool.remove_unmapped(b)
        b.mapped = True
        start = b.ptr
        if nbytes < b.size:
            rest = ModelBlock(b.ptr + nbytes, b.size - nbytes, b.stream, pool, es, False)
            link(rest, b, b.next)
            pool.insert_unmapped(rest)
            b.size = nbytes
        try_merge(b, b.prev)
        try_merge(b, b.next)
        pool.insert(b)
        self._total += nbytes
        if pool.owner is not None:
            pool.owner.reserved += nbytes
        st = self.stats
        st.inc(S.RESERVED_BYTES, pool.index, nbytes)
        st.num_device_alloc += 1
        if self._record:
            self._emit(SEGMENT_MAP, start, nbytes, b.stream)
        return True

    def _unmap_block(self, b: ModelBlock) -> None:
        """`unmap_block`: give back the whole free pages inside a free expandable block."""
        es = b.seg
        assert es is not None
        page = es.page
        begin = -(-(b.ptr - es.base) // page)
        end = (b.ptr + b.size - es.base) // page
        if begin >= end:
            return
        pool = b.pool
        pool.remove(b)
        uptr = es.base + begin * page
        usize = (end - begin) * page
        before = uptr - b.ptr
        if before > 0:
            bf = ModelBlock(b.ptr, before, b.stream, pool, es, True)
            link(bf, b.prev, b)
            pool.insert(bf)
        after = b.size - before - usize
        if after > 0:
            af = ModelBlock(uptr + usize, after, b.stream, pool, es, True)
            link(af, b, b.next)
            pool.insert(af)
        b.ptr = uptr
        b.size = usize
        b.mapped = False
        try_merge(b, b.prev)
        try_merge(b, b.next)
        pool.insert_unmapped(b)
        self._total -= usize
        if pool.owner is not None:
            pool.owner.reserved -= usize
            if pool.owner.malloc_count > 0:
                pool.owner.malloc_count -= 1
        st = self.stats
        st.dec(S.RESERVED_BYTES, pool.index, usize)
        st.num_device_free += 1
        if self._record:
            self._emit(SEGMENT_UNMAP, uptr, usize, b.stream)

    def _new_reservation(self, stream: int, small: bool, base: int | None = None) -> Reservation:
        """A new `ExpandableSegment` of the pool: at `base`, else where the provider says."""
        page = page_size(small, self._lss)
        vsize = reservation_size(self.device_total, page)
        if base is None:
            base = self._provide("expandable", vsize, stream)
        return Reservation(base, vsize, page, stream, small)
