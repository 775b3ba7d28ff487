"""render/rows.py: the segment map's rows and cell bytes, checked against the raw torch dicts."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import random_expandable_model, unallocated_bytes
from gpumemviz.render.rows import (
    CELL_NO_DATA,
    KIND_ALLOCATED,
    KIND_PENDING,
    KIND_RELEASABLE,
    KIND_TRAPPED,
    LEVELS,
    build_rows,
    encode_cells,
)
from gpumemviz.snapshot import Snapshot

MiB = 1 << 20
PURE = {
    KIND_ALLOCATED: LEVELS,
    KIND_PENDING: KIND_PENDING << 6,
    KIND_RELEASABLE: KIND_RELEASABLE << 6,
    KIND_TRAPPED: KIND_TRAPPED << 6,
}


def _seg(blocks, *, address=0, device=0, stream=0, small=False, expandable=False):
    return {
        "device": device,
        "address": address,
        "total_size": sum(b[0] for b in blocks),
        "stream": stream,
        "segment_type": "small" if small else "large",
        "is_expandable": expandable,
        "blocks": [
            {"size": s, "requested_size": s if st != "inactive" else 0, "state": st}
            for s, st in blocks
        ],
    }


def _oracle_kinds(seg: dict) -> list[int]:
    """Kind of each block from the raw dict, written independently of rows.py (no pages)."""
    active = any(b["state"] == "active_allocated" for b in seg["blocks"])
    out = []
    for b in seg["blocks"]:
        if b["state"] == "active_allocated":
            out.append(KIND_ALLOCATED)
        elif b["state"] == "active_pending_free":
            out.append(KIND_PENDING)
        elif active or seg.get("is_expandable"):
            out.append(KIND_TRAPPED)
        else:
            out.append(KIND_RELEASABLE)
    return out


def test_real_rows_account_for_every_byte(recorded_dict):
    segs = recorded_dict["segments"] if isinstance(recorded_dict, dict) else recorded_dict
    rows = build_rows(Snapshot.from_torch(recorded_dict))
    assert rows.n_rows == len(segs)
    assert sorted(rows.segment.tolist()) == list(range(len(segs)))
    t = rows.totals()
    assert t["reserved"] == sum(s["total_size"] for s in segs)
    allocated = sum(
        b["size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated"
    )
    assert t["allocated"] == allocated
    assert (
        t["allocated"] + t["pending_free"] + t["free_releasable"] + t["free_trapped"]
        == (t["reserved"])
    )
    empty = sum(
        s["total_size"]
        for s in segs
        if not s.get("is_expandable") and all(b["state"] == "inactive" for b in s["blocks"])
    )
    # free bytes of segments with nothing allocated: empty_cache syncs the pending frees first,
    # so a segment of pending-free and free blocks (verl's) goes back whole, and its free bytes
    # are releasable too (its pending ones stay painted pending)
    unallocated_free = unallocated_bytes(segs, "inactive")
    if not any(s.get("is_expandable") for s in segs):
        assert t["free_releasable"] == unallocated_free >= empty
        if not any(b["state"] == "active_pending_free" for s in segs for b in s["blocks"]):
            assert t["free_releasable"] == empty


def test_real_rows_are_grouped_and_sorted(recorded_dict):
    segs = recorded_dict["segments"] if isinstance(recorded_dict, dict) else recorded_dict
    rows = build_rows(Snapshot.from_torch(recorded_dict))
    keys = [
        (
            s.get("device", 0),
            tuple(s.get("segment_pool_id", (0, 0))),  # the default pool, then private ones
            s.get("segment_type") == "small",
            s["stream"],
            s["address"],
        )
        for s in (segs[i] for i in rows.segment)
    ]
    assert keys == sorted(keys)
    covered = 0
    for g in rows.groups:
        assert g.first == covered
        inside = keys[g.first : g.first + g.count]
        assert {k[:4] for k in inside} == {(g.device, g.pool_id, g.pool == "small", g.stream)}
        covered += g.count
    assert covered == rows.n_rows


def test_real_cells_inside_a_block_have_its_colour(recorded_dict):
    """Every cell lying wholly inside one block carries that block's pure kind."""
    segs = recorded_dict["segments"] if isinstance(recorded_dict, dict) else recorded_dict
    rows = build_rows(Snapshot.from_torch(recorded_dict))
    cells = 256
    grid = encode_cells(rows, cells=cells)
    checked = 0
    for r, i in enumerate(rows.segment):
        seg = segs[i]
        total = seg["total_size"]
        off = 0
        for b, kind in zip(seg["blocks"], _oracle_kinds(seg), strict=True):
            lo = -(-off * cells // total)
            hi = (off + b["size"]) * cells // total
            off += b["size"]
            if hi <= lo:
                continue
            got = grid[r, lo:hi]
            if seg.get("is_expandable") and b["state"] == "inactive":
                assert set(got.tolist()) <= {PURE[KIND_TRAPPED], PURE[KIND_RELEASABLE]}
            else:
                assert (got == PURE[kind]).all(), (i, b, got[:8])
            checked += hi - lo
    assert checked > 0
    assert (grid != CELL_NO_DATA).all()


def test_mixed_cells_show_the_allocated_fraction():
    # a 2 MiB small segment of 16 blocks of 128 KiB: allocated, free, allocated, free, ...
    blocks = [(128 << 10, "active_allocated" if k % 2 == 0 else "inactive") for k in range(16)]
    rows = build_rows(Snapshot.from_torch([_seg(blocks, small=True)]))
    got = encode_cells(rows, cells=4)  # 512 KiB per cell: two allocated, two free blocks
    assert got.tolist() == [[(KIND_TRAPPED << 6) | 32] * 4]  # round(0.5 * 63) = 32
    fine = encode_cells(rows, cells=16)
    assert fine.tolist() == [[PURE[KIND_ALLOCATED], PURE[KIND_TRAPPED]] * 8]


def test_kinds_follow_empty_cache_rules():
    snap = Snapshot.from_torch(
        [
            _seg([(20 * MiB, "inactive")], address=0),  # wholly free: releasable
            # empty_cache waits for pending frees first: this segment goes back whole
            _seg([(4 * MiB, "active_pending_free"), (16 * MiB, "inactive")], address=1 << 30),
            _seg([(10 * MiB, "active_allocated"), (10 * MiB, "inactive")], address=2 << 30),
            _seg(
                [
                    (2 * MiB, "active_pending_free"),
                    (8 * MiB, "inactive"),
                    (10 * MiB, "active_allocated"),
                ],
                address=3 << 30,
            ),
        ]
    )
    rows = build_rows(snap)
    kb = rows.kind_bytes
    assert kb[0].tolist() == [0, 0, 20 * MiB, 0]
    assert kb[1].tolist() == [0, 4 * MiB, 16 * MiB, 0]
    assert kb[2].tolist() == [10 * MiB, 0, 0, 10 * MiB]
    assert kb[3].tolist() == [10 * MiB, 2 * MiB, 0, 8 * MiB]
    grid = encode_cells(rows, cells=20)
    assert set(grid[0].tolist()) == {PURE[KIND_RELEASABLE]}
    assert grid[1, :4].tolist() == [PURE[KIND_PENDING]] * 4
    assert grid[1, 4:].tolist() == [PURE[KIND_RELEASABLE]] * 16
    assert grid[3].tolist() == [
        PURE[k] for k in [KIND_PENDING] * 2 + [KIND_TRAPPED] * 8 + [KIND_ALLOCATED] * 10
    ]


def test_expandable_free_blocks_release_whole_pages_only():
    # large-pool expandable run of 60 MiB (3 pages of 20 MiB): allocated 5 MiB, free 55 MiB.
    # empty_cache unmaps pages 2 and 3 (20..60 MiB); the 15 MiB sliver of page 1 stays trapped.
    snap = Snapshot.from_torch(
        [_seg([(5 * MiB, "active_allocated"), (55 * MiB, "inactive")], expandable=True)]
    )
    rows = build_rows(snap)
    assert rows.kind_bytes[0].tolist() == [5 * MiB, 0, 40 * MiB, 15 * MiB]
    assert rows.label(0) == "60.00 MiB exp"
    grid = encode_cells(rows, cells=12)  # 5 MiB per cell
    kinds = [KIND_ALLOCATED, *[KIND_TRAPPED] * 3, *[KIND_RELEASABLE] * 8]
    assert grid[0].tolist() == [PURE[k] for k in kinds]


def test_device_filter_and_groups():
    snap = Snapshot.from_torch(
        [
            _seg([(2 * MiB, "active_allocated")], device=0, small=True, address=4 * MiB),
            _seg([(20 * MiB, "active_allocated")], device=0, address=0, stream=7),
            _seg([(20 * MiB, "inactive")], device=1, address=0),
        ]
    )
    rows = build_rows(snap)
    assert [(g.device, g.pool, g.stream, g.count) for g in rows.groups] == [
        (0, "large", 7, 1),
        (0, "small", 0, 1),
        (1, "large", 0, 1),
    ]
    one = build_rows(snap, device=1)
    assert one.n_rows == 1 and one.device.tolist() == [1]
    assert one.blocks(0)["size"].tolist() == [20 * MiB]
    assert build_rows(snap, device=5).n_rows == 0
    assert encode_cells(build_rows(snap, device=5)).shape == (0, 1024)


def test_exact_blocks_per_row():
    snap = Snapshot.from_torch([_seg([(6 * MiB, "active_allocated"), (14 * MiB, "inactive")])])
    b = build_rows(snap).blocks(0)
    assert b["offset"].tolist() == [0, 6 * MiB]
    assert b["size"].tolist() == [6 * MiB, 14 * MiB]
    assert b["state"].tolist() == [1, 0]


def test_bad_cell_counts_are_refused():
    rows = build_rows(Snapshot.from_torch([_seg([(2 * MiB, "inactive")], small=True)]))
    with pytest.raises(ValueError, match=r"cells must be in 1\.\.1024"):
        encode_cells(rows, cells=2048)
    with pytest.raises(ValueError, match="row index out of range"):
        encode_cells(rows, [3])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(1, 4096), st.sampled_from([0, 1, 2])), min_size=1, max_size=40
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 300),
)
def test_cells_conserve_the_allocated_fraction(segments, cells):
    """Summed over a row, the cells' allocated levels match the row's allocated bytes."""
    block_count = [len(s) for s in segments]
    size = [u * 512 for s in segments for u, _ in s]
    state = [k for s in segments for _, k in s]
    totals = [sum(u * 512 for u, _ in s) for s in segments]
    snap = Snapshot.from_columns(
        device=[0] * len(segments),
        address=np.arange(len(segments)) * (1 << 40),
        total_size=totals,
        stream=[0] * len(segments),
        is_small=[False] * len(segments),
        block_count=block_count,
        size=size,
        requested_size=size,
        state=state,
    )
    rows = build_rows(snap)
    grid = encode_cells(rows, cells=cells)
    assert (grid != CELL_NO_DATA).all()
    for r in range(rows.n_rows):
        level = (grid[r] & 63).astype(float) / LEVELS
        want = rows.kind_bytes[r, KIND_ALLOCATED] / rows.total_size[r] * cells
        assert abs(level.sum() - want) <= cells * 0.5 / LEVELS + 1e-6


