"""fragmentation(): figures against torch's own segsum arithmetic on every real file, the two
input paths against each other, hand-computed cases, and can_fit against the allocator model."""

from __future__ import annotations

import copy
import io
import json
import pickle
from contextlib import redirect_stdout
from dataclasses import fields

import numpy as np
import pytest
from torch.cuda import _memory_viz

from conftest import blk, random_expandable_model, read_real
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.rules import allocation_size, round_size
from gpumemviz.analysis.fragmentation import VERDICTS, FragmentationReport, fragmentation
from gpumemviz.snapshot import Snapshot, SnapshotError
from gpumemviz.snapshot.units import format_size

MIB = 1 << 20
BASE = 0x7F0000000000


def seg(blocks: list[dict], address: int = BASE, **kw) -> dict:
    """A torch-2.11-shaped segment whose sums are derived from its blocks."""
    total = sum(b["size"] for b in blocks)
    off = 0
    for b in blocks:
        b["address"] = address + off
        off += b["size"]
    alloc = [b for b in blocks if b["state"] == "active_allocated"]
    active = [b for b in blocks if b["state"] != "inactive"]
    d = {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": sum(b["size"] for b in alloc),
        "active_size": sum(b["size"] for b in active),
        "requested_size": sum(b["requested_size"] for b in active),
        "stream": 0,
        "segment_type": "small" if total == 2 * MIB else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    d.update(kw)
    return d


def snap(*segments: dict, settings: dict | None = None, traces: int = 1) -> dict:
    d = {"segments": list(segments), "device_traces": [[] for _ in range(traces)]}
    if settings is not None:
        d["allocator_settings"] = settings
    return d


# ---------------------------------------------------------------- real files


def _segsum_oracle(d) -> tuple[int, int, int]:
    """total_reserved, total_allocated, total_free as torch's segsum computes them."""
    reserved = allocated = free = 0
    for s in d["segments"]:
        reserved += s["total_size"]
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                _, req = _memory_viz._block_extra(b)
                allocated += req
                free += b["size"] - req
            else:
                free += b["size"]
    return reserved, allocated, free


def test_reconciles_with_segsum_on_real_files(recorded_dict):
    with redirect_stdout(io.StringIO()):
        _memory_viz.segsum(recorded_dict)  # torch's own check passes on the file
    r = fragmentation(recorded_dict)
    reserved, requested, total_free = _segsum_oracle(recorded_dict)
    assert r.reserved == reserved
    assert r.requested == requested
    assert r.free + r.pending_free + r.internal_waste == total_free
    assert r.violations == ()


def test_figures_match_a_plain_walk_of_real_files(recorded_dict):
    r = fragmentation(recorded_dict)
    segs = recorded_dict["segments"]
    for dev, f in r.devices.items():
        mine = [s for s in segs if s["device"] == dev]
        blocks = [b for s in mine for b in s["blocks"]]
        free = [b["size"] for b in blocks if b["state"] == "inactive"]
        assert f.reserved == sum(s["total_size"] for s in mine)
        assert f.allocated == sum(s["allocated_size"] for s in mine)
        assert f.active == sum(s["active_size"] for s in mine)
        assert f.free == sum(free)
        assert f.largest_free == max(free, default=0)
        assert f.segments == len(mine) and f.blocks == len(blocks)
        assert f.blocks_free == len(free)
        trapped = sum(
            b["size"]
            for s in mine
            if not s.get("is_expandable") and s["allocated_size"] > 0
            for b in s["blocks"]
            if b["state"] == "inactive"
        )
        assert f.free_trapped == trapped
        empty = sum(
            s["total_size"] for s in mine if not s.get("is_expandable") and s["allocated_size"] == 0
        )
        assert f.releasable >= empty
        if free:
            assert f.external_fragmentation == pytest.approx(1 - max(free) / sum(free))
            sq = sum(x * x for x in free) / sum(free) ** 2
            assert f.fragmentation_sq == pytest.approx(1 - sq)
    assert r.total.reserved == sum(s["total_size"] for s in segs)
    assert r.largest_free == max((f.largest_free for f in r.devices.values()), default=0)


def test_snapshot_path_gives_the_identical_report(recorded_dict):
    by_dict = fragmentation(recorded_dict)
    by_snap = fragmentation(Snapshot.from_torch(copy.deepcopy(recorded_dict)))
    assert by_dict.to_dict() == by_snap.to_dict()
    for f in fields(by_dict.per_segment):
        a, b = getattr(by_dict.per_segment, f.name), getattr(by_snap.per_segment, f.name)
        assert a.dtype == b.dtype and np.array_equal(a, b), f.name
    assert by_dict.total == by_snap.total


def test_path_and_bytes_go_through_io(recorded_path):
    by_path = fragmentation(recorded_path)
    by_bytes = fragmentation(recorded_path.read_bytes())
    by_dict = fragmentation(read_real(recorded_path))
    assert by_path.to_dict() == by_bytes.to_dict() == by_dict.to_dict()


def test_json_shape_on_real_files(recorded_dict):
    out = json.loads(json.dumps(fragmentation(recorded_dict).to_dict()))
    assert set(out) >= {"total", "devices"}
    for figs in [out["total"], *out["devices"].values()]:
        for key in ("reserved", "allocated", "free", "pending_free", "largest_free"):
            assert type(figs[key]) is int
        for key in ("segments", "blocks"):
            assert type(figs[key]) is int
        for key in ("external_fragmentation", "fragmentation_sq"):
            assert type(figs[key]) is float and 0.0 <= figs[key] <= 1.0


# ---------------------------------------------------------------- hand-computed


def test_the_minimal_two_segment_example():
    d = snap(
        seg([blk(4 * MIB, "active_allocated", 4_000_000), blk(16 * MIB)]),
        seg(
            [
                blk(512, "active_allocated", 100),
                blk(512, "active_pending_free", 500),
                blk(2 * MIB - 1024),
            ],
            address=BASE + 32 * MIB,
        ),
    )
    r = fragmentation(d)
    assert r.reserved == 22 * MIB
    assert r.allocated == 4 * MIB + 512
    assert r.active == 4 * MIB + 1024
    assert r.pending_free == 512
    assert r.requested == 4_000_100
    assert r.internal_waste == 4 * MIB + 512 - 4_000_100
    assert r.free == 18 * MIB - 1024
    assert r.free_trapped == r.free  # both segments still hold an allocated block
    assert r.releasable == 0
    assert r.largest_free == 16 * MIB
    assert r.external_fragmentation == pytest.approx(1 - 16 * MIB / (18 * MIB - 1024))
    free = [16 * MIB, 2 * MIB - 1024]
    assert r.fragmentation_sq == pytest.approx(1 - sum(x * x for x in free) / sum(free) ** 2)
    assert (r.blocks, r.blocks_allocated, r.blocks_pending_free, r.blocks_free) == (5, 2, 1, 2)
    assert r.segments == 2
    small = r.devices[0].largest_free_by_pool
    assert {(k.pool, v) for k, v in small.items()} == {("large", 16 * MIB), ("small", free[1])}


def test_releasable_counts_pending_free_and_keeps_private_pools_apart():
    d = snap(
        seg([blk(20 * MIB)]),  # fully free: released
        seg([blk(4 * MIB, "active_pending_free"), blk(16 * MIB)], address=BASE + 20 * MIB),
        seg([blk(4 * MIB, "active_allocated"), blk(16 * MIB)], address=BASE + 40 * MIB),
        seg([blk(2 * MIB)], address=BASE + 60 * MIB, segment_pool_id=(1, 3)),
    )
    r = fragmentation(d)
    assert r.releasable == 40 * MIB  # empty_cache syncs events first
    assert r.releasable_private == 2 * MIB
    assert r.free_trapped == 16 * MIB
    assert r.blocks_pending_free == 1
    assert r.per_segment.releasable.tolist() == [20 * MIB, 20 * MIB, 0, 2 * MIB]


def test_expandable_segments_release_whole_free_pages():
    # a 60 MiB mapped run of 20 MiB pages: free bytes [5, 55) MiB hold one whole page [20, 40)
    run = seg(
        [blk(5 * MIB, "active_allocated"), blk(50 * MIB), blk(5 * MIB, "active_allocated")],
        is_expandable=True,
    )
    # a small-pool run: 2 MiB pages, a free tail of 5 MiB from offset 3 MiB -> pages [4, 8)
    small = seg(
        [blk(3 * MIB, "active_allocated"), blk(5 * MIB)],
        address=BASE + 1024 * MIB,
        is_expandable=True,
        segment_type="small",
    )
    r = fragmentation(snap(run, small, settings={"expandable_segments": True}))
    assert r.per_segment.releasable.tolist() == [20 * MIB, 4 * MIB]
    assert r.releasable == 24 * MIB
    assert r.free_trapped == 0  # trapped is a non-expandable notion
    assert r.per_segment.stuck_free.tolist() == [30 * MIB, 1 * MIB]


def test_a_broken_segment_is_reported_not_raised():
    bad = seg([blk(4 * MIB, "active_allocated"), blk(16 * MIB)])
    bad["total_size"] = 22 * MIB
    r = fragmentation(snap(seg([blk(2 * MIB)], address=BASE + 64 * MIB), bad))
    (v,) = r.violations
    assert (v.index, v.total_size, v.blocks_sum) == (1, 22 * MIB, 20 * MIB)
    assert "segment 1" in v.message and "total_size" in v.message
    assert r.devices[0].violations == (v,)


def test_legacy_blocks_take_their_requested_size_from_history():
    b = {"size": 2 * MIB, "requested_size": 7, "state": "active_allocated"}
    b["history"] = [{"addr": BASE, "real_size": 1_500_000}]
    legacy = {
        "device": 0,
        "address": BASE,
        "total_size": 22 * MIB,
        "allocated_size": 2 * MIB,
        "active_size": 2 * MIB,
        "requested_size": 7,
        "stream": 0,
        "segment_type": "large",
        "blocks": [b, {"size": 20 * MIB, "requested_size": 0, "state": "inactive"}],
    }
    d = {"segments": [legacy], "device_traces": [[]]}
    r = fragmentation(d)
    assert r.requested == _memory_viz._block_extra(b)[1] == 1_500_000
    assert r.internal_waste == 2 * MIB - 1_500_000


def test_bare_segment_list_and_old_keys():
    bare = [
        {"address": 0, "total_size": 2 * MIB, "blocks": [{"size": 2 * MIB, "state": "inactive"}]}
    ]
    r = fragmentation(bare)
    assert (r.reserved, r.free, r.releasable, r.per_segment.is_small.tolist()) == (
        2 * MIB,
        2 * MIB,
        2 * MIB,
        [True],
    )


def test_multiple_devices_and_the_total():
    d = snap(
        seg([blk(4 * MIB, "active_allocated"), blk(16 * MIB)]),
        seg([blk(30 * MIB)], address=BASE, device=1),
        traces=3,
    )
    r = fragmentation(d)
    assert list(r.devices) == [0, 1]  # device 2 has neither a segment nor a trace entry
    assert r.devices[1].largest_free == r.largest_free == 30 * MIB
    assert r.total.free == 46 * MIB and r.total.device is None
    assert r.external_fragmentation == pytest.approx(1 - 30 / 46)
    with pytest.raises(ValueError, match=r"no device 2 in this snapshot \(devices: 0, 1\)"):
        r.device(2)
    assert json.loads(json.dumps(r.to_dict()))["devices"]["1"]["reserved"] == 30 * MIB


def test_worst_segments_rank_by_free_that_empty_cache_cannot_return():
    d = snap(
        seg([blk(2 * MIB, "active_allocated"), blk(18 * MIB)]),
        seg([blk(20 * MIB)], address=BASE + 20 * MIB),  # releasable: not stuck
        seg([blk(2 * MIB, "active_allocated"), blk(38 * MIB)], address=BASE + 40 * MIB),
    )
    worst = fragmentation(d).worst_segments
    assert [(w.index, w.stuck_free) for w in worst] == [(2, 38 * MIB), (0, 18 * MIB)]
    assert worst[0].external_fragmentation == 0.0


@pytest.mark.parametrize(
    ("segments", "message"),
    [
        ([{"address": 0, "total_size": 512}], "segment 0 (device ?, 0x0) has no blocks"),
        (
            [{"address": 0, "total_size": 512, "blocks": [{"state": "inactive"}]}],
            "segment 0 (device ?, 0x0): block 0 has no size",
        ),
        (
            [{"address": 0, "total_size": 512, "blocks": [{"size": 512, "state": "gone"}]}],
            "segment 0 (device ?, 0x0): block 0 has unknown state 'gone'",
        ),
        ([7], "segment 0 is an int, not a dict"),
    ],
)
def test_bad_input_says_what_and_where(segments, message):
    with pytest.raises(SnapshotError) as info:
        fragmentation({"segments": segments})
    assert str(info.value) == message
    with pytest.raises(SnapshotError) as same:  # one reader: Snapshot.from_torch says the same
        Snapshot.from_torch({"segments": segments})
    assert str(same.value) == message


_SEG1 = r"segment 1 \(device 0, 0x7f0000200000\)"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s.update(address=1 << 64),
            r"segment 1 \(device 0, 0x10000000000000000\): address is 18446744073709551616, "
            "not a 64-bit integer",
        ),
        (lambda s: s.update(total_size="big"), _SEG1 + ": total_size is 'big', not a 64-bit"),
        (
            lambda s: s["blocks"][0].update(requested_size=None),
            _SEG1 + ": block 0: requested_size is None, not a 64-bit integer",
        ),
        (lambda s: s["blocks"][1].update(size=1.5), _SEG1 + ": block 1: size is 1.5, not a 64"),
    ],
)
def test_values_that_are_not_64_bit_integers(change, message):
    bad = seg([blk(512, "active_allocated"), blk(512)], address=BASE + 2 * MIB)
    change(bad)
    with pytest.raises(SnapshotError, match="^" + message):
        fragmentation(snap(seg([blk(2 * MIB)]), bad))


