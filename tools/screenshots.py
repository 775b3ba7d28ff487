"""Regenerate the docs' pictures from the real panel: ``make screenshots``.

A picture copied in by hand goes stale the day the panel changes; these are taken from the
panel itself, in JupyterLab and Debian's Chromium (the browser tests' harness,
tests/browser/labtools.py), so README and docs never show a panel that no longer exists.
`SHOTS` names every image this script writes; tests/render/test_render_images.py checks that
every image README.md and docs/*.md link is one of them.

Run: PYTHONPATH=$PWD/src .venv/bin/python tools/screenshots.py [--only docs/panel.png]
(the kernel imports gpumemviz from PYTHONPATH: give it the checkout's src as an absolute path).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Every image this script writes (relative to the repository), and what it shows.
SHOTS = {
    "docs/panel.png": "the simulated training workload held at its OOM: the device bar, the "
    "figures, the OOM verdict, the advice, the timeline and the segment map",
    "docs/panel-replay.png": "notebook 03's replay: the timeline's byte axis, legend and thinned "
    "marker labels, and the map drawn to scale",
    "docs/panel-dark.png": "the same live panel in JupyterLab's dark theme",
    "docs/panel-forecast.png": "the leak demo's timeline with the live forecast: the dashed "
    "projection to the limit, its band and its sentence",
    "docs/panel-holders.png": "the holders view of a real recording (volcengine/verl, in "
    "tests/data/real): the call-path icicle and the table by frame",
}

LIVE_OOM = """
import gpumemviz
from gpumemviz.live.sources.simulated import SimulatedSource

# the training workload at 6x speed, held at its out-of-memory error
src = SimulatedSource("training", steps_per_second=2500, loop=False)
panel = gpumemviz.monitor(source=src, interval=0.25)
panel
"""
# the first view on the page (the test hooks register it)
VIEW = "Object.values(window.__gpumemviz.views)[0]"
WAIT_OOM = f"""() => {{ const v = window.__gpumemviz && {VIEW};
    if (!v || !v.root.dataset.seq) return false;
    const o = v.root.querySelector('.gmv-oom');
    return !o.hidden && v.root.querySelector('.gmv-glance-part') !== null
        && v.timeline.points.length > 3; }}"""
LEAK = """
import gpumemviz
from gpumemviz.live.sources.simulated import SimulatedSource

panel = gpumemviz.monitor(source=SimulatedSource("leak"), interval=0.25)
panel
"""
WAIT_FORECAST = f"""() => {{ const v = window.__gpumemviz && {VIEW};
    return v && v.timeline.forecast !== null && v.timeline.points.length > 3; }}"""
VERL = REPO / "tests" / "data" / "real" / "volcengine__verl__mem_mempools.pickle"
HOLDERS = ["%load_ext gpumemviz", f"%gpumemviz --replay {VERL}"]
WAIT_HOLDERS = f"""() => {{ const v = window.__gpumemviz && {VIEW};
    return v && v.root.dataset.seq && Number(v.map.canvas.dataset.drawnRows) > 0
        && v.root.querySelector('.gmv-holders table[data-table=holders] tbody tr') !== null; }}"""
WAIT_DRAWN = f"""() => {{ const v = window.__gpumemviz && {VIEW};
    return v && v.root.dataset.seq && Number(v.map.canvas.dataset.drawnRows) > 0
        && v.timeline.points.length > 1 && v.root.querySelector('.gmv-glance-part') !== null; }}"""


def _notebook_03_cells() -> list[str]:
    """Notebook 03's cells from its file up to its replay panel."""
    path = REPO / "example_notebooks" / "03_replay_a_snapshot.ipynb"
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    first = next(i for i, src in enumerate(code) if "def find" in src)
    last = next(i for i, src in enumerate(code) if "PlaybackSource" in src)
    return code[first : last + 1]


def _shoot(page, out: Path) -> None:
    page.evaluate(f"() => {{ const v = {VIEW}; v.map.drawNow(); v.timeline.drawNow(); }}")
    root = page.locator(".gmv-root").first
    root.scroll_into_view_if_needed()
    out.parent.mkdir(parents=True, exist_ok=True)
    root.screenshot(path=str(out))
    print(f"wrote {out.relative_to(REPO)}")


def _shoot_part(page, selector: str, out: Path) -> None:
    """One part of the first panel (the timeline, the holders view), drawn now."""
    page.evaluate(f"() => {{ const v = {VIEW}; v.map.drawNow(); v.timeline.drawNow(); }}")
    part = page.locator(selector).first
    part.scroll_into_view_if_needed()
    out.parent.mkdir(parents=True, exist_ok=True)
    part.screenshot(path=str(out))
    print(f"wrote {out.relative_to(REPO)}")


def _theme(page, name: str) -> None:
    page.evaluate(
        "t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", name
    )
    light = "false" if "Dark" in name else "true"
    page.wait_for_function(f"() => document.body.dataset.jpThemeLight === '{light}'")
    page.wait_for_timeout(500)  # the redraws the theme change scheduled


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(SHOTS), help="write only these")
    args = ap.parse_args(argv)
    want = set(args.only or SHOTS)
    sys.path.insert(0, str(REPO / "tests" / "browser"))
    from labtools import CHROMIUM, CHROMIUM_ARGS, TEST_HOOKS, Notebook, running_lab
    from playwright.sync_api import sync_playwright

    with (
        tempfile.TemporaryDirectory(prefix="gpumemviz-shots-") as tmp,
        running_lab(Path(tmp)) as lab,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # tall enough for the whole panel: an element shot shows only what the window shows
        context = browser.new_context(viewport={"width": 1200, "height": 2000})
        context.add_init_script(TEST_HOOKS)
        page = context.new_page()
        if want & {"docs/panel.png", "docs/panel-dark.png"}:
            nb = Notebook(page, lab, "live.ipynb", [LIVE_OOM])
            nb.run(0)
            page.wait_for_function(WAIT_OOM, timeout=120_000)
            if "docs/panel.png" in want:
                _shoot(page, REPO / "docs" / "panel.png")
            if "docs/panel-dark.png" in want:
                _theme(page, "JupyterLab Dark")
                _shoot(page, REPO / "docs" / "panel-dark.png")
                _theme(page, "JupyterLab Light")
            nb.shutdown()
        if "docs/panel-replay.png" in want:
            cells = _notebook_03_cells()
            page.goto("about:blank")
            nb = Notebook(page, lab, "replay.ipynb", cells)
            for i in range(len(cells)):
                nb.run(i, timeout=300_000)
            page.wait_for_function(WAIT_DRAWN, timeout=120_000)
            page.locator(".gmv-map-mode button[data-scale=bytes]").first.click()
            _shoot(page, REPO / "docs" / "panel-replay.png")
            nb.shutdown()
        if "docs/panel-forecast.png" in want:
            page.goto("about:blank")
            nb = Notebook(page, lab, "leak.ipynb", [LEAK])
            nb.run(0)
            page.wait_for_function(WAIT_FORECAST, timeout=120_000)  # ~30 s of readings
            page.wait_for_timeout(5_000)  # a few more readings: the band narrows
            _shoot_part(page, ".gmv-timeline", REPO / "docs" / "panel-forecast.png")
            nb.shutdown()
        if "docs/panel-holders.png" in want:
            page.goto("about:blank")
            nb = Notebook(page, lab, "holders.ipynb", HOLDERS)
            nb.run(0)
            nb.run(1)
            page.wait_for_function(WAIT_HOLDERS, timeout=120_000)
            _shoot_part(page, ".gmv-holders", REPO / "docs" / "panel-holders.png")
            nb.shutdown()
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
