"""sources/simulated.py: the allocator model running a workload, as demo data."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from torch.cuda import _memory_viz

from gpumemviz.analysis.findings import analyze
from gpumemviz.analysis.fragmentation.oom import classify_event
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources import Source, default_source, oom
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.snapshot import ALLOCATED
from gpumemviz.snapshot.sample import NOT_CLASSIFIED, OomEvent


def run_to_end(src: SimulatedSource) -> int:
    n = 0
    while True:
        ran = src.step(2000)
        n += ran
        if ran < 2000:
            return n


def test_is_a_source_labelled_as_demo_data():
    src = SimulatedSource(autostart=False)
    assert isinstance(src, Source)
    s = src.sample()
    assert s.demo and "demo data" in s.source_label
    assert s.nvml.synthetic
    assert s.state == "ok" and s.stats.reserved == 0


def test_default_source_without_cuda_is_the_simulation():
    src = default_source(0)
    try:
        assert isinstance(src, SimulatedSource)
    finally:
        src.close()


def test_training_workload_fragments_and_its_oom_is_classified():
    src = SimulatedSource("training", autostart=False)
    events: list[OomEvent] = []
    src.set_oom_handler(events.append)
    steps = run_to_end(src)
    assert steps == 10_886  # deterministic: the OOM is the 10,886th allocator call
    assert len(events) == 1 and list(src.ooms) == events
    ev = events[0]
    assert ev.cause == "fragmentation", ev.explanation
    assert ev.free_in_segments >= ev.request_size > ev.largest_free_block
    assert ev.snapshot["device_traces"][0][-1]["action"] == "oom"
    oom = src.oom_sample(ev)
    assert oom.keyframe and oom.oom is ev
    assert int(oom.segments.segments.total_size.sum()) == ev.reserved
    # the sample after the OOM obeys the conservation law
    s = src.sample()
    assert int(s.segments.segments.total_size.sum()) == s.stats.reserved
    assert int(s.segments.segments.allocated_size.sum()) == s.stats.allocated


def test_a_failed_verdict_leaves_the_raw_facts_with_the_reason(monkeypatch):
    """The source judges its OOM with the analysis layer's `classify_event`; when that raises,
    the handlers still get the event, with the facts the failure said and why it has no verdict
    (the demo goes on), and those facts judged later give the verdict."""

    def broken(event: OomEvent) -> OomEvent:
        raise RuntimeError("verdict bug")

    monkeypatch.setattr(oom, "classify_event", broken)
    src = SimulatedSource("training", autostart=False)
    events: list[OomEvent] = []
    src.set_oom_handler(events.append)
    run_to_end(src)
    (ev,) = events
    assert (ev.cause, ev.largest_free_block) == ("unknown", 0)
    assert ev.explanation == "not classified: RuntimeError: verdict bug" != NOT_CLASSIFIED
    assert ev.device_total == src.workload.capacity and ev.request_size > 0
    assert list(src.ooms) == events
    assert classify_event(ev).cause == "fragmentation"


def test_commands_act_on_the_model():
    src = SimulatedSource("training", autostart=False)
    src.step(3000)
    before = src.sample().stats
    released = src.empty_cache()
    after = src.sample().stats
    assert released == {0: before.reserved - after.reserved}
    exported = src.export()
    assert "device_traces" in exported and exported["device_traces"][0]
    # torch's own memory_viz reads the export
    assert "Summary of segments" in _memory_viz.segsum(exported)


def test_unknown_workload_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown workload 'trainig'; known: \\["):
        SimulatedSource("trainig")
    with pytest.raises(ValueError, match="steps_per_second must be positive"):
        SimulatedSource(steps_per_second=0)


def test_runs_on_its_own_thread_and_the_sampler_sees_the_oom():
    before = set(threading.enumerate())
    src = SimulatedSource("training", steps_per_second=200_000, pause_after_oom=0.2)
    s = Sampler(src, interval=0.05, segment_interval=0.1)
    got: list = []
    s.add_listener(lambda x: got.append(x) if x.oom is not None else None)
    s.start()
    try:
        end = time.monotonic() + 20
        while not got and time.monotonic() < end:
            time.sleep(0.05)
        assert got, "no OOM sample within 20 s"
        assert got[0].oom.cause == "fragmentation" and got[0].keyframe and got[0].demo
        end = time.monotonic() + 10
        while src.runs < 2 and time.monotonic() < end:  # then the workload starts again
            time.sleep(0.05)
        assert src.runs >= 2
    finally:
        s.close()
    assert not [
        t for t in threading.enumerate() if t not in before and t.name.startswith("gpumemviz")
    ]
    assert s.sample_once().state == "ok"  # a closed simulation still answers, frozen


def test_keeps_only_the_newest_ooms():
    """Each OOM holds a full snapshot with its trace: a demo left open must not pile them up."""
    from gpumemviz.live.sources.simulated import OOMS_KEPT

    src = SimulatedSource("training", autostart=False)
    run_to_end(src)
    first = src.ooms[-1]
    for i in range(OOMS_KEPT + 5):
        src._deliver(dataclasses.replace(first, time=float(i)))
    assert len(src.ooms) == OOMS_KEPT
    assert [e.time for e in src.ooms] == [float(i) for i in range(5, OOMS_KEPT + 5)]


def test_a_program_driving_the_model_gets_its_oom_after_every_handler_ran(monkeypatch):
    """`step(raise_oom=True)`: the handlers run in the stepping thread first (as torch's
    observer does), then the model's own OutOfMemory is raised; the failure is judged once, by
    the analysis layer's verdict, and every handler gets that one judged event."""
    from gpumemviz.allocator.oom import OutOfMemory

    src = SimulatedSource("training", autostart=False, loop=False)
    seen: list[tuple[str, object]] = []
    judged: list[tuple[OomEvent, OomEvent, str]] = []

    def counting(event: OomEvent) -> OomEvent:
        verdict = classify_event(event)
        judged.append((event, verdict, threading.current_thread().name))
        return verdict

    monkeypatch.setattr(oom, "classify_event", counting)
    src.set_oom_handler(lambda e: seen.append(("sampler", e)))
    src.add_oom_handler(lambda e: seen.append(("extra", e)))
    src.add_oom_handler(lambda e: seen.append(("another", e)))
    with pytest.raises(OutOfMemory) as caught:
        while src.step(1000, raise_oom=True):
            pass
    assert [who for who, _ in seen] == ["sampler", "extra", "another"]
    ((raw, verdict, thread),) = judged  # one judgement, in the thread that ran out of memory
    assert thread == threading.current_thread().name
    assert raw.explanation == NOT_CLASSIFIED and verdict == classify_event(raw)
    assert all(e is verdict for _, e in seen) and verdict.cause == "fragmentation"
    assert src.ooms[-1] is verdict
    assert caught.value.alloc_size == verdict.alloc_size
    assert src.step(10) == 0  # the run is over, as after a real OOM


