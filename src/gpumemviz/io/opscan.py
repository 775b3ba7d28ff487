"""The opcode pre-scan: what CPython's unpickler would act on before checking it, refused
before anything is built.

CPython's C unpickler trusts a few opcode arguments before it checks them: LONG_BINPUT/PUT
resize the memo to twice the index (16 bytes per index, zeroed: a 9-byte file costs 256 MiB),
BINBYTES/BINBYTES8/BYTEARRAY8 allocate their declared length before reading it, and EXT1/2/4
take a global from copyreg's extension cache without asking `find_class`. Sets and frozensets
(EMPTY_SET, ADDITEMS, FROZENSET) are no part of a snapshot and the costliest objects one byte
can build (216 bytes each), so they are refused here too, and so is BYTEARRAY8: what passes
the scan builds plain data only (the walk relies on it). So every pickle is walked opcode by
opcode first, front to back as the unpickler reads it (`unpickle._Stream`), and the scan also
returns where the FRAME opcodes are, which the unpickler is then fed without.

Runs of fixed-size opcodes (nearly all of a real file) are matched by one regular expression,
in C; Python looks only at the others (strings, frames, the dangerous ones), which keeps the
scan at a few % of `load_snapshot` on the real files (benchmarks/snapshot_io.py, column scan).
"""

from __future__ import annotations

import pickletools
import re

from gpumemviz.snapshot import SnapshotError
from gpumemviz.snapshot.units import format_size

_ARG_SIZE: list[int | None] = [None] * 256  # fixed argument size, or pickletools' negative kind
_OP_NAME: list[str] = [""] * 256
for _op in pickletools.opcodes:
    _c = ord(_op.code.encode("latin-1"))
    _OP_NAME[_c] = _op.name
    _ARG_SIZE[_c] = 0 if _op.arg is None else _op.arg.n
_STOP, _PUT, _LONG_BINPUT, _FRAME = ord("."), ord("p"), ord("r"), 0x95
_GLOBAL, _INST = ord("c"), ord("i")
_EXT = frozenset({0x82, 0x83, 0x84})
#: EMPTY_SET, ADDITEMS, FROZENSET -> the type they build
_SETS = {0x8F: "set", 0x90: "set", 0x91: "frozenset"}
_STOPPERS = frozenset({_STOP, _LONG_BINPUT, _FRAME, *_EXT, *_SETS})
_LINE = pickletools.UP_TO_NEWLINE
_LEN1, _LEN4, _LEN4U, _LEN8U = (
    pickletools.TAKEN_FROM_ARGUMENT1,
    pickletools.TAKEN_FROM_ARGUMENT4,
    pickletools.TAKEN_FROM_ARGUMENT4U,
    pickletools.TAKEN_FROM_ARGUMENT8U,
)


#: The commonest opcodes of real snapshot pickles, most frequent first (BINGET, LONG_BINGET,
#: MEMOIZE, MARK, EMPTY_DICT, SETITEMS, BININT1, BININT): tried one by one before the rest,
#: as single bytes, which the regex engine tests faster than a class (the scan: -25 %).
_COMMON = b"hj\x94(}uKJ"
_LONG1, _SHORT_BINUNICODE, _BYTEARRAY8 = 0x8A, 0x8C, 0x96


def _fixed_run() -> re.Pattern[bytes]:
    """A possessive regex over runs of harmless fixed-size opcodes (not STOP, LONG_BINPUT,
    FRAME, EXTs or sets), and of LONG1 with up to 8 bytes (a 64-bit int: addresses, sizes)
    and SHORT_BINUNICODE with up to 64 (names, file names), which the loop would otherwise
    take one at a time."""
    alts = [re.escape(bytes([c])) + _any(_ARG_SIZE[c] or 0) for c in _COMMON]
    for op, most in ((_LONG1, 8), (_SHORT_BINUNICODE, 64)):
        lengths = (re.escape(bytes([k])) + _any(k) for k in range(most + 1))
        alts.append(re.escape(bytes([op])) + b"(?:" + b"|".join(lengths) + b")")
    by_size: dict[int, list[int]] = {}
    for c, n in enumerate(_ARG_SIZE):
        if n is not None and n >= 0 and c not in _STOPPERS and c not in _COMMON:
            by_size.setdefault(n, []).append(c)
    alts += [
        b"[" + b"".join(re.escape(bytes([c])) for c in codes) + b"]" + _any(n)
        for n, codes in sorted(by_size.items())
    ]
    return re.compile(b"(?:" + b"|".join(alts) + b")*+", re.DOTALL)


