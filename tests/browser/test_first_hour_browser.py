"""Issue 35's items that are on screen, in a real JupyterLab: notebook 05's panel names the
user's line by its cell (8) and says its state is the one at peak allocated (15); the
``--device all`` demo's OOM counts never go down when a workload restarts (12); right after a
strip click the timeline never draws the device shown before (13). Each watches what the page
draws, not the kernel's traits alone."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import nbformat
import pytest

from gpumemviz.snapshot.units import format_size

from .looks import kernel_json
from .test_panel_browser import VIEW, _wait_drawn

pytestmark = pytest.mark.browser

NOTEBOOK_05 = Path(__file__).resolve().parents[2] / "example_notebooks" / "05_will_it_fit.ipynb"


def _notebook_05() -> list[str]:
    """Notebook 05's code cells, as shipped (the estimate and the panel: a few seconds here)."""
    nb = nbformat.read(NOTEBOOK_05, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


# the panel's map block allocated at the step's line 14 (`loss = ...cross_entropy(...)`), its
# frame's file (ipykernel's temporary file) and the figures the title names, as JSON text
STEP_LINE = """
import json
from gpumemviz.render.rows import build_rows

rows = build_rows(panel.shown)
raw = panel.shown.to_torch()
found = []
for i, seg in enumerate(raw["segments"]):
    start = 0
    for b in seg["blocks"]:
        for f in b.get("frames") or []:
            if f["name"] == "step" and f["line"] == 14:
                found.append({"row": list(rows.segment).index(i), "offset": start,
                              "size": b["size"], "total": seg["total_size"],
                              "file": f["filename"]})
        start += b["size"]
json.dumps({"blocks": sorted(found, key=lambda x: -x["size"]),
            "peak_allocated": best.peak_allocated, "peak_reserved": best.peak_reserved})
"""


def _run_notebook_05(page, notebook) -> tuple[list[str], dict]:
    cells = _notebook_05()
    nb = notebook("nb05.ipynb", [*cells, STEP_LINE])
    for i in range(len(cells) + 1):
        nb.run(i, timeout=300_000)
    _wait_drawn(page)
    return cells, kernel_json(page, len(cells))


def test_notebook_05_names_the_users_line_by_its_cell(page, notebook, artifacts):
    page.set_viewport_size({"width": 1400, "height": 1000})
    cells, got = _run_notebook_05(page, notebook)
    block = got["blocks"][0]  # the widest block allocated at the step's line 14
    assert "ipykernel" in block["file"]  # the frame names the kernel's temporary file ...
    step_cell = next(i for i, src in enumerate(cells) if "def step(state):" in src)
    count = page.evaluate(
        "i => window.jupyterapp.shell.currentWidget.content.widgets[i].model.executionCount",
        step_cell,
    )
    want = f"cell [{count}], line 14: step"  # ... the panel names the cell, as IPython does
    row = block["row"]
    page.evaluate(f"(row) => ({VIEW})().map.scrollToRow(row)", row)
    _wait_drawn(page, row)
    page.wait_for_function(
        f"row => {{ const r = ({VIEW})().map.cached(row); return r && r.blocks; }}",
        arg=row,
        timeout=20_000,
    )
    page.locator(".gmv-scroll").first.scroll_into_view_if_needed()  # the map, under the bar
    box = page.evaluate(
        f"""([row, mid]) => {{ const v = ({VIEW})(); v.map.drawNow(); const r = v.map.rowRect(row);
            const c = v.map.canvas.getBoundingClientRect();
            return {{ x: c.left + r.x + mid * r.w, y: c.top + r.y + r.h / 2 }}; }}""",
        [row, (block["offset"] + block["size"] / 2) / block["total"]],
    )
    page.mouse.move(box["x"], box["y"])
    tip = page.locator(".gmv-tip").first
    tip.wait_for(state="visible", timeout=5000)
    text = tip.text_content()
    assert f"▶ {want}" in text, text
    assert Path(block["file"]).name not in text and "ipykernel" not in text, text
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "nb05-cell-line.png"))
    page.mouse.move(0, 0)


def test_notebook_05_panel_says_it_is_the_state_at_peak_allocated(page, notebook, artifacts):
    page.set_viewport_size({"width": 1400, "height": 1000})
    _, got = _run_notebook_05(page, notebook)
    title = page.locator(".gmv-title").first.text_content()
    allocated, reserved = format_size(got["peak_allocated"]), format_size(got["peak_reserved"])
    assert title.startswith(f"predicted state at peak allocated ({allocated})"), title
    assert title.endswith(f"peak reserved {reserved}"), title
    # the state shown is the one at peak allocated; reserved there is below the step's peak
    shown = page.evaluate(
        f"""() => Object.fromEntries([...({VIEW})().root.querySelectorAll('[data-fig]')]
            .map((f) => [f.dataset.fig, Number(f.dataset.value)]))"""
    )
    assert shown["allocated"] == got["peak_allocated"]
    assert shown["reserved"] < got["peak_reserved"]
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "nb05-title.png"))


