"""MemoryPanel: traits, frames and writer thread, with the real anywidget (no browser)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import read_real as _read
from gpumemviz.analysis.findings import LIVE_UNCHECKED
from gpumemviz.render.rows import build_rows, encode_cells
from gpumemviz.render.wire import FIRST_FRAME_LIMIT
from gpumemviz.render.wire_frame import decode_frame
from gpumemviz.reporting.bundles import bundle_path
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.sample import MemoryStats, Sample
from gpumemviz.widget import MemoryPanel

MiB = 1 << 20


def _advice(panel):
    """The panel's advice rows, without its notes (kind "note")."""
    return [a for a in panel.advice if a["kind"] != "note"]


def _snap(n_alloc: int) -> Snapshot:
    """n_alloc allocated 2 MiB blocks in a 20 MiB segment, the rest free."""
    blocks = [{"size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated"}] * n_alloc
    blocks = [*blocks, {"size": (20 - 2 * n_alloc) * MiB, "requested_size": 0, "state": "inactive"}]
    seg = {
        "device": 0,
        "address": 1 << 32,
        "total_size": 20 * MiB,
        "stream": 0,
        "segment_type": "large",
        "blocks": blocks,
    }
    return Snapshot.from_torch([seg])


def _small_segs(devices: tuple[int, ...]) -> list[dict]:
    """One wholly allocated 2 MiB small-pool segment at address 0 per entry of ``devices``."""
    return [
        {
            "device": d,
            "address": 0,
            "total_size": 2 * MiB,
            "stream": 0,
            "segment_type": "small",
            "blocks": [{"size": 2 * MiB, "requested_size": 1, "state": "active_allocated"}],
        }
        for d in devices
    ]


@pytest.fixture
def panel():
    p = MemoryPanel()
    yield p
    p.close()


@pytest.fixture
def sent(panel, monkeypatch):
    """Frames the panel sends, recorded on their way to the real comm."""
    out = []
    real = panel.send

    def record(content, buffers=None):
        out.append((content, buffers, threading.current_thread().name))
        return real(content, buffers)

    monkeypatch.setattr(panel, "send", record)
    return out


def test_a_snapshot_file_can_be_shown_by_path(recorded_path):
    p = MemoryPanel.from_snapshot(recorded_path)
    try:
        assert p.flush()
        assert p.map_layout["n_rows"] == Snapshot.from_torch(_read(recorded_path)).n_segments
    finally:
        p.close()


def test_bundle_is_built_and_loaded():
    js = bundle_path("widget.js")
    assert js.is_file() and bundle_path("widget.css").is_file()
    text = js.read_text()
    assert "gmv-root" in text and "msg:custom" in text
    assert "import " not in text.split("\n", 3)[0]  # bundled: no relative imports left
    # the class holds the file (anywidget reads it, and watches it under ANYWIDGET_HMR=1)
    assert str(MemoryPanel._esm) == text
    assert str(MemoryPanel._css) == bundle_path("widget.css").read_text()
    p = MemoryPanel(subshell=False)
    try:
        assert p._esm == text
    finally:
        p.close()


