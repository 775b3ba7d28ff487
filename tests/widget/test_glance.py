"""The panel's ``glance`` trait (issue 30): a bar per device whose parts are the findings'
figures (a replay's: the entry shown); and the timeline after a device change holds only the
chosen device's history (issue 35, item 13)."""

from __future__ import annotations

from conftest import standin_file  # tests/ is on sys.path
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.playback import PlaybackSource
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.render.glance import MEANINGS, glance_set
from gpumemviz.widget import MemoryPanel


def _live(device: int = 0, steps: int = 3000) -> Sampler:
    src = SimulatedSource("training", device=device, autostart=False)
    src.step(steps)
    return Sampler(src)


def test_a_live_panel_draws_its_findings_to_scale_of_the_device():
    sampler = _live()
    panel = MemoryPanel()
    panel.attach(sampler, owned=True)
    try:
        sampler.sample_once(segments=True)
        assert panel.flush()
        found = panel.findings
        assert found is not None
        f = found.figures
        assert panel.glance == glance_set(panel.device_findings, found.device, panel.oom)
        (bar,) = panel.glance["bars"]
        parts = {p["key"]: p["bytes"] for p in bar["parts"]}
        assert bar["scale"] == "device" and bar["total"] == f.device_total
        assert sum(parts.values()) == f.device_total
        assert parts["allocated"] == f.allocated and parts["pending_free"] == f.pending_free
        assert parts["releasable"] + parts["stays"] == f.free_in_reserved
        assert parts["outside"] + parts["headroom"] == f.device_total - f.reserved
        assert parts["outside"] == min(f.non_pytorch or 0, f.device_total - f.reserved)
        assert bar["largest_free"] == f.largest_free
        assert panel.glance["meanings"] == MEANINGS  # each part's hover, sent once
    finally:
        panel.close()


def test_a_file_is_drawn_to_scale_of_reserved_and_says_so():
    seg = {
        "device": 0,
        "address": 0,
        "total_size": 4 << 20,
        "stream": 0,
        "segment_type": "large",
        "blocks": [
            {"size": 1 << 20, "requested_size": 1 << 20, "state": "active_allocated"},
            {"size": 3 << 20, "requested_size": 0, "state": "inactive"},
        ],
    }
    free = {**seg, "address": 8 << 20, "blocks": [{"size": 4 << 20, "state": "inactive"}]}
    panel = MemoryPanel.from_snapshot([seg, free])
    try:
        assert panel.flush()
        (bar,) = panel.glance["bars"]
        parts = {p["key"]: p["bytes"] for p in bar["parts"]}
        assert bar["scale"] == "reserved" and "unknown" in bar["note"]
        assert bar["total"] == 8 << 20 == sum(parts.values())
        assert parts == {
            "allocated": 1 << 20,
            "pending_free": 0,
            "releasable": 4 << 20,
            "stays": 3 << 20,
        }
        assert bar["oom"] is None
    finally:
        panel.close()


def test_after_a_device_change_the_timeline_holds_only_that_devices_points():
    samplers = {d: _live(d, 2000 + 1500 * d) for d in (0, 1)}
    panel = MemoryPanel()
    panel.attach_devices(samplers, owned=True, selected=0)
    try:
        for _ in range(3):
            for s in samplers.values():
                s.source.step(200)
                s.sample_once(segments=True)
        assert panel.flush()
        # a bar per device, each of its own findings' figures
        bars = panel.glance["bars"]
        assert [b["device"] for b in bars] == [0, 1]
        for b in bars:
            f = panel.device_findings[b["device"]].figures
            assert b["reserved"] == f.reserved and b["parts"][0]["bytes"] == f.allocated
        assert bars[0]["reserved"] != bars[1]["reserved"]
        before = panel.timeline.since(0)[1]
        assert before
        panel.select_device(1)
        assert panel.flush()
        # device 0's history is gone: only device 1's newest read, drawn at the change
        newest = samplers[1].history.latest_segments()
        assert [p[1] for p in panel.timeline.since(0)[1]] == [newest.stats.allocated]
        samplers[0].source.step(300)
        samplers[0].sample_once(segments=True)  # the other device keeps sampling
        samplers[1].source.step(300)
        samplers[1].sample_once(segments=True)
        assert panel.flush()
        after = panel.timeline.since(0)[1]
        want = samplers[1].history.latest_segments()
        assert after and after[-1][1] == want.stats.allocated
        assert all(p not in before for p in after)
    finally:
        panel.close()


def test_a_replay_draws_the_entry_shown_not_the_files_final_state():
    src = PlaybackSource(standin_file("training_10k"), device=0, loop=False)
    src.seek(1065)
    sampler = Sampler(src)
    panel = MemoryPanel()
    panel.attach(sampler, owned=True)
    try:
        sampler.sample_once(segments=True)
        assert panel.flush() and panel.wait_checked(60) and panel.flush()
        (bar,) = panel.glance["bars"]
        parts = {p["key"]: p["bytes"] for p in bar["parts"]}
        assert bar["reserved"] == panel.header["reserved"] == sum(parts.values())
        assert parts["allocated"] == panel.header["allocated"]
        found = panel.findings
        assert found is not None and found.figures.reserved != bar["reserved"]  # the final state
        src.seek(src.n - 1)
        sampler.sample_once(segments=True)
        assert panel.flush()
        assert panel.glance["bars"][0]["reserved"] == found.figures.reserved
    finally:
        panel.close()
