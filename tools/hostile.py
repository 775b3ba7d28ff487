"""Hostile pickles by name: the patterns the snapshot loader is held to.

Each pattern builds a pickle of about `n` bytes that costs a naive reader far more than its size:
objects from one-byte opcodes (sets, dicts, lists, tuples, memo entries, marks, references),
short strings and ints, a list reachable at 60 depths, and a few hundred bytes of shared
references that expand to 2^30 leaves. The loader must answer each within 12x its size plus
64 MiB of memory (measured with tracemalloc) and in time linear in its size, with a snapshot or
a one-line SnapshotError. tests/io/test_io_bounds.py runs them small; benchmarks/snapshot_io.py
reports their memory per input byte; tools/fuzz.py may draw on them.

Run: ``python tools/hostile.py [--mib 8] OUT_DIR`` writes one file per pattern.
"""

from __future__ import annotations

import argparse
import pickle
from collections.abc import Callable
from pathlib import Path

PROTO4 = b"\x80\x04"
#: The wrapper every opcode pattern sits in: {"segments": [], "x": <pattern>}, so a reader
#: that checks the top level first still has to build the pattern.
_HEAD = PROTO4 + b"}(\x8c\x08segments]\x8c\x01x"
_TAIL = b"u."


def _wrap(body: bytes) -> bytes:
    return _HEAD + body + _TAIL


def _list_of(op: bytes, n: int) -> bytes:
    """A list of n // len(op) objects, each built by `op` (MARK, the ops, LIST)."""
    return _wrap(b"(" + op * max(1, n // len(op)) + b"l")


def empty_sets(n: int) -> bytes:
    """One EMPTY_SET per byte: the issue's 232x pattern (8 MB in, 1.9 GB peak)."""
    return _list_of(b"\x8f", n)


def frozensets(n: int) -> bytes:
    """MARK, FROZENSET: an empty frozenset per two bytes."""
    return _list_of(b"(\x91", n)


def empty_dicts(n: int) -> bytes:
    """One EMPTY_DICT per byte (64 bytes each)."""
    return _list_of(b"}", n)


def empty_lists(n: int) -> bytes:
    """One EMPTY_LIST per byte (56 bytes each)."""
    return _list_of(b"]", n)


def tuple_chain(n: int) -> bytes:
    """None wrapped in n one-item tuples (TUPLE1 per byte): 48 bytes each, n levels deep."""
    return _wrap(b"N" + b"\x85" * n)


def memo_entries(n: int) -> bytes:
    """One MEMOIZE per byte, each a new memo slot for the same None (16 bytes each)."""
    return _wrap(b"N" + b"\x94" * n)


def open_marks(n: int) -> bytes:
    """n MARKs never closed: the unpickler's mark stack grows by one per byte."""
    return PROTO4 + b"(" * n + b"N."


def duplicates(n: int) -> bytes:
    """A list of n references to one empty list, one DUP per byte (the stack holds them all)."""
    return _wrap(b"(]" + b"2" * n + b"l")


def short_strings(n: int) -> bytes:
    """Two-character strings, four bytes each (SHORT_BINUNICODE): 51-byte objects."""
    return _list_of(b"\x8c\x02ab", n)


def ints(n: int) -> bytes:
    """The int 257 (not cached), three bytes each (BININT2): 28-byte objects."""
    return _list_of(b"M\x01\x01", n)


def many_depths(n: int) -> bytes:
    """A list of about n bytes of one-int lists, reachable at each of 60 depths: a chain of 60
    lists, each holding the next and the big list (a walk by depth visits it 60 times; the
    deepest path, 63 levels, is within the nesting limit)."""
    big = [[i] for i in range(1000, 1000 + max(1, n // 8))]
    chain: list = [big]
    for _ in range(59):
        chain = [chain, big]
    return pickle.dumps({"segments": [], "x": chain}, protocol=4)


def shared_2e30(n: int = 0) -> bytes:
    """The issue's few hundred bytes: a list of the same list, 30 deep (2^30 leaves once
    expanded), as the allocator settings (`n` is ignored: the file is always small)."""
    layer: list = ["leaf"]
    for _ in range(30):
        layer = [layer, layer]
    return pickle.dumps({"segments": [], "allocator_settings": {"x": layer}}, protocol=4)


#: Every pattern by name.
PATTERNS: dict[str, Callable[[int], bytes]] = {
    f.__name__: f
    for f in (
        *(empty_sets, frozensets, empty_dicts, empty_lists, tuple_chain, memo_entries),
        *(open_marks, duplicates, short_strings, ints, many_depths, shared_2e30),
    )
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write NAME.pickle files to")
    parser.add_argument("--mib", type=float, default=8.0, help="size of each file (MiB)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, make in PATTERNS.items():
        data = make(int(args.mib * (1 << 20)))
        (args.out / f"{name}.pickle").write_bytes(data)
        print(f"{name}: {len(data):,} bytes")


if __name__ == "__main__":
    main()
