"""Allocation stacks in the replayed history: `snapshot_at` blocks carry their frames."""

from __future__ import annotations

import pytest

from conftest import read_real, real_file, standin_file
from gpumemviz.allocator.replay import replay
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.analysis.diff import diff


def _traced(d) -> bool:
    return isinstance(d, dict) and any(len(t) > 0 for t in d.get("device_traces") or [])


def _blocks(segments, device: int) -> list[tuple]:
    """(address, size, state, frames) of every block of `device`, in address order.

    A free block has no stack: torch >= 2.1 writes none (no recorded file has one), while a
    torch 2.0 free block's `history` lists the allocations that were freed there, which are
    no live block's stack."""
    out = []
    for s in sorted(segments, key=lambda s: s["address"]):
        if int(s.get("device", 0)) != device:
            continue
        at = int(s["address"])
        for b in s["blocks"]:
            frames = b.get("frames") or (b.get("history") or [{}])[0].get("frames") or []
            if b["state"] == "inactive":
                assert "history" in b or frames == []  # what torch >= 2.1 writes
                frames = []
            out.append((int(b.get("address", at)), b["size"], b["state"], frames))
            at += b["size"]
    return out


def test_the_last_entry_has_the_files_stacks_and_diff_sees_no_site_change(recorded_dict):
    if not _traced(recorded_dict):
        pytest.skip("no trace")
    for dev, trace in enumerate(recorded_dict["device_traces"]):
        if not trace:
            continue
        tl = Recording.from_snapshot(recorded_dict, dev)
        last = tl.snapshot_at(len(tl) - 1)
        assert _blocks(last["segments"], dev) == _blocks(recorded_dict["segments"], dev)
        mine = {"segments": last["segments"]}
        theirs = {"segments": [s for s in recorded_dict["segments"] if s.get("device", 0) == dev]}
        d = diff(mine, theirs, top=None).device(dev)
        assert d.holders_grew == () and d.holders_shrank == ()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(lambda: standin_file("training_10k"), id="standin:training_10k"),
        pytest.param(lambda: standin_file("streams10"), id="standin:streams10"),
        pytest.param(
            lambda: real_file(
                "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
            ),
            id="Wedsonlin",
        ),
        pytest.param(  # CI-only
            lambda: real_file("cranberrii__ftcourse__memory_snapshot.pickle"), id="cranberrii"
        ),
    ],
)
def test_a_block_freed_before_the_end_carries_its_alloc_entrys_stack(path):
    raw = read_real(path())
    trace = raw["device_traces"][0]
    r = replay(raw)
    checked = 0
    for i in range(0, len(trace), 97):  # a spread of entries; each jump is one checkpoint walk
        e = trace[i]
        if e["action"] != "alloc" or not e.get("frames"):
            continue
        snap = r.snapshot_at(i)
        block = next(b for s in snap["segments"] for b in s["blocks"] if b["address"] == e["addr"])
        freed_later = any(
            t["action"] == "free_completed" and t["addr"] == e["addr"] for t in trace[i + 1 :]
        )
        if freed_later:
            assert block["state"] == "active_allocated"
            assert block["frames"] == e["frames"]
            checked += 1
    assert checked > 5
