"""The live forecast on the timeline in a real JupyterLab (issue 32, item 4): the leak demo
gets the dashed projection and the sentence; the RL demo, run beside it as long, none: its
memory is a sawtooth whose peaks do not rise (each rollout and update in its private pools and
back). Not the training demo: its reserved memory does climb to an OOM (longer sequences and the
fragmentation they leave), so a forecast there, once a loaded machine slows it past the 25 s a
forecast needs, is right."""

from __future__ import annotations

import pytest

from .test_panel_browser import _wait_drawn

pytestmark = pytest.mark.browser

# each panel's forecast as drawn: the projection's ends (pixels) and the sentence shown
DRAWN = """() => Object.values(window.__gpumemviz.views).map(v => {
    const canvas = v.root.querySelector('.gmv-timeline canvas');
    const said = v.root.querySelector('.gmv-tl-forecast');
    const key = said && !said.hidden && said.querySelector('.gmv-tl-swatch');
    return { status: v.root.dataset.view, line: canvas ? canvas.dataset.forecast : '',
             sentence: said && !said.hidden ? said.textContent : '',
             key: key ? [getComputedStyle(key).borderTopStyle, getComputedStyle(key).borderTopColor,
                         getComputedStyle(said).color] : null,
             points: v.timeline.points.length };
})"""


# the demo a panel of `%gpumemviz --demo NAME` shows (one panel each: the magic shows one panel
# per device, and both demos simulate device 0)
DEMO = """
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.widget import MemoryPanel

def demo(name):
    sampler = Sampler(SimulatedSource(name), interval=0.25)
    panel = MemoryPanel()
    panel.attach(sampler, owned=True)
    sampler.start()
    return panel
"""


def test_the_forecast_shows_on_the_leak_demo_and_not_on_a_flat_sawtooth(page, notebook, artifacts):
    nb = notebook(
        "forecast.ipynb",
        [DEMO, "demo('leak')", "demo('rl_mempools')"],
    )
    nb.run(0)
    nb.run(1)
    nb.run(2)
    _wait_drawn(page)
    # both demos run side by side; the page notes, every half second, whether the RL
    # panel ever drew a forecast, until the leak's appears (10 s of warm-up, then 15 s of
    # readings at least)
    page.evaluate(
        f"""() => {{ window.__gmvSeen = [];
            window.__gmvPoll = setInterval(() => window.__gmvSeen.push(({DRAWN})()), 500); }}"""
    )
    page.wait_for_function(
        f"() => {{ const d = ({DRAWN})(); return d.length === 2 && d[0].sentence !== ''; }}",
        timeout=90_000,
    )
    page.evaluate("() => clearInterval(window.__gmvPoll)")
    page.locator(".gmv-timeline").first.screenshot(path=str(artifacts / "forecast_leak.png"))
    leak, flat = page.evaluate(DRAWN)
    seen = page.evaluate("() => window.__gmvSeen")
    assert leak["sentence"].startswith("at this rate, OOM in about ")
    # the sentence is the projection's legend: a dash in the line's (the OOM) colour before it
    style, colour, text_colour = leak["key"]
    assert style == "dashed" and colour == text_colour, leak["key"]
    x0, y0, x1, y1 = map(int, leak["line"].strip("[]").split(","))
    assert x1 > x0 and y1 < y0  # rising to the right, toward the limit
    assert len(seen) >= 40  # the RL panel was watched for 20 s at least
    assert all(s[1]["line"] == "" and s[1]["sentence"] == "" for s in seen if len(s) == 2)
    assert flat["points"] > 40 and flat["sentence"] == "" and flat["line"] == ""
