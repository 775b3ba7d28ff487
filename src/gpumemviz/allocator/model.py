"""A faithful CPU model of PyTorch's CUDA caching allocator: `CachingAllocator`.

One `CachingAllocator` is one `DeviceCachingAllocator`: the same pools ordered by
(stream, size, address), the same best fit, split, merge, oversize, release-and-retry, GC and
expandable-segment control flow, the same stats and trace entries. Only the driver is invented:
`capacity` bytes of device memory, and an `address_provider` choosing where each new segment lands.

This module holds the state and the hot paths, `malloc` and `free` with the `free_block` they
share; the rest of the class comes from mixins, one module each: `trace` (the trace ring),
`events` (record_stream), `release` (release and GC), `expandable`, `pools` (MemPool and
CUDA-graph pools), `load` (`from_segments`),
`dump` (`snapshot()`) and `clone` (deepcopy). It stays whole past 500 lines: what is left is
one job, handing blocks out and taking them back, and `malloc` and `_free_block` are long
because they inline their best fit, split, merge and stats updates for speed.

Hot paths are written for speed (bisect over sorted lists of tuples, trace entries as tuples);
dicts are built only in `snapshot()` and `memory_stats()`.

Not modelled: FreeMemoryCallbacks, MemPools with a custom allocator, the graph-capture reuse of
freed blocks (`graph_capture_record_stream_reuse`), `throw_on_cudamalloc_oom` rejections, the
cudaMallocAsync backend, and
the physical-memory fragmentation of the driver (a map or cudaMalloc fits iff reserved + size
<= capacity). Frames are not recorded (`frames` is always []).
"""

from __future__ import annotations

import operator
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from typing import Any, NoReturn

from gpumemviz.allocator import stats as S
from gpumemviz.allocator.addresses import AddressProvider, DescendingAddresses, check_address
from gpumemviz.allocator.blocks import BlockPool, ModelBlock, try_merge
from gpumemviz.allocator.clone import CloneMixin
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.dump import SnapshotMixin
from gpumemviz.allocator.events import StreamEventsMixin
from gpumemviz.allocator.expandable import ExpandableMixin
from gpumemviz.allocator.load import LoadMixin
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.pools import PoolsMixin
from gpumemviz.allocator.release import ReleaseMixin
from gpumemviz.allocator.rules import K_MIN_BLOCK_SIZE, K_SMALL_SIZE, allocation_size, round_size
from gpumemviz.allocator.trace import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    SEGMENT_ALLOC,
    TraceMixin,
)
from gpumemviz.snapshot.escaping import short_repr

__all__ = ["CachingAllocator"]

_new_block = object.__new__
_IS = 3 * S.INACTIVE_SPLIT  # index of inactive_split.all in DeviceStats.cur
_ISB = 3 * S.INACTIVE_SPLIT_BYTES
_AB = 3 * S.ALLOCATED_BYTES
_AC = 3 * S.ACTIVE
_ACB = 3 * S.ACTIVE_BYTES
_RQ = 3 * S.REQUESTED_BYTES
_OA = 3 * S.OVERSIZE_ALLOCATIONS


def _as_size(size: Any) -> int:  # Any: anything int-like; `operator.index` decides
    """An int-like size (numpy integers included); bool, float and the rest are refused."""
    if isinstance(size, bool):
        raise TypeError(f"malloc: size must be an int, got {short_repr(size)}")
    try:
        return operator.index(size)
    except TypeError:
        raise TypeError(f"malloc: size must be an int, got {type(size).__name__}") from None


