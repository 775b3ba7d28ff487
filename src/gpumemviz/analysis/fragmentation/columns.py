"""Both ways in, one set of columns: a torch dict read by `snapshot.read_torch` (only what the
analysis needs, no Snapshot built) or a Snapshot's own columns, reduced the same way."""

from __future__ import annotations

import numpy as np

from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.analysis.fragmentation.pools import released_mask
from gpumemviz.analysis.fragmentation.reduce import make_columns, reduce_columns
from gpumemviz.analysis.fragmentation.report import FragmentationReport
from gpumemviz.analysis.fragmentation.settings import parse_settings, snapshot_settings
from gpumemviz.snapshot import ALLOCATED, INACTIVE, PENDING_FREE, Snapshot, read_torch
from gpumemviz.snapshot.schema import TorchDict, TorchList


def from_torch(
    obj: TorchDict | TorchList, pools_in_use: bool | frozenset[tuple[int, int]] = True
) -> FragmentationReport:
    """A torch dict or bare segment list, read by the reader `Snapshot.from_torch` uses."""
    cols = read_torch(obj, full=False)
    settings = cols.allocator_settings
    parsed = parse_settings(settings)
    return _report(cols.seg, cols.blk, settings, parsed, cols.traced_devices(), pools_in_use)


def from_snapshot(
    snap: Snapshot, pools_in_use: bool | frozenset[tuple[int, int]] = True
) -> FragmentationReport:
    sg, bl = snap.segments, snap.blocks
    seg = {k: getattr(sg, k) for k in _SEG_COLUMNS}
    seg["block_count"] = sg.block_count
    blk = {"size": bl.size, "requested_size": bl.requested_size, "state": bl.state}
    parsed = snapshot_settings(snap)  # the snapshot's own parse (`Snapshot.config`)
    return _report(seg, blk, snap.allocator_settings, parsed, tuple(snap.devices), pools_in_use)


_SEG_COLUMNS = ("device", "address", "total_size", "stream", "is_small", "is_expandable", "pool_id")


def _report(
    seg: dict[str, np.ndarray],
    blk: dict[str, np.ndarray],
    settings: object,  # the recorded allocator_settings, as given
    parsed: tuple[AllocatorConfig, bool],  # them read leniently (`parse_settings`)
    devices: tuple[int, ...],
    pools_in_use: bool | frozenset[tuple[int, int]],
) -> FragmentationReport:
    """Per-segment sums and the inactive and pending-free blocks (segment, offset, size), from
    one row per block in segment order; then the shared reduction."""
    count = np.asarray(seg["block_count"], dtype=np.int64)
    n = len(count)
    start = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(count[:-1], out=start[1:])
    state = np.asarray(blk["state"])
    size = np.asarray(blk["size"], dtype=np.int64)
    is_alloc = state == ALLOCATED
    alloc = _seg_sum(np.where(is_alloc, size, 0), start, count)
    req = np.asarray(blk["requested_size"], dtype=np.int64)
    req = _seg_sum(np.where(is_alloc, req, 0), start, count)
    # the inactive and pending-free blocks only (a third of them): segment and offset in it
    before = np.cumsum(size) - size  # bytes of all blocks before each
    ends = start + count
    fseg, foff, fsel = _where(np.flatnonzero(state == INACTIVE), ends, start, before)
    pseg, poff, psel = _where(np.flatnonzero(state == PENDING_FREE), ends, start, before)
    pool_id = np.asarray(seg["pool_id"], dtype=np.int64).reshape(n, 2)
    cols = make_columns(
        device=np.asarray(seg["device"], dtype=np.int64),
        address=np.asarray(seg["address"], dtype=np.int64),
        total_size=np.asarray(seg["total_size"], dtype=np.int64),
        allocated=alloc,
        requested=req,
        n_blocks=count,
        stream=np.asarray(seg["stream"], dtype=np.int64),
        is_small=np.asarray(seg["is_small"], dtype=bool),
        is_expandable=np.asarray(seg["is_expandable"], dtype=bool),
        pool_id=pool_id,
        free_segment=fseg,
        free_offset=foff,
        free_size=size[fsel],
        pend_segment=pseg,
        pend_offset=poff,
        pend_size=size[psel],
        config=parsed[0],
        released=released_mask(pool_id, pools_in_use),
    )
    return reduce_columns(cols, settings, devices, parsed, pools_in_use)


def _where(
    rows: np.ndarray, ends: np.ndarray, start: np.ndarray, before: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For block rows: their segment (the first whose blocks end past the row: empty ones end
    where the next starts), their offset in it, and the rows."""
    seg = np.searchsorted(ends, rows, side="right").astype(np.int64, copy=False)
    return seg, before[rows] - before[start[seg]], rows


def _seg_sum(values: np.ndarray, start: np.ndarray, count: np.ndarray) -> np.ndarray:
    cs = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=cs[1:])
    out: np.ndarray = cs[start + count] - cs[start]
    return out
