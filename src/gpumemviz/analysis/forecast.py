"""When will it run out: a forecast of the time to OOM from the recent growth of reserved
memory, shown only when the trend is clear.

A training loop's memory is a sawtooth (activations made in the forward pass, freed after the
backward), so a straight line through every reading would see a trend in every half tooth.
The forecast fits the upper envelope instead: the window is cut into `BINS` equal spans of time
and each span's highest reading (at the time it was read) is one point, the peak the sawtooth
reached there. The rule:

* at least `MIN_SAMPLES` readings in at least `MIN_BINS` spans;
* the least-squares slope of the peaks over time has a 95 % confidence interval (Student's t
  at n - 2 degrees of freedom) that lies wholly above zero;
* then the time to OOM is what is left below the device's capacity (from the fitted level at
  the last reading) over the slope, and its interval is the same over the slope's interval.

A flat run, or a sawtooth whose peaks do not rise, has an interval that holds zero: no
forecast. `docs/forecast.md` says the same for users.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpumemviz.snapshot.schema import JsonDict
from gpumemviz.snapshot.tables import Trace
from gpumemviz.snapshot.units import format_size

__all__ = ["BINS", "MIN_BINS", "MIN_SAMPLES", "Forecast", "forecast", "reserved_series"]

#: Spans of time the window is cut into; each span's peak is one point of the fit.
BINS = 24
#: Fewest spans holding a reading for a forecast.
MIN_BINS = 8
#: Fewest readings for a forecast.
MIN_SAMPLES = 20

# Student's t, two-sided 95 %, by degrees of freedom (1-30); 1.96 beyond.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


@dataclass(frozen=True)
class Forecast:
    """A time to OOM at the present rate: `seconds` from the last reading (`low`, `high`: its
    95 % interval; `high` is inf when the slope's lower bound is tiny), the growth `rate` of the
    peaks in bytes per second (with its interval), the `level` they reached, the `capacity`,
    and in `steps` the same time in steps where a step's length is known."""

    seconds: float
    low: float
    high: float
    rate: float
    rate_low: float
    rate_high: float
    level: int
    capacity: int
    samples: int
    what: str = "reserved"
    steps: float | None = None

    @property
    def sentence(self) -> str:
        """ "at this rate, OOM in about 40 s (32-55 s) / 120 steps"."""
        high = "?" if math.isinf(self.high) else _seconds(self.high)
        steps = f" / {self.steps:.0f} steps" if self.steps is not None else ""
        return (
            f"at this rate, OOM in about {_seconds(self.seconds)} ({_seconds(self.low)} to "
            f"{high}){steps}: {self.what} grows {format_size(round(self.rate))}/s toward "
            f"{format_size(self.capacity)}"
        )

    def to_dict(self) -> JsonDict:
        out: JsonDict = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if math.isinf(self.high):
            out["high"] = None  # JSON has no infinity
        out["sentence"] = self.sentence
        return out


def _seconds(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def forecast(
    times: Sequence[float] | np.ndarray,
    values: Sequence[int] | np.ndarray,
    capacity: int | None,
    *,
    what: str = "reserved",
    step_seconds: float | None = None,
) -> Forecast | None:
    """The time until `values` reach `capacity`, or None when the trend is not clear.

    Parameters
    ----------
    times : sequence of float
        Seconds of each reading, ascending.
    values : sequence of int
        Bytes at each reading (reserved memory).
    capacity : int or None
        The device's bytes (None or 0: unknown, no forecast).
    what : str
        What `values` are, for the sentence.
    step_seconds : float, optional
        The length of one step, to say the time in steps too.

    Returns
    -------
    Forecast or None
        None unless the rule in the module's docstring holds, or the peaks already reach
        the capacity.

    Examples
    --------
    >>> t = np.arange(100.0)
    >>> flat = forecast(t, np.full(100, 1 << 30), 8 << 30)
    >>> rising = forecast(t, (1 << 30) + (1 << 20) * t, (1 << 30) + (1 << 20) * 200)
    >>> flat is None, round(rising.seconds)
    (True, 101)
    """
    if not capacity or capacity <= 0:
        return None
    x = np.asarray(times, np.float64)
    y = np.asarray(values, np.float64)
    if len(x) < MIN_SAMPLES or len(x) != len(y) or not np.isfinite(x).all():
        return None
    span = float(x[-1] - x[0])
    if span <= 0:
        return None
    cut = np.minimum(((x - x[0]) / span * BINS).astype(np.int64), BINS - 1)
    order = np.lexsort((x, y, cut))  # by span, then value, then time
    last = order[np.flatnonzero(np.diff(cut[order], append=BINS) != 0)]  # each span's peak
    if len(last) < MIN_BINS:
        return None
    px, py = x[last], y[last]  # the peak and when it was reached
    n = len(px)
    mx, my = px.mean(), py.mean()
    sxx = float(((px - mx) ** 2).sum())
    slope = float(((px - mx) * (py - my)).sum() / sxx)
    resid = py - (my + slope * (px - mx))
    se = math.sqrt(float((resid**2).sum()) / (n - 2) / sxx)
    half = _t95(n - 2) * se
    low_rate, high_rate = slope - half, slope + half
    if low_rate <= 0:
        return None  # the interval holds zero (or a fall): no clear growth
    level = my + slope * (float(x[-1]) - mx)
    left = capacity - level
    if left <= 0:
        return None
    seconds = left / slope
    return Forecast(
        seconds=seconds,
        low=left / high_rate,
        high=left / low_rate,
        rate=slope,
        rate_low=low_rate,
        rate_high=high_rate,
        level=round(level),
        capacity=int(capacity),
        samples=len(x),
        what=what,
        steps=None if not step_seconds else seconds / step_seconds,
    )


def reserved_series(trace: Trace, final_reserved: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(seconds, reserved bytes) after each timed trace entry, walked back from the final
    reserved bytes through the segment entries; None when the trace has no times.

    Examples
    --------
    >>> t = Trace.from_entries([
    ...     {"action": "segment_alloc", "addr": 0, "size": 2 << 20, "stream": 0, "time_us": 1},
    ...     {"action": "alloc", "addr": 0, "size": 512, "stream": 0, "time_us": 2000001}])
    >>> s, r = reserved_series(t, 2 << 20)
    >>> s.tolist(), r.tolist()
    ([0.0, 2.0], [2097152, 2097152])
    """
    if not len(trace):
        return None
    times = trace.time_us
    timed = times > 0
    if timed.sum() < 2:
        return None
    names = trace.action_names
    sign = np.zeros(len(names), np.int64)
    for name, s in (("segment_alloc", 1), ("segment_map", 1), ("segment_free", -1)):
        sign[names.index(name)] = s
    sign[names.index("segment_unmap")] = -1
    delta = sign[trace.action] * np.maximum(trace.size, 0)
    after = final_reserved - (delta.sum() - np.cumsum(delta))
    t = times[timed].astype(np.float64)
    return (t - t[0]) / 1e6, after[timed]
