"""Private pools in the analysis, the advice, the map, inspect and the report, on one hand-made
snapshot whose figures are worked out by hand below (docs/private-pools.md).

Device 0, stream 0, sizes in MiB (A allocated, F free, P pending free):

    S1 default   large 20: A4 F16          S5 graph (1, 0)   large 100: A100
    S2 default   large 20: F20             S6 graph (2, 0)   large  80: A60 F20
    S3 (0, 1)    large 20: A8 F12          S7 MemPool (0, 3) large 128: F128
    S4 (0, 1)    large 40: F40             S8 (0, 1)         small   2: P1 F1
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from gpumemviz.analysis.advice import POOL_BYTES_MIN, advise
from gpumemviz.analysis.fragmentation import ASSUMED_IN_USE, fragmentation
from gpumemviz.cli import main
from gpumemviz.render.rows import KIND_RELEASABLE, build_rows
from gpumemviz.render.wire import header_numbers
from gpumemviz.reporting.html_report import MAX_POOLS, report_data
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.pools import normalize_in_use, pool_kind, pool_label
from gpumemviz.widget import MemoryPanel

MIB = 1 << 20


def _seg(address: int, pool: tuple[int, int], blocks: list[tuple[int, str]], small=False):
    return {
        "device": 0,
        "address": address,
        "total_size": sum(s for s, _ in blocks) * MIB,
        "stream": 0,
        "segment_type": "small" if small else "large",
        "segment_pool_id": pool,
        "is_expandable": False,
        "frames": [],
        "blocks": [
            {"size": s * MIB, "requested_size": s * MIB if st != "inactive" else 0, "state": st}
            for s, st in blocks
        ],
    }


A, F, P = "active_allocated", "inactive", "active_pending_free"
SEGMENTS = [
    _seg(0x10000000, (0, 0), [(4, A), (16, F)]),
    _seg(0x20000000, (0, 0), [(20, F)]),
    _seg(0x30000000, (0, 1), [(8, A), (12, F)]),
    _seg(0x40000000, (0, 1), [(40, F)]),
    _seg(0x50000000, (1, 0), [(100, A)]),
    _seg(0x60000000, (2, 0), [(60, A), (20, F)]),
    _seg(0x70000000, (0, 3), [(128, F)]),
    _seg(0x80000000, (0, 1), [(1, P), (1, F)], small=True),
]


def snap_dict() -> dict:
    return {"segments": [dict(s) for s in SEGMENTS], "device_traces": [[]]}


# per pool: (label, kind, reserved, allocated, pending, free, largest, now, after, segments)
IN_USE = {
    (0, 0): ("default pool", "default", 40, 4, 0, 36, 20, 20, 0, 2),
    (0, 1): ("MemPool (0, 1)", "mempool", 62, 8, 1, 53, 40, 0, 42, 3),
    (0, 3): ("MemPool (0, 3)", "mempool", 128, 0, 0, 128, 128, 0, 128, 1),
    (1, 0): ("CUDA graph pool (1, 0)", "graph", 100, 100, 0, 0, 0, 0, 0, 1),
    (2, 0): ("CUDA graph pool (2, 0)", "graph", 80, 60, 0, 20, 20, 0, 0, 1),
}


def _row(p) -> tuple:
    mib = [
        v // MIB
        for v in (
            p.reserved,
            p.allocated,
            p.pending_free,
            p.free,
            p.largest_free,
            p.releasable,
            p.releasable_after_release,
        )
    ]
    return (p.label, p.kind, *mib, p.segments)


def test_pool_kinds_and_labels_follow_torch_numbering():
    # (0, n): MemPool() / graph_pool_handle(); (n, 0): a graph's own pool
    assert [pool_kind(p) for p in [(0, 0), (0, 7), (7, 0), (2, 3), (-1, 0)]] == [
        "default",
        "mempool",
        "graph",
        "private",
        "private",
    ]
    assert pool_label((2, 3)) == "private pool (2, 3)"
    assert normalize_in_use([(0, 1), [0, 3]]) == frozenset({(0, 1), (0, 3)})
    for bad in ("all", [(0, 1, 2)], [(0, True)], 3, [("0", 1)]):
        with pytest.raises(ValueError, match=r"^pools_in_use must be"):
            fragmentation(snap_dict(), pools_in_use=bad)


@pytest.mark.parametrize("source", ["dict", "snapshot"])
def test_per_pool_figures_by_hand(source):
    d = snap_dict()
    r = fragmentation(d if source == "dict" else Snapshot.from_torch(d))
    f = r.device(0)
    assert [p.pool_id for p in f.pools] == list(IN_USE)  # default first, then by id
    assert {p.pool_id: _row(p) for p in f.pools} == IN_USE
    for p in f.pools:  # the conservation law per pool
        assert p.allocated + p.pending_free + p.free == p.reserved
        assert p.in_use
    assert f.pool((0, 1)).note == "only after the pool is released"
    assert f.pool((0, 0)).note == f.pool((1, 0)).note == ""
    assert f.pool((5, 5)) is None
    assert f.pool((0, 0)).external_fragmentation == pytest.approx(1 - 20 / 36)
    # ... and overall: the device's figures are the pools' sums
    assert (f.reserved, f.allocated, f.pending_free, f.free) == (
        410 * MIB,
        172 * MIB,
        MIB,
        237 * MIB,
    )
    assert f.allocated + f.pending_free + f.free == f.reserved
    assert (f.releasable, f.releasable_private) == (20 * MIB, 170 * MIB)
    assert f.free_stuck == f.free + f.pending_free - f.releasable
    assert r.pools_in_use is True and r.to_dict()["pools_in_use"] is True
    assert r.total.pools == f.pools
    pools_json = r.to_dict()["devices"]["0"]["pools"]
    assert [p["label"] for p in pools_json] == [v[0] for v in IN_USE.values()]
    assert pools_json[1]["pool_id"] == [0, 1]
    assert pools_json[1]["releasable_after_release"] == 42 * MIB
    assert pools_json[1]["note"] == "only after the pool is released"


@pytest.mark.parametrize(
    ("in_use", "now", "later", "released"),
    [
        (True, 20, 170, set()),
        (False, 190, 0, {(0, 1), (0, 3), (1, 0), (2, 0)}),
        ([(0, 1)], 148, 42, {(0, 3), (1, 0), (2, 0)}),
    ],
)
def test_what_empty_cache_returns_follows_the_assumption(in_use, now, later, released):
    r = fragmentation(snap_dict(), pools_in_use=in_use)
    f = r.device(0)
    assert (f.releasable, f.releasable_private) == (now * MIB, later * MIB)
    assert {p.pool_id for p in f.pools if not p.in_use} == released
    for p in f.pools:
        whole = IN_USE[p.pool_id][7] + IN_USE[p.pool_id][8]  # whole-free bytes, in MiB
        assert p.releasable + p.releasable_after_release == whole * MIB
        assert p.releasable_after_release == (
            0 if p.pool_id in released else p.releasable_after_release
        )
    expect = in_use if isinstance(in_use, bool) else [[0, 1]]
    assert r.to_dict()["pools_in_use"] == expect


def test_can_fit_searches_only_the_requests_pool():
    r = fragmentation(snap_dict())
    # the default pool's free blocks are 16 and 20 MiB: 36 MiB does not fit there, although
    # MemPool (0, 1) and (0, 3) hold 40 and 128 MiB free blocks
    a = r.can_fit(36 * MIB, device_free=0)
    assert a.verdict == "out_of_memory" and a.pool_id == (0, 0)
    assert a.releasable == 20 * MIB  # the flush returns only the default pool's S2
    assert (
        "(MemPool (0, 3) holds a free 128.00 MiB block, but a request in the default pool "
        "cannot use another pool's blocks)" in a.explanation
    )
    # told the pools are released, the allocator's flush returns them too
    b = fragmentation(snap_dict(), pools_in_use=False).can_fit(36 * MIB, device_free=0)
    assert (b.verdict, b.releasable) == ("flush_and_retry", 190 * MIB)
    # asked for a pool, the answer is that pool's best fit
    c = r.can_fit(36 * MIB, pool=(0, 1))
    assert (c.verdict, c.block_address, c.block_size) == ("cached", 0x40000000, 40 * MIB)
    assert c.pool_id == (0, 1) and "the large pool of MemPool (0, 1)" in c.explanation
    assert r.can_fit(36 * MIB, pool=(0, 3)).block_address == 0x70000000
    # a graph pool with only a 20 MiB free block needs a new segment for 30 MiB
    g = r.can_fit(30 * MIB, pool=(2, 0), device_free=MIB << 10)
    assert (g.verdict, g.new_bytes) == ("new_segment", 30 * MIB)
    assert "CUDA graph pool (2, 0)" in g.explanation
    # the small pools: only MemPool (0, 1) has one (its free 1 MiB block after the pending one)
    s = r.can_fit(512)
    assert s.verdict == "room_unknown" and "MemPool (0, 1) holds a free 1024.00 KiB block" in str(s)
    s1 = r.can_fit(512, pool=[0, 1])
    assert (s1.verdict, s1.block_address, s1.block_size) == ("cached", 0x80100000, MIB)
    # a default-pool request that does fit says nothing about the other pools
    assert "another pool" not in str(r.can_fit(10 * MIB))
    assert r.can_fit(10 * MIB).to_dict()["pool_id"] == (0, 0)
    for bad in ((0,), (0, "1"), "0,1", (True, 0)):
        with pytest.raises(ValueError, match=r"^pool must be a pair of ints"):
            r.can_fit(MIB, pool=bad)


def test_pool_advice_with_its_numbers():
    advice = advise(snap_dict())
    assert [a.kind for a in advice] == ["release_idle_pool", "share_graph_pool"]
    idle, share = advice
    assert idle.evidence == {
        "device": 0,
        "pools": 1,
        "largest_pool_a": 0,
        "largest_pool_b": 3,
        "reserved": 128 * MIB,
        "bytes_freed": 128 * MIB,
        "assumed_in_use": 1,
    }
    assert idle.message.startswith("MemPool (0, 3) on the device holds 128.00 MiB with nothing")
    assert "release it (graph.reset()" in idle.message
    assert "so each was assumed to be" in idle.message
    # two graphs with their own pools: one shared pool holds about the larger (100 MiB)
    assert share.evidence == {
        "device": 0,
        "graph_pools": 2,
        "reserved_in_graph_pools": 180 * MIB,
        "largest_graph_pool": 100 * MIB,
        "bytes_saved": 80 * MIB,
    }
    assert "graph_pool_handle()" in share.message and "saving up to 80.00 MiB" in share.message
    # taken as released: empty_cache alone returns the idle pool; (0, 1) frees only 42 MiB
    released = advise(fragmentation(snap_dict(), pools_in_use=False))
    (idle2,) = (a for a in released if a.kind == "release_idle_pool")
    assert idle2.evidence["assumed_in_use"] == 0
    # (0, 3)'s 128 MiB, (0, 1)'s 42 MiB (S4, S8): one advice for the device, largest first
    assert idle2.evidence["pools"] == 2 and idle2.evidence["bytes_freed"] == 170 * MIB
    assert idle2.message.startswith(
        "2 private pools (MemPool (0, 3) 128.00 MiB, MemPool (0, 1) 42.00 MiB) on the device, "
        "taken as released (pools_in_use), still cache 170.00 MiB"
    )
    assert "torch.cuda.empty_cache() returns 170.00 MiB" in idle2.message


def test_idle_pools_of_a_device_make_one_advice():
    # five idle graph pools of 20 MiB each: 100 MiB together, the largest three named
    segs = [_seg(0x10000000 * (n + 1), (n + 1, 0), [(20 + n, F)]) for n in range(5)]
    (idle,) = (a for a in advise({"segments": segs}) if a.kind == "release_idle_pool")
    assert idle.evidence["pools"] == 5 and idle.evidence["bytes_freed"] == 110 * MIB
    assert idle.evidence["largest_pool_a"] == 5
    assert idle.message.startswith(
        "5 private pools (CUDA graph pool (5, 0) 24.00 MiB, CUDA graph pool (4, 0) 23.00 MiB, "
        "CUDA graph pool (3, 0) 22.00 MiB and 2 more) on the device hold 110.00 MiB with "
        "nothing allocated. If their graph or MemPool is no longer needed, release them"
    )


def test_pool_advice_stays_quiet_below_its_thresholds():
    # one graph pool only, and the idle pool shrunk under POOL_BYTES_MIN
    segs = [s for s in snap_dict()["segments"] if tuple(s["segment_pool_id"]) != (2, 0)]
    small = _seg(0x70000000, (0, 3), [(POOL_BYTES_MIN // MIB - 2, F)])
    segs = [small if tuple(s["segment_pool_id"]) == (0, 3) else s for s in segs]
    assert advise({"segments": segs}) == []
    # two graph pools saving just under the threshold: quiet; at it: advised
    g = POOL_BYTES_MIN // MIB
    for extra, kinds in ((g - 2, []), (g, ["share_graph_pool"])):
        two = [_seg(0x1000000, (1, 0), [(100, A)]), _seg(0x9000000, (2, 0), [(extra, A)])]
        assert [a.kind for a in advise({"segments": two})] == kinds


def test_map_rows_group_pools_apart_and_paint_what_empty_cache_keeps():
    snap = Snapshot.from_torch(snap_dict())
    rows = build_rows(snap)
    got = [(g.pool_id, g.pool, g.count, g.label) for g in rows.groups]
    assert got == [
        ((0, 0), "large", 2, ""),
        ((0, 1), "large", 2, "MemPool (0, 1)"),
        ((0, 1), "small", 1, "MemPool (0, 1)"),
        ((0, 3), "large", 1, "MemPool (0, 3)"),
        ((1, 0), "large", 1, "CUDA graph pool (1, 0)"),
        ((2, 0), "large", 1, "CUDA graph pool (2, 0)"),
    ]
    assert rows.address.tolist() == [
        0x10000000,
        0x20000000,
        0x30000000,
        0x40000000,
        0x80000000,
        0x70000000,
        0x50000000,
        0x60000000,
    ]
    assert rows.groups[3].to_dict()["pool_label"] == "MemPool (0, 3)"
    assert rows.groups[3].to_dict()["pool_id"] == [0, 3]
    # in use, a private pool's whole-free segment is kept by empty_cache: painted trapped
    t = rows.totals()
    assert (t["free_releasable"], t["free_trapped"], t["pending_free"]) == (
        20 * MIB,
        217 * MIB,
        MIB,
    )
    assert header_numbers(rows)["free_releasable"] == fragmentation(snap).releasable
    painted = rows.kind_bytes[:, KIND_RELEASABLE]
    assert np.flatnonzero(painted).tolist() == [1]  # S2 only
    # released: S4, S7 and S8's free MiB too (the pending MiB stays painted pending)
    t2 = build_rows(snap, pools_in_use=False).totals()
    assert (t2["free_releasable"], t2["pending_free"]) == (189 * MIB, MIB)
    # only (0, 3) in use: S2, S4 and S8's free MiB
    assert build_rows(snap, pools_in_use=[(0, 3)]).totals()["free_releasable"] == 61 * MIB


def test_the_panel_labels_its_pool_groups():
    p = MemoryPanel.from_snapshot(snap_dict(), title="pools")
    try:
        assert p.flush()
        labels = [g["pool_label"] for g in p.map_layout["groups"]]
        assert labels == [
            "",
            "MemPool (0, 1)",
            "MemPool (0, 1)",
            "MemPool (0, 3)",
            "CUDA graph pool (1, 0)",
            "CUDA graph pool (2, 0)",
        ]
    finally:
        p.close()


def test_inspect_prints_each_pool(tmp_path, capsys):
    path = tmp_path / "pools.pickle"
    path.write_bytes(pickle.dumps(snap_dict()))
    assert main(["inspect", str(path), "--no-replay"]) == 0
    text = capsys.readouterr().out
    assert "  pools:\n" in text
    assert (
        "    MemPool (0, 3): 1 segments, reserved 128.00 MiB, allocated 0 bytes, free 128.00 MiB "
        "(largest 128.00 MiB, external fragmentation 0.0%); empty_cache releases 0 bytes now, "
        "128.00 MiB only after the pool is released\n"
    ) in text
    assert (
        "    MemPool (0, 1): 3 segments, reserved 62.00 MiB, allocated 8.00 MiB, pending free "
        "1024.00 KiB, free 53.00 MiB (largest 40.00 MiB, external fragmentation 24.5%); "
        "empty_cache releases 0 bytes now, 42.00 MiB only after the pool is released\n"
    ) in text
    assert f"    note: {ASSUMED_IN_USE}\n" in text
    assert "empty_cache would release 20.00 MiB (+170.00 MiB of private pools)" in text
    assert "large in CUDA graph pool (2, 0) 80.00 MiB: 20.00 MiB stuck" in text
    assert "[release_idle_pool] MemPool (0, 3)" in text and "[share_graph_pool]" in text
    assert main(["inspect", str(path), "--no-replay", "--pools-released"]) == 0
    text = capsys.readouterr().out
    assert "empty_cache would release 190.00 MiB\n" in text
    assert "MemPool (0, 3): 1 segments" in text and "empty_cache releases 128.00 MiB\n" in text
    assert "    note: private pools taken as released\n" in text
    assert main(["inspect", str(path), "--no-replay", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pools_in_use"] is True
    pools = out["devices"]["0"]["pools"]
    assert [(p["label"], p["reserved"]) for p in pools] == [
        (v[0], v[2] * MIB) for v in IN_USE.values()
    ]
    assert out["memory"]["pools"] == out["pools"] == pools
    for p in pools:
        assert p["allocated"] + p["pending_free"] + p["free"] == p["reserved"]


def test_the_report_lists_the_pools():
    data = report_data(Snapshot.from_torch(snap_dict()), replay_advice=False)
    assert [p["label"] for p in data["pools"]] == [v[0] for v in IN_USE.values()]
    mp = data["pools"][2]
    assert (mp["releasable"], mp["releasable_after_release"], mp["note"]) == (
        0,
        128 * MIB,
        "only after the pool is released",
    )
    assert data["pools_note"] == ASSUMED_IN_USE
    groups = data["map"]["layout"]["groups"]
    assert [g["pool_label"] for g in groups][1:3] == ["MemPool (0, 1)"] * 2
    assert {a["kind"] for a in data["advice"]} == {"release_idle_pool", "share_graph_pool"}
    # the worst segments name their private pool
    assert [(w["address"], w["pool_label"]) for w in data["worst"]][:2] == [
        (0x60000000, "CUDA graph pool (2, 0)"),
        (0x10000000, ""),
    ]
    # a snapshot with the default pool only lists no pools
    plain = {"segments": [SEGMENTS[0]], "device_traces": [[]]}
    assert report_data(Snapshot.from_torch(plain), replay_advice=False)["pools"] == []
    # many pools: the default pool and the 11 largest private ones, in the report's order
    many = [SEGMENTS[0]] + [_seg(0x10000000 * (n + 2), (n + 1, 0), [(2 + n, A)]) for n in range(20)]
    listed = report_data(Snapshot.from_torch({"segments": many}), replay_advice=False)["pools"]
    assert len(listed) == MAX_POOLS == 12
    assert [p["label"] for p in listed] == ["default pool"] + [
        f"CUDA graph pool ({n}, 0)" for n in range(10, 21)
    ]


def test_an_expandable_run_in_a_pool_gives_back_its_whole_pages_once_released():
    # a 40 MiB mapped run of MemPool (0, 4): 10 MiB allocated, then 30 MiB free; pages are
    # 20 MiB (large), so [20, 40) is a whole free page and [10, 20) a sliver
    run = _seg(0x7F0000000000, (0, 4), [(10, A), (30, F)])
    run["is_expandable"] = True
    d = {"segments": [run], "allocator_settings": {"expandable_segments": True}}
    kept = fragmentation(d).device(0)
    (p,) = kept.pools
    assert (p.releasable, p.releasable_after_release) == (0, 20 * MIB)
    assert (kept.releasable, kept.free_stuck, kept.free_stuck_expandable) == (0, 30 * MIB, 0)
    gone = fragmentation(d, pools_in_use=False).device(0)
    assert (gone.releasable, gone.free_stuck, gone.free_stuck_expandable) == (
        20 * MIB,
        10 * MIB,
        10 * MIB,
    )
    snap = Snapshot.from_torch(d)
    assert build_rows(snap).totals()["free_releasable"] == 0
    assert build_rows(snap, pools_in_use=False).totals()["free_releasable"] == 20 * MIB


def test_two_devices_keep_their_pools_apart(tmp_path, capsys):
    segs = [_seg(0x10000000, (0, 0), [(20, F)]), _seg(0x20000000, (0, 1), [(20, F)])]
    other = [dict(s, device=1) for s in [_seg(0x10000000, (0, 0), [(4, A), (16, F)]), segs[1]]]
    d = {"segments": segs + other, "device_traces": [[], []]}
    r = fragmentation(d)
    for dev in (0, 1):
        assert [(p.device, p.pool_id) for p in r.device(dev).pools] == [
            (dev, (0, 0)),
            (dev, (0, 1)),
        ]
    assert [(p.device, p.pool_id) for p in r.total.pools] == [
        (0, (0, 0)),
        (0, (0, 1)),
        (1, (0, 0)),
        (1, (0, 1)),
    ]
    assert (r.total.releasable, r.total.releasable_private) == (20 * MIB, 40 * MIB)
    # device 1's default pool has a 16 MiB block: a default-pool request is told of device 1's
    # pool (device 0's 20 MiB blocks are another device's)
    assert "MemPool (0, 1) holds a free 20.00 MiB block" in str(r.can_fit(19 * MIB, device=1))
    assert r.can_fit(19 * MIB, device=1, pool=(0, 1)).block_address == 0x20000000
    rows = build_rows(Snapshot.from_torch(d))
    assert [(g.device, g.label) for g in rows.groups] == [
        (0, ""),
        (0, "MemPool (0, 1)"),
        (1, ""),
        (1, "MemPool (0, 1)"),
    ]
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(d))
    assert main(["inspect", str(path), "--no-replay"]) == 0
    text = capsys.readouterr().out
    assert text.count("  pools:\n") == 2  # under each device, not again under "all devices"
    assert text.count("    MemPool (0, 1): 1 segments, reserved 20.00 MiB") == 2
