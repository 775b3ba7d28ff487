"""The panel in Notebook 7 (built on JupyterLab's parts, a front end of its own): the live demo
updates, a button acts, and the device bar and timeline read as in JupyterLab. Skipped (one
line) where the `notebook` package is not installed."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator

import pytest

from .labtools import Lab, Notebook, running_lab
from .test_looks_browser import LIVE, READ_BAR, SHOWN, _check_bar, _kernel_json
from .test_panel_browser import VIEW, _wait_drawn

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


def test_the_device_bar_and_the_timeline_read_as_in_jupyterlab(page, notebook7, artifacts):
    """test_looks_browser's checks of the bar (its parts are the findings' figures, to scale)
    and of the timeline (byte axis with units, a legend naming every drawn series)."""
    page.set_viewport_size({"width": 1300, "height": 1000})
    nb = Notebook(page, notebook7, "looks7.ipynb", [LIVE, "src.step(400); panel.flush()", SHOWN])
    try:
        nb.run(0)
        _wait_drawn(page)
        nb.run(1)
        page.wait_for_function(f"() => ({VIEW})().timeline.points.length > 1", timeout=30_000)
        nb.run(2)
        shown = _kernel_json(page, 2)
        want = [p["bytes"] for p in shown["glance"]["bars"][0]["parts"]]
        page.wait_for_function(
            f"""want => {{ const b = ({READ_BAR})();
                return b && JSON.stringify(b.parts.map((p) => p.bytes)) === JSON.stringify(want);
            }}""",
            arg=want,
            timeout=20_000,
        )
        _check_bar(page.evaluate(READ_BAR), shown["glance"], shown["figures"])
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
    finally:
        nb.shutdown()
