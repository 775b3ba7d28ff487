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

__all__ = [
    "NOT_RECORDED",
    "STDIN",
    "UsageError",
    "add_sharing_args",
    "check_output",
    "input_name",
    "snapshot_input",
]

#: The FILE argument that means standard input.
STDIN = "-"

#: What `inspect` and `whatif` say of a file that does not record its allocator settings.
NOT_RECORDED = "not recorded (assumed PyTorch's defaults)"


class UsageError(ValueError):
    """Bad input from the command line: printed as one line, exit status 2."""


def snapshot_input(arg: str | os.PathLike) -> Path | bytes:
    """A FILE argument as the loaders take it: ``-`` is standard input, read whole (within
    the 4 GiB limit) as bytes; anything else stays a path (a pipe is read whole too)."""
    if os.fspath(arg) != STDIN:
        return Path(arg)
    from ..io import read_input

    return read_input(STDIN)


def input_name(arg: str | os.PathLike) -> str:
    """How messages name a FILE argument: ``<stdin>`` for ``-``."""
    return "<stdin>" if os.fspath(arg) == STDIN else os.fspath(arg)


def add_sharing_args(p: argparse.ArgumentParser, output_help: str) -> None:
    """FILE, -o OUTPUT and --redact-paths: what every command that writes a file to share takes."""
    p.add_argument("file", type=Path, help="snapshot file (- for standard input)")
    p.add_argument("-o", "--output", type=Path, required=True, help=output_help)
    p.add_argument(
        "--redact-paths",
        action="store_true",
        help="replace home directories and user names in every string first",
    )


def check_output(path: Path) -> None:
    """An output path whose folder is missing, or that is a folder, is a usage error."""
    if path.is_dir():
        raise UsageError(f"output {path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"output folder {parent} does not exist")
