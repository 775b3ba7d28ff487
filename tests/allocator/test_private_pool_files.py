"""The two shipped recordings with segments in private pools (`torch.cuda.MemPool`).

THUDM's slime: 297 of its 298 segments in pool (0, 1), on device 3, with a 2,515-entry trace;
volcengine's verl: vLLM weights in pool (0, 1), the KV cache in pool (0, 2), no trace.

What holds on both: loading, analysis, advice, rendering, the panel, the HTML report, exports,
diff and `inspect` run without error and keep the conservation law (allocated + free +
pending_free == reserved, per device, per pool and per segment); each pool's figures, worked out
here from the raw dicts with plain Python, are the analysis's (docs/private-pools.md), and
`inspect`, the report and the panel show the pools apart; `can_fit` keeps pools apart. The model
holds private pools, so slime's trace replays with every allocation at its recorded address,
each in the pool the file names, `whatif` reports per pool and the advice check replays it;
verl (no trace) gets the no-trace line.
"""

from __future__ import annotations

import collections
import csv
import json
import pickle

import numpy as np
import pytest

from conftest import has_private_pools, read_real, real_file
from gpumemviz.allocator.replay import ReplayError, replay
from gpumemviz.analysis.advice import ADVICE_KINDS, Advice, advise
from gpumemviz.analysis.advice_check import check_advice
from gpumemviz.analysis.diff import FIGURES, diff
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.analysis.holders import live_holders
from gpumemviz.cli import main
from gpumemviz.io import load_snapshot
from gpumemviz.render.rows import build_rows
from gpumemviz.render.wire import FIRST_FRAME_LIMIT, Wire, header_numbers
from gpumemviz.render.wire_frame import decode_frame
from gpumemviz.reporting.export import TRACE_COLUMNS, export
from gpumemviz.reporting.html_report import report, report_data
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.pools import pool_label
from gpumemviz.snapshot.units import format_size
from gpumemviz.widget import MemoryPanel
from test_report_html import decoded_map, page_data

SLIME = "THUDM__slime__init_model_mempool.pickle"
VERL = "volcengine__verl__mem_mempools.pickle"
FILES = {"slime": SLIME, "verl": VERL}

# what PROVENANCE.md says of each file, read here off the raw dicts
POOLS = {
    "slime": {(0, 0): 1, (0, 1): 297},
    "verl": {(0, 0): 59, (0, 1): 44, (0, 2): 24},
}
DEVICES = {"slime": [3], "verl": [0]}
TRACE_LENGTHS = {"slime": {3: 2515}, "verl": {}}

NO_TRACE = "snapshot has no trace to replay (recorded with history off?)"


@pytest.fixture(params=sorted(FILES))
def which(request) -> str:
    return request.param


@pytest.fixture
def path(which):
    return real_file(FILES[which])


@pytest.fixture
def raw(path):
    return read_real(path)


def _segs(raw: dict) -> list[dict]:
    return raw["segments"]


def _by_state(blocks, state: str) -> int:
    return sum(b["size"] for b in blocks if b["state"] == state)


def _device_sums(raw: dict) -> dict[int, dict[str, int]]:
    """Per device, from the raw dict alone: reserved and the three kinds of bytes."""
    out: dict[int, dict[str, int]] = {}
    for s in _segs(raw):
        d = out.setdefault(
            s["device"], {"reserved": 0, "allocated": 0, "free": 0, "pending_free": 0}
        )
        d["reserved"] += s["total_size"]
        d["allocated"] += _by_state(s["blocks"], "active_allocated")
        d["free"] += _by_state(s["blocks"], "inactive")
        d["pending_free"] += _by_state(s["blocks"], "active_pending_free")
    return out


def _pool_bytes(raw: dict, device: int) -> dict[tuple[int, int], int]:
    """Reserved bytes per pool of the device's final segments, from the raw dict alone."""
    out: dict[tuple[int, int], int] = {}
    for s in _segs(raw):
        if s["device"] == device:
            pid = tuple(s["segment_pool_id"])
            out[pid] = out.get(pid, 0) + s["total_size"]
    return out