def _any(n: int) -> bytes:
    """`n` bytes of argument, as `n` dots: the engine steps over those faster than over `.{n}`
    (a repeat), 5-10 % of the scan."""
    return b"." * n


_FIXED_RUN = _fixed_run()


def scan_pickle(data: bytes) -> list[tuple[int, int]]:
    """Refuse the opcodes CPython's unpickler would act on before checking them; return where
    the FRAME opcodes are, as (start, end) byte ranges.

    Walks the pickle as the unpickler will (up to STOP, or the first unknown opcode, where the
    unpickler stops too) and raises `SnapshotError` on an EXT1/EXT2/EXT4 opcode (a global by
    number: refused like any global), a set or frozenset, a memo index beyond half the file's
    size (a real pickle spends at least two bytes per memo entry), or a declared length
    (FRAME's included) beyond the remaining bytes.
    """
    n = len(data)
    p = 0
    frames: list[tuple[int, int]] = []
    run = _FIXED_RUN.match
    while p < n:
        p = run(data, p).end()  # type: ignore[union-attr]  # `*+` always matches
        if p >= n:
            return frames
        c = data[p]
        kind = _ARG_SIZE[c]
        if kind is None or c == _STOP:
            return frames
        if c in _EXT:
            raise SnapshotError(
                f"refused global by extension code ({_OP_NAME[c]} at byte {p}): snapshot files "
                "hold only plain data (this file may be malicious)"
            )
        if c in _SETS:
            raise SnapshotError(
                f"a value of type {_SETS[c]} ({_OP_NAME[c]} at byte {p}; only plain data "
                "allowed: a snapshot holds no sets)"
            )
        if c == _LONG_BINPUT:
            _check_memo(int.from_bytes(data[p + 1 : p + 5], "little"), p, n)
            p += 5
        elif c == _FRAME:
            length = int.from_bytes(data[p + 1 : p + 9], "little")
            _check_length(c, p, length, n - p - 9)
            frames.append((p, p + 9))
            p += 9
        elif kind == _LEN1:
            p += 2 + data[p + 1] if p + 1 < n else 1
        elif kind in (_LEN4, _LEN4U, _LEN8U):
            width = 8 if kind == _LEN8U else 4
            length = int.from_bytes(data[p + 1 : p + 1 + width], "little", signed=kind == _LEN4)
            start = p + 1 + width
            _check_length(c, p, length, n - start)
            if c == _BYTEARRAY8:
                raise SnapshotError(
                    f"a value of type bytearray (BYTEARRAY8 at byte {p}; only plain data allowed)"
                )
            p = start + max(length, 0)
        elif kind == _LINE:
            end = data.find(b"\n", p + 1)
            if end >= 0 and c in (_GLOBAL, _INST):
                end = data.find(b"\n", end + 1)
            if end < 0:
                return frames
            if c == _PUT:
                _check_memo(_decimal(data[p + 1 : end]), p, n)
            p = end + 1
        else:  # pragma: no cover - every other kind has a fixed size and was matched above
            return frames
    return frames


def _check_length(c: int, p: int, length: int, left: int) -> None:
    if length > left:
        raise SnapshotError(
            f"truncated or corrupt pickle ({_OP_NAME[c]} at byte {p} declares "
            f"{length} bytes ({format_size(length)}), but only {max(left, 0)} follow)"
        )


def _decimal(text: bytes) -> int:
    """A PUT index parsed as the unpickler does (signs, spaces, underscores); -1 if none."""
    try:
        return int(text)
    except ValueError:  # not a number: the unpickler stops there
        return -1


def _check_memo(index: int, p: int, n: int) -> None:
    if index > n // 2:
        raise SnapshotError(
            f"corrupt pickle (memo index {index} at byte {p} is beyond what a {n}-byte pickle "
            "can hold; the unpickler would allocate memory for every index below it)"
        )