def _nested(depth: int) -> dict:
    """A value nested `depth` dicts deep (deeper than the interpreter's recursion limit)."""
    top: dict = {}
    inner = top
    for _ in range(depth):
        inner["a"] = {}
        inner = inner["a"]
    return top


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # found by the differential fuzz run of the dict path (tools/fuzz.py, dict target)
        (
            lambda s: s["blocks"][0].update(state=_nested(100_000)),
            _SEG1 + r": block 0 has unknown state \{'a': \{",
        ),
        (
            lambda s: (
                [b.pop("frames") for b in s["blocks"]]
                and s["blocks"][0].update(requested_size="12")
            ),
            _SEG1 + ": block 0: requested_size is '12', not a 64-bit integer",
        ),
        (lambda s: s.update(segment_pool_id=7), _SEG1 + ": segment_pool_id 7 is not a pair"),
        (
            lambda s: s["blocks"].extend([blk(2**62), blk(2**62, "active_allocated")]),
            "segments: the blocks add up past 2\\^63 bytes",
        ),
    ],
)
def test_strange_values_get_a_one_line_error(change, message):
    bad = seg([blk(512, "active_allocated"), blk(512)], address=BASE + 2 * MIB)
    change(bad)
    with pytest.raises(SnapshotError, match="^" + message) as info:
        fragmentation(snap(seg([blk(2 * MIB)]), bad))
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


