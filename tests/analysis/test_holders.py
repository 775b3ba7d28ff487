"""holders.py: allocation sites (holders) by bytes, checked against the raw torch dicts of the
real files; `Findings.holders` along every key sums exactly to allocated."""

from __future__ import annotations

import pytest
from torch.cuda import _memory_viz as mv

from conftest import read_real, real_file, standin_file
from gpumemviz.analysis.findings import analyze
from gpumemviz.analysis.frames import format_frame, user_frame
from gpumemviz.analysis.holders import (
    HOLDER_KEYS,
    NO_STACK,
    NO_USER_FRAME,
    CallPaths,
    call_path,
    frame_key,
    live_holders,
    trace_holders,
)
from gpumemviz.io import load_snapshot


def _key(frames) -> tuple:
    f = user_frame(frames) if frames else None
    if f is None:
        label = NO_USER_FRAME if frames else NO_STACK
        return (label, 0, "")
    return (f["filename"], f["line"], f["name"])


def _raw_blocks(raw) -> list[tuple[int, dict]]:
    segs = raw["segments"] if isinstance(raw, dict) else raw
    return [(s["device"], b) for s in segs for b in s["blocks"]]


def test_live_sites_match_the_raw_blocks(recorded_path, recorded_dict):
    snap = load_snapshot(recorded_path)
    sites = live_holders(snap, top=None)
    # independent: walk the torch dict, frames as torch's own _block_extra reads them
    by_key: dict[tuple, list[int]] = {}
    for _dev, b in _raw_blocks(recorded_dict):
        if b["state"] == "active_allocated":
            by_key.setdefault(_key(mv._block_extra(b)[0]), []).append(b["size"])
    assert {s.key: s.bytes for s in sites} == {k: sum(v) for k, v in by_key.items()}
    assert {s.key: s.count for s in sites} == {k: len(v) for k, v in by_key.items()}
    assert [s.bytes for s in sites] == sorted((s.bytes for s in sites), reverse=True)
    allocated = sum(
        b["size"] for _, b in _raw_blocks(recorded_dict) if b["state"] == "active_allocated"
    )
    assert sum(s.bytes for s in sites) == allocated
    if sites:
        top = sites[0]
        assert top.bytes == int(snap.blocks.size[top.indices].sum())  # the sum of its blocks
        assert (snap.blocks.state[top.indices] == 1).all()
        assert live_holders(recorded_dict, top=1)[0].key == top.key  # dicts work the same
        assert top.to_dict()["bytes"] == top.bytes
    for dev in snap.devices:  # per device adds up to the whole
        per = live_holders(snap, device=dev, top=None)
        assert sum(s.bytes for s in per) == sum(
            b["size"]
            for d, b in _raw_blocks(recorded_dict)
            if d == dev and b["state"] == "active_allocated"
        )


def test_trace_sites_match_the_raw_alloc_entries(recorded_path, recorded_dict):
    if not isinstance(recorded_dict, dict) or not any(recorded_dict["device_traces"]):
        pytest.skip("no recorded history")
    snap = load_snapshot(recorded_path)
    for dev, entries in enumerate(recorded_dict["device_traces"]):
        sites = trace_holders(snap, device=dev, top=None)
        by_key: dict[tuple, int] = {}
        for e in entries:
            if e["action"] == "alloc":
                k = _key(e.get("frames", []))
                by_key[k] = by_key.get(k, 0) + e["size"]
        assert {s.key: s.bytes for s in sites} == by_key
        for s in sites[:3]:
            assert s.bytes == sum(entries[i]["size"] for i in s.indices.tolist())
            assert all(entries[i]["action"] == "alloc" for i in s.indices.tolist())


def test_known_site_of_a_torch_2_0_file():
    yiyi = real_file("Yiyi-philosophy__LLM-inference__oom_snapshot.pickle")
    top = live_holders(yiyi, top=1)[0]  # a path: loaded and validated
    assert top.label == "pytorch_backend.py:190:allocate"
    assert top.frame is not None and format_frame(top.frame) == top.label


def test_known_sites_of_the_2_7b_forward():
    cs336 = real_file("kkaitlyn111__cs336-a2-systems__memory_2.7b_forward.pickle")  # CI-only
    sites = live_holders(cs336, top=3)
    assert len(sites) == 3
    assert all(s.frame is None or "cs336" in s.frame["filename"] for s in sites)
    longest = trace_holders(cs336, top=None)  # default device: the longest trace
    raw = read_real(cs336)
    assert sum(s.bytes for s in longest) == sum(
        e["size"] for e in raw["device_traces"][0] if e["action"] == "alloc"
    )


def test_no_history_and_empty_snapshots():
    assert live_holders([]) == []
    assert trace_holders([]) == []
    seg = {
        "device": 0, "address": 1 << 21, "total_size": 1024, "stream": 0,
        "segment_type": "small",
        "blocks": [{"size": 1024, "state": "active_allocated", "requested_size": 1000}],
    }  # fmt: skip
    (only,) = live_holders([seg])
    assert (only.label, only.bytes, only.count, only.frame) == (NO_STACK, 1024, 1, None)


