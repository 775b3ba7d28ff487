"""The panel in marimo, which renders anywidget natively: `gpumemviz.monitor()` in a marimo
cell shows the live demo updating, and a button acts while no cell runs; while another cell
runs the panel still updates, and a click says it is queued and acts when that cell ends
(docs/panel.md says so). The panel reads as in JupyterLab (tests/browser/looks.py's checks: the
device bar to scale, the timeline's axis and legend, marker labels on notebook 03's replay, the
map to scale, each series' colour in panel, report and plot in the light theme). Skipped (one
line) where marimo is not installed."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from textwrap import indent

import pytest

from conftest import standin_file  # tests/ is on sys.path

from .labtools import free_port, serving
from .looks import (
    REPLAY_03,
    REPLAY_TITLE,
    check_axis_and_legend,
    check_map_to_scale,
    check_marker_labels,
    check_panel_colours,
    check_report_and_plot,
    map_cell,
    read_bar,
    read_panel_colours,
    view_titled,
    view_with,
)
from .test_panel_browser import PICTURE

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        importlib.util.find_spec("marimo") is None, reason="marimo is not installed"
    ),
]

APP = (
    """
import marimo

app = marimo.App()


@app.cell
def _():
    import gpumemviz
    import marimo as mo

    panel = gpumemviz.monitor(interval=0.25)  # no GPU here: the simulated allocator
    mo.ui.anywidget(panel)
    return (mo,)


@app.cell
def _(mo):
    train = mo.ui.run_button(label="train")
    train
    return (train,)


@app.cell
def _(train):
    import time

    if train.value:  # a "training" cell, run from the page: it holds the kernel 6 s
        time.sleep(6)
    return


@app.cell
def _(mo):
"""
    + indent(REPLAY_03, "    ")
    + """
    mo.ui.anywidget(replay_panel)  # notebook 03's replay, its markers
    return


@app.cell
def _(mo):
"""
    + indent(map_cell(PICTURE, "to scale"), "    ")
    + """
    mo.ui.anywidget(map_panel)  # a file's map, for "to scale"
    return


if __name__ == "__main__":
    app.run()
