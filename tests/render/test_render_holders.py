"""The holders view's data (render/holders.py): bounded, exact sums, and a click's marks placed
by device and address in the map's rows."""

from __future__ import annotations

from gpumemviz.analysis.findings import analyze
from gpumemviz.analysis.holders import HOLDER_KEYS, holder_rows
from gpumemviz.render.holders import holder_marks, holders_view
from gpumemviz.render.rows import build_rows
from gpumemviz.snapshot import Snapshot

MIB = 1 << 20


def _seg(address: int, sizes: list[int], lines: list[int | None], device: int = 0) -> dict:
    blocks = []
    for size, line in zip(sizes, lines, strict=True):
        frames = [] if line is None else [{"filename": "train.py", "line": line, "name": "f"}]
        blocks.append(
            {"size": size, "requested_size": size, "state": "active_allocated", "frames": frames}
        )
    blocks.append({"size": 2 * MIB - sum(sizes), "requested_size": 0, "state": "inactive"})
    return {
        "device": device,
        "address": address,
        "total_size": 2 * MIB,
        "stream": 0,
        "blocks": blocks,
    }


def test_top_rows_and_the_rest_sum_to_allocated_for_every_key():
    segs = [_seg(i * 4 * MIB, [64 << 10] * 4, [1 + i, 2 + i, None, 1 + i]) for i in range(8)]
    found = analyze(segs)
    view = holders_view(found.holders, top=3)
    assert view["keys"] == list(HOLDER_KEYS)
    assert view["allocated"] == found.figures.allocated == 8 * 4 * (64 << 10)
    for by in HOLDER_KEYS:
        got = view["by"][by]
        rows = found.holders(by)
        assert [r["bytes"] for r in got["rows"]] == [r.bytes for r in rows[:3]]
        assert got["rest"]["rows"] == max(0, len(rows) - 3)
        assert sum(r["bytes"] for r in got["rows"]) + got["rest"]["bytes"] == view["allocated"]
        assert sum(r["count"] for r in got["rows"]) + got["rest"]["count"] == 32


def test_marks_follow_device_and_address_into_a_newer_map():
    old = Snapshot.from_torch(
        [_seg(0, [MIB, MIB // 2], [7, 8]), _seg(8 * MIB, [MIB], [7]), _seg(0, [MIB], [7], 1)]
    )
    line7 = next(r for r in holder_rows(old, "frame") if r.key == "train.py:7")
    assert line7.count == 3
    rows = build_rows(old)
    m = holder_marks(old, line7, rows)
    assert m["bytes"] == line7.bytes and m["count"] == 3 and m["missing"] == m["more"] == 0
    placed = {
        (int(rows.device[r]), int(rows.address[r]) + o)
        for r, o in zip(m["row"], m["offset"], strict=True)
    }
    assert placed == {(0, 0), (0, 8 * MIB), (1, 0)}
    # the map moved on: the segment at 8 MiB is gone, so its block is missing, not misplaced
    newer = build_rows(Snapshot.from_torch([_seg(0, [MIB], [7]), _seg(0, [MIB], [7], 1)]))
    m = holder_marks(old, line7, newer)
    assert (m["count"], m["missing"], m["bytes"]) == (2, 1, 2 * MIB)
    # bounded: the largest blocks first, the others counted
    m = holder_marks(old, next(r for r in holder_rows(old, "stream")), rows, limit=1)
    assert (m["count"], m["more"], m["size"]) == (1, 3, [MIB])
