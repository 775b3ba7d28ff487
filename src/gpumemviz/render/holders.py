"""The holders view's data: who holds the allocated bytes, bounded for a page or a message.

The report embeds it and the panel sends it (its ``holders`` trait); js/src/holders.js draws
both the same way: a table per holder key and an icicle of the call paths. The rows are the
findings' own (`Findings.holders`), cut to the top `N_TOP` per key with a ``rest`` that keeps
the sum exact, so the view says what ``gpumemviz inspect --holders`` says, whatever the file's
size.

`holder_marks` answers a click in the panel: where one holder's blocks lie in the segment map
(map row, offset in the row, size), at most `MAX_MARKS` of them per message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpumemviz.analysis.holders import HOLDER_KEYS, N_TOP, HolderRow
from gpumemviz.render.rows import RowTable
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.schema import JsonDict

__all__ = ["MAX_MARKS", "holder_marks", "holders_view"]

MAX_MARKS = 1 << 15  # blocks one click marks: about 0.6 MB of JSON at most


def holders_view(rows_of: Callable[[str], Sequence[HolderRow]], top: int = N_TOP) -> JsonDict:
    """Every holder key's top rows and the rest, with the allocated bytes they sum to.

    Parameters
    ----------
    rows_of : callable
        ``by -> rows`` for each of `HOLDER_KEYS` (`Findings.holders`, `holder_rows`).
    top : int
        Rows kept per key; the others are summed into ``rest``.

    Returns
    -------
    dict
        ``{"keys": [...], "allocated": int, "by": {by: {"rows": [HolderRow.to_dict()],
        "rest": {"rows", "bytes", "count"}}}}``; each key's rows plus its rest sum to
        ``allocated``.

    Examples
    --------
    >>> from gpumemviz.analysis.holders import holder_rows
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "blocks": [
    ...     {"size": 1 << 20, "state": "active_allocated", "requested_size": 1 << 20,
    ...      "frames": [{"filename": "train.py", "line": 9, "name": "step"}]},
    ...     {"size": 512, "state": "active_allocated", "requested_size": 512, "frames": []},
    ...     {"size": (1 << 20) - 512, "state": "inactive", "requested_size": 0}]}
    >>> v = holders_view(lambda by: holder_rows([seg], by), top=1)
    >>> v["allocated"], v["by"]["frame"]["rows"][0]["bytes"], v["by"]["frame"]["rest"]
    (1049088, 1048576, {'rows': 1, 'bytes': 512, 'count': 1})
    """
    by: JsonDict = {}
    allocated = 0
    for key in HOLDER_KEYS:
        rows = list(rows_of(key))
        rest = rows[top:]
        by[key] = {
            "rows": [r.to_dict() for r in rows[:top]],
            "rest": {
                "rows": len(rest),
                "bytes": sum(r.bytes for r in rest),
                "count": sum(r.count for r in rest),
            },
        }
        allocated = sum(r.bytes for r in rows)  # the same for every key
    return {"keys": list(HOLDER_KEYS), "allocated": allocated, "by": by}


def holder_marks(
    snap: Snapshot, holder: HolderRow, rows: RowTable, limit: int = MAX_MARKS
) -> JsonDict:
    """Where one holder's blocks lie in the segment map drawn from `rows`.

    Parameters
    ----------
    snap : Snapshot
        The state the holder's ``blocks`` index (`Snapshot.blocks` rows).
    holder : HolderRow
    rows : RowTable
        The map's rows (`build_rows`); may be of a newer state: a block is placed by its
        device and address, and one no row covers any longer is left out.
    limit : int
        The most blocks listed (the largest first).

    Returns
    -------
    dict
        ``row``, ``offset``, ``size`` (lists, one entry per block placed), ``bytes`` and
        ``count`` (of the blocks placed), ``missing`` (blocks no row covers) and ``more``
        (blocks left out by `limit`).

    Examples
    --------
    >>> from gpumemviz.analysis.holders import holder_rows
    >>> from gpumemviz.render.rows import build_rows
    >>> seg = {"device": 0, "address": 4096, "total_size": 2 << 20, "stream": 0, "blocks": [
    ...     {"size": 1 << 20, "state": "inactive", "requested_size": 0},
    ...     {"size": 1 << 20, "state": "active_allocated", "requested_size": 1 << 20}]}
    >>> snap = Snapshot.from_torch([seg])
    >>> m = holder_marks(snap, holder_rows(snap, "stream")[0], build_rows(snap))
    >>> m["row"], m["offset"], m["size"], m["bytes"], m["missing"], m["more"]
    ([0], [1048576], [1048576], 1048576, 0, 0)
    """
    b = snap.blocks
    idx = np.asarray(holder.blocks, np.int64)
    idx = idx[np.argsort(-b.size[idx], kind="stable")]  # the largest first
    device = snap.segments.device[b.segment[idx]]
    address = b.address[idx]
    row = np.full(len(idx), -1, np.int64)
    for d in np.unique(device).tolist():
        mine = np.flatnonzero(rows.device == d)
        if not len(mine):
            continue
        mine = mine[np.argsort(rows.address[mine], kind="stable")]
        at = np.flatnonzero(device == d)
        pos = np.searchsorted(rows.address[mine], address[at], side="right") - 1
        ok = pos >= 0
        cand = mine[np.maximum(pos, 0)]
        ok &= address[at] < rows.address[cand] + rows.total_size[cand]
        row[at[ok]] = cand[ok]
    placed = np.flatnonzero(row >= 0)
    shown = placed[:limit]
    size = b.size[idx[shown]]
    return {
        "row": row[shown].tolist(),
        "offset": (address[shown] - rows.address[row[shown]]).tolist(),
        "size": size.tolist(),
        "bytes": int(size.sum()),
        "count": len(shown),
        "missing": int(len(idx) - len(placed)),
        "more": int(len(placed) - len(shown)),
    }
