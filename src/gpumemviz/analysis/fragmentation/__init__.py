"""Fragmentation analysis: where the reserved bytes of the caching allocator are, and what fits.

`fragmentation(snapshot)` walks the segments once and returns a frozen `FragmentationReport`:
per-device and total figures (reserved, allocated, free, trapped, releasable, largest free block,
external fragmentation), per-segment numpy columns, the worst segments, the per-segment
conservation law, and `can_fit(nbytes)`, which answers "would this allocation succeed?" by the
allocator's own rules (docs/allocator.md, The malloc path).

Two ways in, one report: a torch dict (or bare segment list), as users hand it over straight from
`torch.cuda.memory._snapshot()`, is read by `snapshot.read_torch`, the reader `Snapshot.from_torch`
uses too, but only for the columns the analysis needs (no Snapshot is built); a `Snapshot` (and
paths or bytes, through `gpumemviz.io.as_snapshot`) gives its own columns. Either way the same
values are read the same way, and a bad one gets the same one-line SnapshotError. Full validation
belongs to `load_snapshot`; the analysis checks only what it reads.

One job per module: `report` (the values returned), `tables` (its per-segment and free-block
columns), `columns` (both ways in -> columns), `reduce` (columns -> figures), `pools` (the private
pools' in-use assumption and per-pool figures), `fit` (can_fit and its answer), `expandable_fit`
(where can_fit lands in expandable mode), `_util` (helpers `reduce` and `fit` share).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumemviz.analysis.fragmentation.columns import from_snapshot, from_torch
from gpumemviz.analysis.fragmentation.fit import VERDICTS, FitAnswer
from gpumemviz.analysis.fragmentation.pools import ASSUMED_IN_USE, PoolsInUse, normalize_in_use
from gpumemviz.analysis.fragmentation.report import (  # N_WORST: public before the split, kept here
    FIGURE_NAMES,
    N_WORST,
    ConservationViolation,
    FragmentationReport,
    MemoryFigures,
    PoolFigures,
    PoolKey,
    SegmentSummary,
)
from gpumemviz.analysis.fragmentation.tables import FreeBlocks, SegmentFigures

if TYPE_CHECKING:
    from gpumemviz.io import SnapshotLike

__all__ = [
    "ASSUMED_IN_USE",
    "FIGURE_NAMES",
    "N_WORST",
    "VERDICTS",
    "ConservationViolation",
    "FitAnswer",
    "FragmentationReport",
    "FreeBlocks",
    "MemoryFigures",
    "PoolFigures",
    "PoolKey",
    "SegmentFigures",
    "SegmentSummary",
    "fragmentation",
]


def fragmentation(
    snapshot: SnapshotLike, *, pools_in_use: PoolsInUse = True
) -> FragmentationReport:
    """Measure the allocator's memory and its fragmentation in a snapshot.

    Parameters
    ----------
    snapshot : Snapshot, dict, list, str, os.PathLike or bytes
        A `gpumemviz.Snapshot`, the dict of `torch.cuda.memory._snapshot()`, the segment list of
        `torch.cuda.memory_snapshot()`, or a snapshot file (path or bytes).
    pools_in_use : bool or collection of (int, int)
        Which private pools (CUDA graphs, ``torch.cuda.MemPool``) are still in use: a snapshot
        does not record it, and empty_cache releases a pool's free segments only once it is not
        (its MemPool deleted, its graph reset). True (the default): all; False: none; else the
        ids of those in use. The report keeps the assumption (`pools_in_use`) and each pool's
        figures say what waits on the release (`MemoryFigures.pools`).

    Returns
    -------
    FragmentationReport
        Per-device and total figures, per-segment columns and `can_fit`.

    Raises
    ------
    gpumemviz.SnapshotError
        When a segment or block lacks what the analysis reads, or holds a value it cannot read
        (one line, saying where: the message `Snapshot.from_torch` gives).
    ValueError
        When `pools_in_use` is none of those.

    Notes
    -----
    ``fragmentation(d)`` equals ``fragmentation(Snapshot.from_torch(d))`` (report, per-segment
    columns, can_fit) or raises the same `SnapshotError`: tested on every recorded file, on
    hand-made edge cases and generated odd dicts (tests/test_torch_reader.py), and fuzzed
    (tools/fuzz.py, dict target). The one difference: the analysis does not read block
    addresses, the segments' own allocated/active/requested sums or trace entries, so only
    `Snapshot.from_torch` refuses a bad value there.

    Examples
    --------
    >>> seg = {"device": 0, "address": 0, "total_size": 2 * 2**20, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...     {"size": 512, "requested_size": 100, "state": "active_allocated"},
    ...     {"size": 2 * 2**20 - 512, "requested_size": 0, "state": "inactive"}]}
    >>> r = fragmentation({"segments": [seg]})
    >>> r.reserved, r.allocated, r.internal_waste, r.free_trapped, r.releasable
    (2097152, 512, 412, 2096640, 0)
    """
    in_use = normalize_in_use(pools_in_use)
    if isinstance(snapshot, dict | list):  # what `as_snapshot` reads with Snapshot.from_torch
        return from_torch(snapshot, in_use)
    from gpumemviz.io import as_snapshot  # paths and bytes: io is needed only off the dict path

    return from_snapshot(as_snapshot(snapshot), in_use)
