"""What the panel shows at a glance, read back from the page in JupyterLab and Chromium: the
device bar against the findings, the timeline's axis, legend and marker labels on notebook 03's
replay, the map's "to scale" rows, and each series' colour per theme in panel, report and plot.
The checks are tests/browser/looks.py's, which Notebook 7's and marimo's tests run too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import standin_file  # tests/ is on sys.path

from .looks import (
    LIVE,
    READ_BAR,
    SHOWN,
    check_axis_and_legend,
    check_bar,
    check_map_to_scale,
    check_marker_labels,
    check_panel_colours,
    check_report_and_plot,
    kernel_json,
    read_map,
    read_panel_colours,
    set_theme,
)
from .test_panel_browser import PICTURE, VIEW, _panel_cell, _wait_drawn

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_03 = REPO / "example_notebooks" / "03_replay_a_snapshot.ipynb"


def _shot(page, selector: str, name: str, artifacts: Path) -> None:
    page.locator(selector).first.screenshot(path=str(artifacts / name))


def test_the_device_bar_is_the_findings_figures_to_scale(page, notebook, artifacts):
    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = notebook("glance.ipynb", [LIVE, SHOWN])
    nb.run(0)
    _wait_drawn(page)
    nb.run(1)
    shown = kernel_json(page, 1)
    figures, glance = shown["figures"], shown["glance"]
    assert figures["device_total"] and glance["bars"][0]["scale"] == "device"
    want = [p["bytes"] for p in glance["bars"][0]["parts"]]
    page.wait_for_function(
        f"""want => {{ const b = ({READ_BAR})();
            return b && JSON.stringify(b.parts.map((p) => p.bytes)) === JSON.stringify(want); }}""",
        arg=want,
        timeout=20_000,
    )
    bar = page.evaluate(READ_BAR)
    assert bar["scale"] == "device" and bar["total"] == figures["device_total"]
    assert [p["key"] for p in bar["parts"]][-2:] == ["outside", "headroom"]
    check_bar(bar, glance, figures)
    assert "of the device" in bar["parts"][0]["title"]
    _shot(page, ".gmv-root", "glance-live.png", artifacts)


def test_a_file_without_the_device_total_is_drawn_to_scale_of_reserved(page, notebook, artifacts):
    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = notebook(
        "glance-file.ipynb",
        [
            _panel_cell(PICTURE, "file"),
            "import json\npanel.flush()\njson.dumps({'figures': "
            "panel.findings.figures.to_dict(), 'glance': panel.glance})",
        ],
    )
    nb.run(0)
    _wait_drawn(page)
    nb.run(1)
    shown = kernel_json(page, 1)
    figures, glance = shown["figures"], shown["glance"]
    assert figures["device_total"] is None
    page.wait_for_function(f"() => ({READ_BAR})() !== null", timeout=20_000)
    bar = page.evaluate(READ_BAR)
    assert bar["scale"] == "reserved" and bar["total"] == figures["reserved"]
    assert "total is unknown" in bar["note"]
    check_bar(bar, glance, figures)
    _shot(page, ".gmv-root", "glance-file.png", artifacts)


def _notebook_03_cells() -> list[str]:
    """Notebook 03's cells up to its replay panel: the file, the replay, the panel."""
    nb = json.loads(NOTEBOOK_03.read_text(encoding="utf-8"))
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    want = [i for i, src in enumerate(code) if "PlaybackSource" in src]
    assert want, "notebook 03 has no replay panel"
    first = next(i for i, src in enumerate(code) if "def find" in src)
    return code[first : want[0] + 1]


