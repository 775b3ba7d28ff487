"""Each rule of check_invariants, on a small hand-made snapshot broken one way at a time."""

from __future__ import annotations

import copy

import pytest

from gpumemviz.allocator.invariants import check_invariants
from gpumemviz.allocator.rules import MIB

BASE = 0x7F0000000000


def _good() -> dict:
    large = {
        "device": 0, "address": BASE, "total_size": 20 * MIB, "allocated_size": 4_000_256,
        "active_size": 4_000_256 + MIB, "requested_size": 0, "stream": 0,
        "segment_type": "large", "is_expandable": False, "frames": [],
        "blocks": [
            {"address": BASE, "size": 4_000_256, "requested_size": 4_000_000,
             "state": "active_allocated", "frames": []},
            {"address": BASE + 4_000_256, "size": MIB, "requested_size": 5,
             "state": "active_pending_free", "frames": []},
            {"address": BASE + 4_000_256 + MIB, "size": 20 * MIB - 4_000_256 - MIB,
             "requested_size": 77, "state": "inactive", "frames": []},
        ],
    }  # fmt: skip
    small = {
        "device": 0, "address": BASE + 32 * MIB, "total_size": 2 * MIB, "allocated_size": 512,
        "active_size": 512, "stream": 0, "segment_type": "small", "is_expandable": False,
        "blocks": [
            {"address": BASE + 32 * MIB, "size": 512, "requested_size": 100,
             "state": "active_allocated", "frames": []},
            {"address": BASE + 32 * MIB + 512, "size": 2 * MIB - 512, "requested_size": 0,
             "state": "inactive", "frames": []},
        ],
    }  # fmt: skip
    trace = [
        {"action": "alloc", "addr": BASE, "size": 1, "stream": 0, "time_us": t}
        for t in (1, 2, 2, 5)
    ]
    return {"segments": [large, small], "device_traces": [trace]}


def test_a_sound_snapshot_has_no_problems():
    assert check_invariants(_good()) == []
    assert check_invariants(_good()["segments"]) == []  # a bare segment list works too
    # a 1-byte request in a 512-byte block is round_size exactly
    assert _broken(lambda d: d["segments"][1]["blocks"][0].update(requested_size=1)) == []


def _broken(edit) -> list[str]:
    d = copy.deepcopy(_good())
    edit(d)
    return check_invariants(d)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["segments"][0].update(total_size=22 * MIB), "blocks add up to"),  # 1
        (lambda d: d["segments"][0].update(allocated_size=1), "allocated blocks add up"),  # 1
        (lambda d: d["segments"][0].update(active_size=1), "active blocks add up"),  # 1
        (lambda d: d["segments"][1]["blocks"][1].update(address=BASE), "expected"),  # 2
        (lambda d: d["segments"][1]["blocks"][0].update(size=600), "not a multiple of 512"),  # 3
        (lambda d: _resize(d, 1, 4 * MIB), "is not 2 MiB (small pool)"),  # 4
        (lambda d: _resize(d, 0, 15 * MIB), "20 MiB or a multiple of 2 MiB"),  # 4
        (lambda d: d["segments"][0]["blocks"][1].update(state="inactive"), "two adjacent"),  # 6
        (lambda d: d["segments"][0]["blocks"][0].update(requested_size=2_000_000), "leftover"),  # 7
        (lambda d: d["segments"][1]["blocks"][1].update(frames=[{"name": "f"}]), "frames"),  # 8
        (lambda d: d["device_traces"][0][3].update(time_us=0), "time_us 0 is before 2"),  # 9
    ],
)
def test_each_rule_reports_its_problem(edit, expected):
    problems = _broken(edit)
    assert any(expected in p for p in problems), problems


def _resize(d: dict, seg: int, total: int) -> None:
    s = d["segments"][seg]
    grow = total - s["total_size"]
    s["total_size"] = total
    s["blocks"][-1]["size"] += grow


def test_expandable_runs_are_whole_pages_and_settings_are_used():
    d = _good()
    seg = d["segments"][0]
    seg["is_expandable"] = True
    assert check_invariants(d) == []  # 20 MiB: one large page
    _resize(d, 0, 22 * MIB)
    assert any("page" in p for p in check_invariants(d))
    d["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "large_segment_size_mb:22"}
    assert check_invariants(d) == []


def test_oversize_blocks_may_waste_up_to_max_non_split_rounding():
    d = _good()
    seg = d["segments"][0]
    seg.update(total_size=64 * MIB, allocated_size=64 * MIB, active_size=64 * MIB)
    seg["blocks"] = [{"address": BASE, "size": 64 * MIB, "requested_size": 45 * MIB,
                      "state": "active_allocated", "frames": []}]  # fmt: skip
    assert any("leftover" in p for p in check_invariants(d))  # no max_split_size: too much
    d["allocator_settings"] = {"max_split_size": 32 * MIB, "PYTORCH_CUDA_ALLOC_CONF": ""}
    assert check_invariants(d) == []


def test_unreadable_input_is_one_problem_not_a_crash():
    d = _good()
    del d["segments"][0]["blocks"][1]["state"]
    assert check_invariants(d) == ["not a snapshot this checker can read: KeyError 'state'"]
