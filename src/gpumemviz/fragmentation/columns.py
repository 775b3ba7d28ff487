"""The Snapshot path: the same columns as the dict walk, from a Snapshot's numpy columns."""

from __future__ import annotations

from typing import Any

import numpy as np

from .reduce import _columns, _reduce, _settings
from .report import FragmentationReport


def _from_snapshot(snap: Any) -> FragmentationReport:
    sg = snap.segments
    bl = snap.blocks
    n = len(sg.total_size)
    state = np.asarray(bl.state)
    size = np.asarray(bl.size, dtype=np.int64)
    start = np.asarray(sg.block_start, dtype=np.int64)
    count = np.asarray(sg.block_count, dtype=np.int64)
    seg_of = np.repeat(np.arange(n, dtype=np.int64), count)
    is_alloc = state == 1
    alloc = _seg_sum(np.where(is_alloc, size, 0), start, count)
    req = np.asarray(bl.requested_size, dtype=np.int64)
    req = _seg_sum(np.where(is_alloc, req, 0), start, count)
    offsets = np.zeros(len(size), dtype=np.int64)
    if len(size):
        excl = np.cumsum(size) - size  # exclusive prefix sum over all blocks
        offsets = excl - excl[start[seg_of]]
    fsel = np.flatnonzero(state == 0)
    psel = np.flatnonzero(state == 2)
    free_segment, pend_segment = seg_of[fsel], seg_of[psel]
    parsed = _settings(snap.allocator_settings)
    cols = _columns(
        device=np.asarray(sg.device, dtype=np.int64),
        address=np.asarray(sg.address, dtype=np.int64),
        total_size=np.asarray(sg.total_size, dtype=np.int64),
        allocated=alloc,
        requested=req,
        n_blocks=count,
        stream=np.asarray(sg.stream, dtype=np.int64),
        is_small=np.asarray(sg.is_small, dtype=bool),
        is_expandable=np.asarray(sg.is_expandable, dtype=bool),
        pool_id=np.asarray(sg.pool_id, dtype=np.int64).reshape(n, 2),
        free_segment=free_segment,
        free_offset=offsets[fsel],
        free_size=size[fsel],
        pend_segment=pend_segment,
        pend_offset=offsets[psel],
        pend_size=size[psel],
        config=parsed[0],
    )
    return _reduce(cols, snap.allocator_settings, tuple(snap.devices), parsed)


def _seg_sum(values: np.ndarray, start: np.ndarray, count: np.ndarray) -> np.ndarray:
    cs = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=cs[1:])
    return cs[start + count] - cs[start]
