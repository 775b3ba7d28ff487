"""render/wire_frame.py and render/wire.py: what goes on the wire, and only what changed."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import unallocated_bytes
from gpumemviz.render.rows import MAX_CELLS, build_rows, encode_cells
from gpumemviz.render.wire import FIRST_FRAME_LIMIT, FRAME_LIMIT, Wire, header_numbers, window
from gpumemviz.render.wire_frame import META_FIELDS, decode_frame, row_meta
from gpumemviz.snapshot import ALLOCATED, INACTIVE, PENDING_FREE, Snapshot

MiB = 1 << 20


def synthetic(n_segments: int, per_segment: int, seed: int = 0, flip: int = 0) -> Snapshot:
    """n_segments large segments of per_segment blocks (512 B multiples), states at random;
    `flip` changes the state of that many blocks (deterministically) for a "next sample"."""
    rng = np.random.default_rng(seed)
    units = rng.integers(1, 64, size=(n_segments, per_segment))
    size = (units * 512).ravel()
    state = rng.choice([INACTIVE, ALLOCATED], size=size.size, p=[0.3, 0.7]).astype(np.uint8)
    # never two adjacent free blocks, as in torch: free blocks merge
    state[1:][(state[1:] == INACTIVE) & (state[:-1] == INACTIVE)] = ALLOCATED
    if flip:
        idx = np.linspace(0, size.size - 1, flip).astype(np.int64)
        state[idx] = PENDING_FREE
    totals = units.sum(axis=1) * 512
    return Snapshot.from_columns(
        device=np.zeros(n_segments, np.int64),
        address=np.arange(n_segments, dtype=np.int64) << 32,
        total_size=totals,
        stream=np.zeros(n_segments, np.int64),
        is_small=np.zeros(n_segments, bool),
        block_count=np.full(n_segments, per_segment),
        size=size,
        requested_size=size,
        state=state,
    )


def _real(recorded_dict):
    return build_rows(Snapshot.from_torch(recorded_dict))


def test_frame_round_trip(recorded_dict):
    rows = _real(recorded_dict)
    wire = Wire()
    wire.set_rows(rows)
    frames = wire.set_view("a", first=0, count=30, cells=700)
    assert frames
    seen = {}
    for f in frames:
        assert f.nbytes <= FIRST_FRAME_LIMIT
        got = decode_frame(f.content, f.buffers)
        for j, r in enumerate(got["rows"]):
            seen[int(r)] = j
            assert (got["cells"][j] == encode_cells(rows, [r], 700)[0]).all()
            assert (got["meta"][j] == row_meta(rows, [r])[0]).all()
            b = got["blocks"][j]
            if b is not None:
                want = rows.blocks(int(r))
                assert b["size"].tolist() == want["size"].tolist()
                assert b["offset"].tolist() == want["offset"].tolist()
                assert b["state"].tolist() == want["state"].tolist()
    in_view = set(range(min(30, rows.n_rows)))
    assert in_view <= set(seen)
    assert list(seen)[: len(in_view)] == sorted(in_view)  # rows in view come first
    assert wire.update() == []  # the same rows again: nothing to send


def test_meta_fields_describe_the_segment():
    snap = synthetic(3, 4)
    rows = build_rows(snap)
    meta = row_meta(rows, [2])[0]
    m = dict(zip(META_FIELDS, meta.tolist(), strict=True))
    assert m["address"] == 2 << 32
    assert m["total_size"] == rows.total_size[2]
    assert m["n_blocks"] == 4
    assert (
        m["allocated"] + m["free_trapped"] + m["free_releasable"] + m["pending_free"]
        == (m["total_size"])
    )


def test_only_changed_rows_are_sent_and_steady_frames_stay_small():
    wire = Wire()
    wire.set_rows(build_rows(synthetic(2000, 50)))  # 10^5 blocks
    first = wire.set_view("a", first=100, count=48, cells=MAX_CELLS)
    assert len(first) == 1 and first[0].nbytes <= FIRST_FRAME_LIMIT
    assert wire.update() == []
    assert not wire.set_rows(build_rows(synthetic(2000, 50, flip=3)))  # same layout
    frames = wire.update()
    changed = [int(r) for f in frames for r in decode_frame(f.content, f.buffers)["rows"]]
    flipped_rows = set(np.linspace(0, 2000 * 50 - 1, 3).astype(int) // 50)
    assert set(changed) == flipped_rows & set(range(100, 148))
    assert all(f.nbytes <= FRAME_LIMIT for f in frames)


def test_every_row_changed_still_fits_steady_frames():
    wire = Wire()
    wire.set_rows(build_rows(synthetic(500, 200, seed=1)))
    wire.set_view("a", first=0, count=48, cells=MAX_CELLS)
    wire.set_rows(build_rows(synthetic(500, 200, seed=2)))
    frames = wire.update()
    rows = [int(r) for f in frames for r in decode_frame(f.content, f.buffers)["rows"]]
    assert sorted(rows) == list(range(48))
    assert all(f.nbytes <= FRAME_LIMIT for f in frames)


def test_a_tall_view_is_split_into_frames_within_limit():
    wire = Wire()
    wire.set_rows(build_rows(synthetic(400, 3)))
    opening = wire.set_view("a", first=0, count=200, cells=MAX_CELLS)
    assert all(f.nbytes <= FIRST_FRAME_LIMIT for f in opening)
    wire.set_rows(build_rows(synthetic(400, 3, seed=9)))
    frames = wire.update()
    assert len(frames) >= 2
    assert all(f.nbytes <= FRAME_LIMIT for f in frames)
    sent = [int(r) for f in frames for r in decode_frame(f.content, f.buffers)["rows"]]
    assert set(range(200)) <= set(sent)
    assert len(sent) == len(set(sent))


def test_scrolling_sends_only_missing_rows_and_forgets_far_ones():
    wire = Wire()
    wire.set_rows(build_rows(synthetic(1000, 5)))
    (f1,) = wire.set_view("a", first=0, count=20, cells=256)
    got1 = set(decode_frame(f1.content, f1.buffers)["rows"].tolist())
    assert got1 == set(range(40))  # the view, then one view below (nothing above row 0)
    (f2,) = wire.set_view("a", first=10, count=20, cells=256)
    got2 = set(decode_frame(f2.content, f2.buffers)["rows"].tolist())
    lo, hi = window(10, 20)
    assert got2 == set(range(40, hi))  # rows 0..39 are held already
    assert lo < 0
    frames = wire.set_view("a", first=500, count=20, cells=256)
    got3 = {int(r) for f in frames for r in decode_frame(f.content, f.buffers)["rows"]}
    assert set(range(500, 520)) <= got3
    back = wire.set_view("a", first=0, count=20, cells=256)  # forgotten: sent again
    assert set(range(20)) <= {
        int(r) for f in back for r in decode_frame(f.content, f.buffers)["rows"]
    }


def test_resize_resends_and_views_are_independent():
    wire = Wire()
    wire.set_rows(build_rows(synthetic(50, 5)))
    a = wire.set_view("a", first=0, count=10, cells=256)
    b = wire.set_view("b", first=0, count=10, cells=256)
    assert [f.content["view"] for f in a + b] == ["a", "b"]
    (again,) = wire.set_view("a", first=0, count=10, cells=512)  # wider: every row again
    assert again.content["cells"] == 512
    assert set(range(10)) <= set(decode_frame(again.content, again.buffers)["rows"].tolist())
    wire.drop_view("b")
    assert wire.views == ("a",)


def test_layout_version_moves_only_when_rows_regroup():
    wire = Wire()
    assert wire.set_rows(build_rows(synthetic(10, 2)))
    assert not wire.set_rows(build_rows(synthetic(10, 2, seed=5)))
    assert wire.set_rows(build_rows(synthetic(11, 2)))
    lay = wire.layout()
    assert lay["version"] == 2 and lay["n_rows"] == 11
    assert lay["groups"] == [
        {
            "device": 0,
            "pool": "large",
            "stream": 0,
            "first": 0,
            "count": 11,
            "pool_id": [0, 0],
            "pool_label": "",
        }
    ]


def test_rows_that_vanish_are_forgotten():
    wire = Wire()
    wire.set_rows(build_rows(synthetic(30, 2)))
    wire.set_view("a", first=0, count=30, cells=64)
    wire.set_rows(build_rows(synthetic(10, 2)))
    wire.update()
    wire.set_rows(build_rows(synthetic(30, 2)))
    frames = wire.update()  # rows 10..29 came back: they must be sent again
    assert set(range(10, 30)) <= {
        int(r) for f in frames for r in decode_frame(f.content, f.buffers)["rows"]
    }


def test_header_numbers_obey_conservation(recorded_dict):
    rows = _real(recorded_dict)
    f = header_numbers(rows)
    assert f["allocated"] + f["pending_free"] + f["free"] == f["reserved"]
    segs = recorded_dict["segments"] if isinstance(recorded_dict, dict) else recorded_dict
    free_sizes = [b["size"] for s in segs for b in s["blocks"] if b["state"] == "inactive"]
    assert f["largest_free"] == max(free_sizes, default=0)


def test_decode_refuses_foreign_messages():
    with pytest.raises(ValueError, match="not a gpumemviz frame"):
        decode_frame({"kind": "ack"}, [])


def test_header_numbers_agree_with_the_fragmentation_report(recorded_dict):
    from gpumemviz.analysis.fragmentation import fragmentation

    snap = Snapshot.from_torch(recorded_dict)
    mine = header_numbers(build_rows(snap))
    report = fragmentation(snap).total
    assert mine["reserved"] == report.reserved
    assert mine["allocated"] == report.allocated
    assert mine["free"] == report.free
    assert mine["largest_free"] == report.largest_free
    assert mine["fragmentation"] == pytest.approx(report.external_fragmentation)
    # the report's releasable is what empty_cache returns: whole segments with nothing
    # allocated, their pending-free blocks too (it syncs them first); the map paints those
    # pending, so its releasable is the rest (verl's file has 571 MB of them)
    pending_in_unallocated = unallocated_bytes(recorded_dict, "active_pending_free")
    assert (
        mine["free_releasable"] + pending_in_unallocated
        == report.releasable + report.releasable_private
    )
    if not snap.segments.is_expandable.any():  # the report leaves expandable slivers out
        assert mine["free_trapped"] == report.free_trapped


def test_hover_blocks_carry_their_filtered_stacks(recorded_dict):
    """Each exact block's stack travels with the frame: the snapshot's own frames, interpreter
    frames dropped, the first frame outside torch marked; frames stay within their limit."""
    from gpumemviz.analysis.frames import filter_frames, format_frame, user_frame_index
    from gpumemviz.render.stacks import MAX_LINES, Stacks

    snap = Snapshot.from_torch(recorded_dict)
    rows = build_rows(snap)
    wire = Wire()
    wire.set_rows(rows, Stacks(snap))
    frames = wire.set_view("v", first=0, count=60, cells=1024)
    assert all(f.nbytes <= FIRST_FRAME_LIMIT for f in frames)
    all_frames = snap.block_frames()
    start = np.asarray(snap.segments.block_start)
    checked = with_frames = 0
    for f in frames:
        got = decode_frame(f.content, f.buffers)
        for r, blocks in zip(got["rows"], got["blocks"], strict=True):
            if blocks is None:
                continue
            seg = int(rows.segment[r])
            for j, stack in enumerate(blocks["stack"]):
                kept = filter_frames(all_frames[int(start[seg]) + j])
                with_frames += bool(kept)
                if stack is None:
                    continue
                user = user_frame_index(kept)
                if user is not None:  # the user's line is shown and marked, however deep
                    assert stack["lines"][stack["user"]] == format_frame(kept[user])
                else:
                    assert stack["user"] is None
                    assert stack["lines"] == [format_frame(x) for x in kept[:MAX_LINES]]
                assert len(stack["lines"]) <= MAX_LINES
                checked += 1
    assert checked >= min(1, with_frames)  # where the file has stacks, they travel


def test_zoom_fetches_exact_blocks_of_a_row_whose_frame_carried_cells_only():
    """A row with more blocks than cells travels as cells; `exact_blocks` answers the zoom's
    request with every block of that row, as `RowTable.blocks` has them."""
    rows = build_rows(synthetic(3, 3000))
    wire = Wire()
    wire.set_rows(rows)
    (frame,) = wire.set_view("v", first=0, count=3, cells=512)
    assert all(b is None for b in decode_frame(frame.content, frame.buffers)["blocks"])
    (exact,) = wire.exact_blocks("v", 1)
    got = decode_frame(exact.content, exact.buffers)
    assert got["rows"].tolist() == [1] and got["cells"].shape == (1, 512)
    want = rows.blocks(1)
    blocks = got["blocks"][0]
    assert len(blocks["size"]) == 3000
    for key in ("offset", "size", "requested", "state"):
        assert np.array_equal(blocks[key], want[key])
    assert wire.exact_blocks("v", 3) == [] and wire.exact_blocks("other", 0) == []
    assert wire.update() == []  # the answer is no change: the view's digests stay as they were


def test_zoom_into_a_row_too_big_to_send_whole_gets_the_blocks_of_its_window():
    from gpumemviz.render.wire import EXACT_MAX_BLOCKS

    rows = build_rows(synthetic(1, EXACT_MAX_BLOCKS + 5000))
    wire = Wire()
    wire.set_rows(rows)
    wire.set_view("v", first=0, count=1, cells=1024)
    b = rows.blocks(0)
    end = b["offset"] + b["size"]
    lo, hi = int(b["offset"][40000]) + 7, int(b["offset"][40100]) + 1
    (msg,) = wire.exact_blocks("v", 0, lo, hi)
    c = msg.content
    assert c["kind"] == "blocks" and c["row"] == 0 and c["first"] == 40000
    got = np.frombuffer(msg.buffers[0], "<f8").reshape(-1, 3)
    # every block overlapping [lo, hi), and only those: 40000 .. 40100 inclusive
    assert np.array_equal(got[:, 0], b["offset"][40000:40101])
    assert np.array_equal(got[:, 1], b["size"][40000:40101])
    assert np.array_equal(np.frombuffer(msg.buffers[1], np.uint8), b["state"][40000:40101])
    assert (c["lo"], c["hi"]) == (int(b["offset"][40000]), int(end[40100]))
    assert c["lo"] <= lo and hi <= c["hi"]
    # the whole segment is more than a message carries: the first EXACT_MAX_BLOCKS, and says so
    (whole,) = wire.exact_blocks("v", 0)
    assert whole.content["first"] == 0
    assert whole.content["hi"] == int(end[EXACT_MAX_BLOCKS - 1]) < int(rows.total_size[0])
