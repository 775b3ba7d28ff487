"""The timeline's data: one point per sample with stats, and markers, bounded and numbered.

Points are numbered from the first one ever appended, so a browser view that holds points up to
``n`` asks only for what follows (`since`); a view that falls behind the bound starts over.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

__all__ = ["FIELDS", "MAX_POINTS", "TimelineData"]

FIELDS = ("t", "allocated", "reserved", "nvml_used", "non_pytorch", "fragmentation")
MAX_POINTS = 4000


class TimelineData:
    """Points ``[t, allocated, reserved, nvml_used, non_pytorch, fragmentation]`` (None where a
    figure is unknown) and markers ``{t, label, kind}``, thread-safe.

    Examples
    --------
    >>> from gpumemviz.sample import MemoryStats, Sample
    >>> tl = TimelineData()
    >>> s = Sample(time=5.0, device=0, stats=MemoryStats.from_torch(
    ...     {"allocated_bytes.all.current": 3, "reserved_bytes.all.current": 8}))
    >>> tl.add_sample(s, fragmentation=0.25)
    [5.0, 3, 8, None, None, 0.25]
    >>> tl.since(0)
    (0, [[5.0, 3, 8, None, None, 0.25]])
    """

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self._points: collections.deque[list] = collections.deque(maxlen=max_points)
        self._marks: collections.deque[dict] = collections.deque(maxlen=500)
        self._count = 0  # points ever appended
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return self._count

    def add_sample(self, sample: Any, fragmentation: float | None = None) -> list | None:
        """Append the sample's figures; None (nothing appended) for a sample without stats."""
        stats = getattr(sample, "stats", None)
        if stats is None:
            return None
        nvml = getattr(sample, "nvml", None)
        used = nvml.used if nvml is not None and nvml.available else None
        point = [
            float(sample.time),
            int(stats.allocated),
            int(stats.reserved),
            used,
            sample.non_pytorch_bytes,
            None if fragmentation is None else round(float(fragmentation), 4),
        ]
        with self._lock:
            self._points.append(point)
            self._count += 1
        return point

    def add_mark(self, t: float, label: str, kind: str = "mark") -> dict:
        mark = {"t": float(t), "label": str(label), "kind": str(kind)}
        with self._lock:
            self._marks.append(mark)
        return mark

    def since(self, n: int) -> tuple[int, list[list]]:
        """``(first, points)``: the points numbered ``n`` and after that are still held."""
        with self._lock:
            first = self._count - len(self._points)
            start = max(int(n), first)
            return start, list(self._points)[start - first :]

    def marks(self) -> list[dict]:
        with self._lock:
            return list(self._marks)

    def points_between(self, t0: float, t1: float) -> list[list]:
        with self._lock:
            return [p for p in self._points if t0 <= p[0] <= t1]