def test_history_recording_follows_record_history():
    src = SimulatedSource("training", autostart=False, record_history=False)
    src.step(200)
    assert src.history_enabled() is False and src.export()["device_traces"][0] == []
    src.record_history(True)
    src.step(200)
    assert src.history_enabled() is True and len(src.export()["device_traces"][0]) > 0


def test_counts_only_grow_when_the_workload_restarts():
    """A restart is a new workload in the same simulated process: `OOMs 0` must never show
    under the OOM the panel just reported."""
    src = SimulatedSource("training", autostart=False)
    run_to_end(src)
    first = src.sample(segments=False).stats
    assert first.num_ooms == 1
    src.restart()
    after = src.sample(segments=False).stats
    assert after.num_ooms == 1 and after.num_alloc_retries >= first.num_alloc_retries
    assert after.peak_reserved == first.peak_reserved  # the earlier run's peak stays the peak
    assert after.reserved == 0  # the fresh model holds nothing yet
    run_to_end(src)
    assert src.sample(segments=False).stats.num_ooms == 2 == len(src.ooms)
    src.reset_peaks()  # the panel's button: peaks start again from now, counts stay
    again = src.sample(segments=False).stats
    assert again.peak_reserved == again.reserved and again.num_ooms == 2


def test_the_oom_sample_carries_the_device_total_every_sample_carries():
    """At an OOM the panel's bar stays to scale of the device (it fell back to reserved: the
    OOM's sample had no device figures), with the context beside the segments as before."""
    from gpumemviz.analysis.findings import analyze
    from gpumemviz.render.glance import glance_bar

    src = SimulatedSource("inference_contiguous", autostart=False)
    before = src.sample()
    run_to_end(src)
    oom = src.oom_sample(src.ooms[-1])
    assert oom.device_info is not None and before.device_info is not None
    assert oom.device_info.total_memory == before.device_info.total_memory
    assert oom.nvml is not None and before.nvml is not None
    assert oom.nvml.total == before.nvml.total and oom.nvml.non_pytorch == before.nvml.non_pytorch
    assert oom.nvml.used == src.ooms[-1].reserved + oom.nvml.non_pytorch
    found = analyze(oom)
    assert found.figures.device_total == oom.device_info.total_memory
    bar = glance_bar(found)
    assert bar["scale"] == "device" and bar["total"] == found.figures.device_total


def test_the_demo_holders_are_lines_of_the_demo_program():
    src = SimulatedSource("training", autostart=False)
    src.step(3000)  # into the first backward: weights, activations, gradients held
    findings = analyze(src.export(), check=False)
    rows = findings.holders("frame")
    assert sum(r.bytes for r in rows) == findings.figures.allocated > 0
    top = rows[:5]
    assert all(r.key is not None and r.key.startswith("demo_train.py:") for r in top)
    assert {r.key for r in rows} >= {"demo_train.py:124", "demo_train.py:39"}  # weights, softmax
    # the panel's map reads the stacks off the live sample's blocks (its hover)
    snap = src.sample().segments
    assert snap is not None
    allocated = snap.blocks.state == ALLOCATED
    stacks = [f for f, live in zip(snap.block_frames(), allocated, strict=True) if live]
    assert stacks and all(f and f[-1]["filename"] == "demo_train.py" for f in stacks)


def test_the_leak_demo_names_its_leaking_line():
    src = SimulatedSource("leak", autostart=False)
    src.step(12_000)  # about ten training steps
    findings = analyze(src.export(), check=False)
    (suspect,) = [g for g in findings.growth if g.frame == "demo_train.py:99"]
    assert abs(suspect.bytes_per_step - (128 << 20)) <= 0.1 * (128 << 20)
    assert findings.growth[0] is suspect  # the leak leads
