"""The segment map as numbers: one row per segment, one byte per cell.

Pure numpy over the Snapshot's columns, so the widget, the offline report and the tests share one
definition of what each pixel means. Nothing here knows about widgets or the wire.

Cell byte: ``(other_kind << 6) | level``. ``level`` (0..63) is the allocated fraction of the cell's
bytes; ``other_kind`` is the non-allocated kind holding most of the rest (`KIND_PENDING`,
`KIND_RELEASABLE` or `KIND_TRAPPED`), or 0 when the cell is entirely allocated (then level = 63).
Byte 0 (kind 0, level 0) never describes bytes, so it marks "no data".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.snapshot.pools import PoolsInUse, normalize_in_use, pool_label, released_mask
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.snapshot import Snapshot

__all__ = [
    "CELL_NO_DATA",
    "KIND_ALLOCATED",
    "KIND_NAMES",
    "KIND_PENDING",
    "KIND_RELEASABLE",
    "KIND_TRAPPED",
    "LEVELS",
    "MAX_CELLS",
    "Group",
    "RowTable",
    "build_rows",
    "cell_byte",
    "encode_cells",
    "kind_cover",
]

KIND_ALLOCATED = 0
KIND_PENDING = 1
KIND_RELEASABLE = 2  # free bytes that torch.cuda.empty_cache() would hand back to the driver
KIND_TRAPPED = 3  # free bytes held in a segment that still has allocated blocks
KIND_NAMES = ("allocated", "pending_free", "free_releasable", "free_trapped")
LEVELS = 63
MAX_CELLS = 1024
CELL_NO_DATA = 0

# Expandable segments release whole pages only (torch unmaps page by page): 2 MiB in the small
# pool, the large segment size (20 MiB unless configured) in the large pool. Kept here rather
# than imported from allocator.rules because render/ may not import the allocator
# (docs/internals.md).
_SMALL_PAGE = 2 << 20
_LARGE_PAGE = 20 << 20

# block state codes of gpumemviz.snapshot (INACTIVE, ALLOCATED, PENDING_FREE)
_INACTIVE, _ALLOCATED, _PENDING = 0, 1, 2


@dataclass(frozen=True)
class Group:
    """A run of consecutive rows that share device, pool (private pool and size class) and
    stream. `label` names a private pool ("MemPool (0, 2)", "CUDA graph pool (3, 0)"; empty
    for the default pool): the map's group header shows it."""

    device: int
    pool: str  # "large" or "small"
    stream: int
    first: int
    count: int
    pool_id: tuple[int, int] = (0, 0)

    @property
    def label(self) -> str:
        return "" if self.pool_id == (0, 0) else pool_label(self.pool_id)

    def to_dict(self) -> dict[str, int | str | list[int]]:
        return {
            "device": self.device,
            "pool": self.pool,
            "stream": self.stream,
            "first": self.first,
            "count": self.count,
            "pool_id": list(self.pool_id),
            "pool_label": self.label,
        }


