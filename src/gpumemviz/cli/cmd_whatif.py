"""`gpumemviz whatif`: a recorded trace replayed under other allocator settings or capacity."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gpumemviz.cli.common import NOT_RECORDED, UsageError, input_name, snapshot_input
from gpumemviz.cli.output import quoted, say, say_json
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.units import format_size, parse_size

if TYPE_CHECKING:
    import numpy as np

    from gpumemviz.allocator.replay import ReplayResult
    from gpumemviz.cli.common import Subparsers
    from gpumemviz.snapshot.schema import JsonDict

__all__ = ["add_whatif", "run_whatif"]


def add_whatif(sub: Subparsers) -> None:
    p = sub.add_parser(
        "whatif",
        help="replay a recorded trace under other allocator settings or another capacity",
        description="Replay a snapshot's recorded history through the allocator model with "
        "other PYTORCH_CUDA_ALLOC_CONF settings (and/or another capacity) and show the "
        "recorded and predicted segments, peak reserved and OOM side by side.",
    )
    p.add_argument(
        "file", type=Path, help="snapshot file recorded with history (trace; - for standard input)"
    )
    p.add_argument(
        "--conf",
        default=None,
        help="PYTORCH_CUDA_ALLOC_CONF to try, e.g. expandable_segments:True "
        "(default: the recorded settings)",
    )
    p.add_argument(
        "--capacity",
        default=None,
        help="bytes the process can get per device, e.g. 80GiB (default: inferred from a "
        "recorded OOM, else unknown)",
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(run=run_whatif)


def run_whatif(args: argparse.Namespace) -> int:
    """`allocator.replay.replay(FILE, --conf, --capacity)`; without --conf the recorded settings.

    Per traced device, recorded vs predicted peak reserved, peak segments, final segments (at
    the OOM where the run stops there) and the OOM. ``--json`` prints ``{"config",
    "recorded_config", "what_if", "capacity_known", "devices": {"0": {"events", "capacity"
    (None when unknown), "capacity_known", "what_if", "recorded": {...}, "predicted":
    {...}, "pools": [...]}}}``; the text says "capacity unknown" when it is. ``pools`` (a
    trace with private pools; else empty) gives per pool ``{"pool": [a, b], "recorded":
    {"peak_reserved"}, "predicted": {"peak_reserved", "final_reserved"}}``, ``[0, 0]``
    being the default pools: each allocation is replayed in the pool it was recorded in.
    """
    from gpumemviz.allocator.config import AllocatorConfig
    from gpumemviz.allocator.replay import replay
    from gpumemviz.io import load_snapshot

    if args.capacity is not None and args.capacity.strip().startswith("-"):
        raise UsageError(f"--capacity must be positive, got {short_repr(args.capacity)}")
    capacity = parse_size(args.capacity) if args.capacity is not None else None
    if capacity is not None and capacity <= 0:
        raise UsageError(f"--capacity must be positive, got {short_repr(args.capacity)}")
    conf = None
    if args.conf is not None:
        try:
            conf = AllocatorConfig.parse(args.conf)
        except ValueError as e:
            raise UsageError(f"--conf {short_repr(args.conf)}: {e}") from None
    snap = load_snapshot(snapshot_input(args.file))
    recorded = snap.allocator_settings is not None
    result = replay(snap, config=conf, capacity=capacity)  # reads the trace's columns
    rows = {dev: _whatif_device(result, dev) for dev in sorted(result.devices)}
    if args.json:
        out = {
            "config": result.config,
            "recorded_config": result.recorded_config,
            "what_if": result.what_if,
            "capacity_known": result.capacity_known,
            "devices": {str(d): r for d, r in rows.items()},
        }
        say_json(out)
    else:
        say("\n".join(_whatif_text(result, rows, input_name(args.file), recorded)))
    return 0


def _whatif_device(result: ReplayResult, dev: int) -> JsonDict:
    """Recorded vs predicted figures of one traced device (JSON-ready)."""
    run, tl = result.devices[dev], result.timelines[dev]
    start = tl.start.totals()[2]
    recorded_oom = tl.first_oom  # (the recorded pass is not driven for it)
    return {
        "events": len(tl),
        "capacity": run.capacity,
        "capacity_known": bool(run.capacity_known),
        "what_if": bool(run.what_if),
        "recorded": _run_figures(
            result.recorded_peak_reserved(dev),
            result.peak_segments(dev, "recording"),
            tl.segments,
            start,
            recorded_oom,
        ),
        "predicted": _run_figures(
            int(run.peak_reserved), result.peak_segments(dev), run.segments, start, run.oom
        ),
        "pools": _pool_rows(result, dev),
    }


def _pool_rows(result: ReplayResult, dev: int) -> list[JsonDict]:
    """Per pool, recorded and predicted peak reserved (empty without private pools)."""
    run, tl = result.devices[dev], result.timelines[dev]
    if tl.pools is None:
        return []
    recorded = tl.pools.recorded_peaks(tl.start, tl.steps)
    pids = sorted(set(recorded) | set(run.pool_peak_reserved))
    return [
        {
            "pool": list(pid),
            "recorded": {"peak_reserved": recorded.get(pid, 0)},
            "predicted": {
                "peak_reserved": run.pool_peak_reserved.get(pid, 0),
                "final_reserved": run.pool_final_reserved.get(pid, 0),
            },
        }
        for pid in pids
    ]


def _run_figures(
    peak_reserved: int, peak_segments: int, segments: np.ndarray, start: int, oom_at: int | None
) -> JsonDict:
    """One side of the comparison; `segments` is the count after each entry, `start` before."""
    return {
        "peak_reserved": peak_reserved,
        "peak_segments": peak_segments,
        "final_segments": int(segments[-1]) if len(segments) else start,
        "oom": oom_at is not None,
        "oom_at": oom_at,
    }


def _whatif_text(
    result: ReplayResult, rows: dict[int, JsonDict], name: str, recorded: bool
) -> list[str]:
    def conf(s: str) -> str:
        return f"PYTORCH_CUDA_ALLOC_CONF={quoted(s)}" if s else "the default settings"

    was = conf(result.recorded_config) if recorded else NOT_RECORDED
    lines = [f"{name}: what if {conf(result.config)} (recorded: {was})"]
    if not result.what_if:
        lines.append("  same settings and capacity as recorded: predicted = the model's replay")
    for dev, r in rows.items():
        cap = (
            format_size(r["capacity"])
            if r["capacity_known"] and r["capacity"] is not None
            else "capacity unknown (the model never runs out of memory)"
        )
        if r["capacity_known"]:
            cap = f"capacity {cap}"
        lines.append(f"device {dev}, {r['events']} trace entries, {cap}:")
        lines.append(f"  {'':<16}{'recorded':>18}{'predicted':>18}")
        rec, pre = r["recorded"], r["predicted"]
        for label, key, fmt in (
            ("peak reserved", "peak_reserved", format_size),
            ("peak segments", "peak_segments", str),
            ("final segments", "final_segments", str),
        ):
            lines.append(f"  {label:<16}{fmt(rec[key]):>18}{fmt(pre[key]):>18}")
        lines.append(f"  {'OOM':<16}{_oom_cell(rec['oom_at']):>18}{_oom_cell(pre['oom_at']):>18}")
        for p in r["pools"]:
            label = (
                "default pools" if p["pool"] == [0, 0] else f"pool ({p['pool'][0]}, {p['pool'][1]})"
            )
            lines.append(
                f"  {label:<16}{format_size(p['recorded']['peak_reserved']):>18}"
                f"{format_size(p['predicted']['peak_reserved']):>18}  (peak reserved)"
            )
    return lines


def _oom_cell(at: int | None) -> str:
    return "no" if at is None else f"yes (entry {at})"
