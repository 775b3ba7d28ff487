"""The pickle guard: a restricted unpickler for snapshot files from strangers.

`pickle.load` runs whatever a file asks for. Here the C unpickler accepts only the plain types
a snapshot holds and refuses every global. Before it runs, an opcode pre-scan (`opscan`)
refuses what CPython's unpickler would act on before checking it (memo indices and declared
lengths that allocate gigabytes, globals by extension code) and sets; while it runs, it is fed
in chunks with a memory guard between them (`budget`); after it, the plain-data walk (`walk`)
checks types, depth and cycles, each container once.
"""

from __future__ import annotations

import pickle
from typing import Any

from gpumemviz.io.budget import MemoryGuard
from gpumemviz.io.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, check_size
from gpumemviz.io.opscan import scan_pickle
from gpumemviz.io.walk import check_plain
from gpumemviz.snapshot import SnapshotError
from gpumemviz.snapshot.escaping import one_line
from gpumemviz.snapshot.gc_pause import no_gc


class _RestrictedUnpickler(pickle.Unpickler):
    """The C unpickler, with every global refused: only plain data can be built."""

    def find_class(self, module: str, name: str) -> Any:  # pickle.Unpickler's signature
        raise SnapshotError(
            f"refused global {one_line(module)}.{one_line(name)}: snapshot files hold only "
            "plain data (this file may be malicious)"
        )

    def persistent_load(self, pid: Any) -> Any:  # pickle.Unpickler's signature
        raise SnapshotError("refused persistent id: snapshot files hold only plain data")


_CHUNK = 64 << 10
"""Bytes the unpickler parses between two guard checks (at most ~5 MB built from them)."""


class _Stream:
    """The pickle as the C unpickler reads it: FRAME opcodes cut out, in chunks of `_CHUNK`
    bytes, the memory guard checked before each.

    With a `peek` method the C unpickler asks for data in chunks and parses each front to
    back, as `pickle.loads` parses its buffer (which `scan_pickle` models). A FRAME would make
    it take a whole frame at once (a hostile file is one frame) and, if an opcode's argument
    ran past the frame's end, read it from the bytes after the frame instead (fuzz: an 8 KiB
    file whose LONG_BINPUT index became 0x58280000 that way, 22 GiB); frames only group bytes,
    so without them the parse is `pickle.loads`' parse.
    """

    def __init__(self, data: bytes, frames: list[tuple[int, int]], guard: MemoryGuard) -> None:
        self._data = data
        self._view = memoryview(data)
        self._spans: list[tuple[int, int]] = []  # the bytes kept, in order
        p = 0
        for start, end in frames:
            self._spans.append((p, start))
            p = end
        self._spans.append((p, len(data)))
        self._left = sum(end - start for start, end in self._spans)
        self._i, self._p = 0, 0  # the current span, the position in the data
        self._guard = guard

    def _take(self, n: int, advance: bool) -> bytes | memoryview:
        """The next `n` bytes (fewer at the end), FRAME opcodes left out: a view of the data
        where they lie in one span (the unpickler reads any buffer; a copy would double what a
        small file costs to load), else a copy joining the spans."""
        out = []
        i, p, n = self._i, self._p, min(n, self._left)
        taken = n
        while n > 0:
            end = self._spans[i][1]
            k = min(n, end - p)
            out.append(self._view[p : p + k])
            p, n = p + k, n - k
            if p >= end and i + 1 < len(self._spans):
                i += 1
                p = self._spans[i][0]
        if advance:
            self._i, self._p, self._left = i, p, self._left - taken
        return out[0] if len(out) == 1 else b"".join(out)

    def peek(self, n: int = 0) -> bytes | memoryview:
        self._guard.check()
        return self._take(max(n, _CHUNK), advance=False)

    def read(self, n: int = -1) -> bytes | memoryview:
        self._guard.check()
        return self._take(self._left if n is None or n < 0 else n, advance=True)

    def readinto(self, buf: Any) -> int:  # Any: a writable buffer
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    def readline(self) -> bytes | memoryview:
        self._guard.check()
        i, p, n = self._i, self._p, 0
        while True:
            end = self._spans[i][1]
            nl = self._data.find(b"\n", p, end)
            if nl >= 0:
                return self._take(n + nl + 1 - p, advance=True)
            n += end - p
            if i + 1 >= len(self._spans):
                return self._take(n, advance=True)
            i += 1
            p = self._spans[i][0]


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
        Refuse larger input. Memory stays within `budget.guard_limit` of its size (10x plus
        48 MiB): a pickle that builds more is refused as it goes.
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
    frames = scan_pickle(data)
    with MemoryGuard(len(data)) as guard:
        try:
            with no_gc():
                # typeshed wants bytes from read(); the C unpickler takes any buffer (views)
                stream: Any = _Stream(data, frames, guard)
                obj = _RestrictedUnpickler(stream).load()
        except SnapshotError:
            raise
        except (pickle.UnpicklingError, EOFError) as e:
            raise SnapshotError(
                f"truncated or corrupt pickle ({one_line(str(e)) or 'unexpected end of data'})"
            ) from None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:
            raise SnapshotError(
                f"corrupt pickle ({type(e).__name__}: {one_line(str(e))})"
            ) from None
        except MemoryError:
            raise SnapshotError("pickle needs more memory than is available") from None
        check_plain(obj, max_depth=max_depth, guard=guard)
    return obj
