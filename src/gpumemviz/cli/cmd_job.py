"""`gpumemviz job HOST:PORT`: the rank grid of a running torch.distributed job, in a terminal.

Reads the job's own store (torchrun's MASTER_ADDR:MASTER_PORT), where each rank runs
`gpumemviz.distributed.publish`, and prints one line per (rank, device), the rank closest to
OOM first, refreshed every ``--interval`` seconds until Ctrl-C (``--once``: one print, for
scripts and tests). Every store call waits at most ``--timeout`` seconds: a store that does not
answer is said (and, refreshing, tried again). Values that are not a rank's summary show as
``suspect`` rows. ``--snapshot RANK`` asks that rank for its full snapshot and prints the path
it wrote. Everything printed from the store goes through `say` (other processes wrote it).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from gpumemviz.cli.common import UsageError
from gpumemviz.cli.output import say, say_json

if TYPE_CHECKING:
    from gpumemviz.cli.common import Subparsers

__all__ = ["add_job", "parse_address", "run_job"]

_CLEAR = "\x1b[H\x1b[J"  # cursor home, clear to the end: the grid redrawn in place


def add_job(sub: Subparsers) -> None:
    p = sub.add_parser(
        "job",
        help="the live rank grid of a torchrun job whose ranks run gpumemviz.distributed.publish",
        description="Connect to the job's torch.distributed store (MASTER_ADDR:MASTER_PORT) and "
        "print every rank's memory: reserved, allocated, largest free block, fragmentation, "
        "OOMs and a binned segment map, the rank closest to OOM first; stale ranks show their "
        "age. Refreshes until Ctrl-C.",
    )
    p.add_argument("address", metavar="HOST:PORT", help="the job's store, e.g. 127.0.0.1:29500")
    p.add_argument("--once", action="store_true", help="print the grid once and exit")
    p.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (default 1)"
    )
    p.add_argument("--json", action="store_true", help="print the ranks as JSON (implies --once)")
    p.add_argument(
        "--snapshot",
        type=int,
        metavar="RANK",
        help="ask RANK to write its full snapshot in its own snapshot_dir; print the path",
    )
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the store (default 10)"
    )
    p.set_defaults(run=run_job)


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as (host, port); `UsageError` otherwise.

    >>> parse_address("127.0.0.1:29500"), parse_address("[::1]:80")
    (('127.0.0.1', 29500), ('::1', 80))
    """
    from gpumemviz.distributed.jobview import parse_address as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run_job(args: argparse.Namespace) -> int:
    from gpumemviz.distributed import JobError, JobView
    from gpumemviz.distributed.store import StoreHung
    from gpumemviz.distributed.terminal import grid_text

    host, port = parse_address(args.address)
    if not 0.05 <= args.interval <= 3600:
        raise UsageError(f"--interval must be 0.05 to 3600 seconds, got {args.interval:g}")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    view = JobView(host, port, timeout=args.timeout)
    if args.snapshot is not None:
        try:
            path = view.request_snapshot(args.snapshot, timeout=max(args.timeout, 30.0))
        except JobError as exc:
            raise UsageError(str(exc)) from None
        say(str(path))
        return 0
    if args.json:
        say_json(view.ranks())
        return 0
    title = f"gpumemviz job {host}:{port}"
    live = not args.once and sys.stdout.isatty()
    try:
        while True:
            head = f"{title}  {time.strftime('%H:%M:%S')}"
            try:
                text = grid_text(view.ranks(), title=head, dropped=view.dropped)
            except StoreHung as exc:
                if args.once:
                    raise
                text = f"{head}\nthe store is not answering ({exc}): trying again"
            if live:
                sys.stdout.write(_CLEAR)
            say(text, flush=True)
            if args.once:
                return 0
            if not live:
                say("")
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
