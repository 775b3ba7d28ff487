"""gpumemviz.render.plots: every line and marker carries the input's own numbers."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import gpumemviz
from conftest import real_file, standin_file
from gpumemviz.allocator.replay import replay
from gpumemviz.allocator.workloads import WORKLOADS, run, training_loop
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.render import plots
from gpumemviz.render.plots import GIB, _decimate

#: Long traces (over 4,000 entries) that fit in less memory with expandable segments, with a
#: capacity between the two: the default settings run out under it, expandable ones do not.
#: cranberrii's (CI-only): between the expandable peak (5.96 GB) and the recorded one
#: (6.47 GB). The training stand-in's (ships) starts with 2.89 GB cached: under a capacity the
#: replay releases the cache when short, and fits in 2.45 GB by default, 2.31 GB expandable.
LONG_TRACES = {
    "real": (lambda: real_file("cranberrii__ftcourse__memory_snapshot.pickle"), 6_200_000_000),
    "standin": (lambda: standin_file("training_10k"), 2_400_000_000),
}


def by_name(fig):
    return {t.name: t for t in fig.data}


@pytest.fixture(scope="module")
def oom_outcome():
    o = run(WORKLOADS["training"])
    assert not o.completed  # the catalogue's training workload runs out of memory
    return o


@pytest.fixture(scope="module")
def simulated_history():
    """A sampler history of the simulated training run, read step by step up to its OOM."""
    src = SimulatedSource("training", autostart=False, loop=False)
    sampler = Sampler(src, interval=0.5, segment_interval=60.0)
    # the OOM handler is wired by start(); the ticks of the running thread add samples too
    sampler.start()
    try:
        while src.step(1500) == 1500:
            sampler.sample_once(segments=False)
        sampler.sample_once(segments=False)
        # the OOM reaches the history from the sampler's thread
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(s.oom for s in sampler.history.samples()):
            time.sleep(0.02)
    finally:
        sampler.stop()
    assert src.ooms, "the simulated training run should end in an OOM"
    return sampler


def test_timeline_of_a_workload_outcome_holds_its_arrays(oom_outcome):
    o = oom_outcome
    fig = plots.timeline(o, max_points=10**9)
    t = by_name(fig)
    assert list(t) == ["allocated", "reserved", "OOM"]
    np.testing.assert_array_equal(t["allocated"].y, o.allocated / GIB)
    np.testing.assert_array_equal(t["reserved"].y, o.reserved / GIB)
    np.testing.assert_array_equal(t["reserved"].x, np.arange(o.steps))
    # the cross sits at the failing step, at the reserved bytes when it failed
    assert list(t["OOM"].x) == [o.oom_step]
    assert t["OOM"].y[0] == pytest.approx(o.reserved[-1] / GIB)
    [cap] = list(fig.layout.shapes)
    assert cap.y0 == pytest.approx(o.capacity / GIB)


def test_timeline_of_a_completed_run_has_no_oom_marker():
    o = run(training_loop(iterations=1))
    assert o.completed
    assert [t.name for t in plots.timeline(o).data] == ["allocated", "reserved"]


def test_timeline_of_a_sampler_history(simulated_history):
    sampler = simulated_history
    samples = [s for s in sampler.history.samples() if s.stats is not None]
    fig = plots.timeline(sampler)
    t = by_name(fig)
    assert set(t) == {"allocated", "reserved", "NVML used", "non-PyTorch", "OOM"}
    times, reserved = sampler.history.series("reserved")
    _, allocated = sampler.history.series("allocated")
    np.testing.assert_allclose(t["reserved"].x, times - sampler.history.samples()[0].time)
    np.testing.assert_array_equal(t["reserved"].y, reserved / GIB)
    np.testing.assert_array_equal(t["allocated"].y, allocated / GIB)
    np.testing.assert_array_equal(t["NVML used"].y, [s.nvml.used / GIB for s in samples])
    np.testing.assert_array_equal(t["non-PyTorch"].y, [s.nvml.non_pytorch / GIB for s in samples])
    n_oom = sum(s.oom is not None for s in sampler.history.samples())
    assert n_oom == 1 and len(t["OOM"].x) == 1
    # History and a plain list of its samples draw the same figure
    again = plots.timeline(list(sampler.history.samples()))
    assert [list(tr.y) for tr in again.data] == [list(tr.y) for tr in fig.data]


def test_timeline_leaves_out_nvml_when_unknown(simulated_history):
    samples = [s.replace(nvml=None) for s in simulated_history.history.samples()]
    names = [t.name for t in plots.timeline(samples).data]
    assert "NVML used" not in names and "non-PyTorch" not in names
    assert {"allocated", "reserved"} <= set(names)


def test_timeline_picks_a_device_from_mixed_samples(simulated_history):
    base = [s for s in simulated_history.history.samples() if s.stats is not None][:5]
    mixed = base + [s.replace(device=3) for s in base[:2]]
    fig = plots.timeline(mixed, device=3)
    assert len(by_name(fig)["reserved"].y) == 2
    with pytest.raises(ValueError, match=r"device 7 is not in the history \(devices: \[0, 3\]\)"):
        plots.timeline(mixed, device=7)


@pytest.mark.parametrize("which", sorted(LONG_TRACES))
def test_what_if_draws_recorded_and_predicted_with_the_oom(which):
    path, cap = LONG_TRACES[which][0](), LONG_TRACES[which][1]
    r = replay(path, config="", capacity=cap)
    assert r.oom is not None
    fig = plots.what_if(r, max_points=10**9)
    t = by_name(fig)
    f = r.figures()
    np.testing.assert_array_equal(t["recorded reserved"].y, f["recorded_reserved"] / GIB)
    np.testing.assert_array_equal(t["predicted reserved"].y, f["reserved"] / GIB)
    np.testing.assert_array_equal(t["recorded segments"].y, f["recorded_segments"])
    np.testing.assert_array_equal(t["predicted segments"].y, f["segments"])
    assert list(t["predicted OOM"].x) == [r.oom]
    assert t["predicted OOM"].y[0] == pytest.approx(f["reserved"][r.oom] / GIB)
    assert "recorded OOM" not in t  # the recording itself did not run out
    assert t["predicted segments"].yaxis == "y2" and t["predicted reserved"].yaxis == "y"
    assert any(s.y0 == pytest.approx(cap / GIB) for s in fig.layout.shapes)

    fits = plots.what_if(replay(path, config="expandable_segments:True", capacity=cap))
    assert "predicted OOM" not in by_name(fits)
    assert "expandable_segments:True" in fits.layout.title.text


@pytest.mark.parametrize("which", sorted(LONG_TRACES))
def test_long_series_keep_their_peaks(which):
    r = replay(LONG_TRACES[which][0](), config="expandable_segments:True")
    f = r.figures()
    assert len(f["recorded_reserved"]) > 4000
    t = by_name(plots.what_if(r, max_points=1000))
    y, x = t["recorded reserved"].y, t["recorded reserved"].x.astype(int)
    assert len(y) <= 1002
    np.testing.assert_array_equal(y, f["recorded_reserved"][x] / GIB)  # real points only
    assert y.max() == pytest.approx(f["recorded_reserved"].max() / GIB)
    assert "capacity unknown" in plots.what_if(r).layout.title.text
    # a replay result also draws as a plain timeline of the recorded figures
    tl = by_name(plots.timeline(r, max_points=10**9))
    np.testing.assert_array_equal(tl["reserved"].y, r.timelines[0].reserved / GIB)


def test_decimate_keeps_extremes_and_ends():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 10**9, 100_003)
    x = np.arange(len(y), dtype=np.float64)
    dx, dy = _decimate(x, y, 500)
    assert len(dy) <= 502
    np.testing.assert_array_equal(dy, y[dx.astype(int)])
    assert dy.max() == y.max() and dy.min() == y.min()
    assert dx[0] == 0 and dx[-1] == len(y) - 1
    short = np.arange(10)
    assert _decimate(short, short, 500)[1] is short


def test_workloads_figure_and_rows():
    outs = {
        "batch 8": run(WORKLOADS["training"]),
        "expandable": run(WORKLOADS["training_expandable"]),
    }
    rows = plots.outcome_rows(outs)
    assert [r["variant"] for r in rows] == ["batch 8", "expandable"]
    assert [r["completed"] for r in rows] == [False, True]
    assert rows[0]["outcome"] == f"OOM at operation {outs['batch 8'].oom_step}"
    assert rows[0]["free_in_segments_at_oom"] == outs["batch 8"].free_in_segments_at_oom > 0
    assert rows[1]["config"] == "expandable_segments:True"

    fig = plots.workloads(outs, max_points=10**9)
    t = by_name(fig)
    assert list(t["peak reserved"].x) == ["batch 8", "expandable"]
    np.testing.assert_array_equal(
        t["peak reserved"].y, [o.peak_reserved / GIB for o in outs.values()]
    )
    np.testing.assert_array_equal(
        t["peak allocated"].y, [o.peak_allocated / GIB for o in outs.values()]
    )
    assert list(t["peak reserved"].text) == [
        f"OOM at operation {outs['batch 8'].oom_step}",
        "completed",
    ]
    np.testing.assert_array_equal(t["expandable reserved"].y, outs["expandable"].reserved / GIB)
    assert list(t["batch 8 OOM"].x) == [outs["batch 8"].oom_step]
    assert "expandable OOM" not in t
    colors = list(t["peak reserved"].marker.color)
    assert colors[0] != colors[1]  # the OOM variant stands out

    # an iterable of outcomes is named by workload
    assert [r["variant"] for r in plots.outcome_rows(outs.values())] == [
        "training",
        "training_expandable",
    ]


def test_bad_input_is_named():
    with pytest.raises(TypeError, match=r"timeline needs a Sampler.*got int"):
        plots.timeline(3)
    with pytest.raises(TypeError, match=r"what_if needs a gpumemviz\.replay result, got dict"):
        plots.what_if({})
    with pytest.raises(ValueError, match="no workload outcomes to compare"):
        plots.workloads([])


def test_missing_plotly_gets_an_install_hint(monkeypatch, oom_outcome):
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    with pytest.raises(ImportError, match=r"pip install plotly"):
        plots.timeline(oom_outcome)


def test_public_name_is_lazy():
    code = (
        "import sys, gpumemviz; assert 'plotly' not in sys.modules; "
        "f = gpumemviz.plots; assert 'plotly' not in sys.modules; "
        "from gpumemviz.render import plots as r; assert f is r; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
    assert "plots" in gpumemviz.__all__ and "figures" not in gpumemviz.__all__


def test_the_old_name_figures_still_works_for_one_release():
    with pytest.warns(DeprecationWarning, match="gpumemviz.figures is now gpumemviz.plots"):
        old = gpumemviz.figures
    assert old is gpumemviz.plots


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_timeline_colours_are_the_palette_files(simulated_history, oom_outcome, theme):
    """Each series has the colour render/palette.json gives it in the theme: the panel's and
    the report's (js/src/palette.js reads the same file)."""
    from gpumemviz.render.palette import palette

    want = palette(theme)
    fig = plots.timeline(simulated_history, theme=theme)
    lines = {t.name: t.line.color for t in fig.data if t.mode == "lines"}
    assert lines == {
        plots.LABELS[k]: want[k] for k in ("allocated", "reserved", "nvml_used", "non_pytorch")
    }
    crosses = plots.timeline(oom_outcome, theme=theme)
    assert by_name(crosses)["OOM"].marker.color == want["oom"]
    assert (fig.layout.paper_bgcolor == want["bg"]) is (theme == "dark")
    assert len(set(lines.values())) == len(lines)  # no two series alike
    with pytest.raises(ValueError, match="theme must be one of light, dark"):
        plots.timeline(simulated_history, theme="blue")
