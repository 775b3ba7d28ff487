"""Every placement rule of allocator/rules.py against worked examples.

The table is that of docs/allocator.md, Rounding.
"""

from __future__ import annotations

import pytest

from gpumemviz.allocator.rules import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    MIB,
    UNLIMITED,
    allocation_size,
    division_index,
    is_small,
    oversize_rejects,
    page_size,
    reservation_size,
    round_size,
    roundup_power2_next_division,
    should_split,
)


def test_constants():
    assert (K_MIN_BLOCK_SIZE, K_SMALL_SIZE, K_SMALL_BUFFER) == (512, 1048576, 2097152)
    assert (K_MIN_LARGE_ALLOC, K_ROUND_LARGE, K_LARGE_BUFFER) == (10485760, 2097152, 20971520)
    assert UNLIMITED == 2**64 - 1


# request -> (round_size, pool, get_allocation_size), the table of docs/allocator.md, Rounding
WORKED_EXAMPLES = [
    (1, 512, "small", 2 * MIB),
    (513, 1024, "small", 2 * MIB),
    (1_048_576, 1_048_576, "small", 2 * MIB),
    (1_048_577, 1_049_088, "large", 20 * MIB),
    (4_000_000, 4_000_256, "large", 20 * MIB),
    (10_485_760, 10_485_760, "large", 10 * MIB),
    (10_485_761, 10_486_272, "large", 12 * MIB),
    (40_960_000, 40_960_000, "large", 41_943_040),
]


@pytest.mark.parametrize(("request_", "rounded", "pool", "segment"), WORKED_EXAMPLES)
def test_worked_examples_of_rounding_and_segment_sizes(request_, rounded, pool, segment):
    assert round_size(request_) == rounded
    assert is_small(rounded) == (pool == "small")
    assert allocation_size(rounded) == segment


def test_round_size_below_and_at_512():
    assert [round_size(n) for n in (0, 1, 511, 512, 513, 1024, 1025)] == [
        512, 512, 512, 512, 1024, 1024, 1536,
    ]  # fmt: skip


def test_roundup_divisions_examples():
    four = [4] * 16
    assert round_size(5_000_000, four) == 5_242_880
    assert round_size(300_000_000, four) == 335_544_320
    # the docs' "1200 -> 1280" does not happen: 1200 <= 512 * 4 goes to plain rounding
    assert round_size(1200, four) == 1536
    # powers of two stay; divisions of 0 or 1 mean plain rounding
    assert round_size(8 * MIB, four) == 8 * MIB
    assert round_size(5_000_000, [1] * 16) == round_size(5_000_000) == 5_000_192
    assert round_size(5_000_000, [0] * 16) == 5_000_192
    # the interval of the size picks the entry: 5 MB is in [4, 8) MiB, index 2
    table = [0] * 16
    table[2] = 2
    assert round_size(5_000_000, table) == 6 * MIB  # 2 divisions of [4, 8) MiB: 4, 6, 8
    assert round_size(3_000_000, table) == 3_000_320  # index 1: no rounding


def test_roundup_power2_next_division():
    assert roundup_power2_next_division(1 << 30, 8) == 1 << 30
    assert roundup_power2_next_division(5 * MIB + 1, 4) == 6 * MIB  # steps of 1 MiB in [4, 8)
    assert roundup_power2_next_division(5 * MIB, 4) == 5 * MIB
    assert roundup_power2_next_division(600, 2048) == 1024  # step 0 -> next power of two


def test_division_index_intervals():
    assert division_index(1) == 0
    assert division_index(2 * MIB - 1) == 0
    assert division_index(2 * MIB) == 1
    assert division_index(4 * MIB - 1) == 1
    assert division_index(1 << 35) == 15  # 32 GiB and above share the last interval
    assert division_index(1 << 40) == 15


def test_pool_is_small_up_to_and_including_1_mib():
    assert is_small(K_SMALL_SIZE)
    assert not is_small(K_SMALL_SIZE + 512)


def test_allocation_size_boundaries_and_large_segment_size():
    assert allocation_size(K_MIN_LARGE_ALLOC - 512) == 20 * MIB
    assert allocation_size(K_MIN_LARGE_ALLOC) == 10 * MIB
    assert allocation_size(4 * MIB, large_segment_size=64 * MIB) == 64 * MIB
    assert allocation_size(512, large_segment_size=64 * MIB) == 2 * MIB


def test_should_split_small_pool_and_expandable_at_512():
    assert should_split(2 * MIB, 2 * MIB - 512, small=True)
    assert not should_split(2 * MIB, 2 * MIB - 511, small=True)
    assert should_split(20 * MIB, 20 * MIB - 512, small=False, expandable=True)
    assert not should_split(20 * MIB, 20 * MIB - 256, small=False, expandable=True)


def test_should_split_large_pool_needs_more_than_1_mib_left():
    assert not should_split(20 * MIB, 19 * MIB, small=False)  # exactly 1 MiB left: handed out
    assert should_split(20 * MIB, 19 * MIB - 512, small=False)
    # requests at or above max_split_size never split
    assert not should_split(64 * MIB, 30 * MIB, small=False, max_split_size=30 * MIB)
    assert should_split(64 * MIB, 30 * MIB - 512, small=False, max_split_size=30 * MIB)
    assert not should_split(2 * MIB, 512, small=True, no_split=True)


def test_oversize_rules_both():
    mss, mnsr = 64 * MIB, 20 * MIB
    # rule 1: an oversize block never serves a normal request
    assert oversize_rejects(64 * MIB, 30 * MIB, mss, mnsr)
    assert not oversize_rejects(63 * MIB, 30 * MIB, mss, mnsr)
    # rule 2: an oversize request takes an oversize block only with less than mnsr waste
    assert not oversize_rejects(100 * MIB - 512, 80 * MIB, mss, mnsr)
    assert oversize_rejects(100 * MIB, 80 * MIB, mss, mnsr)
    # unset max_split_size: nothing is oversize
    assert not oversize_rejects(1 << 40, 512, UNLIMITED, mnsr)


def test_page_and_reservation_size():
    assert page_size(True) == 2 * MIB
    assert page_size(False) == 20 * MIB
    assert page_size(False, 64 * MIB) == 64 * MIB
    total = 80 * 2**30
    assert reservation_size(total, 20 * MIB) == 20 * MIB * -(-(total * 9 // 8) // (20 * MIB))
    assert reservation_size(1000 * MIB, 20 * MIB) == 1140 * MIB  # 1125 MiB -> 57 pages