@pytest.mark.parametrize(
    "settings",
    [
        {"roundup_power2_divisions": {"1024": 3}},  # not a power of 2
        {"roundup_power2_divisions": {"x": 4}},  # not an interval
        {"roundup_power2_divisions": _nested(100_000)},
        {"PYTORCH_CUDA_ALLOC_CONF": "nonsense:1", "expandable_segments": True},
    ],
)
def test_malformed_settings_fall_back_to_what_parses(settings):
    d = snap(seg([blk(512, "active_allocated", 100), blk(2 * MIB - 512)]), settings=settings)
    r = fragmentation(d)
    assert r.allocator_settings is settings and r.reserved == 2 * MIB
    assert r.config.roundup_power2_divisions == (0,) * len(r.config.roundup_power2_divisions)
    assert r.expandable_mode == bool(settings.get("expandable_segments"))


def test_a_zero_size_block_at_a_segment_end_stays_in_its_segment():
    d = snap(
        seg([blk(2 * MIB, "active_allocated"), blk(0), blk(0, "active_pending_free")]),
        seg([blk(2 * MIB, "active_allocated")], address=BASE + 2 * MIB, device=1),
    )
    r = fragmentation(d)
    assert (r.device(0).blocks_free, r.device(0).blocks_pending_free) == (1, 1)
    assert (r.device(1).blocks_free, r.device(1).blocks_allocated) == (0, 1)