def _pool_sums(raw: dict) -> dict[tuple[int, tuple[int, int]], dict[str, int]]:
    """Per (device, pool), from the raw dict alone: the pool's figures."""
    out: dict[tuple[int, tuple[int, int]], dict[str, int]] = {}
    for s in _segs(raw):
        key = (s["device"], tuple(s["segment_pool_id"]))
        d = out.setdefault(key, collections.Counter())
        blocks = s["blocks"]
        d["reserved"] += s["total_size"]
        d["allocated"] += _by_state(blocks, "active_allocated")
        d["pending_free"] += _by_state(blocks, "active_pending_free")
        d["free"] += _by_state(blocks, "inactive")
        d["segments"] += 1
        free_sizes = [b["size"] for b in blocks if b["state"] == "inactive"]
        d["largest_free"] = max([d["largest_free"], *free_sizes])
        # empty_cache syncs pending frees, then returns every segment with nothing allocated
        if not any(b["state"] == "active_allocated" for b in blocks):
            d["whole_free"] += s["total_size"]
    return out


def _free_blocks(raw: dict, device: int, pool: tuple[int, int], large: bool):
    """(size, address) of the inactive blocks of one device's pool and size class, stream 0."""
    out = []
    for s in _segs(raw):
        if (s["device"], tuple(s["segment_pool_id"]), s["stream"]) != (device, pool, 0):
            continue
        if (s["segment_type"] == "large") != large:
            continue
        at = s["address"]
        for b in s["blocks"]:
            if b["state"] == "inactive":
                out.append((b["size"], at))
            at += b["size"]
    return sorted(out)


# -- the files ----------------------------------------------------------------------------------


def test_the_files_hold_private_pools(which, raw):
    assert has_private_pools(raw)
    pools = collections.Counter(tuple(s["segment_pool_id"]) for s in _segs(raw))
    assert dict(pools) == POOLS[which]
    assert sorted({s["device"] for s in _segs(raw)}) == DEVICES[which]
    traced = {d: len(t) for d, t in enumerate(raw["device_traces"]) if t}
    assert traced == TRACE_LENGTHS[which]


def test_load_snapshot_keeps_every_pool_id(path, raw):
    snap = load_snapshot(path)
    assert snap.to_torch() == raw
    assert [tuple(p) for p in snap.segments.pool_id.tolist()] == [
        tuple(s["segment_pool_id"]) for s in _segs(raw)
    ]
    assert snap.devices == tuple(sorted({s["device"] for s in _segs(raw)}))


# -- analysis -----------------------------------------------------------------------------------


def test_fragmentation_keeps_the_conservation_law(path, raw):
    report_ = fragmentation(path)
    assert report_.violations == ()
    sums = _device_sums(raw)
    assert sorted(report_.devices) == sorted(sums)
    for dev, want in sums.items():
        f = report_.device(dev)
        assert f.violations == ()
        assert (f.reserved, f.allocated, f.free, f.pending_free) == (
            want["reserved"],
            want["allocated"],
            want["free"],
            want["pending_free"],
        )
        assert f.allocated + f.free + f.pending_free == f.reserved
        assert f.segments == sum(1 for s in _segs(raw) if s["device"] == dev)
    t = report_.total
    assert t.allocated + t.free + t.pending_free == t.reserved
    assert t.reserved == sum(s["total_size"] for s in _segs(raw))
    # per segment, in file order
    seg = report_.per_segment
    assert len(seg) == len(_segs(raw))
    np.testing.assert_array_equal(seg.allocated + seg.free + seg.pending_free, seg.total_size)
    assert seg.total_size.tolist() == [s["total_size"] for s in _segs(raw)]
    assert seg.allocated.tolist() == [
        _by_state(s["blocks"], "active_allocated") for s in _segs(raw)
    ]
    assert seg.free.tolist() == [_by_state(s["blocks"], "inactive") for s in _segs(raw)]
    assert seg.pending_free.tolist() == [
        _by_state(s["blocks"], "active_pending_free") for s in _segs(raw)
    ]
    assert [tuple(p) for p in seg.pool_id.tolist()] == [
        tuple(s["segment_pool_id"]) for s in _segs(raw)
    ]
    # the dict, the Snapshot and the path give one report
    assert (
        fragmentation(raw).to_dict()
        == report_.to_dict()
        == fragmentation(load_snapshot(path)).to_dict()
    )
    json.dumps(report_.to_dict())


