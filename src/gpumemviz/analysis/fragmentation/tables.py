"""The tables a `FragmentationReport` holds: per-segment figures and the free blocks, as numpy
columns. They sit below `report` and `fit`, so the fit reads the tables it is handed and never
the report that holds them (the report calls `fit.can_fit`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FreeBlocks", "SegmentFigures"]


@dataclass(frozen=True, eq=False)
class SegmentFigures:
    """Per-segment figures as numpy columns, one row per segment in snapshot order.

    Properties `stuck_free` (what empty_cache leaves free in each segment) and
    `external_fragmentation` are derived columns.
    """

    device: np.ndarray  # i64
    address: np.ndarray  # i64
    total_size: np.ndarray  # i64
    allocated: np.ndarray  # i64
    pending_free: np.ndarray  # i64
    requested: np.ndarray  # i64 (active_allocated blocks only)
    free: np.ndarray  # i64
    largest_free: np.ndarray  # i64
    free_sq: np.ndarray  # f64: sum of squared inactive block sizes
    releasable: np.ndarray  # i64: what empty_cache returns from this segment (once its pool may)
    n_blocks: np.ndarray  # i64
    stream: np.ndarray  # i64
    is_small: np.ndarray  # bool
    is_expandable: np.ndarray  # bool
    pool_id: np.ndarray  # (n, 2) i64

    def __len__(self) -> int:
        return len(self.total_size)

    @property
    def stuck_free(self) -> np.ndarray:
        """Free bytes left after empty_cache (which completes pending frees first): free +
        pending_free - releasable (trapped blocks, or slivers of expandable pages)."""
        stuck: np.ndarray = np.maximum(self.free + self.pending_free - self.releasable, 0)
        return stuck

    @property
    def external_fragmentation(self) -> np.ndarray:
        """1 - largest_free / free per segment (0.0 where free is 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = 1.0 - self.largest_free / self.free
        return np.where(self.free > 0, frac, 0.0)


@dataclass(frozen=True, eq=False)
class FreeBlocks:
    """The inactive and pending-free blocks of a snapshot, as int64 numpy columns: one row per
    block, in snapshot order (so by segment, ascending, then by offset).

    `can_fit` searches the inactive blocks (best fit, the expandable-size walk, what max_split_size
    hands back); the pending-free ones are not reused until their events complete, but the
    allocator's flush completes them, so the expandable layout after a flush counts them too.

    Attributes
    ----------
    segment, offset, size : numpy.ndarray of int64
        Each inactive block's segment (its row in `FragmentationReport.per_segment`), its offset
        from the segment's address, and its size in bytes.
    pending_segment, pending_offset, pending_size : numpy.ndarray of int64
        The same for the ``active_pending_free`` blocks.

    Examples
    --------
    >>> from gpumemviz import fragmentation
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...     {"size": 512, "requested_size": 100, "state": "active_allocated"},
    ...     {"size": (2 << 20) - 512, "requested_size": 0, "state": "inactive"}]}
    >>> free = fragmentation([seg]).free_blocks
    >>> free.segment.tolist(), free.offset.tolist(), free.size.tolist(), len(free.pending_size)
    ([0], [512], [2096640], 0)
    """

    segment: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    pending_segment: np.ndarray
    pending_offset: np.ndarray
    pending_size: np.ndarray
