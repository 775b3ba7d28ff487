"""The panel in Notebook 7 (built on JupyterLab's parts, a front end of its own): the live demo
updates, a button acts, and the device bar and timeline read as in JupyterLab. Skipped (one
line) where the `notebook` package is not installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from .labtools import Lab, Notebook, running_lab
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
