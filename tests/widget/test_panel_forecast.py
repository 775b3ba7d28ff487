"""The panel's ``forecast`` trait: the live forecast (live/forecast.py) of the sampler's
history, sent to the timeline; none on a run without clear growth."""

from __future__ import annotations

from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.widget.panel import MemoryPanel

T0 = 1.7e9


def _panel_after(workload: str, seconds: float) -> MemoryPanel:
    """A panel on `workload`'s sampler after `seconds` of the demo, read every half second
    (stamped on the demo's own clock: 400 calls a second)."""
    src = SimulatedSource(workload, autostart=False, loop=False)
    sampler = Sampler(src)
    panel = MemoryPanel()
    panel.attach(sampler, owned=True)
    for i in range(round(seconds * 2)):
        src.step(200)
        sample = sampler.history.append(src.sample(segments=i % 4 == 0).replace(time=T0 + i / 2))
        panel.push_sample(sample)
        panel.flush()
    return panel


def test_the_leak_demo_sends_a_forecast_to_the_timeline():
    panel = _panel_after("leak", 45)
    try:
        f = panel.forecast
        assert f["sentence"].startswith("at this rate, OOM in about ")
        assert 25 < f["seconds"] < 50  # the leak runs out about 83 s in
        assert f["low"] <= f["seconds"] <= f["high"]
        assert T0 + 43.5 <= f["t_last"] <= T0 + 44.5  # forecast once a second of readings
        assert 0 < f["level"] < f["capacity"]
    finally:
        panel.close()


def test_the_training_demo_sends_none():
    panel = _panel_after("training", 26)
    try:
        assert panel.sampler is not None and len(panel.sampler.history) == 52
        assert panel.forecast == {}
    finally:
        panel.close()
