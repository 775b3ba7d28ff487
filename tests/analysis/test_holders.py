"""sites.py: allocation sites by bytes, checked against the raw torch dicts of the real files."""

from __future__ import annotations

import pytest
from torch.cuda import _memory_viz as mv

from conftest import read_real, real_file, standin_file
from gpumemviz.analysis.frames import format_frame, user_frame
from gpumemviz.analysis.holders import NO_STACK, NO_USER_FRAME, live_holders, trace_holders
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
