"""Walking a trace backwards to its start, checked on every real trace.

See docs/allocator.md, Reconstructing the start.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from conftest import read_real, real_file, standin_file
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.replay.layout import Layout, LayoutError
from gpumemviz.allocator.replay.reconstruct import reconstruct
from gpumemviz.allocator.replay.recording import apply_step
from gpumemviz.allocator.replay.steps import Rules, steps_of
from gpumemviz.allocator.rules import K_SMALL_SIZE, MIB

DATA = Path(__file__).resolve().parents[1] / "data"


def _traced_devices(d: dict) -> list[int]:
    return [i for i, t in enumerate(d.get("device_traces") or []) if t]


def _final_view(segments: list[dict], device: int) -> list[tuple]:
    """The recorded final layout straight from the file's dicts (an independent oracle)."""
    out = []
    for s in segments:
        if s.get("device", 0) != device:
            continue
        at, blocks = s["address"], []
        for b in s["blocks"]:
            addr = b.get("address", at)
            req = b.get("requested_size", 0) if b["state"] != "inactive" else 0
            blocks.append((addr, b["size"], b["state"], req))
            at += b["size"]
        out.append(
            (s["address"], s["total_size"], s["stream"], s.get("is_expandable", False), blocks)
        )
    return sorted(out)


def _view(segments: list[dict]) -> list[tuple]:
    return sorted(
        (
            s["address"],
            s["total_size"],
            s["stream"],
            s["is_expandable"],
            [(b["address"], b["size"], b["state"], b["requested_size"]) for b in s["blocks"]],
        )
        for s in segments
    )


def _forward(start: list[dict], trace: list[dict], settings) -> list[dict]:
    lay = Layout.from_segments(start)
    steps = steps_of(trace)
    rules = Rules.from_settings(settings)
    for i in range(len(steps)):
        apply_step(lay, steps, i, rules)
    return lay.to_segments()


def test_backwards_then_forwards_gives_the_recorded_final_layout(recorded_dict):
    if isinstance(recorded_dict, list) or not _traced_devices(recorded_dict):
        pytest.skip("no trace in this file")
    settings = recorded_dict.get("allocator_settings")
    for dev in _traced_devices(recorded_dict):
        trace = recorded_dict["device_traces"][dev]
        start = reconstruct(recorded_dict["segments"], trace, device=dev, settings=settings)
        end = _forward(start, trace, settings)
        for s in end:
            s["device"] = dev
        assert _view(end) == _final_view(recorded_dict["segments"], dev), f"device {dev}"


def test_start_states_obey_the_allocator_invariants(recorded_dict):
    """No adjacent free blocks, 512-multiples, and no large block of <= 1 MiB.

    See docs/allocator.md, Invariants.
    """
    if isinstance(recorded_dict, list) or not _traced_devices(recorded_dict):
        pytest.skip("no trace in this file")
    for dev in _traced_devices(recorded_dict):
        start = reconstruct(
            recorded_dict["segments"],
            recorded_dict["device_traces"][dev],
            device=dev,
            settings=recorded_dict.get("allocator_settings"),
        )
        for s in start:
            sizes = [b["size"] for b in s["blocks"]]
            assert sum(sizes) == s["total_size"]
            assert all(x % 512 == 0 for x in sizes)
            states = [b["state"] for b in s["blocks"]]
            assert not any(a == b == "inactive" for a, b in itertools.pairwise(states))
            if s["segment_type"] == "large" and not s["is_expandable"]:
                assert min(sizes) > K_SMALL_SIZE, hex(s["address"])
            else:
                assert (
                    s["segment_type"] != "small" or s["is_expandable"] or s["total_size"] == 2 * MIB
                )


def _standin_cut_at_its_empty_cache() -> dict:
    """The 10k training stand-in as a ring buffer that dropped everything before its
    empty_cache: the trace starts with that burst of 19 segment_free (entries 2001-2019)."""
    d = read_real(standin_file("training_10k"))
    trace = d["device_traces"][0]
    at = next(i for i, e in enumerate(trace) if e["action"] == "segment_free")
    assert at == 2001 and trace[at - 1]["action"] != "segment_free"
    return {**d, "device_traces": [trace[at:]]}


@pytest.mark.parametrize(
    ("load", "burst"),
    [
        pytest.param(_standin_cut_at_its_empty_cache, 19, id="standin:training_10k"),
        pytest.param(  # CI-only: the real trace starts with 742 segment_free
            lambda: read_real(
                real_file("kkaitlyn111__cs336-a2-systems__memory_2.7b_forward.pickle")
            ),
            742,
            id="kkaitlyn111:2.7b_forward",
        ),
    ],
)
def test_leading_segment_free_burst_comes_back_as_free_segments(load, burst):
    d = load()
    trace = d["device_traces"][0]
    start = reconstruct(d["segments"], trace, settings=d.get("allocator_settings"))
    n_alloc = sum(e["action"] == "segment_alloc" for e in trace)
    n_free = sum(e["action"] == "segment_free" for e in trace)
    assert n_free == burst  # all of them leading the trace
    assert all(e["action"] == "segment_free" for e in trace[:burst])
    assert len(start) == len(d["segments"]) - n_alloc + n_free
    freed = {e["addr"] for e in trace[:burst]}
    by_addr = {s["address"]: s for s in start}
    assert all(by_addr[a]["blocks"][0]["state"] == "inactive" for a in freed)


