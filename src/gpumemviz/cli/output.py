"""What the command prints: every line through the one escaping function, JSON without NaN.

A snapshot's strings (frame names, file paths, settings) and its file's name come from
strangers; printed raw, an ESC sequence in them would retitle the window or clear the screen,
and a CR or a bidi override would make a line say something else. So everything the
subcommands print goes through `say` (or `say_json`), and argparse's own messages, which quote
the command line (file names included), through `EscapingParser`.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any, NoReturn

from gpumemviz.io.json_text import dumps
from gpumemviz.snapshot.escaping import one_line, short_repr

__all__ = ["EscapingParser", "quoted", "say", "say_json"]

#: Longest string `quoted` shows whole.
QUOTED_WHOLE = 500


def say(text: str, *, file: IO[str] | None = None, flush: bool = False) -> None:
    """Print `text`, each of its lines made safe for the terminal (`messages.one_line`)."""
    print("\n".join(map(one_line, text.split("\n"))), file=file or sys.stdout, flush=flush)


def quoted(value: Any) -> str:
    """A value from a file (a settings string) as a line quotes it: a string's repr, whole up to
    `QUOTED_WHOLE` characters; anything longer or else bounded by `messages.short_repr`."""
    if type(value) is str and len(value) <= QUOTED_WHOLE:
        return repr(value)
    return short_repr(value)


def say_json(data: Any) -> None:
    """Print `data` as indented JSON: ASCII only (so nothing to escape), NaN and infinity null."""
    print(dumps(data, indent=2))


class EscapingParser(argparse.ArgumentParser):
    """argparse, with its usage errors made safe for the terminal: they quote arguments, and a
    shell glob hands the command file names it did not choose."""

    def error(self, message: str) -> NoReturn:
        super().error("\n".join(map(one_line, message.split("\n"))))
