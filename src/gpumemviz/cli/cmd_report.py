"""`gpumemviz report`: a self-contained HTML report that opens offline."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpumemviz.cli.common import (
    UsageError,
    add_sharing_args,
    check_output,
    output_of,
    snapshot_input,
)
from gpumemviz.cli.output import say
from gpumemviz.io import is_stdout
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.cli.common import Subparsers

__all__ = ["add_report", "run_report"]


def add_report(sub: Subparsers) -> None:
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report that opens offline",
        description="Write one HTML file with everything inlined (segment map, timeline, "
        "fragmentation, advice, who holds the memory); it opens with the network off. FILE "
        "may be a folder of per-rank snapshot files: the page is the worst rank's, with the "
        "rank grid (worst first), what differs and each rank's findings in its data.",
    )
    add_sharing_args(p, "the HTML file to write (- for standard output)")
    p.add_argument(
        "--no-replay",
        action="store_true",
        help="do not check setting advice by replaying the recorded trace",
    )
    p.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from gpumemviz.reporting.html_report import report

    args.output = output_of(args)
    check_output(args.output, args.force)
    ranks = None
    source = snapshot_input(args.file)
    if args.file.is_dir():  # a folder of per-rank files: the worst rank's page, and the grid
        from gpumemviz.analysis.ranks import analyze_ranks

        try:
            ranks = analyze_ranks(args.file, check=not args.no_replay)
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
        source = args.file / ranks.ranks[0].file
    # the file itself: its name is the title and its size sets the page's budget
    path = report(
        source,
        args.output,
        redact_paths=args.redact_paths,
        replay_advice=not args.no_replay,
        force=args.force,
        ranks=ranks,
    )
    if is_stdout(path):  # the page went to standard output: nothing else goes there
        return 0
    say(f"wrote {path} ({format_size(path.stat().st_size)})")
    return 0
