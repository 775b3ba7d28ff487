"""Replay results stay what they were before the million-entry work (issue 20, point 5):
every real recording replays to the same scores, figures and what-if answers as recorded in
tests/data/golden_replay_results.json (tests/replay_golden.py wrote it before the change)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import CI_ONLY_FILES, SHIPPED_FILES, read_real
from replay_golden import GOLDEN, results_of

_GOLDEN = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("path", [*SHIPPED_FILES, *CI_ONLY_FILES], ids=lambda p: p.name)
def test_replay_results_unchanged(path: Path) -> None:
    read_real(path)  # skips a CI-only file that is absent
    if path.name not in _GOLDEN:
        pytest.fail(f"{path.name} has no golden record: run tests/replay_golden.py")
    assert results_of(path) == _GOLDEN[path.name]


def test_every_real_trace_replays_at_the_recorded_addresses() -> None:
    """The golden record itself: 100 % of allocs at the recorded address, end to end."""
    for name, got in _GOLDEN.items():
        for dev, d in got.get("recorded", {}).items():
            assert d["allocs_matched"] == d["allocs"], (name, dev)
            assert d["final_matched"] is True, (name, dev)


def test_prepared_replays_share_one_reconstruction() -> None:
    """`prepare` once, then one what-if pass per settings: the same answers as `replay`, on
    one reconstruction and one recorded pass (what the advice check runs)."""
    from gpumemviz.allocator.replay import prepare, replay
    from gpumemviz.io import load_snapshot

    snap = load_snapshot(next(p for p in SHIPPED_FILES if "oom_snapshot" in p.name))
    prepared = prepare(snap)
    a = prepared.replay("expandable_segments:True")
    b = prepared.replay("max_split_size_mb:64", 8 << 30)
    assert a.timelines[0] is b.timelines[0] and a.recorded[0] is b.recorded[0]
    for got, want in ((a, replay(snap, "expandable_segments:True")),
                      (b, replay(snap, "max_split_size_mb:64", 8 << 30))):  # fmt: skip
        for dev, d in want.devices.items():
            assert got.devices[dev].peak_reserved == d.peak_reserved
            assert (got.devices[dev].reserved == d.reserved).all()
            assert got.devices[dev].oom == d.oom
