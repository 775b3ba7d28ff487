"""Reading and writing snapshot files, safely.

Snapshot files come from strangers, and `pickle.load` runs whatever a file asks for. Here a
restricted unpickler accepts only the plain types a snapshot holds and refuses every global;
size and nesting limits stop a hostile file from exhausting memory or recursion. Writes are
atomic (temp file in the same folder, fsync, rename), so a crash never leaves half a file.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import operator
import os
import pickle
import pickletools
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .snapshot import Snapshot, SnapshotError, no_gc, one_line, type_phrase, validate
from .units import format_size

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "as_snapshot",
    "atomic_write",
    "check_plain",
    "load_snapshot",
    "loads_restricted",
    "save_snapshot",
    "scan_pickle",
    "validate",
    "write_torch",
]

DEFAULT_MAX_BYTES = 4 << 30
"""Largest file `load_snapshot` reads (4 GiB); Chrome already fails on 1 GB snapshots."""
DEFAULT_MAX_DEPTH = 64
"""Deepest nesting of containers accepted; a torch snapshot is about 9 levels deep."""

_PLAIN = frozenset({dict, list, tuple, str, int, float, bool, type(None), bytes})
_CONTAINERS = frozenset({dict, list, tuple})
_SAMPLE = 4096  # items looked at to decide whether a level is mostly shared references
_KEY_TYPES = frozenset({str, int, float, bool, type(None), bytes})


class _RestrictedUnpickler(pickle.Unpickler):
    """The C unpickler, with every global refused: only plain data can be built."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"refused global {one_line(module)}.{one_line(name)}: snapshot files hold only "
            "plain data (this file may be malicious)"
        )

    def persistent_load(self, pid: Any) -> Any:
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

    def readinto(self, buf: Any) -> int:
        return 0


def loads_restricted(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH
) -> Any:
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
    _check_size(len(data), max_bytes, "pickle")
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


