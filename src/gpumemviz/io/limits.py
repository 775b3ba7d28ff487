"""The bounds every untrusted input is held to, pickle or JSON: a size limit, plain types only
(dict, list, tuple, str, int, float, bool, None, bytes), and a nesting limit.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import numpy as np

from ..snapshot import SnapshotError
from ..units import format_size

DEFAULT_MAX_BYTES = 4 << 30
"""Largest file `load_snapshot` reads (4 GiB); Chrome already fails on 1 GB snapshots."""
DEFAULT_MAX_DEPTH = 64
"""Deepest nesting of containers accepted; a torch snapshot is about 9 levels deep."""

_PLAIN = frozenset({dict, list, tuple, str, int, float, bool, type(None), bytes})
_CONTAINERS = frozenset({dict, list, tuple})
_SAMPLE = 4096  # items looked at to decide whether a level is mostly shared references
_KEY_TYPES = frozenset({str, int, float, bool, type(None), bytes})


def check_plain(obj: Any, *, max_depth: int = DEFAULT_MAX_DEPTH) -> None:  # Any: unpickled
    """Raise `SnapshotError` if `obj` holds anything but plain types or nests too deep.

    Walks level by level with C-level passes, never recursing, and visits each container once
    per level, so a small file of shared references cannot blow the walk up (and the frames
    that real pickles share are walked once). Cycles hit the depth limit.
    """
    if type(obj) not in _PLAIN:
        raise SnapshotError(f"a value of type {type(obj).__name__} (only plain data allowed)")
    if type(obj) not in _CONTAINERS:
        return  # a lone scalar: plain (`Snapshot.from_torch` says it is not a snapshot)
    # the walk's items are unpickled values of any type: `type()` checks each
    level: list[Any] = [obj]
    kinds = [type(obj)]
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


def _unique(objs: list[Any]) -> list[Any]:  # Any: unpickled values
    """`objs` without repeats (by identity), in C: pickles share frames lists heavily."""
    if len(objs) < 2:
        return objs
    ids = np.fromiter(map(id, objs), np.uint64, len(objs))
    _, first = np.unique(ids, return_index=True)
    if len(first) == len(objs):
        return objs
    first.sort()
    return list(map(objs.__getitem__, first.tolist()))


def _names(types: set[type]) -> str:
    return ", ".join(sorted(t.__name__ for t in types))


def check_size(n: int, max_bytes: int, what: str) -> None:
    """Refuse `n` bytes of input over `max_bytes`; `what` names the input in the message."""
    if n > max_bytes:
        raise SnapshotError(
            f"{what} is {format_size(n)}, over the {format_size(max_bytes)} limit "
            f"(max_bytes={max_bytes})"
        )