def test_known_sites_of_the_standins():
    # the same checks as the 2.7b forward's (CI-only) on the stand-ins, which ship: the top
    # live sites are the user's project, and the default device of trace_holders is the one
    # with the longest trace (device 1 of the 3-device one, not device 0)
    sites = live_holders(standin_file("training_10k"), top=3)
    assert len(sites) == 3
    assert all(s.frame is not None and "/home/user/project/" in s.frame["filename"] for s in sites)
    path = standin_file("expandable_oom_3dev")
    raw = read_real(path)
    lengths = [len(t) for t in raw["device_traces"]]
    assert max(lengths) == lengths[1] > lengths[0]
    longest = trace_holders(path, top=None)
    alloc = [sum(e["size"] for e in t if e["action"] == "alloc") for t in raw["device_traces"]]
    assert sum(s.bytes for s in longest) == alloc[1] != alloc[0]


def test_holders_along_every_key_sum_to_allocated_on_real_files(recorded_path, recorded_dict):
    """`Findings.holders(by)`: every allocated block in exactly one row, so each key's rows sum
    exactly to the allocated bytes of the raw dict (all devices and each device); the frame
    rows are the live holders merged by "file:line"."""
    found = analyze(recorded_path, check=False)
    blocks = _raw_blocks(recorded_dict)
    allocated = sum(b["size"] for _, b in blocks if b["state"] == "active_allocated")
    n_allocated = sum(1 for _, b in blocks if b["state"] == "active_allocated")
    assert found.figures.allocated == allocated
    for by in HOLDER_KEYS:
        rows = found.holders(by)
        assert sum(r.bytes for r in rows) == allocated, by
        assert sum(r.count for r in rows) == n_allocated, by
        assert [r.bytes for r in rows] == sorted((r.bytes for r in rows), reverse=True), by
        assert len({r.key for r in rows}) == len(rows), by
        for dev, f in found.devices.items():
            per = sum(b["size"] for d, b in blocks if d == dev and b["state"] == "active_allocated")
            assert sum(r.bytes for r in f.holders(by)) == per, (by, dev)
    merged: dict[object, int] = {}
    for h in live_holders(recorded_path, top=None):
        k = None if h.frame is None else frame_key(h.frame)
        merged[k] = merged.get(k, 0) + h.bytes
    assert {r.key: r.bytes for r in found.holders("frame")} == merged
    pools: dict[tuple, int] = {}
    segs = recorded_dict["segments"] if isinstance(recorded_dict, dict) else recorded_dict
    for s in segs:
        pid = tuple(s.get("segment_pool_id") or (0, 0))
        got = sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
        if got:
            pools[pid] = pools.get(pid, 0) + got
    assert {r.key: r.bytes for r in found.holders("pool")} == pools


def test_holders_at_an_entry_sum_to_the_replayed_allocated(recorded_path, recorded_dict):
    """`holders(at=i)` groups the state the replay gives after entry i: its rows sum to that
    state's allocated bytes."""
    if not isinstance(recorded_dict, dict) or not any(recorded_dict["device_traces"]):
        pytest.skip("no recorded history")
    dev = max(range(len(recorded_dict["device_traces"])),
              key=lambda d: len(recorded_dict["device_traces"][d]))  # fmt: skip
    n = len(recorded_dict["device_traces"][dev])
    if n > 20_000:
        pytest.skip("a long trace: the replay to an entry is covered by the shorter files")
    found = analyze(recorded_path, device=dev, check=False)
    shared = found.shared
    assert shared is not None
    prepared = shared.get()
    if isinstance(prepared, str):
        with pytest.raises(ValueError, match="cannot be replayed"):
            found.holders("frame", at=n // 2)
        return
    rec = prepared.timelines[dev]
    for at in (0, n // 2, n - 1):
        state = rec.snapshot_at(at)["segments"]
        allocated = sum(
            b["size"] for s in state for b in s["blocks"] if b["state"] == "active_allocated"
        )
        for by in ("frame", "user_metadata", "pool"):
            assert sum(r.bytes for r in found.holders(by, at=at)) == allocated, (by, at)


def test_call_paths_agree_with_call_path(recorded_path):
    """`CallPaths` (each distinct frame keyed once) gives `call_path` of every stack of a real
    file, its blocks' and its trace entries', malformed frames included."""
    snap = load_snapshot(recorded_path)
    stacks = [fr for fr in snap.block_frames() if fr]
    for trace in snap.traces.values():
        stacks += [fr for fr in trace.frames() if fr]
    odd = {"filename": 7, "line": "x", "name": None}
    stacks.append([odd, {"filename": "/w/train.py", "line": 3, "name": "step"}, odd, "frame"])
    paths = CallPaths()
    assert [paths(fr) for fr in stacks] == [call_path(fr) for fr in stacks]


def test_to_dict_holders_are_each_devices_own_rows(recorded_path, monkeypatch):
    """`Findings.to_dict` gives each device its own holder rows, as `holders` does for that
    device; where the snapshot has one device, its rows are grouped once, not again for it."""
    import gpumemviz.analysis.findings as findings_module

    found = analyze(recorded_path, check=False)
    calls = []
    grouped = findings_module.holder_rows

    def counted(*a, **k):
        calls.append(k.get("device"))
        return grouped(*a, **k)

    monkeypatch.setattr(findings_module, "holder_rows", counted)
    out = found.to_dict()
    one = found.snapshot is not None and len(set(found.snapshot.segments.device.tolist())) == 1
    assert len(calls) == len(HOLDER_KEYS) * (1 if one else 1 + len(found.devices))
    monkeypatch.undo()
    for by in HOLDER_KEYS:
        assert out["holders"][by] == [r.to_dict() for r in found.holders(by)], by
        for dev, f in found.devices.items():
            got = out["devices"][str(dev)]["holders"][by]
            assert got == [r.to_dict() for r in f.holders(by)], (by, dev)
