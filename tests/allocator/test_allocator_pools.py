"""Private pools in the model, rule by rule, against figures worked out from torch's source.

Each test states the rule (the torch function in docs/allocator.md, Private pools) and
checks the model's segments, pool ids, use counts and released bytes against numbers computed
by hand: a small request takes a 2 MiB segment, a 3 MiB request a 20 MiB one, a 30 MiB request
a 30 MiB one (rounded to 2 MiB).
"""

from __future__ import annotations

import copy

import pytest

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.pool_workloads import GRAPH_POOL
from gpumemviz.allocator.replay import replay
from gpumemviz.allocator.workloads import WORKLOADS, rl_mempool_workload, run

MIB = 1 << 20
GIB = 1 << 30
P1, P2 = (0, 1), (0, 2)


def _pools(a: CachingAllocator) -> dict[int, tuple[int, int]]:
    return {s["address"]: s["segment_pool_id"] for s in a.snapshot(record=False)["segments"]}


def _pool_of(a: CachingAllocator, addr: int) -> tuple[int, int]:
    (seg,) = [
        s
        for s in a.snapshot(record=False)["segments"]
        if s["address"] <= addr < s["address"] + s["total_size"]
    ]
    return seg["segment_pool_id"]


def test_use_mem_pool_routes_allocations_to_the_pool_and_reuse_stays_inside():
    a = CachingAllocator(GIB)
    pid = a.create_pool()
    assert pid == P1 and a.pool_use_count(P1) == 1  # the MemPool holds one reference
    with a.use_mem_pool(P1):
        assert a.pool_use_count(P1) == 2
        x = a.malloc(1000)  # small pool of P1: a 2 MiB segment
        y = a.malloc(3 * MIB)  # large pool of P1: a 20 MiB segment
    assert a.pool_use_count(P1) == 1
    segs = a.snapshot(record=False)["segments"]
    assert sorted((s["segment_type"], s["total_size"], s["segment_pool_id"]) for s in segs) == [
        ("large", 20 * MIB, P1),
        ("small", 2 * MIB, P1),
    ]
    a.free(x)
    a.free(y)
    # a default-pool malloc does not see the pool's free blocks: two new segments
    z, w = a.malloc(1000), a.malloc(3 * MIB)
    assert a.reserved == 44 * MIB and _pools(a)[z] == (0, 0) and _pools(a)[w - 0] == (0, 0)
    # and the pool's own malloc reuses its cached blocks at the same addresses
    with a.use_mem_pool(P1):
        assert a.malloc(1000) == x and a.malloc(3 * MIB) == y
    assert a.reserved == 44 * MIB
    assert [s["segment_pool_id"] for s in a.pool_snapshot(P1)] == [P1, P1]
    assert a.pool_reserved() == {(0, 0): 22 * MIB, P1: 22 * MIB}


def test_stream_filter_and_lifo_nesting():
    a = CachingAllocator(GIB)
    a.begin_allocate_to_pool(GRAPH_POOL, streams=[1])  # a capture on stream 1
    x0, x1 = a.malloc(1000, 0), a.malloc(1000, 1)
    assert (_pools(a)[x0], _pools(a)[x1]) == ((0, 0), GRAPH_POOL)
    a.begin_allocate_to_pool(P2)  # nested, all streams: the newest routing wins
    y1 = a.malloc(1000, 1)
    assert _pools(a)[y1] == P2
    a.end_allocate_to_pool(P2)
    z1 = a.malloc(600, 1)  # back to the graph pool: its small segment has room
    assert z1 == x1 + 1024 and _pool_of(a, z1) == GRAPH_POOL
    with pytest.raises(ValueError, match="already recording to mempool_id"):
        a.begin_allocate_to_pool(GRAPH_POOL)
    a.end_allocate_to_pool(GRAPH_POOL)
    with pytest.raises(ValueError, match="not currently recording"):
        a.end_allocate_to_pool(GRAPH_POOL)
    assert a.pool_use_count(GRAPH_POOL) == 1 and a.pool_use_count(P2) == 1


def test_memory_returns_only_when_the_pool_is_freeable_and_a_release_runs():
    a = CachingAllocator(GIB)
    a.create_pool(P1)
    with a.use_mem_pool(P1):
        x = a.malloc(30 * MIB)
        y = a.malloc(1000)
    a.free(x)
    assert a.empty_cache() == 0  # held by its MemPool: empty_cache leaves it alone
    a.release_pool(P1)  # the MemPool deleted: freeable
    assert a.pool_use_count(P1) == 0
    assert a.empty_cache() == 30 * MIB  # the whole free segment; y's segment still holds y
    assert a.pool_ids == [P1]  # one segment left (torch's cudaMalloc_count 1): kept
    a.free(y)
    assert a.empty_cache() == 2 * MIB and a.pool_ids == []  # empty: forgotten
    with pytest.raises(ValueError, match="no private pool"):
        a.pool_use_count(P1)


