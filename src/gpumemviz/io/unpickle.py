"""The pickle guard: a restricted unpickler for snapshot files from strangers.

`pickle.load` runs whatever a file asks for. Here the C unpickler accepts only the plain types
a snapshot holds and refuses every global, and an opcode pre-scan first refuses what CPython's
unpickler would act on before checking it (memo indices and declared lengths that allocate
gigabytes, globals by extension code); `limits` bounds the size and the nesting.
"""

from __future__ import annotations

import pickle
import pickletools
import re
from typing import Any

from ..snapshot import SnapshotError
from ..snapshot.gc_pause import no_gc
from ..snapshot.messages import one_line
from ..units import format_size
from .limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, check_plain, check_size


class _RestrictedUnpickler(pickle.Unpickler):
    """The C unpickler, with every global refused: only plain data can be built."""

    def find_class(self, module: str, name: str) -> Any:  # pickle.Unpickler's signature
        raise SnapshotError(
            f"refused global {one_line(module)}.{one_line(name)}: snapshot files hold only "
            "plain data (this file may be malicious)"
        )

    def persistent_load(self, pid: Any) -> Any:  # pickle.Unpickler's signature
        raise SnapshotError("refused persistent id: snapshot files hold only plain data")


class _WholeInput:
    """A file whose first read hands the unpickler all of the data at once.

    The C unpickler then parses one buffer front to back, as `pickle.loads` does, which is
    what `scan_pickle` models. Through a `BytesIO` it would not: an opcode whose argument runs
    past the end of a FRAME makes it drop the frame's rest and read the argument from the bytes
    after the frame (fuzz: an 8 KiB file whose LONG_BINPUT index became 0x58280000 that way,
    22 GiB). Extra bytes from `read` stay in its buffer; later reads get nothing (truncated).
    """

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, n: int = -1) -> bytes:
        data, self._data = self._data, b""
        return data

    def readline(self) -> bytes:
        return self.read()

    def readinto(self, buf: Any) -> int:  # Any: a writable buffer
        return 0


def loads_restricted(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH
) -> Any:  # Any: plain data of any shape
    """Unpickle plain data (dict, list, tuple, str, int, float, bool, None, bytes) only.

    Any global (a class, a function such as ``posix.system``) is refused before it is looked
    up, so a malicious pickle runs nothing.

    Parameters
    ----------
    data : bytes
        The pickle.
    max_bytes : int
        Refuse larger input (memory stays within a small multiple of it).
    max_depth : int
        Refuse containers nested deeper than this (or cyclic ones).

    Returns
    -------
    The unpickled object.

    Raises
    ------
    SnapshotError
        On a refused global, a truncated or corrupt pickle, or a limit exceeded.

    Examples
    --------
    >>> loads_restricted(pickle.dumps({"segments": []}, protocol=4))
    {'segments': []}
    >>> try:
    ...     loads_restricted(b"cposix\\nsystem\\n(S'true'\\ntR.")
    ... except SnapshotError as e:
    ...     print(str(e).split(":")[0])
    refused global posix.system
    """
    check_size(len(data), max_bytes, "pickle")
    if not data:
        raise SnapshotError("empty input: no snapshot to read")
    scan_pickle(data)
    try:
        with no_gc():
            obj = _RestrictedUnpickler(_WholeInput(data)).load()
    except SnapshotError:
        raise
    except (pickle.UnpicklingError, EOFError) as e:
        raise SnapshotError(
            f"truncated or corrupt pickle ({one_line(str(e)) or 'unexpected end of data'})"
        ) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:
        raise SnapshotError(f"corrupt pickle ({type(e).__name__}: {one_line(str(e))})") from None
    except MemoryError:
        raise SnapshotError("pickle needs more memory than is available") from None
    check_plain(obj, max_depth=max_depth)
    return obj


# --- the opcode pre-scan ---------------------------------------------------------------------
# CPython's C unpickler trusts a few opcode arguments before it checks them: LONG_BINPUT/PUT
# resize the memo to twice the index (16 bytes per index, zeroed: a 9-byte file costs 256 MiB),
# BINBYTES/BINBYTES8/BYTEARRAY8 allocate their declared length before reading it, and EXT1/2/4
# take a global from copyreg's extension cache without asking `find_class`. So every pickle is
# walked opcode by opcode first, front to back as the unpickler reads it (see `_WholeInput`).
# Runs of fixed-size opcodes (nearly all of a real file) are matched by one regular expression,
# in C; Python looks only at the others (strings, the dangerous ones), which keeps the walk at
# 20-35 % of `load_snapshot` on the real files (benchmarks/snapshot_io.py, column scan).

