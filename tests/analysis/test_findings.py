"""analyze(): one frozen Findings per source, the figures' law exact, an OOM judged where it
happened with ranked actions that carry a byte figure, advice checked on the recorded trace."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import REAL_FILES, fragmented_segments, real_file
from gpumemviz import Findings, analyze
from gpumemviz.analysis.advice import advise_each_device, oom_device_free
from gpumemviz.analysis.advice_check import check_advice
from gpumemviz.analysis.findings import LIVE_UNCHECKED, NOT_CHECKED
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.io import load_snapshot
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.snapshot.sample import OomEvent

GiB, MiB = 1 << 30, 1 << 20
WEDSONLIN_128 = (
    "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
)
YIYI_OOM = "Yiyi-philosophy__LLM-inference__oom_snapshot.pickle"
SUN_OOM = "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"
#: The real recordings taken at an OOM: (device, cause, where it was judged).
OOM_FILES = {YIYI_OOM: (0, "capacity", "final state"), SUN_OOM: (1, "capacity", "trace")}


def _law(f: Findings) -> None:
    g = f.figures
    assert g.allocated + g.pending_free + g.free_in_reserved == g.reserved
    assert g.releasable + g.stuck == g.free_in_reserved + g.pending_free


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
def test_every_real_file_gives_json_safe_findings_whose_figures_add_up(path):
    f = analyze(path)
    _law(f)
    for d, one in f.devices.items():
        assert one.device == d and not one.devices
        _law(one)
    assert f.figures.reserved == sum(x.figures.reserved for x in f.devices.values())
    json.dumps(f.to_dict(), allow_nan=False)  # JSON-safe, no NaN
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.advice = ()  # type: ignore[misc]
    expected = OOM_FILES.get(path.name)
    if expected is None:
        assert f.oom is None, f.oom
        return
    device, cause, basis = expected
    assert f.oom is not None
    assert (f.oom.device, f.oom.cause, f.oom.basis) == (device, cause, basis)
    assert f.oom == f.devices[device].oom
    assert f.oom.actions and all(a.effect > 0 for a in f.oom.actions)
    assert f.oom.sentence.startswith(f"OOM on cuda:{device}")


def test_the_three_device_oom_is_judged_at_its_entry_on_the_replayed_state():
    path = real_file(SUN_OOM)
    f = analyze(path)
    oom = f.oom
    assert oom is not None and oom.entry == 421 and oom.basis == "trace"
    # at the entry, not the final state (384.81 MiB allocated there)
    assert oom.allocated > 78 * GiB and f.devices[1].figures.allocated < 400 * MiB
    assert oom.rounded is not None and 4.9 * GiB < oom.rounded < 5 * GiB
    assert oom.device_free == 91.25 * MiB
    first = oom.actions[0]
    assert first.kind == "smaller_batch_or_checkpointing"
    assert first.effect == oom.rounded - oom.device_free
    assert oom.frame is not None and ".py:" in oom.frame
    # the failing device's; the other devices have none
    assert [d for d, x in f.devices.items() if x.oom is not None] == [1]


def test_a_full_final_state_without_history_is_judged_as_an_oom():
    f = analyze(real_file(YIYI_OOM))
    assert f.oom is not None and f.oom.entry is None and f.oom.request is None
    top = f.oom.actions[0]
    assert top.effect > 10 * GiB and "live" in top.sentence


def test_advice_is_check_advice_of_the_advice_inspect_gives():
    path = real_file(
        "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
    )
    snap = load_snapshot(path)
    report = fragmentation(snap)
    checked = check_advice(snap, advise_each_device(report, oom_device_free(snap)))
    f = analyze(snap)
    assert [a.message for a in f.advice] == [c.advice.message for c in checked.shown]
    assert [a.message for a in f.rejected] == [c.advice.message for c in checked.rejected]
    for a in (*f.advice, *f.rejected):
        if a.checked:
            assert a.peak_reserved_before is not None and a.reason


def test_check_off_leaves_setting_advice_unchecked_with_the_reason():
    f = analyze(fragmented_segments(), check=False)
    settings = [a for a in f.advice if a.setting is not None]
    assert settings and all(not a.checked and a.unchecked == NOT_CHECKED for a in settings)
    assert not f.rejected


def test_one_device_and_an_unknown_device():
    path = real_file(SUN_OOM)
    one = analyze(path, device=2)
    assert one.device == 2 and not one.devices and one.oom is None
    with pytest.raises(ValueError, match="no device 7"):
        analyze(path, device=7)


def test_a_live_sample_is_one_read_and_says_its_advice_is_unchecked():
    sampler = Sampler(SimulatedSource(autostart=False))
    try:
        for _ in range(5):
            sample = sampler.sample_once(segments=True)
        f = analyze(sample)
    finally:
        sampler.close()
    _law(f)
    assert f.device == sample.device and f.figures.time == sample.time
    assert LIVE_UNCHECKED in f.notes
    assert all(not a.checked for a in f.advice)
    event = OomEvent(
        time=1.0,
        device=sample.device,
        alloc_size=64 * GiB,
        device_limit=8 * GiB,
        device_free=0,
        request_size=64 * GiB,
        cause="capacity",
        explanation="it does not fit",
        device_total=8 * GiB,
    )
    with_oom = analyze(dataclasses.replace(sample, oom=event))
    assert with_oom.oom is not None and with_oom.oom.basis == "event"
    assert with_oom.oom.actions[0].effect == 64 * GiB
    # an OOM's sample made before the device was first read: its event's total is the device's
    bare = dataclasses.replace(sample, oom=event, device_info=None, nvml=None)
    assert analyze(bare).figures.device_total == 8 * GiB
    assert analyze(dataclasses.replace(bare, oom=None)).figures.device_total is None
    assert with_oom.oom.sentence == "OOM on cuda:0 of 64.00 GiB (capacity): it does not fit"
