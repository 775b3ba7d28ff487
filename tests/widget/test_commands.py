"""The panel's commands (what its buttons do), run with real sources and a real panel."""

from __future__ import annotations

import pytest

from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.io import load_snapshot
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.widget import MemoryPanel
from gpumemviz.widget.commands import RESET_PEAKS_TEXT


@pytest.fixture
def live():
    """A panel on a paused-in-time simulated training run (driven by hand, so states are known)."""
    src = SimulatedSource("training", autostart=False)
    src.step(6000)
    sampler = Sampler(src, interval=0.2)
    panel = MemoryPanel(subshell=False)
    panel.attach(sampler, owned=True)
    sampler.sample_once(segments=True)
    assert panel.flush()
    yield panel, src, sampler
    panel.close()


def test_empty_cache_reports_bytes_released_and_redraws(live):
    panel, _, _ = live
    before = panel.header["reserved"]
    cached_whole = panel.header["free_releasable"]
    reply = panel.command("empty_cache")
    assert reply["ok"], reply["text"]
    assert reply["released"] == {0: cached_whole}  # whole free segments go back, nothing else
    assert panel.flush()
    assert panel.header["reserved"] == before - cached_whole
    assert panel.header["free_releasable"] == 0
    assert reply["text"].startswith("empty_cache released cuda:0 ")


def test_export_writes_a_protocol_4_pickle_beside_the_notebook(live, tmp_path, monkeypatch):
    panel, src, _ = live
    monkeypatch.chdir(tmp_path)
    reply = panel.command("export")
    assert reply["ok"], reply["text"]
    path = tmp_path / reply["text"].split()[1]
    assert path.read_bytes()[:2] == b"\x80\x04"
    got = load_snapshot(path)
    want = load_snapshot(src.export())
    assert got.n_segments == want.n_segments and got.n_blocks == want.n_blocks
    assert (got.blocks.size == want.blocks.size).all()
    assert reply["url"] is None  # no Jupyter server here: the path, no link


def test_fit_answers_as_can_fit_does(live):
    panel, src, _ = live
    snap = src.sample().segments
    free = src.sample().nvml.free
    for text in ("512MB", "2GiB", "40GiB", str(3 << 20)):
        reply = panel.command("fit", value=text)
        assert reply["ok"], reply["text"]
        from gpumemviz.snapshot.units import parse_size

        want = fragmentation(snap).can_fit(parse_size(text), device=0, device_free=free)
        assert reply["verdict"] == want.verdict
        assert reply["text"].endswith(str(want))
    bad = panel.command("fit", value="lots")
    assert not bad["ok"] and "lots" in bad["text"]


def test_pause_resume_and_interval_drive_the_sampler(live):
    panel, _, sampler = live
    assert panel.command("pause")["ok"] and sampler.paused
    assert panel.flush() and panel.controls["paused"] is True
    assert panel.command("resume")["ok"] and not sampler.paused
    assert panel.command("interval", value=1)["ok"] and sampler.interval == 1.0
    assert not panel.command("interval", value=-1)["ok"]
    assert panel.flush() and panel.controls["interval"] == 1.0


def test_commands_a_source_cannot_do_say_so(live):
    panel, *_ = live
    for name, args in (("seek", {"index": 3}), ("record_history", {"on": True})):
        reply = panel.command(name, **args)
        assert not reply["ok"] and "simulated: training (demo data) cannot" in reply["text"]
    assert not panel.command("frobnicate")["ok"]


def test_a_fixed_snapshot_panel_exports_and_fits_but_has_no_sampler(recorded_dict, tmp_path):
    panel = MemoryPanel.from_snapshot(recorded_dict)
    try:
        assert panel.flush()
        assert not panel.command("pause")["ok"]
        fit = panel.command("fit", value="1MiB")
        assert fit["ok"], fit["text"]
    finally:
        panel.close()