def test_snapshot_fills_layout_and_header(recorded_path, recorded_dict):
    segs = recorded_dict["segments"] if isinstance(recorded_dict, dict) else recorded_dict
    p = MemoryPanel.from_snapshot(Snapshot.from_torch(recorded_dict), title=recorded_path.name)
    try:
        assert p.flush()
        assert p.map_layout["n_rows"] == len(segs)
        assert sum(g["count"] for g in p.map_layout["groups"]) == len(segs)
        allocated = sum(
            b["size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated"
        )
        assert p.header["allocated"] == allocated
        assert p.header["reserved"] == sum(s["total_size"] for s in segs)
        assert p.title == recorded_path.name
        assert p.errors == ()
    finally:
        p.close()


def test_view_message_answers_with_frames_from_the_writer_thread(panel, sent):
    snap = _snap(3)
    panel.show_snapshot(snap)
    panel._handle_custom_msg(
        {"kind": "view", "view": "t", "first": 0, "count": 10, "cells": 80}, []
    )
    assert panel.flush()
    assert len(sent) == 1
    content, buffers, thread = sent[0]
    assert thread.startswith("gpumemviz-panel")
    assert content["view"] == "t" and content["cells"] == 80
    got = decode_frame(content, buffers)
    want = encode_cells(build_rows(snap), [0], 80)
    assert (got["cells"] == want).all()
    assert got["cells"][0, :24].tolist() == [63] * 24  # 6 MiB of 20 allocated: 24 of 80 cells
    assert panel.wire_stats["frames"] == 1
    assert panel.wire_stats["max_bytes"] <= FIRST_FRAME_LIMIT


def test_unchanged_samples_send_nothing_and_changes_send_one_row(panel, sent):
    panel.show_snapshot(_snap(1))
    panel._handle_custom_msg(
        {"kind": "view", "view": "t", "first": 0, "count": 5, "cells": 100}, []
    )
    assert panel.flush()
    n = len(sent)
    panel.show_snapshot(_snap(1))
    assert panel.flush()
    assert len(sent) == n
    panel.show_snapshot(_snap(4))
    assert panel.flush()
    assert len(sent) == n + 1
    got = decode_frame(sent[-1][0], sent[-1][1])
    assert got["rows"].tolist() == [0]
    assert (got["cells"][0, :40] == 63).all() and (got["cells"][0, 40:] == 192).all()
    assert panel.header["allocated"] == 8 * MiB


def test_traits_are_written_by_the_writer_thread_only(panel):
    writers = set()
    panel.observe(lambda _c: writers.add(threading.current_thread().name), names=["header"])
    for k in range(5):
        panel.show_snapshot(_snap(k))
    assert panel.flush()
    assert writers and all(w.startswith("gpumemviz-panel") for w in writers)
    assert panel.header["allocated"] == 8 * MiB  # the newest snapshot wins


def test_samples_drive_status_demo_and_figures(panel):
    stats = MemoryStats.from_torch(
        {
            "allocated_bytes.all.current": 6 * MiB,
            "reserved_bytes.all.current": 20 * MiB,
            "num_alloc_retries": 2,
            "num_ooms": 1,
        }
    )
    panel.push_sample(Sample(time=0.0, device=0, stats=None, state="waiting", demo=True))
    assert panel.flush()
    assert panel.status == "waiting for CUDA" and panel.demo
    panel.push_sample(
        Sample(time=1.0, device=0, stats=stats, segments=_snap(3), source_label="simulated")
    )
    assert panel.flush()
    assert not panel.demo
    assert panel.status == "simulated"
    assert panel.header["allocated"] == 6 * MiB
    assert panel.header["num_alloc_retries"] == 2 and panel.header["num_ooms"] == 1
    assert panel.map_layout["n_rows"] == 1


def test_a_bad_item_is_caught_and_the_panel_keeps_working(panel):
    panel.push_sample(object())
    assert panel.flush()
    assert panel.errors and "AttributeError" in panel.errors[0]
    panel.show_snapshot(_snap(2))
    assert panel.flush()
    assert panel.header["allocated"] == 4 * MiB


def test_unknown_inputs_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match=r"cannot load a snapshot from an? int"):
        MemoryPanel.from_snapshot(42)


def test_device_filter(panel):
    segs = _small_segs((0, 1, 1))
    segs[2] = {**segs[2], "address": 2 * MiB}
    p = MemoryPanel.from_snapshot(Snapshot.from_torch(segs), device=1)
    try:
        assert p.flush()
        assert p.map_layout["n_rows"] == 2
        assert np.all([g["device"] == 1 for g in p.map_layout["groups"]])
    finally:
        p.close()


def test_close_stops_the_writer():
    p = MemoryPanel.from_snapshot(_snap(1))
    assert p.flush()
    names = {t.name for t in threading.enumerate()}
    assert any(n.startswith("gpumemviz-panel") for n in names)
    p.close()
    assert p._writer._thread is None
    p.show_snapshot(_snap(3))  # a listener still attached after close: ignored, no new thread
    assert p._writer._thread is None and p.flush(1)


def test_a_sample_shows_its_own_device(panel):
    segs = _small_segs((0, 1))
    both = Snapshot.from_torch(segs)
    panel.push_sample(Sample(time=0.0, device=1, stats=None, segments=both))
    assert panel.flush()
    assert [g["device"] for g in panel.map_layout["groups"]] == [1]


