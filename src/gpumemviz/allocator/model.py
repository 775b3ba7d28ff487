"""A faithful CPU model of PyTorch's CUDA caching allocator (reference sections 2.3-2.15, 9).

One `CachingAllocator` is one `DeviceCachingAllocator`: the same pools ordered by
(stream, size, address), the same best fit, split, merge, oversize, release-and-retry, GC and
expandable-segment control flow, the same stats and trace entries. Only the driver is invented:
`capacity` bytes of device memory, and an `address_provider` choosing where each new segment lands.

Hot paths are written for speed (bisect over sorted lists of tuples, trace entries as tuples);
dicts are built only in `snapshot()` and `memory_stats()`.

Not modelled: private pools (CUDA graphs, MemPool, use_on_oom pools), FreeMemoryCallbacks,
graph-capture deferral, `throw_on_cudamalloc_oom` rejections, the cudaMallocAsync backend, and
the physical-memory fragmentation of the driver (a map or cudaMalloc fits iff reserved + size
<= capacity). Frames are not recorded (`frames` is always []).
"""

from __future__ import annotations

import itertools
import operator
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..snapshot import ACTIONS
from ..units import format_size
from . import stats as S
from .config import AllocatorConfig
from .rules import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_SIZE,
    UNLIMITED,
    allocation_size,
    page_size,
    reservation_size,
    round_size,
)

__all__ = [
    "ACTIONS",
    "CachingAllocator",
    "DescendingAddresses",
    "OutOfMemory",
    "default_address_provider",
]

# trace action codes: indices into snapshot.ACTIONS (the torch action names)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE = 0, 1, 2, 3, 4
SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM = 5, 6, 7, 8
_ALIGN = 2 << 20
_new_block = object.__new__
# attributes __deepcopy__ rebuilds itself rather than deep-copying
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
    )
)
_IS = 3 * S.INACTIVE_SPLIT  # index of inactive_split.all in DeviceStats.cur
_ISB = 3 * S.INACTIVE_SPLIT_BYTES
_AB = 3 * S.ALLOCATED_BYTES
_AC = 3 * S.ACTIVE
_ACB = 3 * S.ACTIVE_BYTES
_RQ = 3 * S.REQUESTED_BYTES
_OA = 3 * S.OVERSIZE_ALLOCATIONS
_DEFAULT_TOP = 0x7F0000000000

AddressProvider = Callable[[str, int, int], int]


class DescendingAddresses:
    """Invented driver addresses: each new range just below the previous one, 2 MiB aligned.

    Real drivers mostly hand out descending addresses (reference 9.4); addresses are not
    reused. An object rather than a closure so that copies of a model get their own cursor.

    >>> p = DescendingAddresses(1 << 40)
    >>> hex(p("segment", 20 << 20, 0)), hex(p("segment", 2 << 20, 0))
    ('0xfffec00000', '0xfffea00000')
    """

    def __init__(self, top: int = _DEFAULT_TOP) -> None:
        self.cursor = top

    def __call__(self, kind: str, size: int, stream: int) -> int:
        addr = (self.cursor - size) & ~(_ALIGN - 1)
        if addr <= 0:
            raise OverflowError("DescendingAddresses ran out of invented address space")
        self.cursor = addr
        return addr


def reservation_starts(runs: Sequence[int], bases: Sequence[int], extent: int) -> list[int]:
    """Where `from_segments` starts the expandable reservations of one stream and pool.

    `runs` are the sorted addresses of the mapped runs, `bases` the sorted known reservation
    starts: a reservation starts at each base, else at the lowest run above the last
    reservation's `extent` bytes. Replay's address bookkeeping (`drive`) mirrors it.

    >>> reservation_starts([10, 30, 95], [0], 50)
    [0, 95]
    """
    out: list[int] = []
    i = k = 0
    while True:
        nxt = runs[i] if i < len(runs) else None
        if k < len(bases) and (nxt is None or bases[k] <= nxt):
            base = bases[k]
            k += 1
        elif nxt is not None:
            base = nxt
        else:
            return out
        out.append(base)
        while i < len(runs) and runs[i] < base + extent:
            i += 1


