"""gpumemviz's own peaks, and resets of torch's peak counters that gpumemviz did not make.

Framework monitors reset torch's peak counters (``torch.cuda.reset_peak_memory_stats``) at every
log step, so a peak read from torch means "since someone's last reset", and whoever reads it gets
a figure someone else chose. The sampler keeps its own running maximum over its samples instead
(`PeakTracker`), and gpumemviz resets torch's counters only when the panel's "reset peaks" button
asks (`gpumemviz.live.sampler.Sampler.reset_peaks`). torch's peak counters only ever rise until a
reset, so a drop between two samples that gpumemviz did not make is someone else's reset: it is
counted and named (`Peaks.note`), and the panel shows the line. `Peaks`, the value stamped on
each sample, is one of the sample's frozen values (`gpumemviz.snapshot.sample`); this module
keeps the tracker that makes it. When torch's count of
allocations falls too, every counter started over (a new allocator: the demo's next run, or
``reset_accumulated_memory_stats``): gpumemviz's peaks start over with it, and no reset is
counted.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from gpumemviz.snapshot.sample import Peaks

if TYPE_CHECKING:  # the value the tracker reads
    from gpumemviz.snapshot.sample import Sample

__all__ = ["PeakTracker", "Peaks"]

# torch's count of allocations ever made: only a new allocator or reset_accumulated_memory_stats
# lowers it, never reset_peak_memory_stats
_ALLOCATIONS = "allocation.all.allocated"


class PeakTracker:
    """The running maximum over a sampler's samples, and the resets of torch's counters it sees.

    `update` is called with every sample the sampler publishes (samples without stats leave the
    peaks as they are); `reset` starts the maximum again and excuses the next drop of torch's
    counters (the button's own reset).

    Examples
    --------
    >>> from gpumemviz.snapshot.sample import MemoryStats, Sample
    >>> def at(t, alloc, peak):
    ...     stats = MemoryStats.from_torch({"allocated_bytes.all.current": alloc,
    ...                                     "allocated_bytes.all.peak": peak})
    ...     return Sample(time=t, device=0, stats=stats)
    >>> tracker = PeakTracker()
    >>> tracker.update(at(1.0, 5, 9)).allocated
    5
    >>> tracker.update(at(2.0, 2, 9)).allocated
    5
    >>> p = tracker.update(at(3.0, 2, 2))  # torch's peak fell: someone reset it
    >>> p.allocated, p.torch_resets, p.last_torch_reset
    (5, 1, 3.0)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._peaks: Peaks | None = None
        # torch's peak counters (allocated, reserved) and its count of allocations
        self._torch: tuple[int, int, int] | None = None
        self._resets = 0
        self._last_reset: float | None = None

    @property
    def peaks(self) -> Peaks | None:
        """The peaks so far (None before the first sample with stats)."""
        return self._peaks

    def update(self, sample: Sample) -> Peaks | None:
        """Fold one sample in; returns the peaks up to it (the same object when unchanged)."""
        stats = sample.stats
        if stats is None:
            return self._peaks
        with self._lock:
            now = (stats.peak_allocated, stats.peak_reserved, stats.get(_ALLOCATIONS, 0))
            prev, old = self._torch, self._peaks
            if prev is not None and now[2] < prev[2]:
                old = None  # every counter started over: a new allocator (the demo's next run)
            elif prev is not None and (now[0] < prev[0] or now[1] < prev[1]):
                self._resets += 1
                self._last_reset = sample.time
            self._torch = now
            new = Peaks(
                allocated=stats.allocated if old is None else max(old.allocated, stats.allocated),
                reserved=stats.reserved if old is None else max(old.reserved, stats.reserved),
                since=sample.time if old is None else old.since,
                torch_resets=self._resets,
                last_torch_reset=self._last_reset,
            )
            if new != old:
                self._peaks = new
            return self._peaks

    def reset(self) -> None:
        """Start the maximum again from the next sample; torch's counters, reset at the same
        time by the caller, are not counted as someone else's reset."""
        with self._lock:
            self._peaks = None
            self._torch = None
