"""What the panel shows at a glance, checked the same way wherever it runs: JupyterLab
(test_looks_browser), Notebook 7 (test_notebook7_browser) and marimo (test_marimo_browser).

Each check reads one panel view from the page (a JavaScript expression for it, `VIEW`, `view_titled`
or `view_with`) so a page showing several panels checks each where it is, and the environments
differ only in how a cell runs: the checks themselves are written once, here.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from conftest import standin_file  # tests/ is on sys.path
from gpumemviz.io import load_snapshot
from gpumemviz.render.palette import palette
from gpumemviz.render.rows import build_rows

from .test_panel_browser import VIEW

MIN_ROW_W = 4  # js/src/heatmap.js: a "to scale" row's fewest pixels
UNIT_TICK = r"[\d.]+ (bytes|KiB|MiB|GiB|TiB)"

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

# Notebook 03's replay panel (example_notebooks/03_replay_a_snapshot.ipynb: the stand-in
# training trace paused on its peak, its markers every step) as one cell's code, its helpers'
# names cell-local in marimo (a leading underscore) so the same code runs there; it defines
# `replay_panel`, titled "recorded trace". A cell shows it with `replay_panel` (Jupyter) or
# `mo.ui.anywidget(replay_panel)` (marimo).
REPLAY_03 = f"""
import gpumemviz as _gmv
import numpy as _np
from gpumemviz.live.sources.playback import PlaybackSource as _Playback

