"""What the panel shows at a glance, read back from the page in JupyterLab and Chromium: the
device bar against the findings, the timeline's axis, legend and marker labels on notebook 03's
replay, the map's "to scale" rows, and each series' colour per theme in panel, report and plot."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from conftest import standin_file  # tests/ is on sys.path
from gpumemviz.io import load_snapshot
from gpumemviz.render.palette import palette
from gpumemviz.render.rows import build_rows

from .test_panel_browser import PICTURE, VIEW, _panel_cell, _wait_drawn

pytestmark = pytest.mark.browser

MIN_ROW_W = 4  # js/src/heatmap.js: a "to scale" row's fewest pixels
REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_03 = REPO / "example_notebooks" / "03_replay_a_snapshot.ipynb"

LIVE = """
import gpumemviz
from gpumemviz.live.sources.simulated import SimulatedSource

src = SimulatedSource("training", autostart=False)  # driven by hand: its state is known
src.step(6000)
panel = gpumemviz.monitor(source=src, interval=0.25, subshell=False)
panel
"""
# the sampler stopped, everything sent: what the kernel shows, as JSON text
SHOWN = """
import json
panel.sampler.stop()
panel.flush()
json.dumps({"figures": panel.findings.figures.to_dict(), "glance": panel.glance})
"""

# the first bar's track and parts, as laid out
READ_BAR = f"""() => {{
    const bar = ({VIEW})().root.querySelector('.gmv-glance-bar');
    if (!bar) return null;
    const track = bar.querySelector('.gmv-glance-track').getBoundingClientRect();
    const parts = [...bar.querySelectorAll('.gmv-glance-part')].map((p) => {{
        const r = p.getBoundingClientRect();
        return {{ key: p.dataset.part, bytes: Number(p.dataset.bytes), left: r.left - track.left,
                  width: r.width, title: p.title, colour: getComputedStyle(p).backgroundColor }};
    }});
    const largest = bar.querySelector('.gmv-glance-largest');
    return {{ width: track.width, total: Number(bar.dataset.total), scale: bar.dataset.scale,
              note: bar.querySelector('.gmv-glance-note').textContent, parts,
              largest: largest ? Number(largest.dataset.bytes) : null }};
}}"""


def _kernel_json(page, cell: int):
    out = page.evaluate(
        "i => window.jupyterapp.shell.currentWidget.content.widgets[i].model.outputs.toJSON()",
        cell,
    )
    return json.loads(ast.literal_eval(out[-1]["data"]["text/plain"]))


def _shot(page, selector: str, name: str, artifacts: Path) -> None:
    page.locator(selector).first.screenshot(path=str(artifacts / name))


def _check_bar(bar: dict, glance: dict, figures: dict) -> None:
    """The bar's parts are the findings' figures and fill the bar to scale."""
    want = glance["bars"][0]
    assert [p["key"] for p in bar["parts"]] == [p["key"] for p in want["parts"]]
    got = {p["key"]: p["bytes"] for p in bar["parts"]}
    assert got == {p["key"]: p["bytes"] for p in want["parts"]}
    # the parts are the figures: allocated, pending, the free split in two
    assert got["allocated"] == figures["allocated"]
    assert got["pending_free"] == figures["pending_free"]
    assert got["releasable"] + got["stays"] == figures["free_in_reserved"]
    assert got["releasable"] == min(figures["releasable"], figures["free_in_reserved"])
    assert bar["largest"] == figures["largest_free"]
    assert sum(got.values()) == bar["total"]
    # to scale: each part within a pixel of its share, all of them within a pixel each
    n = len(bar["parts"])
    assert abs(sum(p["width"] for p in bar["parts"]) - bar["width"]) <= n
    for p, w in zip(bar["parts"], want["parts"], strict=True):
        assert abs(p["width"] - p["bytes"] / bar["total"] * bar["width"]) <= 1, p
        label, meaning = p["title"].split("\n", 1)
        assert label.startswith(w["label"] + ": "), p["title"]
        assert meaning == glance["meanings"][w["key"]], p["title"]
        assert re.search(r"\d (bytes|KiB|MiB|GiB)", label) and len(meaning) > 20, p["title"]


def test_the_device_bar_is_the_findings_figures_to_scale(page, notebook, artifacts):
    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = notebook("glance.ipynb", [LIVE, SHOWN])
    nb.run(0)
    _wait_drawn(page)
    nb.run(1)
    shown = _kernel_json(page, 1)
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
    _check_bar(bar, glance, figures)
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
    shown = _kernel_json(page, 1)
    figures, glance = shown["figures"], shown["glance"]
    assert figures["device_total"] is None
    page.wait_for_function(f"() => ({READ_BAR})() !== null", timeout=20_000)
    bar = page.evaluate(READ_BAR)
    assert bar["scale"] == "reserved" and bar["total"] == figures["reserved"]
    assert "total is unknown" in bar["note"]
    _check_bar(bar, glance, figures)
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
    got = page.evaluate(
        f"""() => {{ const v = ({VIEW})(); const t = v.timeline; t.drawNow();
            const c = t.canvas.dataset;
            const keys = [...v.root.querySelectorAll('.gmv-tl-key')].map((k) => ({{
                series: k.dataset.series, text: k.textContent,
                colour: getComputedStyle(k.querySelector('.gmv-tl-swatch')).borderTopColor }}));
            return {{ yTicks: JSON.parse(c.yTicks), series: c.series.split(','), keys,
                      marks: t.marks.length, ...t.labelled, width: t.canvas.width,
                      cssWidth: t.canvas.getBoundingClientRect().width }}; }}"""
    )
    # a byte axis with units, and a legend naming every drawn series
    assert len(got["yTicks"]) >= 2 and got["yTicks"][0] == "0"
    assert all(re.fullmatch(r"[\d.]+ (bytes|KiB|MiB|GiB|TiB)", t) for t in got["yTicks"][1:])
    assert {"allocated", "reserved"} <= set(got["series"])
    assert sorted(k["series"] for k in got["keys"]) == sorted(got["series"])
    assert all(k["text"] for k in got["keys"])
    # the canvas is drawn at its CSS size, so its pixels are the page's
    assert abs(got["width"] - got["cssWidth"]) <= 1
    # the markers: many, their labels never overlap, one at most ~100 px before each marker
    boxes, xs = got["boxes"], got["xs"]
    assert got["marks"] > 50 and len(xs) > 50 and boxes
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            apart = (
                a[0] + a[2] <= b[0]
                or b[0] + b[2] <= a[0]
                or a[1] + a[3] <= b[1]
                or (b[1] + b[3] <= a[1])
            )
            assert apart, (a, b)
    starts = sorted(b[0] for b in boxes)
    for x in xs:
        assert any(0 <= x - s <= 100 for s in starts), x
    assert len(boxes) >= 2
    _shot(page, ".gmv-timeline", "timeline-nb03.png", artifacts)
    _shot(page, ".gmv-root", "panel-nb03.png", artifacts)


def test_the_map_to_scale_sizes_rows_by_bytes(page, notebook, artifacts):
    rows = build_rows(load_snapshot(PICTURE))
    sizes = [int(s) for s in rows.total_size]
    largest = max(sizes)
    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = notebook("toscale.ipynb", [_panel_cell(PICTURE, "to scale")])
    nb.run(0)
    _wait_drawn(page)
    page.locator(".gmv-map-mode button[data-scale=bytes]").first.click()
    read = f"""() => {{ const m = ({VIEW})().map; m.drawNow();
        const c = m.canvas.dataset; const first = Number(c.first), count = Number(c.count);
        const out = [];
        for (let r = first; r < first + count; r++) {{
            const row = m.cached(r); if (!row) continue;
            out.push({{ row: r, w: m.rowRect(r).w, size: row.meta.total_size }});
        }}
        return {{ scale: m.scale, max: m.maxSize, cells: Number(c.cells), rows: out }}; }}"""
    got = page.evaluate(read)
    assert got["scale"] == "bytes" and got["max"] == largest
    cells, min_w = got["cells"], MIN_ROW_W
    assert len(got["rows"]) >= 10
    distinct = set()
    for r in got["rows"]:
        assert r["size"] == sizes[r["row"]]
        exact = cells * r["size"] / largest
        if exact >= min_w:
            assert abs(r["w"] - exact) <= 1, r
        else:
            assert r["w"] == min_w, r
        distinct.add(r["w"])
    assert len(distinct) > 1  # sizes differ, so do rows
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
    back = page.evaluate(read)
    assert all(r["w"] == back["cells"] for r in back["rows"])


def _rgb(colour: str) -> tuple[int, int, int]:
    """ "#rrggbb" or "rgb(r, g, b)" as a tuple."""
    if colour.startswith("#"):
        return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))
    r, g, b = (int(float(v)) for v in re.findall(r"[\d.]+", colour)[:3])
    return (r, g, b)


def _contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """WCAG 2 contrast ratio of two colours."""

    def lum(c: tuple[int, int, int]) -> float:
        ch = [v / 255 for v in c]
        lin = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in ch]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _set_theme(page, name: str) -> None:
    page.evaluate(
        "t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", name
    )
    light = "false" if "Dark" in name else "true"
    page.wait_for_function(
        f"() => document.body.dataset.jpThemeLight === '{light}'", timeout=30_000
    )


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_each_series_has_one_colour_per_theme_in_panel_report_and_plot(
    page, notebook, artifacts, tmp_path, theme
):
    from gpumemviz.allocator.workloads import run, training_loop
    from gpumemviz.render.plots import timeline
    from gpumemviz.reporting.html_report import report

    want = {k: _rgb(v) for k, v in palette(theme).items()}
    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = notebook(f"theme-{theme}.ipynb", [LIVE, "src.step(400); panel.flush()"])
    nb.run(0)
    _wait_drawn(page)
    _set_theme(page, "JupyterLab Dark" if theme == "dark" else "JupyterLab Light")
    try:
        nb.run(1)
        page.wait_for_function(
            f"() => ({VIEW})().timeline.points.length > 1 && "
            f"({VIEW})().root.querySelector('.gmv-glance-part') !== null",
            timeout=30_000,
        )
        page.wait_for_timeout(300)  # the redraw the theme change scheduled
        panel = page.evaluate(
            f"""() => {{ const v = ({VIEW})(); v.timeline.drawNow();
                const keys = {{}};
                for (const k of v.root.querySelectorAll('.gmv-tl-key'))
                    keys[k.dataset.series] = getComputedStyle(k.querySelector('.gmv-tl-swatch'))
                        .borderTopColor;
                const parts = {{}};
                for (const p of v.root.querySelectorAll('.gmv-glance-part'))
                    parts[p.dataset.part] = getComputedStyle(p).backgroundColor;
                const text = getComputedStyle(v.root).color;
                return {{ keys, parts, kinds: v.map.palette.kinds, text }}; }}"""
        )
        _shot(page, ".gmv-root", f"panel-{theme}.png", artifacts)
    finally:
        _set_theme(page, "JupyterLab Light")
    for series, colour in panel["keys"].items():
        assert _rgb(colour) == want[series], series
    # the text stays legible on the panel's background, muted words too
    assert _contrast(_rgb(panel["text"]), want["bg"]) >= 4.5
    assert _contrast(want["muted"], want["bg"]) >= 4.5
    assert _rgb(panel["parts"]["allocated"]) == want["allocated"]
    assert _rgb(panel["parts"]["releasable"]) == want["releasable"]
    assert _rgb(panel["parts"]["stays"]) == want["trapped"]
    assert [tuple(k) for k in panel["kinds"]] == [
        want[k] for k in ("allocated", "pending", "releasable", "trapped")
    ]
    # the report of a recording (it has a timeline), in the browser's colour scheme
    out = report(standin_file("training_10k"), tmp_path / "report.html")
    page2 = page.context.new_page()
    page2.emulate_media(color_scheme=theme)
    page2.goto(Path(out).resolve().as_uri())
    page2.wait_for_selector(".gmv-root[data-ready='1']", timeout=30_000)
    page2.wait_for_function(
        "() => document.querySelectorAll('.gmv-report-timeline .gmv-tl-key').length > 0",
        timeout=30_000,
    )
    shown = page2.evaluate(
        """() => { const keys = {};
            for (const k of document.querySelectorAll('.gmv-report-timeline .gmv-tl-key'))
                keys[k.dataset.series] = getComputedStyle(k.querySelector('.gmv-tl-swatch'))
                    .borderTopColor;
            return { keys, kinds: window.__gpumemviz.views.report.map.palette.kinds,
                     bg: getComputedStyle(document.body).backgroundColor }; }"""
    )
    page2.screenshot(path=str(artifacts / f"report-{theme}.png"))
    page2.close()
    assert shown["keys"] and _rgb(shown["bg"]) == want["bg"]
    assert [tuple(k) for k in shown["kinds"]] == [tuple(k) for k in panel["kinds"]]
    for series, colour in shown["keys"].items():
        assert _rgb(colour) == want[series] == _rgb(panel["keys"][series]), series
    # the plot's figure JSON
    fig = timeline(run(training_loop(iterations=1)), theme=theme).to_plotly_json()
    lines = {t["name"]: t["line"]["color"] for t in fig["data"] if t.get("mode") == "lines"}
    assert lines and _rgb(lines["allocated"]) == want["allocated"]
    assert _rgb(lines["reserved"]) == want["reserved"]
    for name, series in (("allocated", "allocated"), ("reserved", "reserved")):
        if series in panel["keys"]:
            assert _rgb(lines[name]) == _rgb(panel["keys"][series])
