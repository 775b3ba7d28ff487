"""The recording's figures and checkpoints taken from the backward walk (`Trail`) are the
forward pass's own: compared entry by entry with a Recording built forwards, on every
recorded file and on model workloads; and a walk that a forward pass would not retrace falls
back to that pass (its error included).

See docs/allocator.md, Reconstructing the start.
"""

from __future__ import annotations

import itertools
import random

import pytest

from conftest import traced_devices
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay.layout import Layout, LayoutError
from gpumemviz.allocator.replay.reconstruct import reconstruct_layout
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.allocator.replay.steps import Rules, steps_of
from gpumemviz.allocator.replay.trail import Trail
from gpumemviz.allocator.workloads import inference_server, run, training_loop

GIB = 1 << 30


def _walked(d: dict, device: int, every: int = 128) -> tuple[Recording, Recording, bool]:
    """(the recording as `from_snapshot` builds it, the one built forwards, trail exact?)"""
    trace = d["device_traces"][device]
    rules = Rules.from_settings(d.get("allocator_settings"))
    final = Layout.from_segments([s for s in d["segments"] if s.get("device", 0) == device])
    steps = steps_of(trace)
    trail = Trail(len(steps), every)
    start = reconstruct_layout(final, steps, rules, trail)
    forward = Recording(start, steps, rules, device=device, every=every)
    return Recording.from_snapshot(d, device, every=every), forward, trail.exact


