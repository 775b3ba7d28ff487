"""`gpumemviz export`: a snapshot written as pickle (protocol 4), JSON or a CSV timeline."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from gpumemviz.cli.common import (
    UsageError,
    add_sharing_args,
    check_output,
    input_name,
    output_of,
    snapshot_input,
)
from gpumemviz.cli.output import say
from gpumemviz.io import is_stdout
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.cli.common import Subparsers

__all__ = ["add_export", "run_export"]


def add_export(sub: Subparsers) -> None:
    p = sub.add_parser(
        "export",
        help="write a snapshot as pickle (protocol 4), JSON or a CSV timeline",
        description="Export a snapshot for sharing: a protocol-4 pickle with the full trace "
        "(PyTorch's tools accept it), JSON, or a CSV with one row per trace entry.",
    )
    add_sharing_args(p, "the file to write (- for standard output)")
    p.add_argument(
        "--format",
        choices=("pickle", "json", "csv"),
        default=None,
        help="default: from the output's suffix (.json, .csv; anything else pickle)",
    )
    p.add_argument("--device", type=int, default=None, help="CSV: only this device's trace")
    p.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> int:
    from gpumemviz.io import load_snapshot
    from gpumemviz.reporting.export import export

    args.output = output_of(args)
    check_output(args.output, args.force)
    if is_stdout(args.output) and sys.stdout.isatty() and _format(args) == "pickle":
        raise UsageError(
            "will not write a binary pickle to a terminal: redirect the output (> FILE), "
            "or use --format json or csv"
        )
    snap = load_snapshot(snapshot_input(args.file))
    if args.device is not None and args.device not in snap.traces:
        have = ", ".join(map(str, sorted(snap.traces))) or "none"
        raise UsageError(
            f"no trace of device {args.device} in {input_name(args.file)} (traced: {have})"
        )
    path = export(
        snap,
        args.output,
        format=args.format,
        redact_paths=args.redact_paths,
        device=args.device,
        force=args.force,
    )
    if is_stdout(path):  # the data went to standard output: nothing else goes there
        return 0
    say(f"wrote {path} ({format_size(path.stat().st_size)})")
    return 0


def _format(args: argparse.Namespace) -> str:
    """The format export writes: --format, else the output's suffix (anything else pickle)."""
    if args.format:
        return str(args.format)
    return {".json": "json", ".csv": "csv"}.get(args.output.suffix.lower(), "pickle")
