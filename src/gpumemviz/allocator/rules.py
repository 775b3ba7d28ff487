"""Placement rules of PyTorch's CUDA caching allocator, as pure functions.

As c10/cuda/CUDACachingAllocator.cpp implements them (round_size, get_allocation_size, the
small/large pool split, should_split). The model, replay, fragmentation analysis
and `can_fit` all use these, so there is exactly one copy of each rule.
"""

from __future__ import annotations

from collections.abc import Sequence

# the settings' unit, defaults and bounds: defined with the settings parser (the snapshot layer,
# which parses a snapshot's recorded settings), listed here with the rules that use them
from gpumemviz.snapshot.settings import (
    K_LARGE_BUFFER,
    K_MIN_LARGE_ALLOC,
    MIB,
    N_ROUNDUP_INTERVALS,
    UNLIMITED,
)

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "MIB",
    "N_ROUNDUP_INTERVALS",
    "UNLIMITED",
    "allocation_size",
    "division_index",
    "is_small",
    "oversize_rejects",
    "page_size",
    "reservation_size",
    "round_size",
    "roundup_power2_next_division",
    "should_split",
]

K_MIN_BLOCK_SIZE = 512  # every size is a multiple of this
K_SMALL_SIZE = 1 * MIB  # rounded size <= this goes to the small pool
K_SMALL_BUFFER = 2 * MIB  # small-pool segment size and small expandable page
K_ROUND_LARGE = 2 * MIB  # larger requests are cudaMalloc'd rounded up to this


def division_index(size: int) -> int:
    """Which roundup_power2_divisions interval `size` is in: floor(log2(size)) - 20, clamped."""
    return min(max(size.bit_length() - 1 - 20, 0), N_ROUNDUP_INTERVALS - 1)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round `size` up to the next of `divisions` equal steps between two powers of two."""
    if size & (size - 1) == 0:
        return size
    floor_pow2 = 1 << (size.bit_length() - 1)
    step = floor_pow2 >> (divisions.bit_length() - 1)
    if step == 0:
        return 2 * floor_pow2
    return -(-size // step) * step


def round_size(size: int, divisions: Sequence[int] | None = None) -> int:
    """The block size the allocator carves for a request of `size` bytes.

    See docs/allocator.md, Rounding.

    `divisions` is the 16-entry `roundup_power2_divisions` table (None or all zero: plain rounding).

    >>> round_size(1), round_size(513), round_size(4_000_000)
    (512, 1024, 4000256)
    >>> round_size(5_000_000, [4] * 16)
    5242880
    """
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions:
        div = divisions[division_index(size)]
        if div > 1 and size > K_MIN_BLOCK_SIZE * div:
            return roundup_power2_next_division(size, div)
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def is_small(rounded_size: int) -> bool:
    """Pool choice: small iff the rounded size is at most 1 MiB (not "< 1 MB").

    See docs/allocator.md, Pools.
    """
    return rounded_size <= K_SMALL_SIZE


def allocation_size(rounded_size: int, large_segment_size: int = K_LARGE_BUFFER) -> int:
    """Bytes cudaMalloc is asked for when no cached block fits (docs/allocator.md, Segment sizes).

    >>> [allocation_size(s) // 2**20 for s in (512, 4_000_256, 10 * 2**20, 10 * 2**20 + 512)]
    [2, 20, 10, 12]
    """
    if rounded_size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded_size < K_MIN_LARGE_ALLOC:
        return large_segment_size
    return -(-rounded_size // K_ROUND_LARGE) * K_ROUND_LARGE


def page_size(small: bool, large_segment_size: int = K_LARGE_BUFFER) -> int:
    """Mapping granularity of an expandable segment of that pool.

    See docs/allocator.md, Expandable segments.
    """
    return K_SMALL_BUFFER if small else large_segment_size


def reservation_size(device_total: int, page: int) -> int:
    """Virtual address space of one expandable segment: 1.125 × device memory in whole pages.

    `ExpandableSegment` reserves page × ceil((total + total / 8) / page) bytes.

    >>> reservation_size(80 * 2**30, 20 * 2**20) // 2**20
    92160
    """
    return page * -(-(device_total + device_total // 8) // page)


def should_split(
    block_size: int,
    size: int,
    *,
    small: bool,
    expandable: bool = False,
    max_split_size: int = UNLIMITED,
    no_split: bool = False,
) -> bool:
    """Whether handing out `size` bytes of a `block_size` free block leaves a separate block.

    See docs/allocator.md, Splitting.

    Small pool or expandable mode: split when at least 512 bytes remain. `expandable` is the
    allocator's setting (`expandable_segments:True`), not whether this block lies in an
    expandable segment: torch's `should_split` reads the config flag. Large pool: only for
    requests below max_split_size, and only when strictly more than 1 MiB remains, so a large
    block can be handed out whole with up to 1 MiB of internal waste.
    """
    if no_split:
        return False
    remaining = block_size - size
    if small or expandable:
        return remaining >= K_MIN_BLOCK_SIZE
    return size < max_split_size and remaining > K_SMALL_SIZE


def oversize_rejects(
    block_size: int, size: int, max_split_size: int, max_non_split_rounding: int
) -> bool:
    """Whether the best-fit candidate is refused by the oversize rules.

    See docs/allocator.md, Oversize blocks.

    A block of at least max_split_size never serves a smaller request, and serves a larger one
    only if it wastes less than max_non_split_rounding bytes.
    """
    if size < max_split_size and block_size >= max_split_size:
        return True
    return size >= max_split_size and block_size >= size + max_non_split_rounding