def test_notebook_03_timeline_reads_alone(page, notebook, artifacts):
    page.set_viewport_size({"width": 1300, "height": 1100})
    cells = _notebook_03_cells()
    nb = notebook("nb03.ipynb", cells)
    for i in range(len(cells)):
        nb.run(i, timeout=300_000)
    _wait_drawn(page)
    page.wait_for_function(
        f"""() => {{ const t = ({VIEW})().timeline;
            return t.points.length > 1 && t.canvas.dataset.labelBoxes !== undefined; }}""",
        timeout=60_000,
    )
    # a byte axis with units, and a legend naming every drawn series
    got = check_axis_and_legend(page)
    assert {"allocated", "reserved"} <= set(got["series"])
    # the canvas is drawn at its CSS size, so its pixels are the page's
    size = page.evaluate(
        f"""() => {{ const c = ({VIEW})().timeline.canvas;
            return [c.width, c.getBoundingClientRect().width]; }}"""
    )
    assert abs(size[0] - size[1]) <= 1
    # the markers: many, their labels never overlap, one at most ~100 px before each marker
    check_marker_labels(page)
    _shot(page, ".gmv-timeline", "timeline-nb03.png", artifacts)
    _shot(page, ".gmv-root", "panel-nb03.png", artifacts)


def test_the_map_to_scale_sizes_rows_by_bytes(page, notebook, artifacts):
    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = notebook("toscale.ipynb", [_panel_cell(PICTURE, "to scale")])
    nb.run(0)
    _wait_drawn(page)
    got = check_map_to_scale(page, PICTURE)
    # nothing is painted past a short row; hover and a pin work on it
    short = min(got["rows"], key=lambda r: r["w"])
    rect = page.evaluate(f"r => ({VIEW})().map.rowRect(r)", short["row"])
    box = page.locator(".gmv-canvas").first.bounding_box()
    y = box["y"] + rect["y"] + rect["h"] / 2
    page.mouse.move(box["x"] + rect["x"] + rect["w"] / 2, y)
    tip = page.locator(".gmv-tip").first
    tip.wait_for(state="visible")
    text = tip.text_content()
    assert text.startswith("segment 0x")
    page.mouse.move(box["x"] + rect["x"] + rect["w"] + 20, y)  # past the row: no tip
    page.wait_for_function("() => document.querySelector('.gmv-tip').hidden")
    page.mouse.click(box["x"] + rect["x"] + rect["w"] / 2, y)  # pinned
    assert tip.get_attribute("data-pinned") == "true"
    page.mouse.move(box["x"] + 10, box["y"] + 5)
    assert tip.text_content() == text and tip.is_visible()
    page.mouse.click(box["x"] + rect["x"] + rect["w"] / 2, y)  # freed
    _shot(page, ".gmv-root", "map-to-scale.png", artifacts)
    page.locator(".gmv-map-mode button[data-scale=segment]").first.click()
    back = page.evaluate(read_map())
    assert all(r["w"] == back["cells"] for r in back["rows"])


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_each_series_has_one_colour_per_theme_in_panel_report_and_plot(
    page, notebook, artifacts, tmp_path, theme
):
    from gpumemviz.reporting.html_report import report

    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = notebook(f"theme-{theme}.ipynb", [LIVE, "src.step(400); panel.flush()"])
    nb.run(0)
    _wait_drawn(page)
    set_theme(page, "JupyterLab Dark" if theme == "dark" else "JupyterLab Light")
    try:
        nb.run(1)
        page.wait_for_function(
            f"() => ({VIEW})().timeline.points.length > 1 && "
            f"({VIEW})().root.querySelector('.gmv-glance-part') !== null",
            timeout=30_000,
        )
        page.wait_for_timeout(300)  # the redraw the theme change scheduled
        panel = read_panel_colours(page)
        _shot(page, ".gmv-root", f"panel-{theme}.png", artifacts)
    finally:
        set_theme(page, "JupyterLab Light")
    check_panel_colours(panel, theme)
    # the report of a recording (it has a timeline), in the browser's colour scheme; a plot
    out = report(standin_file("training_10k"), tmp_path / "report.html")
    check_report_and_plot(page, panel, theme, Path(out), artifacts)