class CachingAllocator(
    TraceMixin,
    StreamEventsMixin,
    ReleaseMixin,
    ExpandableMixin,
    PoolsMixin,
    LoadMixin,
    SnapshotMixin,
    CloneMixin,
):
    """The caching allocator of one CUDA device, on the CPU.

    Parameters
    ----------
    capacity : int
        Bytes of device memory this process can get: cudaMalloc (or mapping an expandable
        page) fails when it would push reserved memory above this.
    config : str or AllocatorConfig
        `PYTORCH_CUDA_ALLOC_CONF` settings (parsed as a CUDA build would).
    device : int
        Device index reported in snapshots, traces and OOM messages.
    device_total : int, optional
        Total device memory (expandable address-space size, fraction caps, OOM message);
        defaults to `capacity`.
    address_provider : callable, optional
        `(kind, size, stream) -> int` giving the base address of each new segment (kind
        "segment": called once per segment_alloc, after the capacity checks pass) or expandable
        reservation (kind "expandable": called where torch calls cuMemAddressReserve, before
        its first map is tried). Default: `addresses.default_address_provider()`
        (`DescendingAddresses`: 2 MiB aligned, descending, never reused).
    record_trace : bool
        Keep the trace ring (`device_traces` of the snapshot).
    trace_max_entries : int, optional
        Ring size (torch's `max_entries`); unbounded by default, like torch.
    clock : callable, optional
        Returns `time_us` for trace entries; default: a counter that ticks once per entry.

    Examples
    --------
    >>> a = CachingAllocator(1 << 30)
    >>> p = a.malloc(4_000_000)
    >>> a.memory_stats()["reserved_bytes.all.current"] // 2**20  # one 20 MiB segment
    20
    >>> a.free(p); a.empty_cache() // 2**20
    20
    """

    def __init__(
        self,
        capacity: int,
        config: str | AllocatorConfig = "",
        device: int = 0,
        device_total: int | None = None,
        *,
        address_provider: AddressProvider | None = None,
        record_trace: bool = True,
        trace_max_entries: int | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(
                f"capacity must be a non-negative int of bytes, got {short_repr(capacity)}"
            )
        if device_total is not None and (not isinstance(device_total, int) or device_total < 0):
            raise ValueError(
                f"device_total must be a non-negative int, got {short_repr(device_total)}"
            )
        if isinstance(config, AllocatorConfig):
            self.config = config
        elif config is None or isinstance(config, str):
            self.config = AllocatorConfig.parse(config)
        else:
            raise TypeError(f"config must be a str or AllocatorConfig, got {type(config).__name__}")
        cfg = self.config
        if cfg.backend != "native":
            raise ValueError(
                f"backend:{cfg.backend} is not modelled: the native caching allocator's rules "
                "do not apply to cudaMallocAsync"
            )
        self.capacity = capacity
        self.device = device
        self.device_total = capacity if device_total is None else device_total
        self._provide = address_provider or DescendingAddresses()
        self._mss = cfg.max_split_size
        self._mnsr = cfg.max_non_split_rounding_size
        self._lss = cfg.large_segment_size
        self._div = cfg.divisions
        self._expandable = cfg.expandable_segments
        self._small = BlockPool(True)
        self._large = BlockPool(False)
        self._allocated: dict[int, ModelBlock] = {}
        self._pending: dict[int, ModelBlock] = {}  # freed, waiting on events (active_pending_free)
        self._events: dict[int, deque[list[Any]]] = {}  # stream -> FIFO of [block, done]
        self._total = 0  # total_allocated_memory (reserved, all pools, mapped pages included)
        self._allowed: int | None = None
        self._gc_threshold = cfg.garbage_collection_threshold
        self._gc = False
        self.stats = S.DeviceStats(cfg.to_settings()["max_split_size"])
        self._record = record_trace
        self._init_pools()
        self._init_trace(record_trace, trace_max_entries, clock)
        if cfg.per_process_memory_fraction < 1.0:
            self.set_memory_fraction(cfg.per_process_memory_fraction)

    # ------------------------------------------------------------------ public API

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate `size` bytes on `stream`; returns the block address (0 for size 0, like
        torch's nullptr).

        `size` is int-like (numpy integers included; bool and float raise TypeError). Raises
        `OutOfMemory` (after the release-and-retry path) when it cannot.
        """
        if type(size) is not int:
            size = _as_size(size)
        if size <= 0:
            if size == 0:
                return 0  # torch hands out a null pointer and records nothing
            raise ValueError(f"malloc: size must be a non-negative int, got {short_repr(size)}")
        if self._events and not self._alloc_to:
            self._process_events()  # not while a capture may be underway
        if size < K_MIN_BLOCK_SIZE:
            rsize = K_MIN_BLOCK_SIZE
        elif self._div is None:
            rsize = (size + 511) & ~511
        else:
            rsize = round_size(size, self._div)
        small = rsize <= K_SMALL_SIZE
        if self._alloc_to:
            pool = self._route(small, stream)
        else:
            pool = self._small if small else self._large
        exp = self._expandable
        # get_free_block, inlined for a non-expandable best fit (the common case)
        mss = self._mss
        if self._gc:
            pool.gc_count += 1
        blocks = pool.blocks
        i = bisect_left(blocks, (stream, rsize))
        block = None
        if i < len(blocks):
            k = blocks[i]
            if k[0] == stream:
                block = k[3]
                if block.seg is not None:
                    block = self._get_free_block(pool, stream, rsize, i)
                elif (rsize < mss and k[1] >= mss) or (rsize >= mss and k[1] >= rsize + self._mnsr):
                    block = None  # the oversize rules look at this one candidate only
                else:
                    del blocks[i]
        if block is None:
            alloc_size = allocation_size(rsize, self._lss)
            if self._gc:
                self._garbage_collect()
            block = self._alloc_block(pool, stream, rsize, alloc_size, False)
            if block is None and self._use_on_oom and pool.owner is None:
                block = self._mempool_fallback(stream, rsize, small)
                if block is not None:
                    pool, exp = block.pool, False
            if block is None and self._release_available(pool, stream, rsize):
                block = self._alloc_block(pool, stream, rsize, alloc_size, False)
            if block is None and not self._alloc_to:
                self._release_cached_blocks()
                block = self._alloc_block(pool, stream, rsize, alloc_size, True)
            if block is None:
                self._oom(size, rsize, alloc_size, stream)
        # should_split + alloc_found_block, inlined for speed
        st = self.stats
        p = pool.index
        seg = block.seg
        remaining = block.size - rsize
        if small or exp:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = rsize < mss and remaining > K_SMALL_SIZE
        if split and pool.no_split:
            split = False
        prev = block.prev
        already_split = prev is not None or block.next is not None
        if split:
            rem = block
            # block = ModelBlock(rem.ptr, rsize, stream, pool, seg), without the __init__ call
            block = _new_block(ModelBlock)
            block.ptr = rem.ptr
            block.size = rsize
            block.stream = stream
            block.pool = pool
            block.seg = seg
            block.mapped = True
            block.event_count = 0
            block.stream_uses = None
            block.gc_base = 0
            block.prev = prev
            if prev is not None:
                prev.next = block
            block.next = rem
            rem.prev = block
            rem.ptr += rsize
            rem.size = remaining
            rem.gc_base = pool.gc_count
            insort(blocks, (stream, remaining, rem.ptr, rem))
            if seg is None:
                if already_split:  # inactive_split_bytes -= rsize, inlined
                    cur = st.cur
                    cur[_ISB] -= rsize
                    cur[_ISB + p] -= rsize
                else:  # a new inactive split block of `remaining` bytes, inlined
                    cur, peak, alloc = st.cur, st.peak, st.alloc
                    c = cur[_IS] + 1
                    cur[_IS] = c
                    if c > peak[_IS]:
                        peak[_IS] = c
                    i = _IS + p
                    c = cur[i] + 1
                    cur[i] = c
                    if c > peak[i]:
                        peak[i] = c
                    alloc[i] += 1
                    c = cur[_ISB] + remaining
                    cur[_ISB] = c
                    if c > peak[_ISB]:
                        peak[_ISB] = c
                    i = _ISB + p
                    c = cur[i] + remaining
                    cur[i] = c
                    if c > peak[i]:
                        peak[i] = c
                    alloc[i] += remaining
        elif already_split and seg is None:
            cur = st.cur  # one inactive split block fewer, inlined
            cur[_ISB] -= block.size
            cur[_ISB + p] -= block.size
            cur[_IS] -= 1
            cur[_IS + p] -= 1
        block.allocated = True
        block.requested = size
        ptr = block.ptr
        ta = self._tappend
        if ta is not None:
            ta((ALLOC, ptr, size, stream, self._tick()))
        self._allocated[ptr] = block
        bsize = block.size
        if small:
            st.on_alloc_1(bsize, size)
        else:
            st.on_alloc_2(bsize, size)
        if bsize >= mss:
            st.inc1(S.OVERSIZE_ALLOCATIONS)
        return ptr

    def free(self, addr: int) -> None:
        """Free the block at `addr` (deferred while `record_stream` streams still use it)."""
        b = self._allocated.pop(addr, None)
        if b is None:
            if addr == 0:
                return
            raise ValueError(f"free: {addr:#x} is not the address of an allocated block")
        b.allocated = False
        ta = self._tappend
        if ta is not None:
            ta((FREE_REQUESTED, addr, b.requested, b.stream, self._tick()))
        st = self.stats
        if b.size >= self._mss:
            st.cur[_OA] -= 1
        # allocation and allocated bytes go down now; active and requested bytes when the block
        # is freed (`_free_block`)
        st.on_free_requested(b.pool.index, b.size)
        if b.stream_uses:
            if self._alloc_to:  # no event may be recorded during a capture: later
                self._pending[addr] = b
                self._capture_deferred.append(b)
            else:
                self._free_deferred(b)
        else:
            self._free_block(b)

    def empty_cache(self) -> int:
        """`torch.cuda.empty_cache()`: sync events, release free segments and pages.

        Returns the bytes released."""
        before = self._total
        self._release_cached_blocks()
        return before - self._total

    def set_memory_fraction(self, fraction: float) -> None:
        """`torch.cuda.set_per_process_memory_fraction`: cap reserved at fraction × device_total."""
        if not (0.0 <= fraction <= 1.0):
            raise ValueError(f"invalid fraction:{fraction}. Please set within [0, 1].")
        if fraction >= 1.0:
            self._allowed = None
        else:
            self._allowed = int(fraction * self.device_total)
        self._gc = self._allowed is not None and self._gc_threshold > 0.0

    def memory_stats(self) -> dict[str, int]:
        """torch's flattened `memory_stats()` dict (sorted keys)."""
        return self.stats.as_dict()

    def reset_peak_stats(self) -> None:
        self.stats.reset_peak()

    def reset_accumulated_stats(self) -> None:
        self.stats.reset_accumulated()

    @property
    def reserved(self) -> int:
        """Bytes reserved from the device (segments and mapped expandable pages)."""
        return self._total

    @property
    def allocated(self) -> int:
        """Bytes in allocated blocks (`allocated_bytes.all.current`)."""
        return self.stats.cur[3 * S.ALLOCATED_BYTES]

    @property
    def active(self) -> int:
        """Bytes in allocated or pending-free blocks (`active_bytes.all.current`)."""
        return self.stats.cur[3 * S.ACTIVE_BYTES]

    @property
    def n_segments(self) -> int:
        """cudaMalloc'd segments (`segment.all.current`; expandable memory is not counted)."""
        return self.stats.cur[3 * S.SEGMENT]

    # ------------------------------------------------------------------ internals: allocation

    def _get_free_block(self, pool: BlockPool, stream: int, size: int, i: int) -> ModelBlock | None:
        """`get_free_block` when the best fit `blocks[i]` is expandable.

        The clock tick, the lower bound and the plain case are inlined in `malloc`.
        """
        blocks = pool.blocks
        n = len(blocks)
        b = blocks[i][3]
        if b.seg is not None:
            if self._expandable:
                exp = b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
                j = i + 1
                while b.seg is not None and j < n:
                    k2 = blocks[j]
                    if k2[0] != stream:
                        break
                    b2 = k2[3]
                    exp2 = b2.size + (
                        b2.next.size if b2.next is not None and not b2.next.mapped else 0
                    )
                    if exp2 >= exp:
                        break
                    i, b, exp = j, b2, exp2
                    j += 1
            else:
                i += 1
                while i < n and blocks[i][3].seg is not None and blocks[i][0] == stream:
                    i += 1
                if i == n or blocks[i][0] != stream:
                    return None
                b = blocks[i][3]
        mss = self._mss
        if size < mss:
            if b.size >= mss:
                return None
        elif b.size >= size + self._mnsr:
            return None
        del blocks[i]
        return b

    def _alloc_block(
        self, pool: BlockPool, stream: int, size: int, alloc_size: int, retry: bool
    ) -> ModelBlock | None:
        """`alloc_block`: a new segment from the driver, or the expandable path."""
        st = self.stats
        if retry:
            st.num_alloc_retries += 1
        if self._allowed is not None and self._total + alloc_size > self._allowed:
            return None
        if self._expandable:
            b = self._try_allocate_expandable(pool, stream, size)
            if b is not None and pool.owner is not None:
                pool.owner.malloc_count += 1
            return b
        if self._total + alloc_size > self.capacity:
            return None  # cudaMalloc: out of memory
        ptr = self._provide("segment", alloc_size, stream)
        check_address(ptr, alloc_size)
        self._total += alloc_size
        if pool.owner is not None:
            pool.owner.malloc_count += 1
            pool.owner.reserved += alloc_size
        b = ModelBlock(ptr, alloc_size, stream, pool)
        p = pool.index
        st.inc(S.SEGMENT, p, 1)
        st.inc(S.RESERVED_BYTES, p, alloc_size)
        if alloc_size >= self._mss:
            st.inc1(S.OVERSIZE_SEGMENTS)
        st.num_device_alloc += 1
        if self._record:
            self._emit(SEGMENT_ALLOC, ptr, alloc_size, stream)
        return b

    def _free_block(self, b: ModelBlock) -> None:
        """`free_block`: merge a freed block with its free neighbours and file it in its pool.

        Called by `free` for a block without stream uses, and for a deferred free once its
        events complete.
        """
        requested = b.requested
        ta = self._tappend
        if ta is not None:
            ta((FREE_COMPLETED, b.ptr, requested, b.stream, self._tick()))
        orig_size = b.size
        pool = b.pool
        merged = 0
        merged_size = 0
        prev, nxt = b.prev, b.next
        blocks = pool.blocks
        # try_merge_blocks with each neighbour, inlined for the mapped (common) case
        if prev is not None and not prev.allocated:
            if prev.mapped and b.mapped and not prev.event_count and not prev.stream_uses:
                del blocks[bisect_left(blocks, (prev.stream, prev.size, prev.ptr))]
                b.ptr = prev.ptr
                pp = b.prev = prev.prev
                if pp is not None:
                    pp.next = b
                b.size += prev.size
                merged = 1
                merged_size = prev.size
            elif try_merge(b, prev):
                merged = 1
                merged_size = prev.size
        if nxt is not None and not nxt.allocated:
            if nxt.mapped and b.mapped and not nxt.event_count and not nxt.stream_uses:
                del blocks[bisect_left(blocks, (nxt.stream, nxt.size, nxt.ptr))]
                nn = b.next = nxt.next
                if nn is not None:
                    nn.prev = b
                b.size += nxt.size
                merged += 1
                merged_size += nxt.size
            elif try_merge(b, nxt):
                merged += 1
                merged_size += nxt.size
        b.gc_base = pool.gc_count
        insort(blocks, (b.stream, b.size, b.ptr, b))
        st = self.stats
        cur = st.cur
        p = pool.index
        if b.seg is None:
            # inactive_split(_bytes): -1 block and its bytes per merged neighbour, then +1 block
            # of the merged size if the result is still split: net +orig_size bytes then
            if b.prev is not None or b.next is not None:
                peak, alloc = st.peak, st.alloc
                c = cur[_ISB] + orig_size
                cur[_ISB] = c
                if c > peak[_ISB]:
                    peak[_ISB] = c
                i = _ISB + p
                c = cur[i] + orig_size
                cur[i] = c
                if c > peak[i]:
                    peak[i] = c
                alloc[i] += orig_size
                if merged == 0:
                    c = cur[_IS] + 1
                    cur[_IS] = c
                    if c > peak[_IS]:
                        peak[_IS] = c
                    i = _IS + p
                    c = cur[i] + 1
                    cur[i] = c
                    if c > peak[i]:
                        peak[i] = c
                    alloc[i] += 1
                elif merged == 2:
                    cur[_IS] -= 1
                    cur[_IS + p] -= 1
            elif merged:
                cur[_IS] -= merged
                cur[_IS + p] -= merged
                cur[_ISB] -= merged_size
                cur[_ISB + p] -= merged_size
        # active and requested bytes go down, inlined
        cur[_AC] -= 1
        cur[_AC + p] -= 1
        cur[_ACB] -= orig_size
        cur[_ACB + p] -= orig_size
        cur[_RQ] -= requested
        cur[_RQ + p] -= requested

    # ------------------------------------------------------------------ internals: OOM

    def _oom(self, size: int, rsize: int, alloc_size: int, stream: int) -> NoReturn:
        free = max(self.capacity - self._total, 0)
        st = self.stats
        if self._record:
            self._emit(OOM, free, rsize, stream)
        st.num_ooms += 1
        raise OutOfMemory(
            device=self.device,
            size=size,
            rounded_size=rsize,
            alloc_size=alloc_size,
            capacity=self.device_total,
            free=free,
            allocated=st.cur[3 * S.ALLOCATED_BYTES],
            reserved=st.cur[3 * S.RESERVED_BYTES],
            allowed=self._allowed,
            private_pools=self._private_free_bytes() if self._pools else 0,
        )
