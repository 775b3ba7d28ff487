"""The strip summary: its bins agree with the full map's totals, on real and model snapshots."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpumemviz.io import load_snapshot
from gpumemviz.render.rows import KIND_ALLOCATED, LEVELS, build_rows
from gpumemviz.render.strips import device_bins, device_summary

STANDIN = Path(__file__).parent / "data" / "standin" / "standin__expandable_oom_3dev.pickle"


def _allocated_share(bins: list[int]) -> float:
    """Allocated fraction of the strip read back from the cell bytes (level / LEVELS per cell)."""
    levels = np.array(bins) & 0x3F
    return float(levels.sum()) / (LEVELS * len(bins))


@pytest.mark.parametrize("n_bins", [1, 7, 64, 1024])
def test_bins_follow_each_device_allocated_share(n_bins: int) -> None:
    snap = load_snapshot(STANDIN)
    for device in sorted({int(d) for d in snap.segments.device}):
        rows = build_rows(snap, device)
        bins = device_bins(rows, n_bins)
        assert len(bins) == n_bins
        t = rows.totals()
        share = t["allocated"] / t["reserved"]
        # each cell rounds its level to 1/63, so the mean is off by at most half a level
        assert abs(_allocated_share(bins) - share) <= 0.5 / LEVELS + 1e-9


def test_summary_is_small_json_with_header_figures() -> None:
    snap = load_snapshot(STANDIN)
    rows = build_rows(snap, 1)
    s = device_summary(rows, device=1, ooms=1)
    assert s["reserved"] == s["allocated"] + s["pending_free"] + s["free"]
    assert 0.0 <= float(s["fragmentation"]) <= 1.0  # type: ignore[arg-type]
    assert len(json.dumps(s)) < 1024


def test_empty_device_and_bad_bins() -> None:
    snap = load_snapshot(STANDIN)
    rows = build_rows(snap, 99)
    assert device_bins(rows, 8) == [0] * 8
    assert device_summary(rows, device=99)["reserved"] == 0
    with pytest.raises(ValueError, match="bins must be in"):
        device_bins(rows, 0)


def test_fully_allocated_cells_are_pure() -> None:
    from gpumemviz.snapshot import Snapshot

    seg = {
        "device": 0,
        "address": 0,
        "total_size": 2 << 20,
        "stream": 0,
        "segment_type": "large",
        "blocks": [{"size": 2 << 20, "requested_size": 2 << 20, "state": "active_allocated"}],
    }
    bins = device_bins(build_rows(Snapshot.from_torch([seg])), 16)
    assert bins == [LEVELS | (KIND_ALLOCATED << 6)] * 16