def test_the_last_retry_releases_freeable_pools_but_not_while_routing():
    a = CachingAllocator(60 * MIB)
    a.create_pool(P1)
    with a.use_mem_pool(P1):
        a.free(a.malloc(40 * MIB))
    # default pool: 40 MiB cached in a pool that is still held -> cudaMalloc of 30 MiB fails
    with pytest.raises(OutOfMemory):
        a.malloc(30 * MIB)
    a.release_pool(P1)
    a.malloc(30 * MIB)  # the OOM path's release_cached_blocks frees the freeable pool first
    assert a.reserved == 30 * MIB and a.pool_ids == []
    # while allocations are routed to a pool, the last retry (release everything) is skipped
    b = CachingAllocator(60 * MIB)
    b.free(b.malloc(40 * MIB))  # 40 MiB cached in the default pool
    b.create_pool(P2)
    with b.use_mem_pool(P2), pytest.raises(OutOfMemory):
        b.malloc(30 * MIB)
    q = b.malloc(30 * MIB)  # outside the pool: the default pool's cached 40 MiB block
    assert b.reserved == 40 * MIB and _pool_of(b, q) == (0, 0)


def test_use_on_oom_pool_lends_a_free_block_to_a_default_malloc():
    for use_on_oom in (False, True):
        a = CachingAllocator(40 * MIB)
        a.create_pool(P1, use_on_oom=use_on_oom)
        with a.use_mem_pool(P1):
            a.free(a.malloc(30 * MIB))  # a free 30 MiB block cached in P1
        if not use_on_oom:
            with pytest.raises(OutOfMemory):
                a.malloc(20 * MIB)
            continue
        p = a.malloc(20 * MIB)  # cudaMalloc(20 MiB) fails; P1's block is taken instead
        seg = next(s for s in a.snapshot(record=False)["segments"] if s["address"] == p)
        assert seg["segment_pool_id"] == P1 and seg["total_size"] == 30 * MIB
        assert [b["size"] for b in seg["blocks"]] == [20 * MIB, 10 * MIB]  # split as usual
        assert a.reserved == 30 * MIB


def test_no_split_pool_hands_out_whole_blocks():
    a = CachingAllocator(GIB)
    a.create_pool(P1, no_split=True)
    with a.use_mem_pool(P1):
        x = a.malloc(1000)
    (seg,) = a.pool_snapshot(P1)
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [(2 * MIB, "active_allocated")]
    a.free(x)
    a.create_pool(P2)
    with a.use_mem_pool(P2):
        a.malloc(1000)
    (seg,) = a.pool_snapshot(P2)
    assert [b["size"] for b in seg["blocks"]] == [1024, 2 * MIB - 1024]


def test_frees_with_stream_uses_wait_until_routing_ends():
    a = CachingAllocator(GIB)
    x = a.malloc(1000)
    a.record_stream(x, 7)
    a.begin_allocate_to_pool(GRAPH_POOL, streams=[1])
    a.free(x)  # no event may be recorded during capture: deferred, still active
    states = [b["state"] for s in a.snapshot(record=False)["segments"] for b in s["blocks"]]
    assert "active_pending_free" in states
    assert a.complete_events() == 0  # no event exists yet
    a.end_allocate_to_pool(GRAPH_POOL)  # now it waits on an event of stream 7
    assert a.complete_events() == 1
    a.malloc(5000)  # process_events frees it
    assert a.active == 5120


def test_process_events_is_skipped_while_routing():
    a = CachingAllocator(GIB)
    x = a.malloc(1000)
    a.record_stream(x, 7)
    a.free(x)
    a.complete_events()
    a.begin_allocate_to_pool(P1, streams=[1])
    a.malloc(1000, 1)
    assert a.active == 1024 + 1024  # x still pending: process_events did not run
    a.end_allocate_to_pool(P1)
    a.malloc(1000)
    assert a.active == 2048