@dataclass(frozen=True, eq=False)
class RowTable:
    """Rows of the segment map, in display order, plus the spans that paint them.

    Row columns (length n_rows) describe each row's segment; span columns (sorted by row, then
    offset) tile each row with pieces of one kind; block columns give the exact blocks of a row
    (``block_first[i] : block_first[i] + block_count[i]``), offsets relative to the segment.
    """

    segment: np.ndarray  # i64 index into Snapshot.segments
    device: np.ndarray
    address: np.ndarray
    total_size: np.ndarray
    stream: np.ndarray
    is_small: np.ndarray  # bool
    is_expandable: np.ndarray  # bool
    kind_bytes: np.ndarray  # (n_rows, 4) i64 bytes per kind
    block_first: np.ndarray
    block_count: np.ndarray
    span_row: np.ndarray
    span_start: np.ndarray  # byte offset in the segment
    span_size: np.ndarray
    span_kind: np.ndarray  # u1, KIND_*
    block_offset: np.ndarray
    block_size: np.ndarray
    block_requested: np.ndarray
    block_state: np.ndarray  # u1, snapshot state codes
    groups: tuple[Group, ...]

    @property
    def n_rows(self) -> int:
        return len(self.segment)

    def label(self, row: int) -> str:
        """The text beside a row: its size, and "exp" for an expandable segment's mapped run."""
        text = format_size(int(self.total_size[row]))
        return f"{text} exp" if self.is_expandable[row] else text

    def blocks(self, row: int) -> dict[str, np.ndarray]:
        """Exact blocks of one row: offset (from the segment start), size, requested, state."""
        lo = int(self.block_first[row])
        hi = lo + int(self.block_count[row])
        return {
            "offset": self.block_offset[lo:hi],
            "size": self.block_size[lo:hi],
            "requested": self.block_requested[lo:hi],
            "state": self.block_state[lo:hi],
        }

    def totals(self) -> dict[str, int]:
        """Bytes per kind over all rows, and reserved (conservation holds by construction)."""
        sums = self.kind_bytes.sum(axis=0) if self.n_rows else np.zeros(4, np.int64)
        out = {name: int(v) for name, v in zip(KIND_NAMES, sums, strict=True)}
        out["reserved"] = int(self.total_size.sum())
        return out


def build_rows(
    snap: Snapshot, device: int | None = None, pools_in_use: PoolsInUse = True
) -> RowTable:
    """Order a snapshot's segments into the rows of the segment map and classify their bytes.

    Parameters
    ----------
    snap : Snapshot
        The columnar snapshot (gpumemviz.snapshot).
    device : int, optional
        Keep only this device's segments.
    pools_in_use : bool or collection of (int, int)
        As `fragmentation(..., pools_in_use=)`: the free segments of a private pool in use are
        painted trapped (empty_cache keeps them until the pool is released), so the map's
        releasable bytes are the report's `releasable`.

    Returns
    -------
    RowTable
        Rows grouped by device, pool (the default pool, then private pools by id; in each,
        large before small) and stream, addresses ascending inside a group.

    Examples
    --------
    >>> from gpumemviz.snapshot import Snapshot
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...     {"size": 1 << 20, "requested_size": 1 << 20, "state": "active_allocated"},
    ...     {"size": 1 << 20, "requested_size": 0, "state": "inactive"}]}
    >>> rows = build_rows(Snapshot.from_torch([seg]))
    >>> rows.n_rows, rows.label(0), rows.totals()["free_trapped"]
    (1, '2.00 MiB', 1048576)
    """
    seg = snap.segments
    blk = snap.blocks
    n_seg = len(seg.address)
    seg_dev = np.asarray(seg.device, np.int64)
    keep = np.arange(n_seg) if device is None else np.flatnonzero(seg_dev == device)
    small = np.asarray(seg.is_small, bool)
    stream = np.asarray(seg.stream, np.int64)
    address = np.asarray(seg.address, np.int64)
    pool = np.asarray(seg.pool_id, np.int64).reshape(n_seg, 2)
    released = released_mask(pool, normalize_in_use(pools_in_use))
    # lexsort: last key is primary
    keys = (address[keep], stream[keep], small[keep], pool[keep, 1], pool[keep, 0], seg_dev[keep])
    order = keep[np.lexsort(keys)]

    total = np.asarray(seg.total_size, np.int64)
    expandable = np.asarray(seg.is_expandable, bool)
    b_first = np.asarray(seg.block_start, np.int64)
    b_count = np.asarray(seg.block_count, np.int64)

    b_seg = np.asarray(blk.segment, np.int64)
    b_size = np.asarray(blk.size, np.int64)
    b_state = np.asarray(blk.state, np.uint8)
    b_offset = np.asarray(blk.address, np.int64) - address[b_seg] if len(b_seg) else b_seg.copy()
    # empty_cache() first waits for pending frees, so only allocated blocks keep a segment
    allocated = _run_sums(np.where(b_state == _ALLOCATED, b_size, 0), b_first, b_count)

    # the blocks of the kept segments, in row order (usually the file's order already)
    rows_n = len(order)
    if rows_n == n_seg and bool((order == np.arange(n_seg)).all()):
        row_of_blk = seg_of_blk = b_seg
        state, size, start = b_state, b_size, b_offset
        requested = np.asarray(blk.requested_size, np.int64)
    else:
        blk_idx = _ranges(b_first[order], b_count[order])
        row_of_blk = np.repeat(np.arange(rows_n), b_count[order])
        seg_of_blk = order[row_of_blk]
        state, size, start = b_state[blk_idx], b_size[blk_idx], b_offset[blk_idx]
        requested = np.asarray(blk.requested_size, np.int64)[blk_idx]
    end = start + size
    kind = np.full(len(state), KIND_TRAPPED, np.uint8)
    kind[state == _ALLOCATED] = KIND_ALLOCATED
    kind[state == _PENDING] = KIND_PENDING
    free = state == _INACTIVE
    gives_back = released[seg_of_blk]  # empty_cache may release the segment's pool now
    kind[free & (allocated[seg_of_blk] == 0) & ~expandable[seg_of_blk] & gives_back] = (
        KIND_RELEASABLE
    )

    if expandable.any():
        exp_back = expandable[seg_of_blk] & gives_back
        span_row, span_start, span_size, span_kind = _split_pages(
            row_of_blk,
            start,
            end,
            kind,
            (free | (state == _PENDING)) & exp_back,
            free & exp_back,
            small[seg_of_blk],
        )
    else:  # one span per block
        span_row, span_start, span_size, span_kind = row_of_blk, start, size, kind
    span_first = np.searchsorted(span_row, np.arange(rows_n))
    span_count = np.diff(np.append(span_first, len(span_row)))
    kind_bytes = np.column_stack(
        [
            _run_sums(np.where(span_kind == k, span_size, 0), span_first, span_count)
            for k in range(4)
        ]
    ).reshape(rows_n, 4)

    first_in_rows = np.concatenate([[0], np.cumsum(b_count[order])[:-1]]) if rows_n else b_count[:0]
    return RowTable(
        segment=order,
        device=seg_dev[order],
        address=address[order],
        total_size=total[order],
        stream=stream[order],
        is_small=small[order],
        is_expandable=expandable[order],
        kind_bytes=kind_bytes,
        block_first=first_in_rows.astype(np.int64),
        block_count=b_count[order],
        span_row=span_row,
        span_start=span_start,
        span_size=span_size,
        span_kind=span_kind,
        block_offset=start,
        block_size=size,
        block_requested=requested,
        block_state=state,
        groups=_groups(seg_dev[order], small[order], stream[order], pool[order]),
    )


