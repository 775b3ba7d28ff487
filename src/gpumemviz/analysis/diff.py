"""What changed between two snapshots, per device: memory figures, segments, holders.

Answers "what did that step / empty_cache / config change do to my memory?" from two files.
Figures come from `gpumemviz.fragmentation` and holders from `gpumemviz.analysis.holders`, so
`diff` says nothing those modules would not; it lines the two sides up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.analysis.fragmentation import FIGURE_NAMES, MemoryFigures, fragmentation
from gpumemviz.analysis.holders import N_TOP, UNKNOWN_LINE, live_holders
from gpumemviz.io import SnapshotLike, as_snapshot
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.escaping import one_line, short_repr
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import JsonDict

__all__ = [
    "FIGURES",
    "DeviceDiff",
    "FigureChange",
    "HolderChange",
    "SegmentChanges",
    "SnapshotDiff",
    "diff",
]

# MemoryFigures fields compared, in display order; the fragmentation ratios are floats.
FIGURES = FIGURE_NAMES
_COUNTS = frozenset({"segments", "blocks"})
_RATIOS = frozenset({"external_fragmentation", "fragmentation_sq"})


@dataclass(frozen=True)
class FigureChange:
    """One figure before and after (bytes, a count, or a 0..1 ratio)."""

    name: str
    before: int | float
    after: int | float

    @property
    def delta(self) -> int | float:
        return self.after - self.before

    def to_dict(self) -> JsonDict:
        return {"before": self.before, "after": self.after, "delta": self.delta}

    def text(self) -> str:
        if self.name in _RATIOS:
            b, a, d = f"{self.before:.3f}", f"{self.after:.3f}", f"{self.delta:+.3f}"
        elif self.name in _COUNTS:
            b, a, d = str(self.before), str(self.after), f"{self.delta:+d}"
        else:
            b, a = format_size(self.before), format_size(self.after)
            d = ("+" if self.delta >= 0 else "") + format_size(self.delta)
        return f"{self.name:<24}{b:>14} -> {a:<14}({d})"


@dataclass(frozen=True)
class SegmentChanges:
    """Segments matched by (address, pool): added in B, released from A, kept (same address
    and size), and resized: same address, another size (an expandable run that mapped or
    unmapped pages, or a released segment whose address the driver handed out again)."""

    added: int
    added_bytes: int
    removed: int
    removed_bytes: int
    resized: int
    resized_bytes: int  # total_size after - before, over the resized segments
    kept: int

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class HolderChange:
    """A holder's (its frame's) live bytes before and after."""

    label: str
    key: tuple[str, int, str]
    before: int
    after: int
    count_before: int
    count_after: int

    @property
    def delta(self) -> int:
        return self.after - self.before

    def to_dict(self) -> JsonDict:
        return {
            "label": self.label,
            "filename": self.key[0],
            "line": None if self.key[1] == UNKNOWN_LINE else self.key[1],
            "name": self.key[2],
            "before": self.before,
            "after": self.after,
            "delta": self.delta,
            "count_before": self.count_before,
            "count_after": self.count_after,
        }


@dataclass(frozen=True)
class DeviceDiff:
    """One device: `present` is "both", "a" (only in A) or "b" (only in B); a missing side
    reads as zeros. `figures` holds one `FigureChange` per name in `FIGURES`; the holders are
    the live holders by frame (`holders.live_holders`), at most `diff`'s `top` each."""

    device: int
    present: str
    figures: tuple[FigureChange, ...]
    segments: SegmentChanges
    holders_grew: tuple[HolderChange, ...]  # most bytes gained first
    holders_shrank: tuple[HolderChange, ...]  # most bytes lost first

    def figure(self, name: str) -> FigureChange:
        """The change of one figure by name (one of `FIGURES`)."""
        for f in self.figures:
            if f.name == name:
                return f
        raise KeyError(f"no figure {short_repr(name)}; figures: {', '.join(FIGURES)}")

    def to_dict(self) -> JsonDict:
        return {
            "present": self.present,
            "figures": {f.name: f.to_dict() for f in self.figures},
            "segments": self.segments.to_dict(),
            "holders_grew": [s.to_dict() for s in self.holders_grew],
            "holders_shrank": [s.to_dict() for s in self.holders_shrank],
        }

    def text(self) -> str:
        where = {"both": "", "a": " (only in A)", "b": " (only in B)"}[self.present]
        lines = [f"device {self.device}{where}"]
        lines += ["  " + f.text() for f in self.figures if f.name not in _COUNTS]
        s = self.segments
        lines.append(
            f"  segments: {s.added} added ({format_size(s.added_bytes)}), {s.removed} released"
            f" ({format_size(s.removed_bytes)}), {s.resized} resized, {s.kept} unchanged"
        )
        for title, rows in (("grew most", self.holders_grew), ("shrank most", self.holders_shrank)):
            if rows:
                lines.append(f"  holders that {title}:")
                for r in rows:
                    delta = ("+" if r.delta >= 0 else "") + format_size(r.delta)
                    lines.append(
                        f"    {delta:>13}  {one_line(r.label)}"
                        f"  ({format_size(r.before)} -> {format_size(r.after)})"
                    )
        return "\n".join(lines)


