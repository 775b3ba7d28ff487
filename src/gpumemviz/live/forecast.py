"""When will a live run run out: the forecast of analysis/forecast.py fed from a sampler's
recent history, for the panel's timeline.

The rule is analysis/forecast.py's and only it (the peaks of 24 spans of the window, a slope
whose 95 % interval lies above zero, at least 20 readings in 8 spans); this module only picks
what it is fed:

* the window: the last `WINDOW_S` seconds of samples, but nothing from the first `WARMUP_S`
  seconds of a run: the history's first reading, or the newest OOM (a run that restarts after
  one grows again from nothing), starts a run. A start's growth (weights loaded, the optimizer's
  state made at the first step) is no trend: a plain training sawtooth would read as a leak.
  And the readings after the warm-up span `MIN_SPAN_S` at least: a few steps of a run whose
  sequence lengths vary climb as the longest one yet arrives;
* the limit: what this process could hold at the newest reading, its reserved bytes plus the
  device's free bytes (NVML) where they are known, else the device's total memory;
* two series: reserved (stats, every tick) and, where the caller kept them, the bytes out of
  reach of the next tensor: the limit less the largest block it could get (the largest free
  block in the segments, or what the device still has free, whichever is larger), read at
  each segment state. The first to reach the limit is the one shown.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpumemviz.analysis.forecast import Forecast, forecast
from gpumemviz.snapshot.sample import Sample
from gpumemviz.snapshot.schema import JsonDict

__all__ = [
    "MIN_SPAN_S",
    "WARMUP_S",
    "WINDOW_S",
    "Forecaster",
    "LiveForecast",
    "limit_of",
    "live_forecast",
]

#: Seconds of recent history the live forecast reads.
WINDOW_S = 30.0
#: Seconds after a run's start (the first reading, or an OOM) the forecast does not read.
WARMUP_S = 10.0
#: Fewest seconds of readings (after the warm-up) a forecast is made from.
MIN_SPAN_S = 15.0
RESERVED = "reserved"
OUT_OF_REACH = "memory out of the next tensor's reach"


@dataclass(frozen=True)
class LiveForecast:
    """The two forecasts of one window (None: no clear growth) and the time of its newest
    reading (Unix seconds), where the projection starts."""

    reserved: Forecast | None
    out_of_reach: Forecast | None
    t_last: float

    @property
    def shown(self) -> Forecast | None:
        """The sooner of the two, or None."""
        found = [f for f in (self.reserved, self.out_of_reach) if f is not None]
        return min(found, key=lambda f: f.seconds) if found else None

    def to_dict(self) -> JsonDict:
        """The panel's ``forecast`` trait: the shown forecast's fields (`Forecast.to_dict`)
        and ``t_last``; {} when there is none."""
        shown = self.shown
        return {} if shown is None else {**shown.to_dict(), "t_last": self.t_last}


def limit_of(sample: Sample) -> int | None:
    """The bytes this process could hold at `sample`: reserved plus the device's free bytes
    (NVML), else the device's total memory; None when neither is known."""
    stats = sample.stats
    nvml = sample.nvml
    if stats is not None and nvml is not None and nvml.available and nvml.free is not None:
        return int(stats.reserved) + int(nvml.free)
    info = sample.device_info
    if info is not None and info.total_memory > 0:
        return int(info.total_memory)
    return None