@pytest.mark.parametrize(
    "name",
    [
        "real:Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle",
        "standin:training_10k",  # starts mid-run: seeks land on reconstructed states
    ],
    ids=["Wedsonlin", "standin:training_10k"],
)
def test_replay_seek_moves_the_map_to_the_recorded_state(tmp_path, name):
    from gpumemviz.live.sources.playback import PlaybackSource

    src = PlaybackSource(_recorded(name), loop=False)
    sampler = Sampler(src)
    panel = MemoryPanel(subshell=False)
    panel.attach(sampler, owned=True)
    try:
        k = src.n // 3
        reply = panel.command("seek", index=k)
        assert reply["ok"], reply["text"]
        assert panel.flush()
        state = src.recording.snapshot_at(k)
        assert panel.map_layout["n_rows"] == len(state["segments"])
        assert panel.header["reserved"] == int(src.recording.reserved[k])
        replay = panel.controls["replay"]
        assert (replay["n"], replay["position"], replay["times"]) == (src.n, k, True)
    finally:
        panel.close()


def _recorded(name: str):
    """`real:<file name>` (shipped, or CI-only: skips in one line) or `standin:<short name>`."""
    from conftest import real_file, standin_file

    kind, _, rest = name.partition(":")
    return real_file(rest) if kind == "real" else standin_file(rest)


def _replay_panel(name: str):
    from conftest import read_real
    from gpumemviz.live.sources.playback import PlaybackSource

    path = _recorded(name)
    raw = read_real(path)
    src = PlaybackSource(path, loop=False)
    panel = MemoryPanel(subshell=False)
    panel.attach(Sampler(src), owned=True)
    return panel, src, raw["device_traces"][src.device]


