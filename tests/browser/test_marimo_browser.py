"""The panel in marimo, which renders anywidget natively: `gpumemviz.monitor()` in a marimo
cell shows the live demo updating, and a button acts while no cell runs; while another cell
runs the panel still updates, and a click says it is queued and acts when that cell ends
(docs/panel.md says so). Skipped (one line) where marimo is not installed."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_looks_browser import READ_BAR

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        importlib.util.find_spec("marimo") is None, reason="marimo is not installed"
    ),
]

APP = """
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


if __name__ == "__main__":
    app.run()
"""
VIEW = "() => window.__gpumemviz && Object.values(window.__gpumemviz.views)[0]"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def marimo_app(tmp_path_factory) -> Iterator[str]:
    """`marimo run` of a one-cell app on 127.0.0.1; its URL."""
    base = tmp_path_factory.mktemp("marimo")
    app = base / "panel_app.py"
    app.write_text(APP, encoding="utf-8")
    port = _free_port()
    src = Path(__file__).resolve().parents[2] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    log = (base / "marimo.log").open("wb")
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
    proc = subprocess.Popen(cmd, env=env, cwd=base, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError((base / "marimo.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("marimo did not answer within 60 s")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_the_live_demo_updates_and_a_button_acts_in_marimo(page, marimo_app, artifacts):
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
    bar = page.evaluate(READ_BAR)
    assert bar["scale"] == "device" and sum(p["bytes"] for p in bar["parts"]) == bar["total"]
    assert abs(sum(p["width"] for p in bar["parts"]) - bar["width"]) <= len(bar["parts"])
    for p in bar["parts"]:
        assert abs(p["width"] - p["bytes"] / bar["total"] * bar["width"]) <= 1, p
    # the timeline: a byte axis with units, a legend naming every drawn series
    got = page.evaluate(
        f"""() => {{ const v = ({VIEW})(); v.timeline.drawNow();
            const c = v.timeline.canvas.dataset;
            return {{ ticks: JSON.parse(c.yTicks), series: c.series.split(','),
                      keys: [...v.root.querySelectorAll('.gmv-tl-key')]
                          .map((k) => k.dataset.series) }}; }}"""
    )
    assert got["ticks"][0] == "0" and len(got["ticks"]) >= 2
    assert all(re.fullmatch(r"[\d.]+ (bytes|KiB|MiB|GiB|TiB)", t) for t in got["ticks"][1:])
    assert sorted(got["keys"]) == sorted(got["series"]) and "allocated" in got["series"]
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
