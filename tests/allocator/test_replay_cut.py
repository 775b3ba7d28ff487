"""Replay of traces cut by the ring buffer with expandable segments: where each address
reservation starts is not in the snapshot, only in the trace."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.replay import replay
from gpumemviz.allocator.rules import MIB


def _cut(snap: dict, start: int) -> dict:
    return {**snap, "device_traces": [snap["device_traces"][0][start:]]}


def test_a_map_below_the_lowest_run_goes_where_the_trace_shows():
    """The low pages of a reservation were unmapped before the cut; the trace then maps there
    again. The reservation must start at or below that map, not at the lowest run."""
    a = CachingAllocator(1 << 30, "expandable_segments:True")
    x = a.malloc(30 * MIB)
    y = a.malloc(30 * MIB)
    a.free(x)
    a.empty_cache()  # unmaps the low page of x: the run left starts above the base
    cut = a.trace_len()
    a.malloc(30 * MIB)  # maps the base page again, below the run
    a.free(y)
    snap = a.snapshot(record=False)
    tail = snap["device_traces"][0][cut:]
    start_runs = [s["address"] for s in snap["segments"]]
    assert tail[0]["action"] == "segment_map" and tail[0]["addr"] < min(start_runs) + 30 * MIB
    dev = replay(_cut(snap, cut)).devices[0]
    assert dev.exact, dev.mismatches
    assert (dev.segments_recorded, dev.segments_matched) == (1, 1)


def test_the_first_malloc_whose_own_map_fell_off_the_ring():
    """The cut falls between a malloc's segment_map and its alloc. The map refilled a hole at
    the reservation's base, and with max_split_size the 40 MiB block it made is oversize for
    the 23 MiB request: searching the start state cannot find it, only mapping it can."""
    a = CachingAllocator(1 << 30, "max_split_size_mb:40,expandable_segments:True")
    x = a.malloc(40 * MIB)  # two pages at the base
    a.malloc(20 * MIB)  # one page above
    a.free(x)
    a.empty_cache()  # a 40 MiB hole at the base, below an allocated block
    a.malloc(23 * MIB)  # maps the hole again (two pages) and splits it
    snap = a.snapshot(record=False)
    trace = snap["device_traces"][0]
    first = len(trace) - 1
    assert [e["action"] for e in trace[-2:]] == ["segment_map", "alloc"]
    assert trace[-2]["size"] == 40 * MIB
    dev = replay(_cut(snap, first)).devices[0]
    assert dev.exact, dev.mismatches
    assert dev.segments_recorded == 0


def test_the_first_malloc_whose_new_segment_fell_off_the_ring():
    """The same without expandable segments: a 5 MB request gets a 20 MiB segment, oversize
    under max_split_size_mb:20, so only making that segment puts the block there."""
    a = CachingAllocator(1 << 30, "max_split_size_mb:20")
    a.malloc(5 * MIB)
    snap = a.snapshot(record=False)
    trace = snap["device_traces"][0]
    assert [(e["action"], e["size"]) for e in trace] == [
        ("segment_alloc", 20 * MIB),
        ("alloc", 5 * MIB),
    ]
    dev = replay(_cut(snap, 1)).devices[0]
    assert dev.exact, dev.mismatches


_CONFS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "roundup_power2_divisions:4",
    "max_split_size_mb:40,expandable_segments:True",
]


def oom_program(
    seed: int,
    capacities: Sequence[int] = (1 << 30, 2 << 30, 4 << 30),
    confs: Sequence[str] = _CONFS,
) -> dict:
    """1,500 random steps on two streams that keep running out of memory (the fuzz program
    that found these cases; test_replay.py runs it whole, with its own capacities and confs)."""
    rng = random.Random(seed)
    a = CachingAllocator(rng.choice(capacities), confs[seed % len(confs)])
    live: list[int] = []
    for _ in range(1500):
        r = rng.random()
        if r < 0.55 or not live:
            big = rng.random() < 0.5
            size = rng.randrange(1 << 20, 200 << 20) if big else rng.randrange(1, 1 << 20)
            try:
                p = a.malloc(size, rng.choice([0, 7]))
            except OutOfMemory:
                continue
            live.append(p)
            if rng.random() < 0.1:
                a.record_stream(p, rng.choice([0, 7, 11]))
        elif r < 0.93:
            a.free(live.pop(rng.randrange(len(live))))
        elif r < 0.98:
            a.complete_events(rng.choice([None, 7, 11]))
        else:
            a.empty_cache()
    return a.snapshot(record=False)


# seeds whose half trace replayed inexactly before the reservations were inferred: the
# reservation below the lowest run (21 .. 294), a reservation made by a malloc that ran out
# (51, 59), the first malloc's map cut off (79, 194); both expandable settings, 1-4 GiB
@pytest.mark.parametrize("seed", [21, 26, 29, 41, 46, 51, 59, 79, 106, 156, 194, 241, 289, 294])
def test_expandable_programs_cut_in_the_middle_replay_exactly(seed):
    snap = oom_program(seed)
    assert "expandable_segments:True" in snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"]
    trace = snap["device_traces"][0]
    dev = replay(_cut(snap, len(trace) // 2)).devices[0]
    assert dev.exact, dev.mismatches


# found by the same fuzzing afterwards, whole traces too: deferred frees completed just before
# a release could have finished before the malloc or been synchronised by its release, and
# only the new segments tell which (304); a reservation whose base the trace never shows ends
# where the next one above begins (399); deferred frees completed before a recorded OOM were
# synchronised by its release, which freed nothing (413, 1054); a release run before a malloc
# that was an empty_cache although the malloc's own release would free the same (413, 1585);
# a free whose free_completed follows its free_requested at once, just before a release, may
# still have waited on events until that release synchronised them (200)
@pytest.mark.parametrize(
    ("seed", "half"),
    [(304, False), (399, True), (413, False), (413, True), (200, False), (200, True)],
)
def test_release_stories_are_told_by_the_whole_run(seed, half):
    snap = oom_program(seed)
    trace = snap["device_traces"][0]
    dev = replay(_cut(snap, len(trace) // 2 if half else 0)).devices[0]
    assert dev.exact, dev.mismatches
