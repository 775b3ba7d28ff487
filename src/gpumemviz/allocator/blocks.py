"""The model's memory structures: blocks linked into segments, pools, expandable reservations.

`ModelBlock` is torch's `Block` (a run of one segment, linked to its neighbours), `BlockPool`
its `BlockPool` (the free blocks, sorted for best fit) and `Reservation` its
`ExpandableSegment` (one virtual address range mapped page by page), `PrivatePool` its
`PrivatePool` (a MemPool's or a CUDA graph's own pair of pools, named by a `PoolId`). `link`
and `try_merge` are the two ways blocks are re-linked. Not the `snapshot.Block` of a recorded
snapshot: these are the model's own mutable state, which `model.CachingAllocator` holds.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from gpumemviz.allocator import stats as S
from gpumemviz.allocator.trace import Frames

__all__ = [
    "DEFAULT_POOL",
    "BlockPool",
    "ModelBlock",
    "PoolId",
    "PrivatePool",
    "Reservation",
    "link",
    "try_merge",
]

PoolId = tuple[int, int]
"""A pool's id as torch hands them out: (0, n) for a MemPool, (n, 0) for a CUDA graph's."""
DEFAULT_POOL: PoolId = (0, 0)


class Reservation:
    """One virtual address reservation (`ExpandableSegment`): base, size, page."""

    __slots__ = ("base", "page", "size", "small", "stream")

    def __init__(self, base: int, size: int, page: int, stream: int, small: bool) -> None:
        self.base = base
        self.size = size
        self.page = page
        self.stream = stream
        self.small = small


class ModelBlock:
    """A `Block`: a run of one segment, linked to its neighbours.

    `frames` is torch's `context_when_allocated`: the call site given to the malloc that
    handed it out (None: none given). It is only read while the block is active, so a freed
    block keeps a stale one until its next malloc sets it.
    """

    __slots__ = (
        "allocated",
        "event_count",
        "frames",
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
        pool: BlockPool,
        seg: Reservation | None = None,
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
        self.frames: Frames | None = None
        self.prev: ModelBlock | None = None
        self.next: ModelBlock | None = None
        self.gc_base = 0


class BlockPool:
    """A `BlockPool`: free mapped blocks by (stream, size, ptr); unmapped by (stream, ptr).

    `owner` is the `PrivatePool` it belongs to (None: the default pools); `no_split` is its
    owner's MemPool option, kept here so that the malloc hot path reads one attribute.
    """

    __slots__ = ("blocks", "gc_count", "index", "no_split", "owner", "small", "unmapped")

    def __init__(self, small: bool, owner: PrivatePool | None = None) -> None:
        self.small = small
        self.index = S.SMALL if small else S.LARGE
        self.blocks: list[tuple[int, int, int, ModelBlock]] = []
        self.unmapped: list[tuple[int, int, ModelBlock]] = []
        self.gc_count = 0
        self.owner = owner
        self.no_split = False

    def insert(self, b: ModelBlock) -> None:
        b.gc_base = self.gc_count
        insort(self.blocks, (b.stream, b.size, b.ptr, b))

    def remove(self, b: ModelBlock) -> None:
        blocks = self.blocks
        del blocks[bisect_left(blocks, (b.stream, b.size, b.ptr))]

    def insert_unmapped(self, b: ModelBlock) -> None:
        insort(self.unmapped, (b.stream, b.ptr, b))

    def remove_unmapped(self, b: ModelBlock) -> None:
        um = self.unmapped
        del um[bisect_left(um, (b.stream, b.ptr))]


class PrivatePool:
    """A `PrivatePool`: the small and large pools of one MemPool or CUDA-graph pool.

    `use_count` counts the holders (the MemPool object, each open `use_mem_pool` or capture);
    at 0 the pool is freeable and the next release frees its whole free segments.
    `malloc_count` is torch's `cudaMalloc_count` (segments and maps it holds): the pool is
    forgotten once freeable and at 0. `reserved` is the bytes it holds from the device.
    """

    __slots__ = ("id", "large", "malloc_count", "reserved", "small", "use_count", "use_on_oom")

    def __init__(self, pool_id: PoolId, no_split: bool = False) -> None:
        self.id = pool_id
        self.small = BlockPool(True, self)
        self.large = BlockPool(False, self)
        self.small.no_split = self.large.no_split = no_split
        self.use_count = 1
        self.malloc_count = 0
        self.reserved = 0  # bytes of its segments and mapped pages
        self.use_on_oom = False


def link(b: ModelBlock, before: ModelBlock | None, after: ModelBlock | None) -> None:
    """`splice`: put b between before and after."""
    if before is not None:
        before.next = b
    b.prev = before
    if after is not None:
        after.prev = b
    b.next = after


def try_merge(dst: ModelBlock, src: ModelBlock | None) -> int:
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
