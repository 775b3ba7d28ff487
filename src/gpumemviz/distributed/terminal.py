"""The rank grid as text: what `gpumemviz job HOST:PORT` prints (and reprints) in a terminal.

One line per (rank, device) in `grid_rows` order: the figures, the binned segment map drawn with
shade characters (the allocated share of each cell; "·" a free cell, blank: nothing reserved)
and the note (stale age, last OOM). Host names and notes come from other processes: the command
prints every line through `gpumemviz.cli.output.say`, which escapes them.
"""

from __future__ import annotations

from gpumemviz.distributed.grid import grid_rows
from gpumemviz.distributed.keys import Json
from gpumemviz.snapshot.units import format_size

__all__ = ["MAP_CHARS", "grid_text", "map_text"]

MAP_CHARS = 32  # the map column's width
_SHADES = "\u00b7\u2591\u2592\u2593\u2588"  # ·░▒▓█: no allocated byte .. wholly allocated


def map_text(bins: object, width: int = MAP_CHARS) -> str:
    """Cell bytes (`gpumemviz.render.strips.device_bins`) as `width` shade characters.

    >>> map_text([63, 63, 0, 0, 192, 192, 32, 32], 4)
    '█ ·▓'
    """
    if not isinstance(bins, list) or not bins or not all(isinstance(b, int) for b in bins):
        return " " * width
    out = []
    n = len(bins)
    for i in range(width):
        cell = bins[i * n // width : max(i * n // width + 1, (i + 1) * n // width)]
        if not any(cell):
            out.append(" ")
            continue
        level = max(b & 63 for b in cell if b)
        out.append(_SHADES[0] if level == 0 else _SHADES[min(4, 1 + level * 4 // 64)])
    return "".join(out)


def _size(value: object) -> str:
    return format_size(value) if isinstance(value, int) else "?"


def grid_text(ranks: list[Json], *, title: str = "", dropped: int = 0) -> str:
    """The grid of `ranks` (what `JobView.ranks` returns) as lines of text; `dropped` (the
    view's) says how many (rank, device) entries were not read.

    >>> print(grid_text([]))
    no rank has published yet
    >>> print(grid_text([], dropped=3))
    no rank has published yet
    3 more (rank, device) entries in the store not read (over the cap, or not rank:device)
    """
    tail = (
        f"\n{dropped} more (rank, device) entries in the store not read (over the cap, or not "
        "rank:device)"
        if dropped
        else ""
    )
    if not ranks:
        return (title + "\n" if title else "") + "no rank has published yet" + tail
    head = (
        f"{'rank':>4} {'dev':>3} {'host':<12} {'reserved':>10} {'allocated':>10} "
        f"{'largest free':>12} {'frag':>5} {'ooms':>4} {'headroom':>10}  "
        f"{'segment map':<{MAP_CHARS}}  note"
    )
    lines = [title] if title else []
    lines.append(head)
    for row in grid_rows(ranks):
        frag = row.get("fragmentation")
        lines.append(
            f"{row.get('rank', '?'):>4} {row.get('device', '?'):>3} "
            f"{str(row.get('host', '?'))[:12]:<12} {_size(row.get('reserved')):>10} "
            f"{_size(row.get('allocated')):>10} {_size(row.get('largest_free')):>12} "
            f"{(f'{frag:.0%}' if isinstance(frag, int | float) else '?'):>5} "
            f"{row.get('ooms', '?'):>4} {_size(row.get('headroom')):>10}  "
            f"{map_text(row.get('bins'))}  {row['note']}"
        )
    return "\n".join(lines) + tail
