"""The panel in Notebook 7 (built on JupyterLab's parts, a front end of its own): the live demo
updates, a button acts, and the panel reads as in JupyterLab (tests/browser/looks.py's checks:
the device bar, the timeline's axis and legend, marker labels on notebook 03's replay, the map
to scale, each series' colour in panel, report and plot in the light and dark themes). Skipped
(one line) where the `notebook` package is not installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import standin_file  # tests/ is on sys.path

from .labtools import Lab, Notebook, running_lab
from .looks import (
    LIVE,
    READ_BAR,
    REPLAY_03,
    REPLAY_TITLE,
    SHOWN,
    check_axis_and_legend,
    check_bar,
    check_map_to_scale,
    check_marker_labels,
    check_panel_colours,
    check_report_and_plot,
    kernel_json,
    map_cell,
    read_panel_colours,
    set_theme,
    view_titled,
)
from .test_panel_browser import PICTURE, VIEW, _wait_drawn

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        importlib.util.find_spec("notebook") is None, reason="Notebook 7 is not installed"
    ),
]

DEMO = """
import gpumemviz
panel = gpumemviz.monitor(interval=0.25)  # no GPU here: the simulated allocator, as demo data
panel
"""


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory) -> Iterator[Lab]:
    with running_lab(tmp_path_factory.mktemp("nb7"), app="notebook") as handle:
        yield handle


def test_the_live_demo_updates_and_a_button_acts_in_notebook_7(page, notebook7, artifacts):
    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = Notebook(page, notebook7, "demo7.ipynb", [DEMO])
    try:
        nb.run(0)
        _wait_drawn(page)
        first = int(page.evaluate(f"() => ({VIEW})().root.dataset.seq"))
        page.wait_for_function(
            f"seq => Number(({VIEW})().root.dataset.seq) > seq + 2", arg=first, timeout=30_000
        )
        page.wait_for_function(
            f"""() => {{ const v = ({VIEW})();
                return v.root.querySelector('.gmv-glance-part') !== null
                    && v.timeline.points.length > 1; }}""",
            timeout=30_000,
        )
        assert page.locator(".gmv-badge").first.is_visible()  # demo data, said so
        page.locator("button[data-cmd=pause]").first.click()
        page.wait_for_function(
            f"""() => {{ const l = ({VIEW})().root.querySelector('.gmv-reply');
                return l.dataset.state === 'ok' && l.dataset.cmd === 'pause'; }}""",
            timeout=20_000,
        )
        page.wait_for_function(
            f"() => ({VIEW})().root.querySelector('button[data-cmd=pause]').textContent"
            " === 'resume'",
            timeout=20_000,
        )
        page.locator(".gmv-root").first.screenshot(path=str(artifacts / "notebook7.png"))
    finally:
        nb.shutdown()


def test_the_panel_reads_as_in_jupyterlab(page, notebook7, artifacts, tmp_path):
    """looks.py's checks, on one page: the live panel's bar (its parts are the findings'
    figures, to scale), timeline (byte axis with units, a legend naming every drawn series) and
    colours per theme; notebook 03's replay panel's marker labels; a file's map to scale."""
    from gpumemviz.reporting.html_report import report

    page.set_viewport_size({"width": 1300, "height": 1000})
    cells = [
        LIVE,
        "src.step(400); panel.flush()",
        SHOWN,
        REPLAY_03 + "replay_panel",
        map_cell(PICTURE, "to scale") + "map_panel",
    ]
    nb = Notebook(page, notebook7, "looks7.ipynb", cells)
    try:
        nb.run(0)
        _wait_drawn(page)
        nb.run(1)
        page.wait_for_function(f"() => ({VIEW})().timeline.points.length > 1", timeout=30_000)
        nb.run(2)
        shown = kernel_json(page, 2)
        want = [p["bytes"] for p in shown["glance"]["bars"][0]["parts"]]
        page.wait_for_function(
            f"""want => {{ const b = ({READ_BAR})();
                return b && JSON.stringify(b.parts.map((p) => p.bytes)) === JSON.stringify(want);
            }}""",
            arg=want,
            timeout=20_000,
        )
        check_bar(page.evaluate(READ_BAR), shown["glance"], shown["figures"])
        check_axis_and_legend(page)
        # the same colours as in JupyterLab, per theme (Notebook 7 switches themes as Lab does)
        out = Path(report(standin_file("training_10k"), tmp_path / "report.html"))
        for theme in ("light", "dark"):
            set_theme(page, "JupyterLab Dark" if theme == "dark" else "JupyterLab Light")
            page.wait_for_timeout(300)  # the redraw the theme change scheduled
            panel = read_panel_colours(page)
            check_panel_colours(panel, theme)
            check_report_and_plot(page, panel, theme, out, artifacts)
        set_theme(page, "JupyterLab Light")
        # notebook 03's replay: many markers, their labels apart, one per ~100 px
        nb.run(3)
        check_marker_labels(page, view_titled(REPLAY_TITLE))
        # a file's map, each row to scale of its segment's bytes
        nb.run(4)
        page.wait_for_function(
            f"""() => {{ const v = ({view_titled("to scale")})();
                return v && Number(v.map.canvas.dataset.drawnRows) > 0; }}""",
            timeout=60_000,
        )
        check_map_to_scale(page, PICTURE, view_titled("to scale"))
        page.locator(".gmv-root").nth(2).screenshot(path=str(artifacts / "notebook7-map.png"))
    finally:
        set_theme(page, "JupyterLab Light")
        nb.shutdown()
