"""Random programs against the model: after every step the state is sound (seeded hypothesis).

Checked after each of >= 10^5 operations: the invariants (docs/allocator.md, Invariants),
incremental stats equal to a walk of the blocks, no two adjacent free blocks in non-expandable
segments, allocated blocks never overlap, reserved memory never exceeds the capacity (or the
fraction cap).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumemviz.allocator.invariants import check_invariants
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.rules import MIB
from gpumemviz.allocator.stats import walk_stats

CONFIGS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:24",
    "max_split_size_mb:32,max_non_split_rounding_mb:40",
    "roundup_power2_divisions:[1:2,4:8,>:4]",
    "garbage_collection_threshold:0.7,per_process_memory_fraction:0.8",
    "large_segment_size_mb:32,expandable_segments:True",
    "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:2",
]
EXAMPLES = 40
OPS = 2500  # per example: 40 x 2500 = 100,000 operations in total
DONE = {"ops": 0}


# stats that only rise on a malloc and only fall on free paths: their peak is the largest value
# seen between operations, so a walk after every step gives the exact peak too
MONOTONE = ("allocation", "allocated_bytes", "active", "active_bytes", "requested_bytes")


def _check(a: CachingAllocator, step: int, peaks: dict[str, int]) -> dict[str, int]:
    snap = a.snapshot(include_traces=False, record=False)
    segs = snap["segments"]
    problems = check_invariants(snap)
    assert problems == [], (step, problems[:3])
    stats = a.memory_stats()
    for k, v in walk_stats(segs).items():
        assert stats[k] == v, (step, k, stats[k], v)
        if k.split(".")[0] in MONOTONE:
            peak = k.replace(".current", ".peak")
            peaks[peak] = max(peaks.get(peak, 0), v)
            assert stats[peak] == peaks[peak], (step, peak, stats[peak], peaks[peak])
    assert stats["reserved_bytes.all.current"] == a.reserved <= a.capacity
    fraction = a.config.per_process_memory_fraction  # the programs set it only in the config
    if fraction < 1.0:
        assert a.reserved <= int(fraction * a.device_total)
    end = 0  # segments come sorted by address; walk every block in address order
    for s in segs:
        assert s["address"] >= end, (step, "segments overlap")
        prev = None
        for b in s["blocks"]:
            assert b["address"] >= end, (step, "blocks overlap")
            end = b["address"] + b["size"]
            state = b["state"]
            if state == "inactive" and prev == "inactive" and not s["is_expandable"]:
                raise AssertionError((step, "two adjacent free blocks", hex(b["address"])))
            prev = state
    return stats


def _program(seed: int, conf: str) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([64, 192, 512]) * MIB
    a = CachingAllocator(capacity, conf)
    live: list[int] = []
    streams = [0, 0, 0, 0x10, 0x20][: rng.choice([3, 4, 5])]
    big = rng.choice([8, 40, 120]) * MIB
    peaks: dict[str, int] = {}
    n_alloc = n_free = 0
    for step in range(OPS):
        r = rng.random()
        if r < 0.52 or not live:
            kind = rng.random()
            if kind < 0.45:
                size = rng.randint(1, 16 * 1024)
            elif kind < 0.75:
                size = rng.randint(16 * 1024, 3 * MIB)
            elif kind < 0.97:
                size = rng.randint(3 * MIB, big)
            else:
                size = rng.choice([0, 512, MIB, 2 * MIB, 20 * MIB])
            try:
                p = a.malloc(size, rng.choice(streams))
            except OutOfMemory as e:
                assert e.alloc_size >= e.rounded_size or a.config.expandable_segments
            else:
                if p:
                    n_alloc += 1
                    live.append(p)
                    if rng.random() < 0.04:
                        a.record_stream(p, rng.choice([0x30, 0x40, 0x10]))
        elif r < 0.93:
            a.free(live.pop(rng.randrange(len(live))))
            n_free += 1
        elif r < 0.97:
            a.complete_events(rng.choice([None, 0x30, 0x40]), process=rng.random() < 0.3)
        elif r < 0.99:
            a.empty_cache()
        else:
            a.reset_peak_stats()
            peaks.clear()  # peak = current from here on
        stats = _check(a, step, peaks)
        assert stats["allocation.all.allocated"] == n_alloc
        assert stats["allocation.all.freed"] == n_free
        DONE["ops"] += 1


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**32 - 1), conf=st.sampled_from(CONFIGS))
def test_random_programs_keep_the_state_sound(seed, conf):
    _program(seed, conf)


def test_the_property_run_covered_1e5_operations():
    # runs after the property test in file order; on its own it has nothing to count
    if DONE["ops"] == 0:
        _program(7, CONFIGS[1])
        assert DONE["ops"] == OPS
    else:
        assert DONE["ops"] >= 100_000
