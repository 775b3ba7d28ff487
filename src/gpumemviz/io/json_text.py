"""JSON that gpumemviz writes: never NaN or infinity, and its size known before it is written.

JSON has no references, so a subtree shared between many places (torch's pickles share each
frames list between the blocks and trace entries allocated at the same line; a hostile file can
share a list with itself 30 levels deep) is written out once per place. `json_size` computes the
size of that expansion visiting each shared object once, so the JSON export refuses what would
be gigabytes before writing a byte (`check_json_size`), and `json_ready` replaces the values
JSON cannot hold (NaN, infinity, integers too long for JSON readers) with null the same way.
"""

from __future__ import annotations

import json
import math
import sys
from json.encoder import encode_basestring_ascii
from typing import Any

from gpumemviz.snapshot import SnapshotError
from gpumemviz.snapshot.plain import rewrite_leaves
from gpumemviz.snapshot.units import format_size

__all__ = ["JSON_LIMIT", "check_json_size", "dumps", "json_ready", "json_size"]

JSON_LIMIT = 1 << 30
"""Largest JSON export (1 GiB): Chrome already fails on 1 GB snapshots, and a pickle keeps the
file's sharing (the same data is usually a hundred times smaller as a pickle)."""

# Python's int <-> str conversion limit (the json module's too): longer ints become null
_MAX_DIGITS = sys.get_int_max_str_digits() or 4300
_MAX_INT_BITS = int(_MAX_DIGITS * 3.32) - 8  # comfortably below that many decimal digits
_CONTAINERS = (dict, list, tuple)


def _bad_scalar(v: Any) -> bool:
    t = type(v)
    return (t is float and not math.isfinite(v)) or (t is int and v.bit_length() > _MAX_INT_BITS)


def json_ready(obj: Any) -> Any:
    """`obj` with every NaN or infinite float, and every int too long for a JSON reader, as
    None (null); containers holding none of them are returned as they are (not copied), and a
    shared container is visited once and stays shared.

    Examples
    --------
    >>> json_ready({"a": [1.5, float("nan")], "b": [2]})
    {'a': [1.5, None], 'b': [2]}
    """
    return rewrite_leaves(obj, _null_if_bad)


def _null_if_bad(v: Any) -> Any:  # Any: a scalar of plain data
    return None if _bad_scalar(v) else v


def json_size(obj: Any) -> int:
    """Bytes of ``json.dumps(json_ready(obj), separators=(",", ":"))``, computed without
    writing it: each shared container is measured once and counted once per reference, so the
    time is linear in the distinct objects, whatever the expansion.

    A value JSON cannot hold (bytes, a set) counts as its repr would; a cycle, or nesting too
    deep for `json.dumps`, raises `SnapshotError`.

    Examples
    --------
    >>> deep = [1]
    >>> for _ in range(40):
    ...     deep = [deep, deep]
    >>> json_size(deep)  # 2**40 leaves, never built
    6597069766653
    >>> json_size({"a": [1, "x"]}) == len(json.dumps({"a": [1, "x"]}, separators=(",", ":")))
    True
    """
    try:
        return _size(obj, {}, {})
    except RecursionError:
        raise SnapshotError("data nested too deep (or in a cycle) to write as JSON") from None


def _scalar_size(v: Any) -> int:
    t = type(v)
    if t is str:
        return len(encode_basestring_ascii(v))
    if t is int:
        return 4 if v.bit_length() > _MAX_INT_BITS else len(int.__repr__(v))
    if t is bool:
        return 4 if v else 5
    if v is None:
        return 4
    if t is float:
        return len(float.__repr__(v)) if math.isfinite(v) else 4
    return len(repr(v)) + 2  # not JSON: json.dumps refuses it, or its subclass says


def _size(obj: Any, sizes: dict[int, int], keys: dict[Any, int]) -> int:
    t = type(obj)
    if t is not dict and t is not list and t is not tuple:
        return _scalar_size(obj)
    known = sizes.get(id(obj))
    if known is not None:
        return known
    n = len(obj)
    total = 2 + max(n - 1, 0)  # brackets and commas
    values = obj
    if t is dict:
        for k in obj:
            ks = keys.get(k)
            if ks is None:
                ks = keys[k] = _scalar_size(k if type(k) is str else str(k)) + 1  # and ':'
            total += ks
        values = obj.values()
    for v in values:
        tv = type(v)
        if tv is int:
            total += len(int.__repr__(v)) if v.bit_length() <= _MAX_INT_BITS else 4
        elif tv is dict or tv is list or tv is tuple:
            total += _size(v, sizes, keys)
        else:
            total += _scalar_size(v)
    sizes[id(obj)] = total
    return total


def check_json_size(obj: Any, *, limit: int | None = None) -> int:
    """The size `obj` takes as JSON (`json_size`); `SnapshotError` when that is over `limit`
    (default `JSON_LIMIT`), with the estimate and what to write instead."""
    limit = JSON_LIMIT if limit is None else limit
    size = json_size(obj)
    if size > limit:
        raise SnapshotError(
            f"as JSON this snapshot would take {format_size(size)}, over the "
            f"{format_size(limit)} limit (JSON has no references: a list shared by many blocks "
            "and trace entries, as their frames are, is written out once for each): write a "
            "pickle instead (a .pickle name, or --format pickle), which keeps the sharing"
        )
    return size


def dumps(obj: Any, *, indent: int | None = None, compact: bool = False) -> str:
    """`json.dumps` of `json_ready(obj)` (no NaN, no infinity), ASCII-only so any terminal or
    file shows it as it is; `compact` drops the spaces."""
    separators = (",", ":") if compact else None
    return json.dumps(json_ready(obj), indent=indent, separators=separators, allow_nan=False)
