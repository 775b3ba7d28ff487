"""The bounded history of a sampler: samples in time order, bounded in bytes.

Every sample keeps its stats; segment state (the blocks, the expensive part) only on the newest
sample that has it and on keyframes, so a panel left open for days holds a fixed amount of
memory while the timeline keeps every tick. Written by the sampler's thread, read by panels,
figures and exports (any thread: one lock).
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from gpumemviz.snapshot.sample import Sample

__all__ = ["History"]

MiB = 1 << 20


class History:
    """Samples in time order, bounded in bytes (estimated from numpy columns).

    Every sample keeps its stats. Segment state (the blocks) is kept only on the newest sample that
    has it and on keyframes (one every ``keyframe_interval`` seconds, and every OOM). When the bound
    is exceeded, the oldest keyframes lose their blocks first (while they hold over half the bound),
    then the oldest samples go.
    """

    def __init__(self, max_bytes: int = 64 * MiB, keyframe_interval: float = 60.0) -> None:
        if max_bytes < 64 * 1024:
            raise ValueError(f"history max_bytes must be at least 64 KiB, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.keyframe_interval = float(keyframe_interval)
        self._lock = threading.Lock()
        # cells are [sample, nbytes] lists, replaced in place when a sample loses its blocks
        self._cells: collections.deque[list[Any]] = collections.deque()
        self._keyframes: collections.deque[list[Any]] = collections.deque()
        self._newest_seg: list[Any] | None = None
        self._last_keyframe = -math.inf
        self._bytes = 0
        self.dropped = 0  # samples evicted
        self.stripped = 0  # samples whose blocks were dropped

    # writing ---------------------------------------------------------------------------------
    def append(self, sample: Sample) -> Sample:
        """Store a sample; returns it as stored (``keyframe`` may be set)."""
        with self._lock:
            if sample.segments is not None:
                is_key = (
                    sample.keyframe
                    or sample.oom is not None
                    or sample.monotonic - self._last_keyframe >= self.keyframe_interval
                )
                if is_key and not sample.keyframe:
                    sample = sample.replace(keyframe=True)
                if is_key:
                    self._last_keyframe = sample.monotonic
                prev = self._newest_seg
                if prev is not None and not prev[0].keyframe:
                    self._strip(prev, "older segment state dropped (the history keeps keyframes)")
            cell: list[Any] = [sample, sample.nbytes]
            self._cells.append(cell)
            self._bytes += cell[1]
            if sample.segments is not None:
                self._newest_seg = cell
                if sample.keyframe:
                    self._keyframes.append(cell)
            self._evict()
            stored: Sample = cell[0]  # as stored: eviction may have dropped its blocks
            return stored

    def _strip(self, cell: list[Any], note: str) -> None:
        sample: Sample = cell[0]
        if sample.segments is None:
            return
        stripped = sample.replace(segments=None, keyframe=False, segments_note=note)
        nbytes = stripped.nbytes
        self._bytes += nbytes - cell[1]
        cell[0], cell[1] = stripped, nbytes
        self.stripped += 1

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._cells:
            old_keys = [c for c in self._keyframes if c is not self._newest_seg]
            key_bytes = sum(c[1] for c in old_keys)
            if old_keys and key_bytes > self.max_bytes // 2:
                cell = old_keys[0]
                self._keyframes.remove(cell)
                self._strip(cell, "keyframe blocks dropped to stay within the history bound")
                continue
            if len(self._cells) == 1:
                cell = self._cells[0]
                if cell[0].segments is None:
                    break  # a single stats sample: nothing left to drop
                with_note = "segment state larger than the history bound: not kept"
                if cell in self._keyframes:
                    self._keyframes.remove(cell)
                self._strip(cell, with_note)
                if cell is self._newest_seg:
                    self._newest_seg = None
                continue
            cell = self._cells.popleft()
            self._bytes -= cell[1]
            self.dropped += 1
            if self._keyframes and self._keyframes[0] is cell:
                self._keyframes.popleft()
            if cell is self._newest_seg:
                self._newest_seg = None

    def clear(self) -> None:
        with self._lock:
            self._cells.clear()
            self._keyframes.clear()
            self._newest_seg = None
            self._bytes = 0

    # reading ---------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Estimated bytes held now (always <= max_bytes once a sample has been stored)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._cells)

    def samples(self) -> list[Sample]:
        """A copy of the stored samples, oldest first."""
        with self._lock:
            return [c[0] for c in self._cells]

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples())

    def latest(self) -> Sample | None:
        with self._lock:
            return self._cells[-1][0] if self._cells else None

    def latest_stats(self) -> Sample | None:
        """The newest sample that holds stats (an OOM's keyframe or a failed read holds none)."""
        with self._lock:
            for cell in reversed(self._cells):
                if cell[0].stats is not None:
                    found: Sample = cell[0]
                    return found
            return None

    def latest_segments(self) -> Sample | None:
        """The newest sample that still holds segment state."""
        with self._lock:
            return self._newest_seg[0] if self._newest_seg is not None else None

    def keyframes(self) -> list[Sample]:
        with self._lock:
            return [c[0] for c in self._keyframes if c[0].segments is not None]

    def series(self, figure: str = "allocated") -> tuple[np.ndarray, np.ndarray]:
        """(times, values) of one stats figure over the history, for timelines.

        ``figure`` is a `MemoryStats` property ("allocated", "reserved", ...) or a raw stats key.
        Samples without stats are skipped. Times are ``time.time()`` seconds.
        """
        times: list[float] = []
        values: list[int] = []
        for s in self.samples():
            if s.stats is None:
                continue
            if figure in s.stats:
                v = s.stats[figure]
            else:
                got: int | None = getattr(s.stats, figure, None)
                if got is None:
                    continue
                v = got
            times.append(s.time)
            values.append(v)
        return np.asarray(times, dtype=np.float64), np.asarray(values, dtype=np.int64)