_path = {str(standin_file("training_10k"))!r}
_result = _gmv.replay(_path)
_device = min(_result.timelines)
_source = _Playback(_path, device=_device)
_source.seek(int(_np.argmax(_result.timelines[_device].reserved)))
replay_panel = _gmv.monitor(source=_source, interval=0.5)
replay_panel.sampler.sample_once(segments=True)
replay_panel.sampler.stop()
replay_panel.flush()
"""
REPLAY_TITLE = "recorded trace"


def map_cell(path: Path, title: str) -> str:
    """One cell's code defining `map_panel`, a file's panel titled `title` (cell-local helpers,
    as in `REPLAY_03`)."""
    return (
        "from gpumemviz.io import load_snapshot as _load\n"
        "from gpumemviz.widget import MemoryPanel as _Panel\n"
        f"map_panel = _Panel.from_snapshot(_load({str(path)!r}), title={title!r})\n"
    )


def view_with(trait: str, value: object) -> str:
    """A page-side expression for the panel view whose model's `trait` is `value` (null until
    drawn)."""
    return (
        "() => window.__gpumemviz && Object.values(window.__gpumemviz.views)"
        f".find((v) => v.model.get({json.dumps(trait)}) === {json.dumps(value)}) || null"
    )


def view_titled(title: str) -> str:
    """A page-side expression for the panel view whose title is `title` (null until drawn)."""
    return view_with("title", title)


def read_bar(view: str = VIEW) -> str:
    """A page-side expression: the view's first device bar, its track and parts as laid out."""
    return f"""() => {{
    const v = ({view})();
    const bar = v && v.root.querySelector('.gmv-glance-bar');
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


READ_BAR = read_bar()


def kernel_json(page, cell: int):
    """Cell `cell`'s last output (a JSON string's repr) in the current Jupyter notebook."""
    out = page.evaluate(
        "i => window.jupyterapp.shell.currentWidget.content.widgets[i].model.outputs.toJSON()",
        cell,
    )
    return json.loads(ast.literal_eval(out[-1]["data"]["text/plain"]))


def check_bar(bar: dict, glance: dict, figures: dict) -> None:
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


def check_axis_and_legend(page, view: str = VIEW) -> dict:
    """The view's timeline has a byte axis with units and a legend naming every drawn series;
    what was read (ticks, series, legend keys with their text)."""
    got = page.evaluate(
        f"""() => {{ const v = ({view})(); v.timeline.drawNow();
            const c = v.timeline.canvas.dataset;
            const keys = [...v.root.querySelectorAll('.gmv-tl-key')].map((k) => ({{
                series: k.dataset.series, text: k.textContent }}));
            return {{ ticks: JSON.parse(c.yTicks), series: c.series.split(','), keys }}; }}"""
    )
    assert got["ticks"][0] == "0" and len(got["ticks"]) >= 2
    assert all(re.fullmatch(UNIT_TICK, t) for t in got["ticks"][1:]), got["ticks"]
    assert "allocated" in got["series"]
    assert sorted(k["series"] for k in got["keys"]) == sorted(got["series"])
    assert all(k["text"] for k in got["keys"])
    return got


def check_marker_labels(page, view: str = VIEW) -> dict:
    """On a timeline with many markers the drawn labels (the exposed boxes) never overlap and
    one starts at most ~100 px before each marker; what was read."""
    page.wait_for_function(
        f"""() => {{ const v = ({view})(); const t = v && v.timeline;
            return t && t.points.length > 1 && t.canvas.dataset.labelBoxes !== undefined; }}""",
        timeout=60_000,
    )
    got = page.evaluate(
        f"""() => {{ const t = ({view})().timeline; t.drawNow();
            return {{ marks: t.marks.length, ...t.labelled }}; }}"""
    )
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
    return got


def read_map(view: str = VIEW) -> str:
    """A page-side expression: the view's map drawn now, its mode and the rows in view with
    their drawn length and segment bytes, as {scale, max, cells, rows: [{row, w, size}]}."""
    return f"""() => {{ const m = ({view})().map; m.drawNow();
        const c = m.canvas.dataset; const first = Number(c.first), count = Number(c.count);
        const out = [];
        for (let r = first; r < first + count; r++) {{
            const row = m.cached(r); if (!row) continue;
            out.push({{ row: r, w: m.rowRect(r).w, size: row.meta.total_size }});
        }}
        return {{ scale: m.scale, max: m.maxSize, cells: Number(c.cells), rows: out }}; }}"""


def check_map_to_scale(page, path: Path, view: str = VIEW) -> dict:
    """The view (`path`'s panel) toggled to "to scale": each row's length is its segment's bytes
    to scale of the largest, short ones at the minimum; toggled back, every row is full width.
    The rows read while to scale, as {scale, max, cells, rows: [{row, w, size}]}; the map is
    left to scale."""
    sizes = [int(s) for s in build_rows(load_snapshot(path)).total_size]
    largest = max(sizes)
    toggle = f"""s => ({view})().root
        .querySelector('.gmv-map-mode button[data-scale=' + s + ']').click()"""
    read = read_map(view)
    page.evaluate(toggle, "segment")
    back = page.evaluate(read)
    assert back["scale"] == "segment" and len(back["rows"]) >= 10
    assert all(r["w"] == back["cells"] for r in back["rows"])
    page.evaluate(toggle, "bytes")
    got = page.evaluate(read)
    assert got["scale"] == "bytes" and got["max"] == largest
    cells = got["cells"]
    assert len(got["rows"]) >= 10
    distinct = set()
    for r in got["rows"]:
        assert r["size"] == sizes[r["row"]]
        exact = cells * r["size"] / largest
        if exact >= MIN_ROW_W:
            assert abs(r["w"] - exact) <= 1, r
        else:
            assert r["w"] == MIN_ROW_W, r
        distinct.add(r["w"])
    assert len(distinct) > 1  # sizes differ, so do rows
    return got


def rgb(colour: str) -> tuple[int, int, int]:
    """ "#rrggbb" or "rgb(r, g, b)" as a tuple."""
    if colour.startswith("#"):
        return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))
    r, g, b = (int(float(v)) for v in re.findall(r"[\d.]+", colour)[:3])
    return (r, g, b)


def contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """WCAG 2 contrast ratio of two colours."""

    def lum(c: tuple[int, int, int]) -> float:
        ch = [v / 255 for v in c]
        lin = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in ch]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def set_theme(page, name: str) -> None:
    """Switch JupyterLab's (or Notebook 7's) theme and wait for the page to say it did."""
    page.evaluate(
        "t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", name
    )
    light = "false" if "Dark" in name else "true"
    page.wait_for_function(
        f"() => document.body.dataset.jpThemeLight === '{light}'", timeout=30_000
    )


def read_panel_colours(page, view: str = VIEW) -> dict:
    """The view's colours as drawn: legend swatches by series, bar parts by key, the map's four
    kinds and the text colour."""
    return page.evaluate(
        f"""() => {{ const v = ({view})(); v.timeline.drawNow();
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


def check_panel_colours(panel: dict, theme: str) -> None:
    """The panel's colours (`read_panel_colours`) are `theme`'s palette, its text legible."""
    want = {k: rgb(v) for k, v in palette(theme).items()}
    assert panel["keys"] and panel["parts"]
    for series, colour in panel["keys"].items():
        assert rgb(colour) == want[series], series
    # the text stays legible on the panel's background, muted words too
    assert contrast(rgb(panel["text"]), want["bg"]) >= 4.5
    assert contrast(want["muted"], want["bg"]) >= 4.5
    assert rgb(panel["parts"]["allocated"]) == want["allocated"]
    assert rgb(panel["parts"]["releasable"]) == want["releasable"]
    assert rgb(panel["parts"]["stays"]) == want["trapped"]
    assert [tuple(k) for k in panel["kinds"]] == [
        want[k] for k in ("allocated", "pending", "releasable", "trapped")
    ]


def check_report_and_plot(page, panel: dict, theme: str, report: Path, artifacts: Path) -> None:
    """The same series have the panel's colours (`read_panel_colours`) in `report` (an HTML
    report of a recording, opened in a new page in `theme`'s colour scheme) and in a plot."""
    from gpumemviz.allocator.workloads import run, training_loop
    from gpumemviz.render.plots import timeline

    want = {k: rgb(v) for k, v in palette(theme).items()}
    page2 = page.context.new_page()
    try:
        page2.emulate_media(color_scheme=theme)
        page2.goto(Path(report).resolve().as_uri())
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
    finally:
        page2.close()
    assert shown["keys"] and rgb(shown["bg"]) == want["bg"]
    assert [tuple(k) for k in shown["kinds"]] == [tuple(k) for k in panel["kinds"]]
    for series, colour in shown["keys"].items():
        assert rgb(colour) == want[series] == rgb(panel["keys"][series]), series
    # the plot's figure JSON
    fig = timeline(run(training_loop(iterations=1)), theme=theme).to_plotly_json()
    lines = {t["name"]: t["line"]["color"] for t in fig["data"] if t.get("mode") == "lines"}
    assert lines and rgb(lines["allocated"]) == want["allocated"]
    assert rgb(lines["reserved"]) == want["reserved"]
    for name, series in (("allocated", "allocated"), ("reserved", "reserved")):
        if series in panel["keys"]:
            assert rgb(lines[name]) == rgb(panel["keys"][series])
