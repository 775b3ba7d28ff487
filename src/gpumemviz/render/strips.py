"""One device as a strip: its header figures and a binned segment map, small enough to publish.

The multi-device panel draws one strip per device and a job's rank grid one per (rank, device),
so both take this one summary: plain JSON numbers, a few hundred bytes, computed from the rows of
the segment map (gpumemviz.render.rows), so a strip's pixels mean what the full map's cells mean.
"""

from __future__ import annotations

import numpy as np

from gpumemviz.render.rows import MAX_CELLS, RowTable, cell_byte, kind_cover
from gpumemviz.render.wire import header_numbers

__all__ = ["STRIP_BINS", "device_bins", "device_summary"]

STRIP_BINS = 64


def device_bins(rows: RowTable, bins: int = STRIP_BINS) -> list[int]:
    """The device's segments laid end to end in map order, cut into `bins` equal cells.

    Each value is a cell byte of gpumemviz.render.rows (allocated level and the main other kind);
    0 for every cell when nothing is reserved.

    >>> from gpumemviz.snapshot import Snapshot
    >>> from gpumemviz.render.rows import build_rows
    >>> seg = {"device": 0, "address": 0, "total_size": 4 << 20, "stream": 0,
    ...        "segment_type": "large", "blocks": [
    ...     {"size": 3 << 20, "requested_size": 3 << 20, "state": "active_allocated"},
    ...     {"size": 1 << 20, "requested_size": 0, "state": "inactive"}]}
    >>> device_bins(build_rows(Snapshot.from_torch([seg])), 4)
    [63, 63, 63, 192]
    """
    if not 1 <= bins <= MAX_CELLS:
        raise ValueError(f"bins must be in 1..{MAX_CELLS}, got {bins}")
    reserved = int(rows.total_size.sum())
    if reserved <= 0:
        return [0] * bins
    base = np.concatenate([[0], np.cumsum(rows.total_size)[:-1]]).astype(np.int64)
    start = (base[rows.span_row] + rows.span_start).astype(np.float64)
    edges = np.linspace(0.0, float(reserved), bins + 1)
    at = kind_cover(start, rows.span_size.astype(np.float64), rows.span_kind, edges)
    cover = np.column_stack([np.maximum(np.diff(a), 0.0) for a in at])
    total = cover.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        fractions = np.where(total > 0, cover / total, 0.0)
    return [int(b) for b in cell_byte(fractions)]


def device_summary(
    rows: RowTable, *, device: int, ooms: int = 0, bins: int = STRIP_BINS
) -> dict[str, int | float | list[int]]:
    """The strip of one device: header figures (bytes), its OOM count and its binned map.

    Keys: device, reserved, allocated, pending_free, free (free in reserved), free_releasable,
    free_trapped, largest_free, fragmentation (external, 0-1), segments, blocks, ooms, bins.

    >>> from gpumemviz.snapshot import Snapshot
    >>> from gpumemviz.render.rows import build_rows
    >>> seg = {"device": 1, "address": 0, "total_size": 4 << 20, "stream": 0,
    ...        "segment_type": "large", "blocks": [
    ...     {"size": 3 << 20, "requested_size": 3 << 20, "state": "active_allocated"},
    ...     {"size": 1 << 20, "requested_size": 0, "state": "inactive"}]}
    >>> s = device_summary(build_rows(Snapshot.from_torch([seg])), device=1, ooms=2, bins=4)
    >>> s["device"], s["free"], s["largest_free"], s["ooms"], s["bins"]
    (1, 1048576, 1048576, 2, [63, 63, 63, 192])
    """
    out: dict[str, int | float | list[int]] = {"device": int(device)}
    out.update(header_numbers(rows))
    out["ooms"] = int(ooms)
    out["bins"] = device_bins(rows, bins)
    return out