def encode_cells(
    rows: RowTable, select: np.ndarray | None = None, cells: int = MAX_CELLS
) -> np.ndarray:
    """Rasterise rows into one byte per cell, each row scaled to its own segment.

    Parameters
    ----------
    rows : RowTable
    select : array of int, optional
        Row indices to encode (default: all rows).
    cells : int
        Cells per row, 1..1024.

    Returns
    -------
    numpy.ndarray
        ``(len(select), cells)`` uint8, see the module docstring for the byte.
    """
    if not 1 <= cells <= MAX_CELLS:
        raise ValueError(f"cells must be in 1..{MAX_CELLS}, got {cells}")
    select = np.arange(rows.n_rows) if select is None else np.asarray(select, np.int64)
    if select.size and (select.min() < 0 or select.max() >= rows.n_rows):
        raise ValueError(f"row index out of range 0..{rows.n_rows - 1}")
    out = np.empty((len(select), cells), np.uint8)
    # a chunk's temporaries are about 15 float64 arrays of rows x (cells + 1) at once: 2^14
    # edges keep them near 2 MB (2^21 made 150 MB for the report of a 4 MB file), no slower
    chunk = max(1, (1 << 14) // (cells + 1))
    bounds = np.searchsorted(rows.span_row, np.arange(rows.n_rows + 1))
    for lo in range(0, len(select), chunk):
        part = select[lo : lo + chunk]
        out[lo : lo + len(part)] = _encode_chunk(rows, part, bounds, cells)
    return out


def cell_byte(fractions: np.ndarray) -> np.ndarray:
    """Bytes for cells from their per-kind fractions, shape (..., 4), summing to 1 (or 0 = no data).

    >>> cell_byte(np.array([[1.0, 0, 0, 0], [0, 0, 0, 1.0], [0.5, 0.5, 0, 0]])).tolist()
    [63, 192, 96]
    """
    fr = np.asarray(fractions, np.float64)
    return _bytes(fr[..., 0], fr[..., 1], fr[..., 2], fr[..., 3])


def _bytes(a: np.ndarray, p: np.ndarray, r: np.ndarray, t: np.ndarray) -> np.ndarray:
    covered = a + p + r + t
    rest = covered - a
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(covered > 0, a / covered, 0.0)
    # round half up, with a margin far above float noise and far below one level, so a cell
    # gets the same byte whichever rows are encoded with it
    level = np.floor(frac * LEVELS + 0.5 + 1e-7).astype(np.uint8)
    other = np.where(p >= r, np.where(p >= t, 1, 3), np.where(r >= t, 2, 3)).astype(np.uint8)
    # rounding residue of the cumulative sums must not turn a pure cell into a mixed one
    pure_alloc = rest <= 1e-9 * covered
    byte = (other << 6) | level
    byte[pure_alloc] = LEVELS
    byte[covered <= 1e-12] = CELL_NO_DATA
    return byte


def _encode_chunk(rows: RowTable, part: np.ndarray, bounds: np.ndarray, cells: int) -> np.ndarray:
    k = len(part)
    counts = bounds[part + 1] - bounds[part]
    span_idx = _ranges(bounds[part], counts)
    local = np.repeat(np.arange(k), counts)
    total = rows.total_size[part].astype(np.float64)
    total[total <= 0] = 1.0
    # each row occupies [j, j+1) on one axis; spans become fractions of their row
    key = local + rows.span_start[span_idx] / total[local]
    frac = rows.span_size[span_idx] / total[local]
    edges = (np.arange(k)[:, None] + np.arange(cells + 1)[None, :] / cells).ravel()
    at = kind_cover(key, frac, rows.span_kind[span_idx], edges)
    return _bytes(*(np.maximum(np.diff(a.reshape(k, cells + 1), axis=1), 0.0) for a in at))


def kind_cover(
    start: np.ndarray, size: np.ndarray, kinds: np.ndarray, edges: np.ndarray
) -> list[np.ndarray]:
    """Per kind, how much of the axis up to each edge the spans of that kind cover.

    Spans (ascending, not overlapping) lie on one axis; the four arrays returned (one per KIND_*)
    are cumulative, so differences between neighbouring edges give each cell's share.

    >>> at = kind_cover(np.array([0.0, 2.0]), np.array([2.0, 2.0]), np.array([0, 3]),
    ...                 np.array([0.0, 1.0, 3.0, 4.0]))
    >>> [a.tolist() for a in at][0], at[3].tolist()
    ([0.0, 1.0, 2.0, 2.0], [0.0, 0.0, 1.0, 2.0])
    """
    # breakpoints at both ends of every span, so gaps and empty rows stay flat
    xp = np.column_stack([start, start + size]).ravel()
    out = []
    for kind in range(4):
        mine = np.where(kinds == kind, size, 0.0)
        after = np.cumsum(mine)
        fp = np.column_stack([after - mine, after]).ravel()
        out.append(np.interp(edges, xp, fp))
    return out


def _split_pages(
    row: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    kind: np.ndarray,
    syncs_free: np.ndarray,
    exp_free: np.ndarray,
    small: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Spans for blocks where free blocks of expandable segments become up to three pieces:
    a trapped sliver, the whole pages that empty_cache unmaps (releasable), a trapped sliver.

    empty_cache completes pending frees first, so a pending block merges with its free
    neighbours and the whole pages are those of the merged run (`syncs_free` marks the blocks
    that are free once synced); the pending bytes themselves stay painted as pending.
    """
    n_b = len(start)
    # runs of adjacent blocks of one row that are free after the sync (computed on those only)
    idx = np.flatnonzero(syncs_free)
    r, s0, e0 = row[idx], start[idx], end[idx]
    joins = np.zeros(len(idx), bool)
    joins[1:] = (idx[1:] == idx[:-1] + 1) & (r[1:] == r[:-1]) & (s0[1:] == e0[:-1])
    heads = np.flatnonzero(~joins)
    run_id = np.cumsum(~joins) - 1
    tails = np.append(heads[1:] - 1, len(idx) - 1) if len(idx) else heads
    page = np.where(small[idx], _SMALL_PAGE, _LARGE_PAGE)
    lo = -(-s0[heads][run_id] // page) * page  # the run's whole pages
    hi = e0[tails][run_id] // page * page
    cut0 = end.copy()
    cut1 = end.copy()
    c0 = np.minimum(np.maximum(lo, s0), e0)
    c1 = np.minimum(np.maximum(hi, c0), e0)
    none = c1 <= c0  # no whole page of the run inside this block: one trapped piece
    c0[none] = e0[none]
    cut0[idx] = c0
    cut1[idx] = np.where(none, e0, c1)
    # only free blocks split; a pending one keeps its kind whole
    cut0[~exp_free] = end[~exp_free]
    # one piece per block, three for a free block of an expandable segment (sliver, whole
    # pages, sliver), written in block order so the spans stay sorted by offset
    at = np.cumsum(1 + 2 * exp_free) - (1 + 2 * exp_free)
    n_p = int(at[-1] + 1 + 2 * exp_free[-1]) if n_b else 0
    p_row = np.empty(n_p, row.dtype)
    p_start = np.empty(n_p, np.int64)
    p_end = np.empty(n_p, np.int64)
    p_kind = np.empty(n_p, np.uint8)
    p_row[at], p_start[at], p_end[at] = row, start, cut0
    p_kind[at] = np.where(exp_free, KIND_TRAPPED, kind)
    f = at[exp_free]
    fr = row[exp_free]
    c0, c1, e = cut0[exp_free], cut1[exp_free], end[exp_free]
    p_row[f + 1], p_start[f + 1], p_end[f + 1], p_kind[f + 1] = fr, c0, c1, KIND_RELEASABLE
    p_row[f + 2], p_start[f + 2], p_end[f + 2], p_kind[f + 2] = fr, c1, e, KIND_TRAPPED
    sel = np.flatnonzero(p_end > p_start)
    return p_row[sel], p_start[sel], p_end[sel] - p_start[sel], p_kind[sel]


def _run_sums(values: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Sums of ``values[first[i] : first[i] + count[i]]`` for runs that tile ``values`` in order."""
    out = np.zeros(len(first), np.int64)
    nz = count > 0
    if nz.any():
        out[nz] = np.add.reduceat(values.astype(np.int64, copy=False), first[nz])
    return out


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s + c)`` for each pair, vectorised."""
    counts = np.asarray(counts, np.int64)
    n = int(counts.sum())
    if n == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(counts)
    offsets = np.repeat(np.asarray(starts, np.int64) - (ends - counts), counts)
    out: np.ndarray = np.arange(n, dtype=np.int64) + offsets
    return out


def _groups(
    device: np.ndarray, small: np.ndarray, stream: np.ndarray, pool: np.ndarray
) -> tuple[Group, ...]:
    n = len(device)
    if n == 0:
        return ()
    change = np.flatnonzero(
        (device[1:] != device[:-1])
        | (small[1:] != small[:-1])
        | (stream[1:] != stream[:-1])
        | (pool[1:] != pool[:-1]).any(axis=1)
    )
    starts = np.concatenate([[0], change + 1])
    ends = np.concatenate([change + 1, [n]])
    return tuple(
        Group(
            device=int(device[s]),
            pool="small" if small[s] else "large",
            stream=int(stream[s]),
            first=int(s),
            count=int(e - s),
            pool_id=(int(pool[s, 0]), int(pool[s, 1])),
        )
        for s, e in zip(starts, ends, strict=True)
    )
