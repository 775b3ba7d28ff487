"""Hand-computed cases for every rule of the model (the rules of docs/allocator.md)."""

from __future__ import annotations

import contextlib
import copy
import pickle
import random

import pytest

from gpumemviz.allocator.addresses import DescendingAddresses
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.invariants import check_invariants
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.rules import MIB
from gpumemviz.allocator.stats import walk_stats

GIB = 1 << 30
B = 0x7F0000000000  # a base address for hand-placed segments


def fixed(*addrs: int):
    """An address provider handing out the given addresses in order, recording the calls."""
    it = iter(addrs)
    calls: list[tuple[str, int, int]] = []

    def provide(kind: str, size: int, stream: int) -> int:
        calls.append((kind, size, stream))
        return next(it)

    provide.calls = calls  # type: ignore[attr-defined]
    return provide


def blocks(a: CachingAllocator, seg: int = 0) -> list[tuple[int, int, str]]:
    """(address, size, state) of the blocks of one segment of a fresh snapshot."""
    s = a.snapshot(record=False)["segments"][seg]
    return [(b["address"], b["size"], b["state"]) for b in s["blocks"]]


def actions(a: CachingAllocator, since: int = 0) -> list[tuple[str, int, int]]:
    return [(act, addr, size) for act, addr, size, _, _ in a.trace_since(since)]


def check(a: CachingAllocator) -> None:
    """The snapshot is sound and the incremental stats equal a walk of the blocks."""
    snap = a.snapshot(record=False)
    assert check_invariants(snap) == []
    stats = a.memory_stats()
    for k, v in walk_stats(snap["segments"]).items():
        assert stats[k] == v, k


# ---------------------------------------------------------------------------- split


def test_small_pool_split_carves_from_the_low_end():
    a = CachingAllocator(GIB, address_provider=fixed(B))
    p1 = a.malloc(100)
    p2 = a.malloc(1000)
    assert (p1, p2) == (B, B + 512)
    assert blocks(a) == [
        (B, 512, "active_allocated"),
        (B + 512, 1024, "active_allocated"),
        (B + 1536, 2 * MIB - 1536, "inactive"),
    ]
    s = a.memory_stats()
    assert s["inactive_split_bytes.small_pool.current"] == 2 * MIB - 1536
    assert s["inactive_split.small_pool.current"] == 1
    assert s["requested_bytes.all.current"] == 1100
    assert s["allocated_bytes.all.current"] == 1536
    assert actions(a) == [
        ("segment_alloc", B, 2 * MIB),
        ("alloc", B, 100),
        ("alloc", B + 512, 1000),
    ]
    check(a)


def test_large_pool_splits_only_when_more_than_1_mib_remains():
    a = CachingAllocator(GIB, address_provider=fixed(B, B - 64 * MIB))
    p = a.malloc(4_000_000)  # 20 MiB segment, 4_000_256 block, 16+ MiB left: split
    assert blocks(a) == [
        (B, 4_000_256, "active_allocated"),
        (B + 4_000_256, 16_971_264, "inactive"),
    ]
    a.free(p)
    assert blocks(a) == [(B, 20 * MIB, "inactive")]
    q = a.malloc(19 * MIB)  # exactly 1 MiB would remain: the whole block is handed out
    assert q == B
    assert blocks(a) == [(B, 20 * MIB, "active_allocated")]
    assert a.snapshot(record=False)["segments"][0]["blocks"][0]["requested_size"] == 19 * MIB
    a.free(q)
    r = a.malloc(19 * MIB - 512)  # 1 MiB + 512 remains: split
    assert blocks(a) == [
        (B, 19 * MIB - 512, "active_allocated"),
        (B + 19 * MIB - 512, MIB + 512, "inactive"),
    ]
    assert r == B
    check(a)


# ---------------------------------------------------------------------------- merge


def test_free_merges_with_free_neighbours():
    a = CachingAllocator(GIB, address_provider=fixed(B))
    p = [a.malloc(4 * MIB) for _ in range(3)]
    assert p == [B, B + 4 * MIB, B + 8 * MIB]
    a.free(p[1])
    assert [s for _, _, s in blocks(a)] == [
        "active_allocated",
        "inactive",
        "active_allocated",
        "inactive",
    ]
    assert a.memory_stats()["inactive_split.large_pool.current"] == 2
    a.free(p[0])  # merges with the block after it
    assert blocks(a)[0] == (B, 8 * MIB, "inactive")
    assert a.memory_stats()["inactive_split_bytes.large_pool.current"] == 8 * MIB + 8 * MIB
    a.free(p[2])  # merges both ways: the segment is one free block again
    assert blocks(a) == [(B, 20 * MIB, "inactive")]
    s = a.memory_stats()
    assert s["inactive_split.all.current"] == 0 and s["inactive_split_bytes.all.current"] == 0
    assert s["active.all.current"] == 0
    check(a)