def test_the_second_segment_is_named():
    good = seg([blk(2 * MIB)])
    bad = seg([blk(512, "active_allocated"), blk(512)], address=BASE + 2 * MIB)
    del bad["blocks"][1]["size"]
    with pytest.raises(SnapshotError, match="^" + _SEG1 + ": block 1 has no size$"):
        fragmentation(snap(good, bad))


# ---------------------------------------------------------------- can_fit, by hand


def _cached_layout() -> dict:
    return snap(
        seg([blk(4 * MIB, "active_allocated"), blk(16 * MIB)], address=BASE + 40 * MIB),
        seg([blk(4 * MIB, "active_allocated"), blk(16 * MIB)], address=BASE),
        seg([blk(2 * MIB, "active_allocated"), blk(18 * MIB)], address=BASE + 80 * MIB),
        seg([blk(2 * MIB)], address=BASE + 120 * MIB, stream=7),
    )


def test_can_fit_best_fit_lowest_address_on_ties():
    r = fragmentation(_cached_layout())
    a = r.can_fit(10 * MIB)
    assert (a.verdict, a.fits, a.block_address, a.block_size) == (
        "cached",
        True,
        BASE + 4 * MIB,
        16 * MIB,
    )
    assert "16.00 MiB" in a.explanation and f"0x{BASE + 4 * MIB:x}" in a.explanation
    assert str(a) == a.explanation
    assert r.can_fit(17 * MIB).block_address == BASE + 82 * MIB  # the 18 MiB block


def test_can_fit_respects_streams_and_pools():
    r = fragmentation(_cached_layout())
    # the 2 MiB block belongs to stream 7's small pool: stream 0 small requests need a segment
    a = r.can_fit(1000, stream=0)
    assert (a.verdict, a.new_bytes, a.pool) == ("room_unknown", 2 * MIB, "small")
    assert r.can_fit(1000, stream=7).block_address == BASE + 120 * MIB
    assert "stream 7's small pool" in r.can_fit(1000, stream=7).explanation


def test_can_fit_new_segment_flush_and_oom():
    r = fragmentation(
        snap(
            seg([blk(4 * MIB, "active_allocated"), blk(16 * MIB)]),
            seg([blk(20 * MIB)], address=BASE + 20 * MIB),  # releasable
        )
    )
    need = allocation_size(round_size(30 * MIB))
    b = r.can_fit(30 * MIB, device_free=need)
    assert (b.verdict, b.fits, b.new_bytes) == ("new_segment", True, need)
    c = r.can_fit(30 * MIB, device_free=need - 20 * MIB)
    assert (c.verdict, c.fits, c.releasable) == ("flush_and_retry", True, 20 * MIB)
    assert "num_alloc_retries" in c.explanation
    d = r.can_fit(30 * MIB, device_free=need - 20 * MIB - 512)
    assert (d.verdict, d.fits) == ("out_of_memory", False)
    assert "empty_cache would not help" in d.explanation
    assert format_size(need - 20 * MIB - 512) in d.explanation
    u = r.can_fit("30MiB")
    assert (u.verdict, u.fits, u.device_free) == ("room_unknown", None, None)
    assert "unknown" in u.explanation
    assert {a.verdict for a in (b, c, d, u)} <= set(VERDICTS)


