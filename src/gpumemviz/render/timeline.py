"""The timeline's data: one point per sample with stats, and markers, bounded and numbered.

Points are numbered from the first one ever appended, so a browser view that holds points up to
``n`` asks only for what follows (`since`); a view that falls behind the bound starts over.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gpumemviz.snapshot.sample import Sample

from gpumemviz.analysis.frames import UNKNOWN

__all__ = [
    "FIELDS",
    "MAX_POINTS",
    "TimelineData",
    "annotation_marks",
    "entry_at_time",
    "envelope",
    "recorded_points",
    "trace_times",
]

FIELDS = ("t", "allocated", "reserved", "nvml_used", "non_pytorch", "fragmentation")
MAX_POINTS = 4000
Point = list[float | None]  # the FIELDS, in order (a list: it travels as JSON)
Mark = dict[str, float | str]  # {t, label, kind}


class TimelineData:
    """Points ``[t, allocated, reserved, nvml_used, non_pytorch, fragmentation]`` (None where a
    figure is unknown) and markers ``{t, label, kind}``, thread-safe.

    Examples
    --------
    >>> from gpumemviz.snapshot.sample import MemoryStats, Sample
    >>> tl = TimelineData()
    >>> s = Sample(time=5.0, device=0, stats=MemoryStats.from_torch(
    ...     {"allocated_bytes.all.current": 3, "reserved_bytes.all.current": 8}))
    >>> tl.add_sample(s, fragmentation=0.25)
    [5.0, 3, 8, None, None, 0.25]
    >>> tl.since(0)
    (0, [[5.0, 3, 8, None, None, 0.25]])
    """

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self._points: collections.deque[Point] = collections.deque(maxlen=max_points)
        self._marks: collections.deque[Mark] = collections.deque(maxlen=500)
        self._count = 0  # points ever appended
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return self._count

    @staticmethod
    def point(sample: Sample, fragmentation: float | None = None) -> Point | None:
        """The sample's point, not appended (the widget compares it with its last one first);
        None for a sample without stats."""
        stats = getattr(sample, "stats", None)
        if stats is None:
            return None
        nvml = getattr(sample, "nvml", None)
        return [
            float(sample.time),
            int(stats.allocated),
            int(stats.reserved),
            nvml.used if nvml is not None and nvml.available else None,
            sample.non_pytorch_bytes,
            None if fragmentation is None else round(float(fragmentation), 4),
        ]

    def append(self, point: Point) -> None:
        with self._lock:
            self._points.append(point)
            self._count += 1

    def add_sample(self, sample: Sample, fragmentation: float | None = None) -> Point | None:
        """Append the sample's figures; None (nothing appended) for a sample without stats."""
        point = self.point(sample, fragmentation)
        if point is not None:
            self.append(point)
        return point

    def add_mark(self, t: float, label: str, kind: str = "mark") -> Mark:
        mark: Mark = {"t": float(t), "label": str(label), "kind": str(kind)}
        with self._lock:
            self._marks.append(mark)
        return mark

    def reset(self, points: list[Point], marks: list[Mark]) -> None:
        """Hold exactly these points (numbered from 0) and markers: a recorded run's own
        timeline replaces the sampled one."""
        with self._lock:
            self._points.clear()
            self._points.extend(points[-(self._points.maxlen or len(points)) :])
            self._count = len(points)
            self._marks.clear()
            self._marks.extend(marks)

    def since(self, n: int) -> tuple[int, list[Point]]:
        """``(first, points)``: the points numbered ``n`` and after that are still held."""
        with self._lock:
            first = self._count - len(self._points)
            start = max(int(n), first)
            return start, list(self._points)[start - first :]

    def marks(self) -> list[Mark]:
        with self._lock:
            return list(self._marks)

    def points_between(self, t0: float, t1: float) -> list[Point]:
        with self._lock:
            # a point's t is never None (the one figure always known)
            return [p for p in self._points if p[0] is not None and t0 <= p[0] <= t1]


def recorded_points(
    trace: Sequence[object] | np.ndarray,
    allocated: Sequence[int] | np.ndarray,
    reserved: Sequence[int] | np.ndarray,
    max_points: int = MAX_POINTS,
) -> list[Point]:
    """Timeline points of a recorded trace, one per entry: t from the entry's ``time_us`` (in
    seconds; the entry index when the trace has no times), the replayed allocated and reserved.
    `trace`: the entry dicts, or their ``time_us`` column (int64, -1 where an entry has none:
    a `Snapshot` trace's ``time_us``).

    Longer traces keep their `envelope`: per bucket of entries, those with the most and the
    least allocated and reserved (peaks and troughs survive).

    >>> recorded_points([{"time_us": 2_000_000}, {"time_us": 3_500_000}], [512, 0], [2 << 20] * 2)
    [[2.0, 512, 2097152, None, None, None], [3.5, 0, 2097152, None, None, None]]
    """
    n = min(len(trace), len(allocated), len(reserved))
    if n == 0:
        return []
    if isinstance(trace, np.ndarray):
        column = trace[:n]
        timed = not (column == -1).any()
        t = column / 1e6 if timed else np.arange(n, dtype=np.float64)
    else:
        times = [_time_us(e.get("time_us")) if isinstance(e, dict) else None for e in trace[:n]]
        timed = None not in times
        t = np.array(times, np.float64) / 1e6 if timed else np.arange(n, dtype=np.float64)
    alloc = np.asarray(allocated[:n], np.int64)
    res = np.asarray(reserved[:n], np.int64)
    keep = envelope(max_points, alloc, res)
    return [[float(t[i]), int(alloc[i]), int(res[i]), None, None, None] for i in keep.tolist()]


