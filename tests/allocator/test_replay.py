"""Exact replay of recorded traces through the allocator model (issue 4), and what-if runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from test_replay_cut import oom_program

from conftest import has_private_pools, read_real, real_file, standin_file
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.replay import ReplayError, replay
from gpumemviz.allocator.replay.driver import drive
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.allocator.rules import MIB

DATA = Path(__file__).resolve().parents[1] / "data"
HAND_BUILT = sorted(DATA.glob("replay_*.json"))


#: Each class of recording: the CI-only real file (../shared) and its model-made stand-in.
_FILES = {
    "expandable_oom": (
        "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle",
        "expandable_oom_3dev",
    ),
    "10streams": ("Maphsge4__select_n__snapshot_10streams.pickle", "streams10"),
}


def _real(cls: str) -> dict:
    """The real recording of a class (CI-only: the test skips without ../shared)."""
    return read_real(real_file(_FILES[cls][0]))


def _load(which: str) -> dict:
    """`standin:<class>` (always there) or `real:<class>` (CI-only)."""
    kind, cls = which.split(":")
    return _real(cls) if kind == "real" else read_real(standin_file(_FILES[cls][1]))


def _both(cls: str) -> list[str]:
    return [f"standin:{cls}", f"real:{cls}"]


def _private_pool_on_a_traced_device(d) -> bool:
    traced = {i for i, t in enumerate(d.get("device_traces") or []) if t}
    return has_private_pools([s for s in d["segments"] if s.get("device", 0) in traced])


def _hand(name: str) -> dict:
    return json.loads((DATA / f"replay_{name}.json").read_text())


def _traced(d) -> bool:
    return isinstance(d, dict) and any(len(t) > 0 for t in d.get("device_traces") or [])


# --------------------------------------------------------------------------- acceptance figures


def test_every_real_trace_replays_exactly(recorded_dict):
    """Every alloc at its recorded address (end to end and per decision), every new segment,
    every release burst in order, the final layout, and the recorded OOM."""
    if not _traced(recorded_dict):
        pytest.skip("no trace in this file")
    r = replay(recorded_dict)
    assert not r.what_if
    for dev, d in r.devices.items():
        trace = recorded_dict["device_traces"][dev]
        n_alloc = sum(e["action"] == "alloc" for e in trace)
        n_grow = sum(e["action"] in ("segment_alloc", "segment_map") for e in trace)
        assert d.allocs == n_alloc
        assert d.allocs_matched == n_alloc, d.mismatches
        assert d.allocs_matched_per_decision == n_alloc
        assert (d.segments_recorded, d.segments_matched) == (n_grow, n_grow), d.mismatches
        assert d.bursts_matched == d.bursts, d.mismatches
        assert d.final_matched, d.mismatches
        assert d.oom == d.recorded_oom
        assert d.mismatches == []
        assert len(d.reserved) == len(trace)
        np.testing.assert_array_equal(d.reserved, r.timelines[dev].reserved)
        np.testing.assert_array_equal(d.allocated, r.timelines[dev].allocated)
        np.testing.assert_array_equal(d.segments, r.timelines[dev].segments)
        if _private_pool_on_a_traced_device(recorded_dict):
            # each segment ends in the pool the file names (MemPool / CUDA-graph pools)
            want = {s["address"]: tuple(s["segment_pool_id"])
                    for s in recorded_dict["segments"] if s.get("device", 0) == dev}  # fmt: skip
            got = {s["address"]: tuple(s["segment_pool_id"]) for s in d.final_segments}
            assert got == want
            assert set(d.pool_final_reserved) == set(want.values())


def test_the_recorded_oom_is_reproduced_with_the_inferred_capacity():
    d = _real("expandable_oom")
    r = replay(d)
    dev1 = r.devices[1]
    oom_at = next(i for i, e in enumerate(d["device_traces"][1]) if e["action"] == "oom")
    assert dev1.capacity_known and dev1.recorded_oom == dev1.oom == oom_at
    # reserved just before the oom plus the device_free the oom entry carries
    assert dev1.capacity == r.timelines[1].reserved[oom_at - 1] + 95_682_560
    assert not r.devices[0].capacity_known and r.devices[0].capacity is None
    # the six unmaps before the failing map were the model's own release-and-retry
    assert dev1.bursts == dev1.bursts_matched == 1 and dev1.explicit_bursts == []
    assert "capacity unknown" in r.summary() and "capacity 78.51 GiB" in r.summary()
    assert (dev1.capacity_source, dev1.capacity_oom) == ("oom entry", oom_at)
    assert f"78.51 GiB (from the oom entry at event {oom_at})" in r.summary()
    assert (r.devices[0].capacity_source, r.devices[0].capacity_oom) == ("unknown", None)


def test_the_standins_oom_is_reproduced_with_the_inferred_capacity():
    """The same on the stand-in, its figures worked out from its trace alone."""
    d = read_real(standin_file("expandable_oom_3dev"))
    trace = d["device_traces"][1]
    oom_at = next(i for i, e in enumerate(trace) if e["action"] == "oom")

    def mapped(entries) -> int:
        return sum(e["size"] for e in entries if e["action"] == "segment_map") - sum(
            e["size"] for e in entries if e["action"] == "segment_unmap"
        )

    # the trace starts on an empty device: its maps less its unmaps are the final segments
    assert mapped(trace) == sum(s["total_size"] for s in d["segments"] if s["device"] == 1)
    capacity = mapped(trace[:oom_at]) + trace[oom_at]["device_free"]
    assert capacity == 3 << 30  # the card tools/make_standins.py gave device 1
    r = replay(d)
    dev1 = r.devices[1]
    assert dev1.capacity_known and dev1.recorded_oom == dev1.oom == oom_at
    # reserved just before the oom plus the device_free the oom entry carries
    assert r.timelines[1].reserved[oom_at - 1] == mapped(trace[:oom_at])
    assert dev1.capacity == capacity
    assert not r.devices[0].capacity_known and r.devices[0].capacity is None
    # the one unmap, right before the oom, was the model's own release-and-retry
    assert [i for i, e in enumerate(trace) if e["action"] == "segment_unmap"] == [oom_at - 1]
    assert dev1.bursts == dev1.bursts_matched == 1 and dev1.explicit_bursts == []
    assert "capacity unknown" in r.summary() and "capacity 3.00 GiB" in r.summary()
    assert (dev1.capacity_source, dev1.capacity_oom) == ("oom entry", oom_at)
    assert f"3.00 GiB (from the oom entry at event {oom_at})" in r.summary()
    assert (r.devices[0].capacity_source, r.devices[0].capacity_oom) == ("unknown", None)
    assert not d["device_traces"][3] and 3 not in r.devices  # the idle device has no trace


def test_the_result_says_which_source_gave_the_capacity():
    """oom entry, user, or unknown: a recorded per_process_memory_fraction is a share of a
    device total the snapshot does not hold, so it gives no capacity."""
    from gpumemviz.allocator.model import CachingAllocator
    from gpumemviz.allocator.oom import OutOfMemory

    a = CachingAllocator(
        1 << 30, "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8"
    )
    a.free(a.malloc(30 * MIB))
    snap = a.snapshot(record=False)
    dev = replay(snap).devices[0]
    assert (dev.capacity, dev.capacity_known, dev.capacity_source) == (None, False, "unknown")
    assert "per_process_memory_fraction 0.8 is a share of a device total not recorded" in (
        replay(snap).summary()
    )
    r = replay(snap, capacity={0: 2 << 30})
    assert (r.devices[0].capacity_source, r.recorded[0].capacity_source) == ("user", "unknown")
    assert "capacity 2.00 GiB (given)" in r.summary()

    b = CachingAllocator(100 * MIB)
    b.malloc(60 * MIB)
    with pytest.raises(OutOfMemory):
        b.malloc(60 * MIB)
    r = replay(b.snapshot(record=False), config="expandable_segments:True")
    assert r.what_if and r.devices[0].capacity == 100 * MIB
    assert (r.devices[0].capacity_source, r.devices[0].capacity_oom) == ("oom entry", 2)


def _scramble(addr: int) -> int:
    """A one-to-one renaming of 64-bit ids that does not keep their order."""
    return (addr * 0x9E3779B97F4A7C15 ^ 0x5DEECE66D) & ((1 << 64) - 1)


@pytest.mark.parametrize("which", [*_both("10streams"), *_both("expandable_oom")])
def test_the_model_does_not_read_recorded_addresses(which):
    """Renaming every allocation id (one-to-one, order scrambled) gives the same choices."""
    d = _load(which)
    for dev, trace in enumerate(d["device_traces"]):
        if not trace:
            continue
        tl = Recording.from_snapshot(d, dev)
        cfg = AllocatorConfig.from_settings(d.get("allocator_settings"))
        plain, choices = drive(tl, cfg, None)
        scrambled, renamed = drive(tl, cfg, None, rename=_scramble)
        assert renamed == choices
        assert scrambled.allocs_matched == plain.allocs_matched == plain.allocs


def _streams_erased(which: str) -> dict:
    """The 10-stream trace with every stream 0: the model no longer follows it."""
    d = copy.deepcopy(_load(which))
    for s in d["segments"]:
        s["stream"] = 0
    for e in d["device_traces"][0]:
        e["stream"] = 0
    return d


@pytest.mark.parametrize("which", _both("10streams"))
def test_a_wrong_rule_is_caught_by_the_scores(which):
    """The negative control: with streams erased the 10-stream trace no longer matches."""
    dev = replay(_streams_erased(which)).devices[0]
    assert dev.allocs_matched < 0.6 * dev.allocs
    assert dev.allocs_matched < dev.allocs_matched_per_decision < 0.9 * dev.allocs
    assert not dev.final_matched and dev.mismatches


@pytest.mark.parametrize("which", _both("10streams"))
def test_the_per_decision_pass_runs_when_read(which):
    """A trace the model does not follow end to end needs a second, re-synchronised pass for
    `allocs_matched_per_decision`; it runs when the figure is read (what-ifs never read it),
    and gives what the pass run at once gives."""
    d = _streams_erased(which)
    dev = replay(d).devices[0]
    assert callable(dev.per_decision)  # not run yet
    tl = Recording.from_snapshot(d, 0)
    cfg = AllocatorConfig.from_settings(d.get("allocator_settings"))
    at_once, _ = drive(tl, cfg, None, resync=True)
    assert dev.allocs_matched_per_decision == at_once.allocs_matched
    assert dev.per_decision == at_once.allocs_matched  # kept, not run again


# --------------------------------------------------------------------------- hand-built traces


@pytest.mark.parametrize("path", HAND_BUILT, ids=[p.stem for p in HAND_BUILT])
def test_hand_built_traces_replay_exactly(path):
    d = json.loads(path.read_text())
    r = replay(d)
    dev = r.devices[0]
    assert dev.exact, dev.mismatches
    assert dev.allocs == sum(e["action"] == "alloc" for e in d["device_traces"][0])


def test_equal_size_candidates_on_two_streams():
    d = _hand("two_streams")
    tl = Recording.from_snapshot(d)
    _, choices = drive(tl, AllocatorConfig(), None)
    base = 0x7F0000000000
    got = [c for c in choices if c is not None]
    # stream 1 skips the lower block of stream 2; then best fit takes the 16 MiB remainder
    assert got[:3] == [base + 32 * MIB, base, base + 32 * MIB + 4_000_256]
    assert got[3] == base - 32 * MIB  # the new segment, at the recorded driver address


def test_expandable_allocation_starts_at_the_free_tail_below_the_new_map():
    d = _hand("expandable_tail")
    r = replay(d)
    base = 0x7F0000000000
    trace = d["device_traces"][0]
    assert trace[0] == {**trace[0], "action": "segment_map", "addr": base + 20 * MIB}
    assert trace[1]["addr"] == base + 12 * MIB  # below the map
    assert r.devices[0].exact
    assert [s["total_size"] for s in r.devices[0].final_segments] == [40 * MIB, 4 * MIB]


def test_release_burst_order_across_both_pools_is_checked():
    d = _hand("release_burst")
    assert replay(d).devices[0].bursts_matched == 1
    shuffled = copy.deepcopy(d)
    trace = shuffled["device_traces"][0]
    trace[1:6] = [trace[4], *trace[1:4], trace[5]]  # a small segment first: not torch's order
    dev = replay(shuffled).devices[0]
    assert (dev.bursts, dev.bursts_matched) == (1, 0)
    assert dev.mismatches[0][1] == "burst"


# --------------------------------------------------------------------------- what-if


def test_what_if_without_expandable_segments_runs_out_sooner():
    d = _real("expandable_oom")
    r = replay(d, config="expandable_segments:False")
    assert r.what_if and r.recorded_config == "expandable_segments:True"
    dev1, rec1 = r.devices[1], r.recorded[1]
    assert dev1.what_if and dev1.capacity == rec1.capacity
    assert dev1.oom is not None and dev1.oom < rec1.recorded_oom
    assert len(dev1.reserved) == dev1.oom + 1  # the program would have stopped there
    fig = r.figures(1)
    assert len(fig["recorded_reserved"]) == len(d["device_traces"][1]) > len(fig["reserved"])
    assert fig["reserved"][-1] <= dev1.capacity
    assert dev1.peak_reserved <= dev1.capacity
    # devices that never ran out keep going to the end
    assert r.devices[0].oom is None and len(r.devices[0].reserved) == len(d["device_traces"][0])


def test_what_if_without_expandable_segments_on_the_standin_reserves_more_before_its_oom():
    """The stand-in's failing request (437.5 MiB with 280 MiB free on a 3 GiB card) fails
    under either setting, at the recorded oom entry; without expandable segments the cache
    held more before it. The program survived that OOM, so the what-if goes on to the end."""
    d = read_real(standin_file("expandable_oom_3dev"))
    r = replay(d, config="expandable_segments:False")
    assert r.what_if and r.recorded_config == "expandable_segments:True"
    dev1, rec1 = r.devices[1], r.recorded[1]
    assert dev1.what_if and dev1.capacity == rec1.capacity == 3 << 30
    assert dev1.oom is not None and dev1.oom == rec1.recorded_oom
    oom_at = next(i for i, e in enumerate(d["device_traces"][1]) if e["action"] == "oom")
    assert dev1.oom == oom_at
    assert dev1.peak_reserved > int(r.timelines[1].reserved[:oom_at].max())
    fig = r.figures(1)
    assert len(fig["recorded_reserved"]) == len(d["device_traces"][1]) == len(fig["reserved"])
    assert fig["reserved"][-1] <= dev1.capacity
    assert dev1.peak_reserved <= dev1.capacity
    # devices that never ran out keep going to the end
    for dev in (0, 2):
        assert r.devices[dev].oom is None
        assert len(r.devices[dev].reserved) == len(d["device_traces"][dev])


@pytest.mark.parametrize("which", _both("10streams"))
def test_what_if_invents_descending_addresses_and_keeps_address_free_figures(which):
    d = _load(which)
    r = replay(d, config="expandable_segments:True")
    dev = r.devices[0]
    tl = r.timelines[0]
    assert dev.what_if and dev.oom is None and dev.allocs == r.recorded[0].allocs
    assert len(dev.reserved) == len(tl)
    # allocated bytes depend on placement only through the remainder a block keeps unsplit
    # (torch splits a large block only when more than 1 MiB is left): under 1 MiB per live block
    trace = d["device_traces"][0]
    step = np.array([(e["action"] == "alloc") - (e["action"] == "free_requested") for e in trace])
    live_at_end = sum(b["state"] == "active_allocated" for s in d["segments"] for b in s["blocks"])
    live = live_at_end - step.sum() + np.cumsum(step)
    assert np.all(np.abs(dev.allocated - tl.allocated) <= live * MIB)
    if which.startswith("real"):
        # the real trace has no such remainder: same as recorded after every entry
        np.testing.assert_array_equal(dev.allocated, tl.allocated)
    assert dev.peak_reserved != int(tl.reserved.max())
    recorded = {s["address"] for s in r.snapshot_at(-1)["segments"]}
    new = [s["address"] for s in dev.final_segments if s["address"] not in recorded]
    assert new and min(new) > 1 << 59  # invented, far from every recorded address


#: A capacity below each 10-stream recording's peak: the real trace starts at 13 GiB and
#: peaks at 21 GiB; the stand-in starts on an empty device and peaks at 1.56 GiB.
_SMALL_CAPACITY = {"real:10streams": 18 << 30, "standin:10streams": 1 << 30}


@pytest.mark.parametrize("which", _both("10streams"))
def test_what_if_with_a_smaller_capacity_stops_at_the_first_oom(which):
    d = _load(which)
    tl = Recording.from_snapshot(d)
    cap = _SMALL_CAPACITY[which]
    assert tl.start.totals()[0] < cap < int(tl.reserved.max())
    r = replay(d, capacity=cap)
    dev = r.devices[0]
    assert r.what_if and dev.capacity_known and dev.capacity == cap
    assert dev.oom is not None and r.oom == dev.oom and len(dev.reserved) == dev.oom + 1
    assert int(dev.reserved.max()) <= cap
    assert d["device_traces"][0][dev.oom]["action"] == "alloc"


# --------------------------------------------------------------------------- time travel, errors


@pytest.mark.parametrize("which", _both("10streams"))
def test_snapshot_at_walks_the_recorded_history(which):
    d = _load(which)
    r = replay(d)
    tl = r.timelines[0]
    last = r.snapshot_at(len(tl) - 1)
    final = sorted((s["address"], s["total_size"]) for s in d["segments"])
    assert sorted((s["address"], s["total_size"]) for s in last["segments"]) == final
    assert len(last["device_traces"][0]) == len(tl)
    for i in (0, 1000, min(5000, len(tl) - 1), len(tl) // 2):
        snap = r.snapshot_at(i)
        reserved = sum(s["total_size"] for s in snap["segments"])
        allocated = sum(s["allocated_size"] for s in snap["segments"])
        assert (reserved, allocated) == (tl.reserved[i], tl.allocated[i])
    with pytest.raises(IndexError):
        r.snapshot_at(len(tl))
    with pytest.raises(ReplayError, match="device 3 has no trace"):
        r.snapshot_at(0, device=3)


def test_a_snapshot_without_trace_is_refused():
    with pytest.raises(ReplayError, match="no trace to replay"):
        replay({"segments": [], "device_traces": [[]]})


def test_a_segment_of_a_private_pool_replays_in_that_pool():
    """The recorded history keeps no pool: the segment's pool id says where its allocs went,
    and the replay routes them there (a pool the model would not reuse for the others)."""
    from gpumemviz.allocator.model import CachingAllocator

    a = CachingAllocator(1 << 30)
    x = a.malloc(3 * MIB)
    a.malloc(512)
    a.free(x)
    snap = a.snapshot(record=False)
    assert replay(snap).devices[0].exact  # the same snapshot with default pools replays
    seg = next(s for s in snap["segments"] if s["segment_type"] == "small")
    seg["segment_pool_id"] = [1, 2]  # as a JSON file gives it
    d = replay(snap).devices[0]
    assert d.exact
    assert {s["address"]: tuple(s["segment_pool_id"]) for s in d.final_segments} == {
        s["address"]: tuple(s["segment_pool_id"]) for s in snap["segments"]
    }
    assert d.pool_final_reserved == {(0, 0): 20 * MIB, (1, 2): 2 * MIB}
    seg["segment_pool_id"] = (0, 0)
    snap["segments"].append({**seg, "device": 1, "segment_pool_id": (3, 0)})
    assert replay(snap).devices[0].exact  # another device's private pool does not stop it


def test_an_inconsistent_trace_names_device_and_entry():
    d = _hand("two_streams")
    d["device_traces"][0][0]["addr"] += 4096  # an alloc in the middle of a block
    with pytest.raises(ReplayError, match=r"device 0: trace event \d+"):
        replay(d)


@pytest.mark.parametrize("which", _both("expandable_oom"))
def test_snapshot_at_equals_a_walk_from_the_start_in_any_order(which):
    """Checkpoints are copy-on-write: jumping around must never leak one state into another."""
    d = _load(which)  # maps and unmaps split and join segments
    for dev in (0, 1):
        tl = Recording.from_snapshot(d, dev, every=16)
        walk = Recording.from_snapshot(d, dev, every=10**9)  # no checkpoint but the start
        n = len(tl)
        order = [n - 1, 3, n // 2, 17, n // 2 + 1, 0, n - 1, 16, 15, n // 3, -1, n // 2]
        for i in order:
            got = tl.snapshot_at(i)["segments"]
            want = walk.layout_at(i).to_segments(dev, frames=walk.frames_after(i))
            assert got == want, (dev, i)
        want = tl.final.to_segments(dev, frames=tl.frames_after(n - 1))
        assert tl.snapshot_at(n - 1)["segments"] == want


@pytest.mark.parametrize("which", _both("10streams"))
def test_a_model_oom_in_the_recorded_run_is_scored_and_survived(which):
    """Recorded settings, too little memory: the miss is counted and the pass carries on."""
    d = _load(which)
    tl = Recording.from_snapshot(d)
    out, _ = drive(tl, AllocatorConfig(), _SMALL_CAPACITY[which], max_mismatches=10**6)
    assert out.oom is not None and out.oom < len(tl) - 1
    assert out.allocs == sum(e["action"] == "alloc" for e in d["device_traces"][0])
    assert out.allocs_matched < out.allocs
    assert any(kind == "oom" for _, kind, _ in out.mismatches)
    assert len(out.reserved) == len(tl)  # the recorded run is scored to the end


def test_a_burst_the_model_did_not_cause_is_an_empty_cache_even_with_a_known_capacity():
    """With a finite capacity the driver first lets the model try the alloc on a copy; here
    the model finds room without releasing, so the recorded burst was an empty_cache."""
    d = _hand("release_burst")
    tl = Recording.from_snapshot(d)
    out, _ = drive(tl, AllocatorConfig(), 1 << 40)
    assert out.exact and out.explicit_bursts == [1]
    assert (out.bursts, out.bursts_matched) == (1, 1)


@pytest.mark.parametrize("which", [*_both("10streams"), *_both("expandable_oom")])
def test_a_trace_cut_anywhere_still_replays_exactly(which):
    """Ring buffers drop the oldest entries: a trace may start mid-pair, mid-burst, anywhere."""
    d = _load(which)
    trace = d["device_traces"][0]
    pair = next(
        k
        for k in range(len(trace) - 1)
        if trace[k]["action"] == "free_requested" and trace[k + 1]["action"] == "free_completed"
    )
    burst = next(
        (k for k in range(len(trace)) if trace[k]["action"] in ("segment_free", "segment_map")),
        1,
    )
    for cut in (pair + 1, burst + 1, len(trace) // 3, len(trace) - 7):
        cut_d = {**d, "device_traces": [trace[cut:], *d["device_traces"][1:]]}
        dev = replay(cut_d).devices[0]
        assert dev.exact, (cut, dev.mismatches)
        assert dev.allocs == sum(e["action"] == "alloc" for e in trace[cut:])


def test_replay_reads_paths_and_snapshots_like_dicts():
    from gpumemviz.io import load_snapshot

    path = DATA / "replay_two_streams.json"
    from_dict = replay(_hand("two_streams")).devices[0]
    for src in (path, str(path), load_snapshot(path)):
        got = replay(src).devices[0]
        assert got.exact and (got.allocs, got.segments_matched) == (
            from_dict.allocs,
            from_dict.segments_matched,
        )
    with pytest.raises(ReplayError, match="no 'segments' key"):
        replay({"device_traces": []})


@pytest.mark.parametrize(
    ("iterations", "config", "capacity_gib", "bursts", "cut"),
    [
        (4, "max_split_size_mb:256", 14, 8, 3),  # oversize releases first (release_available)
        (5, "", 14, 2, 3),  # runs out at last: a recorded oom entry gives the capacity
        (5, "expandable_segments:True", 14, 1, 3),  # unmaps before the oom
        (4, "roundup_power2_divisions:[256:8,>:2]", 14, 1, 3),
        # the GC picks blocks by age, which a snapshot does not hold: only a whole trace
        (5, "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8", 18, 3, 0),
    ],
)
def test_traces_the_model_recorded_replay_exactly(iterations, config, capacity_gib, bursts, cut):
    """Settings no real trace covers: the model records a workload, replay must reproduce it,
    from a third of the way in where possible (so the start is reconstructed)."""
    from gpumemviz.allocator.model import CachingAllocator
    from gpumemviz.allocator.workloads import run, training_loop

    w = training_loop(iterations=iterations, capacity=capacity_gib << 30)
    a = CachingAllocator(w.capacity, config)
    run(w, a)
    snap = a.snapshot(record=False)
    trace = snap["device_traces"][0]
    start = len(trace) // cut if cut else 0
    dev = replay({**snap, "device_traces": [trace[start:]]}).devices[0]
    assert dev.exact, dev.mismatches
    assert dev.bursts >= bursts
    assert dev.recorded_oom == dev.oom


@pytest.mark.parametrize("seed", [3, 4])
def test_random_programs_with_record_stream_replay_exactly(seed):
    """Deferred frees (record_stream), three streams, empty_cache: what no real trace shows."""
    import random

    from gpumemviz.allocator.model import CachingAllocator

    rng = random.Random(seed)
    a = CachingAllocator(8 << 30)
    live: list[int] = []
    for _ in range(2500):
        r = rng.random()
        if r < 0.5 or not live:
            big = rng.random() < 0.5
            size = rng.randrange(1 << 20, 64 << 20) if big else rng.randrange(1, 1 << 20)
            p = a.malloc(size, rng.choice([0, 7, 9]))
            live.append(p)
            if rng.random() < 0.2:
                a.record_stream(p, rng.choice([0, 7, 9, 11]))
        elif r < 0.9:
            a.free(live.pop(rng.randrange(len(live))))
        elif r < 0.97:
            a.complete_events(rng.choice([None, 7, 11]))
        else:
            a.empty_cache()
    for p in live[:20]:  # leave some frees waiting at the end
        a.record_stream(p, 13)
        a.free(p)
    snap = a.snapshot(record=False)
    states = [b["state"] for s in snap["segments"] for b in s["blocks"]]
    assert "active_pending_free" in states
    trace = snap["device_traces"][0]
    for start in (0, len(trace) // 3):
        dev = replay({**snap, "device_traces": [trace[start:]]}).devices[0]
        assert dev.exact and dev.bursts > 0, (start, dev.mismatches)


_CONFS = ["", "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4"]


@pytest.mark.parametrize("seed", [1, 2, 7, 8, 12])
def test_programs_that_keep_running_out_of_memory_replay_exactly(seed):
    """A program that catches OOMs and goes on, with deferred frees and empty_cache: every
    release path in every order, with the capacity taken from the recorded oom entries. Cut
    in the middle too (expandable segments included: test_replay_cut.py)."""
    snap = oom_program(seed, capacities=(1 << 30, 2 << 30), confs=_CONFS)
    trace = snap["device_traces"][0]
    assert sum(e["action"] == "oom" for e in trace) > 0
    for start in (0, len(trace) // 2):
        dev = replay({**snap, "device_traces": [trace[start:]]}).devices[0]
        assert dev.exact, (start, dev.mismatches)


@pytest.mark.parametrize("which", _both("10streams"))
def test_a_file_in_torch_2_0_shape_replays_exactly(which):
    """torch 2.0 files: blocks without address or requested_size (a `history` instead),
    segments without is_expandable / segment_pool_id, trace entries without time_us."""
    d = copy.deepcopy(_load(which))
    for s in d["segments"]:
        for k in ("is_expandable", "segment_pool_id", "frames"):
            s.pop(k, None)
        for b in s["blocks"]:
            b["history"] = [{"addr": b.pop("address"), "real_size": b.pop("requested_size")}]
            b.pop("frames", None)
    for e in d["device_traces"][0]:
        e.pop("time_us", None)
        e.pop("frames", None)
    assert replay(d).devices[0].exact
