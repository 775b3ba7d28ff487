"""How error messages name a value: its type, a bounded one-line repr, text made one line.

Every SnapshotError names the bad value this way, here and in `gpumemviz.io`, so no message
runs long, spans lines or fails on a value whose repr fails.
"""

from __future__ import annotations

import reprlib


def type_phrase(x: object) -> str:
    """'a list', 'an int': how error messages name a value's type."""
    name = type(x).__name__
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def one_line(text: str) -> str:
    """`text` fit for a one-line message: newlines and other unprintables escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 80, 80


def short_repr(x: object) -> str:
    """A bounded, one-line repr for error messages: never recurses deep, never runs long."""
    try:
        return one_line(_SHORT.repr(x))
    except Exception:  # a value whose repr fails must not hide the real error
        return f"<{type(x).__name__}>"
