"""How messages and printed lines name values from files: one escaping function, one bounded repr.

Snapshot files come from strangers, and so do their names. Everything gpumemviz prints or puts
into a message that came from a file (a frame's name, a settings string, a path) goes through
`one_line`, which shows control characters, ESC, BEL, CR, newlines, bidi overrides and lone
surrogates as escapes, so a file cannot drive the user's terminal. Every value a message embeds
goes through `short_repr`, which is bounded in time and length whatever the value holds (a list
of the same list 30 levels deep is 2^30 leaves to `repr`), and `error_line` names an exception
the same way. Every SnapshotError uses them, here and in `gpumemviz.io`.
"""

from __future__ import annotations

import itertools
import reprlib

__all__ = ["MAX_MESSAGE", "MAX_REPR", "error_line", "one_line", "short_repr", "type_phrase"]

#: Longest `error_line`: a message is one line, not a dump of the data.
MAX_MESSAGE = 500
#: Longest `short_repr`.
MAX_REPR = 240
_SCALARS = (str, int, float, bool, type(None), bytes)


def type_phrase(x: object) -> str:
    """'a list', 'an int': how error messages name a value's type."""
    name = type(x).__name__
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    named = _NAMED.get(c)
    if named is not None:
        return named
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def one_line(text: str) -> str:
    """`text` safe for one line of a terminal: what is not printable becomes its escape.

    Control characters (ESC, BEL, CR, newline, tab), bidi overrides and other format characters,
    and lone surrogates (Python's stand-ins for the bytes of a non-UTF-8 file name) are shown as
    ``\\x1b``, ``\\u202e``, ``\\udcff``; printable text of any script stays as it is. This is the
    one escaping function for everything printed that comes from a file or a file name.

    Examples
    --------
    >>> one_line("model.py")
    'model.py'
    >>> one_line("\\x1b]0;title\\x07\\r\\u202eevil")
    '\\\\x1b]0;title\\\\x07\\\\r\\\\u202eevil'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


class _Bounded(reprlib.Repr):
    """`reprlib.Repr` that never sorts a whole dict or set, nor spells out a huge int."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 3, 80, 80

    def repr_dict(self, x: dict[object, object], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [
            f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
            for k, v in itertools.islice(x.items(), self.maxdict)
        ]
        return "{" + ", ".join(items) + (", ...}" if len(x) > self.maxdict else "}")

    def repr_set(self, x: set[object] | frozenset[object], level: int) -> str:
        if not x:
            return f"{type(x).__name__}()"
        if level <= 0:
            return "{...}"
        items = [self.repr1(v, level - 1) for v in itertools.islice(x, self.maxset)]
        return "{" + ", ".join(items) + (", ...}" if len(x) > self.maxset else "}")

    repr_frozenset = repr_set

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 4 * self.maxother:  # never build a repr of thousands of digits
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_SHORT = _Bounded()


def short_repr(x: object) -> str:
    """A bounded, one-line repr for messages: never recurses deep, never runs long.

    Examples
    --------
    >>> deep = []
    >>> for _ in range(40):
    ...     deep = [deep, deep]
    >>> short_repr(deep)
    '[[[[...], [...]], [[...], [...]]], [[[...], [...]], [[...], [...]]]]'
    """
    try:
        text = one_line(_SHORT.repr(x))
    except Exception:  # a value whose repr fails must not hide the real error
        return f"<{type(x).__name__}>"
    return text if len(text) <= MAX_REPR else text[: MAX_REPR - 3] + "..."


def error_line(exc: BaseException) -> str:
    """An exception as one bounded, printable line: its message's first line, or its name.

    An exception's own `str` reprs its arguments (a KeyError of a value from a file), so
    arguments that are not plain scalars are named by `short_repr` instead.
    """
    args = exc.args
    if all(type(a) in _SCALARS for a in args):
        try:
            text = str(exc)
        except Exception:  # a broken __str__: the name alone
            text = ""
    else:
        text = ", ".join(map(short_repr, args[:3]))
    text = text.strip().split("\n")[0]  # not at a CR: a file name may hold one
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 1] + "…"
    return one_line(text) if text else type(exc).__name__