def default_address_provider(top: int = _DEFAULT_TOP) -> AddressProvider:
    """The provider a model uses when given none: `DescendingAddresses(top)`."""
    return DescendingAddresses(top)


class OutOfMemory(RuntimeError):
    """The model's `torch.OutOfMemoryError`: what PyTorch's message carries, as attributes.

    Attributes: device, size (the request), rounded_size, alloc_size ("Tried to allocate"),
    capacity (device total), free (device free), allocated, reserved, allowed (cap or None).
    """

    def __init__(
        self,
        *,
        device: int,
        size: int,
        rounded_size: int,
        alloc_size: int,
        capacity: int,
        free: int,
        allocated: int,
        reserved: int,
        allowed: int | None,
    ) -> None:
        self.device = device
        self.size = size
        self.rounded_size = rounded_size
        self.alloc_size = alloc_size
        self.capacity = capacity
        self.free = free
        self.allocated = allocated
        self.reserved = reserved
        self.allowed = allowed
        super().__init__(self._message())

    def _message(self) -> str:
        allowed = f"{format_size(self.allowed)} allowed; " if self.allowed is not None else ""
        return (
            f"CUDA out of memory. Tried to allocate {format_size(self.alloc_size)}. "
            f"GPU {self.device} has a total capacity of {format_size(self.capacity)} of which "
            f"{format_size(self.free)} is free. {allowed}Of the allocated memory "
            f"{format_size(self.allocated)} is allocated by PyTorch, and "
            f"{format_size(self.reserved - self.allocated)} is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )

    def fields(self) -> dict[str, Any]:
        """The numbers of the message, as a dict."""
        return {k: getattr(self, k) for k in _OOM_FIELDS}

    def __reduce__(self):  # keep picklable despite keyword-only __init__
        return (_rebuild_oom, (self.fields(),))


_OOM_FIELDS = (
    "device",
    "size",
    "rounded_size",
    "alloc_size",
    "capacity",
    "free",
    "allocated",
    "reserved",
    "allowed",
)


def _rebuild_oom(d: dict[str, Any]) -> OutOfMemory:
    return OutOfMemory(**d)


class _Expandable:
    """One virtual address reservation (`ExpandableSegment`): base, size, page."""

    __slots__ = ("base", "page", "size", "small", "stream")

    def __init__(self, base: int, size: int, page: int, stream: int, small: bool) -> None:
        self.base = base
        self.size = size
        self.page = page
        self.stream = stream
        self.small = small


class _Block:
    """A `Block`: a run of one segment, linked to its neighbours."""

    __slots__ = (
        "allocated",
        "event_count",
        "gc_base",
        "mapped",
        "next",
        "pool",
        "prev",
        "ptr",
        "requested",
        "seg",
        "size",
        "stream",
        "stream_uses",
    )

    def __init__(
        self,
        ptr: int,
        size: int,
        stream: int,
        pool: _Pool,
        seg: _Expandable | None = None,
        mapped: bool = True,
    ) -> None:
        self.ptr = ptr
        self.size = size
        self.stream = stream
        self.pool = pool
        self.seg = seg
        self.mapped = mapped
        self.requested = 0
        self.allocated = False
        self.event_count = 0
        self.stream_uses: set[int] | None = None
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.gc_base = 0


class _Pool:
    """A `BlockPool`: free mapped blocks by (stream, size, ptr); unmapped by (stream, ptr)."""

    __slots__ = ("blocks", "gc_count", "index", "small", "unmapped")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.index = S.SMALL if small else S.LARGE
        self.blocks: list[tuple[int, int, int, _Block]] = []
        self.unmapped: list[tuple[int, int, _Block]] = []
        self.gc_count = 0

    def insert(self, b: _Block) -> None:
        b.gc_base = self.gc_count
        insort(self.blocks, (b.stream, b.size, b.ptr, b))

    def remove(self, b: _Block) -> None:
        blocks = self.blocks
        del blocks[bisect_left(blocks, (b.stream, b.size, b.ptr))]

    def insert_unmapped(self, b: _Block) -> None:
        insort(self.unmapped, (b.stream, b.ptr, b))

    def remove_unmapped(self, b: _Block) -> None:
        um = self.unmapped
        del um[bisect_left(um, (b.stream, b.ptr))]


def _as_size(size: Any) -> int:
    """An int-like size (numpy integers included); bool, float and the rest are refused."""
    if isinstance(size, bool):
        raise TypeError(f"malloc: size must be an int, got {size!r}")
    try:
        return operator.index(size)
    except TypeError:
        raise TypeError(f"malloc: size must be an int, got {type(size).__name__}") from None


def _link(b: _Block, before: _Block | None, after: _Block | None) -> None:
    """`splice`: put b between before and after."""
    if before is not None:
        before.next = b
    b.prev = before
    if after is not None:
        after.prev = b
    b.next = after


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
        `(kind, size, stream) -> int` giving the base address of each new segment
        (kind "segment") or expandable reservation (kind "expandable").
        Default: `default_address_provider()`.
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
            raise ValueError(f"capacity must be a non-negative int of bytes, got {capacity!r}")
        if device_total is not None and (not isinstance(device_total, int) or device_total < 0):
            raise ValueError(f"device_total must be a non-negative int, got {device_total!r}")
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
        self._small = _Pool(True)
        self._large = _Pool(False)
        self._allocated: dict[int, _Block] = {}
        self._pending: dict[int, _Block] = {}  # freed, waiting on events (active_pending_free)
        self._events: dict[int, deque[list[Any]]] = {}  # stream -> FIFO of [block, done]
        self._total = 0  # total_allocated_memory (reserved, all pools, mapped pages included)
        self._allowed: int | None = None
        self._gc_threshold = cfg.garbage_collection_threshold
        self._gc = False
        self.stats = S.DeviceStats(cfg.to_settings()["max_split_size"])
        self._record = record_trace
        if trace_max_entries is not None:
            trace_max_entries = max(1, trace_max_entries)  # torch's setMaxEntries
        self._trace: deque[tuple[int, int, int, int, int]] = deque(maxlen=trace_max_entries)
        # the hot paths append `(action, addr, size, stream, tick())` through `_tappend` (None
        # when not recording). time_us is by default a counter that ticks once per entry, so the
        # last entry's time is the number emitted; a custom clock counts them in `_trace_count`.
        self._tappend = self._trace.append if record_trace else None
        self._trace_count = 0
        self._default_clock = clock is None
        self._clock = clock
        self._tick = itertools.count(1).__next__ if clock is None else self._counted_tick
        if cfg.per_process_memory_fraction < 1.0:
            self.set_memory_fraction(cfg.per_process_memory_fraction)

    # ------------------------------------------------------------------ public API

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate `size` bytes on `stream`; returns the block address (0 for size 0).

        Raises `OutOfMemory` (after the release-and-retry path, section 2.6) when it cannot.
        """
        if type(size) is not int:
            size = _as_size(size)
        if size <= 0:
            if size == 0:
                return 0  # torch hands out a null pointer and records nothing
            raise ValueError(f"malloc: size must be a non-negative int, got {size!r}")
        if self._events:
            self._process_events()
        if size < K_MIN_BLOCK_SIZE:
            rsize = K_MIN_BLOCK_SIZE
        elif self._div is None:
            rsize = (size + 511) & ~511
        else:
            rsize = round_size(size, self._div)
        small = rsize <= K_SMALL_SIZE
        pool = self._small if small else self._large
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
            if block is None and self._release_available(pool, stream, rsize):
                block = self._alloc_block(pool, stream, rsize, alloc_size, False)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, stream, rsize, alloc_size, True)
            if block is None:
                self._oom(size, rsize, alloc_size, stream)
        # should_split + alloc_found_block (section 2.8), inlined for speed
        st = self.stats
        p = pool.index
        seg = block.seg
        remaining = block.size - rsize
        if small or self._expandable:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = rsize < mss and remaining > K_SMALL_SIZE
        prev = block.prev
        already_split = prev is not None or block.next is not None
        if split:
            rem = block
            # block = _Block(rem.ptr, rsize, stream, pool, seg), without the __init__ call
            block = _new_block(_Block)
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
        if b.stream_uses:
            self._free_deferred(b)
            return
        if b.size >= self._mss:
            self.stats.cur[_OA] -= 1
        # free_block (section 2.10), inlined: `_free_block` has the same steps
        requested = b.requested
        ta = self._tappend
        if ta is not None:
            tick = self._tick
            ta((FREE_REQUESTED, addr, requested, b.stream, tick()))
            ta((FREE_COMPLETED, addr, requested, b.stream, tick()))
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
            elif self._try_merge(b, prev):
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
            elif self._try_merge(b, nxt):
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
        # allocation, allocated, active and requested bytes go down, inlined
        cur[0] -= 1  # allocation
        cur[p] -= 1
        cur[_AB] -= orig_size
        cur[_AB + p] -= orig_size
        cur[_AC] -= 1
        cur[_AC + p] -= 1
        cur[_ACB] -= orig_size
        cur[_ACB + p] -= orig_size
        cur[_RQ] -= requested
        cur[_RQ + p] -= requested

    def _free_deferred(self, b: _Block) -> None:
        """A free of a block with stream uses: it waits on one event per stream."""
        ta = self._tappend
        if ta is not None:
            ta((FREE_REQUESTED, b.ptr, b.requested, b.stream, self._tick()))
        if b.size >= self._mss:
            self.stats.cur[_OA] -= 1
        self.stats.on_free_requested(b.pool.index, b.size)
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

    def __deepcopy__(self, memo: dict[int, Any]) -> CachingAllocator:
        """An independent copy (blocks re-linked without recursion, so long chains are fine)."""
        import copy

        new = object.__new__(CachingAllocator)
        memo[id(self)] = new
        olds: dict[int, _Block] = {}
        for pool in (self._small, self._large):
            for k in pool.blocks:
                olds[id(k[3])] = k[3]
            for k in pool.unmapped:
                olds[id(k[2])] = k[2]
        for b in self._allocated.values():
            olds[id(b)] = b
        for b in self._pending.values():
            olds[id(b)] = b
        pools = {id(self._small): _Pool(True), id(self._large): _Pool(False)}
        segs: dict[int, _Expandable] = {}
        clones: dict[int, _Block] = {}
        for key, b in olds.items():
            c = object.__new__(_Block)
            for name in _Block.__slots__:
                setattr(c, name, getattr(b, name))
            c.pool = pools[id(b.pool)]
            if b.seg is not None:
                es = segs.get(id(b.seg))
                if es is None:
                    o = b.seg
                    es = segs[id(o)] = _Expandable(o.base, o.size, o.page, o.stream, o.small)
                c.seg = es
            if b.stream_uses:
                c.stream_uses = set(b.stream_uses)
            clones[key] = c
        for c in clones.values():
            if c.prev is not None:
                c.prev = clones[id(c.prev)]
            if c.next is not None:
                c.next = clones[id(c.next)]
        for old_pool in (self._small, self._large):
            np_ = pools[id(old_pool)]
            np_.gc_count = old_pool.gc_count
            np_.blocks = [(a, b, c, clones[id(d)]) for a, b, c, d in old_pool.blocks]
            np_.unmapped = [(a, b, clones[id(c)]) for a, b, c in old_pool.unmapped]
        for name, value in self.__dict__.items():
            if name in _NOT_DEEPCOPIED:
                continue
            setattr(new, name, copy.deepcopy(value, memo))
        new._clock = self._clock
        new._tappend = new._trace.append if self._tappend is not None else None
        # the default clock ticked once per entry: the copy's own counter goes on from there
        new._tick = (
            itertools.count(self.trace_len() + 1).__next__
            if self._default_clock
            else new._counted_tick
        )
        new._small = pools[id(self._small)]
        new._large = pools[id(self._large)]
        new._allocated = {p: clones[id(b)] for p, b in self._allocated.items()}
        new._pending = {p: clones[id(b)] for p, b in self._pending.items()}
        new._events = {
            s: deque([clones[id(b)], done] for b, done in q) for s, q in self._events.items()
        }
        st = S.DeviceStats(self.stats.max_split_size)
        for name in S.DeviceStats.__slots__:
            v = getattr(self.stats, name)
            setattr(st, name, list(v) if isinstance(v, list) else v)
        new.stats = st
        return new

    def trace_len(self) -> int:
        """Trace entries emitted so far (a monotonic index for `trace_since`)."""
        if self._default_clock:
            return self._trace[-1][4] if self._trace else 0
        return self._trace_count

    def trace_since(self, i: int) -> list[tuple[str, int, int, int, int]]:
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
        return [(ACTIONS[a], addr, size, s, t) for a, addr, size, s, t in tail]

    def snapshot(self, *, include_traces: bool = True, record: bool = True) -> dict[str, Any]:
        """The torch 2.11 `_snapshot()` dict: segments, device_traces, allocator_settings, ...

        As in torch, a `snapshot` trace entry (size = total active bytes) is appended after the
        trace is read, so it shows up in the next snapshot; `record=False` skips it.
        """
        heads: list[_Block] = []
        for b in self._all_blocks():
            if b.mapped and (b.prev is None or not b.prev.mapped):
                heads.append(b)
        heads.sort(key=lambda b: b.ptr)
        segments = []
        total_active = 0
        dev = self.device
        for h in heads:
            blocks = []
            total = alloc = active = req = 0
            addr = h.ptr
            b: _Block | None = h
            while b is not None and b.mapped:
                is_active = b.allocated or b.event_count > 0 or bool(b.stream_uses)
                state = (
                    "active_allocated"
                    if b.allocated
                    else ("active_pending_free" if is_active else "inactive")
                )
                blocks.append(
                    {
                        "address": addr,
                        "size": b.size,
                        "requested_size": b.requested,
                        "state": state,
                        "frames": [],
                    }
                )
                addr += b.size
                total += b.size
                if b.allocated:
                    alloc += b.size
                if is_active:
                    active += b.size
                    req += b.requested
                b = b.next
            total_active += active
            segments.append(
                {
                    "device": dev,
                    "address": h.ptr,
                    "total_size": total,
                    "allocated_size": alloc,
                    "active_size": active,
                    "requested_size": req,
                    "stream": h.stream,
                    "segment_type": "small" if h.pool.small else "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": h.seg is not None,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        traces: list[list[dict[str, Any]]] = [[] for _ in range(dev + 1)]
        if include_traces:
            out = traces[dev]
            for a, addr, size, s, t in self._trace:
                e: dict[str, Any] = {"action": ACTIONS[a]}
                e["device_free" if a == OOM else "addr"] = addr
                e["size"] = size
                e["stream"] = s
                e["time_us"] = t
                e["compile_context"] = "N/A"
                e["user_metadata"] = ""
                out.append(e)
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
        segments: Iterable[Mapping[str, Any]],
        capacity: int,
        config: str | AllocatorConfig = "",
        device: int = 0,
        device_total: int | None = None,
        *,
        reservations: Iterable[tuple[int, bool, int]] = (),
        **kwargs: Any,
    ) -> CachingAllocator:
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
        current). Segments of private pools are refused.
        Extra keyword arguments go to the constructor.
        """
        self = cls(capacity, config, device, device_total, **kwargs)
        segs = [s for s in segments if s.get("device", device) == device]
        exp_runs: dict[tuple[int, bool], list[Mapping[str, Any]]] = {}
        for seg in segs:
            pid = tuple(seg.get("segment_pool_id") or (0, 0))
            if pid != (0, 0):
                raise ValueError(
                    f"from_segments: segment at {seg['address']:#x} belongs to private pool "
                    f"{pid}; private pools (CUDA graphs, MemPool) are not modelled"
                )
            small = seg.get("segment_type") == "small"
            if seg.get("is_expandable"):
                exp_runs.setdefault((seg["stream"], small), []).append(seg)
                continue
            self._load_run(seg, self._small if small else self._large, None)
            self._total += seg["total_size"]
        bases: dict[tuple[int, bool], list[int]] = {}
        for stream, small, base in reservations:
            bases.setdefault((stream, bool(small)), []).append(base)
            exp_runs.setdefault((stream, bool(small)), [])
        for (stream, small), runs in exp_runs.items():
            self._load_expandable(
                stream,
                small,
                sorted(runs, key=lambda s: s["address"]),
                sorted(bases.get((stream, small), ())),
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

    # ------------------------------------------------------------------ internals: state loading

    def _load_run(self, seg: Mapping[str, Any], pool: _Pool, es: _Expandable | None) -> _Block:
        """Chain the blocks of one segment dict (or mapped run) and file each where it belongs."""
        stream = seg["stream"]
        addr = seg["address"]
        prev: _Block | None = None
        head: _Block | None = None
        blocks = seg["blocks"]
        if not blocks:
            raise ValueError(f"from_segments: segment at {addr:#x} has no blocks")
        for bd in blocks:
            b = _Block(addr, bd["size"], stream, pool, es, True)
            b.requested = bd.get("requested_size", 0)
            _link(b, prev, None)
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
                raise ValueError(f"from_segments: block at {addr:#x} has unknown state {state!r}")
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

    def _new_reservation(self, stream: int, small: bool, base: int | None = None) -> _Expandable:
        page = page_size(small, self._lss)
        vsize = reservation_size(self.device_total, page)
        if base is None:
            base = self._provide("expandable", vsize, stream)
        return _Expandable(base, vsize, page, stream, small)

    def _load_expandable(
        self, stream: int, small: bool, runs: list[Mapping[str, Any]], bases: list[int]
    ) -> None:
        """Place sorted mapped `runs` in reservations: one at each known base of sorted `bases`
        (holding the runs within its address space), else one at the lowest run left."""
        pool = self._small if small else self._large
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
            last: _Block | None = None
            while i < len(runs) and runs[i]["address"] + runs[i]["total_size"] <= end:
                run = runs[i]
                if run["address"] > cursor:  # unmapped gap
                    gap = _Block(cursor, run["address"] - cursor, stream, pool, es, False)
                    _link(gap, last, None)
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
                tail = _Block(cursor, end - cursor, stream, pool, es, False)
                _link(tail, last, None)
                pool.insert_unmapped(tail)

    # ------------------------------------------------------------------ internals: allocation

    def _emit(self, action: int, addr: int, size: int, stream: int) -> None:
        self._trace.append((action, addr, size, stream, self._tick()))

    def _counted_tick(self) -> int:
        """The tick of a custom clock: count the entry, then read the clock."""
        self._trace_count += 1
        assert self._clock is not None
        return self._clock()

    def _all_blocks(self) -> list[_Block]:
        out = [k[3] for k in self._small.blocks]
        out += [k[3] for k in self._large.blocks]
        out += self._allocated.values()
        out += self._pending.values()
        return out

    def _get_free_block(self, pool: _Pool, stream: int, size: int, i: int) -> _Block | None:
        """`get_free_block` (section 2.7) when the best fit `blocks[i]` is expandable.

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
        self, pool: _Pool, stream: int, size: int, alloc_size: int, retry: bool
    ) -> _Block | None:
        """`alloc_block`: a new segment from the driver, or the expandable path."""
        st = self.stats
        if retry:
            st.num_alloc_retries += 1
        if self._allowed is not None and self._total + alloc_size > self._allowed:
            return None
        if self._expandable:
            return self._try_allocate_expandable(pool, stream, size)
        if self._total + alloc_size > self.capacity:
            return None  # cudaMalloc: out of memory
        ptr = self._provide("segment", alloc_size, stream)
        self._check_address(ptr, alloc_size)
        self._total += alloc_size
        b = _Block(ptr, alloc_size, stream, pool)
        p = pool.index
        st.inc(S.SEGMENT, p, 1)
        st.inc(S.RESERVED_BYTES, p, alloc_size)
        if alloc_size >= self._mss:
            st.inc1(S.OVERSIZE_SEGMENTS)
        st.num_device_alloc += 1
        if self._record:
            self._emit(SEGMENT_ALLOC, ptr, alloc_size, stream)
        return b

    def _check_address(self, ptr: int, size: int) -> None:
        if isinstance(ptr, bool) or not isinstance(ptr, int) or ptr <= 0 or ptr % 512:
            raise ValueError(
                f"address_provider returned {ptr!r}: need a positive int, a multiple of 512"
            )

    def _free_block(self, b: _Block) -> None:
        """`free_block` of a block whose events completed (section 2.10).

        `free` inlines the same steps for a block without stream uses (the common case):
        a change here goes there too.
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
            elif self._try_merge(b, prev):
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
            elif self._try_merge(b, nxt):
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

    def _try_merge(self, dst: _Block, src: _Block | None) -> int:
        """`try_merge_blocks`: absorb a free neighbour in the same mapped state; its size."""
        if (
            src is None
            or src.allocated
            or src.event_count > 0
            or src.stream_uses
            or dst.mapped != src.mapped
        ):
            return 0
        pool = dst.pool
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

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

    # ------------------------------------------------------------------ internals: release

    def _release_block(self, b: _Block) -> None:
        """`release_block`: cudaFree a whole free non-expandable segment."""
        st = self.stats
        st.num_device_free += 1
        if self._record:
            self._emit(SEGMENT_FREE, b.ptr, b.size, b.stream)
        self._total -= b.size
        pool = b.pool
        p = pool.index
        st.dec(S.SEGMENT, p, 1)
        st.dec(S.RESERVED_BYTES, p, b.size)
        if b.size >= self._mss:
            st.dec1(S.OVERSIZE_SEGMENTS)
        pool.remove(b)

    def _release_blocks(self, pool: _Pool) -> None:
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
        """`release_cached_blocks` (empty_cache and the last retry): large pool, then small."""
        self._synchronize_and_free_events()
        self._release_blocks(self._large)
        self._release_blocks(self._small)

    def _release_available(self, pool: _Pool, stream: int, size: int) -> bool:
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
        """`garbage_collect_cached_blocks` (section 2.11): free the oldest whole segments."""
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

    def _try_allocate_expandable(self, pool: _Pool, stream: int, size: int) -> _Block | None:
        """`try_allocate_expandable_block`: map pages at the lowest address that fits (2.13)."""
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

    def _find_expandable_block(self, pool: _Pool, stream: int, size: int) -> _Block:
        """`find_expandable_block`: first unmapped range (with a free block before it) that fits."""

        def allocatable(b: _Block | None) -> bool:
            return b is not None and not b.allocated and b.event_count == 0 and not b.stream_uses

        um = pool.unmapped
        i = bisect_left(um, (stream,))
        while i < len(um) and um[i][0] == stream:
            c = um[i][2]
            if allocatable(c.prev):
                c = c.prev  # type: ignore[assignment]
            nbytes = 0
            b: _Block | None = c
            while nbytes < size and allocatable(b):
                assert b is not None
                nbytes += b.size
                b = b.next
            if nbytes >= size:
                return c
            i += 1
        es = self._new_reservation(stream, pool.small)
        self._check_address(es.base, es.size)
        c = _Block(es.base, es.size, stream, pool, es, False)
        pool.insert_unmapped(c)
        return c

    def _map_block(self, b: _Block, size: int) -> bool:
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
            rest = _Block(b.ptr + nbytes, b.size - nbytes, b.stream, pool, es, False)
            _link(rest, b, b.next)
            pool.insert_unmapped(rest)
            b.size = nbytes
        self._try_merge(b, b.prev)
        self._try_merge(b, b.next)
        pool.insert(b)
        self._total += nbytes
        st = self.stats
        st.inc(S.RESERVED_BYTES, pool.index, nbytes)
        st.num_device_alloc += 1
        if self._record:
            self._emit(SEGMENT_MAP, start, nbytes, b.stream)
        return True

    def _unmap_block(self, b: _Block) -> None:
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
            bf = _Block(b.ptr, before, b.stream, pool, es, True)
            _link(bf, b.prev, b)
            pool.insert(bf)
        after = b.size - before - usize
        if after > 0:
            af = _Block(uptr + usize, after, b.stream, pool, es, True)
            _link(af, b, b.next)
            pool.insert(af)
        b.ptr = uptr
        b.size = usize
        b.mapped = False
        self._try_merge(b, b.prev)
        self._try_merge(b, b.next)
        pool.insert_unmapped(b)
        self._total -= usize
        st = self.stats
        st.dec(S.RESERVED_BYTES, pool.index, usize)
        st.num_device_free += 1
        if self._record:
            self._emit(SEGMENT_UNMAP, uptr, usize, b.stream)

    # ------------------------------------------------------------------ internals: OOM

    def _oom(self, size: int, rsize: int, alloc_size: int, stream: int) -> None:
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
        )
