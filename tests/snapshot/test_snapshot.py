"""The snapshot data model: exact torch round trips, columns, views, and what from_torch refuses."""

from __future__ import annotations

import copy
import dataclasses
import re

import numpy as np
import pytest
import torch.cuda._memory_viz as memory_viz

from conftest import read_real, real_file, standin_file
from gpumemviz.snapshot import (
    ACTIONS,
    ALLOCATED,
    INACTIVE,
    PENDING_FREE,
    STATE_NAMES,
    Snapshot,
    SnapshotError,
    Trace,
    validate,
)

MiB = 1 << 20
BASE = 0x7F0000000000
#: A torch 2.0 file (blocks carry `history`, no address): it ships.
LEGACY = "Yiyi-philosophy__LLM-inference__oom_snapshot.pickle"
#: Expandable segments on 3 devices with an `oom` entry: the real one is CI-only, the stand-in
#: is the same class in every clone.
EXPANDABLE_OOM = {
    "real": lambda: real_file(
        "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"
    ),
    "standin": lambda: standin_file("expandable_oom_3dev"),
}


def minimal() -> dict:
    """A minimal two-segment snapshot of the kind torch's _memory_viz tools accept, with a
    pending-free block."""
    frame = {"filename": "train.py", "line": 10, "name": "forward"}
    return {
        "segments": [
            {"device": 0, "address": BASE, "total_size": 20 * MiB, "allocated_size": 4 * MiB,
             "active_size": 4 * MiB, "requested_size": 4_000_000, "stream": 0,
             "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
             "frames": [],
             "blocks": [
                 {"address": BASE, "size": 4 * MiB, "requested_size": 4_000_000,
                  "state": "active_allocated", "frames": [frame]},
                 {"address": BASE + 4 * MiB, "size": 16 * MiB, "requested_size": 0,
                  "state": "inactive", "frames": []}]},
            {"device": 0, "address": BASE + 32 * MiB, "total_size": 2 * MiB,
             "allocated_size": 512, "active_size": 1024, "requested_size": 600, "stream": 0,
             "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
             "frames": [],
             "blocks": [
                 {"address": BASE + 32 * MiB, "size": 512, "requested_size": 100,
                  "state": "active_allocated", "frames": []},
                 {"address": BASE + 32 * MiB + 512, "size": 512, "requested_size": 500,
                  "state": "active_pending_free", "frames": []},
                 {"address": BASE + 32 * MiB + 1024, "size": 2 * MiB - 1024,
                  "requested_size": 0, "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": BASE, "size": 20 * MiB, "stream": 0,
             "time_us": 1, "frames": []},
            {"action": "alloc", "addr": BASE, "size": 4_000_000, "stream": 0, "time_us": 2,
             "frames": [frame]},
            {"action": "free_requested", "addr": BASE + 32 * MiB + 512, "size": 500,
             "stream": 0, "time_us": 6, "frames": []},
            {"action": "oom", "device_free": 123 * MiB, "size": 40 * MiB, "stream": 0,
             "time_us": 7, "frames": []}]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0,
                               "expandable_segments": False},
        "external_annotations": [],
    }  # fmt: skip


def synthetic(n_blocks: int, per_segment: int = 10) -> dict:
    """A consistent torch-2.11-shaped dict: two devices, two streams, every block state."""
    states = ("active_allocated", "inactive", "active_allocated", "active_pending_free")
    segments = []
    for s in range(n_blocks // per_segment):
        device, stream = s % 2, (s // 2) % 2 * 0x5A5A
        address = BASE + s * (per_segment + 2) * MiB
        blocks, active, allocated, requested = [], 0, 0, 0
        for j in range(per_segment):
            state = states[(s + j) % 4]
            size = MiB + 512 * (j % 3)
            req = size - 100 * (j % 5)
            frames = [] if state == "inactive" else [{"filename": "m.py", "line": j, "name": "f"}]
            blocks.append({"address": address + sum(b["size"] for b in blocks), "size": size,
                           "requested_size": req, "state": state, "frames": frames})  # fmt: skip
            if state != "inactive":
                active += size
                requested += req
            if state == "active_allocated":
                allocated += size
        segments.append({"device": device, "address": address,
                         "total_size": sum(b["size"] for b in blocks),
                         "allocated_size": allocated, "active_size": active,
                         "requested_size": requested, "stream": stream,
                         "segment_type": "large", "segment_pool_id": (0, int(s % 3 == 0)),
                         "is_expandable": s % 5 == 0, "frames": [], "blocks": blocks})  # fmt: skip
    segments.sort(key=lambda seg: (seg["device"], seg["address"]))
    return {"segments": segments, "device_traces": [[], []]}


# -- real files ---------------------------------------------------------------------------------


def test_real_file_round_trips_exactly(recorded_dict):
    snap = Snapshot.from_torch(recorded_dict)
    out = snap.to_torch()
    assert out == recorded_dict
    assert list(out) == list(recorded_dict)
    for seg_out, seg_in in zip(out["segments"], recorded_dict["segments"], strict=True):
        assert set(seg_out) == set(seg_in)
        if "segment_pool_id" in seg_in:
            assert type(seg_out["segment_pool_id"]) is tuple
        assert seg_out.get("frames") is seg_in.get("frames")  # referenced, not copied
        for b_out, b_in in zip(seg_out["blocks"], seg_in["blocks"], strict=True):
            assert b_out.get("frames") is b_in.get("frames")
    validate(snap)


def test_real_file_columns_match_the_dict(recorded_dict):
    snap = Snapshot.from_torch(recorded_dict)
    segs = recorded_dict["segments"]
    blocks = [b for s in segs for b in s["blocks"]]
    assert snap.n_segments == len(segs) and snap.n_blocks == len(blocks)
    assert snap.segments.total_size.tolist() == [s["total_size"] for s in segs]
    assert snap.segments.device.tolist() == [s["device"] for s in segs]
    assert snap.segments.is_small.tolist() == [s["segment_type"] == "small" for s in segs]
    assert snap.blocks.size.tolist() == [b["size"] for b in blocks]
    assert [STATE_NAMES[c] for c in snap.blocks.state.tolist()] == [b["state"] for b in blocks]
    assert snap.segments.block_count.tolist() == [len(s["blocks"]) for s in segs]
    # every block's address: from the file, or (torch 2.0) segment address + prefix sum
    expected = []
    for s in segs:
        offset = 0
        for b in s["blocks"]:
            expected.append(b.get("address", s["address"] + offset))
            offset += b["size"]
    assert snap.blocks.address.tolist() == expected
    for d, entries in enumerate(recorded_dict["device_traces"]):
        trace = snap.traces[d]
        assert len(trace) == len(entries)
        names = [trace.action_names[c] for c in trace.action.tolist()]
        assert names == [e["action"] for e in entries]
        assert trace.time_us.tolist() == [e.get("time_us", -1) for e in entries]
    assert snap.devices == tuple(sorted({s["device"] for s in segs}))


def test_real_file_passes_torch_segsum(recorded_dict):
    out = Snapshot.from_torch(recorded_dict).to_torch()
    assert "total_reserved" in memory_viz.segsum(out)


def test_torch_2_0_legacy_file_is_accepted_by_memory_viz():
    d = read_real(real_file(LEGACY))
    snap = Snapshot.from_torch(d)
    out = snap.to_torch()
    assert out == d  # legacy layout kept: blocks keep `history`, gain no address
    assert "history" in out["segments"][0]["blocks"][0]
    memory_viz.segsum(out)
    assert "snapshot" in memory_viz.trace(out)
    # the view gives a legacy block its frames from history[0]
    first = snap.block(0)
    assert first.frames == tuple(d["segments"][0]["blocks"][0]["history"][0]["frames"])
    assert first.address == d["segments"][0]["address"]


@pytest.mark.parametrize("which", sorted(EXPANDABLE_OOM))
def test_oom_entry_and_expandable_segments(which):
    d = read_real(EXPANDABLE_OOM[which]())
    snap = Snapshot.from_torch(d)
    assert snap.segments.is_expandable.all()
    assert snap.devices == (0, 1, 2)
    assert len(snap.traces) == 4 and len(snap.traces[3]) == 0
    hits = [(dev, i) for dev, t in snap.traces.items() for i in np.flatnonzero(
        t.action == ACTIONS.index("oom")).tolist()]  # fmt: skip
    assert len(hits) == 1
    assert hits == [  # the raw dict's own `oom` entry, found without gpumemviz
        (dv, k) for dv, es in enumerate(d["device_traces"]) for k, e in enumerate(es)
        if e["action"] == "oom"
    ]  # fmt: skip
    dev, i = hits[0]
    entry = snap.traces[dev].entry(i)
    assert "addr" not in entry and entry == d["device_traces"][dev][i]
    assert snap.traces[dev].device_free[i] == entry["device_free"]
    assert snap.traces[dev].addr[i] == -1


def test_bare_segment_list_gains_device_traces(recorded_dict):
    segs = recorded_dict["segments"]
    out = Snapshot.from_torch(segs).to_torch()
    n_dev = max(s["device"] for s in segs) + 1
    assert out == {"segments": segs, "device_traces": [[] for _ in range(n_dev)]}
    memory_viz.segsum(out)


def test_bare_list_on_device_1_is_accepted_by_memory_viz_trace():
    seg = minimal()["segments"][1]
    seg["device"] = 1
    out = Snapshot.from_torch([seg]).to_torch()
    assert out["device_traces"] == [[], []]
    memory_viz.trace(out)  # torch's own reader fails on a bare list (KeyError: device_traces)


# -- generations and unknowns ---------------------------------------------------------------------


def test_pending_free_block_and_oom_entry():
    d = minimal()
    snap = Snapshot.from_torch(d)
    assert snap.blocks.state.tolist() == [ALLOCATED, INACTIVE, ALLOCATED, PENDING_FREE, INACTIVE]
    assert snap.segments.active_size.tolist() == [4 * MiB, 1024]
    assert snap.to_torch() == d
    validate(snap)
    assert "total_reserved" in memory_viz.segsum(snap.to_torch())
    assert "OutOfMemoryError" in memory_viz.trace(snap.to_torch())


def test_unknown_keys_and_actions_are_kept():
    d = minimal()
    d["future_top"] = {"x": 1}
    d["segments"][0]["registration_counter"] = 7
    d["segments"][1]["blocks"][2]["stream_uses"] = [3, 4]
    d["device_traces"][0].insert(1, {"action": "user_defined", "addr": 0, "size": 0,
                                     "stream": 0, "pool_id": (1, 2), "name": "step"})  # fmt: skip
    snap = Snapshot.from_torch(d)
    assert snap.to_torch() == d
    trace = snap.traces[0]
    assert trace.action_names[: len(ACTIONS)] == ACTIONS
    assert trace.action_names[trace.action[1]] == "user_defined"
    assert trace.entry(1) == d["device_traces"][0][1]
    assert trace.entry(-1) == d["device_traces"][0][-1]


def test_torch_1x_blocks_without_requested_size():
    seg = {"device": 0, "address": BASE, "total_size": 2 * MiB, "allocated_size": 512,
           "active_size": 512, "stream": 0, "segment_type": "small",
           "blocks": [{"size": 512, "state": "active_allocated"},
                      {"size": 2 * MiB - 512, "state": "inactive"}]}  # fmt: skip
    snap = Snapshot.from_torch([seg])
    assert snap.blocks.requested_size.tolist() == [512, 2 * MiB - 512]
    assert snap.blocks.address.tolist() == [BASE, BASE + 512]
    assert snap.segments.requested_size.tolist() == [512]  # derived from the active block
    assert snap.to_torch()["segments"] == [seg]


def test_blocks_with_and_without_address_in_one_file():
    d = minimal()
    del d["segments"][1]["blocks"][1]["address"]
    snap = Snapshot.from_torch(d)
    assert snap.blocks.address.tolist()[2:] == [BASE + 32 * MiB + k for k in (0, 512, 1024)]
    assert snap.to_torch() == d
    validate(snap)


def test_json_style_lists_become_tuples():
    d = minimal()
    for seg in d["segments"]:
        seg["segment_pool_id"] = list(seg["segment_pool_id"])
    out = Snapshot.from_torch(d).to_torch()
    assert out == minimal()
    assert all(type(s["segment_pool_id"]) is tuple for s in out["segments"])


def test_synthetic_100k_blocks_round_trip():
    d = synthetic(100_000)
    snap = Snapshot.from_torch(d)
    assert snap.n_blocks == 100_000 and snap.devices == (0, 1)
    validate(snap)
    assert snap.to_torch() == d
    assert snap.segments.allocated_size.sum() == sum(s["allocated_size"] for s in d["segments"])


# -- views and immutability -----------------------------------------------------------------------


def test_views():
    snap = Snapshot.from_torch(minimal())
    seg = snap.segment(1)
    assert (seg.index, seg.address, seg.segment_type, seg.pool_id) == (1, BASE + 32 * MiB,
                                                                       "small", (0, 0))  # fmt: skip
    assert seg.end == BASE + 34 * MiB and not seg.is_expandable
    assert [b.state for b in seg.blocks] == ["active_allocated", "active_pending_free", "inactive"]
    assert [b.index for b in seg.blocks] == [2, 3, 4]
    assert seg.blocks[1].address == BASE + 32 * MiB + 512 and seg.blocks[1].segment == 1
    b0 = snap.block(0)
    assert b0.frames == ({"filename": "train.py", "line": 10, "name": "forward"},)
    assert snap.segment(-1) == seg and snap.block(-5) == b0
    with pytest.raises(IndexError, match=r"^segment 2 out of range \(2 segments\)$"):
        snap.segment(2)
    with pytest.raises(IndexError, match=r"^segment -3 out of range \(2 segments\)$"):
        snap.segment(-3)
    with pytest.raises(IndexError, match=r"^block 5 out of range \(5 blocks\)$"):
        snap.block(5)
    trace = snap.traces[0]
    assert trace.entry(-len(trace)) == trace.entry(0)
    with pytest.raises(
        IndexError, match=rf"^trace entry {len(trace)} out of range \({len(trace)} entries\)$"
    ):
        trace.entry(len(trace))
    with pytest.raises(dataclasses.FrozenInstanceError):
        seg.size = 1  # type: ignore[misc]
    assert "segments=2" in repr(snap) and "blocks=5" in repr(snap)
    assert snap.where(1) == f"segment 1 (device 0, {BASE + 32 * MiB:#x})"


def test_columns_are_read_only():
    snap = Snapshot.from_torch(minimal())
    with pytest.raises(ValueError, match="read-only"):
        snap.blocks.size[0] = 1
    with pytest.raises(ValueError, match="read-only"):
        snap.segments.total_size[0] = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.blocks = None  # type: ignore[misc]


def test_to_torch_rows_are_fresh_dicts():
    d = minimal()
    snap = Snapshot.from_torch(d)
    first = snap.to_torch()
    first["segments"][0]["total_size"] = 0
    first["segments"][0]["blocks"][0]["size"] = 0
    assert snap.to_torch() == d


# -- from_columns --------------------------------------------------------------------------------


def test_from_columns_matches_from_torch():
    d = minimal()
    del d["device_traces"][0][3]  # from_columns traces below carry no oom entry
    snap = Snapshot.from_torch(d)
    trace_in = d["device_traces"][0]
    built = Snapshot.from_columns(
        device=[0, 0],
        address=[BASE, BASE + 32 * MiB],
        total_size=[20 * MiB, 2 * MiB],
        stream=[0, 0],
        is_small=[False, True],
        block_count=[2, 3],
        size=snap.blocks.size,
        requested_size=snap.blocks.requested_size,
        state=snap.blocks.state,
        block_frames=[b["frames"] for s in d["segments"] for b in s["blocks"]],
        traces={0: Trace.from_columns(
            action=[ACTIONS.index(e["action"]) for e in trace_in],
            addr=[e["addr"] for e in trace_in], size=[e["size"] for e in trace_in],
            stream=[0] * len(trace_in), time_us=[e["time_us"] for e in trace_in],
            frames=[e["frames"] for e in trace_in])},
        allocator_settings=d["allocator_settings"],
        external_annotations=[],
    )  # fmt: skip
    assert built.to_torch() == d
    validate(built)
    for name in ("allocated_size", "active_size", "requested_size", "block_start"):
        assert getattr(built.segments, name).tolist() == getattr(snap.segments, name).tolist()
    assert built.blocks.address.tolist() == snap.blocks.address.tolist()


def test_from_columns_defaults_and_checks():
    snap = Snapshot.from_columns(
        device=[1], address=[BASE], total_size=[2 * MiB], stream=[0], is_small=[True],
        block_count=[1], size=[2 * MiB], requested_size=[0], state=[INACTIVE],
    )  # fmt: skip
    out = snap.to_torch()
    assert out["device_traces"] == [[], []]
    assert set(out) == {"segments", "device_traces"}
    assert out["segments"][0]["segment_pool_id"] == (0, 0)
    assert out["segments"][0]["blocks"][0]["frames"] == []
    assert out["segments"][0]["frames"] is not out["segments"][0]["blocks"][0]["frames"]
    with pytest.raises(SnapshotError, match="block_count sums to 2, but there are 1 blocks"):
        Snapshot.from_columns(
            device=[0], address=[0], total_size=[512], stream=[0], is_small=[True],
            block_count=[2], size=[512], requested_size=[0], state=[INACTIVE],
        )  # fmt: skip
    with pytest.raises(SnapshotError, match="unknown state code 3"):
        Snapshot.from_columns(
            device=[0], address=[0], total_size=[512], stream=[0], is_small=[True],
            block_count=[1], size=[512], requested_size=[0], state=[3],
        )  # fmt: skip
    with pytest.raises(SnapshotError, match=r"stream has shape \(2,\), expected \(1,\)"):
        Snapshot.from_columns(
            device=[0], address=[0], total_size=[512], stream=[0, 0], is_small=[True],
            block_count=[1], size=[512], requested_size=[0], state=[0],
        )  # fmt: skip


def test_trace_from_columns_writes_oom_with_device_free():
    trace = Trace.from_columns(
        action=[ACTIONS.index("alloc"), ACTIONS.index("oom")], addr=[BASE, 0],
        size=[512, 40 * MiB], stream=[0, 0], device_free=[-1, 5 * MiB],
    )  # fmt: skip
    assert trace.entries() == [
        {"action": "alloc", "addr": BASE, "size": 512, "stream": 0},
        {"action": "oom", "device_free": 5 * MiB, "size": 40 * MiB, "stream": 0},
    ]
    with pytest.raises(SnapshotError, match="action code 9"):
        Trace.from_columns(action=[9], addr=[0], size=[0], stream=[0])


# -- what from_torch refuses, and validate ---------------------------------------------------------


def _bad(mutate) -> dict:
    d = copy.deepcopy(synthetic(80, per_segment=10))
    mutate(d)
    return d


def _seg3() -> str:
    """How messages name segment 3 of `synthetic(80)`, as a regex."""
    s = synthetic(80, per_segment=10)["segments"][3]
    return re.escape(f"segment 3 (device {s['device']}, {s['address']:#x})")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("segments"), "not a snapshot: a dict without 'segments'"),
        (lambda d: d.update(segments={}), "'segments' is a dict, not a list"),
        (lambda d: d["segments"].__setitem__(3, [1]), "segment 3 is a list, not a dict"),
        (lambda d: d["segments"][3].pop("blocks"), "{seg3} has no blocks"),
        (lambda d: d["segments"][3]["blocks"][7].pop("size"), "{seg3}: block 7 has no size"),
        (lambda d: d["segments"][3]["blocks"][7].pop("state"), "{seg3}: block 7 has no state"),
        (lambda d: d["segments"][3]["blocks"].__setitem__(7, 5), "{seg3}: block 7 is an int"),
        (
            lambda d: d["segments"][3]["blocks"][7].update(state="active_awaiting_free"),
            "{seg3}: block 7 has unknown state 'active_awaiting_free'",
        ),
        (
            lambda d: d["segments"][3]["blocks"][7].update(state=["inactive"]),
            r"{seg3}: block 7 has unknown state \['inactive'\]",
        ),
        (
            lambda d: d["segments"][3]["blocks"][7].update(size="1MiB"),
            "{seg3}: block 7: size is '1MiB', not a 64-bit integer",
        ),
        (
            lambda d: d["segments"][3]["blocks"][7].update(size=1.5),
            "{seg3}: block 7: size is 1.5, not a 64-bit integer",
        ),
        (
            lambda d: d["segments"][3].update(segment_type="huge"),
            "{seg3}: unknown segment_type 'huge'",
        ),
        (
            lambda d: d["segments"][3].update(segment_pool_id=(1, 2, 3)),
            r"{seg3}: segment_pool_id \(1, 2, 3\) is not a pair of 64-bit ints",
        ),
        (lambda d: d.update(device_traces={}), "'device_traces' is a dict, not a list"),
        (
            lambda d: d["device_traces"][1].append({"addr": 0}),
            r"device_traces\[1\], entry 0 has no action",
        ),
    ],
)
def test_from_torch_names_what_and_where(mutate, message):
    with pytest.raises(SnapshotError, match="^" + message.format(seg3=_seg3())):
        Snapshot.from_torch(_bad(mutate))