def test_stats_only_samples_keep_the_figures_of_the_segments_shown(panel):
    """Issue 29: the header shows one moment. A stats-only tick does not mix its totals into
    the figures of the segments shown (they would no longer add up); it rides along with its
    time."""
    stats = MemoryStats.from_torch(
        {"allocated_bytes.all.current": 6 * MiB, "reserved_bytes.all.current": 20 * MiB}
    )
    panel.push_sample(Sample(time=0.0, device=0, stats=stats, segments=_snap(3), source_label="x"))
    assert panel.flush()
    later = MemoryStats.from_torch(
        {"allocated_bytes.all.current": 8 * MiB, "reserved_bytes.all.current": 20 * MiB}
    )
    panel.push_sample(Sample(time=1.0, device=0, stats=later, segments_note="not due"))
    assert panel.flush()
    h = panel.header
    assert h["allocated"] == 6 * MiB and h["segments_time"] == 0.0  # the segments shown
    assert h["allocated"] + h["pending_free"] + h["free"] == h["reserved"]
    assert (h["stats_allocated"], h["stats_reserved"], h["stats_time"]) == (8 * MiB, 20 * MiB, 1.0)
    assert panel.map_layout["n_rows"] == 1 and panel.status == "x"


def test_views_report_what_the_browser_shows(panel):
    panel.show_snapshot(_snap(1))
    panel._handle_custom_msg({"kind": "view", "view": "a", "first": 0, "count": 7, "cells": 99}, [])
    assert panel.flush()
    assert panel.views == {"a": {"first": 0, "count": 7, "cells": 99}}
    panel._handle_custom_msg({"kind": "close", "view": "a"}, [])
    assert panel.flush()
    assert panel.views == {}


# -- following a sampler: monitor(), advice and the OOM verdict ----------------------------------