# ---------------------------------------------------------------------------- best fit


def test_best_fit_lowest_address_on_ties_and_per_stream():
    a = CachingAllocator(GIB, address_provider=fixed(B, B - 32 * MIB, B - 64 * MIB, B - 96 * MIB))
    xs = [a.malloc(12 * MIB), a.malloc(12 * MIB), a.malloc(12 * MIB, stream=5)]
    assert xs == [B, B - 32 * MIB, B - 64 * MIB]
    for p in xs:
        a.free(p)
    assert a.malloc(12 * MIB) == B - 32 * MIB  # a tie: the lowest address wins
    assert a.malloc(12 * MIB, stream=5) == B - 64 * MIB
    assert a.malloc(12 * MIB, stream=5) == B - 96 * MIB  # stream 0's free block is not used
    check(a)


def test_best_fit_prefers_the_smaller_block():
    a = CachingAllocator(GIB, address_provider=fixed(B, B - 64 * MIB))
    big = a.malloc(30 * MIB)
    small = a.malloc(12 * MIB)
    a.free(big)
    a.free(small)
    assert a.malloc(11 * MIB) == B - 64 * MIB  # the 12 MiB block, not the 30 MiB one


# ---------------------------------------------------------------------------- oversize


def test_oversize_block_never_serves_a_normal_request():
    a = CachingAllocator(GIB, "max_split_size_mb:32", address_provider=fixed(B, B - 64 * MIB))
    p = a.malloc(40 * MIB)
    assert a.memory_stats()["oversize_segments.current"] == 1
    assert a.memory_stats()["oversize_allocations.current"] == 1
    a.free(p)
    q = a.malloc(8 * MIB)  # < max_split_size: the cached 40 MiB block is refused
    assert q == B - 64 * MIB
    s = a.memory_stats()
    assert s["segment.all.current"] == 2 and s["oversize_allocations.current"] == 0
    assert s["max_split_size"] == 32 * MIB
    check(a)


def test_oversize_block_serves_a_large_request_within_max_non_split_rounding():
    a = CachingAllocator(GIB, "max_split_size_mb:32", address_provider=fixed(B, B - 128 * MIB))
    p = a.malloc(64 * MIB)
    a.free(p)
    q = a.malloc(40 * MIB)  # 64 >= 40 + 20: refused, new 40 MiB segment
    assert q == B - 128 * MIB
    a.free(q)
    r = a.malloc(45 * MIB)  # best fit is the 64 MiB block; 64 < 45 + 20: served whole
    assert r == B
    seg = next(s for s in a.snapshot(record=False)["segments"] if s["address"] == B)
    assert [(b["size"], b["requested_size"]) for b in seg["blocks"]] == [(64 * MIB, 45 * MIB)]
    check(a)


# ---------------------------------------------------------------------------- roundup


def test_roundup_power2_divisions_rounds_the_block():
    a = CachingAllocator(GIB, "roundup_power2_divisions:4", address_provider=fixed(B))
    p = a.malloc(5_000_000)
    assert blocks(a)[0] == (p, 5_242_880, "active_allocated")
    s = a.memory_stats()
    assert s["requested_bytes.all.current"] == 5_000_000
    assert s["allocated_bytes.all.current"] == 5_242_880
    check(a)


# ---------------------------------------------------------------------------- release paths


def test_release_available_cached_blocks_frees_an_oversize_segment_first():
    a = CachingAllocator(80 * MIB, "max_split_size_mb:32", address_provider=fixed(B, B - 128 * MIB))
    p = a.malloc(60 * MIB)
    a.free(p)
    i = a.trace_len()
    q = a.malloc(30 * MIB)  # 60 + 30 > 80: release the oversize 60 MiB block, then cudaMalloc
    assert q == B - 128 * MIB
    assert actions(a, i) == [
        ("segment_free", B, 60 * MIB),
        ("segment_alloc", B - 128 * MIB, 30 * MIB),
        ("alloc", B - 128 * MIB, 30 * MIB),
    ]
    s = a.memory_stats()
    assert s["num_alloc_retries"] == 0 and s["num_sync_all_streams"] == 0
    check(a)