def test_each_pool_has_its_own_figures(path, raw):
    sums = _pool_sums(raw)
    report_ = fragmentation(path)
    assert report_.pools_in_use is True
    for dev, f in report_.devices.items():
        want = sorted((pool for d, pool in sums if d == dev), key=lambda p: (p != (0, 0), p))
        assert [p.pool_id for p in f.pools] == want
        for p in f.pools:
            w = sums[(dev, p.pool_id)]
            got = (p.reserved, p.allocated, p.pending_free, p.free, p.segments, p.largest_free)
            assert got == (
                w["reserved"],
                w["allocated"],
                w["pending_free"],
                w["free"],
                w["segments"],
                w["largest_free"],
            )
            assert p.allocated + p.pending_free + p.free == p.reserved
            assert p.label == pool_label(p.pool_id)
            # assumed in use: a private pool's whole-free segments wait on its release
            if p.pool_id == (0, 0):
                assert (p.releasable, p.releasable_after_release) == (w["whole_free"], 0)
            else:
                assert (p.releasable, p.releasable_after_release) == (0, w["whole_free"])
                assert p.note == ("only after the pool is released" if w["whole_free"] else "")
        private = sum(v["whole_free"] for (d, pool), v in sums.items() if d == dev and any(pool))
        assert f.releasable == sums[(dev, (0, 0))]["whole_free"]
        assert f.releasable_private == private
        released = fragmentation(path, pools_in_use=False).device(dev)
        assert released.releasable == f.releasable + private
        assert released.releasable_private == 0
    # what PROVENANCE.md says, in the analysis's words
    if path.name == VERL:
        kv = report_.device(0).pool((0, 2))
        assert (kv.label, kv.segments, kv.reserved) == ("MemPool (0, 2)", 24, 21793603584)
    else:
        f = report_.device(3)
        assert f.pool((0, 1)).segments == 297
        # 360 MiB free in reserved at 97.2 % external fragmentation, nearly all in the pool
        assert (format_size(f.free), f"{f.external_fragmentation:.1%}") == ("360.29 MiB", "97.2%")
        assert format_size(f.pool((0, 1)).free) == "358.29 MiB"


def test_can_fit_keeps_the_pools_apart(which, path, raw):
    (dev,) = DEVICES[which]
    report_ = fragmentation(path)
    mib = 1 << 20
    # MemPool (0, 1)'s best fit for 8 MiB: the smallest large free block of at least 8 MiB,
    # lowest address first on ties
    mine = [b for b in _free_blocks(raw, dev, (0, 1), large=True) if b[0] >= 8 * mib]
    a = report_.can_fit(8 * mib, device=dev, pool=(0, 1))
    assert (a.verdict, a.block_size, a.block_address) == ("cached", *mine[0])
    assert a.pool_id == (0, 1) and "MemPool (0, 1)" in a.explanation
    default = [b for b in _free_blocks(raw, dev, (0, 0), large=True) if b[0] >= 8 * mib]
    d = report_.can_fit(8 * mib, device=dev, device_free=0)
    if default:  # verl: the default pool has its own
        assert (d.verdict, d.block_size, d.block_address) == ("cached", *default[0])
    else:  # slime: MemPool (0, 1)'s blocks are not the default pool's
        assert d.verdict == "out_of_memory"
        largest = max(b[0] for b in mine)
        assert (
            f"(MemPool (0, 1) holds a free {format_size(largest)} block, but a request in the "
            "default pool cannot use another pool's blocks)"
        ) in d.explanation
    # a pool with no room: the flush returns only the default pool's whole-free segments
    big = report_.can_fit(4 << 30, device=dev, device_free=0, pool=(0, 1))
    assert big.releasable == _pool_sums(raw)[(dev, (0, 0))]["whole_free"]
    assert big.verdict == "out_of_memory"


def test_live_sites_add_up_to_the_allocated_bytes(path, raw):
    sites = live_holders(path, top=None)
    assert sum(s.bytes for s in sites) == sum(v["allocated"] for v in _device_sums(raw).values())


def test_advice_runs_and_a_setting_check_replays_the_pools(which, path, raw):
    report_ = fragmentation(path)
    advice = advise(report_)
    assert advice == advise(raw)
    for a in advice:
        assert a.kind in ADVICE_KINDS and a.evidence and "\n" not in a.message
    (dev,) = DEVICES[which]
    checked = check_advice(raw, [Advice("expandable_segments", "Try it.", {"device": dev})])
    (c,) = checked.shown
    assert checked.rejected == []
    if which == "slime":  # traced: replayed, every pool under the new setting
        assert c.unchecked is None and c.check is not None
        assert c.check.events == TRACE_LENGTHS["slime"][3]
        assert c.check.peak_segments_before == 384 and c.check.peak_segments_after < 384
    else:
        assert c.check is None and c.unchecked == f"no recorded trace for device {dev}"


