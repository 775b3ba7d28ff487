"""Equal stacks of a loaded trace share one list (`snapshot.stacks.share_stacks`): torch
writes a fresh frames list per entry, and kept as read they are most of a big snapshot's
memory and of every full GC pass."""

from __future__ import annotations

import gc
import pickle
import random

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.workloads import run, training_loop
from gpumemviz.io import load_snapshot
from gpumemviz.snapshot.stacks import CANDIDATES, share_stacks
from gpumemviz.snapshot.tables import Trace


def torch_shaped(entries: int) -> dict:
    """A model training run's snapshot, every trace entry a fresh list of 20-100 frames from
    40 call stacks over 100 shared frame dicts (as torch pickles them)."""
    a = CachingAllocator(64 << 30, trace_max_entries=entries)
    run(training_loop(iterations=4, capacity=64 << 30), a)
    d = a.snapshot()
    rng = random.Random(0)
    pool = [{"filename": f"m{k % 7}.py", "line": k, "name": f"f{k}"} for k in range(100)]
    stacks = [rng.choices(pool, k=rng.randrange(20, 101)) for _ in range(40)]
    for e in d["device_traces"][0]:
        e["frames"] = list(rng.choice(stacks))
    return d


def test_a_loaded_torch_shaped_trace_holds_each_stack_once():
    d = torch_shaped(3000)
    trace = d["device_traces"][0]
    distinct = {tuple(map(id, e["frames"])) for e in trace}
    assert len({id(e["frames"]) for e in trace}) == len(trace)  # fresh lists, as torch writes
    snap = load_snapshot(pickle.dumps(d))
    frames = snap.traces[0].frames()
    assert len({id(f) for f in frames}) == len(distinct) < len(trace) // 5
    assert frames == [e["frames"] for e in trace]  # the same stacks, in order
    assert snap.to_torch()["device_traces"][0] == trace  # the round trip is exact


def test_the_gc_no_longer_visits_a_list_per_entry():
    snap = load_snapshot(pickle.dumps(torch_shaped(3000)))
    lists = {id(f) for f in snap.traces[0].frames()}
    tracked = sum(1 for o in gc.get_objects() if id(o) in lists)
    assert tracked == len(lists) < 400


def test_equal_copies_share_and_different_stacks_stay_apart():
    f, g, h = {"line": 1}, {"line": 2}, {"line": 3}
    values = [[f, g, h], [f, dict(g), h], [f, h, h], None, "x", [], [], [f, g, h]]
    out = share_stacks(values)
    assert out == values
    assert out[0] is out[1] is out[7]  # equal by value: the first one met
    assert out[2] is values[2]
    assert out[3] is None and out[4] == "x" and out[5] is out[6]


def test_stacks_differing_only_inside_cost_a_bounded_number_of_comparisons():
    """Same length, first and last frame: at most CANDIDATES kept to compare with, so hostile
    input cannot make the sharing quadratic; the rest stay as they are."""
    compared = 0

    class Frame(dict):  # counts the comparisons that reach a frame
        def __eq__(self, other: object) -> bool:
            nonlocal compared
            compared += 1
            return dict.__eq__(self, other)

        __hash__ = None

    first, last = Frame(line=0), Frame(line=-1)
    values = [[first, Frame(line=i), last] for i in range(2000)]
    out = share_stacks(values)
    assert all(a is b for a, b in zip(out, values, strict=True))  # all different
    assert compared <= CANDIDATES * len(values)
    assert compared >= CANDIDATES * (len(values) - CANDIDATES)  # each met the full set


def test_mostly_shared_lists_are_left_alone():
    s = [{"line": 1}]
    values = [s] * 100 + [[{"line": 2}]]
    out = share_stacks(values)
    assert out == values and all(a is b for a, b in zip(out, values, strict=True))


def test_without_sharing_the_entries_own_lists_are_kept():
    """What replay asks of a torch dict the caller keeps: its lists, not copies or others."""
    trace = torch_shaped(500)["device_traces"][0]
    frames = Trace.from_entries(trace, share=False).frames()
    assert all(f is e["frames"] for f, e in zip(frames, trace, strict=True))
    shared = Trace.from_entries(trace).frames()
    assert len({id(f) for f in shared}) < len(trace) // 5
