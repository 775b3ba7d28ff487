"""What each open view of the panel has, and the frames that bring it up to date.

The widget owns one `Wire`; its single writer thread calls it. A view is one rendering of the
panel in a browser tab: it reports the rows it shows, and gets frames holding only the rows it
lacks or that changed. Both sides keep the rows of the same window around the view (`window`),
so Python always knows what the browser holds. No threads, no locks, no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.render.rows import MAX_CELLS, Group, RowTable, encode_cells
from gpumemviz.render.wire_frame import (
    BLOCK_BYTES,
    ROW_OVERHEAD,
    Frame,
    pack_blocks,
    pack_frame,
    row_digest,
    row_meta,
)

if TYPE_CHECKING:
    from gpumemviz.render.stacks import Stacks
    from gpumemviz.snapshot.schema import JsonDict

__all__ = [
    "EXACT_MAX_BLOCKS",
    "FIRST_FRAME_LIMIT",
    "FRAME_LIMIT",
    "MAX_VIEW_ROWS",
    "Wire",
    "header_numbers",
    "window",
]

FRAME_LIMIT = 64 << 10  # steady state: a new sample, a scroll
FIRST_FRAME_LIMIT = 256 << 10  # the first frame after a view opens or resizes
MAX_VIEW_ROWS = 200
EXACT_MAX_BLOCKS = 1 << 16  # one zoomed row's blocks on demand: at most ~1.9 MiB, once
_CONTENT_ALLOWANCE = 512  # the JSON part of a frame


def window(first: int, count: int) -> tuple[int, int]:
    """Rows both sides keep for a view: one view's height above and below it (js/src/rows.js)."""
    return first - count, first + 2 * count


@dataclass
class _View:
    first: int = 0
    count: int = 0
    cells: int = 0
    sent: dict[int, int] = field(default_factory=dict)