def _until(pred, timeout=10.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_monitor_follows_its_sampler_and_stops_it_on_close():
    from gpumemviz.analysis.advice import advise
    from gpumemviz.live.sources.simulated import SimulatedSource
    from gpumemviz.widget import monitor

    src = SimulatedSource("training", autostart=False)
    src.step(3000)  # frozen from here on: the samples must match this state
    want = src.sample()
    panel = monitor(source=src, interval=0.05)
    sampler = panel.sampler
    try:
        assert sampler.running
        assert _until(lambda: panel.header.get("segments") == want.segments.n_segments)
        assert panel.flush()
        assert panel.header["allocated"] == want.stats.allocated
        assert panel.header["nvml_total"] == want.nvml.total
        assert panel.title == want.device_info.name and panel.demo
        expected = advise(
            want.segments,
            want.device_info.allocator_settings or None,
            want.stats,
            device_total=want.device_info.total_memory,
            device=0,
        )
        assert expected  # this state is fragmented: the header has lines to show
        assert [a["message"] for a in _advice(panel)] == [a.message for a in expected]
        # live, no trace: the panel says its advice is unchecked
        assert [a["message"] for a in panel.advice if a["kind"] == "note"] == [LIVE_UNCHECKED]
        assert panel.oom == {}
    finally:
        panel.close()
    assert not sampler.running  # a sampler made for one panel stops with it
    assert panel.push_sample not in sampler._listeners


def test_advice_follows_the_last_state_when_samples_stop_within_the_throttle(panel):
    """Two samples inside one advice interval (a seek, then a pause): the lines end on the
    second state's advice, not on the first one's."""
    from gpumemviz.analysis.advice import advise
    from gpumemviz.live.sources.simulated import SimulatedSource

    src = SimulatedSource("training", autostart=False)
    src.step(5)
    first = src.sample()
    src.step(3000)
    second = src.sample()

    def expected(sample):
        return [
            a.message
            for a in advise(
                sample.segments,
                sample.device_info.allocator_settings or None,
                sample.stats,
                device_total=sample.device_info.total_memory,
                device=0,
            )
        ]

    assert expected(first) != expected(second)
    panel.push_sample(first)
    assert panel.flush()
    assert [a["message"] for a in _advice(panel)] == expected(first)
    panel.push_sample(second)  # inside the interval: throttled
    assert panel.flush()
    assert panel.header["allocated"] == second.stats.allocated
    want = expected(second)
    assert _until(lambda: [a["message"] for a in _advice(panel)] == want, 5 * panel.ADVICE_EVERY_S)


def test_an_oom_sample_shows_its_verdict(panel):
    from gpumemviz.live.sources.simulated import SimulatedSource

    src = SimulatedSource("training", autostart=False)
    src.step(100_000)
    assert src.ooms, "the training workload runs out of memory near its end"
    event = src.ooms[-1]  # judged by the source where it ran out, as its sampler gets it
    panel.push_sample(src.oom_sample(event))
    assert panel.flush()
    assert panel.oom["cause"] == event.cause == "fragmentation"
    assert panel.oom["explanation"] == event.explanation
    assert panel.oom["alloc_size"] == event.alloc_size
    assert panel.map_layout["n_rows"] == len(event.snapshot["segments"])
    assert {a["kind"] for a in panel.advice} >= {"expandable_segments"}
    assert panel.timeline.marks()[-1] == {
        "t": event.time,
        "label": "OOM (fragmentation)",
        "kind": "oom",
    }


def test_monitor_uses_the_shared_sampler_and_its_interval():
    from gpumemviz.live.shared import shared
    from gpumemviz.widget import monitor

    sampler = shared(0)
    before = sampler.interval
    a = monitor(0, interval=0.2)
    b = monitor(0, interval=0.2)
    try:
        assert a.sampler is b.sampler is sampler and sampler.running
        assert sampler.interval == 0.2 and sampler.read_timeout == 2.0
        assert _until(lambda: a.header.get("reserved") is not None)
    finally:
        a.close()
        assert sampler.running  # shared: another panel still follows it
        b.close()
        sampler.stop()
        sampler.interval = before


def test_an_attached_panel_shows_the_newest_state_at_once(panel):
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.simulated import SimulatedSource

    src = SimulatedSource("training", autostart=False)
    src.step(2000)
    sampler = Sampler(src)
    sampler.sample_once(segments=True)
    panel.attach(sampler)  # not started: the history alone fills the panel
    assert panel.flush()
    assert panel.map_layout["n_rows"] == src.sample().segments.n_segments


def test_timeline_grows_when_figures_move_and_marks_reach_every_panel():
    import gpumemviz
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.simulated import SimulatedSource

    src = SimulatedSource("training", autostart=False)
    src.step(1000)
    sampler = Sampler(src)
    panel = MemoryPanel()
    other = MemoryPanel()
    panel.attach(sampler, owned=True)
    try:
        sampler.sample_once(segments=True)
        sampler.sample_once(segments=True)  # same figures: no new point
        assert panel.flush() and panel.timeline.count == 1
        src.step(500)
        want = src.sample().stats
        sampler.sample_once(segments=True)
        assert panel.flush() and panel.timeline.count == 2
        point = panel.timeline.since(1)[1][0]
        assert point[1:3] == [want.allocated, want.reserved]
        assert point[3] == src.sample().nvml.used and point[4] == 512 << 20
        assert point[5] == round(panel.header["fragmentation"], 4)
        gpumemviz.mark("epoch 3")
        for p in (panel, other):
            assert [m["label"] for m in p.timeline.marks()] == ["epoch 3"]
    finally:
        panel.close()
        other.close()


def test_header_says_what_stays_after_empty_cache_from_the_report(recorded_path, recorded_dict):
    """One "stuck" figure: the fragmentation report's free_stuck for the device shown, not the
    painted slivers nor torch's inactive_split_bytes (they differ on expandable segments)."""
    from gpumemviz.analysis.fragmentation import fragmentation

    snap = Snapshot.from_torch(recorded_dict)
    device = int(snap.segments.device[0]) if len(snap.segments.device) else 0
    report = fragmentation(snap)
    p = MemoryPanel.from_snapshot(snap, device=device)
    try:
        assert p.flush()
        assert "free_trapped" not in p.header
        assert p.header["free_stuck"] == report.devices[device].free_stuck
        figs = report.devices[device]
        assert p.header["free_stuck"] == figs.free + figs.pending_free - figs.releasable
    finally:
        p.close()


def test_export_writes_the_live_source_state(panel, tmp_path):
    """panel.export: the source's own export, written as a protocol-4 torch pickle
    that gpumemviz and torch's _memory_viz read back."""
    from torch.cuda import _memory_viz

    from gpumemviz.io import load_snapshot
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.simulated import SimulatedSource

    src = SimulatedSource("training", autostart=False)
    src.step(1500)
    sampler = Sampler(src)
    sampler.sample_once(segments=True)
    panel.attach(sampler)
    path = panel.export(tmp_path / "oom.pickle")
    assert path == tmp_path / "oom.pickle" and path.read_bytes()[:2] == b"\x80\x04"
    written = load_snapshot(path)
    assert written.n_segments == src.sample().segments.n_segments > 0
    assert np.array_equal(written.blocks.size, src.sample().segments.blocks.size)
    assert _memory_viz.segsum(_read(path))  # torch's own reader takes it


def _recorded(name: str):
    """`real:<file name>` (shipped, or CI-only: skips in one line) or `standin:<short name>`."""
    from conftest import real_file, standin_file

    kind, _, rest = name.partition(":")
    return real_file(rest) if kind == "real" else standin_file(rest)


@pytest.mark.parametrize(
    "name",
    [
        "real:Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle",
        "standin:training_10k",
        "real:kkaitlyn111__cs336-a2-systems__memory_2.7b_forward.pickle",  # CI-only
    ],
    ids=["Wedsonlin", "standin:training_10k", "kkaitlyn111"],
)
def test_export_of_a_fixed_snapshot_can_redact_paths(tmp_path, name):
    from gpumemviz.io import load_snapshot

    src = _recorded(name)
    p = MemoryPanel.from_snapshot(src)
    try:
        assert p.flush()
        plain = p.export(tmp_path / "plain.pickle")
        red = p.export(tmp_path / "red.pickle", redact_paths=True)
    finally:
        p.close()
    assert b"/home/" in plain.read_bytes()
    assert b"/home/" not in red.read_bytes() and b"~user" in red.read_bytes()
    a, b = load_snapshot(plain), load_snapshot(red)
    assert np.array_equal(a.blocks.size, b.blocks.size) and a.n_segments == b.n_segments


def test_export_with_nothing_shown_says_so(panel, tmp_path):
    with pytest.raises(ValueError, match="nothing shown yet: nothing to export"):
        panel.export(tmp_path / "x.pickle")
    assert not (tmp_path / "x.pickle").exists()


@pytest.mark.parametrize(
    ("name", "device", "bucketed", "n_marks"),
    [
        # 2,515 entries on device 3 (one point each), twelve nccl scopes inside the run
        ("real:THUDM__slime__init_model_mempool.pickle", 3, False, 24),
        # 10,000 entries in at most 4,000 points; the forward, backward and optimizer scopes
        # of its window
        ("standin:training_10k", 0, True, 136),
        # CI-only: 6,445 entries on device 0 and two scopes
        ("real:Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle", 0, True, 4),
    ],
    ids=["THUDM", "standin:training_10k", "Constructor-Sun"],
)
def test_a_replay_timeline_is_the_recorded_run_with_its_annotations(
    panel, sent, name, device, bucketed, n_marks
):
    """Replay mode: the timeline holds the trace's own times and replayed figures (peaks and
    troughs kept when bucketed), and record_function scopes (external_annotations) as markers."""
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.playback import PlaybackSource
    from gpumemviz.render.timeline import MAX_POINTS

    path = _recorded(name)
    raw = _read(path)  # independent of gpumemviz's loader
    src = PlaybackSource(path, device=device, loop=False)
    sampler = Sampler(src)
    src.seek(10)
    sampler.sample_once(segments=True)
    panel.attach(sampler, owned=True)
    assert panel.flush()
    first, points = panel.timeline.since(0)
    trace = raw["device_traces"][device]
    assert first == 0 and (len(trace) > MAX_POINTS) == bucketed
    if bucketed:  # the envelope: each bucket's highest and lowest entries, in order
        assert MAX_POINTS // 4 <= len(points) <= MAX_POINTS
    else:
        assert len(points) == len(trace)
    times = {e["time_us"] / 1e6 for e in trace}
    assert all(p[0] in times for p in points)
    assert [p[0] for p in points] == sorted(p[0] for p in points)
    assert max(p[1] for p in points) == int(src.recording.allocated.max())  # the peak survives
    assert max(p[2] for p in points) == int(src.recording.reserved.max())
    assert min(p[1] for p in points) == int(src.recording.allocated.min())  # so does the trough
    notes = [a for a in raw["external_annotations"] if a["device"] == device]
    marks = panel.timeline.marks()
    assert len(marks) == len(notes) == n_marks
    assert all(points[0][0] <= m["t"] <= points[-1][0] for m in marks)  # inside the run: drawn
    assert [(m["t"], m["label"]) for m in marks] == [(a["time_us"] / 1e6, a["name"]) for a in notes]
    assert [m["kind"] for m in marks] == [
        "annotation" if a["stage"] == "START" else "cell" for a in notes
    ]
    reset = [c for c, _, _ in sent if c.get("kind") == "timeline" and c.get("reset")]
    assert reset and reset[-1]["marks"] == marks and len(reset[-1]["points"]) == len(points)
    sampler.sample_once(segments=True)  # replayed samples move the map, not the timeline
    assert panel.flush()
    assert panel.timeline.count == len(points)


def test_a_newer_sample_never_drops_a_waiting_oom(panel):
    """The sampler publishes an OOM sample and, before the writer takes it, another sample
    arrives: the map shows the newer one, the OOM verdict and marker still land."""
    from gpumemviz.live.sources.simulated import SimulatedSource

    src = SimulatedSource("training", autostart=False)
    src.step(100_000)
    event = src.ooms[-1]  # judged by the source
    gate = threading.Event()
    panel._writer.submit(gate.wait)  # the writer is busy: both samples wait in _offer
    panel.push_sample(src.oom_sample(event))
    newer = src.sample()
    panel.push_sample(newer)
    gate.set()
    assert panel.flush()
    assert panel.oom["cause"] == event.cause and panel.oom["alloc_size"] == event.alloc_size
    assert panel.timeline.marks()[-1]["kind"] == "oom"
    assert panel.map_layout["n_rows"] == newer.segments.n_segments  # the newest state is drawn


def test_header_releasable_and_stuck_add_up_to_free_plus_pending():
    """verl's recording has pending frees in segments holding nothing allocated: empty_cache
    syncs them and returns those segments whole, so the header's releasable counts them and
    releasable + stuck == free + pending (the painted green alone would not)."""
    from conftest import real_file, unallocated_bytes
    from gpumemviz import load_snapshot
    from gpumemviz.analysis.fragmentation import fragmentation
    from gpumemviz.widget import MemoryPanel

    path = real_file("volcengine__verl__mem_mempools.pickle")
    raw = _read(path)
    assert not any(s["is_expandable"] for s in raw["segments"])
    pending_in_empty = unallocated_bytes(raw, "active_pending_free")
    assert pending_in_empty > 0  # the case this test is about
    panel = MemoryPanel.from_snapshot(path)
    try:
        assert panel.flush()
        h = panel.header
        assert h["free_releasable"] + h["free_stuck"] == h["free"] + h["pending_free"]
        assert h["free_releasable"] == fragmentation(path).releasable
        painted = build_rows(load_snapshot(path)).totals()["free_releasable"]
        assert h["free_releasable"] == painted + pending_in_empty
    finally:
        panel.close()


def test_holders_trait_and_a_click_on_a_holder_answers_its_blocks(panel, sent):
    """The ``holders`` trait is the findings' holders (top rows and a rest summing to
    allocated); a ``holder_blocks`` message is answered, from the writer thread, with where the
    holder's blocks lie in the map; an index past the rows gets empty marks."""
    panel.show_snapshot(_snap(3))
    assert panel.flush()
    assert panel.holders["allocated"] == 6 * MiB
    assert panel.holders["by"]["stream"]["rows"] == [
        {"key": 0, "label": "stream 0", "bytes": 6 * MiB, "count": 3}
    ]
    for index in (0, 5):
        msg = {"kind": "holder_blocks", "view": "v", "by": "stream", "index": index}
        panel._handle_custom_msg(msg, [])
    assert panel.flush()
    got = [(c, t) for c, _b, t in sent if c.get("kind") == "holder_blocks"]
    assert len(got) == 2 and all(t.startswith("gpumemviz-panel") for _c, t in got)
    first, past = got[0][0], got[1][0]
    assert (first["row"], first["offset"], first["size"]) == (
        [0, 0, 0],
        [0, 2 * MiB, 4 * MiB],
        [2 * MiB] * 3,
    )
    assert (first["bytes"], first["count"], first["missing"]) == (6 * MiB, 3, 0)
    assert (past["row"], past["bytes"]) == ([], 0)
