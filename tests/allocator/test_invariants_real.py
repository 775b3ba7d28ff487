"""The invariants hold on every real snapshot, and catch breakage.

See docs/allocator.md, Invariants.
"""

from __future__ import annotations

import copy

from gpumemviz.allocator.invariants import check_invariants


def test_real_snapshots_satisfy_the_invariants(recorded_dict):
    assert check_invariants(recorded_dict) == []


def _first_split_segment(d):
    segs = d["segments"] if isinstance(d, dict) else d
    for i, s in enumerate(segs):
        if len(s["blocks"]) > 1:
            return i
    return None


def test_a_broken_real_snapshot_is_reported(recorded_dict):
    d = copy.deepcopy(recorded_dict)
    segs = d["segments"] if isinstance(d, dict) else d
    segs[0]["total_size"] += 512
    problems = check_invariants(d)
    assert any("segment 0" in p and "total_size" in p for p in problems)
    i = _first_split_segment(d)
    if i is not None:
        segs[i]["blocks"][1]["size"] += 256  # not a multiple of 512, sizes no longer add up
        problems = check_invariants(d)
        assert any(p.startswith(f"segment {i} (") and "block 1: size" in p for p in problems)


def test_time_going_backwards_is_reported(recorded_dict):
    if not isinstance(recorded_dict, dict):
        return
    for trace in recorded_dict.get("device_traces") or []:
        timed = [e for e in trace if "time_us" in e]
        if len(timed) >= 2:
            d = copy.deepcopy(recorded_dict)
            t = [e for e in d["device_traces"][recorded_dict["device_traces"].index(trace)]
                 if "time_us" in e]  # fmt: skip
            t[1]["time_us"] = t[0]["time_us"] - 1
            assert any("time_us" in p for p in check_invariants(d))
            return