def _random_model_state(seed: int):
    """The allocator model after random mallocs, frees and cross-stream frees (pending) in
    expandable mode; returns the model and its snapshot."""
    m = random_expandable_model(seed, pending=0.4)
    return m, m.snapshot(include_traces=False)


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Bytes shared by two lists of disjoint [lo, hi) intervals."""
    a, b = sorted(a), sorted(b)
    i = j = out = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        out += max(hi - lo, 0)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@pytest.mark.parametrize("seed", range(16))
def test_painted_trapped_is_what_empty_cache_leaves_of_the_free_blocks(seed):
    """Each painted trapped byte stays free after the model's empty_cache (which syncs pending
    frees first, merging them with their free neighbours) and each painted releasable byte goes;
    with the pending bytes that stay, they add up to the report's free_stuck."""
    from gpumemviz.analysis.fragmentation import fragmentation

    m, d = _random_model_state(seed)
    rows = build_rows(Snapshot.from_torch(d))
    base = rows.address[rows.span_row]
    spans = {
        k: list(
            zip(
                (base + rows.span_start)[rows.span_kind == k].tolist(),
                (base + rows.span_start + rows.span_size)[rows.span_kind == k].tolist(),
                strict=True,
            )
        )
        for k in (KIND_PENDING, KIND_RELEASABLE, KIND_TRAPPED)
    }
    m.empty_cache()
    after = [
        (b["address"], b["address"] + b["size"])
        for s in m.snapshot(include_traces=False)["segments"]
        for b in s["blocks"]
        if b["state"] == "inactive"
    ]
    trapped = sum(hi - lo for lo, hi in spans[KIND_TRAPPED])
    assert _overlap(spans[KIND_TRAPPED], after) == trapped
    assert _overlap(spans[KIND_RELEASABLE], after) == 0
    report = fragmentation(d)
    assert trapped + _overlap(spans[KIND_PENDING], after) == report.free_stuck
    if report.pending_free == 0:
        assert trapped == report.free_stuck


def test_encoding_many_rows_needs_little_more_than_its_output():
    """2,000 rows at 1,024 cells: the temporaries stay within a few MB of the 2 MB output (at
    2^21 edges a chunk, the HTML report's map took 150 MB for a 4 MB file), and rows encoded
    together get the bytes they get alone."""
    n = 2000
    rng = np.random.default_rng(0)
    units = rng.integers(1, 4096, size=(n, 4))
    state = rng.integers(0, 3, size=n * 4)
    snap = Snapshot.from_columns(
        device=[0] * n,
        address=np.arange(n) * (1 << 40),
        total_size=units.sum(axis=1) * 512,
        stream=[0] * n,
        is_small=[False] * n,
        block_count=[4] * n,
        size=units.ravel() * 512,
        requested_size=units.ravel() * 512,
        state=state,
    )
    rows = build_rows(snap)
    tracemalloc.start()
    try:
        grid = encode_cells(rows, cells=1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert grid.shape == (n, 1024)
    assert peak - grid.nbytes < 6 * MiB
    for i in (0, 7, n - 1):
        assert (encode_cells(rows, [i], cells=1024)[0] == grid[i]).all()
