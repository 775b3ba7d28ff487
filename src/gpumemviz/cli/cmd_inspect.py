"""`gpumemviz inspect`: a snapshot's memory, fragmentation, worst segments and advice."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gpumemviz.analysis.advice import advise_each_device, oom_device_free
from gpumemviz.analysis.fragmentation import (
    ASSUMED_IN_USE,
    FragmentationReport,
    MemoryFigures,
    PoolFigures,
    SegmentSummary,
    fragmentation,
)
from gpumemviz.cli.common import NOT_RECORDED, UsageError, input_name, snapshot_input
from gpumemviz.cli.output import quoted, say, say_json
from gpumemviz.snapshot.pools import pool_label
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.analysis.advice_check import CheckedAdvice
    from gpumemviz.cli.common import Subparsers
    from gpumemviz.snapshot.schema import JsonDict

__all__ = ["NO_REPLAY", "add_inspect", "run_inspect"]

#: Why `inspect --no-replay` advice carries no replay (its `replay_skipped` in --json).
NO_REPLAY = "--no-replay"


def add_inspect(sub: Subparsers) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a snapshot: memory, fragmentation, worst segments, advice",
        description="Summarise a memory snapshot (torch.cuda.memory._dump_snapshot output, "
        "pickle or JSON): reserved/allocated/free per device, fragmentation, the worst "
        "segments and advice.",
    )
    p.add_argument(
        "file",
        type=Path,
        help="snapshot file (.pickle, .pkl, .json or any name; - for standard input)",
    )
    p.add_argument("--device", type=int, default=None, help="only this device index")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument(
        "--pools-released",
        action="store_true",
        help="take every private pool (CUDA graph, torch.cuda.MemPool) as released, so "
        "empty_cache would return its free segments (a snapshot does not record it; by default "
        "every pool is assumed still in use)",
    )
    p.add_argument(
        "--no-replay",
        action="store_true",
        help="do not check setting advice by replaying the recorded trace (faster; the "
        "advice is then only what the snapshot's fragmentation suggests)",
    )
    p.set_defaults(run=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    """The figures, worst segments and advice of FILE (one device with --device).

    Advice goes through `advice_check.check_advice` unless ``--no-replay``; the text lists the
    refuted advice after "checked and rejected", the JSON shape is `_json`'s.
    """
    from gpumemviz.analysis.advice_check import (  # loads the replay
        Checked,
        CheckedAdvice,
        check_advice,
    )
    from gpumemviz.io import load_snapshot  # the loader is only needed once a file is named

    snap = load_snapshot(snapshot_input(args.file))
    report = fragmentation(snap, pools_in_use=not args.pools_released)
    devices = list(report.devices)
    if args.device is not None:
        if args.device not in report.devices:
            have = ", ".join(map(str, devices)) or "none"
            raise UsageError(
                f"no device {args.device} in {input_name(args.file)} (devices: {have})"
            )
        devices = [args.device]
    oom_free = oom_device_free(snap)
    advice = advise_each_device(report, oom_free, devices)
    if args.no_replay:
        checked = CheckedAdvice([Checked(a, unchecked=NO_REPLAY) for a in advice], [])
    else:
        checked = check_advice(snap, advice)
    if args.json:
        say_json(_json(report, devices, checked, oom_free, args.device))
    else:
        say("\n".join(_text(report, devices, checked, oom_free, input_name(args.file))))
    return 0


def _json(
    report: FragmentationReport,
    devices: list[int],
    checked: CheckedAdvice,
    oom_free: dict[int, int],
    only: int | None,
) -> JsonDict:
    """`{"total": {...}, "devices": {"0": {...}}}` (with --device: total = that device); each
    figures dict lists its `pools`, and `pools_in_use` says what was assumed of private pools.

    Each advice is `{kind, message, evidence, replay, replay_skipped}`; `rejected_advice` holds
    the setting advice the replay refuted, in the same shape."""
    full = report.to_dict()
    out: JsonDict = {
        "total": full["devices"][str(only)] if only is not None else full["total"],
        "devices": {str(d): full["devices"][str(d)] for d in devices},
        "settings": full["settings"],
        "pools_in_use": full["pools_in_use"],
        "advice": [c.to_dict() for c in checked.shown],
        "rejected_advice": [c.to_dict() for c in checked.rejected],
    }
    out["oom_device_free"] = {str(d): v for d, v in oom_free.items() if d in devices}
    return out


def _text(
    report: FragmentationReport,
    devices: list[int],
    checked: CheckedAdvice,
    oom_free: dict[int, int],
    name: str,
) -> list[str]:
    t = report.total
    conf = (report.allocator_settings or {}).get("PYTORCH_CUDA_ALLOC_CONF")
    settings = quoted(conf) if conf else "defaults"
    if report.allocator_settings is None:
        settings = NOT_RECORDED
    lines = [
        f"{name}: {len(report.devices)} device(s), {t.segments} segments, {t.blocks} blocks; "
        f"allocator settings: {settings}"
    ]
    for d in devices:
        lines += _device_lines(f"device {d}", report.devices[d], oom_free.get(d))
    if len(devices) > 1:
        lines += _device_lines("all devices", t, None, worst=False)
    if t.violations:
        lines.append(f"! {len(t.violations)} segment(s) break allocated + free + pending == size:")
        lines += [f"    {v.message}" for v in t.violations[:5]]
    advice = checked.advice
    lines.append("advice:" if advice else "advice: none (nothing worth changing)")
    lines += [f"  - [{a.kind}] {a.message}" for a in advice]
    if checked.rejected:
        lines.append("checked and rejected (the replay of the recorded trace is worse with it):")
        lines += [f"  - [{c.advice.kind}] {c.advice.message}" for c in checked.rejected]
    return lines


def _device_lines(
    title: str, f: MemoryFigures, oom_free: int | None, worst: bool = True
) -> list[str]:
    fs = format_size
    lines = [
        f"{title}: reserved {fs(f.reserved)}, allocated {fs(f.allocated)} (requested "
        f"{fs(f.requested)}, internal waste {fs(f.internal_waste)}), pending free "
        f"{fs(f.pending_free)}",
        f"  free {fs(f.free)} in {f.blocks_free} blocks: largest {fs(f.largest_free)}, "
        f"external fragmentation {f.external_fragmentation:.1%}, "
        f"fragmentation_sq {f.fragmentation_sq:.1%}",
        f"  trapped in partly used segments {fs(f.free_trapped)}; empty_cache would release "
        f"{fs(f.releasable)}"
        + (f" (+{fs(f.releasable_private)} of private pools)" if f.releasable_private else ""),
        f"  left after empty_cache {fs(f.free_stuck)} ({fs(f.free_stuck_expandable)} in "
        "partial pages of expandable segments)",
    ]
    if f.device is not None and any(p.pool_id != (0, 0) for p in f.pools):  # per device only
        assumed = any(p.in_use and p.pool_id != (0, 0) for p in f.pools)
        lines.append("  pools:")
        lines += [f"    {_pool_line(p)}" for p in f.pools]
        lines.append(
            f"    note: {ASSUMED_IN_USE}"
            if assumed
            else "    note: private pools taken as released"
        )
    if oom_free is not None:
        lines.append(f"  last OOM: the driver had {fs(oom_free)} free")
    if worst and f.worst_segments:
        lines.append("  worst segments (free that empty_cache cannot return):")
        lines += [f"    {_segment_line(s)}" for s in f.worst_segments]
    return lines


def _pool_line(p: PoolFigures) -> str:
    fs = format_size
    if p.releasable_after_release:
        rel = f"{fs(p.releasable)} now, {fs(p.releasable_after_release)} {p.note}"
    else:
        rel = fs(p.releasable)
    pending = f", pending free {fs(p.pending_free)}" if p.pending_free else ""
    return (
        f"{p.label}: {p.segments} segments, reserved {fs(p.reserved)}, allocated "
        f"{fs(p.allocated)}{pending}, free {fs(p.free)} (largest {fs(p.largest_free)}, external "
        f"fragmentation {p.external_fragmentation:.1%}); empty_cache releases {rel}"
    )


def _segment_line(s: SegmentSummary) -> str:
    kind = f"{s.pool}{' expandable' if s.is_expandable else ''}"
    if s.pool_id != (0, 0):
        kind += f" in {pool_label(s.pool_id)}"
    stream = f", stream {s.stream}" if s.stream else ""
    # pending frees become free when empty_cache syncs, so they count in what stays stuck
    pending = f" and {format_size(s.pending_free)} pending" if s.pending_free else ""
    return (
        f"0x{s.address:x} {kind} {format_size(s.total_size)}{stream}: "
        f"{format_size(s.stuck_free)} stuck of {format_size(s.free)} free{pending} in "
        f"{s.n_blocks} blocks, largest {format_size(s.largest_free)}"
    )
