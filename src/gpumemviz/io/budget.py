"""How much memory reading a snapshot may take, and the gauge that holds a load to it.

A pickle of one-byte opcodes can build an object of 50-200 bytes per byte (8 MB of EMPTY_DICT
is half a million dicts per MB); JSON of empty lists 20x its size. A snapshot needs far less:
real pickles 3-13x their size, gpumemviz's JSON 4-5x. Loading may take at most `LOAD_FACTOR`
times the input's size plus `LOAD_SLACK` (12x + 64 MiB). Decoding and the plain-data walk are
held to `GUARD_FACTOR` x + `GUARD_SLACK` (10x + 48 MiB), which leaves the rest for building
the Snapshot from what they decoded.

The pickle is fed to the C unpickler in chunks (`unpickle.py`), and between chunks a
`MemoryGuard` reads a gauge: tracemalloc's traced memory when it is tracing (the tests measure
with it), else the process's resident set on Linux (/proc/self/statm), else its peak resident
set (getrusage), which only grows and so never refuses early; where there is none (Windows)
only the opcode scan's refusals hold. The resident set counts every thread, so a load running
beside another thread that allocates hundreds of MB at the same moment may be refused: the
message says so. JSON cannot be fed in chunks; `json_estimate` bounds what `json.loads` builds,
before it runs, from C-level counts of its punctuation and of its distinct keys (gathered only
where the punctuation alone does not settle it: 0.5 s per 100 MB).
"""

from __future__ import annotations

import os
import re
import sys
import tracemalloc
from collections.abc import Callable
from types import TracebackType

from gpumemviz.snapshot import SnapshotError
from gpumemviz.snapshot.units import format_size

LOAD_FACTOR = 12
"""Loading an input of n bytes takes at most LOAD_FACTOR * n + LOAD_SLACK bytes of memory."""
LOAD_SLACK = 64 << 20
GUARD_FACTOR = 10
"""Decoding and the walk are refused past GUARD_FACTOR * n + GUARD_SLACK bytes."""
GUARD_SLACK = 48 << 20

# What json.loads takes at most (CPython 3.11; tests/test_io_bounds.py checks it), in bytes: per
# input byte (the bytes and their decoded text), per container opened, per quote (a string has
# two), per value separator, per distinct key and per byte of those (json memoizes keys:
# a repeated key costs only its slot). Fitted to stay above 1.1x what json.loads takes, plus
# the input, on empty containers, tiny strings, numbers and distinct keys (up to 60 bytes per
# byte), while gpumemviz's JSON of the real files estimates at 6-9.5x (it takes 3.5-5x).
_PER_BYTE, _PER_CONTAINER, _PER_QUOTE, _PER_VALUE, _PER_KEY, _PER_KEY_BYTE = 2, 104, 16, 76, 100, 1
_KEY = re.compile(rb'[{,]\s*"((?:[^"\\]|\\.)*+)"\s*:')  # a key follows { or ,
# ... read backwards where nothing is escaped: the search starts at each colon, not at each
# comma (2x faster on gpumemviz's JSON)
_KEY_BACKWARDS = re.compile(rb':\s*"([^"\\]*)"\s*[{,]')
_KEY_CHUNK = 1 << 20  # keys are gathered a MiB of input at a time


def guard_limit(n: int) -> int:
    """Bytes decoding an input of `n` bytes may take before it is refused."""
    return GUARD_FACTOR * n + GUARD_SLACK


def json_estimate(data: bytes, *, most: int | None = None) -> int:
    """An upper bound of the memory loading `data` (JSON) takes, from C-level counts; past
    `most`, the count of distinct keys may stop early (the bound is past it anyway)."""
    n = len(data)
    base = (
        _PER_BYTE * n
        + _PER_CONTAINER * (data.count(b"[") + data.count(b"{"))
        + _PER_QUOTE * data.count(b'"')
        + _PER_VALUE * data.count(b",")
    )
    if most is not None:
        every = base + _PER_KEY * data.count(b":") + _PER_KEY_BYTE * n
        if base > most or every <= most:  # past it already, or in even if every key is new
            return base if base > most else every
    return base + _distinct_keys(data, None if most is None else most - base)


def _distinct_keys(data: bytes, room: int | None) -> int:
    """What the distinct keys of `data` cost, gathered a chunk at a time (so memory follows the
    distinct keys); stops once past `room`. A key cut by a chunk's end is missed or misread:
    1 KiB per chunk more covers it."""
    seen: set[bytes] = set()
    cost = 0
    for start in range(0, len(data), _KEY_CHUNK):
        before = len(seen)
        chunk = data[start : start + _KEY_CHUNK]
        if b"\\" in chunk:
            fresh = set(_KEY.findall(chunk)) - seen
        else:
            fresh = set(_KEY_BACKWARDS.findall(chunk[::-1])) - seen  # reversed: as distinct
        seen |= fresh
        cost += _PER_KEY * (len(seen) - before) + _PER_KEY_BYTE * sum(map(len, fresh)) + 1024
        if room is not None and cost > room:
            break
    return cost


def check_json(data: bytes) -> None:
    """Refuse JSON whose `json_estimate` is past the guard's limit, before it is parsed."""
    limit = guard_limit(len(data))
    need = json_estimate(data, most=limit)
    if need > limit:
        raise SnapshotError(
            f"refused: this {format_size(len(data))} of JSON would take up to {format_size(need)} "
            f"of memory to read, past the {format_size(limit)} allowed ({GUARD_FACTOR}x its size "
            f"+ {format_size(GUARD_SLACK)}): it is mostly empty containers or tiny values, which "
            "no snapshot is"
        )


class MemoryGuard:
    """Refuses a load whose memory grows past `guard_limit(n)` from when it started.

    Used as a context manager around decoding and the walk; `check()` between chunks.
    """

    def __init__(self, n: int, what: str = "pickle") -> None:
        self.n, self.what = n, what
        self.limit = guard_limit(n)
        self._fd: int | None = None
        self._gauge: Callable[[], int] | None = None
        self._start = 0

    def __enter__(self) -> MemoryGuard:
        self._gauge = self._open()
        if self._gauge is not None:
            self._start = self._gauge()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._gauge = None

    def check(self) -> None:
        """Raise `SnapshotError` if memory grew past the limit since `__enter__`."""
        if self._gauge is None:
            return
        grown = self._gauge() - self._start
        if grown > self.limit:
            raise SnapshotError(
                f"refused: reading this {format_size(self.n)} {self.what} took over "
                f"{format_size(self.limit)} of memory ({GUARD_FACTOR}x its size + "
                f"{format_size(GUARD_SLACK)}), far more than a snapshot needs: it builds a "
                "great many tiny objects (or another thread allocated heavily meanwhile)"
            )

    def _open(self) -> Callable[[], int] | None:
        if tracemalloc.is_tracing():
            return _traced
        if sys.platform.startswith("linux"):
            try:
                self._fd = os.open("/proc/self/statm", os.O_RDONLY)
            except OSError:
                pass
            else:
                fd = self._fd
                return lambda: int(os.pread(fd, 128, 0).split()[1]) * _PAGE
        try:
            import resource
        except ImportError:  # Windows: no gauge
            return None
        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
        return lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _traced() -> int:
    return tracemalloc.get_traced_memory()[0]
