"""The rank grid's order and labels: one strip per (rank, device), the rank closest to OOM
first, stale ranks marked with their age.

Both front ends draw this list: the terminal (`gpumemviz job`, `gpumemviz.distributed.terminal`)
and the panel's job view, whose strips are the multi-device panel's (`render.strips` dicts plus
the rank fields and the ``title`` / ``note`` added here).
"""

from __future__ import annotations

from typing import Any

from gpumemviz.distributed.keys import Json, short_text
from gpumemviz.snapshot.units import format_size

__all__ = ["closeness", "grid_rows"]


def closeness(row: Json) -> tuple[float, int, int]:
    """The sort key: headroom as a share of the device (bytes when its total is unknown), then
    rank, then device. A rank with no figures at all goes last."""
    room, total = row.get("headroom"), row.get("total")
    if isinstance(room, int) and isinstance(total, int) and total > 0:
        key = room / total
    elif isinstance(room, int):
        key = float(room)
    else:
        key = float("inf")
    return key, int(row.get("rank", 0)), int(row.get("device", 0))


def grid_rows(ranks: list[Json]) -> list[dict[str, Any]]:  # Any: JSON values
    """`ranks` (what `JobView.ranks` returns) in grid order, each with ``title`` ("rank 3 ·
    cuda:0 · host") and ``note`` ("suspect: why" for a value that is not a summary, "stale:
    12.0 s", the last OOM's cause, or "").

    >>> rows = [{"rank": 0, "device": 0, "host": "a", "headroom": 8, "total": 10, "stale": False},
    ...         {"rank": 1, "device": 0, "host": "a", "headroom": 1, "total": 10, "stale": True,
    ...          "age_s": 12.0}]
    >>> [(r["rank"], r["note"]) for r in grid_rows(rows)]
    [(1, 'stale: 12.0 s'), (0, '')]
    """
    out = []
    for row in sorted(ranks, key=closeness):
        strip = dict(row)
        host = short_text(row.get("host", "?"), 40)
        strip["title"] = f"rank {row.get('rank')} \u00b7 cuda:{row.get('device')} \u00b7 {host}"
        strip["note"] = _note(row)
        out.append(strip)
    return out


def _note(row: Json) -> str:
    suspect = row.get("suspect")
    if suspect:
        return short_text(f"suspect: {suspect}", 80)
    if row.get("stale"):
        age = row.get("age_s")
        return f"stale: {age:.1f} s" if isinstance(age, int | float) else "stale: never updated"
    oom = row.get("last_oom")
    if isinstance(oom, dict) and oom.get("cause"):
        size = oom.get("alloc_size")
        asked = f" asking {format_size(size)}" if isinstance(size, int) else ""
        return short_text(f"OOM ({oom['cause']}){asked}", 60)
    if row.get("demo"):
        return "simulated"
    return ""