def check_plain(obj: Any, *, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Raise `SnapshotError` if `obj` holds anything but plain types or nests too deep.

    Walks level by level with C-level passes, never recursing, and visits each container once
    per level, so a small file of shared references cannot blow the walk up (and the frames
    that real pickles share are walked once). Cycles hit the depth limit.
    """
    if type(obj) not in _PLAIN:
        raise SnapshotError(f"a value of type {type(obj).__name__} (only plain data allowed)")
    if type(obj) not in _CONTAINERS:
        return  # a lone scalar: plain (`Snapshot.from_torch` says it is not a snapshot)
    level, kinds = [obj], [type(obj)]
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            raise SnapshotError(
                f"data nested deeper than {max_depth} levels (max_depth={max_depth}); "
                "a snapshot is about 9 levels deep"
            )
        is_dict = list(map(operator.is_, kinds, itertools.repeat(dict)))
        dicts = list(itertools.compress(level, is_dict))
        seqs = itertools.compress(level, map(operator.not_, is_dict))
        keys = set(itertools.chain.from_iterable(dicts))  # few distinct keys: cheaper than types
        bad_keys = set(map(type, keys)) - _KEY_TYPES
        if bad_keys:
            raise SnapshotError(f"a dict key of type {_names(bad_keys)} (only plain data allowed)")
        items = list(itertools.chain.from_iterable(itertools.chain(map(dict.values, dicts), seqs)))
        sample = items[:: max(1, len(items) // _SAMPLE)]
        if len(items) > _SAMPLE and len(set(map(id, sample))) < len(sample) // 2:
            # mostly references to a few shared objects (frames in real pickles: 700k
            # references to 800 dicts): check each object once
            items = list(dict(zip(map(id, items), items, strict=True)).values())
        types = set(map(type, items))
        if types - _PLAIN:
            raise SnapshotError(
                f"a value of type {_names(types - _PLAIN)} (only plain data allowed)"
            )
        if types & _CONTAINERS:
            mask = map(_CONTAINERS.__contains__, map(type, items))
            level = _unique(list(itertools.compress(items, mask)))
            kinds = list(map(type, level))
        else:
            level, kinds = [], []


def _unique(objs: list) -> list:
    """`objs` without repeats (by identity), in C: pickles share frames lists heavily."""
    if len(objs) < 2:
        return objs
    ids = np.fromiter(map(id, objs), np.uint64, len(objs))
    _, first = np.unique(ids, return_index=True)
    if len(first) == len(objs):
        return objs
    first.sort()
    return list(map(objs.__getitem__, first.tolist()))


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


def _names(types: set[type]) -> str:
    return ", ".join(sorted(t.__name__ for t in types))


def _check_size(n: int, max_bytes: int, what: str) -> None:
    if n > max_bytes:
        raise SnapshotError(
            f"{what} is {format_size(n)}, over the {format_size(max_bytes)} limit "
            f"(max_bytes={max_bytes})"
        )


def _loads_json(data: bytes, max_bytes: int, max_depth: int) -> Any:
    _check_size(len(data), max_bytes, "JSON")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SnapshotError(f"JSON is not UTF-8 (byte {e.start})") from None
    try:
        with no_gc():
            obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SnapshotError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise SnapshotError(
            f"data nested deeper than {max_depth} levels (max_depth={max_depth})"
        ) from None
    check_plain(obj, max_depth=max_depth)
    return obj


def _decode(data: bytes, max_bytes: int, max_depth: int) -> Any:
    """Pickle or JSON, told apart by content: a file's name says nothing reliable."""
    head = data[:64].lstrip()
    if not head:
        raise SnapshotError("empty input: no snapshot to read")
    if head[:1] in (b"{", b"["):
        return _loads_json(data, max_bytes, max_depth)
    try:
        return loads_restricted(data, max_bytes=max_bytes, max_depth=max_depth)
    except SnapshotError as e:
        # A file not starting like a modern pickle is probably text: scanned as opcodes, text
        # often looks like a memo bomb ("error" holds LONG_BINPUT "ror..."), so say what it is.
        if data[:1] == b"\x80" or not str(e).startswith(("truncated or corrupt", "corrupt")):
            raise
        raise SnapshotError(f"not a pickle or JSON snapshot (starts with {data[:16]!r})") from None


def _read(path: Path, max_bytes: int) -> bytes:
    try:
        size = path.stat().st_size
        _check_size(size, max_bytes, f"{path}")
        with path.open("rb") as f:
            return f.read(min(size, max_bytes) + 1)  # +1: a file that grew shows as too big
    except FileNotFoundError:
        raise SnapshotError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise SnapshotError(f"{path} is a folder, not a snapshot file") from None
    except PermissionError:
        raise SnapshotError(f"cannot read {path}: permission denied") from None


def load_snapshot(
    src: str | os.PathLike | bytes | dict | list | Snapshot,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Snapshot:
    """Load and fully validate a snapshot from a file, bytes, a torch dict or list.

    Files are pickle (any protocol, restricted to plain data) or JSON, recognised by content:
    ``.pkl``, ``.pickle``, ``.json`` and no suffix all work.

    Parameters
    ----------
    src : path, bytes, dict, list or Snapshot
        What to read. A `Snapshot` is returned as it is.
    max_bytes : int
        Largest file or byte string accepted (default 4 GiB).
    max_depth : int
        Deepest nesting of containers accepted (default 64).

    Returns
    -------
    Snapshot

    Raises
    ------
    SnapshotError
        With a one-line message saying what is wrong and where.

    Examples
    --------
    >>> snap = load_snapshot({"segments": [], "device_traces": [[]]})
    >>> snap.n_segments, snap.to_torch()
    (0, {'segments': [], 'device_traces': [[]]})
    """
    if isinstance(src, Snapshot):
        return src
    if not isinstance(src, bytes | bytearray | memoryview | str | os.PathLike | dict | list):
        raise SnapshotError(
            f"cannot load a snapshot from {type_phrase(src)} "
            "(expected a path, bytes, a torch snapshot dict or list, or a Snapshot)"
        )
    # The GC stays off until the decoded objects are gone: they die by reference counting, so
    # the collector never scans them (that scan costs ~0.5 s per 10^7 objects).
    with no_gc():
        if isinstance(src, dict | list):
            obj = src
        elif isinstance(src, str | os.PathLike):
            obj = _decode(_read(Path(src), max_bytes), max_bytes, max_depth)
        else:
            obj = _decode(bytes(src), max_bytes, max_depth)
        snap = Snapshot.from_torch(obj)
        del obj
    validate(snap)
    return snap


def as_snapshot(x: Any) -> Snapshot:
    """The coercion every public function uses: Snapshot, torch dict/list, path or bytes.

    Dicts and lists are only converted (fast; `validate` is left to `load_snapshot`), paths
    and bytes are loaded with full validation.

    Examples
    --------
    >>> as_snapshot([]).n_segments
    0
    """
    if isinstance(x, Snapshot):
        return x
    if isinstance(x, dict | list):
        return Snapshot.from_torch(x)
    return load_snapshot(x)


def save_snapshot(snapshot: Any, path: str | os.PathLike) -> Path:
    """Write a snapshot atomically: pickle protocol 4, or JSON when the name ends in ``.json``.

    Protocol 4 because MemoryViz.js's own unpickler reads protocols 2-4 only ("Unhandled version
    5"). The data goes to a temporary file in the same folder, is fsynced and then renamed over
    `path`, so an error leaves the old file intact and no partial file behind.

    Parameters
    ----------
    snapshot : Snapshot, torch dict or list, path or bytes
        Anything `as_snapshot` accepts.
    path : str or PathLike
        Where to write.

    Returns
    -------
    Path
        The path written.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = save_snapshot([], pathlib.Path(d) / "empty.json")
    ...     p.read_text()
    '{"segments":[],"device_traces":[]}'
    """
    path = Path(path)
    fmt = "json" if path.suffix.lower() == ".json" else "pickle"
    return write_torch(as_snapshot(snapshot).to_torch(), path, format=fmt)


def write_torch(data: dict | list, path: str | os.PathLike, *, format: str = "pickle") -> Path:
    """Write plain snapshot data (a torch dict) atomically as protocol-4 pickle or JSON.

    The writer behind `save_snapshot` and `gpumemviz.export`, for data already in torch's
    shape (e.g. redacted). Same guarantees: temp file, fsync, rename; nothing partial left.

    Parameters
    ----------
    data : dict or list
        Plain data (what `Snapshot.to_torch()` returns).
    path : str or PathLike
        Where to write.
    format : {"pickle", "json"}
        Protocol-4 pickle, or compact JSON (tuples become lists; `load_snapshot` restores them).

    Returns
    -------
    Path
        The path written.
    """
    if format == "json":
        writer: Callable[[Any, BinaryIO], None] = _write_json
    elif format == "pickle":
        writer = _write_pickle
    else:
        raise ValueError(f"unknown format {format!r}: expected 'pickle' or 'json'")
    path = Path(path)
    atomic_write(path, lambda f: writer(data, f))
    return path


def _write_error(e: OSError, path: Path, where: str = "") -> OSError:
    """`e` reworded as ``cannot write PATH: [where: ]reason``, one line, same class and errno."""
    reason = e.strerror or (str(e).splitlines()[0] if str(e) else type(e).__name__)
    msg = f"cannot write {path}: {where + ': ' if where else ''}{reason}"
    try:
        err = type(e)(msg)
    except TypeError:  # a subclass with its own constructor
        err = OSError(msg)
    err.errno = e.errno
    return err


def _write_pickle(data: Any, f: BinaryIO) -> None:
    pickle.dump(data, f, protocol=4)


def _write_json(data: Any, f: BinaryIO) -> None:
    try:
        text = json.dumps(data, separators=(",", ":"), allow_nan=True)
    except TypeError as e:
        raise SnapshotError(f"cannot write JSON: {e} (save as .pickle instead)") from None
    f.write(text.encode("utf-8"))


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call `write(f)` on a temp file beside `path`, fsync it, then rename it over `path`.

    An exception (from `write` or the OS) leaves the old file as it was and no temp file; the
    old file's permission bits are kept. Every file gpumemviz writes goes through here. An OS
    error says ``cannot write PATH: reason`` in one line, naming the target, never the temp
    file the user did not ask for (same exception class and errno).
    """
    path = Path(path)
    folder = path.parent
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise _write_error(e, path, f"folder {folder}") from None
    tmp = Path(name)
    in_write = False
    try:
        with os.fdopen(fd, "wb") as f:
            in_write = True
            write(f)
            in_write = False
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        tmp.chmod(mode)
        tmp.replace(path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        # The caller's own errors pass unchanged; the OS's (an errno, or our steps) name `path`.
        if isinstance(e, OSError) and (e.errno is not None or not in_write):
            raise _write_error(e, path) from None
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
