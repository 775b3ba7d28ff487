"""Frames: the rows in view packed as little-endian binary buffers for js/src/decode.js.

A frame is ``(content, buffers)``: ``content`` is a small JSON dict, ``buffers`` are bytes that
anywidget delivers to the browser as DataViews. docs/internals.md ("wire") is the format's spec;
`decode_frame` is its Python reading, used by the tests and the benchmark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumemviz.render.rows import KIND_NAMES, RowTable
from gpumemviz.snapshot.escaping import short_repr

if TYPE_CHECKING:
    from gpumemviz.render.stacks import Hover, Stacks
    from gpumemviz.snapshot.schema import JsonDict

__all__ = [
    "FRAME_FORMAT",
    "META_FIELDS",
    "Frame",
    "decode_frame",
    "frame_nbytes",
    "pack_frame",
    "row_digest",
    "row_meta",
]

FRAME_FORMAT = 1
# one float64 per field per row; every value is an integer below 2**53
META_FIELDS = (
    "address",
    "total_size",
    "stream",
    "device",
    "flags",  # 1: small pool, 2: expandable
    "n_blocks",
    *KIND_NAMES,  # bytes per kind
)
_BLOCK_FIELDS = 3  # offset, size, requested (float64 each) + state (uint8, own buffer)
BLOCK_BYTES = _BLOCK_FIELDS * 8 + 1 + 4  # + the block's stack index (int32, own buffer)
STACK_BUDGET = 16 << 10  # JSON bytes of stacks one frame may carry (within its hover budget)
ROW_OVERHEAD = 4 + len(META_FIELDS) * 8 + 4  # row id + meta + hover index


@dataclass(frozen=True)
class Frame:
    """One message: JSON content plus its binary buffers."""

    content: JsonDict
    buffers: list[bytes]

    @property
    def nbytes(self) -> int:
        return frame_nbytes(self.content, self.buffers)


def row_meta(rows: RowTable, ids: np.ndarray) -> np.ndarray:
    """``(len(ids), len(META_FIELDS))`` float64: what the hover and the labels need per row."""
    ids = np.asarray(ids, np.int64)
    flags = rows.is_small[ids].astype(np.int64) | (rows.is_expandable[ids].astype(np.int64) << 1)
    cols = [
        rows.address[ids],
        rows.total_size[ids],
        rows.stream[ids],
        rows.device[ids],
        flags,
        rows.block_count[ids],
        *(rows.kind_bytes[ids, k] for k in range(len(KIND_NAMES))),
    ]
    return np.column_stack(cols).astype(np.float64) if len(ids) else np.zeros((0, 10))


def row_digest(rows: RowTable, row: int, cells: np.ndarray, meta: np.ndarray) -> int:
    """A fingerprint of everything a frame says about one row: equal digests send nothing."""
    b = rows.blocks(row)
    return hash(
        (
            cells.tobytes(),
            meta.tobytes(),
            b["size"].tobytes(),
            b["state"].tobytes(),
            b["requested"].tobytes(),
        )
    )


class _StackTable:
    """The allocation stacks one message carries, each once, within a byte budget; blocks refer
    to them by index (-1: no stack, or it did not fit)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.stacks: list[Hover] = []
        self._index: dict[int, int] = {}

    def index(self, stack: Hover) -> int:
        """The stack's index, adding it while the budget lasts; -1 once it does not fit."""
        k = self._index.get(id(stack))
        if k is None:
            cost = len(json.dumps(stack)) + 2
            if cost > self.room:
                return -1
            self.room -= cost
            k = self._index[id(stack)] = len(self.stacks)
            self.stacks.append(stack)
        return k


def pack_frame(
    rows: RowTable,
    ids: np.ndarray,
    cells: np.ndarray,
    meta: np.ndarray,
    *,
    seq: int,
    view: str,
    layout: int,
    hover_budget: int,
    stacks: Stacks | None = None,
    exact_limit: int | None = None,
) -> Frame:
    """Pack rows into one frame; exact blocks ride along for rows with fewer blocks than cells.

    Parameters
    ----------
    rows : RowTable
    ids : array of int
        Row indices, in the order they go on the wire.
    cells, meta : numpy.ndarray
        `encode_cells` and `row_meta` of those rows.
    seq, view, layout : int, str, int
        Frame number, the view it answers, the layout version the rows belong to.
    hover_budget : int
        Bytes available for exact blocks; rows that would overflow it carry none.
    stacks : render.stacks.Stacks, optional
        The allocation stacks of the shown snapshot; the hover blocks' stacks ride along in the
        content (deduplicated), within what is left of ``hover_budget`` and `STACK_BUDGET`.
    exact_limit : int, optional
        Most blocks a row may carry (default: the cell count; the on-demand zoom asks for more).

    Returns
    -------
    Frame
    """
    ids = np.asarray(ids, np.int64)
    n_cells = cells.shape[1] if cells.ndim == 2 else 0
    counts = np.zeros(len(ids), np.int64)
    used = 0
    limit = n_cells if exact_limit is None else int(exact_limit)
    for j, r in enumerate(ids):
        n = int(rows.block_count[r])
        if n <= limit and used + n * BLOCK_BYTES <= hover_budget:
            counts[j] = n
            used += n * BLOCK_BYTES
    index = np.concatenate([[0], np.cumsum(counts)]).astype("<u4")
    blocks = np.zeros((int(index[-1]), _BLOCK_FIELDS), "<f8")
    states = np.zeros(int(index[-1]), np.uint8)
    for j, r in enumerate(ids):
        if counts[j]:
            b = rows.blocks(int(r))
            lo, hi = int(index[j]), int(index[j + 1])
            blocks[lo:hi, 0] = b["offset"]
            blocks[lo:hi, 1] = b["size"]
            blocks[lo:hi, 2] = b["requested"]
            states[lo:hi] = b["state"]
    stack_of = np.full(int(index[-1]), -1, "<i4")
    table = _StackTable(min(STACK_BUDGET, max(0, hover_budget - used)))
    if stacks is not None and len(stack_of):
        for j, r in enumerate(ids):
            for k in range(int(counts[j])):
                stack = stacks.for_block(int(rows.segment[r]), k)
                if stack is not None:
                    stack_of[int(index[j]) + k] = table.index(stack)
    content = {
        "kind": "frame",
        "format": FRAME_FORMAT,
        "seq": seq,
        "view": view,
        "layout": layout,
        "rows": len(ids),
        "cells": int(n_cells),
        "blocks": int(index[-1]),
        "stacks": table.stacks,
    }
    buffers = [
        ids.astype("<u4").tobytes(),
        np.ascontiguousarray(cells, np.uint8).tobytes(),
        np.ascontiguousarray(meta, "<f8").tobytes(),
        index.tobytes(),
        blocks.tobytes(),
        states.tobytes(),
        stack_of.tobytes(),
    ]
    return Frame(content, buffers)