# every drawn change of the strips' OOM counts, the header's and each glance bar's scale,
# recorded on each animation frame until a device's count rose past a count of 1 or more seen
# before (its workload restarted after an OOM) over 10 updates or more, at most `ms`
# milliseconds (page time: a loaded machine runs the demo slower)
RECORD = f"""ms => {{
    const until = performance.now() + ms;
    window.__gmvSeen = [];
    const firstOom = new Map();
    const seqs = new Set();
    let restarted = false;
    let last = "";
    const tick = () => {{
        const v = ({VIEW})();
        const strips = [...v.root.querySelectorAll('.gmv-strip')].map((s) => ({{
            device: Number(s.dataset.device), ooms: Number(s.dataset.ooms),
            text: /OOMs (\\d+)/.exec(s.querySelector('.gmv-strip-figs').textContent)[1] }}));
        const fig = v.root.querySelector('[data-fig=num_ooms]');
        const now = JSON.stringify({{ strips,
            header: fig ? Number(fig.dataset.value) : null,
            scales: [...v.root.querySelectorAll('.gmv-glance-bar')].map((b) => b.dataset.scale),
            seq: Number(v.root.dataset.seq) }});
        if (now !== last) window.__gmvSeen.push(JSON.parse(now));
        last = now;
        seqs.add(Number(v.root.dataset.seq));
        for (const s of strips) {{
            const n = Number(s.text);
            if (n >= 1 && !firstOom.has(s.device)) firstOom.set(s.device, n);
            if (firstOom.has(s.device) && n > firstOom.get(s.device)) restarted = true;
        }}
        const enough = restarted && seqs.size >= 10;
        if (performance.now() < until && !enough) requestAnimationFrame(tick);
        else window.__gmvDone = true;
    }};
    window.__gmvDone = false;
    requestAnimationFrame(tick);
}}"""


def _two_device_demo(page, notebook, workload: str, interval: float) -> None:
    """``%gpumemviz --demo WORKLOAD --device all`` of two simulated devices, drawn."""
    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = notebook(
        f"{workload}.ipynb",
        [
            "%load_ext gpumemviz",
            f"%gpumemviz --demo {workload} --device all --devices 2 --interval {interval}",
        ],
    )
    nb.run(0)
    nb.run(1)
    _wait_drawn(page)


def test_the_demo_oom_counts_never_go_down_when_a_workload_restarts(page, notebook, artifacts):
    """inference_contiguous runs out of memory after ~650 allocator calls (under 2 s at the
    demo's pace), holds the OOM 3 s and starts again: an OOM every ~5 s, so watching until a
    count rises past its first OOM (at most 60 s) sees an OOM, the restart after it and the next
    OOM (which without its restart could not happen)."""
    _two_device_demo(page, notebook, "inference_contiguous", 0.25)
    page.evaluate(RECORD, 60_000)
    page.wait_for_function("() => window.__gmvDone === true", timeout=80_000)
    seen = page.evaluate("() => window.__gmvSeen")
    assert len({s["seq"] for s in seen}) >= 10  # several updates watched
    restarted = set()
    for device in (0, 1):
        counts = [
            (s["strips"][device]["ooms"], int(s["strips"][device]["text"]))
            for s in seen
            if len(s["strips"]) == 2
        ]
        shown = [c[1] for c in counts]
        assert all(c[0] == c[1] for c in counts)  # the strip's figure is its count
        assert shown == sorted(shown), (device, shown)  # never down
        if any(1 <= a < b for a, b in itertools.pairwise(shown)):
            restarted.add(device)  # a workload ends at its OOM: one more means it restarted
    assert restarted, "no workload restarted after an OOM while watched"
    header = [s["header"] for s in seen if s["header"] is not None]
    assert header and header == sorted(header) and max(header) >= 1
    # at an OOM too, each device's bar is to scale of the device (its total is known there)
    assert all(scale == "device" for s in seen for scale in s["scales"]), [
        s["scales"] for s in seen
    ]
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "demo-ooms.png"))


# the timeline's drawn points and the devices they are of, on each animation frame for `ms`:
# a frame's callbacks may run before the timeline's own draw, so what one reads is what the
# frame before painted, after a click when the click came before that frame's callbacks
TIMELINE = f"""ms => {{
    const until = performance.now() + ms;
    window.__gmvTl = [];
    let clicked = null;  // as it was at the frame before
    const tick = () => {{
        const c = ({VIEW})().timeline.canvas.dataset;
        window.__gmvTl.push({{ t: performance.now(), points: Number(c.points || 0),
                              devices: c.devices || "", clicked }});
        clicked = window.__gmvClicked || null;
        if (performance.now() < until) requestAnimationFrame(tick);
        else window.__gmvTlDone = true;
    }};
    window.__gmvTlDone = false;
    requestAnimationFrame(tick);
}}"""


def test_after_a_strip_click_the_timeline_never_draws_the_other_device(page, notebook):
    _two_device_demo(page, notebook, "training", 0.2)
    page.wait_for_function(
        f"""() => {{ const c = ({VIEW})().timeline.canvas.dataset;
            return Number(c.points) > 3 && c.devices === '0'; }}""",
        timeout=30_000,
    )
    page.evaluate(
        """() => document.querySelector(".gmv-strip[data-device='1']").addEventListener(
            "click", () => { window.__gmvClicked = performance.now(); }, { capture: true })"""
    )
    page.evaluate(TIMELINE, 5000)
    page.wait_for_timeout(300)  # a few frames of device 0 first
    page.locator(".gmv-strip[data-device='1']").first.click()
    page.wait_for_function("() => window.__gmvTlDone === true", timeout=20_000)
    frames = page.evaluate("() => window.__gmvTl")
    before = [f for f in frames if f["clicked"] is None]
    after = [f for f in frames if f["clicked"] is not None]
    assert before and all(f["devices"] == "0" and f["points"] > 0 for f in before)
    assert len(after) > 20
    drawn = [f for f in after if f["points"] > 0]
    wrong = [f for f in drawn if f["devices"] != "1"]
    assert not wrong, json.dumps(wrong[:5])
    assert drawn, "device 1's timeline never came"  # and its own history did come
