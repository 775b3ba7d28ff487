"""Many files at once: each rank's `Findings`, the ranks worst first, and what differs.

A distributed job's question is "which rank is worst, and why is it different". Each file of a
folder (`io.rank_files`) is analysed as one file is (`analyze`); the ranks are ordered worst
first (an OOM first, then leak suspects, then the most reserved) and the differences worth
reading are said in words: which ranks ran out, whose reserved or allocated stands out from the
median, whose top holder is not the others', whose settings differ.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpumemviz.analysis.findings import Findings, analyze
from gpumemviz.io import load_snapshot, rank_files
from gpumemviz.snapshot.escaping import one_line
from gpumemviz.snapshot.schema import JsonDict
from gpumemviz.snapshot.units import format_size

__all__ = ["STANDS_OUT", "RankFindings", "Ranks", "analyze_ranks"]

#: A rank's figure stands out when it is this share above (or below) the median of the ranks,
#: and by at least `_STANDS_OUT_BYTES`.
STANDS_OUT = 0.10
_STANDS_OUT_BYTES = 64 << 20


@dataclass(frozen=True)
class RankFindings:
    """One rank's file and its findings."""

    rank: int
    file: str
    findings: Findings

    def row(self) -> JsonDict:
        """The rank's line of the grid: its headline figures, OOM and suspects."""
        f = self.findings
        top = f.holders("frame")[:1]
        return {
            "rank": self.rank,
            "file": self.file,
            "reserved": f.figures.reserved,
            "allocated": f.figures.allocated,
            "largest_free": f.figures.largest_free,
            "fragmentation": f.figures.fragmentation,
            "oom": None if f.oom is None else f.oom.sentence,
            "suspects": len(f.growth),
            "forecast_s": None if f.forecast is None else f.forecast.seconds,
            "top_holder": top[0].to_dict() if top else None,
        }

    def to_dict(self) -> JsonDict:
        return {**self.row(), "findings": self.findings.to_dict()}


@dataclass(frozen=True)
class Ranks:
    """The ranks of a folder, worst first, and the differences between them in words."""

    folder: str
    ranks: tuple[RankFindings, ...]
    differences: tuple[str, ...]

    def lines(self, name: str) -> list[str]:
        """The ranks worst first, a line each (reserved, allocated, largest free, and the OOM,
        leak suspects and forecast where there are), then what differs: what ``gpumemviz
        inspect DIR`` and ``%gpumemviz --replay DIR`` print; `name` names the folder."""
        fs = format_size
        out = [f"{name}: {len(self.ranks)} rank file(s), worst first:"]
        for r in self.ranks:
            f = r.findings
            what = []
            if f.oom is not None:
                what.append(one_line(f.oom.sentence))
            if f.growth:
                what.append(f"{len(f.growth)} leak suspect(s): {one_line(f.growth[0].sentence)}")
            if f.forecast is not None:
                what.append(f.forecast.sentence)
            out.append(
                f"  rank {r.rank} ({one_line(r.file)}): reserved {fs(f.figures.reserved)}, "
                f"allocated {fs(f.figures.allocated)}, largest free {fs(f.figures.largest_free)}"
                + "".join(f"; {w}" for w in what)
            )
        if self.differences:
            out.append("what differs between the ranks:")
            out += [f"  - {d}" for d in self.differences]
        else:
            out.append("what differs between the ranks: nothing that stands out")
        return out

    def to_dict(self) -> JsonDict:
        """``folder``, ``grid`` (each rank's row, worst first), ``differences`` and ``ranks``
        (each rank's row with its full ``findings``)."""
        return {
            "folder": self.folder,
            "grid": [r.row() for r in self.ranks],
            "differences": list(self.differences),
            "ranks": [r.to_dict() for r in self.ranks],
        }


def _badness(r: RankFindings) -> tuple[int, int, int, int]:
    f = r.findings
    return (f.oom is None, -len(f.growth), -f.figures.reserved, r.rank)


def analyze_ranks(
    folder: str | os.PathLike[str],
    *,
    check: bool = True,
    device_total: int | None = None,
) -> Ranks:
    """Analyse every snapshot file of `folder` (one per rank), worst rank first.

    Parameters
    ----------
    folder : str or PathLike
        A folder of per-rank snapshot files (`gpumemviz.io.rank_files`: not recursive).
    check : bool
        Replay setting advice on each file's trace (as `analyze`).
    device_total : int, optional
        The devices' memory, for the forecast (as `analyze`).

    Returns
    -------
    Ranks

    Raises
    ------
    NotADirectoryError, FileNotFoundError
        Not a folder, or no snapshot file in it.
    SnapshotError
        A file that cannot be read (its name is in the message).
    """
    out = []
    for rank, path in rank_files(folder):
        snap = load_snapshot(path)
        found = analyze(snap, check=check, device_total=device_total)
        out.append(RankFindings(rank, path.name, found))
    ranked = tuple(sorted(out, key=_badness))
    return Ranks(str(Path(folder)), ranked, tuple(differences(ranked)))


def differences(ranks: Sequence[RankFindings]) -> list[str]:
    """What differs between the ranks, in words (empty for one rank or ranks alike).

    Examples
    --------
    >>> seg = lambda n: {"device": 0, "address": 0, "total_size": n, "stream": 0, "blocks": [
    ...     {"size": n, "requested_size": n, "state": "active_allocated", "frames": []}]}
    >>> rs = [RankFindings(r, f"rank{r}.pickle", analyze([seg(n << 20)]))
    ...       for r, n in ((0, 512), (1, 512), (2, 2048))]
    >>> for line in differences(rs):
    ...     print(line)
    rank 2 reserved 2.00 GiB, 4.0x the median 512.00 MiB
    rank 2 allocated 2.00 GiB, 4.0x the median 512.00 MiB
    """
    if len(ranks) < 2:
        return []
    out = []
    failed = [r.rank for r in ranks if r.findings.oom is not None]
    if failed and len(failed) < len(ranks):
        which = ", ".join(map(str, sorted(failed)))
        out.append(f"only rank {which} ran out of memory" if len(failed) == 1
                   else f"ranks {which} ran out of memory")  # fmt: skip
    for name in ("reserved", "allocated"):
        values = np.array([getattr(r.findings.figures, name) for r in ranks], np.int64)
        median = float(np.median(values))
        for r, v in zip(ranks, values.tolist(), strict=True):
            gap = abs(v - median)
            if gap > STANDS_OUT * median and gap >= _STANDS_OUT_BYTES:
                times = f"{v / median:.1f}x" if median else "more than"
                out.append(
                    f"rank {r.rank} {name} {format_size(v)}, {times} the median "
                    f"{format_size(round(median))}"
                )
    leaking = [r for r in ranks if r.findings.growth]
    if leaking and len(leaking) < len(ranks):
        for r in leaking:
            out.append(f"rank {r.rank} grows: {one_line(r.findings.growth[0].sentence)}")
    tops: dict[int, object] = {}
    for r in ranks:
        rows = r.findings.holders("frame")[:1]
        tops[r.rank] = rows[0].key if rows else None
    common = max(set(tops.values()), key=list(tops.values()).count)
    for rank, key in tops.items():
        if common is not None and key is not None and key != common:
            out.append(
                f"rank {rank}'s top holder is {one_line(str(key))}, not {one_line(str(common))}"
            )
    settings = {r.rank: r.findings.settings for r in ranks}
    if len(set(settings.values())) > 1:
        shown = "; ".join(f"rank {k}: {one_line(repr(v))}" for k, v in settings.items())
        out.append(f"the allocator settings differ ({shown})")
    return out
