"""`gpumemviz report`: a self-contained HTML report that opens offline."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpumemviz.cli.common import add_sharing_args, check_output, output_of, snapshot_input
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
        "fragmentation, advice, top allocation sites); it opens with the network off.",
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
    # the file itself: its name is the title and its size sets the page's budget
    path = report(
        snapshot_input(args.file),
        args.output,
        redact_paths=args.redact_paths,
        replay_advice=not args.no_replay,
        force=args.force,
    )
    if is_stdout(path):  # the page went to standard output: nothing else goes there
        return 0
    say(f"wrote {path} ({format_size(path.stat().st_size)})")
    return 0
