"""What several subcommands share: the usage error, the file arguments, one phrase.

`UsageError` is what a subcommand raises for bad input (`main` prints it as one line, exit
status 2); `snapshot_input` and `input_name` read a FILE argument (``-``: standard input, read
whole; a pipe such as /dev/stdin too); `add_sharing_args` and `check_output` are the FILE /
-o OUTPUT / --redact-paths of the commands that write a file to share (report, export);
`NOT_RECORDED` is how inspect and whatif name a file that does not record its allocator
settings.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Protocol

from gpumemviz.io import check_target, is_stdout

__all__ = [
    "NOT_RECORDED",
    "STDIN",
    "Subparsers",
    "UsageError",
    "add_sharing_args",
    "check_output",
    "input_name",
    "output_of",
    "snapshot_input",
]

#: The FILE argument that means standard input.
STDIN = "-"

#: What `inspect` and `whatif` say of a file that does not record its allocator settings.
NOT_RECORDED = "not recorded (assumed PyTorch's defaults)"


class Subparsers(Protocol):
    """What `ArgumentParser.add_subparsers()` returns, as each subcommand's ``add_*`` uses it:
    one parser per subcommand, with its one-line help and its description."""

    def add_parser(self, name: str, *, help: str, description: str) -> argparse.ArgumentParser:
        """A new subcommand `name`'s own parser."""
        ...


class UsageError(ValueError):
    """Bad input from the command line: printed as one line, exit status 2."""


def snapshot_input(arg: str | os.PathLike[str]) -> Path | bytes:
    """A FILE argument as the loaders take it: ``-`` is standard input, read whole (within
    the 4 GiB limit) as bytes; anything else stays a path (a pipe is read whole too)."""
    if os.fspath(arg) != STDIN:
        return Path(arg)
    from gpumemviz.io import read_input

    return read_input(STDIN)


def input_name(arg: str | os.PathLike[str]) -> str:
    """How messages name a FILE argument: ``<stdin>`` for ``-``."""
    return "<stdin>" if os.fspath(arg) == STDIN else os.fspath(arg)


def add_sharing_args(p: argparse.ArgumentParser, output_help: str) -> None:
    """FILE, OUTPUT (or -o OUTPUT) and --redact-paths: what every command that writes a file to
    share takes. `check_output` then reads the output from either place."""
    p.add_argument("file", type=Path, help="snapshot file (- for standard input)")
    p.add_argument("output_arg", type=Path, nargs="?", metavar="OUTPUT", help=output_help)
    p.add_argument("-o", "--output", type=Path, help="the same as OUTPUT")
    p.add_argument(
        "--redact-paths",
        action="store_true",
        help="replace home directories and user names in every string first",
    )
    p.add_argument("--force", action="store_true", help="replace OUTPUT even when it is read-only")


def output_of(args: argparse.Namespace) -> Path:
    """The OUTPUT a sharing command writes: given as the second argument or as -o (once)."""
    given: list[Path] = [o for o in (args.output_arg, args.output) if o is not None]
    if not given:
        raise UsageError(f"say where to write: gpumemviz {args.command} FILE OUTPUT")
    if len(given) == 2 and given[0] != given[1]:
        raise UsageError(f"two outputs given ({given[0]} and -o {given[1]}): give one")
    return given[0]


def check_output(path: Path, force: bool = False) -> None:
    """An output path whose folder is missing, or that is a folder, is a usage error; so is
    one the writer would refuse (a device, fifo or socket; a read-only file unless `force`),
    found before any work. "-" is standard output."""
    if is_stdout(path):
        return
    if path.is_dir():
        raise UsageError(f"output {path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"output folder {parent} does not exist")
    try:
        check_target(path, force=force)
    except OSError as e:
        raise UsageError(str(e)) from None