def test_from_torch_refuses_non_snapshots():
    with pytest.raises(SnapshotError, match="not a snapshot: a str"):
        Snapshot.from_torch("run.pickle")  # type: ignore[arg-type]


def _shift(d: dict) -> None:
    d["segments"][3]["blocks"][7]["address"] += 512


def _overlap(d: dict) -> None:
    """Move segment 3 (and its blocks) to start 1 MiB into segment 2, on the same device."""
    two, three = d["segments"][2], d["segments"][3]
    assert two["device"] == three["device"]
    delta = three["address"] - (two["address"] + MiB)
    three["address"] -= delta
    for b in three["blocks"]:
        b["address"] -= delta


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["segments"][3].update(total_size=d["segments"][3]["total_size"] + 512),
            "{seg3}: blocks sum to {total} bytes but total_size is {total_plus}",
        ),
        (_shift, "{seg3}: block 7 is at .* \\(blocks must be contiguous\\)"),
        (
            lambda d: d["segments"][3].update(allocated_size=0),
            "{seg3}: allocated_size is 0 but its blocks give",
        ),
        (
            lambda d: d["segments"][3].update(requested_size=1),
            "{seg3}: requested_size is 1 but its blocks give",
        ),
        (
            lambda d: d["segments"][3]["blocks"][7].update(size=-512),
            "{seg3}: block 7 has size -512",
        ),
        (_overlap, r"segment 3 \(device 0, 0x[0-9a-f]+\) overlaps segment 2 \(device 0"),
    ],
)
def test_validate_names_what_and_where(mutate, message):
    total = synthetic(80, per_segment=10)["segments"][3]["total_size"]
    snap = Snapshot.from_torch(_bad(mutate))
    pattern = message.format(seg3=_seg3(), total=total, total_plus=total + 512)
    with pytest.raises(SnapshotError, match="^" + pattern):
        validate(snap)