def live_forecast(
    samples: Sequence[Sample],
    headroom: Sequence[tuple[float, int]] = (),
    *,
    window_s: float = WINDOW_S,
    warmup_s: float = WARMUP_S,
    step_seconds: float | None = None,
) -> LiveForecast | None:
    """The forecast of the window's reserved bytes (and of the bytes out of the next tensor's
    reach, from `headroom`) against the limit; None when no sample holds stats.

    Parameters
    ----------
    samples : sequence of Sample
        A sampler's history, oldest first (`History.samples`).
    headroom : sequence of (float, int)
        (Unix seconds, the largest block the next tensor could get) at each segment state
        read, oldest first; empty: no such forecast.
    window_s : float
        Seconds of history read, back from the newest sample.
    warmup_s : float
        Seconds after the run's start not read.
    step_seconds : float, optional
        One step's length, to say the time in steps too.

    Examples
    --------
    >>> from gpumemviz.snapshot.sample import DeviceInfo, MemoryStats
    >>> info = DeviceInfo(index=0, name="gpu", total_memory=8 << 30)
    >>> def at(t, b):
    ...     stats = MemoryStats.from_torch({"reserved_bytes.all.current": b})
    ...     return Sample(time=t, monotonic=t, device=0, stats=stats, device_info=info)
    >>> flat = live_forecast([at(t, 1 << 30) for t in range(40)])
    >>> rising = live_forecast([at(t, (1 << 30) + t * (64 << 20)) for t in range(40)])
    >>> flat.shown is None, round(rising.shown.seconds)
    (True, 73)
    >>> live_forecast([at(t, (1 << 30) + t * (64 << 20)) for t in range(24)]).shown is None
    True
    """
    stated = [s for s in samples if s.stats is not None]
    if not stated:
        return None
    newest = stated[-1]
    t_last = float(newest.time)
    began = float(samples[0].time)
    for s in samples:  # a restart after an OOM grows from nothing: read only what follows it
        if s.oom is not None:
            began = max(began, float(s.time))
    start = max(t_last - window_s, began + warmup_s)
    limit = limit_of(newest)
    picked = [s for s in stated if s.time > start]
    if not picked or t_last - max(start, float(picked[0].time)) < min(MIN_SPAN_S, window_s):
        return LiveForecast(None, None, t_last)
    times = np.asarray([s.time for s in picked], np.float64)
    reserved = np.asarray([s.stats.reserved for s in picked if s.stats is not None], np.int64)
    by_reserved = forecast(times, reserved, limit, what=RESERVED, step_seconds=step_seconds)
    by_reach = None
    kept = [(t, b) for t, b in headroom if start < t <= t_last]
    if limit and kept:
        t = np.asarray([t for t, _ in kept], np.float64)
        out = limit - np.minimum(np.asarray([b for _, b in kept], np.int64), limit)
        by_reach = forecast(t, out, limit, what=OUT_OF_REACH, step_seconds=step_seconds)
    return LiveForecast(by_reserved, by_reach, t_last)


class Forecaster:
    """What a panel keeps for its live forecast: the headroom at each segment state it showed
    (a segment state is read every few seconds; the history keeps few of them) and when it
    last forecast (at most once every `every_s` seconds of readings: each forecast reads the
    history).

    Examples
    --------
    >>> f = Forecaster()
    >>> f.forecast([])
    {}
    """

    def __init__(self, every_s: float = 1.0, kept: int = 1024) -> None:
        self.every_s = float(every_s)
        self._headroom: collections.deque[tuple[float, int]] = collections.deque(maxlen=kept)
        self._next = 0.0

    def reset(self) -> None:
        """Forget the headroom (another sampler, another device)."""
        self._headroom.clear()
        self._next = 0.0

    def note_segments(self, sample: Sample, largest_free: int) -> None:
        """Keep the largest block the next tensor could get at `sample`'s segment state: its
        largest free block, or what the device still has free, whichever is larger."""
        limit = limit_of(sample)
        if limit is None or sample.stats is None:
            return
        self._headroom.append(
            (float(sample.time), max(largest_free, limit - sample.stats.reserved))
        )

    def due(self, t: float) -> bool:
        """Whether `every_s` has passed since the last forecast, by the readings' own times
        (`t`: the newest reading's); then it counts as made."""
        if self._next - self.every_s <= t < self._next:
            return False
        self._next = t + self.every_s
        return True

    def forecast(self, samples: Sequence[Sample]) -> JsonDict:
        """`LiveForecast.to_dict` of `samples` and the headroom kept; {} when none is shown."""
        found = live_forecast(samples, tuple(self._headroom))
        return {} if found is None else found.to_dict()