# -- rendering ----------------------------------------------------------------------------------


def test_segment_map_rows_and_wire_frames(raw):
    snap = Snapshot.from_torch(raw)
    rows = build_rows(snap)
    assert rows.n_rows == len(_segs(raw))
    assert sorted(rows.segment.tolist()) == list(range(len(_segs(raw))))
    t = rows.totals()
    reserved = sum(s["total_size"] for s in _segs(raw))
    assert t["reserved"] == reserved
    assert t["allocated"] + t["pending_free"] + t["free_releasable"] + t["free_trapped"] == reserved
    f = header_numbers(rows)
    assert f["allocated"] + f["pending_free"] + f["free"] == f["reserved"] == reserved
    report_ = fragmentation(snap)
    assert (f["allocated"], f["pending_free"], f["free"]) == (
        report_.allocated,
        report_.pending_free,
        report_.free,
    )
    wire = Wire()
    wire.set_rows(rows)
    frames = wire.set_view("v", first=0, count=rows.n_rows, cells=512)
    seen = set()
    for fr in frames:
        assert fr.nbytes <= FIRST_FRAME_LIMIT
        seen |= {int(r) for r in decode_frame(fr.content, fr.buffers)["rows"]}
    assert seen == set(range(rows.n_rows))


def test_the_panel_draws_the_file(which, path, raw):
    p = MemoryPanel.from_snapshot(path, title=which)
    try:
        assert p.flush()
        assert p.errors == ()
        assert p.map_layout["n_rows"] == len(_segs(raw))
        assert sum(g["count"] for g in p.map_layout["groups"]) == len(_segs(raw))
        sums = _device_sums(raw)
        assert p.header["reserved"] == sum(v["reserved"] for v in sums.values())
        assert p.header["allocated"] == sum(v["allocated"] for v in sums.values())
        # the map's groups name their pool: as many rows under each label as it has segments
        rows_by_label = collections.Counter()
        for g in p.map_layout["groups"]:
            rows_by_label[g["pool_label"]] += g["count"]
        want = collections.Counter()
        for (_d, pool), v in _pool_sums(raw).items():
            want["" if pool == (0, 0) else pool_label(pool)] += v["segments"]
        assert rows_by_label == want
        assert set(want) - {""} == {pool_label(pool) for pool in POOLS[which] if any(pool)}
    finally:
        p.close()


# -- the HTML report ----------------------------------------------------------------------------