_ARG_SIZE: list[int | None] = [None] * 256  # fixed argument size, or pickletools' negative kind
_OP_NAME: list[str] = [""] * 256
for _op in pickletools.opcodes:
    _c = ord(_op.code.encode("latin-1"))
    _OP_NAME[_c] = _op.name
    _ARG_SIZE[_c] = 0 if _op.arg is None else _op.arg.n
_STOP, _PUT, _LONG_BINPUT = ord("."), ord("p"), ord("r")
_GLOBAL, _INST = ord("c"), ord("i")
_EXT = frozenset({0x82, 0x83, 0x84})
_LINE = pickletools.UP_TO_NEWLINE
_LEN1, _LEN4, _LEN4U, _LEN8U = (
    pickletools.TAKEN_FROM_ARGUMENT1,
    pickletools.TAKEN_FROM_ARGUMENT4,
    pickletools.TAKEN_FROM_ARGUMENT4U,
    pickletools.TAKEN_FROM_ARGUMENT8U,
)


def _fixed_run() -> re.Pattern[bytes]:
    """A possessive regex over runs of harmless fixed-size opcodes (not STOP, PUTs, EXTs)."""
    by_size: dict[int, list[int]] = {}
    for c, n in enumerate(_ARG_SIZE):
        if n is not None and n >= 0 and c not in _EXT and c not in (_STOP, _LONG_BINPUT):
            by_size.setdefault(n, []).append(c)
    alts = [
        b"[" + b"".join(re.escape(bytes([c])) for c in codes) + b"]" + (b".{%d}" % n if n else b"")
        for n, codes in sorted(by_size.items())
    ]
    return re.compile(b"(?:" + b"|".join(alts) + b")*+", re.DOTALL)


_FIXED_RUN = _fixed_run()


def scan_pickle(data: bytes) -> None:
    """Refuse the opcodes CPython's unpickler would act on before checking them.

    Walks the pickle as the unpickler will (up to STOP, or the first unknown opcode, where the
    unpickler stops too) and raises `SnapshotError` on an EXT1/EXT2/EXT4 opcode (a global by
    number: refused like any global), a memo index beyond the file's size (a real pickle's
    indices stay below its opcode count), or a declared length beyond the remaining bytes.
    """
    n = len(data)
    p = 0
    run = _FIXED_RUN.match
    while p < n:
        p = run(data, p).end()  # type: ignore[union-attr]  # `*+` always matches
        if p >= n:
            return
        c = data[p]
        kind = _ARG_SIZE[c]
        if kind is None or c == _STOP:
            return
        if c in _EXT:
            raise SnapshotError(
                f"refused global by extension code ({_OP_NAME[c]} at byte {p}): snapshot files "
                "hold only plain data (this file may be malicious)"
            )
        if c == _LONG_BINPUT:
            _check_memo(int.from_bytes(data[p + 1 : p + 5], "little"), p, n)
            p += 5
        elif kind == _LEN1:
            p += 2 + data[p + 1] if p + 1 < n else 1
        elif kind in (_LEN4, _LEN4U, _LEN8U):
            width = 8 if kind == _LEN8U else 4
            length = int.from_bytes(data[p + 1 : p + 1 + width], "little", signed=kind == _LEN4)
            start = p + 1 + width
            if length > n - start:
                raise SnapshotError(
                    f"truncated or corrupt pickle ({_OP_NAME[c]} at byte {p} declares "
                    f"{length} bytes ({format_size(length)}), but only {max(n - start, 0)} follow)"
                )
            p = start + max(length, 0)
        elif kind == _LINE:
            end = data.find(b"\n", p + 1)
            if end >= 0 and c in (_GLOBAL, _INST):
                end = data.find(b"\n", end + 1)
            if end < 0:
                return
            if c == _PUT:
                _check_memo(_decimal(data[p + 1 : end]), p, n)
            p = end + 1
        else:  # pragma: no cover - every other kind has a fixed size and was matched above
            return


def _decimal(text: bytes) -> int:
    """A PUT index parsed as the unpickler does (signs, spaces, underscores); -1 if none."""
    try:
        return int(text)
    except ValueError:  # not a number: the unpickler stops there
        return -1


def _check_memo(index: int, p: int, n: int) -> None:
    if index > n:
        raise SnapshotError(
            f"corrupt pickle (memo index {index} at byte {p} is beyond what a {n}-byte pickle "
            "can hold; the unpickler would allocate memory for every index below it)"
        )
