"""Replay results stay what they were before the million-entry work (issue 20, point 5):
every real recording replays to the same scores, figures and what-if answers as recorded in
tests/data/replay_golden.json (tests/replay_golden.py wrote it before the change)."""

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
