"""`validate`: whether a snapshot is self-consistent, checked over its columns.

`Snapshot.from_torch` checks only what building the columns needs; `gpumemviz.io.load_snapshot`
runs this on everything it loads, and names the first problem in one line.
"""

from __future__ import annotations

import numpy as np

from gpumemviz.snapshot.escaping import short_repr, type_phrase
from gpumemviz.snapshot.schema import ALLOCATED, INACTIVE, SnapshotError, TorchDict
from gpumemviz.snapshot.snapshot import Snapshot


def _check_settings(settings: TorchDict | None) -> None:
    """The allocator_settings shape the analyses rely on (roundup_power2_divisions)."""
    rd = (settings or {}).get("roundup_power2_divisions")
    if rd is None:
        return
    if type(rd) is not dict:
        raise SnapshotError(
            f"allocator_settings: roundup_power2_divisions is {type_phrase(rd)}, not a dict"
        )
    for k, v in rd.items():
        if not (type(k) is int or (type(k) is str and k.isascii() and k.isdigit())):
            raise SnapshotError(
                f"allocator_settings: roundup_power2_divisions key {short_repr(k)} is not an "
                "interval (a non-negative integer)"
            )
        if not (type(v) is int and 0 <= v < 1 << 64 and v & (v - 1) == 0):
            raise SnapshotError(
                f"allocator_settings: roundup_power2_divisions[{short_repr(k)}] is "
                f"{short_repr(v)}, not 0 or a power of 2"
            )


def validate(snapshot: Snapshot) -> None:
    """Check that a snapshot is self-consistent; raise `SnapshotError` at the first problem.

    Vectorised over the columns: block and segment sizes are positive, block sizes sum to
    total_size, blocks are contiguous from the segment address, allocated/active/requested
    sums match the blocks, and segments of a device do not overlap. ``allocator_settings
    ["roundup_power2_divisions"]``, when present, must be a dict of interval keys (int or digit
    string) to 0 or a power of two: the shape `AllocatorConfig.from_settings` reads. The
    allocator's own rules (512-byte multiples and such) are not checked: that is analysis.

    Parameters
    ----------
    snapshot : Snapshot

    Raises
    ------
    SnapshotError
        One line naming the first problem and where it is (`Snapshot.where`).

    Examples
    --------
    >>> snap = Snapshot.from_torch([{"address": 0, "total_size": 1024, "blocks": [
    ...     {"size": 512, "state": "inactive"}]}])
    >>> try:
    ...     validate(snap)
    ... except SnapshotError as e:
    ...     print(e)
    segment 0 (device 0, 0x0): blocks sum to 512 bytes but total_size is 1024
    """
    s, b = snapshot.segments, snapshot.blocks
    m = len(b)
    _check_settings(snapshot.allocator_settings)

    def first(mask: np.ndarray) -> int | None:
        hit = np.flatnonzero(mask)
        return int(hit[0]) if hit.size else None

    j = first(b.size <= 0)
    if j is not None:
        seg = int(b.segment[j])
        raise SnapshotError(
            f"{snapshot.where(seg)}: block {j - int(s.block_start[seg])} has size {int(b.size[j])}"
        )
    i = first(s.total_size <= 0)
    if i is not None:
        raise SnapshotError(f"{snapshot.where(i)}: total_size is {int(s.total_size[i])}")
    cs = np.zeros(m + 1, np.int64)
    end = s.block_start + s.block_count
    np.cumsum(b.size, out=cs[1:])
    block_sum = cs[end] - cs[s.block_start]
    i = first(block_sum != s.total_size)
    if i is not None:
        raise SnapshotError(
            f"{snapshot.where(i)}: blocks sum to {int(block_sum[i])} bytes but total_size is "
            f"{int(s.total_size[i])}"
        )
    offset = cs[:-1] - cs[s.block_start[b.segment]] if m else cs[:0]
    j = first(b.address != s.address[b.segment] + offset)
    if j is not None:
        seg = int(b.segment[j])
        raise SnapshotError(
            f"{snapshot.where(seg)}: block {j - int(s.block_start[seg])} is at "
            f"{int(b.address[j]):#x}, expected {int(s.address[seg] + offset[j]):#x} "
            "(blocks must be contiguous)"
        )
    for name, mask, w in (
        ("allocated_size", b.state == ALLOCATED, b.size),
        ("active_size", b.state != INACTIVE, b.size),
        ("requested_size", b.state != INACTIVE, b.requested_size),
    ):
        np.cumsum(np.where(mask, w, 0), out=cs[1:])
        got = cs[end] - cs[s.block_start]
        i = first(got != getattr(s, name))
        if i is not None:
            raise SnapshotError(
                f"{snapshot.where(i)}: {name} is {int(getattr(s, name)[i])} but its blocks "
                f"give {int(got[i])}"
            )
    order = np.lexsort((s.address, s.device))
    if len(order) > 1:
        dev, lo, hi = s.device[order], s.address[order], s.address[order] + s.total_size[order]
        k = first((dev[1:] == dev[:-1]) & (lo[1:] < hi[:-1]))
        if k is not None:
            a, c = int(order[k]), int(order[k + 1])
            raise SnapshotError(f"{snapshot.where(c)} overlaps {snapshot.where(a)}")