def test_can_fit_oversize_rules_refuse_the_best_fit_block():
    settings = {"max_split_size": 64 * MIB, "expandable_segments": False}
    r = fragmentation(snap(seg([blk(100 * MIB)]), settings=settings))
    small_req = r.can_fit(30 * MIB)  # an oversize block never serves a smaller request
    assert small_req.verdict == "room_unknown" and "max_split_size" in small_req.explanation
    assert r.can_fit(90 * MIB).verdict == "cached"  # waste 10 MiB < 20 MiB
    assert r.can_fit(70 * MIB).verdict == "room_unknown"  # waste 30 MiB: refused


def test_can_fit_rounds_with_the_recorded_divisions():
    settings = {"roundup_power2_divisions": {str(1 << k): 4 for k in range(16)}}
    r = fragmentation(
        snap(seg([blk(4 * MIB, "active_allocated"), blk(5 * MIB)]), settings=settings)
    )
    a = r.can_fit(5_000_000)
    assert a.rounded == round_size(5_000_000, [4] * 16) == 5 * MIB
    assert "rounded to 5.00 MiB" in a.explanation


def test_can_fit_maps_pages_after_the_free_tail():
    run = seg([blk(15 * MIB, "active_allocated"), blk(5 * MIB)], is_expandable=True)
    r = fragmentation(snap(run, settings={"expandable_segments": True}))
    a = r.can_fit(30 * MIB, device_free=40 * MIB)
    assert (a.verdict, a.new_bytes) == ("new_segment", 40 * MIB)  # 25 MiB more: two pages
    assert "free tail" in a.explanation


def test_can_fit_rejects_unknown_device_and_bad_sizes():
    r = fragmentation(_cached_layout())
    with pytest.raises(ValueError, match="no device 3"):
        r.can_fit(512, device=3)
    with pytest.raises(ValueError, match="not a size"):
        r.can_fit("lots")


# ---------------------------------------------------------------- can_fit against the model

_SIZES = [1, 600, 1 * MIB, 1 * MIB + 1, 3 * MIB, 9 * MIB, 15 * MIB, 40 * MIB, 130 * MIB, 2 << 30]


def _model_outcome(model: CachingAllocator, size: int, stream: int) -> tuple[str, int, int]:
    m = copy.deepcopy(model)
    before = m.reserved
    retries = m.memory_stats()["num_alloc_retries"]
    try:
        addr = m.malloc(size, stream)
    except OutOfMemory:
        return "out_of_memory", 0, 0
    if m.memory_stats()["num_alloc_retries"] > retries:
        return "flush_and_retry", addr, 0
    if m.reserved == before:
        return "cached", addr, 0
    return "new_segment", addr, m.reserved - before


def test_can_fit_agrees_with_the_allocator_model_on_real_files(recorded_dict):
    r = fragmentation(recorded_dict)
    settings = recorded_dict.get("allocator_settings") or {}
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF", "")
    checked = private = with_segments = 0
    for dev, figs in r.devices.items():
        segs = [s for s in recorded_dict["segments"] if s["device"] == dev]
        with_segments += bool(segs)
        if any(tuple(s.get("segment_pool_id", (0, 0))) != (0, 0) for s in segs):
            private += 1  # the model keeps no private pools (CUDA graphs, mempools)
            continue
        if not segs:
            continue
        streams = sorted({s["stream"] for s in segs})[:2]
        for room in (0, 64 * MIB, 1 << 40):
            # device_total sizes the expandable address reservations, which a snapshot does not
            # record; can_fit assumes room after the last mapped run, so give the model plenty
            model = CachingAllocator.from_segments(
                copy.deepcopy(segs), figs.reserved + room, conf, device=dev, device_total=1 << 44
            )
            for stream in streams:
                for size in [*_SIZES, figs.largest_free, figs.largest_free + 1]:
                    if size <= 0:
                        continue
                    ans = r.can_fit(size, stream=stream, device=dev, device_free=room)
                    verdict, addr, grew = _model_outcome(model, size, stream)
                    assert ans.verdict == verdict, (size, stream, room, ans.explanation)
                    if verdict == "cached":
                        assert ans.block_address == addr
                    if verdict == "new_segment" and "oversize segments" not in ans.explanation:
                        assert ans.new_bytes == grew
                    checked += 1
    assert checked or private == with_segments


def test_report_is_frozen_and_names_its_figures():
    r = fragmentation(_cached_layout())
    assert isinstance(r, FragmentationReport)
    with pytest.raises(AttributeError):
        r.total = None  # type: ignore[misc]
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        _ = r.nonsense
    assert pickle.loads(pickle.dumps(r.total)) == r.total


# ---------------------------------------------------------------- follow-ups: the flush and caps

