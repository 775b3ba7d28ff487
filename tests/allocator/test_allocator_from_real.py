"""`CachingAllocator.from_segments` rebuilds the state of every real snapshot, then keeps going."""

from __future__ import annotations

import contextlib
import random

from conftest import has_private_pools
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.invariants import check_invariants
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.stats import walk_stats


def _segments(d):
    return d["segments"] if isinstance(d, dict) else d


def _layout(segs):
    return [
        (s["address"], s["total_size"], s["stream"], s.get("is_expandable", False),
         [(b["size"], b["state"]) for b in s["blocks"]])
        for s in segs
    ]  # fmt: skip


def test_from_segments_reproduces_real_states(recorded_dict):
    segs = _segments(recorded_dict)
    settings = recorded_dict.get("allocator_settings") if isinstance(recorded_dict, dict) else None
    conf = AllocatorConfig.from_settings(settings)
    for device in sorted({s.get("device", 0) for s in segs}):
        mine = [s for s in segs if s.get("device", 0) == device]
        reserved = sum(s["total_size"] for s in mine)
        total = max(80 << 30, 2 * reserved)
        a = CachingAllocator.from_segments(mine, reserved + (1 << 30), conf, device, total)
        snap = a.snapshot(record=False)
        assert _layout(snap["segments"]) == _layout(sorted(mine, key=lambda s: s["address"]))
        assert check_invariants(snap) == []
        if has_private_pools(mine):  # MemPool / CUDA-graph segments come back in their pools
            assert {s["address"]: tuple(s["segment_pool_id"]) for s in snap["segments"]} == {
                s["address"]: tuple(s["segment_pool_id"]) for s in mine
            }
            per_pool: dict[tuple[int, int], int] = {}
            for s in mine:
                pid = tuple(s["segment_pool_id"])
                per_pool[pid] = per_pool.get(pid, 0) + s["total_size"]
            assert {p: v for p, v in a.pool_reserved().items() if v} == per_pool
        stats = a.memory_stats()
        for k, v in walk_stats(mine).items():
            assert stats[k] == v, k
        assert a.reserved == reserved
        # the rebuilt model keeps working: free what was live, allocate, release
        rng = random.Random(device)
        live = [b["address"] for s in snap["segments"] for b in s["blocks"]
                if b["state"] == "active_allocated"]  # fmt: skip
        rng.shuffle(live)
        for p in live[: len(live) // 2]:
            a.free(p)
        for _ in range(50):
            with contextlib.suppress(OutOfMemory):
                a.malloc(rng.choice([700, 3 << 20, 50 << 20]), rng.choice([0, mine[0]["stream"]]))
        a.complete_events()
        a.empty_cache()
        snap = a.snapshot(record=False)
        assert check_invariants(snap) == []
        stats = a.memory_stats()
        for k, v in walk_stats(snap["segments"]).items():
            assert stats[k] == v, k