class Wire:
    """Frames for every open view, from the latest rows.

    Examples
    --------
    >>> from gpumemviz.snapshot import Snapshot
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...     {"size": 2 << 20, "requested_size": 2 << 20, "state": "active_allocated"}]}
    >>> from gpumemviz.render.rows import build_rows
    >>> wire = Wire()
    >>> wire.set_rows(build_rows(Snapshot.from_torch([seg])))
    True
    >>> [f.content["rows"] for f in wire.set_view("v1", first=0, count=40, cells=512)]
    [1]
    >>> wire.update()  # nothing changed: nothing to send
    []
    """

    def __init__(self) -> None:
        self.rows: RowTable | None = None
        self.stacks: Stacks | None = None
        self.layout_version = 0
        self._layout_key: tuple[int, tuple[Group, ...]] | None = None
        self._views: dict[str, _View] = {}
        self._seq = 0

    @property
    def views(self) -> tuple[str, ...]:
        return tuple(self._views)

    def layout(self) -> JsonDict:
        """The synced layout trait: row count, groups and the largest segment's bytes (the
        map's "to scale" mode sizes every row against it), versioned (the version moves with
        the rows' grouping only: `max_size` may change under one version)."""
        rows = self.rows
        return {
            "version": self.layout_version,
            "n_rows": rows.n_rows if rows is not None else 0,
            "groups": [g.to_dict() for g in rows.groups] if rows is not None else [],
            "max_size": _largest(rows),
        }

    def set_rows(self, rows: RowTable, stacks: Stacks | None = None) -> bool:
        """Take new rows (and the stacks of their snapshot's blocks, for the hover); True when
        the layout (row count or groups) changed."""
        self.rows = rows
        self.stacks = stacks
        key = (rows.n_rows, rows.groups)
        if key == self._layout_key:
            return False
        self._layout_key = key
        self.layout_version += 1
        return True

    def set_view(self, view: str, first: int, count: int, cells: int) -> list[Frame]:
        """A view opened, scrolled or resized: frames with the rows it lacks, nearest first."""
        first = max(0, int(first))
        count = min(max(1, int(count)), MAX_VIEW_ROWS)
        cells = min(max(1, int(cells)), MAX_CELLS)
        v = self._views.get(view)
        fresh = v is None or v.cells != cells or v.count != count
        if v is None or v.cells != cells:
            v = self._views[view] = _View()
        lo, hi = window(first, count)
        v.sent = {r: d for r, d in v.sent.items() if lo <= r < hi}
        v.first, v.count, v.cells = first, count, cells
        limit = FIRST_FRAME_LIMIT if fresh else FRAME_LIMIT
        below = range(first + count, hi)
        above = range(first - 1, lo - 1, -1)
        return self._frames(view, v, range(first, first + count), [*below, *above], limit)

    def exact_blocks(
        self, view: str, row: int, lo: int | None = None, hi: int | None = None
    ) -> list[Frame]:
        """The zoom asked for one row's exact blocks (its frame carried cells only): a frame
        with that row and all its blocks, from the current rows; a row of more than
        `EXACT_MAX_BLOCKS` blocks gets a `pack_blocks` message with the blocks of the zoom's
        byte window ``[lo, hi)`` instead (up to `EXACT_MAX_BLOCKS` of them)."""
        rows, v = self.rows, self._views.get(view)
        if rows is None or v is None or not 0 <= int(row) < rows.n_rows:
            return []
        if int(rows.block_count[row]) > EXACT_MAX_BLOCKS:
            lo = max(0, int(lo or 0))
            hi = int(hi) if hi is not None else int(rows.total_size[row])
            return [
                pack_blocks(
                    rows,
                    int(row),
                    lo,
                    hi,
                    view=view,
                    layout=self.layout_version,
                    limit=EXACT_MAX_BLOCKS,
                    stacks=self.stacks,
                )
            ]
        ids = np.array([int(row)], np.int64)
        cells = encode_cells(rows, ids, v.cells)
        self._seq += 1
        return [
            pack_frame(
                rows,
                ids,
                cells,
                row_meta(rows, ids),
                seq=self._seq,
                view=view,
                layout=self.layout_version,
                hover_budget=EXACT_MAX_BLOCKS * BLOCK_BYTES,
                stacks=self.stacks,
                exact_limit=EXACT_MAX_BLOCKS,
            )
        ]

    def view_state(self) -> dict[str, dict[str, int]]:
        """Each view's rows: {view: {first, count, cells}} (a copy)."""
        views = dict(self._views)  # one C-level copy: callable from any thread
        return {k: {"first": v.first, "count": v.count, "cells": v.cells} for k, v in views.items()}

    def drop_view(self, view: str) -> None:
        self._views.pop(view, None)

    def update(self) -> list[Frame]:
        """New rows arrived: for each view, the rows in view that changed (nothing if none did)."""
        frames = []
        for name, v in self._views.items():
            n = self.rows.n_rows if self.rows is not None else 0
            for r in [r for r in v.sent if r >= n]:
                del v.sent[r]
            frames += self._frames(name, v, range(v.first, v.first + v.count), [], FRAME_LIMIT)
        return frames

    def _frames(
        self, name: str, v: _View, must: range, extra: list[int], limit: int
    ) -> list[Frame]:
        rows = self.rows
        if rows is None:
            return []
        n = rows.n_rows
        must_ids = np.array([r for r in must if 0 <= r < n], np.int64)
        extra_ids = np.array([r for r in extra if 0 <= r < n], np.int64)
        per_row = ROW_OVERHEAD + v.cells
        frames: list[Frame] = []
        pending: tuple[np.ndarray, ...] = self._changed(v, must_ids)
        # rows in view first, as many frames as they need; prefetch only fills what is left
        cap = max(1, (limit - _CONTENT_ALLOWANCE) // per_row)
        while len(pending[0]):
            take = slice(0, cap)
            chunk = tuple(a[take] for a in pending)
            pending = tuple(a[cap:] for a in pending)
            room = limit - _CONTENT_ALLOWANCE - per_row * len(chunk[0])
            if not len(pending[0]) and len(extra_ids):
                more = self._changed(v, extra_ids[: max(0, room // per_row)])
                room -= per_row * len(more[0])
                chunk = tuple(np.concatenate([a, b]) for a, b in zip(chunk, more, strict=True))
            frames.append(self._pack(name, v, chunk, room))
        if not frames and len(extra_ids):
            room = limit - _CONTENT_ALLOWANCE
            chunk = self._changed(v, extra_ids[: room // per_row])
            if len(chunk[0]):
                frames.append(self._pack(name, v, chunk, room - per_row * len(chunk[0])))
        return frames

    def _changed(self, v: _View, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = self.rows
        assert rows is not None
        cells = encode_cells(rows, ids, v.cells)
        meta = row_meta(rows, ids)
        keep = []
        for j, r in enumerate(ids):
            d = row_digest(rows, int(r), cells[j], meta[j])
            if v.sent.get(int(r)) != d:
                v.sent[int(r)] = d
                keep.append(j)
        return ids[keep], cells[keep], meta[keep]

    def _pack(self, name: str, v: _View, chunk: tuple[np.ndarray, ...], room: int) -> Frame:
        self._seq += 1
        assert self.rows is not None
        ids, cells, meta = chunk
        return pack_frame(
            self.rows,
            ids,
            cells,
            meta,
            seq=self._seq,
            view=name,
            layout=self.layout_version,
            hover_budget=max(0, room - BLOCK_BYTES),
            stacks=self.stacks,
        )


def header_numbers(rows: RowTable) -> dict[str, int | float]:
    """Header numbers computed from the rows (bytes): they obey allocated + pending + free =
    reserved by construction."""
    t = rows.totals()
    free = rows.block_state == 0
    largest = int(rows.block_size[free].max()) if free.any() else 0
    free_bytes = t["free_releasable"] + t["free_trapped"]
    return {
        "reserved": t["reserved"],
        "allocated": t["allocated"],
        "pending_free": t["pending_free"],
        "free": free_bytes,
        "free_releasable": t["free_releasable"],
        "free_trapped": t["free_trapped"],
        "largest_free": largest,
        # external fragmentation, as fragmentation.MemoryFigures: 1 - largest free / free
        "fragmentation": 1.0 - largest / free_bytes if free_bytes else 0.0,
        "segments": rows.n_rows,
        "blocks": len(rows.block_size),
    }


def _largest(rows: RowTable | None) -> int:
    """The largest segment's bytes (0: no rows)."""
    return int(rows.total_size.max()) if rows is not None and rows.n_rows else 0
