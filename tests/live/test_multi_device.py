"""Every device in one panel: strips from a replay, a state file, simulated devices and the
magic; a replay's devices move together; the terminal and `gpumemviz inspect` print each one."""

from __future__ import annotations

import json
import time

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from conftest import real_file, standin_file
from gpumemviz.cli import main
from gpumemviz.io import load_snapshot
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.playback import PlaybackSource
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.render.strips import snapshot_summaries
from gpumemviz.render.timeline import entry_at_time, trace_times
from gpumemviz.render.wire import FIRST_FRAME_LIMIT
from gpumemviz.widget import MemoryPanel, monitor
from gpumemviz.widget.devices import BY_SHARE, BY_TIME
from gpumemviz.widget.magics import _MAGICS

REAL_3DEV = "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"


def _recordings():
    """The stand-in always; the real recording where CI has it (skipped with one line else)."""
    return [
        pytest.param(lambda: standin_file("expandable_oom_3dev"), id="standin"),
        pytest.param(lambda: real_file(REAL_3DEV), id="real"),
    ]


def _replay_panel(raw, **kw):
    samplers = {}
    for d in (0, 1, 2):
        src = PlaybackSource(raw, device=d, loop=False)
        src.seek(src.n - 1)
        samplers[d] = Sampler(src)
    panel = MemoryPanel()
    panel.attach_devices(samplers, owned=True, **kw)
    for s in samplers.values():
        s.sample_once(segments=True)
    assert panel.flush()
    assert panel.wait_checked(60)  # the file's findings: analysed off the kernel's thread
    return panel, samplers


def test_the_standin_has_expandable_segments_on_three_devices_and_an_oom_on_device_1():
    raw = load_snapshot(standin_file("expandable_oom_3dev")).to_torch()
    devices = {s["device"] for s in raw["segments"]}
    assert devices == {0, 1, 2}
    assert all(s["is_expandable"] for s in raw["segments"])
    ooms = [d for d, t in enumerate(raw["device_traces"]) for e in t if e["action"] == "oom"]
    assert ooms == [1]
    assert all(len(raw["device_traces"][d]) > 100 for d in (0, 1, 2))


@pytest.mark.parametrize("path", _recordings())
def test_a_replay_of_three_devices_shows_each_with_the_oom_on_device_1(path):
    raw = load_snapshot(path()).to_torch()
    panel, _ = _replay_panel(raw)
    try:
        assert panel.shown_devices == (0, 1, 2)
        strips = panel.strips
        assert [s["device"] for s in strips["strips"]] == [0, 1, 2]
        assert [s["ooms"] for s in strips["strips"]] == [0, 1, 0]
        assert strips["selected"] == 1  # the device the OOM happened on is drawn in full
        assert {g["device"] for g in panel.map_layout["groups"]} == {1}
        assert panel.header["num_ooms"] == 1
        assert strips["totals"]["ooms"] == 1 and strips["note"] == BY_TIME
        assert all(len(s["bins"]) == 64 and s["reserved"] > 0 for s in strips["strips"])
        # the verdict of the recorded OOM, judged on the state at that entry, names its device
        assert panel.oom["device"] == 1 and panel.oom["cause"] in ("capacity", "fragmentation")
        assert panel.oom["explanation"] and panel.title.startswith("cuda:1 · ")
        assert panel.errors == ()
    finally:
        panel.close()


def test_seek_moves_every_device_to_the_same_recorded_time():
    raw = load_snapshot(standin_file("expandable_oom_3dev")).to_torch()
    panel, samplers = _replay_panel(raw)
    try:
        reply = panel.command("seek", index=400)
        assert reply["ok"], reply
        t = trace_times(raw["device_traces"][1])[400]
        for d in (0, 2):
            want = entry_at_time(trace_times(raw["device_traces"][d]), t)
            assert samplers[d].source.position == want
        assert panel.flush()
        # the strips follow: before the OOM entry, device 1 has recorded none yet
        assert [s["ooms"] for s in panel.strips["strips"]] == [0, 0, 0]
        assert panel.oom == {}
        reply = panel.command("select", value=2)
        assert reply["ok"] and panel.flush()
        assert panel.strips["selected"] == 2
        assert {g["device"] for g in panel.map_layout["groups"]} == {2}
        bad = panel.command("select", value=5)
        assert not bad["ok"] and "no strip of device 5" in bad["text"]
    finally:
        panel.close()
    assert not any(s.running for s in samplers.values())