@dataclass(frozen=True)
class SnapshotDiff:
    """The result of `diff(a, b)`: `total` figures and one `DeviceDiff` per device.

    `to_dict()` is what ``gpumemviz diff --json`` prints; `text()` (and ``str()``) the
    readable form it prints without ``--json``.
    """

    total: tuple[FigureChange, ...]
    devices: dict[int, DeviceDiff]

    def device(self, n: int) -> DeviceDiff:
        """The diff of device `n` (ValueError naming the devices present)."""
        if n not in self.devices:
            raise ValueError(f"no device {n} in either snapshot; devices: {sorted(self.devices)}")
        return self.devices[n]

    def to_dict(self) -> JsonDict:
        """JSON-ready: `{"total": {figure: {before, after, delta}}, "devices": {"0": {...}}}`."""
        return {
            "total": {f.name: f.to_dict() for f in self.total},
            "devices": {str(d): v.to_dict() for d, v in self.devices.items()},
        }

    def text(self) -> str:
        """A readable summary, a few lines per device."""
        parts = [d.text() for d in self.devices.values()]
        if len(self.devices) > 1:
            parts.insert(0, "\n".join(["total"] + ["  " + f.text() for f in self.total]))
        return "\n\n".join(parts) if parts else "no devices in either snapshot"

    def __str__(self) -> str:
        return self.text()


def _figures(a: MemoryFigures | _Zero, b: MemoryFigures | _Zero) -> tuple[FigureChange, ...]:
    return tuple(FigureChange(n, getattr(a, n), getattr(b, n)) for n in FIGURES)


def _segment_changes(a: Snapshot, b: Snapshot, device: int) -> SegmentChanges:
    def table(s: Snapshot) -> dict[tuple[int, int, int], int]:
        seg = s.segments
        rows = np.flatnonzero(seg.device == device)
        return {
            (int(seg.address[i]), int(seg.pool_id[i, 0]), int(seg.pool_id[i, 1])): int(
                seg.total_size[i]
            )
            for i in rows.tolist()
        }

    ta, tb = table(a), table(b)
    added = tb.keys() - ta.keys()
    removed = ta.keys() - tb.keys()
    both = ta.keys() & tb.keys()
    resized = [k for k in both if ta[k] != tb[k]]
    return SegmentChanges(
        added=len(added),
        added_bytes=sum(tb[k] for k in added),
        removed=len(removed),
        removed_bytes=sum(ta[k] for k in removed),
        resized=len(resized),
        resized_bytes=sum(tb[k] - ta[k] for k in resized),
        kept=len(both) - len(resized),
    )


def _holder_changes(
    a: Snapshot, b: Snapshot, device: int, top: int | None
) -> tuple[tuple[HolderChange, ...], tuple[HolderChange, ...]]:
    sa = {s.key: s for s in live_holders(a, device=device, top=None)}
    sb = {s.key: s for s in live_holders(b, device=device, top=None)}
    changes = []
    for key in sa.keys() | sb.keys():
        x, y = sa.get(key), sb.get(key)
        changes.append(
            HolderChange(
                label=(y or x).label,  # type: ignore[union-attr]
                key=key,
                before=x.bytes if x else 0,
                after=y.bytes if y else 0,
                count_before=x.count if x else 0,
                count_after=y.count if y else 0,
            )
        )
    grew = sorted((c for c in changes if c.delta > 0), key=lambda c: (-c.delta, c.key))
    shrank = sorted((c for c in changes if c.delta < 0), key=lambda c: (c.delta, c.key))
    if top is not None:
        grew, shrank = grew[:top], shrank[:top]
    return tuple(grew), tuple(shrank)


def diff(a: SnapshotLike, b: SnapshotLike, *, top: int | None = N_TOP) -> SnapshotDiff:
    """Compare two snapshots device by device: figures, segments and holders.

    Parameters
    ----------
    a, b : Snapshot, torch dict or list, path or bytes
        Before and after; anything `gpumemviz.io.as_snapshot` accepts.
    top : int or None
        How many holders to list as grown and as shrunk per device (None: all that changed).

    Returns
    -------
    SnapshotDiff
        `.devices[n].figure("reserved").delta` and friends; `.to_dict()` is the JSON of
        `gpumemviz diff --json`, `.text()` the readable form. A device present on one side
        only is compared against zeros.

    Examples
    --------
    >>> seg = {"device": 0, "address": 0, "total_size": 2097152, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...        {"size": 2097152, "state": "inactive", "requested_size": 0}]}
    >>> d = diff([seg], [])
    >>> d.device(0).figure("reserved").delta, d.device(0).segments.removed
    (-2097152, 1)
    """
    sa, sb = as_snapshot(a), as_snapshot(b)
    ra, rb = fragmentation(sa), fragmentation(sb)
    devices = sorted(set(ra.devices) | set(rb.devices))
    zero = _Zero()
    out: dict[int, DeviceDiff] = {}
    for d in devices:
        fa, fb = ra.devices.get(d), rb.devices.get(d)
        grew, shrank = _holder_changes(sa, sb, d, top)
        out[d] = DeviceDiff(
            device=d,
            present="both" if fa is not None and fb is not None else ("a" if fb is None else "b"),
            figures=_figures(fa or zero, fb or zero),
            segments=_segment_changes(sa, sb, d),
            holders_grew=grew,
            holders_shrank=shrank,
        )
    return SnapshotDiff(total=_figures(ra.total, rb.total), devices=out)


class _Zero:
    """Stands in for the figures of a device one side does not have."""

    def __getattr__(self, name: str) -> int | float:
        return 0.0 if name in _RATIOS else 0
