"""advise(): each rule fires on its evidence, stays quiet below its threshold, and never
suggests a setting that is already on (recorded, or passed as a settings string)."""

from __future__ import annotations

import pytest

from conftest import read_real
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.analysis.advice import (
    ADVICE_KINDS,
    EXTERNAL_FRAGMENTATION_HIGH,
    FREE_BYTES_MIN,
    NEAR_CAPACITY,
    RETRIES_CLIMBING,
    Advice,
    advise,
    oom_device_free,
)
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.snapshot import Snapshot

MIB = 1 << 20
GIB = 1 << 30


def _segment(address: int, blocks: list[tuple[int, str]], **kw) -> dict:
    return {
        "device": 0,
        "address": address,
        "total_size": sum(s for s, _ in blocks),
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [{"size": s, "requested_size": s, "state": st, "frames": []} for s, st in blocks],
        **kw,
    }


def fragmented(n: int = 8, seg_mib: int = 96, used_mib: int = 2) -> dict:
    """n big segments, each split by one small live tensor: the free parts are trapped."""
    segs = [
        _segment(
            0x7F0000000000 + i * seg_mib * MIB,
            [(used_mib * MIB, "active_allocated"), ((seg_mib - used_mib) * MIB, "inactive")],
        )
        for i in range(n)
    ]
    return {"segments": segs, "device_traces": [[]]}


def kinds(advice: list[Advice]) -> list[str]:
    return [a.kind for a in advice]


def test_fragmented_cache_gets_both_settings_with_evidence():
    r = fragmentation(fragmented())
    advice = advise(r)
    assert kinds(advice) == ["expandable_segments", "max_split_size_mb"]
    exp, mss = advice
    assert exp.evidence["external_fragmentation"] == pytest.approx(r.external_fragmentation)
    assert exp.evidence["external_fragmentation"] >= EXTERNAL_FRAGMENTATION_HIGH
    assert exp.evidence["free_trapped"] == 8 * 94 * MIB
    assert "expandable_segments:True" in exp.message and "94.00 MiB" in exp.message
    assert mss.evidence["trapped_in_large_split_segments"] == 8 * 94 * MIB
    assert mss.evidence["suggested_max_split_size_mb"] == 64
    assert "max_split_size_mb:64" in mss.message
    assert all(a.kind in ADVICE_KINDS for a in advice)
    assert str(exp) == exp.message and exp.to_dict()["kind"] == "expandable_segments"


def test_settings_already_on_are_never_suggested():
    d = fragmented()
    d["allocator_settings"] = {"expandable_segments": True, "max_split_size": -1}
    assert advise(d) == []  # recorded: expandable on, and max_split_size is moot then
    d["allocator_settings"] = {"expandable_segments": False, "max_split_size": 128 * MIB}
    assert kinds(advise(d)) == ["expandable_segments"]
    assert kinds(advise(fragmented(), "max_split_size_mb:128")) == ["expandable_segments"]
    assert advise(fragmented(), "expandable_segments:True") == []
    assert kinds(advise(fragmented(), {"expandable_segments": False})) == [
        "expandable_segments",
        "max_split_size_mb",
    ]


def test_a_bad_settings_string_is_a_clear_error():
    with pytest.raises(ValueError, match="not a PYTORCH_CUDA_ALLOC_CONF string"):
        advise(fragmented(), "expandable_segments:Yes")


def test_little_or_releasable_free_memory_is_left_alone():
    small = fragmented(n=1, seg_mib=96, used_mib=2)  # 94 MiB free: below FREE_BYTES_MIN
    assert 94 * MIB < FREE_BYTES_MIN
    assert advise(small) == []
    # lots of free memory but in one block: no external fragmentation
    whole = {"segments": [_segment(0, [(4 * GIB, "inactive")])], "device_traces": [[]]}
    assert advise(whole) == []


def test_retries_rule_reads_memory_stats():
    stats = {"num_alloc_retries": RETRIES_CLIMBING, "num_sync_all_streams": 10}
    (a,) = advise({"segments": []}, stats=stats)
    assert a.kind == "no_empty_cache_in_loop"
    assert a.evidence["manual_flushes"] == 10 - RETRIES_CLIMBING
    assert "empty_cache" in a.message
    assert advise({"segments": []}, stats={"num_alloc_retries": RETRIES_CLIMBING - 1}) == []


def test_retries_rule_on_stats_from_the_allocator_model():
    # 31 MiB of device: a cached 30 MiB segment leaves no room for a 2 MiB small segment and
    # back, so every switch between the two pools costs a flush and a retry
    model = CachingAllocator(31 * MIB)
    for _ in range(RETRIES_CLIMBING):
        model.free(model.malloc(30 * MIB))
        model.free(model.malloc(1000))
    stats = model.memory_stats()
    assert stats["num_alloc_retries"] >= RETRIES_CLIMBING
    assert "no_empty_cache_in_loop" in kinds(advise(model.snapshot(), stats=stats))
    calm = CachingAllocator(64 * MIB)
    for _ in range(RETRIES_CLIMBING):
        calm.free(calm.malloc(30 * MIB))
        calm.free(calm.malloc(1000))
    assert calm.memory_stats()["num_alloc_retries"] == 0
    assert advise(calm.snapshot(), stats=calm.memory_stats()) == []


def test_near_capacity_needs_the_device_size():
    d = {"segments": [_segment(0, [(10 * GIB, "active_allocated")])], "device_traces": [[]]}
    assert advise(d) == []
    (a,) = advise(d, device_total=int(10 * GIB / NEAR_CAPACITY))
    assert a.kind == "smaller_batch_or_checkpointing"
    assert a.evidence == {"device": 0, "allocated": 10 * GIB, "device_total": 11930464711}
    assert advise(d, device_total=12 * GIB) == []


def test_per_device_and_unknown_device():
    d = fragmented()
    other = fragmented()["segments"][0] | {"device": 1}
    d["segments"].append(other)
    advice = advise(d)
    assert {a.evidence["device"] for a in advice} == {0}
    assert "device 0" in advice[0].message
    with pytest.raises(ValueError, match="no device 5"):
        advise(d, device=5)


def test_oom_device_free_from_dicts_and_snapshots(recorded_dict):
    by_dict = oom_device_free(recorded_dict)
    by_snap = oom_device_free(Snapshot.from_torch(recorded_dict))
    assert by_dict == by_snap
    expected = {}
    for dev, entries in enumerate(recorded_dict.get("device_traces") or []):
        ooms = [e for e in entries if e.get("action") == "oom"]
        if ooms:
            expected[dev] = ooms[-1]["device_free"]
    assert by_dict == expected


def test_real_files_get_sensible_advice(recorded_path):
    d = read_real(recorded_path)
    advice = advise(d)
    settings = d.get("allocator_settings") or {}
    if settings.get("expandable_segments"):
        assert "expandable_segments" not in kinds(advice)
    if settings.get("max_split_size", -1) != -1:
        assert "max_split_size_mb" not in kinds(advice)
    for a in advice:
        assert a.kind in ADVICE_KINDS and a.evidence and "\n" not in a.message
