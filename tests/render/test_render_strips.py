"""The strip summary: its bins agree with the full map's totals, on real and model snapshots."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpumemviz.io import load_snapshot
from gpumemviz.render.rows import KIND_ALLOCATED, LEVELS, build_rows
from gpumemviz.render.strips import (
    SUMMED,
    device_bins,
    device_summary,
    snapshot_strip_set,
    snapshot_summaries,
    strip_set,
)

STANDIN = Path(__file__).parents[1] / "data" / "standin" / "standin__expandable_oom_3dev.pickle"


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


def test_a_strip_set_from_published_summaries_sums_them_and_keeps_their_keys() -> None:
    """Summaries made elsewhere (another process's, as JSON) draw as they are: each keeps
    every key, gains a label, and the totals add up."""
    sums = [json.loads(json.dumps(s)) for s in snapshot_summaries(load_snapshot(STANDIN))]
    out = strip_set(sums, labels=["rank 0", "rank 1", "rank 2"], selected=2, note="x")
    assert [s["label"] for s in out["strips"]] == ["rank 0", "rank 1", "rank 2"]
    assert all(set(a) == set(b) | {"label"} for a, b in zip(out["strips"], sums, strict=True))
    for key in SUMMED:
        assert out["totals"][key] == sum(s[key] for s in sums)
    assert out["totals"]["largest_free"] == max(s["largest_free"] for s in sums)
    assert out["selected"] == 2 and out["note"] == "x"
    assert len(json.dumps(out)) < 4096  # three strips travel in a few KiB
    with pytest.raises(ValueError, match="2 labels for 3 strips"):
        strip_set(sums, labels=["a", "b"])
    with pytest.raises(ValueError, match=r"selected strip 3 is outside 0\.\.2"):
        strip_set(sums, selected=3)


def test_a_snapshot_strip_set_has_one_strip_per_device_and_the_ooms_of_its_trace() -> None:
    snap = load_snapshot(STANDIN)
    out = snapshot_strip_set(snap, selected=1)
    assert [(s["device"], s["ooms"]) for s in out["strips"]] == [(0, 0), (1, 1), (2, 0)]
    assert out["selected"] == 1 and out["totals"]["ooms"] == 1
    for s in out["strips"]:  # the strip's figures are the full map's of that device
        assert s["reserved"] == int(build_rows(snap, s["device"]).total_size.sum())
    assert snapshot_strip_set(snap, selected=7)["selected"] is None