EXP = {"expandable_segments": True, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def _exp_run(blocks: list[dict], address: int, stream: int = 0) -> dict:
    return seg(blocks, address=address, stream=stream, is_expandable=True)


def test_flush_unmaps_the_tail_it_would_grow():
    """After the flush the stream-7 tail keeps only its sub-page sliver: 140 MiB of pages are
    needed and 132 MiB are free, so the model raises; before the fix can_fit said it fits."""
    capacity = 512 * MIB
    tail = 39 * MIB + 790 * 1024
    segs = [
        _exp_run([blk(340 * MIB, "active_allocated")], BASE),
        _exp_run([blk(80 * MIB)], BASE + 400 * MIB),  # releasable: a whole free run
        _exp_run([blk(60 * MIB - tail, "active_allocated"), blk(tail)], BASE + (1 << 34), 7),
    ]
    d = snap(*segs, settings=EXP)
    r = fragmentation(d)
    room = capacity - r.reserved
    size = 150 * MIB + 670 * 1024
    ans = r.can_fit(size, stream=7, device_free=room)
    model = CachingAllocator.from_segments(
        copy.deepcopy(segs), capacity, EXP["PYTORCH_CUDA_ALLOC_CONF"], device_total=1 << 44
    )
    assert _model_outcome(model, size, 7)[0] == "out_of_memory"
    assert (ans.verdict, ans.fits) == ("out_of_memory", False)
    assert format_size(140 * MIB) + " of pages after the flush" in ans.explanation
    # with 8 MiB more on the device the flushed layout fits, through the retry
    more = r.can_fit(size, stream=7, device_free=room + 8 * MIB)
    model = CachingAllocator.from_segments(
        copy.deepcopy(segs),
        capacity + 8 * MIB,
        EXP["PYTORCH_CUDA_ALLOC_CONF"],
        device_total=1 << 44,
    )
    assert more.verdict == _model_outcome(model, size, 7)[0] == "flush_and_retry"


def _random_expandable_state(seed: int) -> dict:
    """A model driven by random mallocs, frees and cross-stream frees (pending), no flushes."""
    return random_expandable_model(seed, pending=0.3).snapshot(include_traces=False)


@pytest.mark.parametrize("seed", range(12))
def test_can_fit_agrees_with_the_model_on_random_expandable_states(seed):
    d = _random_expandable_state(seed)
    r = fragmentation(d)
    conf = d["allocator_settings"].get("PYTORCH_CUDA_ALLOC_CONF") or "expandable_segments:True"
    assert r.expandable_mode
    for room in (0, 30 * MIB, 90 * MIB):
        model = CachingAllocator.from_segments(
            copy.deepcopy(d["segments"]), r.reserved + room, conf, device_total=1 << 44
        )
        for stream in (0, 7):
            for size in (5 * MIB, 45 * MIB, 130 * MIB, r.releasable + room + 1):
                ans = r.can_fit(size, stream=stream, device_free=room)
                verdict, addr, grew = _model_outcome(model, size, stream)
                assert ans.verdict == verdict, (seed, size, stream, room, ans.explanation)
                if verdict == "cached":
                    assert ans.block_address == addr
                if verdict == "new_segment":
                    assert ans.new_bytes == grew


def _outcome_by_stats(model: CachingAllocator, size: int, *, gc: bool = True) -> str:
    """The model's path, read from its counters (reserved may end where it began): a retry, an
    OOM, new memory, or, with `gc`, new memory after device frees (the garbage collection;
    without a GC config the only frees before new memory are oversize segments going back)."""
    m = copy.deepcopy(model)
    before = m.memory_stats()
    try:
        m.malloc(size)
    except OutOfMemory:
        return "out_of_memory"
    after = m.memory_stats()
    if after["num_alloc_retries"] > before["num_alloc_retries"]:
        return "flush_and_retry"
    if gc and after["num_device_free"] > before["num_device_free"]:
        return "garbage_collect"
    return "new_segment" if after["num_device_alloc"] > before["num_device_alloc"] else "cached"


def _capped(conf: str, *segments: dict, room: int):
    d = snap(*segments, settings={"PYTORCH_CUDA_ALLOC_CONF": conf})
    r = fragmentation(d)
    total = r.reserved + room
    model = CachingAllocator.from_segments(
        copy.deepcopy(d["segments"]), total, conf, device_total=total
    )
    return r, model


def test_can_fit_honours_per_process_memory_fraction():
    # device total 500 MiB, cap 250 MiB; 100 MiB allocated, a 20 MiB segment releasable
    r, model = _capped(
        "per_process_memory_fraction:0.5",
        seg([blk(100 * MIB, "active_allocated")]),
        seg([blk(20 * MIB)], address=BASE + 200 * MIB),
        room=380 * MIB,
    )
    for size, want in (
        (120 * MIB, "new_segment"),  # 120 + 120 <= 250
        (140 * MIB, "flush_and_retry"),  # 120 + 140 > 250, 100 + 140 <= 250
        (160 * MIB, "out_of_memory"),  # 380 MiB free on the device, but over the cap
    ):
        ans = r.can_fit(size, device_free=380 * MIB)
        assert ans.verdict == _outcome_by_stats(model, size) == want, ans.explanation
        if want != "new_segment":
            assert "per_process_memory_fraction caps reserved at 250.00 MiB" in ans.explanation


def test_can_fit_garbage_collection_succeeds_without_a_retry():
    # cap 250 MiB, GC above 150 MiB: reserved 160 MiB, 60 MiB of whole unused large segments
    conf = "per_process_memory_fraction:0.5,garbage_collection_threshold:0.6"
    r, model = _capped(
        conf,
        seg([blk(100 * MIB, "active_allocated")]),
        seg([blk(20 * MIB)], address=BASE + 200 * MIB),
        seg([blk(40 * MIB)], address=BASE + 300 * MIB),
        room=340 * MIB,
    )
    gc = r.can_fit(100 * MIB, device_free=340 * MIB)  # needs >= 10 MiB back: GC frees >= 10
    assert gc.verdict == _outcome_by_stats(model, 100 * MIB) == "garbage_collect"
    assert gc.fits and "garbage collection" in gc.explanation and "10.00 MiB" in gc.explanation
    # 140 MiB fits only if the GC frees both (ages decide): a flush-and-retry at worst
    maybe = r.can_fit(140 * MIB, device_free=340 * MIB)
    assert maybe.verdict == "flush_and_retry" and "depending on the segments' ages" in str(maybe)
    assert _outcome_by_stats(model, 140 * MIB) in ("garbage_collect", "flush_and_retry")
    big = r.can_fit(160 * MIB, device_free=340 * MIB)  # 100 + 160 > 250 even after the flush
    assert big.verdict == _outcome_by_stats(model, 160 * MIB) == "out_of_memory"
    assert list(VERDICTS).index("garbage_collect") == 2


_CAPPED_CONFS = (
    "per_process_memory_fraction:0.6",
    "per_process_memory_fraction:0.5,garbage_collection_threshold:0.5",
    "per_process_memory_fraction:0.7,garbage_collection_threshold:0.3,expandable_segments:True",
)


@pytest.mark.parametrize("seed", range(24))
def test_can_fit_agrees_with_the_model_under_a_fraction_cap(seed):
    rng = np.random.default_rng(seed)
    conf = _CAPPED_CONFS[seed % len(_CAPPED_CONFS)]
    m = CachingAllocator(1 << 40, "", device_total=1 << 44)
    live: list[int] = []
    for _ in range(40):
        if live and rng.random() < 0.45:
            m.free(live.pop(int(rng.integers(len(live)))))
        else:
            size = int(rng.choice([600, 3 * MIB, 7 * MIB, 25 * MIB, 61 * MIB]))
            live.append(m.malloc(size + int(rng.integers(0, 1 << 19))))
    segs = m.snapshot(include_traces=False)["segments"]
    r = fragmentation({"segments": segs, "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf}})
    for room in (0, 50 * MIB, 200 * MIB, 600 * MIB):
        total = r.reserved + room
        model = CachingAllocator.from_segments(copy.deepcopy(segs), total, conf, device_total=total)
        for size in (5 * MIB, 45 * MIB, 130 * MIB, 300 * MIB):
            ans = r.can_fit(size, device_free=room)
            got = _outcome_by_stats(model, size)
            if got == "garbage_collect" and ans.verdict == "new_segment":
                assert "garbage collection frees" in ans.explanation  # ran, not needed
            elif got == "garbage_collect" and ans.verdict == "flush_and_retry":
                assert "depending on the segments' ages" in ans.explanation
            else:
                assert ans.verdict == got, (conf, room, size, ans.explanation)


def _check_oversize_state(seed: int) -> bool:
    """can_fit against the model in one random max_split_size state; whether any answer took
    the oversize path."""
    rng = np.random.default_rng(seed)
    conf = f"max_split_size_mb:{int(rng.choice([21, 40, 64]))}"
    m = CachingAllocator(1 << 40, conf, device_total=1 << 44)
    live: list[int] = []
    for _ in range(60):
        if live and rng.random() < 0.5:
            m.free(live.pop(int(rng.integers(len(live)))))
        else:
            size = int(rng.choice([3 * MIB, 25 * MIB, 45 * MIB, 70 * MIB, 130 * MIB]))
            live.append(m.malloc(size + int(rng.integers(0, 1 << 20))))
    segs = m.snapshot(include_traces=False)["segments"]
    r = fragmentation({"segments": segs, "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf}})
    oversize = False
    for room in (0, 30 * MIB, 90 * MIB, 400 * MIB):
        model = CachingAllocator.from_segments(
            copy.deepcopy(segs), r.reserved + room, conf, device_total=1 << 44
        )
        for size in (5 * MIB, 30 * MIB, 50 * MIB, 100 * MIB, 180 * MIB, 300 * MIB):
            ans = r.can_fit(size, device_free=room)
            assert ans.verdict == _outcome_by_stats(model, size, gc=False), (conf, room, size, ans)
            oversize |= "oversize segments" in ans.explanation
    return oversize


@pytest.mark.parametrize("seed", range(16))
def test_can_fit_agrees_with_the_model_when_oversize_segments_go_back_first(seed):
    """With max_split_size set the allocator returns cached oversize segments to the driver
    before it flushes everything (release_available_cached_blocks): no retry is counted."""
    _check_oversize_state(seed)


def test_some_random_states_take_the_oversize_path():
    """The property above is not vacuous."""
    assert sum(_check_oversize_state(s) for s in range(16)) >= 3


def _left_after_empty_cache(segs: list[dict], conf: str) -> tuple[int, int]:
    """Inactive bytes the model keeps after empty_cache(): all, and in expandable segments."""
    m = CachingAllocator.from_segments(copy.deepcopy(segs), 1 << 40, conf, device_total=1 << 44)
    m.empty_cache()
    left = [
        (b["size"], s["is_expandable"])
        for s in m.snapshot(include_traces=False)["segments"]
        for b in s["blocks"]
        if b["state"] == "inactive"
    ]
    return sum(n for n, _ in left), sum(n for n, e in left if e)


@pytest.mark.parametrize("seed", range(8))
def test_free_stuck_is_what_empty_cache_leaves(seed):
    d = _random_expandable_state(seed)
    r = fragmentation(d)
    conf = "expandable_segments:True"
    stuck, sliver = _left_after_empty_cache(d["segments"], conf)
    assert (r.free_stuck, r.free_stuck_expandable) == (stuck, sliver)
    assert r.free_stuck == r.free + r.pending_free - r.releasable
    assert int(r.per_segment.stuck_free.sum()) == r.free_stuck  # one pool: columns add up
    out = r.to_dict()["devices"]["0"]
    assert (out["free_stuck"], out["free_stuck_expandable"]) == (stuck, sliver)


def test_stuck_free_counts_pending_frees_in_expandable_segments():
    # 2 MiB pages: [0, 1) allocated, [1, 3) pending, [3, 6.5) free, [6.5, 8) allocated;
    # after the sync the free run [1, 6.5) MiB gives back pages [2, 6): 1.5 MiB stay (the old
    # formula, free - releasable, said 0)
    run = seg(
        [
            blk(1 * MIB, "active_allocated"),
            blk(2 * MIB, "active_pending_free"),
            blk(3 * MIB + MIB // 2),
            blk(MIB + MIB // 2, "active_allocated"),
        ],
        is_expandable=True,
        segment_type="small",
    )
    r = fragmentation(snap(run, settings={"expandable_segments": True}))
    assert r.per_segment.releasable.tolist() == [4 * MIB]
    assert r.per_segment.stuck_free.tolist() == [3 * MIB // 2]
    assert r.free_stuck == r.free_stuck_expandable == 3 * MIB // 2
    assert _left_after_empty_cache([run], "expandable_segments:True") == (3 * MIB // 2,) * 2


def test_requested_and_free_trapped_differ_from_torch_stats_as_documented():
    """`requested` is segsum's (allocated blocks only), torch's requested_bytes also counts
    pending frees; free_trapped needs an allocated block, inactive_split_bytes only a split."""
    segs = [
        seg([blk(4 * MIB, "active_allocated", 3 * MIB), blk(16 * MIB)]),
        seg(  # only a pending free and free blocks: split, nothing allocated
            [blk(6 * MIB, "active_pending_free", 5 * MIB), blk(14 * MIB)],
            address=BASE + 20 * MIB,
        ),
    ]
    r = fragmentation(snap(*segs))
    stats = CachingAllocator.from_segments(copy.deepcopy(segs), 1 << 30).memory_stats()
    assert r.requested == 3 * MIB
    assert stats["requested_bytes.all.current"] == 3 * MIB + 5 * MIB
    assert r.free_trapped == 16 * MIB
    assert stats["inactive_split_bytes.all.current"] == 16 * MIB + 14 * MIB


def test_the_public_name_is_the_function():
    import pydoc

    import gpumemviz
    import gpumemviz.analysis.fragmentation as mod

    assert gpumemviz.fragmentation is mod.fragmentation
    assert (
        gpumemviz.fragmentation(_cached_layout()).reserved
        == fragmentation(_cached_layout()).reserved
    )
    with pytest.raises(TypeError, match=r"fragmentation\(\) got an unexpected keyword .*'foo'"):
        gpumemviz.fragmentation(_cached_layout(), foo=1)
    text = pydoc.render_doc(gpumemviz.fragmentation, renderer=pydoc.plaintext)
    assert "Measure the allocator's memory and its fragmentation" in text
    assert ">>> r = fragmentation(" in text


def test_the_package_keeps_its_names():
    """fragmentation/ is a package of one-job modules: the public names still import from
    `gpumemviz.analysis.fragmentation` (its layer is checked by tests/project/test_layers.py)."""
    import subprocess
    import sys

    code = (
        "import gpumemviz, gpumemviz.analysis.fragmentation as f\n"
        "from gpumemviz.analysis.fragmentation import (N_WORST, VERDICTS, ConservationViolation, "
        "FitAnswer, FragmentationReport, MemoryFigures, PoolKey, SegmentFigures, "
        "SegmentSummary, fragmentation)\n"
        "assert gpumemviz.FragmentationReport is FragmentationReport is f.FragmentationReport\n"
        "assert callable(gpumemviz.fragmentation) and fragmentation.__module__ == f.__name__\n"
        "print(set(f.__all__) >= {'VERDICTS', 'FitAnswer', 'fragmentation'}, N_WORST)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "5"]
