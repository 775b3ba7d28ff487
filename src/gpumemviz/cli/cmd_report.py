"""`gpumemviz report`: a self-contained HTML report that opens offline."""

from __future__ import annotations

import argparse
from typing import Any

from ..units import format_size
from .common import add_sharing_args, check_output, snapshot_input

__all__ = ["add_report", "run_report"]


def add_report(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report that opens offline",
        description="Write one HTML file with everything inlined (segment map, timeline, "
        "fragmentation, advice, top allocation sites); it opens with the network off.",
    )
    add_sharing_args(p, "the HTML file to write")
    p.add_argument(
        "--no-replay",
        action="store_true",
        help="do not check setting advice by replaying the recorded trace",
    )
    p.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from ..report_html import report

    check_output(args.output)
    # the file itself: its name is the title and its size sets the page's budget
    path = report(
        snapshot_input(args.file),
        args.output,
        redact_paths=args.redact_paths,
        replay_advice=not args.no_replay,
    )
    print(f"wrote {path} ({format_size(path.stat().st_size)})")
    return 0