@pytest.mark.parametrize(
    "name",
    [
        "real:silmont2000__assignment2-systems__memory_forward_fp32_128.pickle",
        "standin:training_10k",
        "real:kkaitlyn111__cs336-a2-systems__memory_2.7b_forward.pickle",  # CI-only
    ],
    ids=["silmont2000", "standin:training_10k", "kkaitlyn111"],
)
def test_replay_seek_by_time_lands_on_the_event_at_or_before_that_time(name):
    """time_us read straight from the file (not through gpumemviz): a time between two entries'
    times shows the earlier entry; its time and the trace's span reach the controls."""
    panel, src, trace = _replay_panel(name)
    try:
        times = [e["time_us"] for e in trace]
        assert len(times) == src.n
        # entries whose next entry comes at least 2 µs later: a time strictly between is theirs
        gaps = [i for i in range(len(times) - 1) if times[i + 1] - times[i] >= 2]
        for k in (gaps[len(gaps) // 3], gaps[-1]):
            t = times[k] + (times[k + 1] - times[k]) // 2
            reply = panel.command("seek", time_us=t)
            assert reply["ok"], reply["text"]
            assert reply["index"] == max(i for i, x in enumerate(times) if x <= t) == k
            assert panel.flush()
            replay = panel.controls["replay"]
            assert replay["position"] == k and replay["time_us"] == times[k]
            assert (replay["t_first"], replay["t_last"]) == (times[0], times[-1])
            assert panel.header["reserved"] == int(src.recording.reserved[k])
        before = panel.command("seek", time_us=times[0] - 1)
        assert before["ok"] and before["index"] == -1
        assert panel.flush() and panel.controls["replay"]["time_us"] is None
    finally:
        panel.close()


@pytest.mark.parametrize(
    "name",
    ["standin:streams10", "real:Maphsge4__select_n__snapshot_10streams.pickle"],  # real: CI-only
    ids=["standin:streams10", "Maphsge4"],
)
def test_a_trace_without_times_is_events_only(name):
    panel, src, trace = _replay_panel(name)
    try:
        assert not any(e.get("time_us") for e in trace)
        assert panel.flush() and panel.controls["replay"]["times"] is False
        reply = panel.command("seek", time_us=1000)
        assert not reply["ok"]
        assert reply["text"] == "this trace has no recorded times (torch < 2.2): events only"
        assert panel.command("seek", index=src.n // 2)["ok"]  # events still seek
    finally:
        panel.close()


def test_a_browser_command_message_is_answered_by_the_writer(live, monkeypatch):
    panel, *_ = live
    sent = []
    monkeypatch.setattr(panel, "send", lambda content, buffers=None: sent.append(content))
    panel._handle_custom_msg({"kind": "command", "id": "c1", "name": "pause", "args": {}}, [])
    assert panel.flush()
    assert sent[-1]["kind"] == "reply" and sent[-1]["id"] == "c1" and sent[-1]["ok"]
    assert sent[-1]["thread"] == panel.command_log[-1]["thread"]


def test_the_device_switcher_follows_the_other_devices_shared_sampler(monkeypatch):
    """Without CUDA each device's shared sampler runs its own simulation; switching re-attaches."""
    from gpumemviz.live.shared import shared
    from gpumemviz.widget import monitor

    panel = monitor(0, interval=0.2)
    monkeypatch.setattr(panel, "devices", lambda: [0, 1])  # as torch.cuda would list two GPUs
    try:
        reply = panel.command("device", value=1)
        assert reply["ok"], reply["text"]
        assert panel.sampler is shared(1) and shared(1).running
        assert panel.push_sample not in shared(0)._listeners
        assert shared(1).interval == 0.2
        assert not panel.command("device", value=7)["ok"]
        assert panel.flush() and panel.controls["device"] == 1
    finally:
        panel.close()
        for d in (0, 1):
            shared(d).stop()


def test_reset_peaks_starts_the_peaks_again_from_the_current_figures(live):
    panel, src, _ = live
    assert panel.controls["can_reset_peaks"]
    for _ in range(100):  # until the workload has freed below its peak
        if src.sample().stats.peak_allocated > src.sample().stats.allocated:
            break
        src.step(50)
    assert src.sample().stats.peak_allocated > src.sample().stats.allocated
    reply = panel.command("reset_peaks")
    assert reply["ok"] and reply["text"] == RESET_PEAKS_TEXT
    st = src.sample().stats
    assert st.peak_allocated == st.allocated and st.peak_reserved == st.reserved
    src.step(200)
    st2 = src.sample().stats
    assert st2.peak_allocated >= st2.allocated  # and they follow the run again


def test_reset_peaks_on_torch_without_cuda_says_waiting_and_leaves_cuda_alone():
    import torch

    from gpumemviz.live.sources import SourceCommandError
    from gpumemviz.live.sources.torch_cuda import TorchCudaSource

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    src = TorchCudaSource(0, nvml=False)
    with pytest.raises(SourceCommandError, match="cannot reset peaks: waiting for CUDA"):
        src.reset_peaks()
    assert not torch.cuda.is_initialized()


def test_fit_echoes_what_was_typed_and_a_snapshot_panel_counts_its_devices_memory():
    """ "512MB" is decimal: the answer says so ("512 MB = 488.28 MiB"); a panel that knows its
    device's total (an estimate's capacity) answers whether new memory fits, never "unknown"
    with an API hint the browser cannot follow."""
    seg = {
        "device": 0,
        "address": 0,
        "total_size": 20 << 20,
        "stream": 0,
        "blocks": [{"size": 20 << 20, "state": "active_allocated", "requested_size": 20 << 20}],
    }
    plain = MemoryPanel.from_snapshot([seg])
    known = MemoryPanel.from_snapshot([seg], device_total="64MiB")
    try:
        assert plain.flush() and known.flush()
        unknown = plain.command("fit", value="512MB")
        assert unknown["text"].startswith("512 MB = 488.28 MiB: ")
        assert unknown["verdict"] == "room_unknown" and "pass device_free" not in unknown["text"]
        assert plain.command("fit", value="1GiB")["text"].startswith("1 GiB: ")
        fits = known.command("fit", value="40MiB")  # 64 MiB total, 20 reserved: 44 free
        assert fits["verdict"] == "new_segment", fits["text"]
        too_big = known.command("fit", value="50MiB")
        assert too_big["verdict"] not in ("room_unknown", "new_segment"), too_big["text"]
    finally:
        plain.close()
        known.close()