def envelope(points: int, *series: np.ndarray) -> np.ndarray:
    """The entries to draw of equally long `series`: all when there are at most `points`;
    else, per bucket of consecutive entries, the first entry with each series' maximum and
    minimum there (in order), at most `points` entries in all.

    A line through them is each series' min/max envelope (M4 decimation without the ends):
    every peak and every trough of every series is an entry kept, with its true values.

    >>> envelope(4, np.array([1, 9, 2, 0, 5, 3, 8, 1]))
    array([1, 3, 6, 7])
    >>> envelope(10, np.array([1, 9, 2]))
    array([0, 1, 2])
    """
    n = len(series[0]) if series else 0
    if n <= points:
        return np.arange(n)
    buckets = max(1, points // (2 * len(series)))
    starts = np.unique(np.linspace(0, n, buckets + 1).astype(np.int64)[:-1])
    bucket = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    keep = []
    for s in series:
        for reduce in (np.maximum, np.minimum):
            hit = np.flatnonzero(s == reduce.reduceat(s, starts)[bucket])
            keep.append(hit[np.unique(bucket[hit], return_index=True)[1]])  # first per bucket
    return np.unique(np.concatenate(keep))


def annotation_marks(annotations: Sequence[object] | None, device: int) -> list[Mark]:
    """Markers from a snapshot's ``external_annotations`` (``record_function`` scopes recorded
    with the history) for one device: a labelled mark where a scope starts, a plain line where
    it ends. Entries without a time are skipped.

    >>> annotation_marks([{"stage": "START", "name": "step", "device": 0, "time_us": 5_000_000},
    ...                   {"stage": "END", "name": "step", "device": 0, "time_us": 6_000_000},
    ...                   {"stage": "START", "name": "other", "device": 1, "time_us": 1}], 0)
    [{'t': 5.0, 'label': 'step', 'kind': 'annotation'}, {'t': 6.0, 'label': 'step', 'kind': 'cell'}]
    """
    out: list[Mark] = []
    if not isinstance(annotations, list | tuple):  # malformed: no markers
        return out
    for a in annotations:
        if not isinstance(a, dict) or a.get("device", device) != device:
            continue
        t = _time_us(a.get("time_us"))
        if t is None:
            continue
        stage, name = a.get("stage", "START"), a.get("name", "")
        start = not (type(stage) is str and stage.upper() == "END")
        out.append(
            {
                "t": t / 1e6,
                "label": (name if type(name) is str else UNKNOWN)[:80],
                "kind": "annotation" if start else "cell",
            }
        )
    return out


def _time_us(t: object) -> int | float | None:
    """A recorded ``time_us``, or None where it is not a number within an int64 (a field from
    a file may hold anything: a bool, NaN, an int beyond any clock)."""
    if type(t) is int and -(1 << 63) <= t < 1 << 63:
        return t
    if type(t) is float and math.isfinite(t) and abs(t) < 2.0**63:
        return t
    return None


def trace_times(trace: Sequence[object] | np.ndarray) -> np.ndarray | None:
    """Each trace entry's recorded ``time_us`` (torch >= 2.2), made non-decreasing so a time
    maps to one entry; None when the trace carries no times (older torch: events only).
    `trace`: the entry dicts, or their ``time_us`` column (-1 where an entry has none).

    Examples
    --------
    >>> trace_times([{"time_us": 10}, {"time_us": 30}, {"time_us": 20}]).tolist()
    [10, 30, 30]
    >>> trace_times([{"action": "alloc"}]) is None
    True
    >>> trace_times(np.array([10, -1, 5])).tolist()
    [10, 10, 10]
    """
    if isinstance(trace, np.ndarray):
        column = np.where(trace > 0, trace, 0).astype(np.int64)
    else:
        raw = [_time_us(e.get("time_us")) if isinstance(e, dict) else None for e in trace]
        column = np.array([int(t) if t is not None and t > 0 else 0 for t in raw], np.int64)
    if not column.any():
        return None
    return np.maximum.accumulate(column)


def entry_at_time(times: np.ndarray, time_us: float) -> int:
    """The trace entry at or before ``time_us`` (-1: before the first entry).

    Examples
    --------
    >>> entry_at_time(np.array([10, 20, 20, 40]), 25)
    2
    >>> entry_at_time(np.array([10, 20]), 5)
    -1
    """
    return int(np.searchsorted(times, time_us, side="right")) - 1
