"""`gpumemviz diff`: two snapshots compared (figures, segments, allocation sites)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumemviz.cli.common import Subparsers

from gpumemviz.cli.common import STDIN, UsageError, input_name, snapshot_input
from gpumemviz.cli.output import say, say_json
from gpumemviz.snapshot.escaping import error_line

__all__ = ["add_diff", "run_diff"]


def add_diff(sub: Subparsers) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two snapshots: figures, segments, allocation sites",
        description="Compare snapshot A (before) with B (after), per device: reserved, "
        "allocated, fragmentation, segments added/removed, the allocation sites that grew.",
    )
    p.add_argument("a", type=Path, help="the snapshot before (- for standard input)")
    p.add_argument("b", type=Path, help="the snapshot after (- for standard input)")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    p.set_defaults(run=run_diff)


def run_diff(args: argparse.Namespace) -> int:
    from gpumemviz.analysis.diff import diff
    from gpumemviz.io import load_snapshot

    if str(args.a) == str(args.b) == STDIN:
        raise UsageError("only one of A and B can be - (standard input)")
    sides = []
    for label, arg in (("A", args.a), ("B", args.b)):
        try:
            sides.append(load_snapshot(snapshot_input(arg)))
        except (ValueError, OSError) as e:  # say which of the two files it is
            raise UsageError(f"{label} ({input_name(arg)}): {error_line(e)}") from None
    result = diff(*sides)
    if args.json:
        say_json(result.to_dict())
    else:
        say(result.text())
    return 0
