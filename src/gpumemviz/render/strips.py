"""One device as a strip: its header figures and a binned segment map, small enough to publish.

The multi-device panel draws one strip per device and a job's rank grid one per (rank, device),
so both take this one summary: plain JSON numbers, a few hundred bytes, computed from the rows of
the segment map (gpumemviz.render.rows), so a strip's pixels mean what the full map's cells mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.render.rows import MAX_CELLS, RowTable, build_rows, cell_byte, kind_cover
from gpumemviz.render.wire import header_numbers

if TYPE_CHECKING:
    from gpumemviz.snapshot import Snapshot

__all__ = [
    "STRIP_BINS",
    "SUMMED",
    "device_bins",
    "device_summary",
    "snapshot_devices",
    "snapshot_strip_set",
    "snapshot_summaries",
    "strip_set",
    "trace_oom_counts",
]

STRIP_BINS = 64
Summary = Mapping[str, "int | float | list[int]"]
SUMMED = (
    "reserved",
    "allocated",
    "pending_free",
    "free",
    "free_releasable",
    "free_trapped",
    "segments",
    "blocks",
    "ooms",
)
"""The summary keys `strip_set` adds up across strips (largest_free is the largest of them)."""


def device_bins(rows: RowTable, bins: int = STRIP_BINS) -> list[int]:
    """The device's segments laid end to end in map order, cut into `bins` equal cells.

    Each value is a cell byte of gpumemviz.render.rows (allocated level and the main other kind);
    0 for every cell when nothing is reserved.

    >>> from gpumemviz.snapshot import Snapshot
    >>> from gpumemviz.render.rows import build_rows
    >>> seg = {"device": 0, "address": 0, "total_size": 4 << 20, "stream": 0,
    ...        "segment_type": "large", "blocks": [
    ...     {"size": 3 << 20, "requested_size": 3 << 20, "state": "active_allocated"},
    ...     {"size": 1 << 20, "requested_size": 0, "state": "inactive"}]}
    >>> device_bins(build_rows(Snapshot.from_torch([seg])), 4)
    [63, 63, 63, 192]
    """
    if not 1 <= bins <= MAX_CELLS:
        raise ValueError(f"bins must be in 1..{MAX_CELLS}, got {bins}")
    reserved = int(rows.total_size.sum())
    if reserved <= 0:
        return [0] * bins
    base = np.concatenate([[0], np.cumsum(rows.total_size)[:-1]]).astype(np.int64)
    start = (base[rows.span_row] + rows.span_start).astype(np.float64)
    edges = np.linspace(0.0, float(reserved), bins + 1)
    at = kind_cover(start, rows.span_size.astype(np.float64), rows.span_kind, edges)
    cover = np.column_stack([np.maximum(np.diff(a), 0.0) for a in at])
    total = cover.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        fractions = np.where(total > 0, cover / total, 0.0)
    return [int(b) for b in cell_byte(fractions)]


def device_summary(
    rows: RowTable, *, device: int, ooms: int = 0, bins: int = STRIP_BINS
) -> dict[str, int | float | list[int]]:
    """The strip of one device: header figures (bytes), its OOM count and its binned map.

    Keys: device, reserved, allocated, pending_free, free (free in reserved), free_releasable,
    free_trapped, largest_free, fragmentation (external, 0-1), segments, blocks, ooms, bins.

    >>> from gpumemviz.snapshot import Snapshot
    >>> from gpumemviz.render.rows import build_rows
    >>> seg = {"device": 1, "address": 0, "total_size": 4 << 20, "stream": 0,
    ...        "segment_type": "large", "blocks": [
    ...     {"size": 3 << 20, "requested_size": 3 << 20, "state": "active_allocated"},
    ...     {"size": 1 << 20, "requested_size": 0, "state": "inactive"}]}
    >>> s = device_summary(build_rows(Snapshot.from_torch([seg])), device=1, ooms=2, bins=4)
    >>> s["device"], s["free"], s["largest_free"], s["ooms"], s["bins"]
    (1, 1048576, 1048576, 2, [63, 63, 63, 192])
    """
    out: dict[str, int | float | list[int]] = {"device": int(device)}
    out.update(header_numbers(rows))
    out["ooms"] = int(ooms)
    out["bins"] = device_bins(rows, bins)
    return out


def strip_set(
    summaries: Sequence[Summary],
    *,
    labels: Sequence[str] | None = None,
    selected: int | None = None,
    note: str = "",
) -> dict[str, object]:
    """Strips to draw together (the panel's ``strips`` trait): each summary with its label,
    which one is selected (its full map shows below; None: none), totals and a note line.

    The summaries come from `device_summary` here or from anywhere else that sends its keys
    (another process's published summary), so the drawing needs nothing but this dict.

    Parameters
    ----------
    summaries : sequence of dict
        `device_summary` results, in the order to draw.
    labels : sequence of str, optional
        One per strip (default ``cuda:DEVICE``).
    selected : int, optional
        Index into ``summaries`` of the strip whose full map is shown.
    note : str
        One line shown under the strips (how a replay moves its devices together).

    Returns
    -------
    dict
        ``{strips: [summary + {label}], selected, totals: {SUMMED keys, largest_free,
        fragmentation: the largest of the strips'}, note}``: plain JSON.

    Examples
    --------
    >>> a = {"device": 0, "reserved": 8, "free": 2, "largest_free": 2, "ooms": 0}
    >>> b = {"device": 1, "reserved": 4, "free": 3, "largest_free": 1, "ooms": 1}
    >>> s = strip_set([a, b], selected=1)
    >>> [x["label"] for x in s["strips"]], s["selected"], s["totals"]["reserved"]
    (['cuda:0', 'cuda:1'], 1, 12)
    >>> s["totals"]["ooms"], s["totals"]["largest_free"]
    (1, 2)
    """
    if labels is not None and len(labels) != len(summaries):
        raise ValueError(f"{len(labels)} labels for {len(summaries)} strips")
    if selected is not None and not 0 <= selected < len(summaries):
        raise ValueError(f"selected strip {selected} is outside 0..{len(summaries) - 1}")
    strips: list[dict[str, object]] = []
    for i, s in enumerate(summaries):
        label = labels[i] if labels is not None else f"cuda:{s.get('device', i)}"
        strips.append({**s, "label": str(label)})
    totals: dict[str, int | float] = {}
    for key in SUMMED:
        totals[key] = sum(_number(s.get(key)) for s in summaries)
    totals["largest_free"] = max((_number(s.get("largest_free")) for s in summaries), default=0)
    totals["fragmentation"] = max((_number(s.get("fragmentation")) for s in summaries), default=0)
    return {"strips": strips, "selected": selected, "totals": totals, "note": str(note)}


def _number(v: object) -> int | float:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def trace_oom_counts(snapshot: Snapshot) -> dict[int, int]:
    """Per device, the ``oom`` entries its recorded trace holds (devices without one left out).

    >>> from gpumemviz.snapshot import Snapshot
    >>> snap = Snapshot.from_torch({"segments": [], "device_traces": [[], [
    ...     {"action": "oom", "size": 4096, "stream": 0, "device_free": 0}]]})
    >>> trace_oom_counts(snap)
    {1: 1}
    """
    out: dict[int, int] = {}
    for d, t in snapshot.traces.items():
        names = list(getattr(t, "action_names", ()))
        if "oom" in names and len(t):
            n = int(np.count_nonzero(np.asarray(t.action) == names.index("oom")))
            if n:
                out[int(d)] = n
    return out


def snapshot_devices(snapshot: Snapshot) -> list[int]:
    """The devices a snapshot shows: those with segments or a non-empty recorded trace.

    >>> from gpumemviz.snapshot import Snapshot
    >>> snapshot_devices(Snapshot.from_torch({"segments": [], "device_traces": [[], [
    ...     {"action": "alloc", "addr": 0, "size": 512, "stream": 0}], []]}))
    [1]
    """
    have = {int(d) for d in np.unique(snapshot.segments.device)}
    have |= {int(d) for d, t in snapshot.traces.items() if len(t)}
    return sorted(have)


def snapshot_summaries(snapshot: Snapshot, bins: int = STRIP_BINS) -> list[Summary]:
    """`device_summary` of every device of one snapshot (a state file with several devices),
    with each device's recorded OOMs.

    >>> from gpumemviz.snapshot import Snapshot
    >>> seg = {"address": 0, "total_size": 512, "stream": 0,
    ...        "blocks": [{"size": 512, "state": "inactive"}]}
    >>> snap = Snapshot.from_torch([{**seg, "device": 0}, {**seg, "device": 2}])
    >>> [(s["device"], s["free"]) for s in snapshot_summaries(snap, bins=2)]
    [(0, 512), (2, 512)]
    """
    ooms = trace_oom_counts(snapshot)
    return [
        device_summary(build_rows(snapshot, device=d), device=d, ooms=ooms.get(d, 0), bins=bins)
        for d in snapshot_devices(snapshot)
    ]


def snapshot_strip_set(snapshot: Snapshot, selected: int | None = None) -> dict[str, object]:
    """The `strip_set` of a snapshot of several devices (``selected``: a device index, drawn in
    full); ``{}`` for one device or none, where the panel draws no strips.

    >>> from gpumemviz.snapshot import Snapshot
    >>> seg = {"address": 0, "total_size": 512, "stream": 0,
    ...        "blocks": [{"size": 512, "state": "inactive"}]}
    >>> snapshot_strip_set(Snapshot.from_torch([{**seg, "device": 0}]))
    {}
    >>> two = Snapshot.from_torch([{**seg, "device": 0}, {**seg, "device": 2}])
    >>> snapshot_strip_set(two, selected=2)["selected"]
    1
    """
    summaries = snapshot_summaries(snapshot)
    if len(summaries) < 2:
        return {}
    devices = [s["device"] for s in summaries]
    return strip_set(summaries, selected=devices.index(selected) if selected in devices else None)
