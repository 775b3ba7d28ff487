"""The model's trace ring: action codes, the clock, and reading entries back.

Entries are tuples `(action, addr, size, stream, time_us)` with `action` an index into
`snapshot.ACTIONS` (the torch action names); the hot paths append them directly through
`_tappend`. `TraceMixin` is mixed into `model.CachingAllocator`.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

from gpumemviz.allocator.state import AllocatorState
from gpumemviz.snapshot import ACTIONS

__all__ = [
    "ALLOC",
    "FREE_COMPLETED",
    "FREE_REQUESTED",
    "OOM",
    "SEGMENT_ALLOC",
    "SEGMENT_FREE",
    "SEGMENT_MAP",
    "SEGMENT_UNMAP",
    "SNAPSHOT",
    "TraceMixin",
]

TraceRow = tuple[str, int, int, int, int]
"""An entry read back (`trace_since`): (action name, addr, size, stream, time_us)."""

# trace action codes: indices into snapshot.ACTIONS (the torch action names)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE = 0, 1, 2, 3, 4
SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM = 5, 6, 7, 8


class TraceMixin(AllocatorState):
    """The trace ring of a `CachingAllocator` (`device_traces` of its snapshots)."""

    def _init_trace(
        self, record_trace: bool, trace_max_entries: int | None, clock: Callable[[], int] | None
    ) -> None:
        if trace_max_entries is not None:
            trace_max_entries = max(1, trace_max_entries)  # torch's setMaxEntries
        self._trace = deque(maxlen=trace_max_entries)
        # the hot paths append `(action, addr, size, stream, tick())` through `_tappend` (None
        # when not recording). time_us is by default a counter that ticks once per entry, so the
        # last entry's time is the number emitted; a custom clock counts them in `_trace_count`.
        self._tappend = self._trace.append if record_trace else None
        self._trace_count = 0
        self._default_clock = clock is None
        self._clock = clock
        self._tick = itertools.count(1).__next__ if clock is None else self._counted_tick

    @property
    def recording(self) -> bool:
        """Whether the model records its history now (torch's ``_record_memory_history``)."""
        return self._record

    def set_recording(self, enabled: bool) -> None:
        """Start or stop recording history, as ``torch.cuda.memory._record_memory_history``
        does: entries already in the ring stay; none are added while it is off."""
        self._record = bool(enabled)
        self._tappend = self._trace.append if enabled else None

    def _emit(self, action: int, addr: int, size: int, stream: int) -> None:
        self._trace.append((action, addr, size, stream, self._tick()))

    def _counted_tick(self) -> int:
        """The tick of a custom clock: count the entry, then read the clock."""
        self._trace_count += 1
        assert self._clock is not None
        return self._clock()

    def trace_len(self) -> int:
        """Trace entries emitted so far (a monotonic index for `trace_since`)."""
        if self._default_clock:
            return self._trace[-1][4] if self._trace else 0
        return self._trace_count

    def trace_since(self, i: int) -> list[TraceRow]:
        """Entries emitted since `trace_len()` was `i`: (action, addr, size, stream, time_us).

        For an `oom` entry the addr field is device_free. Raises ValueError when the ring has
        already dropped some of them.
        """
        count = self.trace_len()
        n = count - i
        if n < 0 or n > len(self._trace):
            raise ValueError(
                f"trace_since({i}): entries from {i} are not in the ring "
                f"({len(self._trace)} kept, {count} emitted)"
            )
        if n == 0:
            return []
        tail = list(itertools.islice(reversed(self._trace), n))  # O(n), not O(ring)
        tail.reverse()
        return [(ACTIONS[a], addr, size, s, t) for a, addr, size, s, t in tail]