def test_a_trace_without_times_moves_devices_by_their_share_of_entries_and_says_so():
    raw = load_snapshot(standin_file("expandable_oom_3dev")).to_torch()
    for t in raw["device_traces"]:
        for e in t:
            e.pop("time_us", None)
    panel, samplers = _replay_panel(raw, selected=0)
    try:
        assert panel.strips["note"] == BY_SHARE
        n0 = samplers[0].source.n
        assert panel.command("seek", index=n0 // 2 - 1)["ok"]
        for d in (1, 2):
            n = samplers[d].source.n
            assert samplers[d].source.position == round((n0 // 2) / n0 * n) - 1
    finally:
        panel.close()


def test_a_state_file_of_several_devices_shows_a_strip_each_and_selects_one():
    snap = load_snapshot(standin_file("expandable_oom_3dev"))
    panel = MemoryPanel.from_snapshot(snap)
    try:
        assert panel.flush()
        assert panel.shown_devices == (0, 1, 2)
        assert panel.strips["selected"] is None  # the map shows every device, as before
        assert {g["device"] for g in panel.map_layout["groups"]} == {0, 1, 2}
        assert [s["ooms"] for s in panel.strips["strips"]] == [0, 1, 0]
        panel.select_device(1)
        assert panel.flush()
        assert {g["device"] for g in panel.map_layout["groups"]} == {1}
        assert panel.strips["selected"] == 1
    finally:
        panel.close()
    # one device: no strips, the panel is what it was
    one = MemoryPanel.from_snapshot([s for s in snap.to_torch()["segments"] if s["device"] == 0])
    try:
        assert one.flush() and one.strips == {} and one.shown_devices == ()
    finally:
        one.close()


def test_eight_simulated_devices_fit_the_frame_limits():
    samplers = {d: Sampler(SimulatedSource(device=d, autostart=False)) for d in range(8)}
    for d, s in samplers.items():
        s.source.step(300 + 100 * d)
    panel = MemoryPanel()
    panel.attach_devices(samplers, owned=True, selected=0)
    try:
        for s in samplers.values():
            s.sample_once(segments=True)
        assert panel.flush()
        assert panel.shown_devices == tuple(range(8))
        assert "strips" in panel.keys  # a synced trait: it travels to the browser
        assert len({json.dumps(s["bins"]) for s in panel.strips["strips"]}) > 1
        assert len(json.dumps(panel.strips)) < 16 << 10
        assert panel.wire_stats["max_bytes"] <= FIRST_FRAME_LIMIT
    finally:
        panel.close()


def test_monitor_all_refuses_a_source_and_a_bad_device():
    with pytest.raises(ValueError, match="give no source"):
        monitor(device="all", source=SimulatedSource(autostart=False))
    with pytest.raises(ValueError, match="device must be an index or 'all'"):
        monitor(device="first")


def test_the_strip_summaries_of_a_snapshot_match_its_devices():
    snap = load_snapshot(standin_file("expandable_oom_3dev"))
    sums = snapshot_summaries(snap)
    assert [(s["device"], s["ooms"]) for s in sums] == [(0, 0), (1, 1), (2, 0)]
    assert sum(s["reserved"] for s in sums) == int(snap.segments.total_size.sum())


# the magic and the command line --------------------------------------------------------------
@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "gpumemviz")
    yield sh
    sh.run_line_magic("unload_ext", "gpumemviz")
    InteractiveShell.clear_instance()


@pytest.mark.parametrize("path", _recordings())
def test_the_terminal_magic_prints_every_replayed_device(shell, capsys, path):
    shell.run_line_magic("gpumemviz", f"--replay {path()}")
    out = capsys.readouterr().out
    assert out.startswith("gpumemviz: 3 devices (0, 1, 2) · OOMs: cuda:1 (1)")
    for d in (0, 1, 2):
        assert f"gpumemviz · cuda:{d} · recorded trace" in out
    assert out.count("OOMs 1") == 1
    shell.run_line_magic("gpumemviz", f"--replay {path()} --device 2")  # one device, named
    out = capsys.readouterr().out
    assert "cuda:2 · recorded trace" in out and "cuda:1" not in out


def test_the_magic_shows_simulated_devices_all_in_one_panel(shell, capsys):
    magics = _MAGICS[id(shell)]
    magics.widgets = True
    panel = shell.run_line_magic("gpumemviz", "--demo training --device all --devices 3")
    deadline = time.monotonic() + 10
    while len(panel.strips.get("strips") or ()) < 3 and time.monotonic() < deadline:
        panel.flush()
        time.sleep(0.05)
    assert panel.shown_devices == (0, 1, 2)
    assert [s["label"] for s in panel.strips["strips"]] == ["cuda:0", "cuda:1", "cuda:2"]
    first = panel.sampler
    again = shell.run_line_magic("gpumemviz", "--demo training --device all --devices 3")
    assert again.sampler is first and panel.sampler is None  # same feeds, a new panel
    shell.run_line_magic("gpumemviz", "--device all stop")
    assert "stopped sampling devices 0, 1, 2" in capsys.readouterr().out
    assert not any(s.running for s in magics.multi.samplers.values())
    with pytest.raises(UsageError, match="--devices N is for --demo WORKLOAD --device all"):
        shell.run_line_magic("gpumemviz", "--devices 2")
    with pytest.raises(UsageError, match="export acts on one device"):
        shell.run_line_magic("gpumemviz", "--device all export x.pickle")
    with pytest.raises(UsageError, match="not a device index or all"):
        shell.run_line_magic("gpumemviz", "--device most")


def test_inspect_prints_every_device_and_the_oom_on_device_1(capsys):
    assert main(["inspect", "--no-replay", str(standin_file("expandable_oom_3dev"))]) == 0
    out = capsys.readouterr().out
    assert "3 device(s)" in out
    blocks = out.split("\ndevice ")
    assert [b.split(":")[0] for b in blocks[1:4]] == ["0", "1", "2"]
    assert "OOM on cuda:1" in blocks[2]
    assert "OOM on" not in blocks[1] + blocks[3].split("all")[0]


def test_a_panel_of_shared_devices_switches_by_strip_not_by_the_device_switcher():
    from gpumemviz.live.shared import shared

    panel = MemoryPanel()
    panel.attach_devices({0: shared(0), 1: shared(1)})
    try:
        assert panel.flush()
        assert panel.controls["devices"] == [] and panel.shown_devices == (0, 1)
        assert panel.command("select", value=1)["ok"] and panel.flush()
        assert panel.sampler is shared(1) and panel.strips["selected"] == 1
    finally:
        panel.close()
