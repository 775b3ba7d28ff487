"""Small helpers shared by the fragmentation modules (`reduce` and `fit`)."""

from __future__ import annotations

import numpy as np


def pool_name(small: bool) -> str:
    """The pool a segment or request belongs to: "small" or "large"."""
    return "small" if small else "large"


def blocks_of(
    seg: np.ndarray, offset: np.ndarray, size: np.ndarray, row: int
) -> list[tuple[int, int]]:
    """(offset, size) of one segment's blocks; `seg` is ascending, so two binary searches."""
    lo, hi = np.searchsorted(seg, [row, row + 1])
    return list(zip(offset[lo:hi].tolist(), size[lo:hi].tolist(), strict=True))