"""
)
VIEW = view_with("demo", True)  # the live demo (the other panels show files)


@pytest.fixture(scope="module")
def marimo_app(tmp_path_factory) -> Iterator[str]:
    """`marimo run` of a one-cell app on 127.0.0.1; its URL."""
    base = tmp_path_factory.mktemp("marimo")
    app = base / "panel_app.py"
    app.write_text(APP, encoding="utf-8")
    port = free_port()
    src = Path(__file__).resolve().parents[2] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "marimo",
        "run",
        str(app),
        "--headless",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-token",
    ]
    url = f"http://127.0.0.1:{port}"
    with serving(cmd, env, base / "marimo.log", url, "marimo", 60, cwd=base):
        yield url


def test_the_live_demo_updates_and_a_button_acts_in_marimo(page, marimo_app, artifacts, tmp_path):
    from gpumemviz.reporting.html_report import report

    page.set_viewport_size({"width": 1300, "height": 1000})
    page.goto(marimo_app)
    page.wait_for_function(
        f"() => {{ const v = ({VIEW})(); return v && Number(v.root.dataset.seq) > 0; }}",
        timeout=120_000,
    )
    first = int(page.evaluate(f"() => ({VIEW})().root.dataset.seq"))
    page.wait_for_function(
        f"seq => Number(({VIEW})().root.dataset.seq) > seq + 2", arg=first, timeout=30_000
    )
    page.wait_for_function(
        f"() => ({VIEW})().root.querySelector('.gmv-glance-part') !== null"
        f" && ({VIEW})().timeline.points.length > 1",
        timeout=30_000,
    )
    page.evaluate(f"() => ({VIEW})().root.querySelector('button[data-cmd=pause]').click()")
    page.wait_for_function(
        f"() => ({VIEW})().root.querySelector('button[data-cmd=pause]').textContent === 'resume'",
        timeout=20_000,
    )
    # the bar to scale (its parts against the findings: test_looks_browser, in JupyterLab)
    bar = page.evaluate(read_bar(VIEW))
    assert bar["scale"] == "device" and sum(p["bytes"] for p in bar["parts"]) == bar["total"]
    assert abs(sum(p["width"] for p in bar["parts"]) - bar["width"]) <= len(bar["parts"])
    for p in bar["parts"]:
        assert abs(p["width"] - p["bytes"] / bar["total"] * bar["width"]) <= 1, p
    # the timeline: a byte axis with units, a legend naming every drawn series
    check_axis_and_legend(page, VIEW)
    # each series' colour in panel, report and plot (light: marimo's page is not Lab's themes)
    panel = read_panel_colours(page, VIEW)
    check_panel_colours(panel, "light")
    out = Path(report(standin_file("training_10k"), tmp_path / "report.html"))
    check_report_and_plot(page, panel, "light", out, artifacts)
    # notebook 03's replay: many markers, their labels apart, one per ~100 px
    check_marker_labels(page, view_titled(REPLAY_TITLE))
    # a file's map, each row to scale of its segment's bytes
    scaled = view_titled("to scale")
    page.wait_for_function(
        f"""() => {{ const v = ({scaled})();
            return v && Number(v.map.canvas.dataset.drawnRows) > 0; }}""",
        timeout=60_000,
    )
    check_map_to_scale(page, PICTURE, scaled)
    page.screenshot(path=str(artifacts / "marimo.png"), full_page=True)


def test_a_click_while_another_cell_runs_is_queued_and_acts_when_it_ends(page, marimo_app):
    """`marimo run` gives each page its own session, in one process: its panel reads the
    device's shared sampler, which an earlier page may have paused (resumed here first, while
    no cell runs)."""
    page.set_viewport_size({"width": 1300, "height": 1000})
    page.goto(marimo_app)
    pause = f"() => ({VIEW})().root.querySelector('button[data-cmd=pause]')"
    page.wait_for_function(
        f"() => {{ const v = ({VIEW})(); return v && Number(v.root.dataset.seq) > 0; }}",
        timeout=120_000,
    )
    if page.evaluate(f"() => ({pause})().textContent") == "resume":
        page.evaluate(f"() => ({pause})().click()")
        page.wait_for_function(f"() => ({pause})().textContent === 'pause'", timeout=20_000)
    seq = int(page.evaluate(f"() => ({VIEW})().root.dataset.seq"))
    page.wait_for_function(
        f"seq => Number(({VIEW})().root.dataset.seq) > seq + 2", arg=seq, timeout=30_000
    )
    page.get_by_role("button", name="train").click()
    page.wait_for_timeout(1000)  # the cell runs (6 s)
    seq = int(page.evaluate(f"() => ({VIEW})().root.dataset.seq"))
    page.evaluate(f"() => ({VIEW})().root.querySelector('button[data-cmd=pause]').click()")
    t0 = time.monotonic()
    seen = []  # (seconds since the click, seq, reply state, reply text, button text)
    while time.monotonic() - t0 < 20:
        got = page.evaluate(
            f"""() => {{ const v = ({VIEW})(); const l = v.root.querySelector('.gmv-reply');
                return [Number(v.root.dataset.seq), l.dataset.state, l.textContent,
                        v.root.querySelector('button[data-cmd=pause]').textContent]; }}"""
        )
        seen.append((round(time.monotonic() - t0, 2), *got))
        if got[1] == "ok":
            break
        page.wait_for_timeout(200)
    queued = [r for r in seen if r[2] == "queued"]
    done = [r for r in seen if r[2] == "ok"]
    # while the cell ran: the click said it waits, the button kept its word
    assert queued and queued[0][0] < 1.5, seen
    assert all(r[3:] == ("pause: queued until the cell finishes", "pause") for r in queued), seen
    # it acted once the cell ended (it had ~5 s left), not before
    assert done and done[0][3:] == ("pause: paused", "resume"), seen
    assert 3.5 < done[0][0] < 10, seen
    # and the panel went on updating meanwhile (sent from its own thread)
    assert max(r[1] for r in queued) > seq, seen
