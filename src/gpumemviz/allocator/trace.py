"""The vocabulary of the model's trace ring: action codes and the shapes of its entries.

The ring itself is `model.CachingAllocator`'s (its hot paths append entries directly). An entry
is a tuple `(action, addr, size, stream, time_us, frames)` with `action` an index into
`snapshot.ACTIONS` (the torch action names) and `frames` the block's call site (None where the
caller gave none: segment entries, and every entry of a program that records no stacks);
`dump.torch_trace` writes entries out as torch dicts, `CachingAllocator.trace_since` reads them
back as `TraceRow`s.
"""

from __future__ import annotations

from gpumemviz.snapshot.schema import TorchDict

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
    "Frames",
    "TraceEntry",
    "TraceRow",
]

Frames = list[TorchDict]
"""A call site as torch records it: frame dicts ``{"filename", "line", "name"}``, innermost
first. The model keeps the list it is given (shared, never copied or changed)."""

TraceEntry = tuple[int, int, int, int, int, Frames | None]
"""An entry of the ring: (action code, addr, size, stream, time_us, frames or None)."""

TraceRow = tuple[str, int, int, int, int]
"""An entry read back (`trace_since`): (action name, addr, size, stream, time_us)."""

# trace action codes: indices into snapshot.ACTIONS (the torch action names)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE = 0, 1, 2, 3, 4
SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM = 5, 6, 7, 8
