"""A faithful CPU model of PyTorch's CUDA caching allocator: `CachingAllocator`.

One `CachingAllocator` is one `DeviceCachingAllocator`: the same pools ordered by
(stream, size, address), the same best fit, split, merge, oversize, release-and-retry, GC and
expandable-segment control flow, the same stats and trace entries. Only the driver is invented:
`capacity` bytes of device memory, and an `address_provider` choosing where each new segment lands.

Like torch's `DeviceCachingAllocator`, it is one class that owns all of its state: the pools,
the live and pending blocks, the stream events, the private pools and their routing, the trace
ring and the stats. Every method reads and writes that state through ``self`` only, so the
module is long but has one owner per attribute. Its sections: the public API (malloc and free,
streams, the trace, private pools, state in and out: `snapshot`, `from_segments`, deepcopy),
then the internals in the same order as torch's (allocation, events, release and GC,
expandable segments, private pools, loading, the trace). What needs none of the state lives
beside it: the structures (blocks.py), the rules (rules.py), the stats counters (stats.py), the
trace vocabulary (trace.py) and the torch-format writer of a snapshot (dump.py).

Hot paths are written for speed (bisect over sorted lists of tuples, trace entries as tuples):
`malloc` and `_free_block` inline their best fit, split, merge and stats updates, and read the
state as plain attributes of ``self``, one lookup each. Dicts are built only in `snapshot()` and
`memory_stats()`.

Not modelled: FreeMemoryCallbacks, MemPools with a custom allocator, the graph-capture reuse of
freed blocks (`graph_capture_record_stream_reuse`), `throw_on_cudamalloc_oom` rejections, the
cudaMallocAsync backend, and
the physical-memory fragmentation of the driver (a map or cudaMalloc fits iff reserved + size
<= capacity). Call sites are what the caller hands to `malloc` (its ``frames``, torch's frame
dicts, innermost first): the block and its alloc, free_requested and free_completed trace entries
carry them, as torch's `context_when_allocated`; segments carry none (their `frames` is []).
"""

from __future__ import annotations

import copy
import itertools
import operator
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from gpumemviz.allocator import stats as S
from gpumemviz.allocator.addresses import (
    AddressProvider,
    DescendingAddresses,
    check_address,
    reservation_starts,
)
from gpumemviz.allocator.blocks import (
    DEFAULT_POOL,
    BlockPool,
    ModelBlock,
    PoolId,
    PrivatePool,
    Reservation,
    link,
    try_merge,
)
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.dump import torch_segments, torch_trace
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.rules import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_SIZE,
    UNLIMITED,
    allocation_size,
    page_size,
    reservation_size,
    round_size,
)
from gpumemviz.allocator.trace import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SNAPSHOT,
    Frames,
    TraceEntry,
    TraceRow,
)
from gpumemviz.snapshot import ACTIONS
from gpumemviz.snapshot.escaping import short_repr

if TYPE_CHECKING:
    from typing_extensions import Self

    from gpumemviz.snapshot.schema import TorchDict, TorchMapping

__all__ = ["CachingAllocator"]

StreamFilter = Callable[[int], bool]

_new_block = object.__new__
_IS = 3 * S.INACTIVE_SPLIT  # index of inactive_split.all in DeviceStats.cur
_ISB = 3 * S.INACTIVE_SPLIT_BYTES
_AB = 3 * S.ALLOCATED_BYTES
_AC = 3 * S.ACTIVE
_ACB = 3 * S.ACTIVE_BYTES
_RQ = 3 * S.REQUESTED_BYTES
_OA = 3 * S.OVERSIZE_ALLOCATIONS

# attributes `__deepcopy__` rebuilds itself rather than deep-copying (`__setstate__` binds the
# trace's hot-path handles, `_tappend` and `_tick`, to the copy's own ring and clock)
_NOT_DEEPCOPIED = frozenset(
    (
        "_small",
        "_large",
        "_allocated",
        "_pending",
        "_events",
        "stats",
        "_clock",
        "_tappend",
        "_tick",
        "_pools",
        "_capture_deferred",
    )
)


