"""`gpumemviz inspect`: a snapshot's memory, fragmentation, worst segments and advice."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gpumemviz.analysis.fragmentation import (
    ASSUMED_IN_USE,
    MemoryFigures,
    PoolFigures,
    SegmentSummary,
)
from gpumemviz.cli.common import NOT_RECORDED, UsageError, input_name, snapshot_input
from gpumemviz.cli.holders_text import HOLDER_CHOICES, findings_lines, holders_lines
from gpumemviz.cli.output import quoted, say, say_json
from gpumemviz.snapshot.escaping import one_line
from gpumemviz.snapshot.pools import pool_label
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.analysis.findings import Findings, OomFinding
    from gpumemviz.cli.common import Subparsers
    from gpumemviz.snapshot import Snapshot

__all__ = ["add_inspect", "run_inspect"]


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
        help="snapshot file (.pickle, .pkl, .json or any name; - for standard input), or a "
        "folder of per-rank snapshot files (not recursive): the ranks worst first and what "
        "differs between them",
    )
    p.add_argument("--device", type=int, default=None, help="only this device index")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument(
        "--holders",
        metavar="KEY",
        choices=HOLDER_CHOICES,
        default=None,
        help="list every holder of the allocated bytes grouped by KEY: "
        + ", ".join(HOLDER_CHOICES)
        + " (by default the top holders by frame are shown)",
    )
    p.add_argument(
        "--device-memory",
        metavar="BYTES",
        type=int,
        default=None,
        help="the device's memory in bytes, for the forecast of the time to OOM (default: "
        "what an oom entry of the trace shows; without either, no forecast)",
    )
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
    """The figures, worst segments, OOM and advice of FILE (one device with --device).

    Everything shown is `gpumemviz.analyze`'s `Findings` (``--no-replay``: ``check=False``);
    ``--json`` prints its ``to_dict()``, the text renders it: refuted advice after "checked and
    rejected", an OOM's ranked actions under its device.
    """
    from gpumemviz.analysis.findings import analyze  # loads the replay
    from gpumemviz.io import load_snapshot  # the loader is only needed once a file is named

    if args.file.is_dir():
        return _inspect_folder(args)
    snap = load_snapshot(snapshot_input(args.file))
    if args.device is not None and args.device not in snap.devices:
        have = ", ".join(map(str, snap.devices)) or "none"
        raise UsageError(f"no device {args.device} in {input_name(args.file)} (devices: {have})")
    found = analyze(
        snap,
        device=args.device,
        check=not args.no_replay,
        pools_in_use=not args.pools_released,
        device_total=args.device_memory,
    )
    if args.json:
        say_json(found.to_dict())
    elif args.holders is not None:
        say("\n".join(holders_lines(found, args.holders, top=None)))
    else:
        say("\n".join(_text(found, len(snap.devices), snap, input_name(args.file))))
    return 0


def _inspect_folder(args: argparse.Namespace) -> int:
    """``inspect DIR``: every rank's file analysed, the grid worst first, what differs."""
    from gpumemviz.analysis.ranks import analyze_ranks

    if args.device is not None or args.holders is not None:
        raise UsageError("--device and --holders name one file's devices, not a folder's")
    try:
        ranks = analyze_ranks(args.file, check=not args.no_replay, device_total=args.device_memory)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    if args.json:
        say_json(ranks.to_dict())
        return 0
    lines = ranks.lines(input_name(args.file))
    lines.append("(gpumemviz inspect FILE shows one rank's findings in full)")
    say("\n".join(lines))
    return 0


def _text(found: Findings, n_devices: int, snap: Snapshot, name: str) -> list[str]:
    t = found.memory
    if found.settings is None:
        settings = NOT_RECORDED
    else:
        settings = quoted(found.settings) if found.settings else "defaults"
    lines = [
        f"{name}: {n_devices} device(s), {snap.n_segments} segments, {snap.n_blocks} blocks; "
        f"allocator settings: {settings}"
    ]
    each = [found] if found.device is not None else list(found.devices.values())
    for f in each:
        lines += _device_lines(f"device {f.device}", f.memory, f.oom)
    if found.device is None and len(each) > 1:
        lines += _device_lines("all devices", t, None, worst=False)
    if t.violations:
        lines.append(f"! {len(t.violations)} segment(s) break allocated + free + pending == size:")
        lines += [f"    {v.message}" for v in t.violations[:5]]
    many = found.device is None and len(each) > 1
    if found.advice:
        lines.append("advice:")
    elif found.oom is not None:
        lines.append("advice: no setting to change; the OOM's actions above are what to do")
    else:
        lines.append("advice: none (nothing worth changing)")
    lines += [f"  - [{a.kind}] {_on(a.device, many)}{a.message}" for a in found.advice]
    if found.rejected:
        lines.append("checked and rejected (the replay of the recorded trace is worse with it):")
        lines += [f"  - [{a.kind}] {_on(a.device, many)}{a.message}" for a in found.rejected]
    lines += findings_lines(found)
    lines += [f"note: {one_line(n)}" for n in found.notes]
    return lines


def _on(device: int | None, many: bool) -> str:
    return f"cuda:{device}: " if many and device is not None else ""


def _device_lines(
    title: str, f: MemoryFigures, oom: OomFinding | None, worst: bool = True
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
    if oom is not None:
        lines.append(f"  {one_line(oom.sentence)}")
        where = f"at trace entry {oom.entry}" if oom.entry is not None else f"on the {oom.basis}"
        lines.append(f"    judged {where}")
        if oom.frame:
            lines.append(f"    allocated at {one_line(oom.frame)}")
        lines.append("    what to do, most direct first:")
        lines += [f"    {i}. {a.sentence} ({fs(a.effect)})" for i, a in enumerate(oom.actions, 1)]
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
