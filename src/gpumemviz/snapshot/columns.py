"""Numpy columns from Python values and back: 64-bit integers read as `array("q")` reads them,
read-only arrays, row indices, and a column's values (or some rows of it) as a Python list.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.schema import SnapshotError


def row_index(i: int, n: int, what: str, plural: str) -> int:
    """`i` as a row index into `n` rows (negative counts from the end), or IndexError."""
    if not -n <= i < n:
        raise IndexError(f"{what} {i} out of range ({n} {plural})")
    return i % n


def readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# Any: values read from a file, checked here
def int_column(values: list[Any], what: str, where: Callable[[int], str]) -> np.ndarray:
    """Turn a list of Python ints into int64; name the first row that is not a 64-bit integer.

    `array("q")` decides what an integer is, here and in the fast reader alike: ints (bools
    too, as numpy's own integers) pass, floats and strings do not.
    """
    try:
        return np.frombuffer(array("q", values), np.int64)
    except (TypeError, OverflowError, ValueError):
        for i, v in enumerate(values):
            if as_int64(v) is None:
                raise SnapshotError(
                    f"{where(i)}: {what} is {short_repr(v)}, not a 64-bit integer"
                ) from None
        raise  # pragma: no cover  (a list that fails as a whole fails in one of its rows)


def as_int64(v: Any) -> int | None:  # any value: `array("q")` decides
    """`v` as a 64-bit integer the way `array("q")` reads it, or None."""
    try:
        value: int = array("q", (v,))[0]
        return value
    except (TypeError, OverflowError, ValueError):
        return None


def take(col: np.ndarray, idx: np.ndarray | None) -> list[Any]:  # Any: the dtype's scalars
    values: list[Any] = (col if idx is None else col[idx]).tolist()
    return values


def taker(col: np.ndarray) -> Callable[[np.ndarray | None], list[Any]]:
    return lambda idx: take(col, idx)