def test_release_and_retry_then_oom():
    a = CachingAllocator(40 * MIB, address_provider=fixed(B, B - 32 * MIB, B - 64 * MIB))
    a.free(a.malloc(4_000_000))  # a free 20 MiB segment
    a.free(a.malloc(100))  # a free 2 MiB small segment
    i = a.trace_len()
    p = a.malloc(30 * MIB)  # 22 + 30 > 40: release everything cached, retry
    assert p == B - 64 * MIB
    assert actions(a, i) == [
        ("segment_free", B, 20 * MIB),  # large pool first
        ("segment_free", B - 32 * MIB, 2 * MIB),  # then small
        ("segment_alloc", B - 64 * MIB, 30 * MIB),
        ("alloc", B - 64 * MIB, 30 * MIB),
    ]
    s = a.memory_stats()
    assert s["num_alloc_retries"] == 1 and s["num_sync_all_streams"] == 1
    assert s["num_device_free"] == 2 and s["num_device_alloc"] == 3
    i = a.trace_len()
    with pytest.raises(OutOfMemory) as e:
        a.malloc(20 * MIB - 100)
    oom = e.value
    assert (oom.alloc_size, oom.rounded_size, oom.size) == (20 * MIB, 20 * MIB - 0, 20 * MIB - 100)
    assert (oom.capacity, oom.free, oom.allocated, oom.reserved) == (
        40 * MIB,
        10 * MIB,
        30 * MIB,
        30 * MIB,
    )
    assert str(oom).startswith(
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
        "40.00 MiB of which 10.00 MiB is free. Of the allocated memory 30.00 MiB is allocated "
        "by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )
    assert a.trace_since(i)[-1][:3] == ("oom", 10 * MIB, 20 * MIB)
    assert a.memory_stats()["num_ooms"] == 1
    assert pickle.loads(pickle.dumps(oom)).fields() == oom.fields()
    check(a)


def test_oom_message_with_a_fraction_cap():
    a = CachingAllocator(100 * MIB, "per_process_memory_fraction:0.5")
    a.malloc(40 * MIB)
    with pytest.raises(OutOfMemory, match=r"50\.00 MiB allowed; Of the allocated memory") as e:
        a.malloc(12 * MIB)  # 40 + 12 > 50 allowed although 60 MiB of the device is free
    assert e.value.allowed == 50 * MIB


def test_empty_cache_releases_large_pool_first_in_size_order():
    p = fixed(B, B - 32 * MIB, B - 64 * MIB, B - 96 * MIB, B - 128 * MIB)
    a = CachingAllocator(GIB, address_provider=p)
    ptrs = [a.malloc(12 * MIB, stream=3), a.malloc(100), a.malloc(14 * MIB), a.malloc(12 * MIB)]
    keep = a.malloc(1000)  # shares the small segment with ptrs[1]: that segment stays
    for q in ptrs:
        a.free(q)
    i = a.trace_len()
    released = a.empty_cache()
    # large pool by (stream, size, address), then small; the partly used small segment stays
    assert actions(a, i) == [
        ("segment_free", B - 96 * MIB, 12 * MIB),
        ("segment_free", B - 64 * MIB, 14 * MIB),
        ("segment_free", B, 12 * MIB),
    ]
    assert released == 38 * MIB
    assert a.reserved == 2 * MIB and keep == B - 32 * MIB + 512
    check(a)


def test_garbage_collection_frees_the_oldest_whole_segments():
    addrs = [B - k * 32 * MIB for k in range(8)]
    a = CachingAllocator(
        200 * MIB,
        "garbage_collection_threshold:0.5,per_process_memory_fraction:0.5",
        address_provider=fixed(*addrs),
    )
    p = [a.malloc(12 * MIB) for _ in range(4)]  # 4 large-pool lookups, 4 segments (48 MiB)
    a.free(p[0])
    a.free(p[1])  # both cached at clock 4
    a.malloc(14 * MIB)  # clock 5; 48 <= 50: no GC; a 14 MiB segment (62 MiB reserved)
    a.free(p[2])  # cached at clock 5
    i = a.trace_len()
    a.malloc(16 * MIB)  # clock 6, nothing fits; 62 > 50: GC must reclaim 12 MiB
    # ages 2, 2, 1 (mean 5/3): the two older segments go, in pool order, then the new segment
    assert actions(a, i) == [
        ("segment_free", addrs[1], 12 * MIB),  # pool order: the lower address first
        ("segment_free", addrs[0], 12 * MIB),
        ("segment_alloc", addrs[5], 16 * MIB),
        ("alloc", addrs[5], 16 * MIB),
    ]
    assert a.memory_stats()["num_sync_all_streams"] == 0  # GC does not sync
    check(a)


def test_gc_is_off_without_a_fraction():
    a = CachingAllocator(200 * MIB, "garbage_collection_threshold:0.5")
    p = [a.malloc(12 * MIB) for _ in range(8)]
    for q in p:
        a.free(q)
    i = a.trace_len()
    a.malloc(16 * MIB)
    assert [x[0] for x in a.trace_since(i)] == ["segment_alloc", "alloc"]


# ---------------------------------------------------------------------------- pending frees


def test_record_stream_defers_the_free_until_events_complete():
    a = CachingAllocator(GIB, address_provider=fixed(B))
    p = a.malloc(1000)
    a.record_stream(p, 0)  # the allocation stream itself: ignored
    a.record_stream(p, 7)
    i = a.trace_len()
    a.free(p)
    assert actions(a, i) == [("free_requested", B, 1000)]
    assert blocks(a)[0] == (B, 1024, "active_pending_free")
    s = a.memory_stats()
    assert s["allocated_bytes.all.current"] == 0 and s["active_bytes.all.current"] == 1024
    q = a.malloc(1000)  # the pending block is not reusable
    assert q == B + 1024
    assert a.complete_events() == 1
    assert blocks(a)[0][2] == "active_pending_free"  # freed by the next malloc, as in torch
    i = a.trace_len()
    r = a.malloc(600)
    assert actions(a, i) == [("free_completed", B, 1000), ("alloc", B, 600)]
    assert r == B
    check(a)


def test_empty_cache_synchronizes_pending_frees():
    a = CachingAllocator(GIB, address_provider=fixed(B))
    p = a.malloc(1000)
    a.record_stream(p, 7)
    a.record_stream(p, 8)
    a.free(p)
    assert a.empty_cache() == 2 * MIB  # events synced, block freed, segment released
    assert a.memory_stats()["num_sync_all_streams"] == 1
    assert a.snapshot(record=False)["segments"] == []


def test_complete_events_of_one_stream_only():
    a = CachingAllocator(GIB)
    p = a.malloc(1000)
    a.record_stream(p, 7)
    a.record_stream(p, 8)
    a.free(p)
    assert a.complete_events(7, process=True) == 1
    assert a.memory_stats()["active.all.current"] == 1  # still waits on stream 8
    assert a.complete_events(8, process=True) == 1
    assert a.memory_stats()["active.all.current"] == 0


# ---------------------------------------------------------------------------- expandable

R = 0x7E0000000000
EXP = "expandable_segments:True"


def exp_alloc(capacity: int = GIB, *bases: int) -> CachingAllocator:
    return CachingAllocator(capacity, EXP, address_provider=fixed(*(bases or (R,))))


def test_expandable_maps_one_page_for_the_rounded_request():
    provide = fixed(R)
    a = CachingAllocator(GIB, EXP, address_provider=provide)
    p = a.malloc(4_000_000)
    assert p == R
    assert provide.calls == [("expandable", 58 * 20 * MIB, 0)]  # 1.125 GiB in 20 MiB pages
    assert actions(a) == [("segment_map", R, 20 * MIB), ("alloc", R, 4_000_000)]
    q = a.malloc(4_000_000)  # the next one fits in the same page
    assert q == R + 4_000_256
    s = a.memory_stats()
    assert s["reserved_bytes.all.current"] == 20 * MIB
    assert s["segment.all.current"] == 0  # expandable memory is not counted as segments
    assert s["inactive_split.all.current"] == 0  # nor as inactive_split
    seg = a.snapshot(record=False)["segments"]
    assert len(seg) == 1 and seg[0]["is_expandable"] and seg[0]["total_size"] == 20 * MIB
    check(a)


def test_expandable_growth_starts_at_the_free_tail():
    a = exp_alloc()
    for _ in range(4):
        a.malloc(4_000_000)
    used = 4 * 4_000_256
    i = a.trace_len()
    p = a.malloc(8 * MIB)  # the 4.97 MB free tail is too small: map the next page after it
    assert actions(a, i) == [("segment_map", R + 20 * MIB, 20 * MIB), ("alloc", R + used, 8 * MIB)]
    assert p == R + used  # at the free tail, below the new map's address
    assert a.reserved == 40 * MIB
    check(a)


def test_expandable_small_pool_pages_are_2_mib():
    provide = fixed(R, R - 4 * GIB)
    a = CachingAllocator(GIB, EXP, address_provider=provide)
    p = a.malloc(1000)
    assert p == R and actions(a)[0] == ("segment_map", R, 2 * MIB)
    assert provide.calls[0] == ("expandable", 1152 * MIB, 0)
    big = a.malloc(3 * MIB)  # large pool: its own reservation
    assert big == R - 4 * GIB


def test_expandable_best_fit_prefers_blocks_that_cannot_grow():
    a = exp_alloc()
    p1 = a.malloc(6 * MIB)
    a.malloc(9 * MIB)
    a.free(p1)  # 6 MiB free at R (cannot grow); 5 MiB free at R + 15 MiB before unmapped space
    assert a.malloc(5 * MIB) == R  # the "expandable size" walk
    check(a)


def test_unmapping_whole_free_pages_and_releasing_the_reservation():
    provide = fixed(R, R - 4 * GIB)
    a = CachingAllocator(GIB, EXP, address_provider=provide)
    p = [a.malloc(4_000_000) for _ in range(6)]  # 24 MB: two pages
    assert a.reserved == 40 * MIB
    for q in p[1:]:
        a.free(q)
    i = a.trace_len()
    assert a.empty_cache() == 20 * MIB  # only the second page is whole and free
    assert actions(a, i) == [("segment_unmap", R + 20 * MIB, 20 * MIB)]
    assert blocks(a) == [
        (R, 4_000_256, "active_allocated"),
        (R + 4_000_256, 20 * MIB - 4_000_256, "inactive"),
    ]
    assert a.memory_stats()["num_device_free"] == 1
    a.free(p[0])
    i = a.trace_len()
    assert a.empty_cache() == 20 * MIB
    assert actions(a, i) == [("segment_unmap", R, 20 * MIB)]  # then the reservation goes, silently
    assert a.snapshot(record=False)["segments"] == [] and a.reserved == 0
    check(a)
    # the reservation is gone (not kept unmapped): the next malloc reserves address space anew
    assert a.malloc(4_000_000) == R - 4 * GIB
    assert [kind for kind, _, _ in provide.calls] == ["expandable", "expandable"]


def test_unmapped_hole_gives_two_segment_entries_and_is_refilled_first():
    a = exp_alloc()
    p = [a.malloc(20 * MIB) for _ in range(3)]  # one page each
    a.free(p[1])
    a.empty_cache()
    segs = a.snapshot(record=False)["segments"]
    assert [(s["address"], s["total_size"]) for s in segs] == [
        (R, 20 * MIB),
        (R + 40 * MIB, 20 * MIB),
    ]
    assert all(s["is_expandable"] for s in segs)
    i = a.trace_len()
    q = a.malloc(10 * MIB)  # lowest address that fits: the hole
    assert q == R + 20 * MIB
    assert actions(a, i)[0] == ("segment_map", R + 20 * MIB, 20 * MIB)
    assert len(a.snapshot(record=False)["segments"]) == 1
    check(a)


def test_expandable_map_failure_goes_through_release_and_oom():
    a = exp_alloc(50 * MIB)
    a.malloc(20 * MIB)
    a.malloc(20 * MIB)
    with pytest.raises(OutOfMemory):
        a.malloc(20 * MIB)  # a third page does not fit in 50 MiB
    assert a.reserved == 40 * MIB
    check(a)


# ---------------------------------------------------------------------------- API, state, copies


def test_trace_since_and_snapshot_entry():
    a = CachingAllocator(GIB, address_provider=fixed(B))
    i = a.trace_len()
    a.malloc(30 * MIB)
    assert [x[0] for x in a.trace_since(i)] == ["segment_alloc", "alloc"]
    snap = a.snapshot()
    assert [e["action"] for e in snap["device_traces"][0]] == ["segment_alloc", "alloc"]
    snap = a.snapshot()  # the previous call's marker shows up now, with the active bytes
    last = snap["device_traces"][0][-1]
    assert (last["action"], last["addr"], last["size"]) == ("snapshot", 0, 30 * MIB)
    times = [e["time_us"] for e in snap["device_traces"][0]]
    assert times == sorted(times)
    with pytest.raises(ValueError, match="not in the ring"):
        a.trace_since(a.trace_len() + 1)


def test_bounded_trace_ring():
    a = CachingAllocator(GIB, trace_max_entries=3)
    for _ in range(5):
        a.free(a.malloc(1000))
    assert a.trace_len() == 16 and len(a.snapshot(record=False)["device_traces"][0]) == 3
    with pytest.raises(ValueError, match="not in the ring"):
        a.trace_since(0)


def test_snapshot_format_and_settings():
    a = CachingAllocator(GIB, "expandable_segments:True,max_split_size_mb:128", device=2)
    a.malloc(3 * MIB)
    snap = a.snapshot(record=False)
    assert set(snap) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    assert len(snap["device_traces"]) == 3 and snap["device_traces"][0] == []
    seg = snap["segments"][0]
    assert set(seg) == {
        "device", "address", "total_size", "allocated_size", "active_size", "requested_size",
        "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks",
    }  # fmt: skip
    assert seg["device"] == 2 and seg["segment_pool_id"] == (0, 0)
    st = snap["allocator_settings"]
    assert st["max_split_size"] == 128 * MIB and st["expandable_segments"] is True
    assert AllocatorConfig.from_settings(st).expandable_segments


def test_memory_stats_keys_are_torchs():
    s = CachingAllocator(GIB).memory_stats()
    arrays = ("allocation", "segment", "active", "inactive_split", "allocated_bytes")
    arrays += ("reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
    expected = {
        f"{a}.{p}.{f}"
        for a in arrays
        for p in ("all", "small_pool", "large_pool")
        for f in ("current", "peak", "allocated", "freed")
    }
    expected |= {f"{a}.{f}" for a in ("oversize_allocations", "oversize_segments")
                 for f in ("current", "peak", "allocated", "freed")}  # fmt: skip
    expected |= {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                 "num_device_free", "max_split_size", "num_oom_rejections"}  # fmt: skip
    assert set(s) == expected and list(s) == sorted(s)
    assert s["max_split_size"] == -1


def test_peak_and_accumulated_counters():
    a = CachingAllocator(GIB)
    p = a.malloc(30 * MIB)
    a.free(p)
    s = a.memory_stats()
    assert s["allocated_bytes.all.peak"] == 30 * MIB and s["allocated_bytes.all.current"] == 0
    assert s["allocated_bytes.all.allocated"] == s["allocated_bytes.all.freed"] == 30 * MIB
    a.reset_peak_stats()
    assert a.memory_stats()["allocated_bytes.all.peak"] == 0
    a.reset_accumulated_stats()
    s = a.memory_stats()
    assert s["allocated_bytes.all.allocated"] == 0 and s["num_device_alloc"] == 0
    assert s["reserved_bytes.all.current"] == 30 * MIB


def test_bad_input_is_refused_clearly():
    a = CachingAllocator(GIB)
    with pytest.raises(ValueError, match="not the address of an allocated block"):
        a.free(12345)
    with pytest.raises(ValueError, match="size must be a non-negative int"):
        a.malloc(-1)
    with pytest.raises(TypeError, match="size must be an int, got float"):
        a.malloc(1.5)
    with pytest.raises(TypeError, match="size must be an int, got True"):
        a.malloc(True)
    with pytest.raises(ValueError, match="not the address"):
        a.record_stream(512, 3)
    with pytest.raises(ValueError, match="capacity"):
        CachingAllocator(-5)
    with pytest.raises(ValueError, match="cudaMallocAsync"):
        CachingAllocator(GIB, "backend:cudaMallocAsync")
    with pytest.raises(ValueError, match="Unrecognized key"):
        CachingAllocator(GIB, "expandable:True")
    with pytest.raises(ValueError, match="address_provider returned"):
        CachingAllocator(GIB, address_provider=lambda k, s, t: 1001).malloc(5)
    assert a.malloc(0) == 0 and a.trace_len() == 0  # torch's nullptr, nothing recorded
    a.free(0)
    seg = {
        "address": B,
        "total_size": 2 * MIB,
        "stream": 0,
        "segment_type": "small",
        "segment_pool_id": (1, 2),
        "blocks": [{"size": 2 * MIB, "state": "inactive"}],
    }
    with pytest.raises(ValueError, match="bad segment_pool_id"):
        CachingAllocator.from_segments([{**seg, "segment_pool_id": "pool"}], GIB)
    # a private pool's segment goes into that pool (one reference: its MemPool or graph alive)
    loaded = CachingAllocator.from_segments([seg], GIB)
    assert loaded.pool_ids == [(1, 2)] and loaded.pool_use_count((1, 2)) == 1
    assert [s["segment_pool_id"] for s in loaded.snapshot()["segments"]] == [(1, 2)]
    assert loaded.empty_cache() == 0  # held: not released


def test_address_provider_called_only_for_real_segments():
    calls = fixed(B)
    a = CachingAllocator(30 * MIB, address_provider=calls)
    a.malloc(20 * MIB)
    with pytest.raises(OutOfMemory):
        a.malloc(20 * MIB)
    assert calls.calls == [("segment", 20 * MIB, 0)]


def _workload(a: CachingAllocator, rng: random.Random, n: int, live: list[int]) -> None:
    for _ in range(n):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
            continue
        size = rng.choice([rng.randint(1, 4000), rng.randint(1, 3 * MIB), rng.randint(1, 40 * MIB)])
        with contextlib.suppress(OutOfMemory):
            live.append(a.malloc(size, rng.choice([0, 0, 9])))


@pytest.mark.parametrize("conf", ["", EXP, "max_split_size_mb:24"])
def test_from_segments_continues_exactly(conf):
    provide = DescendingAddresses()
    a = CachingAllocator(512 * MIB, conf, address_provider=provide)
    rng = random.Random(3)
    live: list[int] = []
    _workload(a, rng, 400, live)
    p = a.malloc(700)
    a.record_stream(p, 11)
    a.free(p)
    snap = a.snapshot(record=False)
    b = CachingAllocator.from_segments(
        snap["segments"], 512 * MIB, conf, address_provider=DescendingAddresses(provide.cursor)
    )
    assert b.snapshot(record=False)["segments"] == snap["segments"]
    for k, v in walk_stats(snap["segments"]).items():
        assert b.memory_stats()[k] == v
    a.complete_events()
    b.complete_events()
    rng_a, rng_b = random.Random(4), random.Random(4)
    _workload(a, rng_a, 300, list(live))
    _workload(b, rng_b, 300, list(live))
    assert b.snapshot(record=False)["segments"] == a.snapshot(record=False)["segments"]
    check(b)


def test_deepcopy_is_independent():
    a = CachingAllocator(GIB, EXP)
    live: list[int] = []
    _workload(a, random.Random(5), 300, live)
    b = copy.deepcopy(a)
    assert b.snapshot(record=False) == a.snapshot(record=False)
    b.free(live[0])
    assert b.snapshot(record=False) != a.snapshot(record=False)
    a.free(live[0])
    assert b.snapshot(record=False) == a.snapshot(record=False)
    assert b.memory_stats() == a.memory_stats()


def test_expandable_blocks_are_skipped_when_expandable_is_off():
    # state recorded with expandable segments, continued with them off (a run-time toggle)
    a = exp_alloc()
    p = a.malloc(4_000_000)
    segs = a.snapshot(record=False)["segments"]
    b = CachingAllocator.from_segments(segs, GIB, "", address_provider=fixed(B))
    q = b.malloc(1_500_000)  # the free expandable tail would fit; a new segment is made instead
    assert q == B and b.n_segments == 1
    b.free(p)  # the expandable block is still freed and merged as usual
    assert b.empty_cache() == 20 * MIB  # its page is unmapped; the 20 MiB segment stays in use
    check(b)


def test_oversize_rule_applies_to_expandable_best_fit():
    a = CachingAllocator(
        GIB, "expandable_segments:True,max_split_size_mb:32", address_provider=fixed(R)
    )
    p = a.malloc(50 * MIB)  # three 20 MiB pages; 10 MiB free after it
    q = a.malloc(MIB + 512)  # from that free tail
    assert q == R + 50 * MIB
    a.free(p)  # a free 50 MiB block that cannot grow (oversize)
    i = a.trace_len()
    r = a.malloc(8 * MIB)
    # best fit is the growable tail, the expandable walk moves to the 50 MiB block, the oversize
    # rule refuses it, and find_expandable_block hands back the tail without mapping anything
    assert [x[0] for x in a.trace_since(i)] == ["alloc"]
    assert r == q + MIB + 512
    check(a)


@pytest.mark.parametrize(
    ("blocks_", "message"),
    [
        ([], "has no blocks"),
        ([{"size": 2 * MIB, "state": "busy"}], "unknown state 'busy'"),
        ([{"size": MIB, "state": "inactive"}], "add up to 1048576 bytes, total_size says"),
    ],
)
def test_from_segments_refuses_malformed_segments(blocks_, message):
    seg = {"address": B, "total_size": 2 * MIB, "stream": 0, "segment_type": "small",
           "blocks": blocks_}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        CachingAllocator.from_segments([seg], GIB)


def test_large_segment_size_sets_segment_and_page_size():
    a = CachingAllocator(GIB, "large_segment_size_mb:32", address_provider=fixed(B))
    a.malloc(4_000_000)
    assert actions(a)[0] == ("segment_alloc", B, 32 * MIB)
    e = CachingAllocator(GIB, "large_segment_size_mb:32,expandable_segments:True")
    e.malloc(4_000_000)
    assert e.trace_since(0)[0][:1] == ("segment_map",) and e.reserved == 32 * MIB


def test_max_non_split_rounding_widens_rule_2():
    conf = "max_split_size_mb:32,max_non_split_rounding_mb:64"
    a = CachingAllocator(GIB, conf, address_provider=fixed(B, B - 256 * MIB))
    a.free(a.malloc(100 * MIB))
    assert a.malloc(40 * MIB) == B  # 100 < 40 + 64: the cached block serves it, whole
    assert blocks(a)[0] == (B, 100 * MIB, "active_allocated")


def test_trace_blocks_off_records_only_segment_entries_and_ooms():
    """What replay's driver reads: the same segment entries as the full trace, nothing per
    block, counted by trace_len; kept through set_recording and a deep copy."""

    def work(a: CachingAllocator) -> None:
        x, y = a.malloc(100), a.malloc(3 << 20)
        a.free(x)
        a.free(y)
        a.empty_cache()
        with pytest.raises(OutOfMemory):
            a.malloc(2 << 30)

    full, lean = CachingAllocator(1 << 30), CachingAllocator(1 << 30, trace_blocks=False)
    work(full)
    work(lean)
    blocks = ("alloc", "free_requested", "free_completed")
    want = [e[:4] for e in full.trace_since(0) if e[0] not in blocks]
    got = [e[:4] for e in lean.trace_since(0)]
    assert got == want
    assert [e[0] for e in got] == ["segment_alloc", "segment_alloc", "segment_free",
                                   "segment_free", "oom"]  # fmt: skip
    assert lean.trace_len() == len(got)
    lean.set_recording(False)
    lean.set_recording(True)
    twin = copy.deepcopy(lean)
    for a in (lean, twin):
        a.free(a.malloc(100))
        assert [e[0] for e in a.trace_since(len(got))] == ["segment_alloc"]


def _blocks_at(a: CachingAllocator) -> dict[int, dict]:
    return {b["address"]: b for s in a.snapshot(record=False)["segments"] for b in s["blocks"]}


def test_frames_given_to_malloc_ride_on_the_block_and_its_trace_entries():
    site = [{"filename": "train.py", "line": 7, "name": "step"}]
    a = CachingAllocator(GIB)
    p = a.malloc(3 * MIB, frames=site)
    q = a.malloc(MIB)  # no call site: none recorded
    assert _blocks_at(a)[p]["frames"] is site and _blocks_at(a)[q]["frames"] == []
    a.record_stream(p, 1)
    a.free(p)  # pending on stream 1's event: still active, still its site
    pending = _blocks_at(a)[p]
    assert pending["state"] == "active_pending_free" and pending["frames"] is site
    a.complete_events(process=True)
    a.free(q)
    blocks = _blocks_at(a).values()
    assert all(b["state"] == "inactive" and b["frames"] == [] for b in blocks)
    assert check_invariants(a.snapshot(record=False)) == []
    trace = a.snapshot(record=False)["device_traces"][0]
    at_p = [(e["action"], e.get("frames")) for e in trace if e["addr"] == p]
    assert ("alloc", site) in at_p and ("free_requested", site) in at_p
    assert ("free_completed", site) in at_p
    assert all("frames" not in e for e in trace if e["addr"] == q or "segment" in e["action"])
    # a block reused by a malloc without a site does not keep the old one
    r = a.malloc(3 * MIB)
    assert r == p and _blocks_at(a)[p]["frames"] == []
    # a copy carries the sites of its live blocks (the same list: sites are shared)
    s = a.malloc(MIB, frames=site)
    assert _blocks_at(copy.deepcopy(a))[s]["frames"] is site
