"""The start of a trace and its figures from the blocks' lives (`reconstruct_lives`, array passes
over the columns) are the backward walk's: the same start layout, allocated and reserved bytes
and segment count after every entry, on every recorded file and on model traces cut mid-story
under several settings; where a check fails it answers None, and the walk answers (with its
error where the trace does not fit).

See docs/internals.md, Reconstructing the start on columns.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from conftest import traced_devices
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay import replay
from gpumemviz.allocator.replay.layout import Layout, LayoutError
from gpumemviz.allocator.replay.lives import reconstruct_lives
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.allocator.replay.steps import Rules
from gpumemviz.allocator.workloads import inference_server, run, training_loop
from gpumemviz.snapshot import Snapshot, Trace

GIB = 1 << 30
DATA = Path(__file__).resolve().parents[1] / "data"


def _lives_and_walk(d: dict, device: int):
    """(what `reconstruct_lives` gives, the walk's recording) for one device of torch dict d."""
    snap = Snapshot.from_torch(d)
    final = Layout.from_segments([s for s in d["segments"] if s.get("device", 0) == device])
    lives = reconstruct_lives(final, snap.traces[device], Rules(snap.config))
    walked = Recording.from_snapshot(d, device)  # the entry dicts: always the walk
    return lives, walked


def _same(lives, walked: Recording) -> None:
    assert lives.start.key() == walked.start.key()
    reserved, allocated, _ = lives.start.totals()
    assert (allocated + np.cumsum(lives.alloc_delta)).tolist() == walked.allocated.tolist()
    assert (reserved + np.cumsum(lives.reserved_delta)).tolist() == walked.reserved.tolist()
    assert lives.nsegs.tolist() == walked.segments.tolist()


def _maps(d: dict, device: int) -> bool:
    actions = {e["action"] for e in d["device_traces"][device]}
    expandable = any(s.get("is_expandable") for s in d["segments"])
    return expandable or bool(actions & {"segment_map", "segment_unmap"})


def test_every_recorded_trace_gives_the_walks_start_and_figures(recorded_dict):
    """Every file without expandable segments is answered from its lives, as the walk does."""
    d = recorded_dict
    for dev in traced_devices(d):
        lives, walked = _lives_and_walk(d, dev)
        if _maps(d, dev):
            assert lives is None, f"device {dev}: expandable segments are the walk's"
            continue
        assert lives is not None, f"device {dev}"
        _same(lives, walked)


def _cut(conf: str, seed: int, steps: int = 4000) -> dict:
    """Random mallocs and frees of small, large and huge sizes with an empty_cache now and
    then, the first entries cut off by the ring (blocks alive before the trace, freed in it)."""
    rng = random.Random(seed)
    a = CachingAllocator(256 * GIB, conf, trace_max_entries=steps // 2)
    live: list[int] = []
    for k in range(steps):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice(
                [rng.randrange(1, 1 << 20), rng.randrange(1 << 20, 40 << 20), 1 << 20 | 7]
            )
            live.append(a.malloc(size))
        if k % 700 == 699:
            a.empty_cache()
    return a.snapshot()


@pytest.mark.parametrize(
    "conf",
    [
        "",
        "max_split_size_mb:20",
        "roundup_power2_divisions:4",
        "max_split_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:8]",
    ],
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_traces_cut_mid_story_give_the_walks_start_and_figures(conf, seed):
    """Oversize blocks (never split), roundup divisions, the tail rule, and segments freed and
    made again at one base."""
    d = _cut(conf, seed)
    starts_before = sum(
        1 for s in Recording.from_snapshot(d).start.segs.values() for b in s.blocks if b[2]
    )
    assert starts_before > 10  # the ring cut into live blocks
    lives, walked = _lives_and_walk(d, 0)
    assert lives is not None
    _same(lives, walked)


@pytest.mark.parametrize("name", ["replay_boundary_hint.json", "replay_tail_rule.json"])
def test_the_restored_sizes_follow_the_walks_rules(name):
    """The hand-made traces whose start needs the boundary hint and the tail rule."""
    d = json.loads((DATA / name).read_text())
    lives, walked = _lives_and_walk(d, 0)
    assert lives is not None
    _same(lives, walked)


def test_model_workloads_give_the_walks_start_and_figures():
    for workload in (
        training_loop(iterations=6, capacity=64 * GIB),
        inference_server(paged=False, n_requests=16, max_new_tokens=64, capacity=64 * GIB),
    ):
        a = CachingAllocator(64 * GIB, trace_max_entries=3000)
        run(workload, a)
        lives, walked = _lives_and_walk(a.snapshot(), 0)
        assert lives is not None
        _same(lives, walked)


def _two_blocks() -> dict:
    a = CachingAllocator(1 << 30)
    x = a.malloc(4 << 20)
    y = a.malloc(4 << 20)
    a.free(x)
    a.free(y)
    return a.snapshot()


@pytest.mark.parametrize(
    "break_it",
    [
        "alloc inside a live block",
        "free of a block never allocated",
        "alloc twice",
        "segment freed while a block lives",
    ],
)
def test_a_trace_that_does_not_fit_is_left_to_the_walk_and_its_error(break_it):
    """Each check a forward pass makes: the lives refuse the trace, and `replay` (the walk)
    says where it does not fit, as before."""
    d = _two_blocks()
    trace = d["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    if break_it == "alloc inside a live block":  # the second block moved into the first
        second = allocs[1]["addr"]
        for e in trace:
            if e.get("addr") == second:
                e["addr"] = allocs[0]["addr"] + 512
    elif break_it == "free of a block never allocated":
        trace.insert(3, dict(trace[3], addr=trace[3]["addr"] + (8 << 20)))
    elif break_it == "alloc twice":
        trace.insert(2, dict(allocs[0]))
    else:  # freed and made again while its blocks live
        seg = next(e for e in trace if e["action"] == "segment_alloc")
        at = trace.index(allocs[1]) + 1
        trace[at:at] = [dict(seg, action="segment_free"), dict(seg)]
    snap = Snapshot.from_torch(d)
    final = Layout.from_segments(d["segments"])
    lives = reconstruct_lives(final, snap.traces[0], Rules(snap.config))
    assert lives is None
    with pytest.raises((LayoutError, ValueError), match=r"trace event \d+"):
        replay(snap)


def test_a_replay_reads_the_lives_and_seeks_as_the_walk():
    """`replay` of a `Snapshot` (columns) takes the lives; its recording seeks to the walk's
    layouts, its checkpoints made when first asked."""
    d = _cut("", 5)
    r = replay(Snapshot.from_torch(d))
    tl, want = r.timelines[0], Recording.from_snapshot(d)
    assert tl.allocated.tolist() == want.allocated.tolist()
    assert tl.start.key() == want.start.key()
    n = len(want)
    for i in [n - 1, -1, n // 2, *random.Random(0).sample(range(n), 25)]:
        assert tl.layout_at(i).key() == want.layout_at(i).key(), f"entry {i}"
    assert r.devices[0].allocs_matched == r.devices[0].allocs


def test_an_empty_or_mapping_trace_is_the_walks():
    a = CachingAllocator(1 << 30, "expandable_segments:True")
    a.free(a.malloc(3 << 20))
    snap = Snapshot.from_torch(a.snapshot())
    final = Layout.from_segments(a.snapshot()["segments"])
    assert reconstruct_lives(final, snap.traces[0], Rules(snap.config)) is None
    assert reconstruct_lives(Layout(), Trace.empty(), Rules()) is None
