"""`gpumemviz diff`: two snapshots compared (figures, segments, holders), and the two
sides' `gpumemviz.analyze` findings (advice, rejected advice, OOM) side by side."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumemviz.analysis.findings import Findings
    from gpumemviz.cli.common import Subparsers
    from gpumemviz.snapshot.schema import JsonDict

from gpumemviz.cli.common import STDIN, UsageError, input_name, snapshot_input
from gpumemviz.cli.output import say, say_json
from gpumemviz.snapshot.escaping import error_line, one_line

__all__ = ["add_diff", "run_diff"]


def add_diff(sub: Subparsers) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two snapshots: figures, segments, holders",
        description="Compare snapshot A (before) with B (after), per device: reserved, "
        "allocated, fragmentation, segments added/removed, the holders that grew.",
    )
    p.add_argument("a", type=Path, help="the snapshot before (- for standard input)")
    p.add_argument("b", type=Path, help="the snapshot after (- for standard input)")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    p.add_argument(
        "--no-replay",
        action="store_true",
        help="do not check either side's setting advice by replaying its recorded trace",
    )
    p.set_defaults(run=run_diff)


def run_diff(args: argparse.Namespace) -> int:
    from gpumemviz.analysis.diff import diff
    from gpumemviz.analysis.findings import analyze
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
    found = [analyze(side, check=not args.no_replay) for side in sides]
    if args.json:
        out = result.to_dict()
        out["findings"] = {k: _verdicts(f) for k, f in zip(("a", "b"), found, strict=True)}
        say_json(out)
    else:
        say("\n".join([result.text(), *_side_by_side(*found)]))
    return 0


def _verdicts(f: Findings) -> JsonDict:
    """What `diff --json` shows of one side's `Findings`: its advice, rejected list, OOM."""
    full = f.to_dict()
    return {k: full[k] for k in ("advice", "rejected", "oom", "notes")}


def _side_by_side(a: Findings, b: Findings) -> list[str]:
    """The two sides' advice, rejected advice and OOM verdicts, A then B under each heading."""
    lines = ["advice (A | B):"]
    for label, f in (("A", a), ("B", b)):
        if not f.advice:
            lines.append(f"  {label}: none")
        lines += [f"  {label}: [{x.kind}] {x.message}" for x in f.advice]
    if a.rejected or b.rejected:
        lines.append("checked and rejected (A | B):")
        for label, f in (("A", a), ("B", b)):
            lines += [f"  {label}: [{x.kind}] {x.message}" for x in f.rejected]
    lines.append("OOM (A | B):")
    for label, f in (("A", a), ("B", b)):
        if f.oom is None:
            lines.append(f"  {label}: none")
            continue
        lines.append(f"  {label}: {one_line(f.oom.sentence)}")
        lines += [f"     {i}. {one_line(x.sentence)}" for i, x in enumerate(f.oom.actions, 1)]
    return lines