_VOCAB = frozenset(STATE_NAMES) | frozenset(ACTIONS) | {"small", "large"}


def _mark(obj, memo=None):
    """Every string outside the fixed vocabulary gets a '!': a stand-in for redaction."""
    memo = {} if memo is None else memo
    if type(obj) is str:
        return obj if obj in _VOCAB else obj + "!"
    if type(obj) not in (dict, list, tuple):
        return obj
    if id(obj) not in memo:
        if type(obj) is dict:
            memo[id(obj)] = {k: _mark(v, memo) for k, v in obj.items()}
        else:
            memo[id(obj)] = type(obj)(_mark(v, memo) for v in obj)
    return memo[id(obj)]


def test_map_objects_reaches_every_string_and_keeps_the_columns(recorded_dict):
    snap = Snapshot.from_torch(recorded_dict)
    assert snap.map_objects(lambda p: p).to_torch() == snap.to_torch()
    marked = snap.map_objects(_mark)
    assert marked.to_torch() == _mark(snap.to_torch())
    assert marked.blocks.size is snap.blocks.size  # columns shared, not copied
    assert snap.to_torch() == Snapshot.from_torch(recorded_dict).to_torch()  # source untouched


def test_map_objects_on_unknown_keys_and_actions():
    d = minimal()
    d["future_top"] = {"path": "/x"}
    d["segments"][1]["blocks"][2]["note"] = "n"
    d["device_traces"][0].append({"action": "user_defined", "addr": 0, "size": 0, "stream": 0,
                                  "user_metadata": "m", "compile_context": "c"})  # fmt: skip
    snap = Snapshot.from_torch(d)
    assert snap.map_objects(_mark).to_torch() == _mark(d)


def test_block_frames_and_trace_frames():
    d = minimal()
    snap = Snapshot.from_torch(d)
    blocks = [b for s in d["segments"] for b in s["blocks"]]
    frames = snap.block_frames()
    assert frames == [b.get("frames", []) for b in blocks]
    assert all(f is b["frames"] for f, b in zip(frames, blocks, strict=True) if "frames" in b)
    entries = d["device_traces"][0]
    assert snap.traces[0].frames() == [e.get("frames", []) for e in entries]
    raw = read_real(real_file(LEGACY))
    legacy = Snapshot.from_torch(raw)
    want = [memory_viz._block_extra(b)[0] for s in raw["segments"] for b in s["blocks"]]
    assert legacy.block_frames() == want and any(want)