def _same(got: Recording, want: Recording) -> None:
    assert got.reserved.tolist() == want.reserved.tolist()
    assert got.allocated.tolist() == want.allocated.tolist()
    assert got.segments.tolist() == want.segments.tolist()
    assert got.final.key() == want.final.key()
    n = len(want)
    for i in sorted({-1, 0, n - 1, *range(0, n, max(1, n // 40))}):
        assert got.layout_at(i).key() == want.layout_at(i).key(), f"entry {i}"


def _model_snapshot(workload, conf: str = "") -> dict:
    a = CachingAllocator(64 * GIB, conf, trace_max_entries=3000)
    run(workload, a)
    return a.snapshot()


def test_every_recorded_trace_is_walked_exactly(recorded_dict):
    """Every file's walk is proven exact, and gives the forward pass's figures and layouts."""
    d = recorded_dict
    for dev in traced_devices(d):
        got, want, exact = _walked(d, dev)
        assert exact, f"device {dev}"
        _same(got, want)


@pytest.mark.parametrize(
    "conf", ["", "expandable_segments:True", "max_split_size_mb:64,roundup_power2_divisions:4"]
)
def test_model_workloads_are_walked_exactly(conf):
    """Traces cut mid-story (a 3000-entry ring) under three settings, segment entries and
    expandable maps and unmaps included."""
    for workload in (
        training_loop(iterations=6, capacity=64 * GIB),
        inference_server(paged=False, n_requests=16, max_new_tokens=64, capacity=64 * GIB),
    ):
        d = _model_snapshot(workload, conf)
        got, want, exact = _walked(d, 0, every=64)
        assert exact
        _same(got, want)


def _churn(conf: str, seed: int) -> dict:
    """Random mallocs and frees of small and large sizes with an empty_cache now and then
    (segment frees and unmaps), its first entries cut off by the ring."""
    rng = random.Random(seed)
    a = CachingAllocator(64 * GIB, conf, trace_max_entries=2500)
    live: list[int] = []
    for k in range(2500):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randrange(1, 1 << 20), rng.randrange(1 << 20, 300 << 20)])
            live.append(a.malloc(size))
        if k % 300 == 299:
            a.empty_cache()
    return a.snapshot()


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_churn_with_releases_is_walked_exactly(conf):
    d = _churn(conf, 7)
    actions = {e["action"] for e in d["device_traces"][0]}
    assert actions >= (
        {"segment_map", "segment_unmap"} if conf else {"segment_alloc", "segment_free"}
    )
    got, want, exact = _walked(d, 0, every=50)
    assert exact
    _same(got, want)


def test_without_requested_sizes_the_forward_pass_builds_it():
    """A file that does not record requested sizes (torch 2.0) is not the walk's layout
    forwards (an alloc sets them): the recording is the forward pass's."""
    a = CachingAllocator(64 * GIB)
    x = a.malloc(100)
    a.malloc(3 << 20)
    a.free(x)
    d = a.snapshot()
    for s in d["segments"]:
        for b in s["blocks"]:
            b.pop("requested_size", None)
    got, want, exact = _walked(d, 0)
    assert not exact
    _same(got, want)
    final = Layout.from_segments(d["segments"])
    assert got.final.key() != final.key()  # the alloc's requested size, forwards
    assert got.final.key(requested=False) == final.key(requested=False)


def test_a_block_the_split_rule_would_not_carve_is_refused_as_before():
    """An alloc whose final block is larger than the rounded request in a small segment: the
    walk cannot prove it, the forward pass carves 512 B, and the final layouts differ."""
    base = 0x7F0000000000
    d = {
        "segments": [
            {
                "device": 0,
                "address": base,
                "total_size": 2 << 20,
                "stream": 0,
                "segment_type": "small",
                "blocks": [
                    {
                        "address": base,
                        "size": 1024,
                        "requested_size": 100,
                        "state": "active_allocated",
                    },
                    {"address": base + 1024, "size": (2 << 20) - 1024, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [[{"action": "alloc", "addr": base, "size": 100, "stream": 0}]],
    }
    assert not _walked_exact(d)
    with pytest.raises(LayoutError, match="does not give the recorded final segments"):
        Recording.from_snapshot(d)


def _walked_exact(d: dict) -> bool:
    trail = Trail(len(d["device_traces"][0]), 128)
    rules = Rules(AllocatorConfig())
    reconstruct_layout(
        Layout.from_segments(d["segments"]), steps_of(d["device_traces"][0]), rules, trail
    )
    return trail.exact


def test_a_segment_entry_forwards_would_not_rebuild_is_refused_as_before():
    """A 2 MiB segment the file calls large: its segment_alloc, forwards, makes a small one."""
    base = 0x7F0000000000
    seg = {"device": 0, "address": base, "total_size": 2 << 20, "stream": 0,
           "segment_type": "large", "blocks": [{"size": 2 << 20, "state": "inactive"}]}  # fmt: skip
    d = {
        "segments": [seg],
        "device_traces": [[{"action": "segment_alloc", "addr": base, "size": 2 << 20}]],
    }
    assert not _walked_exact(d)
    with pytest.raises(LayoutError, match="does not give the recorded final segments"):
        Recording.from_snapshot(d)


@pytest.mark.parametrize("every", [1, 2, 3, 7])
def test_every_checkpoint_is_the_forward_layout(every):
    """The walk undoes a free_requested with the free_completed just after it in one go, but
    never across a checkpoint: each checkpoint, and the entries around it, is the layout the
    forward pass has there (narrow spacings put checkpoints between such pairs)."""
    d = _churn("", 3)
    trace = d["device_traces"][0]
    pairs = sum(
        1
        for a, b in itertools.pairwise(trace)
        if a["action"] == "free_requested" and b["action"] == "free_completed"
        and a["addr"] == b["addr"]
    )  # fmt: skip
    assert pairs > 100
    got, want, exact = _walked(d, 0, every=every)
    assert exact
    assert got.allocated.tolist() == want.allocated.tolist()
    assert got.segments.tolist() == want.segments.tolist()
    checkpoints = got.checkpoints
    marks = [at for at, _ in checkpoints]
    assert len(marks) > 20
    for at, lay in checkpoints:  # the layout before entry `at`
        assert lay.key() == want.layout_at(at - 1).key(), f"checkpoint at {at}"
    for i in sorted({j for at in marks for j in (at - 2, at - 1, at) if j >= -1}):
        assert got.layout_at(i).key() == want.layout_at(i).key(), f"entry {i}"


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_a_recording_without_checkpoints_makes_them_when_first_asked(conf):
    """`seekable=False` (a replay's, a report's): the walk keeps only the start, and each
    layout is made forwards when first asked, in any order, from two threads at once: the
    seekable recording's layouts, and the figures are the same."""
    import threading

    d = _model_snapshot(training_loop(iterations=6, capacity=64 * GIB), conf)
    want = Recording.from_snapshot(d, 0, every=16)
    got = Recording.from_snapshot(d, 0, every=16, seekable=False)
    assert got.allocated.tolist() == want.allocated.tolist()
    assert got.segments.tolist() == want.segments.tolist()
    n = len(want)
    assert n > 2000
    order = [n // 2, 5, n - 1, -1, n // 3, *random.Random(0).sample(range(n), 60)]
    errors: list[BaseException] = []

    def seek(points: list[int]) -> None:
        try:
            for i in points:
                assert got.layout_at(i).key() == want.layout_at(i).key(), f"entry {i}"
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=seek, args=(order[k::2],)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    made = [at for at, _ in got.checkpoints]  # every one made now, ascending, once each
    assert made == sorted(set(made)) and len(made) >= 3 and made[-1] > n - 4096
    for at, lay in got.checkpoints:
        assert lay.key() == want.layout_at(at - 1).key(), f"checkpoint at {at}"


def test_the_stacks_table_a_first_seek_builds_is_made_old_at_once():
    """The first `snapshot_at` builds each address's stacks (two lists per address), kept for
    good: left young, the next collections would scan it all (a 0.12 s pause in a later seek
    at 10^6 entries); it is made old at once."""
    import gc

    from gpumemviz.snapshot.gc_pause import PROMOTE_OVER

    rng = random.Random(3)
    a = CachingAllocator(1 << 40, trace_max_entries=200_000)
    live: list[int] = []
    for _ in range(90_000):
        if live and rng.random() < 0.4:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(a.malloc(rng.randrange(1, 64 << 20)))
    tl = Recording.from_snapshot(a.snapshot(), 0)
    addresses = len({s[1] for s in tl.steps if s[0] == "alloc"})
    assert addresses > PROMOTE_OVER // 3  # large enough to be made old
    gc.collect()
    tl.snapshot_at(len(tl) // 2)
    young_lists = sum(type(o) is list for g in (0, 1) for o in gc.get_objects(g))
    assert young_lists < addresses  # (the table alone holds two per address)
