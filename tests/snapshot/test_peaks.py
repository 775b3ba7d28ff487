"""gpumemviz's own peaks: a running maximum over samples, resets by others noted, torch's
counters reset only by the panel's button (real simulated allocator, real sampler and panel)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.snapshot.peaks import PeakTracker
from gpumemviz.snapshot.sample import MemoryStats, Sample
from gpumemviz.widget import MemoryPanel
from gpumemviz.widget.commands import RESET_PEAKS_TEXT

SRC = Path(__file__).resolve().parents[2] / "src" / "gpumemviz"


@pytest.fixture
def live():
    """A panel on a simulated training run driven by hand, past its first peak."""
    src = SimulatedSource("training", autostart=False)
    sampler = Sampler(src, interval=0.2)
    panel = MemoryPanel(subshell=False)
    panel.attach(sampler, owned=True)
    for _ in range(60):
        src.step(100)
        sampler.sample_once(segments=False)
    assert panel.flush()
    yield panel, src, sampler
    panel.close()


def _stats_sample(t: float, allocated: int, peak: int, allocations: int) -> Sample:
    stats = MemoryStats.from_torch(
        {
            "allocated_bytes.all.current": allocated,
            "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": 2 * allocated,
            "reserved_bytes.all.peak": 2 * peak,
            "allocation.all.allocated": allocations,
        }
    )
    return Sample(time=t, device=0, stats=stats)


def test_peaks_are_the_running_maximum_of_the_samples(live):
    panel, _, sampler = live
    samples = [s for s in sampler.history.samples() if s.stats is not None]
    peaks = samples[-1].peaks
    assert peaks.allocated == max(s.stats.allocated for s in samples)
    assert peaks.reserved == max(s.stats.reserved for s in samples)
    assert peaks.since == samples[0].time and peaks.torch_resets == 0
    assert panel.header["peak_allocated"] == peaks.allocated
    assert panel.header["peak_reserved"] == peaks.reserved
    # one value shared by the samples until a figure changes
    same = [(a, b) for a, b in itertools.pairwise(samples) if a.peaks == b.peaks]
    assert same and all(a.peaks is b.peaks for a, b in same)


def test_sampling_showing_and_scraping_never_reset_torchs_counters(live):
    _, src, sampler = live
    for _ in range(100):  # until the workload has freed below its peak
        if src.sample().stats.peak_allocated > src.sample().stats.allocated:
            break
        src.step(50)
    torch_peak = src.sample().stats.peak_allocated
    assert torch_peak > src.sample().stats.allocated
    for _ in range(5):
        sampler.sample_once(segments=True)
    from gpumemviz.prometheus.collector import SamplerCollector

    labels = {"rank": "0", "local_rank": "0", "host": "h", "pid": "1"}
    list(SamplerCollector({0: sampler}, labels).collect())
    assert src.sample().stats.peak_allocated == torch_peak


def test_only_the_button_resets_torchs_peak_counters():
    """In the package, the source's reset_peaks is called by Sampler.reset_peaks only, and that
    only by the panel's reset_peaks command; torch's reset only inside the torch source's."""
    callers: dict[str, set[str]] = {"reset_peaks": set(), "reset_peak_memory_stats": set()}
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in callers:
                callers[node.attr].add(path.relative_to(SRC).as_posix())
            if isinstance(node, ast.Constant) and node.value == "reset_peaks":
                callers["reset_peaks"].add(path.relative_to(SRC).as_posix())
    assert callers["reset_peak_memory_stats"] == {"live/sources/torch_cuda.py"}
    # the sampler calls the source's; commands calls the sampler's (and looks the name up)
    assert callers["reset_peaks"] == {
        "live/sampler.py",
        "widget/commands.py",
        "widget/panel_state.py",
    }
    panel_src = (SRC / "widget" / "panel_state.py").read_text()
    assert '"can_reset_peaks": callable(getattr(source, "reset_peaks", None))' in panel_src


def test_someone_elses_reset_is_counted_and_shown_and_the_peaks_stay(live):
    panel, src, sampler = live
    before = sampler.sample_once(segments=True)
    src.reset_peaks()  # what a framework monitor's reset_peak_memory_stats does
    after = sampler.sample_once(segments=True)
    assert after.stats.peak_allocated < before.stats.peak_allocated
    assert after.peaks.torch_resets == 1 and after.peaks.last_torch_reset == after.time
    assert after.peaks.allocated == before.peaks.allocated  # gpumemviz's peak is its own
    assert panel.flush()
    assert "torch's peak counters were reset outside gpumemviz once" in panel.status
    assert panel.header["peak_allocated"] == before.peaks.allocated


def test_the_button_resets_both_and_says_for_whom_without_a_note(live):
    panel, src, sampler = live
    while src.sample().stats.peak_allocated <= src.sample().stats.allocated:
        src.step(50)  # until the workload has freed below its peak
    sampler.sample_once(segments=False)
    reply = panel.command("reset_peaks")
    assert reply["ok"], reply["text"]
    assert reply["text"] == RESET_PEAKS_TEXT and "for everyone in this process" in reply["text"]
    st = src.sample().stats
    assert st.peak_allocated == st.allocated  # torch's counters start again
    latest = sampler.history.latest()
    assert latest.peaks.allocated == latest.stats.allocated  # and so do gpumemviz's
    assert latest.peaks.torch_resets == 0 and latest.peaks.note is None
    assert panel.flush() and "reset outside" not in panel.status


def test_a_new_allocator_starts_the_peaks_over_without_counting_a_reset():
    tracker = PeakTracker()
    tracker.update(_stats_sample(1.0, 500, 900, allocations=40))
    p = tracker.update(_stats_sample(2.0, 100, 900, allocations=50))
    assert (p.allocated, p.reserved, p.since) == (500, 1000, 1.0)
    p = tracker.update(_stats_sample(3.0, 30, 30, allocations=3))  # the demo's next run
    assert (p.allocated, p.since, p.torch_resets) == (30, 3.0, 0)
    p = tracker.update(_stats_sample(4.0, 20, 25, allocations=9))  # peak fell, count rose
    assert (p.allocated, p.torch_resets, p.last_torch_reset) == (30, 1, 4.0)
    assert tracker.update(Sample(time=5.0, device=0, stats=None)) is p  # no stats: unchanged