def _as_size(size: Any) -> int:  # Any: anything int-like; `operator.index` decides
    """An int-like size (numpy integers included); bool, float and the rest are refused."""
    if isinstance(size, bool):
        raise TypeError(f"malloc: size must be an int, got {short_repr(size)}")
    try:
        return operator.index(size)
    except TypeError:
        raise TypeError(f"malloc: size must be an int, got {type(size).__name__}") from None


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


def _pool_id(seg: TorchMapping) -> PoolId:
    """A segment dict's `segment_pool_id` (absent: the default pool)."""
    pid = seg.get("segment_pool_id") or DEFAULT_POOL
    try:
        a, b = pid
        return (int(a), int(b))
    except (TypeError, ValueError):
        raise ValueError(
            f"from_segments: segment at {seg['address']:#x} has a bad segment_pool_id "
            f"{short_repr(pid)}"
        ) from None


class CachingAllocator:
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
    trace_blocks : bool
        With `record_trace`, also record each block's alloc, free_requested and free_completed
        entries (True, torch's trace). False: the ring holds only segment entries and OOMs, and
        `trace_len` counts only those; for a caller that reads nothing else (replay's driver:
        the per-block entries cost about a fifth of a malloc/free pass).
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
        trace_blocks: bool = True,
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
        self._provide: AddressProvider = address_provider or DescendingAddresses()
        self._mss = cfg.max_split_size
        self._mnsr = cfg.max_non_split_rounding_size
        self._lss = cfg.large_segment_size
        self._div = cfg.divisions
        self._expandable = cfg.expandable_segments
        self._small = BlockPool(True)
        self._large = BlockPool(False)
        self._allocated: dict[int, ModelBlock] = {}
        self._pending: dict[int, ModelBlock] = {}  # freed, waiting on events (active_pending_free)
        # stream -> FIFO of [block, done] pairs, `done` flipped in place (`complete_events`)
        self._events: dict[int, deque[list[Any]]] = {}
        self._total = 0  # total_allocated_memory (reserved, all pools, mapped pages included)
        self._allowed: int | None = None
        self._gc_threshold = cfg.garbage_collection_threshold
        self._gc = False
        self.stats = S.DeviceStats(cfg.to_settings()["max_split_size"])
        self._record = record_trace  # the trace ring's switch (its ring is set up below)
        self._trace_blocks = trace_blocks  # block entries recorded too (not only segments)
        # private pools (the hot path only asks `if self._alloc_to:` when no pool is in use)
        self._pools: dict[PoolId, PrivatePool] = {}  # torch's graph_pools
        self._alloc_to: list[tuple[PoolId, StreamFilter]] = []  # captures_underway
        self._use_on_oom: list[PoolId] = []  # use_on_oom_pools, in the order they were set
        self._capture_deferred: list[ModelBlock] = []  # needs_events_deferred_until_no_capture
        self._next_ids = [1, 1]  # the next graph pool (n, 0) and MemPool (0, n) numbers
        # the trace ring. The hot paths append `(action, addr, size, stream, tick())` through
        # `_tappend` (None when not recording). time_us is by default a counter that ticks once
        # per entry, so the last entry's time is the number emitted; a custom clock counts them
        # in `_trace_count`.
        if trace_max_entries is not None:
            trace_max_entries = max(1, trace_max_entries)  # torch's setMaxEntries
        self._trace: deque[TraceEntry] = deque(maxlen=trace_max_entries)
        self._tappend: Callable[[TraceEntry], None] | None = (
            self._trace.append if record_trace and trace_blocks else None
        )
        self._trace_count = 0
        self._default_clock = clock is None
        self._clock = clock
        self._tick = self._trace_clock()
        if cfg.per_process_memory_fraction < 1.0:
            self.set_memory_fraction(cfg.per_process_memory_fraction)

    # ------------------------------------------------------------------ public API

    def malloc(self, size: int, stream: int = 0, frames: Frames | None = None) -> int:
        """Allocate `size` bytes on `stream`; returns the block address (0 for size 0, like
        torch's nullptr).

        `size` is int-like (numpy integers included; bool and float raise TypeError). Raises
        `OutOfMemory` (after the release-and-retry path) when it cannot. `frames` is the call
        site (torch's frame dicts, innermost first): the block's ``frames`` in `snapshot()` and
        those of its trace entries. The list is kept as given, not copied: callers share one
        list per call site and never change it.
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
        block.frames = frames
        ptr = block.ptr
        ta = self._tappend
        if ta is not None:
            ta((ALLOC, ptr, size, stream, self._tick(), frames))
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
            ta((FREE_REQUESTED, addr, b.requested, b.stream, self._tick(), b.frames))
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

    # ------------------------------------------------------------------ public API: streams
    # A block used on other streams (`record_stream`) is freed only once an event per stream
    # has completed: `complete_events` marks them, and the next malloc (`_process_events`) or
    # empty_cache (`_synchronize_and_free_events`) frees the block (docs/allocator.md, Streams
    # and events).

    def record_stream(self, addr: int, stream: int) -> None:
        """`recordStream`: the block is also used on `stream`; its free waits for that work."""
        b = self._allocated.get(addr)
        if b is None:
            raise ValueError(f"record_stream: {addr:#x} is not the address of an allocated block")
        if stream == b.stream:
            return
        if b.stream_uses is None:
            b.stream_uses = set()
        b.stream_uses.add(stream)

    def complete_events(self, stream: int | None = None, *, process: bool = False) -> int:
        """The GPU finished the work recorded on `stream` (all streams when None).

        The events become complete; as in torch, the blocks are freed at the next `malloc`
        (its `process_events`) or `empty_cache`, or now when `process=True`. Returns the number
        of events marked complete.
        """
        n = 0
        for s, q in self._events.items():
            if stream is None or s == stream:
                for e in q:
                    if not e[1]:
                        e[1] = True
                        n += 1
        if process:
            self._process_events()
        return n

    # ------------------------------------------------------------------ public API: the trace

    @property
    def recording(self) -> bool:
        """Whether the model records its history now (torch's ``_record_memory_history``)."""
        return self._record

    def set_recording(self, enabled: bool) -> None:
        """Start or stop recording history, as ``torch.cuda.memory._record_memory_history``
        does: entries already in the ring stay; none are added while it is off."""
        self._record = bool(enabled)
        self._tappend = self._trace.append if enabled and self._trace_blocks else None

    def trace_len(self) -> int:
        """Trace entries emitted so far (a monotonic index for `trace_since`)."""
        if self._default_clock:
            return self._trace[-1][4] if self._trace else 0
        return self._trace_count

    def trace_since(self, i: int) -> list[TraceRow]:
        """Entries emitted since `trace_len()` was `i`: (action, addr, size, stream, time_us).

        For an `oom` entry the addr field is device_free. Raises ValueError when the ring has
        already dropped some of them.
        """
        count = self.trace_len()
        n = count - i
        if n < 0 or n > len(self._trace):
            raise ValueError(
                f"trace_since({i}): entries from {i} are not in the ring "
                f"({len(self._trace)} kept, {count} emitted)"
            )
        if n == 0:
            return []
        tail = list(itertools.islice(reversed(self._trace), n))  # O(n), not O(ring)
        tail.reverse()
        return [(ACTIONS[a], addr, size, s, t) for a, addr, size, s, t, _ in tail]

    # ---------------------------------------------------------- public API: private pools
    # torch routes the allocations of matching streams to a pool's own small and large
    # BlockPools between `beginAllocateToPool` and `endAllocateToPool` (`use_mem_pool`, graph
    # capture); a pool's memory goes back to the device only once its `use_count` is 0 and an
    # empty_cache or the OOM path's release runs (docs/allocator.md, Private pools).

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

    def pool_of(self, addr: int) -> PoolId:
        """The pool of the allocated block at `addr`: (0, 0) for the default pools, else its
        private pool's id (what replay checks against a trace entry's recorded ``pool_id``)."""
        b = self._allocated.get(addr)
        if b is None:
            raise ValueError(f"pool_of: {addr:#x} is not the address of an allocated block")
        owner = b.pool.owner
        return DEFAULT_POOL if owner is None else owner.id

    def pool_reserved(self) -> dict[PoolId, int]:
        """Reserved bytes per pool: the default pools as (0, 0), then each private pool."""
        out = {pid: pp.reserved for pid, pp in self._pools.items()}
        return {DEFAULT_POOL: self._total - sum(out.values()), **out}

    # ------------------------------------------------------- public API: state in and out

    def snapshot(self, *, include_traces: bool = True, record: bool = True) -> TorchDict:
        """The torch 2.11 `_snapshot()` dict: segments, device_traces, allocator_settings, ...

        As in torch, a `snapshot` trace entry (size = total active bytes) is appended after the
        trace is read, so it shows up in the next snapshot; `record=False` skips it.
        """
        dev = self.device
        segments, total_active = torch_segments(self._all_blocks(), dev)
        traces: list[list[TorchDict]] = [[] for _ in range(dev + 1)]
        if include_traces:
            traces[dev] = torch_trace(self._trace)
        if record and self._record:
            self._emit(SNAPSHOT, 0, total_active, 0)
        return {
            "segments": segments,
            "device_traces": traces,
            "allocator_settings": self.config.to_settings(),
            "external_annotations": [],
        }

    @classmethod
    def from_segments(
        cls,
        segments: Iterable[TorchMapping],
        capacity: int,
        config: str | AllocatorConfig = "",
        device: int = 0,
        device_total: int | None = None,
        *,
        reservations: Iterable[tuple[int, bool, int]] = (),
        **kwargs: Any,  # Any: the constructor's keyword options
    ) -> Self:
        """A model whose state is the given torch-format segments (of `device`).

        Inactive blocks go back into their pools, `active_allocated` blocks become live
        allocations (free them by address), `active_pending_free` blocks wait on an event of an
        unknown stream (-1) that `complete_events()` completes. Expandable runs of one
        (stream, pool) are placed in one address reservation starting at the lowest run when
        they fit in it (unmapped gaps between them stay unmapped). A snapshot does not show
        where a reservation starts: `reservations` gives known bases as ``(stream, small,
        base)``; the runs of that stream and pool from `base` to the end of its address space
        go in a reservation starting there (unmapped below the lowest run), and one with no
        run in it is held entirely unmapped. Stats start at the walk of the state (peak =
        current). A segment of a private pool (`segment_pool_id` other than (0, 0)) goes into
        that pool, created with one reference (its MemPool or graph alive); `reservations` place
        the default pools' runs only. Overlapping reservations and a run crossing its
        reservation's end raise ValueError.
        Extra keyword arguments go to the constructor.
        """
        self = cls(capacity, config, device, device_total, **kwargs)
        segs = [s for s in segments if s.get("device", device) == device]
        exp_runs: dict[tuple[int, bool, tuple[int, int]], list[TorchMapping]] = {}
        for seg in segs:
            pid = _pool_id(seg)
            small = seg.get("segment_type") == "small"
            if seg.get("is_expandable"):
                exp_runs.setdefault((seg["stream"], small, pid), []).append(seg)
                continue
            pool = self._block_pool(pid, small)
            self._load_run(seg, pool, None)
            if pool.owner is not None:
                pool.owner.malloc_count += 1
                pool.owner.reserved += seg["total_size"]
            self._total += seg["total_size"]
        bases: dict[tuple[int, bool], list[int]] = {}
        for stream, small, base in reservations:
            bases.setdefault((stream, bool(small)), []).append(base)
            exp_runs.setdefault((stream, bool(small), (0, 0)), [])
        for (stream, small, pid), runs in exp_runs.items():
            self._load_expandable(
                stream,
                small,
                sorted(runs, key=lambda s: s["address"]),
                sorted(bases.get((stream, small), ())) if pid == (0, 0) else [],
                self._block_pool(pid, small),
            )
        # stats: current values from the state, peak = allocated = current
        st = self.stats
        st.seed_current(S.walk_stats(segs))
        over_alloc = sum(1 for b in self._allocated.values() if b.size >= self._mss)
        over_seg = sum(
            1 for s in segs if not s.get("is_expandable") and s["total_size"] >= self._mss
        )
        for stat, v in ((S.OVERSIZE_ALLOCATIONS, over_alloc), (S.OVERSIZE_SEGMENTS, over_seg)):
            i = 3 * stat
            st.cur[i] = st.peak[i] = st.alloc[i] = v
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:  # Any: deepcopy's memo
        """An independent copy (blocks re-linked in loops, not by the generic deepcopy's
        recursion, so long chains are fine); the copy's trace clock goes on from this one's.

        The copy's state is built here from this instance's and handed to the copy's own
        `__setstate__`.
        """
        new = object.__new__(type(self))
        memo[id(self)] = new
        olds: dict[int, ModelBlock] = {}
        old_pools = [self._small, self._large, *self._private_block_pools()]
        for pool in old_pools:
            for k in pool.blocks:
                olds[id(k[3])] = k[3]
            for u in pool.unmapped:
                olds[id(u[2])] = u[2]
        for b in self._allocated.values():
            olds[id(b)] = b
        for b in self._pending.values():
            olds[id(b)] = b
        pools = {id(self._small): BlockPool(True), id(self._large): BlockPool(False)}
        new_private: dict[PoolId, PrivatePool] = {}
        for pid, pp in self._pools.items():
            npp = new_private[pid] = PrivatePool(pid, pp.small.no_split)
            npp.use_count, npp.malloc_count, npp.use_on_oom, npp.reserved = (
                pp.use_count,
                pp.malloc_count,
                pp.use_on_oom,
                pp.reserved,
            )
            pools[id(pp.small)], pools[id(pp.large)] = npp.small, npp.large
        segs: dict[int, Reservation] = {}
        clones: dict[int, ModelBlock] = {}
        for key, b in olds.items():
            c = object.__new__(ModelBlock)
            for name in ModelBlock.__slots__:
                setattr(c, name, getattr(b, name))
            c.pool = pools[id(b.pool)]
            if b.seg is not None:
                es = segs.get(id(b.seg))
                if es is None:
                    o = b.seg
                    es = segs[id(o)] = Reservation(o.base, o.size, o.page, o.stream, o.small)
                c.seg = es
            if b.stream_uses:
                c.stream_uses = set(b.stream_uses)
            clones[key] = c
        for c in clones.values():
            if c.prev is not None:
                c.prev = clones[id(c.prev)]
            if c.next is not None:
                c.next = clones[id(c.next)]
        for old_pool in old_pools:
            np_ = pools[id(old_pool)]
            np_.gc_count = old_pool.gc_count
            np_.blocks = [(a, b, c, clones[id(d)]) for a, b, c, d in old_pool.blocks]
            np_.unmapped = [(a, b, clones[id(c)]) for a, b, c in old_pool.unmapped]
        state = {
            name: copy.deepcopy(value, memo)
            for name, value in vars(self).items()
            if name not in _NOT_DEEPCOPIED
        }
        st = S.DeviceStats(self.stats.max_split_size)
        for name in S.DeviceStats.__slots__:
            v = getattr(self.stats, name)
            setattr(st, name, list(v) if isinstance(v, list) else v)
        state.update(
            _clock=self._clock,
            _small=pools[id(self._small)],
            _large=pools[id(self._large)],
            _pools=new_private,
            _capture_deferred=[clones[id(b)] for b in self._capture_deferred],
            _allocated={p: clones[id(b)] for p, b in self._allocated.items()},
            _pending={p: clones[id(b)] for p, b in self._pending.items()},
            _events={
                s: deque([clones[id(b)], done] for b, done in q) for s, q in self._events.items()
            },
            stats=st,
        )
        new.__setstate__(state)
        return new

    def __setstate__(self, state: dict[str, Any]) -> None:  # Any: each attribute's own type
        """Take the attributes in `state` (the copy protocol's; `__deepcopy__` builds one),
        then bind the trace's hot-path handles to this instance's own ring and clock."""
        for name, value in state.items():
            setattr(self, name, value)
        self._tappend = self._trace.append if self._record and self._trace_blocks else None
        self._tick = self._trace_clock()

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
            ta((FREE_COMPLETED, b.ptr, requested, b.stream, self._tick(), b.frames))
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

    # ------------------------------------------------------------------ internals: stream events

    def _free_deferred(self, b: ModelBlock) -> None:
        """A free of a block with stream uses: it waits on one event per stream."""
        streams = b.stream_uses
        assert streams
        b.stream_uses = None
        b.event_count += len(streams)
        self._pending[b.ptr] = b
        for s in streams:
            q = self._events.get(s)
            if q is None:
                q = self._events[s] = deque()
            q.append([b, False])

    def _process_events(self) -> None:
        """`process_events`: per stream, completed events in FIFO order free their blocks."""
        events = self._events
        for s in list(events):
            q = events[s]
            while q and q[0][1]:
                b = q.popleft()[0]
                b.event_count -= 1
                if b.event_count == 0:
                    del self._pending[b.ptr]
                    self._free_block(b)
            if not q:
                del events[s]

    def _synchronize_and_free_events(self) -> None:
        """`synchronize_and_free_events`: wait for every event, free what they held."""
        self.stats.num_sync_all_streams += 1
        events = self._events
        self._events = {}
        for q in events.values():
            for b, _ in q:
                b.event_count -= 1
                if b.event_count == 0:
                    del self._pending[b.ptr]
                    self._free_block(b)

    # ------------------------------------------------------------------ internals: release and GC
    # torch's `release_block`, `release_blocks`, `release_cached_blocks` (empty_cache and the
    # last retry of a malloc), `release_available_cached_blocks` (oversize segments, with
    # max_split_size) and `garbage_collect_cached_blocks` (with garbage_collection_threshold);
    # the private pools' part of a release is `_release_private_pools`.

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

    # ------------------------------------------------------------------ internals: expandable
    # With `expandable_segments:True` a pool's memory is one `Reservation` per stream, mapped
    # page by page at the lowest address that fits (torch's `try_allocate_expandable_block`)
    # and unmapped by `_release_blocks`.

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

    # ------------------------------------------------------------------ internals: private pools

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

    # ------------------------------------------------------------------ internals: loading

    def _block_pool(self, pid: tuple[int, int], small: bool) -> BlockPool:
        """The default pool of that size class, or that of private pool `pid` (made once)."""
        if pid == (0, 0):
            return self._small if small else self._large
        if pid not in self._pools:
            self._create_or_incref(pid)
        pp = self._pools[pid]
        return pp.small if small else pp.large

    def _load_run(self, seg: TorchMapping, pool: BlockPool, es: Reservation | None) -> ModelBlock:
        """Chain the blocks of one segment dict (or mapped run) and file each where it belongs."""
        stream = seg["stream"]
        addr = seg["address"]
        prev: ModelBlock | None = None
        head: ModelBlock | None = None
        blocks = seg["blocks"]
        if not blocks:
            raise ValueError(f"from_segments: segment at {addr:#x} has no blocks")
        for bd in blocks:
            b = ModelBlock(addr, bd["size"], stream, pool, es, True)
            b.requested = bd.get("requested_size", 0)
            link(b, prev, None)
            state = bd["state"]
            if state == "active_allocated":
                b.allocated = True
                self._allocated[b.ptr] = b
            elif state == "active_pending_free":
                b.event_count = 1
                self._pending[b.ptr] = b
                q = self._events.get(-1)
                if q is None:
                    q = self._events[-1] = deque()
                q.append([b, False])
            elif state == "inactive":
                pool.insert(b)
            else:
                raise ValueError(
                    f"from_segments: block at {addr:#x} has unknown state {short_repr(state)}"
                )
            head = head or b
            prev = b
            addr += b.size
        if addr - seg["address"] != seg["total_size"]:
            raise ValueError(
                f"from_segments: blocks of segment {seg['address']:#x} add up to "
                f"{addr - seg['address']} bytes, total_size says {seg['total_size']}"
            )
        assert head is not None
        return head

    def _load_expandable(
        self,
        stream: int,
        small: bool,
        runs: list[TorchMapping],
        bases: list[int],
        pool: BlockPool,
    ) -> None:
        """Place sorted mapped `runs` of `pool` in reservations: one at each known base of
        sorted `bases` (holding the runs within its address space), else one at the lowest
        run left."""
        extent = reservation_size(self.device_total, page_size(small, self._lss))
        i = 0
        floor = 0  # end of the last reservation placed
        for base in reservation_starts([run["address"] for run in runs], bases, extent):
            if base < floor:
                raise ValueError(
                    f"from_segments: reservation at {base:#x} overlaps the one below it"
                )
            es = self._new_reservation(stream, small, base)
            end = floor = es.base + es.size
            cursor = es.base
            last: ModelBlock | None = None
            while i < len(runs) and runs[i]["address"] + runs[i]["total_size"] <= end:
                run = runs[i]
                if run["address"] > cursor:  # unmapped gap
                    gap = ModelBlock(cursor, run["address"] - cursor, stream, pool, es, False)
                    link(gap, last, None)
                    pool.insert_unmapped(gap)
                    last = gap
                head = self._load_run(run, pool, es)
                if last is not None:
                    last.next = head
                    head.prev = last
                b = head
                while b.next is not None:
                    b = b.next
                last = b
                cursor = run["address"] + run["total_size"]
                self._total += run["total_size"]
                if pool.owner is not None:
                    pool.owner.malloc_count += 1
                    pool.owner.reserved += run["total_size"]
                i += 1
            if i < len(runs) and runs[i]["address"] < end:
                if runs[i]["address"] == es.base:
                    raise ValueError(
                        f"from_segments: expandable run at {es.base:#x} is larger than "
                        f"the address space of one reservation ({es.size} bytes)"
                    )
                raise ValueError(
                    f"from_segments: expandable run at {runs[i]['address']:#x} crosses the end "
                    f"of the reservation at {es.base:#x} ({es.size} bytes)"
                )
            if cursor < end:  # the unmapped tail (the whole reservation when nothing is mapped)
                tail = ModelBlock(cursor, end - cursor, stream, pool, es, False)
                link(tail, last, None)
                pool.insert_unmapped(tail)

    # ------------------------------------------------------------------ internals: snapshot

    def _all_blocks(self) -> list[ModelBlock]:
        """The mapped blocks: free ones from the pools, then allocated and pending ones."""
        out: list[ModelBlock] = [k[3] for k in self._small.blocks]
        out += [k[3] for k in self._large.blocks]
        if self._pools:
            for pool in self._private_block_pools():
                out += [k[3] for k in pool.blocks]
        out += self._allocated.values()
        out += self._pending.values()
        return out

    # ------------------------------------------------------------------ internals: the trace

    def _emit(self, action: int, addr: int, size: int, stream: int) -> None:
        self._trace.append((action, addr, size, stream, self._tick(), None))

    def _counted_tick(self) -> int:
        """The tick of a custom clock: count the entry, then read the clock."""
        self._trace_count += 1
        assert self._clock is not None
        return self._clock()

    def _trace_clock(self) -> Callable[[], int]:
        """The tick for the next entry: the default clock counts on from the entries emitted
        so far (`trace_len`), a custom one is read through `_counted_tick`."""
        if self._default_clock:
            return itertools.count(self.trace_len() + 1).__next__
        return self._counted_tick