def test_expandable_segments_inside_a_pool():
    a = CachingAllocator(GIB, "expandable_segments:True")
    a.create_pool(P1)
    with a.use_mem_pool(P1):
        a.malloc(30 * MIB)
    a.malloc(30 * MIB)
    segs = a.snapshot(record=False)["segments"]
    assert sorted((s["segment_pool_id"], s["is_expandable"], s["total_size"]) for s in segs) == [
        ((0, 0), True, 40 * MIB),  # two 20 MiB pages each
        (P1, True, 40 * MIB),
    ]
    assert a.pool_reserved() == {(0, 0): 40 * MIB, P1: 40 * MIB}


def test_oom_message_counts_the_private_pools_cached_bytes():
    a = CachingAllocator(40 * MIB)
    a.create_pool(P1)
    with a.use_mem_pool(P1):
        a.free(a.malloc(1000))  # 2 MiB cached free in P1
    a.malloc(30 * MIB)
    with pytest.raises(OutOfMemory) as err:
        a.malloc(20 * MIB)
    e = err.value
    assert e.private_pools == 2 * MIB
    assert (
        "Of the allocated memory 32.00 MiB is allocated by PyTorch, with 2.00 MiB allocated "
        "in private pools (e.g., CUDA Graphs), and 0 bytes is reserved by PyTorch but "
        "unallocated." in str(e)
    )


def test_pools_survive_deepcopy_and_from_segments():
    a = CachingAllocator(GIB)
    a.create_pool(P1)
    with a.use_mem_pool(P1):
        x = a.malloc(1000)
    b = copy.deepcopy(a)
    b.free(x)
    b.release_pool(P1)
    assert b.empty_cache() == 2 * MIB and b.pool_ids == []
    assert a.pool_ids == [P1] and a.pool_use_count(P1) == 1 and a.reserved == 2 * MIB
    c = CachingAllocator.from_segments(a.snapshot()["segments"], GIB)
    assert c.pool_ids == [P1] and _pools(c) == _pools(a)
    c.free(x)
    with c.use_mem_pool(P1):
        assert c.malloc(1000) == x


def test_the_two_pool_workloads_run_and_replay():
    graph = WORKLOADS["cuda_graph"]
    a = CachingAllocator(graph.capacity, graph.config)
    o = run(graph, a)
    marks = {m: s for s, m in o.marks}
    before_second = int(o.reserved[marks["capture graph 2 (shares the pool)"] - 1])
    after_second = int(o.reserved[marks["graph 1 reset, outputs dropped, empty_cache"] - 1])
    assert after_second == before_second  # graph 2 reuses graph 1's freed blocks in the pool
    # graph 1 reset: graph 2 still holds the pool, so empty_cache gives none of it back
    assert o.completed and a.pool_ids == [GRAPH_POOL] and a.pool_use_count(GRAPH_POOL) == 1
    assert a.reserved == a.pool_reserved()[GRAPH_POOL] > 0
    (d,) = replay(a.snapshot()).devices.values()
    # every alloc in its pool at its address; the warm-up's default-pool segments are all gone
    # by the snapshot, so their pool is a guess (docs/allocator.md, Replay: private pools):
    # the final empty_cache releases the same ranges, in another order
    assert d.allocs == d.allocs_matched == d.allocs_matched_per_decision == 1080
    assert d.final_matched and d.segments_matched == d.segments_recorded
    rl = WORKLOADS["rl_mempools"]
    b = CachingAllocator(rl.capacity, rl.config)
    o = run(rl, b)
    assert o.completed
    assert b.pool_ids == [P1]  # KV pools deleted and released; the weights pool stays
    # reloading the weights reuses the pool's cached blocks: it holds after three rollouts
    # exactly what it held after the first
    one = CachingAllocator(rl.capacity, rl.config)
    run(rl_mempool_workload(steps=1), one)
    assert b.pool_reserved()[P1] == one.pool_reserved()[P1] >= sum(rl.params["weights"])
    r = replay(b.snapshot())
    (d,) = r.devices.values()
    assert d.exact and d.allocs == d.allocs_matched


@pytest.mark.parametrize("name", ["cuda_graph", "rl_mempools"])
def test_the_demo_source_runs_the_pool_workloads_to_the_end(name):
    from gpumemviz.live.sources.simulated import SimulatedSource

    src = SimulatedSource(name)
    while src.step(1000):
        pass
    sample = src.sample()
    w = WORKLOADS[name]
    a = CachingAllocator(w.capacity, w.config)
    run(w, a)
    assert sample.stats.reserved == a.reserved  # the panel's demo shows what `run` computes
    pools = {tuple(s["segment_pool_id"]) for s in src.export()["segments"]}
    assert pools == {p for p, v in a.pool_reserved().items() if v}
