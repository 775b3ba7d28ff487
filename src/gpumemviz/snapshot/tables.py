"""The snapshot's tables and views: segment and block columns, the frozen `Segment` and `Block`
values humans read, and `Trace`, one device's trace entries as columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from .columns import int_column, readonly, row_index, take, taker
from .messages import short_repr, type_phrase
from .schema import ACTIONS, TRACE_KEYS, IntColumn, SnapshotError
from .shapes import RowShape


@dataclass(frozen=True, eq=False)
class SegmentTable:
    """One row per segment (an expandable segment: one row per mapped run), in file order."""

    device: np.ndarray
    address: np.ndarray
    total_size: np.ndarray
    allocated_size: np.ndarray
    active_size: np.ndarray
    requested_size: np.ndarray
    stream: np.ndarray
    is_small: np.ndarray
    is_expandable: np.ndarray
    pool_id: np.ndarray  # (n, 2)
    block_start: np.ndarray
    block_count: np.ndarray

    def __len__(self) -> int:
        return len(self.address)


@dataclass(frozen=True, eq=False)
class BlockTable:
    """One row per block, segment by segment, in address order inside a segment."""

    segment: np.ndarray
    address: np.ndarray
    size: np.ndarray
    requested_size: np.ndarray
    state: np.ndarray  # u1 codes into STATE_NAMES

    def __len__(self) -> int:
        return len(self.size)


@dataclass(frozen=True)
class Block:
    """A block, for humans. `requested_size` is stale on inactive blocks (torch keeps the last)."""

    index: int
    segment: int
    address: int
    size: int
    requested_size: int
    state: str
    frames: tuple[dict, ...]


@dataclass(frozen=True)
class Segment:
    """A segment with its blocks, for humans."""

    index: int
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str
    pool_id: tuple[int, int]
    is_expandable: bool
    frames: tuple[dict, ...]
    blocks: tuple[Block, ...]

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.address + self.total_size


@dataclass(frozen=True, eq=False)
class Trace:
    """One device's trace: numpy columns plus the entries' frames and strings, kept as given.

    `action` indexes `action_names`, whose first entries are `ACTIONS`; unknown actions follow.
    `addr`, `size`, `stream`, `time_us` and `device_free` are -1 where an entry lacks the key.
    """

    action: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    time_us: np.ndarray
    device_free: np.ndarray
    action_names: tuple[str, ...] = ACTIONS
    _objects: Mapping[str, list | None] = field(default_factory=dict, repr=False)
    _shape: RowShape = field(default=RowShape.uniform(TRACE_KEYS[:5]), repr=False)

    def __len__(self) -> int:
        return len(self.action)

    @classmethod
    def empty(cls) -> Trace:
        """A trace with no entries (history was off, or another device)."""
        z = readonly(np.zeros(0, np.int64))
        return cls(readonly(np.zeros(0, np.uint8)), z, z, z, z, z)

    @classmethod
    def from_entries(cls, entries: Sequence[dict], where: str = "trace") -> Trace:
        """Build from torch's list of trace-entry dicts (any generation; unknown keys kept)."""
        if not isinstance(entries, list | tuple):
            raise SnapshotError(f"{where} is {type_phrase(entries)}, not a list")
        if not entries:
            return cls.empty()
        for i, e in enumerate(entries):
            if type(e) is not dict:
                raise SnapshotError(f"{where}, entry {i} is {type_phrase(e)}, not a dict")
        shape = RowShape.of(entries, TRACE_KEYS)

        def at(i: int) -> str:
            return f"{where}, entry {i}"

        try:
            names = list(map(itemgetter("action"), entries))
        except KeyError:
            i = next(i for i, e in enumerate(entries) if "action" not in e)
            raise SnapshotError(f"{at(i)} has no action") from None
        table = {a: c for c, a in enumerate(ACTIONS)}
        if set(map(type, names)) - {str}:
            i = next(i for i, name in enumerate(names) if type(name) is not str)
            raise SnapshotError(f"{at(i)}: action {short_repr(names[i])} is not a string")
        for name in sorted(set(names) - table.keys()):
            table[name] = len(table)
        if len(table) > 255:
            raise SnapshotError(f"{where}: more than 255 distinct actions")
        action_names = tuple(table)
        action = np.fromiter(map(table.__getitem__, names), np.uint8, len(names))
        cols = {
            k: readonly(int_column([e.get(k, -1) for e in entries], k, at))
            for k in ("addr", "size", "stream", "time_us", "device_free")
        }
        present = set().union(*shape.layouts)
        objects = {
            k: ([e.get(k) for e in entries] if k in present else None)
            for k in ("frames", "compile_context", "user_metadata")
        }
        return cls(
            readonly(action), **cols, action_names=action_names, _objects=objects, _shape=shape
        )

    @classmethod
    def from_columns(
        cls,
        *,
        action: IntColumn,
        addr: IntColumn,
        size: IntColumn,
        stream: IntColumn,
        time_us: IntColumn | None = None,
        device_free: IntColumn | None = None,
        frames: list | None = None,
    ) -> Trace:
        """Build from columns (the allocator model's fast path); `action` indexes `ACTIONS`.

        Entries become `{action, addr, size, stream[, time_us][, frames]}`; an `oom` entry
        carries `device_free` instead of `addr`, as torch writes it.
        """
        act = np.asarray(action, np.uint8)
        n = len(act)
        if act.size and act.max() >= len(ACTIONS):
            raise SnapshotError(f"trace: action code {int(act.max())} is not in ACTIONS")

        def col(v: Any) -> np.ndarray:
            a = np.full(n, -1, np.int64) if v is None else np.asarray(v, np.int64).copy()
            if a.shape != (n,):
                raise SnapshotError(f"trace: column of length {len(a)}, expected {n}")
            return readonly(a)

        base = ["action", "addr", "size", "stream"]
        if time_us is not None:
            base.append("time_us")
        if frames is not None:
            base.append("frames")
        oom = ACTIONS.index("oom")
        layouts = (tuple(base), tuple(k if k != "addr" else "device_free" for k in base))
        is_oom = act == oom
        if is_oom.any():
            shape = RowShape(layouts, readonly(is_oom.astype(np.uint8)), {})
        else:
            shape = RowShape.uniform(layouts[0])
        objects = {"frames": list(frames) if frames is not None else None}
        columns = [col(v) for v in (addr, size, stream, time_us, device_free)]
        return cls(readonly(act.copy()), *columns, _objects=objects, _shape=shape)

    def _values(self) -> dict[str, Any]:
        names = self.action_names
        vals: dict[str, Any] = {
            "action": lambda idx: [names[c] for c in take(self.action, idx)],
        }
        for k in ("addr", "size", "stream", "time_us", "device_free"):
            vals[k] = taker(getattr(self, k))
        for k, v in self._objects.items():
            if v is not None:
                vals[k] = v
        return vals

    def frames(self) -> list:
        """Each entry's stack (shared, not copied); `[]` where the entry has no `frames` key or
        its `frames` is not a list (a malformed stack reads as none recorded)."""
        f = self._objects.get("frames")
        if f is None:
            return [[]] * len(self)
        return [x if type(x) is list or type(x) is tuple else [] for x in f]

    def entries(self) -> list[dict]:
        """The torch list of entry dicts (frames and strings shared, not copied)."""
        return self._shape.build(len(self), self._values())

    def entry(self, i: int) -> dict:
        """Entry `i` as torch writes it."""
        i = row_index(i, len(self), "trace entry", "entries")
        c = 0 if self._shape.code is None else int(self._shape.code[i])
        vals = self._values()
        out = {}
        for k in self._shape.layouts[c]:
            if k not in vals:
                out[k] = self._shape.extra[i][k]
            elif callable(vals[k]):
                out[k] = vals[k](np.array([i]))[0]
            else:
                out[k] = vals[k][i]
        return out