def test_the_html_report_by_the_cli_and_the_api(which, path, raw, tmp_path, capsys):
    out = tmp_path / "cli.html"
    assert main(["report", str(path), "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (")
    api = report(path, tmp_path / "api.html")
    for page in (out, api):
        text = page.read_text(encoding="utf-8")
        assert text.startswith("<!doctype html>")
        data = page_data(text)
        assert data["map"]["layout"]["n_rows"] == len(_segs(raw))
        assert len(decoded_map(data)["rows"]) == len(_segs(raw))
        sums = _device_sums(raw)
        assert data["header"]["reserved"] == sum(v["reserved"] for v in sums.values())
        assert data["header"]["allocated"] == sum(v["allocated"] for v in sums.values())
        assert {int(d) for d in data["devices"]} == set(sums)
        assert data["violations"] == []
        pools = _pool_sums(raw)
        assert [(p["label"], p["reserved"]) for p in data["pools"]] == [
            (pool_label(pool), pools[(d, pool)]["reserved"])
            for d, pool in sorted(pools, key=lambda k: (k[0], k[1] != (0, 0), k[1]))
        ]
        labels = {g["pool_label"] for g in data["map"]["layout"]["groups"]}
        assert labels == {""} | {pool_label(pool) for pool in POOLS[which] if any(pool)}
    data = report_data(load_snapshot(path))
    # the report's timeline is the recorded trace's own walk: slime's device 3, none for verl
    assert {int(d) for d in data["timeline"]} == set(TRACE_LENGTHS[which])
    for d, n in TRACE_LENGTHS[which].items():
        assert data["timeline"][str(d)]["entries"] == n


# -- exports and diff ---------------------------------------------------------------------------


def test_export_to_pickle_and_json_reloads_equal(path, raw, tmp_path, capsys):
    for name in ("s.pickle", "s.json"):
        out = export(path, tmp_path / name)
        back = load_snapshot(out).to_torch()
        assert back == raw  # segment_pool_id comes back a tuple, from JSON too
        assert all(type(s["segment_pool_id"]) is tuple for s in back["segments"])
    assert read_real(tmp_path / "s.pickle") == raw  # plain pickle, as torch's tools read it
    cli = tmp_path / "cli.pickle"
    assert main(["export", str(path), "-o", str(cli)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {cli} (")
    assert load_snapshot(cli).to_torch() == raw


def test_csv_export_of_the_trace(which, path, raw, tmp_path):
    out = export(path, tmp_path / "t.csv")
    with out.open(newline="") as f:
        header, *rows = list(csv.reader(f))
    assert tuple(header) == TRACE_COLUMNS
    assert len(rows) == sum(TRACE_LENGTHS[which].values())
    col = {c: i for i, c in enumerate(header)}
    for d, entries in enumerate(raw["device_traces"]):
        mine = [r for r in rows if r[col["device"]] == str(d)]
        assert [r[col["action"]] for r in mine] == [e["action"] for e in entries]
    if rows:  # the last row's reserved is the file's final reserved
        assert int(rows[-1][col["reserved"]]) == sum(s["total_size"] for s in _segs(raw))


def test_diff_of_the_two_files_and_of_each_with_itself(capsys):
    a, b = real_file(SLIME), real_file(VERL)
    d = diff(a, b, top=None)
    fa, fb = fragmentation(a), fragmentation(b)
    assert {n: dev.present for n, dev in d.devices.items()} == {0: "b", 3: "a"}
    for n, dev in d.devices.items():
        for name in FIGURES:
            ch = dev.figure(name)
            before = getattr(fa.devices[n], name) if n in fa.devices else 0
            after = getattr(fb.devices[n], name) if n in fb.devices else 0
            assert (ch.before, ch.after, ch.delta) == (before, after, after - before)
    assert d.device(3).segments.removed == 298 and d.device(0).segments.added == 127
    assert [f.name for f in d.total] == list(FIGURES)
    json.dumps(d.to_dict())
    assert "device 3 (only in A)" in d.text() and "device 0 (only in B)" in d.text()
    for p in (a, b):
        same = diff(p, read_real(p), top=None)
        for dev in same.devices.values():
            assert dev.present == "both"
            assert all(f.delta == 0 for f in dev.figures)
            assert dev.holders_grew == () == dev.holders_shrank
            assert dev.segments.added == dev.segments.removed == dev.segments.resized == 0
    assert main(["diff", str(a), str(b), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["devices"]) == {"0", "3"}
    assert out["total"]["reserved"]["before"] == fa.reserved
    assert out["total"]["reserved"]["after"] == fb.reserved
    assert main(["diff", str(a), str(a)]) == 0
    capsys.readouterr()


# -- inspect ------------------------------------------------------------------------------------


def test_inspect_json_and_text(which, path, raw, capsys):
    assert main(["inspect", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sums = _device_sums(raw)
    assert set(out["devices"]) == {str(d) for d in sums}
    for d, want in sums.items():
        figs = out["devices"][str(d)]["memory"]
        for key, value in want.items():
            assert figs[key] == value, key
        assert figs["violations"] == []
    t = out["memory"]
    assert t["allocated"] + t["free"] + t["pending_free"] == t["reserved"]
    assert isinstance(out["advice"], list)
    assert out["pools_in_use"] is True
    pools = _pool_sums(raw)
    for d in sums:
        listed = out["devices"][str(d)]["pools"]
        assert {tuple(p["pool_id"]): p["reserved"] for p in listed} == {
            pool: v["reserved"] for (dd, pool), v in pools.items() if dd == d
        }
        for p in listed:
            assert p["allocated"] + p["pending_free"] + p["free"] == p["reserved"]
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    for d in sums:
        assert f"device {d}: reserved" in text
    assert "Traceback" not in text
    for (_d, pool), v in pools.items():
        head = f"    {pool_label(pool)}: {v['segments']} segments, reserved "
        assert head + format_size(v["reserved"]) in text
    assert "    note: private pools are assumed in use" in text


# -- replay and whatif ---------------------------------------------------------------------------


def test_slime_replays_every_alloc_at_its_recorded_address_in_its_pool():
    path = real_file(SLIME)
    raw = read_real(path)
    trace = raw["device_traces"][3]
    n_alloc = sum(e["action"] == "alloc" for e in trace)
    for source in (path, raw, load_snapshot(path)):
        r = replay(source)
        d = r.devices[3]
        assert (d.allocs, d.allocs_matched, d.allocs_matched_per_decision) == (n_alloc,) * 3
        assert d.exact and d.final_matched and d.mismatches == []
        want = {s["address"]: tuple(s["segment_pool_id"]) for s in _segs(raw)}
        assert {s["address"]: tuple(s["segment_pool_id"]) for s in d.final_segments} == want
        assert d.pool_final_reserved == _pool_bytes(raw, 3)
    # each alloc's pool, as inferred: the 297 pool (0, 1) segments hold most of them
    plan = r.timelines[3].pools
    assert plan is not None and plan.ids == [(0, 1)]
    per_pool = collections.Counter(
        plan.alloc[i] for i, e in enumerate(trace) if e["action"] == "alloc"
    )
    assert per_pool == {(0, 1): 800, None: 265}


def test_verl_replay_says_no_trace():
    path = real_file(VERL)
    for source in (path, read_real(path), load_snapshot(path)):
        with pytest.raises(ReplayError) as e:
            replay(source)
        assert str(e.value) == NO_TRACE
    with pytest.raises(ReplayError) as e:
        replay(path, config="expandable_segments:True", capacity="80GiB")
    assert str(e.value) == NO_TRACE


@pytest.mark.parametrize("extra", [[], ["--conf", "expandable_segments:True"]])
def test_whatif_verl_refuses_in_one_line(capsys, extra):
    assert main(["whatif", str(real_file(VERL)), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"gpumemviz whatif: error: {NO_TRACE}\n"


@pytest.mark.parametrize(
    "extra", [[], ["--conf", "expandable_segments:True"], ["--capacity", "80GiB"]]
)
def test_whatif_slime_reports_each_pool(capsys, extra):
    path = real_file(SLIME)
    raw = read_real(path)
    assert main(["whatif", str(path), "--json", *extra]) == 0
    out = json.loads(capsys.readouterr().out)
    dev = out["devices"]["3"]
    pools = {tuple(p["pool"]): p for p in dev["pools"]}
    assert set(pools) == {(0, 0), (0, 1)}
    # the recorded peaks per pool add up to at least the recorded peak, never less than the end
    final = _pool_bytes(raw, 3)
    for pid, p in pools.items():
        assert p["recorded"]["peak_reserved"] >= final[pid]
        assert p["predicted"]["peak_reserved"] >= p["predicted"]["final_reserved"] > 0
    assert (
        max(p["recorded"]["peak_reserved"] for p in pools.values())
        <= (dev["recorded"]["peak_reserved"])
    )
    if not extra:  # the recorded settings: predicted per pool = recorded per pool
        for p in pools.values():
            assert p["predicted"]["peak_reserved"] == p["recorded"]["peak_reserved"]
        assert {pid: p["predicted"]["final_reserved"] for pid, p in pools.items()} == final
    if extra[:2] == ["--conf", "expandable_segments:True"]:
        assert dev["predicted"]["peak_segments"] < dev["recorded"]["peak_segments"]
    assert main(["whatif", str(path), *extra]) == 0
    text = capsys.readouterr().out
    assert "  default pools " in text and "  pool (0, 1) " in text and "Traceback" not in text


def test_a_whatif_run_in_a_subprocess_prints_the_pools():
    # the console script, as a user runs it
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("gpumemviz")
    r = subprocess.run(
        [str(script), "whatif", str(real_file(SLIME))], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stderr == ""
    assert "pool (0, 1)" in r.stdout


def test_a_private_pool_copy_without_its_trace_says_no_trace(tmp_path, capsys):
    # slime with its trace dropped: the no-trace line, as on verl
    raw = read_real(real_file(SLIME))
    bare = tmp_path / "bare.pickle"
    bare.write_bytes(pickle.dumps({**raw, "device_traces": [[] for _ in raw["device_traces"]]}))
    assert main(["whatif", str(bare)]) == 2
    assert capsys.readouterr().err == f"gpumemviz whatif: error: {NO_TRACE}\n"
