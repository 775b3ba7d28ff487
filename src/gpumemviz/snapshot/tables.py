"""The snapshot's tables and views: segment and block columns, the frozen `Segment` and `Block`
values humans read, and `Trace`, one device's trace entries as columns.

A trace's entries nearly always share one key layout (torch writes every entry alike, but an
oom's): its columns are strided slices of the entries' values, read a chunk of rows at a time
(`_fast_columns`: each dict read once instead of once per key; a chunk holding an oom entry is
read entry by entry), 10^5 entries 70 ms -> 36 ms (with an oom entry 97 -> 39 ms); a trace
with keys outside `TRACE_KEYS` is read key by key.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from gpumemviz.snapshot.columns import int_column, readonly, row_index, take, taker
from gpumemviz.snapshot.escaping import short_repr, type_phrase
from gpumemviz.snapshot.schema import (
    ACTIONS,
    TRACE_KEYS,
    IntColumn,
    SnapshotError,
    TorchDict,
    TorchList,
)
from gpumemviz.snapshot.shapes import RowShape
from gpumemviz.snapshot.stacks import share_stacks


@dataclass(frozen=True, eq=False)
class SegmentTable:
    """One row per segment (an expandable segment: one row per mapped run), in file order:
    devices in order, addresses ascending inside a device. Every column is a read-only numpy
    array of length n_segments.

    Attributes
    ----------
    device, address, total_size, stream : int64
    allocated_size, active_size, requested_size : int64
        The file's values (derived from the blocks where the file lacks them); `validate`
        checks them against the blocks.
    is_small, is_expandable : bool
        ``segment_type == "small"``; an expandable segment.
    pool_id : int64, shape (n, 2)
        ``segment_pool_id``; (0, 0) is the default pool.
    block_start, block_count : int64
        The segment's blocks are rows ``[block_start, block_start + block_count)`` of the
        `BlockTable`.
    """

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
    """One row per block, segment by segment, in address order inside a segment. Every column
    is a read-only numpy array of length n_blocks.

    Attributes
    ----------
    segment, address, size, requested_size : int64
        `segment` indexes the `SegmentTable`. Legacy (torch 2.0) blocks have no address in the
        file: the column holds the segment address plus the sizes before, as torch computes it.
    state : uint8
        `INACTIVE` 0, `ALLOCATED` 1, `PENDING_FREE` 2 (indexes `STATE_NAMES`).
    """

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
    frames: tuple[TorchDict, ...]


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
    frames: tuple[TorchDict, ...]
    blocks: tuple[Block, ...]

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.address + self.total_size


@dataclass(frozen=True, eq=False)
class Trace:
    """One device's trace: numpy columns plus the entries' frames and strings, kept as given.

    `action` indexes `action_names`, whose first entries are `ACTIONS`; unknown actions follow.
    `addr`, `size`, `stream`, `time_us` and `device_free` are -1 where an entry lacks the key:
    `addr` of oom entries, `device_free` of all others, `time_us` before torch 2.2. ``len()``
    is the number of entries; `entry(i)` and `entries()` give torch's dicts back.

    Attributes
    ----------
    action : uint8
    addr, size, stream, time_us, device_free : int64
    action_names : tuple of str

    Examples
    --------
    >>> t = Trace.from_entries([{"action": "alloc", "addr": 4096, "size": 512, "stream": 0},
    ...                         {"action": "oom", "device_free": 0, "size": 1 << 30, "stream": 0}])
    >>> len(t), [t.action_names[a] for a in t.action], t.addr.tolist(), t.device_free.tolist()
    (2, ['alloc', 'oom'], [4096, -1], [-1, 0])
    >>> t.entry(1)
    {'action': 'oom', 'device_free': 0, 'size': 1073741824, 'stream': 0}
    """

    action: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    time_us: np.ndarray
    device_free: np.ndarray
    action_names: tuple[str, ...] = ACTIONS
    _objects: Mapping[str, TorchList | None] = field(default_factory=dict, repr=False)
    _shape: RowShape = field(default=RowShape.uniform(TRACE_KEYS[:5]), repr=False)

    def __len__(self) -> int:
        return len(self.action)

    @classmethod
    def empty(cls) -> Trace:
        """A trace with no entries (history was off, or another device)."""
        z = readonly(np.zeros(0, np.int64))
        return cls(readonly(np.zeros(0, np.uint8)), z, z, z, z, z)

    @classmethod
    def from_entries(
        cls, entries: Sequence[TorchDict], where: str = "trace", *, share: bool = True
    ) -> Trace:
        """Build from torch's list of trace-entry dicts (any generation; unknown keys kept).

        With `share`, equal stacks are kept as one list (`stacks.share_stacks`): what a file
        read once keeps. Without it the entries' own lists are kept, for a caller that keeps
        the entries alive anyway (sharing would then save nothing).
        """
        if not isinstance(entries, list | tuple):
            raise SnapshotError(f"{where} is {type_phrase(entries)}, not a list")
        if not entries:
            return cls.empty()
        if set(map(type, entries)) != {dict}:
            i, e = next((i, e) for i, e in enumerate(entries) if type(e) is not dict)
            raise SnapshotError(f"{where}, entry {i} is {type_phrase(e)}, not a dict")

        def at(i: int) -> str:
            return f"{where}, entry {i}"

        fast = _fast_columns(entries)  # every entry there has an action
        uniform = None if fast is None else fast[1]
        if fast is not None:
            shape, names = fast[0], fast[1]["action"]
        else:
            shape = RowShape.of(entries, TRACE_KEYS)
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
        present = set().union(*shape.layouts)
        everywhere = set.intersection(*map(set, shape.layouts))

        def column(k: str, default: Any) -> list[Any]:  # Any: the file's values
            if uniform is not None:
                got: list[Any] = uniform[k]
                return got
            if k in everywhere:  # one C-level pass
                return list(map(itemgetter(k), entries))
            return [e.get(k, default) for e in entries]

        def ints(k: str) -> np.ndarray:
            if k not in present:  # a key no entry has (device_free)
                return np.full(len(entries), -1, np.int64)
            got = None if uniform is None else uniform[k]
            return got if isinstance(got, np.ndarray) else int_column(column(k, -1), k, at)

        cols = {k: readonly(ints(k)) for k in _INT_KEYS}
        objects = {k: (column(k, None) if k in present else None) for k in _OBJECT_KEYS}
        if share and objects["frames"] is not None:  # a fresh list per entry, few stacks
            objects["frames"] = share_stacks(objects["frames"])
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
        frames: TorchList | None = None,
    ) -> Trace:
        """Build from columns (the allocator model's fast path); `action` indexes `ACTIONS`.

        Entries become `{action, addr, size, stream[, time_us][, frames]}`; an `oom` entry
        carries `device_free` instead of `addr`, as torch writes it.
        """
        act = np.asarray(action, np.uint8)
        n = len(act)
        if act.size and act.max() >= len(ACTIONS):
            raise SnapshotError(f"trace: action code {int(act.max())} is not in ACTIONS")

        def col(v: Any) -> np.ndarray:  # Any: an IntColumn, or None
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
        addrs, sizes, streams, times, frees = (
            col(v) for v in (addr, size, stream, time_us, device_free)
        )
        return cls(
            readonly(act.copy()),
            addrs,
            sizes,
            streams,
            times,
            frees,
            _objects=objects,
            _shape=shape,
        )

    def object_parts(self) -> TorchDict:
        """What the entries hold besides the int columns, as `Snapshot.map_objects` hands it
        to its function: ``{"objects": {key: list or None}`` (frames and strings, one value per
        entry, the lists shared), ``"extra": {row: {key: value}}`` (keys outside the known
        ones), ``"action_names": [str, ...]}``; the dicts and the name list are copies.

        Examples
        --------
        >>> t = Trace.from_entries([{"action": "alloc", "addr": 0, "size": 8, "stream": 0,
        ...                          "frames": [], "note": "x"}])
        >>> parts = t.object_parts()
        >>> parts["objects"]["frames"], parts["extra"], parts["action_names"][:2]
        ([[]], {0: {'note': 'x'}}, ['alloc', 'free_requested'])
        """
        return {
            "objects": dict(self._objects),
            "extra": dict(self._shape.extra),
            "action_names": list(self.action_names),
        }

    def with_object_parts(self, parts: TorchDict) -> Trace:
        """A copy with the same int columns (shared) and `parts`, shaped as `object_parts`
        returns them, in place of its own objects, extra values and action names.

        Examples
        --------
        >>> t = Trace.from_entries([{"action": "alloc", "addr": 0, "size": 8, "stream": 0,
        ...                          "note": "x"}])
        >>> parts = t.object_parts()
        >>> t.with_object_parts({**parts, "extra": {0: {"note": "y"}}}).entry(0)["note"]
        'y'
        """
        return replace(
            self,
            action_names=tuple(parts["action_names"]),
            _objects=parts["objects"],
            _shape=replace(self._shape, extra=parts["extra"]),
        )

    def _values(self) -> dict[str, Any]:  # Any: lists, or callables of row indices
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

    def frames(self) -> TorchList:
        """Each entry's stack (shared, not copied); `[]` where the entry has no `frames` key or
        its `frames` is not a list (a malformed stack reads as none recorded)."""
        f = self._objects.get("frames")
        if f is None:
            return [[]] * len(self)
        return [x if type(x) is list or type(x) is tuple else [] for x in f]

    def values(self, key: str) -> list[Any]:  # Any: the file's values, as given
        """Each entry's value of `key`, None where an entry lacks it: the int columns, the
        object keys (frames, user_metadata, ...) and any key torch added that gpumemviz does
        not know (``pool_id``, ``internal_metadata``, ``forward_frames``: carried as given).

        Examples
        --------
        >>> t = Trace.from_entries([{"action": "alloc", "addr": 0, "size": 8, "stream": 0,
        ...                          "pool_id": (1, 0)}, {"action": "free_requested",
        ...                          "addr": 0, "size": 8, "stream": 0}])
        >>> t.values("pool_id"), t.values("size"), t.values("user_metadata")
        ([(1, 0), None], [8, 8], [None, None])
        """
        n = len(self)
        if key == "action":
            return [self.action_names[c] for c in self.action.tolist()]
        if key in _INT_KEYS:
            col: list[Any] = getattr(self, key).tolist()
            return col
        got = self._objects.get(key)
        if got is not None:
            return list(got)
        extra = self._shape.extra
        if not extra:
            return [None] * n
        return [extra[i].get(key) if i in extra else None for i in range(n)]

    def entries(self) -> list[TorchDict]:
        """The torch list of entry dicts (frames and strings shared, not copied)."""
        return self._shape.build(len(self), self._values())

    def entry(self, i: int) -> TorchDict:
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


_INT_KEYS = ("addr", "size", "stream", "time_us", "device_free")
_OBJECT_KEYS = ("frames", "compile_context", "user_metadata")
_KNOWN = frozenset(TRACE_KEYS)
_ROWS = 1024  # entries read at a time: their keys, then values, 8 pointers each (64 KiB)


# Any: each key's column, an int64 array (`_INT_KEYS`) or the file's values
def _fast_columns(entries: Sequence[TorchDict]) -> tuple[RowShape, dict[str, Any]] | None:
    """The row shape and columns of entries (dicts) whose keys are all `TRACE_KEYS`, read
    `_ROWS` entries at a time: where every entry of a chunk has the first one's keys in its
    order, each column is a strided slice of their values; a chunk holding another layout (an
    oom entry) is read entry by entry. Integer keys as int64 arrays, -1 where an entry lacks the
    key (None for the others), as the careful path reads them. None where an entry has another
    key, or no action while the first has one, or an integer column holds something `int_column`
    refuses: the careful path reads (and names) it.
    """
    first = tuple(entries[0])
    w, n = len(first), len(entries)
    if "action" not in first or not _KNOWN.issuperset(first):
        return None
    layouts = {first: 0}
    code: np.ndarray | None = None
    cols: dict[str, Any] = {}  # each column made whole at once (-1 or None until read)

    def put(k: str, start: int, got: list[Any]) -> bool:  # Any: the file's values
        if k not in cols:
            cols[k] = np.full(n, -1, np.int64) if k in _INT_KEYS else [None] * n
        col = cols[k]
        if type(col) is list:
            col[start : start + len(got)] = got
            return True
        try:
            col[start : start + len(got)] = np.frombuffer(array("q", got), np.int64)
        except (TypeError, OverflowError, ValueError):
            return False
        return True

    for start in range(0, n, _ROWS):
        rows = entries[start : start + _ROWS]
        m = len(rows)
        keys = list(chain.from_iterable(rows))  # `==`: a key equal to a str is a str
        if len(keys) == m * w and all(keys[j::w].count(k) == m for j, k in enumerate(first)):
            del keys
            values = list(chain.from_iterable(map(dict.values, rows)))
            if not all(put(k, start, values[j::w]) for j, k in enumerate(first)):
                return None
            del values
            continue
        del keys
        tuples = list(map(tuple, rows))
        new = [t for t in dict.fromkeys(tuples) if t not in layouts]  # in the order met
        if len(layouts) + len(new) > 255:  # RowShape.of's codes would not be bytes
            return None
        for t in new:
            if "action" not in t or not _KNOWN.issuperset(t):
                return None
            layouts[t] = len(layouts)
        if code is None:
            code = np.zeros(n, np.uint8)
        code[start : start + m] = np.fromiter(map(layouts.__getitem__, tuples), np.uint8, m)
        for k in sorted(set().union(*dict.fromkeys(tuples))):
            if not put(k, start, [e.get(k, -1 if k in _INT_KEYS else None) for e in rows]):
                return None
    if code is None or len(layouts) == 1:
        return RowShape.uniform(first), cols
    return RowShape(tuple(layouts), readonly(code), {}), cols
