"""The `gpumemviz` command: one argparse subcommand per job.

Adding a subcommand is one function that registers its parser and sets `run`, plus one line in
`SUBCOMMANDS`: `run(args)` returns the exit status and raises `UsageError` (or any ValueError,
`SnapshotError` included) for bad input, which `main` turns into exit status 2 and one line on
stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .advice import Advice, advise, oom_device_free
from .fragmentation import FragmentationReport, MemoryFigures, SegmentSummary, fragmentation
from .units import format_size

__all__ = ["SUBCOMMANDS", "UsageError", "main"]


class UsageError(ValueError):
    """Bad input from the command line: printed as one line, exit status 2."""


# --------------------------------------------------------------------------------------------
# inspect


def add_inspect(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a snapshot: memory, fragmentation, worst segments, advice",
        description="Summarise a memory snapshot (torch.cuda.memory._dump_snapshot output, "
        "pickle or JSON): reserved/allocated/free per device, fragmentation, the worst "
        "segments and advice.",
    )
    p.add_argument("file", type=Path, help="snapshot file (.pickle, .pkl, .json or any name)")
    p.add_argument("--device", type=int, default=None, help="only this device index")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(run=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    from .io import load_snapshot  # the loader is only needed once a file is named

    snap = load_snapshot(args.file)
    report = fragmentation(snap)
    devices = list(report.devices)
    if args.device is not None:
        if args.device not in report.devices:
            have = ", ".join(map(str, devices)) or "none"
            raise UsageError(f"no device {args.device} in {args.file} (devices: {have})")
        devices = [args.device]
    oom_free = oom_device_free(snap)
    advice: list[Advice] = []
    for d in devices:
        total = report.devices[d].reserved + oom_free[d] if d in oom_free else None
        advice += advise(report, device=d, device_total=total)
    if args.json:
        print(json.dumps(_json(report, devices, advice, oom_free, args.device), indent=2))
    else:
        print("\n".join(_text(report, devices, advice, oom_free, str(args.file))))
    return 0


def _json(
    report: FragmentationReport,
    devices: list[int],
    advice: list[Advice],
    oom_free: dict[int, int],
    only: int | None,
) -> dict[str, Any]:
    """`{"total": {...}, "devices": {"0": {...}}}` (with --device: total = that device)."""
    full = report.to_dict()
    out: dict[str, Any] = {
        "total": full["devices"][str(only)] if only is not None else full["total"],
        "devices": {str(d): full["devices"][str(d)] for d in devices},
        "settings": full["settings"],
        "advice": [a.to_dict() for a in advice],
    }
    out["oom_device_free"] = {str(d): v for d, v in oom_free.items() if d in devices}
    return out


def _text(
    report: FragmentationReport,
    devices: list[int],
    advice: list[Advice],
    oom_free: dict[int, int],
    name: str,
) -> list[str]:
    t = report.total
    conf = (report.allocator_settings or {}).get("PYTORCH_CUDA_ALLOC_CONF")
    settings = (
        "not recorded"
        if report.allocator_settings is None
        else (repr(conf) if conf else "defaults")
    )
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
    lines.append("advice:" if advice else "advice: none (nothing worth changing)")
    lines += [f"  - [{a.kind}] {a.message}" for a in advice]
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
    ]
    if oom_free is not None:
        lines.append(f"  last OOM: the driver had {fs(oom_free)} free")
    if worst and f.worst_segments:
        lines.append("  worst segments (free that empty_cache cannot return):")
        lines += [f"    {_segment_line(s)}" for s in f.worst_segments]
    return lines


def _segment_line(s: SegmentSummary) -> str:
    kind = f"{s.pool}{' expandable' if s.is_expandable else ''}"
    stream = f", stream {s.stream}" if s.stream else ""
    return (
        f"0x{s.address:x} {kind} {format_size(s.total_size)}{stream}: "
        f"{format_size(s.stuck_free)} stuck of {format_size(s.free)} free in {s.n_blocks} "
        f"blocks, largest {format_size(s.largest_free)}"
    )


# --------------------------------------------------------------------------------------------
# the command

#: One function per subcommand: `add(subparsers)` registers it and sets `run`.
SUBCOMMANDS: list[Callable[[Any], None]] = [add_inspect]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumemviz",
        description="See PyTorch CUDA caching-allocator memory and its fragmentation.",
    )
    parser.add_argument("--version", action="version", version=f"gpumemviz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `gpumemviz ARGS`; returns the exit status (0 ok, 2 bad input).

    Examples
    --------
    >>> main(["inspect", "/no/such/file.pickle"])
    2
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error argparse already printed
        return e.code if isinstance(e.code, int) else 2
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(run(args))
    except BrokenPipeError:  # `gpumemviz inspect x | head`: the reader left, that is fine
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except ValueError as e:  # UsageError, SnapshotError, bad sizes: one line, status 2
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"gpumemviz {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