def pack_blocks(
    rows: RowTable,
    row: int,
    lo: int,
    hi: int,
    *,
    view: str,
    layout: int,
    limit: int,
    stacks: Stacks | None = None,
) -> Frame:
    """The exact blocks of one row that overlap bytes ``[lo, hi)`` of its segment, at most
    ``limit`` of them from the first: the zoom of a segment too big to send whole.

    The message is ``{kind: "blocks", view, layout, row, first, lo, hi, stacks}`` (``lo``,
    ``hi``: the bytes the blocks cover) with three buffers: offset/size/requested (float64 x3),
    state (uint8), stack index (int32, -1 none).
    """
    b = rows.blocks(int(row))
    end = b["offset"] + b["size"]
    i0 = int(np.searchsorted(end, lo, side="right"))
    i1 = min(int(np.searchsorted(b["offset"], hi, side="left")), i0 + int(limit))
    i1 = max(i0, i1)
    out = np.zeros((i1 - i0, _BLOCK_FIELDS), "<f8")
    out[:, 0], out[:, 1], out[:, 2] = b["offset"][i0:i1], b["size"][i0:i1], b["requested"][i0:i1]
    stack_of = np.full(i1 - i0, -1, "<i4")
    table = _StackTable(STACK_BUDGET)
    if stacks is not None:
        for k in range(i0, i1):
            stack = stacks.for_block(int(rows.segment[row]), k)
            if stack is not None:
                stack_of[k - i0] = table.index(stack)
    covered = (int(b["offset"][i0]), int(end[i1 - 1])) if i1 > i0 else (int(lo), int(lo))
    content = {
        "kind": "blocks",
        "view": view,
        "layout": layout,
        "row": int(row),
        "first": i0,
        "lo": covered[0],
        "hi": covered[1],
        "stacks": table.stacks,
    }
    buffers = [
        out.tobytes(),
        np.ascontiguousarray(b["state"][i0:i1], np.uint8).tobytes(),
        stack_of.tobytes(),
    ]
    return Frame(content, buffers)


def frame_nbytes(content: JsonDict, buffers: list[bytes]) -> int:
    """Bytes on the wire, roughly: the buffers plus the JSON content."""
    return sum(len(b) for b in buffers) + len(json.dumps(content))


def decode_frame(content: JsonDict, buffers: list[bytes]) -> dict[str, Any]:  # Any: arrays, lists
    """Read a frame back into numpy arrays (the Python twin of js/src/decode.js).

    Returns
    -------
    dict
        ``rows`` (k,), ``cells`` (k, n_cells), ``meta`` (k, len(META_FIELDS)), and ``blocks``:
        a list with, per row, a dict of offset/size/requested/state arrays and stack (a list:
        each block's `{lines, user}` or None), or None.
    """
    if content.get("kind") != "frame" or content.get("format") != FRAME_FORMAT:
        raise ValueError(
            f"not a gpumemviz frame of format {FRAME_FORMAT}: {short_repr(content.get('kind'))}"
        )
    k, n_cells = int(content["rows"]), int(content["cells"])
    bufs = [bytes(b) for b in buffers]
    ids = np.frombuffer(bufs[0], "<u4").astype(np.int64)
    cells = np.frombuffer(bufs[1], np.uint8).reshape(k, n_cells)
    meta = np.frombuffer(bufs[2], "<f8").reshape(k, len(META_FIELDS))
    index = np.frombuffer(bufs[3], "<u4")
    blocks = np.frombuffer(bufs[4], "<f8").reshape(-1, _BLOCK_FIELDS)
    states = np.frombuffer(bufs[5], np.uint8)
    stack_of = np.frombuffer(bufs[6], "<i4") if len(bufs) > 6 else np.full(len(states), -1)
    table = content.get("stacks") or []
    per_row: list[dict[str, Any] | None] = []  # arrays, and the stacks list
    for j in range(k):
        lo, hi = int(index[j]), int(index[j + 1])
        if hi == lo and meta[j, META_FIELDS.index("n_blocks")] > 0:
            per_row.append(None)
            continue
        per_row.append(
            {
                "offset": blocks[lo:hi, 0].astype(np.int64),
                "size": blocks[lo:hi, 1].astype(np.int64),
                "requested": blocks[lo:hi, 2].astype(np.int64),
                "state": states[lo:hi],
                "stack": [table[i] if i >= 0 else None for i in stack_of[lo:hi].tolist()],
            }
        )
    return {"rows": ids, "cells": cells, "meta": meta, "blocks": per_row}
