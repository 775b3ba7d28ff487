"""live/forecast.py: the time to OOM from a sampler's history, on the simulated demo's runs.

The simulated source runs on a clock of its own here (each reading stamped at its step count
over the demo's pace), so a minute of the demo takes a fraction of a second and the OOM's time
is known exactly: the forecast is checked against it.
"""

from __future__ import annotations

import pytest

from gpumemviz.allocator.workloads import WORKLOADS, training_loop
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.live.forecast import MIN_SPAN_S, WARMUP_S, LiveForecast, limit_of, live_forecast
from gpumemviz.live.history import History
from gpumemviz.live.sources.simulated import SimulatedSource

PACE = 400.0  # the demo's allocator calls per second
TICK = 200  # calls between readings: one reading per 0.5 s, the sampler's default interval
SEGMENTS_EVERY = 4  # segment state every 2 s, as the sampler reads it
T0 = 1.7e9


def drive(
    workload: object, *, flat_after: int | None = None
) -> tuple[list[tuple[float, LiveForecast]], float, int]:
    """Run `workload` to its end (or OOM), reading it into a History each TICK calls and
    forecasting from it. With `flat_after`, the program runs that many calls before the first
    reading, then stands still for 300 readings (a flat run). Returns each reading's (seconds,
    forecast), the seconds at the end, and the OOMs seen."""
    src = SimulatedSource(workload, autostart=False, loop=False)  # type: ignore[arg-type]
    history = History()
    headroom: list[tuple[float, int]] = []
    out = []
    steps = 0
    if flat_after is not None:
        src.step(flat_after)
    for i in range(300 if flat_after is not None else 2000):
        ran = src.step(TICK) if flat_after is None else 0
        steps += ran
        t = steps / PACE if flat_after is None else (i + 1) * TICK / PACE
        read = i % SEGMENTS_EVERY == 0
        sample = history.append(src.sample(segments=read).replace(time=T0 + t))
        if read:
            limit = limit_of(sample)
            assert limit is not None and sample.stats is not None and sample.segments is not None
            largest = fragmentation(sample.segments).largest_free
            headroom.append((T0 + t, max(largest, limit - sample.stats.reserved)))
        found = live_forecast(history.samples(), headroom)
        assert found is not None
        out.append((t, found))
        if flat_after is None and ran < TICK:
            break
    src.close()
    return out, steps / PACE, len(src.ooms)


def test_a_slow_leak_is_forecast_within_a_fifth_of_the_actual_time_to_oom():
    readings, end, ooms = drive("leak")
    assert ooms == 1 and 60 < end < 120  # the demo's leak runs out after about 80 s
    checked = 0
    for t, found in readings:
        shown = found.shown
        if t < WARMUP_S + MIN_SPAN_S + 1:
            assert shown is None  # the warm-up, then too short a span
            continue
        if t > 0.9 * end:
            continue  # the last seconds: a few tenths of a second off is over a fifth
        assert shown is not None, f"no forecast at {t} s"
        left = end - t
        assert abs(shown.seconds - left) <= 0.2 * left, (t, shown.seconds, left)
        assert shown.low <= shown.seconds <= shown.high
        assert shown.sentence.startswith("at this rate, OOM in about ")
        assert found.to_dict()["t_last"] == pytest.approx(T0 + t)
        checked += 1
    assert checked > 80


def test_no_forecast_on_a_flat_run():
    # the leak's first 40 s, then nothing moves for two and a half minutes
    readings, _, ooms = drive("leak", flat_after=round(40 * PACE))
    assert ooms == 0 and len(readings) == 300 and readings[-1][0] == 150
    assert [t for t, found in readings if found.shown is not None] == []


@pytest.mark.parametrize(
    "workload",
    [
        training_loop(iterations=40, min_seq=512, max_seq=512, name="sawtooth"),
        WORKLOADS["training"],  # the training demo: sequence lengths vary, then it runs out
    ],
    ids=["even sawtooth", "training demo"],
)
def test_no_forecast_on_a_training_sawtooth_without_net_growth(workload):
    readings, end, _ = drive(workload)
    assert end > 25  # past the warm-up and the shortest span: the rule was asked
    assert [t for t, found in readings if found.shown is not None] == []


def test_the_window_starts_again_after_an_oom():
    src = SimulatedSource("leak", autostart=False, loop=False)
    history = History()
    for i in range(120):  # a minute of the leak
        src.step(TICK)
        history.append(src.sample(segments=False).replace(time=T0 + i * TICK / PACE))
    grown = live_forecast(history.samples())
    assert grown is not None and grown.shown is not None
    src.step(10**6)  # on to the OOM: a new run starts, with its warm-up
    history.append(src.oom_sample(src.ooms[-1]).replace(time=T0 + 60.5))
    history.append(src.sample(segments=False).replace(time=T0 + 61))
    after = live_forecast(history.samples())
    assert after is not None and after.shown is None and after.to_dict() == {}
    src.close()
