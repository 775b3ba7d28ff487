"""sample.py: frozen values, compact stats, byte estimates."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpumemviz.allocator.stats import DeviceStats
from gpumemviz.snapshot.sample import (
    STAT_FIGURES,
    MemoryStats,
    NvmlInfo,
    OomEvent,
    Sample,
    check_device,
    snapshot_nbytes,
)


def torch_like_stats(allocated: int, reserved: int) -> dict[str, int]:
    """torch 2.13's memory_stats() key set (the allocator model's `as_dict`), a few figures set."""
    d = DeviceStats().as_dict()
    d["allocated_bytes.all.current"] = allocated
    d["allocated_bytes.all.peak"] = allocated
    d["reserved_bytes.all.current"] = reserved
    d["reserved_bytes.all.peak"] = reserved
    d["num_alloc_retries"] = 2
    return d


def oom_event(**fields) -> OomEvent:
    """A capacity OOM of a 2 MiB segment on a full 1 GiB device; `fields` override."""
    base = OomEvent(
        time=0.0,
        device=0,
        alloc_size=2 << 20,
        device_limit=1 << 30,
        device_free=0,
        cause="capacity",
        explanation="x",
    )
    return dataclasses.replace(base, **fields)


def test_stats_read_like_torch_dict_and_name_the_live_figures():
    raw = torch_like_stats(allocated=3 << 20, reserved=20 << 20)
    s = MemoryStats.from_torch(raw)
    assert dict(s) == raw
    assert s.as_dict() == raw
    assert len(s) == len(raw) > 100
    assert s["max_split_size"] == -1
    assert (s.allocated, s.reserved, s.cached) == (3 << 20, 20 << 20, 17 << 20)
    assert s.num_alloc_retries == 2
    assert s.peak_reserved == 20 << 20
    assert "no.such.key" not in s
    assert s.get("no.such.key", 7) == 7


def test_stats_are_frozen_and_compact():
    s = MemoryStats.from_torch(torch_like_stats(1, 2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.values = np.zeros(1)  # type: ignore[misc]
    with pytest.raises(ValueError):
        s.values[0] = 5
    # ~150 int64 values; the key tuple is shared between samples of the same key set
    assert s.nbytes < 1500
    t = MemoryStats.from_torch(torch_like_stats(5, 6))
    assert t.keys_ is s.keys_
    assert t != s
    assert MemoryStats.from_torch(s.as_dict()) == s


def test_stats_missing_keys_read_as_zero_in_properties():
    s = MemoryStats.from_torch({})
    assert (s.allocated, s.reserved, s.active, s.inactive_split, s.num_ooms) == (0, 0, 0, 0, 0)
    assert len(s) == 0


def test_stat_figures_name_the_key_backed_properties_in_csv_order():
    # the CSV export's sample columns follow this order: pin it
    assert (
        *("allocated", "reserved", "active", "requested", "inactive_split"),
        *("peak_allocated", "peak_reserved", "num_alloc_retries", "num_ooms"),
    ) == STAT_FIGURES
    raw = DeviceStats().as_dict()
    keys = [k for k in raw if k != "max_split_size"]
    s = MemoryStats.from_torch({k: i + 1 for i, k in enumerate(keys)})
    for name in STAT_FIGURES:
        key = getattr(MemoryStats, name).key
        assert getattr(s, name) == keys.index(key) + 1, name
        assert key in MemoryStats.__dict__[name].__doc__
    assert s.cached == s.reserved - s.allocated


@pytest.mark.parametrize("bad", [-1, True, 1.0, "0", None])
def test_check_device_names_a_bad_index(bad):
    with pytest.raises(ValueError, match=f"device must be a non-negative int, got {bad!r}$"):
        check_device(bad)
    assert check_device(3) == 3


def test_oom_sample_is_a_keyframe_of_the_event():
    ev = oom_event(time=12.5, device=1)
    s = Sample.for_oom(ev, 1, None, source_label="sim", demo=True, errors=("e",))
    assert (s.time, s.device, s.stats, s.segments, s.oom) == (12.5, 1, None, None, ev)
    assert s.keyframe and s.demo and s.state == "ok" and s.source_label == "sim"
    assert s.errors == ("e",) and s.monotonic > 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([1, 2], "must be a dict"),
        ({"a": "x"}, "'a': expected a number"),
        ({"a": True}, "'a': expected a number"),
        ({1: 2}, "1: expected a number"),
    ],
)
def test_bad_stats_get_a_one_line_error(bad, message):
    with pytest.raises(ValueError, match=message) as info:
        MemoryStats.from_torch(bad)
    assert "\n" not in str(info.value)


def test_float_stats_are_kept_as_floats():
    s = MemoryStats.from_torch({"a": 1, "b": 0.5})
    assert s["b"] == 0.5 and s["a"] == 1.0


def test_failed_sample_says_why_and_is_frozen():
    s = Sample.failed(2, "memory_stats: boom", source_label="x")
    assert (s.state, s.device, s.stats, s.errors) == ("error", 2, None, ("memory_stats: boom",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.state = "ok"  # type: ignore[misc]
    assert s.replace(seq=4).seq == 4 and s.seq == -1


def test_non_pytorch_bytes_comes_from_nvml_only_when_available():
    base = Sample.failed(0, "x")
    assert base.non_pytorch_bytes is None
    assert base.replace(nvml=NvmlInfo.unavailable("no driver")).non_pytorch_bytes is None
    info = NvmlInfo(available=True, total=100, used=60, free=40, non_pytorch=10, synthetic=True)
    assert base.replace(nvml=info).non_pytorch_bytes == 10


def test_snapshot_bytes_are_estimated_from_numpy_columns(recorded_dict):
    from gpumemviz.snapshot import Snapshot

    snap = Snapshot.from_torch(recorded_dict)
    cols = 0
    for table in (snap.segments, snap.blocks):
        for f in dataclasses.fields(table):
            v = getattr(table, f.name)
            if isinstance(v, np.ndarray):
                cols += v.nbytes
    est = snapshot_nbytes(snap)
    assert est >= cols
    assert est >= 40 * snap.n_blocks
    with_segments = Sample.failed(0, "x").replace(segments=snap)
    assert with_segments.nbytes - Sample.failed(0, "x").nbytes == est


def test_an_oom_snapshot_counts_towards_the_sample_bytes():
    trace = [{"action": "alloc", "addr": i, "size": 512, "stream": 0} for i in range(1000)]
    ev = oom_event(snapshot={"segments": [], "device_traces": [trace]})
    plain = Sample.failed(0, "x")
    assert plain.replace(oom=ev).nbytes - plain.nbytes >= 300 * 1000