def _load(name: str) -> dict:
    return json.loads((DATA / f"replay_{name}.json").read_text())


def test_tail_rule_restores_a_ghost_block_with_its_unsplit_remainder():
    d = _load("tail_rule")
    start = reconstruct(d["segments"], d["device_traces"][0], settings=d["allocator_settings"])
    blocks = [(b["size"], b["state"], b["requested_size"]) for b in start[0]["blocks"]]
    # the ghost asked for 5.5 MiB; its block was 6 MiB (0.5 MiB cannot be a large block)
    assert blocks == [
        (6 * MIB, "active_allocated", 5767168),
        (14 * MIB, "active_allocated", 14 * MIB),
    ]


def test_boundary_hint_ends_a_ghost_block_where_a_later_block_started():
    d = _load("boundary_hint")
    start = reconstruct(d["segments"], d["device_traces"][0], settings=d["allocator_settings"])
    blocks = [(b["size"], b["state"]) for b in start[0]["blocks"]]
    assert blocks == [(6 * MIB, "active_allocated"), (14 * MIB, "inactive")]


def test_without_the_hint_the_forward_replay_breaks():
    """The hint carries weight: a 5.5 MiB ghost makes the recorded alloc at +6 MiB impossible."""
    d = _load("boundary_hint")
    start = reconstruct(d["segments"], d["device_traces"][0], settings=d["allocator_settings"])
    start[0]["blocks"] = [
        {"address": start[0]["address"], "size": 5767168, "state": "active_allocated"},
        {"address": start[0]["address"] + 5767168, "size": 20 * MIB - 5767168, "state": "inactive"},
    ]
    with pytest.raises(LayoutError, match="no free block starts"):
        _forward(start, d["device_traces"][0], d["allocator_settings"])


def test_oversize_free_restores_the_whole_free_run():
    base = 0x7F0000000000
    seg = {
        "device": 0,
        "address": base,
        "total_size": 256 * MIB,
        "stream": 0,
        "segment_type": "large",
        "blocks": [{"address": base, "size": 256 * MIB, "state": "inactive"}],
    }
    trace = [{"action": "free_completed", "addr": base, "size": 200 * MIB}]
    settings = AllocatorConfig.parse("max_split_size_mb:128").to_settings()
    start = reconstruct([seg], trace, settings=settings)
    assert [b["size"] for b in start[0]["blocks"]] == [256 * MIB]
    assert [b["size"] for b in reconstruct([seg], trace)[0]["blocks"]] == [200 * MIB, 56 * MIB]


def test_a_free_outside_every_segment_names_the_entry():
    trace = [{"action": "free_completed", "addr": 0x1000, "size": 512, "stream": 0}]
    with pytest.raises(LayoutError, match=r"trace event 0 \(free_completed at 0x1000"):
        reconstruct([], trace)


def test_a_malformed_entry_is_a_clear_error():
    with pytest.raises(LayoutError, match="trace entry 1: malformed"):
        steps_of([{"action": "alloc", "addr": 0, "size": 1}, {"addr": 5}])


def test_every_reconstructed_and_scrubbed_state_passes_the_invariant_checker(recorded_dict):
    """The invariant checker, an independent oracle on our states.

    See docs/allocator.md, Invariants.
    """
    from gpumemviz.allocator.invariants import check_invariants
    from gpumemviz.allocator.replay.recording import Recording

    if isinstance(recorded_dict, list) or not _traced_devices(recorded_dict):
        pytest.skip("no trace in this file")
    settings = recorded_dict.get("allocator_settings")
    for dev in _traced_devices(recorded_dict):
        tl = Recording.from_snapshot(recorded_dict, dev)
        n = len(tl)
        for i in sorted({-1, 0, n // 4, n // 2, 3 * n // 4, n - 1}):
            snap = tl.snapshot_at(i)
            snap["device_traces"] = [[]]  # time_us is not the point here
            snap["allocator_settings"] = settings
            assert check_invariants(snap) == [], (dev, i)


def test_a_trace_that_does_not_end_on_the_final_layout_names_the_segment():
    from gpumemviz.allocator.replay.recording import Recording

    d = _load("two_streams")
    d["segments"][0]["stream"] += 1  # the file disagrees with its trace
    with pytest.raises(LayoutError, match=r"first difference at segment 0x"):
        Recording.from_snapshot(d)
