"""Snapshot files: load one (pickle or JSON, told apart by content, fully validated; from a
path, a pipe, bytes or standard input), coerce what public functions accept into a `Snapshot`,
and save one atomically.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from gpumemviz.io.atomic import atomic_write
from gpumemviz.io.budget import MemoryGuard, check_json
from gpumemviz.io.json_text import check_json_size
from gpumemviz.io.json_text import dumps as json_dumps
from gpumemviz.io.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, check_size
from gpumemviz.io.unpickle import loads_restricted
from gpumemviz.io.walk import check_plain
from gpumemviz.snapshot import Snapshot, SnapshotError, validate
from gpumemviz.snapshot.escaping import one_line, short_repr, type_phrase
from gpumemviz.snapshot.gc_pause import no_gc
from gpumemviz.snapshot.schema import TorchDict, TorchList
from gpumemviz.snapshot.units import format_size


def _loads_json(data: bytes, max_bytes: int, max_depth: int) -> Any:  # Any: JSON of any shape
    check_size(len(data), max_bytes, "JSON")
    check_json(data)
    with MemoryGuard(len(data), "JSON") as guard:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SnapshotError(f"JSON is not UTF-8 (byte {e.start})") from None
        try:
            with no_gc():
                obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise SnapshotError(
                f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
            ) from None
        except RecursionError:
            raise SnapshotError(
                f"data nested deeper than {max_depth} levels (max_depth={max_depth})"
            ) from None
        except ValueError as e:  # an integer of more digits than int() converts (4300)
            raise SnapshotError(f"invalid JSON ({one_line(str(e))})") from None
        del text
        check_plain(obj, max_depth=max_depth, guard=guard)
    return obj


def _decode(data: bytes, max_bytes: int, max_depth: int) -> Any:  # Any: plain data, unchecked
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
        raise SnapshotError(
            f"not a pickle or JSON snapshot (starts with {short_repr(data[:16])})"
        ) from None


def _read(path: Path, max_bytes: int) -> bytes:
    try:
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(st.st_mode):  # a pipe, /dev/stdin, a device: read to its end
            with path.open("rb") as f:
                return read_stream(f, max_bytes, str(path))
        check_size(st.st_size, max_bytes, f"{path}")
        with path.open("rb") as f:
            return f.read(min(st.st_size, max_bytes) + 1)  # +1: a file that grew shows as too big
    except FileNotFoundError:
        raise SnapshotError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise SnapshotError(f"{path} is a folder, not a snapshot file") from None
    except PermissionError:
        raise SnapshotError(f"cannot read {path}: permission denied") from None


SnapshotLike = Snapshot | TorchDict | TorchList | str | os.PathLike[str] | bytes
"""What the public functions take for a snapshot (`as_snapshot`): a `Snapshot`, a torch dict or
segment list, a file path, or a file's bytes."""


#: What a snapshot's first byte can be: JSON's opening, whitespace, or a pickle opcode.
_FIRST_BYTES = frozenset(b"{[ \t\r\n") | {
    ord(op.code.encode("latin-1")) for op in pickletools.opcodes
}


def read_stream(f: BinaryIO, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "input") -> bytes:
    """All of a binary stream (a pipe, standard input), refused once past `max_bytes`.

    A stream whose first byte no snapshot starts with (/dev/zero) is read no further: what was
    read is returned, for the loader to say what it is.

    Examples
    --------
    >>> import io
    >>> read_stream(io.BytesIO(b"abc"))
    b'abc'
    """
    chunks: list[bytes] = []
    n = 0
    while True:
        chunk = f.read(min(1 << 20, max_bytes + 1 - n))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        n += len(chunk)
        if n > max_bytes:
            raise SnapshotError(
                f"{what} is over the {format_size(max_bytes)} limit (max_bytes={max_bytes})"
            )
        if n == len(chunk) and chunk[0] not in _FIRST_BYTES:
            return chunk


def read_input(name: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """A command-line FILE argument's bytes: ``-`` is standard input, read to its end.

    Paths go through the same reader as `load_snapshot`, so a pipe such as /dev/stdin is read
    whole too.
    """
    if os.fspath(name) == "-":
        return read_stream(sys.stdin.buffer, max_bytes, "standard input")
    return _read(Path(name), max_bytes)


def load_snapshot(
    src: SnapshotLike,
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
    try:
        with no_gc(promote_built=True):  # what stays (the Snapshot) made old at once
            if isinstance(src, dict | list):
                obj = src
            elif isinstance(src, str | os.PathLike):
                obj = _decode(_read(Path(src), max_bytes), max_bytes, max_depth)
            else:
                obj = _decode(bytes(src), max_bytes, max_depth)
            snap = Snapshot.from_torch(obj)
            del obj
        validate(snap)
    except SnapshotError:
        raise
    except MemoryError:
        raise SnapshotError("the snapshot needs more memory than is available") from None
    except Exception as e:  # any failure is one line: this one is a gpumemviz bug
        raise SnapshotError(
            f"cannot read this snapshot: internal error {type(e).__name__}: "
            f"{one_line(str(e))[:200]} (please report it)"
        ) from e
    return snap


def as_snapshot(x: SnapshotLike) -> Snapshot:
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


def save_snapshot(
    snapshot: SnapshotLike, path: str | os.PathLike[str], *, force: bool = False
) -> Path:
    """Write a snapshot atomically: pickle protocol 4, or JSON when the name ends in ``.json``.

    Protocol 4 because MemoryViz.js's own unpickler reads protocols 2-4 only ("Unhandled version
    5"). The data goes to a temporary file in the same folder, is fsynced and then renamed over
    `path`, so an error leaves the old file intact and no partial file behind.

    Parameters
    ----------
    snapshot : Snapshot, torch dict or list, path or bytes
        Anything `as_snapshot` accepts.
    path : str or PathLike
        Where to write; ``"-"`` is standard output, a symlink is written through (see
        `gpumemviz.io.atomic_write`).
    force : bool
        Replace a read-only file (refused otherwise).

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
    return write_torch(as_snapshot(snapshot).to_torch(), path, format=fmt, force=force)


def write_torch(
    data: TorchDict | TorchList,
    path: str | os.PathLike[str],
    *,
    format: str = "pickle",
    force: bool = False,
) -> Path:
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
    force : bool
        Replace a read-only file (refused otherwise).

    Returns
    -------
    Path
        The path written.
    """
    if format == "json":
        writer: Callable[[object, BinaryIO], None] = _write_json
    elif format == "pickle":
        writer = _write_pickle
    else:
        raise ValueError(f"unknown format {short_repr(format)}: expected 'pickle' or 'json'")
    path = Path(path)
    atomic_write(path, lambda f: writer(data, f), force=force)
    return path


def _write_pickle(data: object, f: BinaryIO) -> None:
    pickle.dump(data, f, protocol=4)


def _write_json(data: object, f: BinaryIO) -> None:
    check_json_size(data)  # shared frames expand in JSON: refuse gigabytes before writing
    try:
        text = json_dumps(data, compact=True)  # NaN and infinity as null
    except (TypeError, ValueError) as e:
        raise SnapshotError(f"cannot write JSON: {e} (save as .pickle instead)") from None
    f.write(text.encode("utf-8"))
