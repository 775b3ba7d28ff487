"""The sources against data recorded on a real GPU (tests/data/gpu/, by record_fixtures.py).

These run on CPU. Each test skips while its recorded file is absent (no GPU has recorded it yet).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import read_real
from gpumemviz.analysis.fragmentation.oom import classify_oom
from gpumemviz.live.sources.nvml import normalize_uuid
from gpumemviz.snapshot.sample import MemoryStats

GPU_DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"


def recorded(name: str) -> Path:
    path = GPU_DATA / name
    if not path.exists():
        pytest.skip(f"not recorded yet: tests/data/gpu/{name} (run tests/gpu/record_fixtures.py)")
    return path


@pytest.mark.parametrize("tag", ["plain", "expandable"])
def test_memory_stats_properties_name_real_keys(tag):
    raw = json.loads(recorded(f"memory_stats_{tag}.json").read_text())
    stats = MemoryStats.from_torch(raw)
    for key in (
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "active_bytes.all.current",
        "requested_bytes.all.current",
        "inactive_split_bytes.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.all.peak",
        "num_alloc_retries",
        "num_ooms",
    ):
        assert key in raw, key
    assert 0 < stats.allocated <= stats.reserved
    assert stats.nbytes < 2500


@pytest.mark.parametrize("tag", ["plain", "expandable"])
def test_recorded_snapshots_parse_and_agree_with_the_segment_list(tag):
    from gpumemviz.snapshot import Snapshot

    full = read_real(recorded(f"snapshot_{tag}.pickle"))
    segs = read_real(recorded(f"segments_{tag}.pickle"))
    meta = json.loads(recorded(f"meta_{tag}.json").read_text())
    a, b = Snapshot.from_torch(full), Snapshot.from_torch(segs)
    assert a.n_segments == b.n_segments == meta["n_segments"]
    assert b.n_blocks == meta["n_blocks"]
    assert bool(b.segments.is_expandable.any()) == (tag == "expandable")
    assert len(full["device_traces"][0]) > 0  # history was on


@pytest.mark.parametrize(
    ("case", "cause"), [("capacity", "capacity"), ("fragmentation", "fragmentation")]
)
def test_classify_the_recorded_ooms(case, cause):
    snap = read_real(recorded(f"oom_{case}.pickle"))
    facts = json.loads(recorded("oom.json").read_text())
    call = facts["cases"][case]["observer_calls"][-1]
    request = next(
        (
            e["size"]
            for e in reversed(snap["device_traces"][call["device"]])
            if e["action"] == "oom"
        ),
        None,
    )
    got = classify_oom(
        snap["segments"],
        call["device"],
        alloc_size=call["alloc"],
        device_total=facts["device_total"],
        device_free=call["device_free"],
        request_size=request,
    )
    assert got["cause"] == cause, got["explanation"]


def test_recorded_record_stream_free_is_pending():
    facts = json.loads(recorded("record_stream.json").read_text())
    assert facts["state_while_pending"] == ["active_pending_free"]
    snap = read_real(recorded("record_stream.pickle"))
    states = {b["state"] for s in snap["segments"] for b in s["blocks"]}
    assert "active_pending_free" in states


def test_recorded_uuids_match_between_torch_and_nvml():
    facts = json.loads(recorded("nvml.json").read_text())
    nvml = {normalize_uuid(d["uuid"]) for d in facts["after_cuda_init"] if "uuid" in d}
    for torch_uuid in facts["torch_uuids"]:
        assert normalize_uuid(torch_uuid) in nvml


def test_recorded_empty_cache_from_a_second_thread_was_safe():
    facts = json.loads(recorded("empty_cache_thread.json").read_text())
    assert facts["calls"] > 10
    assert facts["errors"] == []
    assert facts["losses_finite"]


def test_the_recorders_fragmentation_recipe_is_a_fragmentation_oom_on_the_model():
    """record_fixtures.py's `oom` part, run on the CPU model of the allocator: the recipe (8 MiB
    pairs until the cap, free every second one, ask for 24 MiB) must give the OOM it is meant to
    record, and classify_oom must call it fragmentation."""
    from gpumemviz.allocator.model import CachingAllocator
    from gpumemviz.allocator.oom import OutOfMemory

    MiB = 1 << 20
    a = CachingAllocator(2 << 30)
    keep, holes = [], []
    with pytest.raises(OutOfMemory):
        while True:
            keep.append(a.malloc(8 * MiB))
            holes.append(a.malloc(8 * MiB))
    for h in holes:
        a.free(h)
    with pytest.raises(OutOfMemory) as info:
        a.malloc(24 * MiB)
    err = info.value
    snap = a.snapshot()
    got = classify_oom(
        snap["segments"],
        0,
        alloc_size=err.alloc_size,
        device_total=err.capacity,
        device_free=err.free,
        request_size=err.rounded_size,
    )
    assert got["cause"] == "fragmentation", got["explanation"]
    assert got["largest_free_block"] == 12 * MiB
