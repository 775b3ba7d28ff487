"""The `gpumemviz` command: one argparse subcommand per job, one module per subcommand.

Adding a subcommand is one module (``cmd_X.py``) with a function that registers its parser and
sets `run`, plus one line in `SUBCOMMANDS`: `run(args)` returns the exit status and raises
`UsageError` (`gpumemviz.cli.common`; or any ValueError, `SnapshotError` included) for bad
input, which `main` turns into exit status 2 and one line on stderr. This package's own module
is the command itself (the parser and `main`, the console script's entry point).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpumemviz import __version__
from gpumemviz.cli.cmd_demo import add_demo
from gpumemviz.cli.cmd_diff import add_diff
from gpumemviz.cli.cmd_export import add_export
from gpumemviz.cli.cmd_inspect import add_inspect
from gpumemviz.cli.cmd_job import add_job
from gpumemviz.cli.cmd_report import add_report
from gpumemviz.cli.cmd_whatif import add_whatif
from gpumemviz.cli.output import EscapingParser
from gpumemviz.snapshot.escaping import error_line

if TYPE_CHECKING:
    from gpumemviz.cli.common import Subparsers

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

#: Options taking a size, whose value may start with "-" (to be refused as not positive).
_SIZE_OPTIONS = ("--capacity",)

#: One function per subcommand: `add(subparsers)` registers it and sets `run`.
SUBCOMMANDS: list[Callable[[Subparsers], None]] = [
    add_inspect,
    add_whatif,
    add_diff,
    add_report,
    add_export,
    add_demo,
    add_job,
]


def build_parser() -> argparse.ArgumentParser:
    # typed as the base class: its subparsers are EscapingParsers too (argparse makes them
    # of the parser's own class), and the subcommands' add_* functions take the base type
    parser: argparse.ArgumentParser = EscapingParser(
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
        args = parser.parse_args(_glue_negative(sys.argv[1:] if argv is None else list(argv)))
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
    except (ValueError, OSError) as e:  # UsageError, SnapshotError, bad sizes, unwritable
        msg = error_line(e)  # one bounded line, safe for the terminal; exit status 2
        print(f"gpumemviz {args.command}: error: {msg}", file=sys.stderr)
        return 2


def _glue_negative(argv: list[str]) -> list[str]:
    """`--capacity -5GiB` as `--capacity=-5GiB`: argparse reads a value starting with "-" and
    a digit as a missing value, so the run could not say the size must be positive."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i] in _SIZE_OPTIONS and nxt.startswith("-") and nxt[1:2].isdigit():
            out.append(f"{argv[i]}={nxt}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out
