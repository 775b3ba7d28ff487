"""The snapshot data model: PyTorch allocator state as numpy columns, with frozen views for humans.

Every other module reads snapshots through this one. Rows stay in the file's order, so
`Snapshot.from_torch(d).to_torch() == d` for every modern file: each row remembers its key set
(its "layout") and any key we do not know, and frames lists are referenced, never copied.
Building columns never creates one Python object per block, so a 10^6-block file stays cheap.
`read_torch` is the one reader of torch dicts: `Snapshot.from_torch` and `fragmentation(dict)`
(which reads only the columns it needs) both go through it.
"""

from __future__ import annotations

import functools
import gc
import itertools
import reprlib
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

import numpy as np

from .units import format_size

__all__ = [
    "ACTIONS",
    "ALLOCATED",
    "INACTIVE",
    "PENDING_FREE",
    "STATE_NAMES",
    "Block",
    "BlockTable",
    "Segment",
    "SegmentTable",
    "Snapshot",
    "SnapshotError",
    "Trace",
    "validate",
]


# What `from_columns` accepts for a column: a numpy array, or any sequence numpy converts.
IntColumn = Sequence[int] | np.ndarray
BoolColumn = Sequence[bool] | np.ndarray


class SnapshotError(ValueError):
    """A snapshot that cannot be read or is inconsistent; the message says what and where."""


INACTIVE, ALLOCATED, PENDING_FREE = 0, 1, 2
STATE_NAMES = ("inactive", "active_allocated", "active_pending_free")
_STATE_CODE = {name: code for code, name in enumerate(STATE_NAMES)}
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
)

# Key order of a torch 2.11 dict; rows built by `from_columns` use these layouts.
# The first segment keys are int columns of SegmentTable under the same names.
_SEG_INT_KEYS = (
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
)
_SEG_KEYS = (
    *_SEG_INT_KEYS,
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
)
_BLOCK_KEYS = ("address", "size", "requested_size", "state", "frames")
_TRACE_KEYS = (
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "compile_context",
    "user_metadata",
    "frames",
    "device_free",
)
_TOP_KEYS = ("segments", "device_traces", "allocator_settings", "external_annotations")
_SMALL_SEGMENT = 2 << 20  # a small-pool segment is exactly 2 MiB (kSmallBuffer)


# ---------------------------------------------------------------------------------------------
# Row shapes: which keys each row had, in which order, and the values of keys we do not model.


@dataclass(frozen=True)
class _Shape:
    """Key layouts of a table's rows: `code[i]` indexes `layouts`; `extra[i]` holds unknown keys.

    `override[i]` holds values a row gives to keys whose column says otherwise: a torch 2.0
    block whose `requested_size` differs from its history's real_size, which the column holds.
    """

    layouts: tuple[tuple[str, ...], ...]
    code: np.ndarray | None  # None: every row has layouts[0]
    extra: Mapping[int, Mapping[str, Any]]
    override: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)

    @staticmethod
    def uniform(keys: tuple[str, ...]) -> _Shape:
        return _Shape((keys,), None, {})

    @staticmethod
    def of(rows: Sequence[dict], known: tuple[str, ...]) -> _Shape:
        """Record each row's key tuple; keep the values of keys outside `known`."""
        index: dict[tuple[str, ...], int] = {}
        codes = [index.setdefault(k, len(index)) for k in map(tuple, rows)]
        layouts = tuple(index)
        known_set = frozenset(known)
        odd = {c for c, keys in enumerate(layouts) if not known_set.issuperset(keys)}
        extra: dict[int, dict[str, Any]] = {}
        if odd:
            for i, c in enumerate(codes):
                if c in odd:
                    extra[i] = {k: v for k, v in rows[i].items() if k not in known_set}
        if len(layouts) <= 1:
            return _Shape(layouts or (known,), None, extra)
        dtype = np.uint8 if len(layouts) < 256 else np.uint32
        return _Shape(layouts, _readonly(np.array(codes, dtype=dtype)), extra)

    def has(self, key: str, n: int) -> np.ndarray:
        """Boolean mask of the rows whose layout includes `key`."""
        with_key = [c for c, keys in enumerate(self.layouts) if key in keys]
        if self.code is None:
            return np.full(n, bool(with_key))
        return np.isin(self.code, with_key)

    def build(self, n: int, values: Mapping[str, Any]) -> list[dict]:
        """Rebuild the row dicts; `values[key]` is a list (or a callable of the row indices)."""
        out: list[Any] = [None] * n
        groups = [(0, None)] if self.code is None else []
        if self.code is not None:
            for c in range(len(self.layouts)):
                idx = np.flatnonzero(self.code == c)
                if idx.size:
                    groups.append((c, idx))
        with no_gc():
            for c, idx in groups:
                keys = self.layouts[c]
                cols = []
                rows = range(n) if idx is None else idx.tolist()
                for k in keys:
                    if k in values:
                        v = values[k]
                        if callable(v):
                            cols.append(v(idx))
                        else:
                            cols.append(v if idx is None else [v[i] for i in rows])
                    else:
                        cols.append([self.extra[i][k] for i in rows])
                built = _row_builder(keys)(cols) if cols else [{} for _ in rows]
                if idx is None:
                    out = built
                else:
                    for i, row in zip(rows, built, strict=True):
                        out[i] = row
            for i, given in self.override.items():
                out[i].update(given)  # keys the row has already: their order is kept
            return out


_KNOWN_KEYS = frozenset(_SEG_KEYS + _BLOCK_KEYS + _TRACE_KEYS)


@functools.lru_cache(maxsize=64)
def _row_builder(keys: tuple[str, ...]) -> Callable[[list[list]], list[dict]]:
    """A function turning columns into row dicts for one key layout.

    A dict display is ~2x faster than dict(zip(...)) on 10^6 rows, so layouts made only of our
    own key names get a compiled comprehension (the names are our constants, never file text);
    layouts with unknown keys use dict(zip(...)).
    """
    if not _KNOWN_KEYS.issuperset(keys) or len(set(keys)) != len(keys):
        return lambda cols: [dict(zip(keys, vals, strict=True)) for vals in zip(*cols, strict=True)]
    names = [f"v{i}" for i in range(len(keys))]
    display = ", ".join(f"{k!r}: {v}" for k, v in zip(keys, names, strict=True))
    src = f"lambda cols: [{{{display}}} for ({', '.join(names)},) in zip(*cols)]"
    return eval(src, {"__builtins__": {"zip": zip}})  # keys checked above: our constants only


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC while millions of containers are built (it would rescan them: ~3x
    slower); io and the replay timeline use it too."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def type_phrase(x: Any) -> str:
    """'a list', 'an int': how error messages name a value's type."""
    name = type(x).__name__
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def one_line(text: str) -> str:
    """`text` fit for a one-line message: newlines and other unprintables escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 80, 80


def short_repr(x: Any) -> str:
    """A bounded, one-line repr for error messages: never recurses deep, never runs long."""
    try:
        return one_line(_SHORT.repr(x))
    except Exception:  # a value whose repr fails must not hide the real error
        return f"<{type(x).__name__}>"


def _index(i: int, n: int, what: str, plural: str) -> int:
    """`i` as a row index into `n` rows (negative counts from the end), or IndexError."""
    if not -n <= i < n:
        raise IndexError(f"{what} {i} out of range ({n} {plural})")
    return i % n


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _int_column(values: list, what: str, where: Any) -> np.ndarray:
    """Turn a list of Python ints into int64; name the first row that is not a 64-bit integer.

    `array("q")` decides what an integer is, here and in the fast reader alike: ints (bools
    too, as numpy's own integers) pass, floats and strings do not.
    """
    try:
        return np.frombuffer(array("q", values), np.int64)
    except (TypeError, OverflowError, ValueError):
        for i, v in enumerate(values):
            if _int64(v) is None:
                raise SnapshotError(
                    f"{where(i)}: {what} is {short_repr(v)}, not a 64-bit integer"
                ) from None
        raise  # pragma: no cover  (a list that fails as a whole fails in one of its rows)


def _int64(v: Any) -> int | None:
    """`v` as a 64-bit integer the way `array("q")` reads it, or None."""
    try:
        return array("q", (v,))[0]
    except (TypeError, OverflowError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# Tables and views


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
    _shape: _Shape = field(default=_Shape.uniform(_TRACE_KEYS[:5]), repr=False)

    def __len__(self) -> int:
        return len(self.action)

    @classmethod
    def empty(cls) -> Trace:
        """A trace with no entries (history was off, or another device)."""
        z = _readonly(np.zeros(0, np.int64))
        return cls(_readonly(np.zeros(0, np.uint8)), z, z, z, z, z)

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
        shape = _Shape.of(entries, _TRACE_KEYS)

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
            k: _readonly(_int_column([e.get(k, -1) for e in entries], k, at))
            for k in ("addr", "size", "stream", "time_us", "device_free")
        }
        present = set().union(*shape.layouts)
        objects = {
            k: ([e.get(k) for e in entries] if k in present else None)
            for k in ("frames", "compile_context", "user_metadata")
        }
        return cls(
            _readonly(action), **cols, action_names=action_names, _objects=objects, _shape=shape
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
            return _readonly(a)

        base = ["action", "addr", "size", "stream"]
        if time_us is not None:
            base.append("time_us")
        if frames is not None:
            base.append("frames")
        oom = ACTIONS.index("oom")
        layouts = (tuple(base), tuple(k if k != "addr" else "device_free" for k in base))
        is_oom = act == oom
        if is_oom.any():
            shape = _Shape(layouts, _readonly(is_oom.astype(np.uint8)), {})
        else:
            shape = _Shape.uniform(layouts[0])
        objects = {"frames": list(frames) if frames is not None else None}
        columns = [col(v) for v in (addr, size, stream, time_us, device_free)]
        return cls(_readonly(act.copy()), *columns, _objects=objects, _shape=shape)

    def _values(self) -> dict[str, Any]:
        names = self.action_names
        vals: dict[str, Any] = {
            "action": lambda idx: [names[c] for c in _take(self.action, idx)],
        }
        for k in ("addr", "size", "stream", "time_us", "device_free"):
            vals[k] = _taker(getattr(self, k))
        for k, v in self._objects.items():
            if v is not None:
                vals[k] = v
        return vals

    def frames(self) -> list:
        """Each entry's stack (shared, not copied); `[]` where the entry has no `frames` key."""
        f = self._objects.get("frames")
        if f is None:
            return [[]] * len(self)
        return [x if x is not None else [] for x in f]

    def entries(self) -> list[dict]:
        """The torch list of entry dicts (frames and strings shared, not copied)."""
        return self._shape.build(len(self), self._values())

    def entry(self, i: int) -> dict:
        """Entry `i` as torch writes it."""
        i = _index(i, len(self), "trace entry", "entries")
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


def _legacy_frames(extra: Mapping[str, Any] | None) -> list | None:
    """The frames of a torch 2.0 block: its `history[0]` (as `_memory_viz._block_extra_legacy`
    reads it), None without one."""
    history = extra.get("history") if extra else None
    if isinstance(history, list) and history and isinstance(history[0], dict):
        frames = history[0].get("frames")
        return frames if isinstance(frames, list) else None
    return None


def _take(col: np.ndarray, idx: np.ndarray | None) -> list:
    return (col if idx is None else col[idx]).tolist()


def _taker(col: np.ndarray):
    return lambda idx: _take(col, idx)


def _empty_lists(n: int):
    """A fresh [] per row: rows built by `from_columns` have no frames, and must not share one."""
    return lambda idx: [[] for _ in range(n if idx is None else len(idx))]


# ---------------------------------------------------------------------------------------------
# The snapshot


@dataclass(frozen=True, eq=False)
class Snapshot:
    """PyTorch caching-allocator state (segments, blocks, traces) as numpy columns.

    Build one with `Snapshot.from_torch(dict_or_list)`, `Snapshot.from_columns(...)` or
    `gpumemviz.load_snapshot(path)`; `to_torch()` gives the dict back. Frames lists, settings and
    annotations are shared with the source dict, not copied: treat them as read-only.
    """

    segments: SegmentTable
    blocks: BlockTable
    traces: Mapping[int, Trace]
    allocator_settings: dict | None = None
    external_annotations: list | None = None
    _seg_frames: list | None = field(default=None, repr=False)
    _seg_shape: _Shape = field(default=_Shape.uniform(_SEG_KEYS), repr=False)
    _blk_frames: list | None = field(default=None, repr=False)
    _blk_shape: _Shape = field(default=_Shape.uniform(_BLOCK_KEYS), repr=False)
    _top_keys: tuple[str, ...] = field(default=_TOP_KEYS, repr=False)
    _top_extra: Mapping[str, Any] = field(default_factory=dict, repr=False)

    # -- sizes and views ------------------------------------------------------------------------

    @property
    def n_segments(self) -> int:
        return len(self.segments)

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def devices(self) -> tuple[int, ...]:
        """Devices that hold a segment or a trace entry, ascending."""
        seen = set(np.unique(self.segments.device).tolist())
        seen.update(d for d, t in self.traces.items() if len(t))
        return tuple(sorted(seen))

    def __repr__(self) -> str:
        reserved = int(self.segments.total_size.sum())
        n_trace = sum(len(t) for t in self.traces.values())
        return (
            f"<Snapshot devices={list(self.devices)} segments={self.n_segments} "
            f"blocks={self.n_blocks} trace_entries={n_trace} reserved={format_size(reserved)}>"
        )

    def block(self, i: int) -> Block:
        """Block `i` (in table order) as a frozen value."""
        i = _index(i, self.n_blocks, "block", "blocks")
        b = self.blocks
        frames = self._blk_frames[i] if self._blk_frames is not None else None
        if frames is None:
            frames = _legacy_frames(self._blk_shape.extra.get(i))
        return Block(
            index=i,
            segment=int(b.segment[i]),
            address=int(b.address[i]),
            size=int(b.size[i]),
            requested_size=int(b.requested_size[i]),
            state=STATE_NAMES[int(b.state[i])],
            frames=tuple(frames or ()),
        )

    def block_frames(self) -> list:
        """Each block's allocation stack, in table order: the file's frames list (shared, not
        copied), a torch 2.0 block's `history[0]` frames, or `[]` when none was recorded.

        One list for all blocks, so stack analysis (sites, hover) costs no per-block objects.
        """
        n = self.n_blocks
        base = self._blk_frames
        out = [[]] * n if base is None else [f if f is not None else [] for f in base]
        for i, extra in self._blk_shape.extra.items():
            if base is None or base[i] is None:
                legacy = _legacy_frames(extra)
                if legacy is not None:
                    out[i] = legacy
        return out

    def map_objects(self, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Snapshot:
        """A snapshot whose Python objects (everything that is not a numpy column) went
        through `fn`; the columns are shared.

        `fn` gets one plain dict and returns one of the same shape: ``seg_frames`` and
        ``blk_frames`` (a frames list per row, or None), ``seg_extra`` and ``blk_extra``
        ({row: {unknown key: value}}, torch 2.0 `history` included), ``traces`` ({device:
        {"objects": {frames/compile_context/user_metadata: per-entry list or None},
        "extra": {entry: {key: value}}, "action_names": [str]}}), ``allocator_settings``,
        ``external_annotations`` and ``top_extra``. This is how path redaction rewrites every
        string of a 10^6-block snapshot without building its dicts.
        """
        payload: dict[str, Any] = {
            "seg_frames": self._seg_frames,
            "blk_frames": self._blk_frames,
            "seg_extra": dict(self._seg_shape.extra),
            "blk_extra": dict(self._blk_shape.extra),
            "traces": {
                d: {
                    "objects": dict(t._objects),
                    "extra": dict(t._shape.extra),
                    "action_names": list(t.action_names),
                }
                for d, t in self.traces.items()
            },
            "allocator_settings": self.allocator_settings,
            "external_annotations": self.external_annotations,
            "top_extra": dict(self._top_extra),
        }
        out = fn(payload)
        traces = {
            d: replace(
                t,
                action_names=tuple(out["traces"][d]["action_names"]),
                _objects=out["traces"][d]["objects"],
                _shape=replace(t._shape, extra=out["traces"][d]["extra"]),
            )
            for d, t in self.traces.items()
        }
        return replace(
            self,
            traces=traces,
            allocator_settings=out["allocator_settings"],
            external_annotations=out["external_annotations"],
            _seg_frames=out["seg_frames"],
            _seg_shape=replace(self._seg_shape, extra=out["seg_extra"]),
            _blk_frames=out["blk_frames"],
            _blk_shape=replace(self._blk_shape, extra=out["blk_extra"]),
            _top_extra=out["top_extra"],
        )

    def segment(self, i: int) -> Segment:
        """Segment `i` (in file order) with its blocks, as a frozen value."""
        i = _index(i, self.n_segments, "segment", "segments")
        s = self.segments
        start, count = int(s.block_start[i]), int(s.block_count[i])
        frames = self._seg_frames[i] if self._seg_frames is not None else None
        return Segment(
            index=i,
            device=int(s.device[i]),
            address=int(s.address[i]),
            total_size=int(s.total_size[i]),
            allocated_size=int(s.allocated_size[i]),
            active_size=int(s.active_size[i]),
            requested_size=int(s.requested_size[i]),
            stream=int(s.stream[i]),
            segment_type="small" if s.is_small[i] else "large",
            pool_id=(int(s.pool_id[i, 0]), int(s.pool_id[i, 1])),
            is_expandable=bool(s.is_expandable[i]),
            frames=tuple(frames or ()),
            blocks=tuple(self.block(j) for j in range(start, start + count)),
        )

    def where(self, seg: int) -> str:
        """'segment 3 (device 0, 0x7f5d00000000)': how messages name a segment."""
        s = self.segments
        return f"segment {seg} (device {int(s.device[seg])}, {int(s.address[seg]):#x})"

    # -- torch dicts ----------------------------------------------------------------------------

    @classmethod
    def from_torch(cls, obj: dict | list) -> Snapshot:
        """Read a torch snapshot: the `_snapshot()` dict of any generation, or a segment list.

        Checks only what building the columns needs; `validate` checks the rest.

        Parameters
        ----------
        obj : dict or list
            `torch.cuda.memory._snapshot()` (2.0 legacy blocks with `history` included), or
            the bare list `torch.cuda.memory_snapshot()` returns.

        Returns
        -------
        Snapshot

        Examples
        --------
        >>> snap = Snapshot.from_torch([{"device": 0, "address": 4096, "total_size": 2097152,
        ...     "stream": 0, "segment_type": "small", "blocks": [
        ...     {"size": 512, "state": "active_allocated", "requested_size": 100},
        ...     {"size": 2096640, "state": "inactive", "requested_size": 0}]}])
        >>> snap.n_blocks, snap.block(1).address, snap.to_torch()["device_traces"]
        (2, 4608, [[]])
        """
        with no_gc():  # the source dict may hold 10^7 objects: a full GC pass costs ~0.5 s
            cols = read_torch(obj)
            return _assemble(
                cls,
                seg=cols.seg,
                blk=cols.blk,
                blk_address=cols.blk_address,
                traces=_trace_columns(cols.device_traces),
                allocator_settings=cols.allocator_settings,
                external_annotations=cols.external_annotations,
                seg_frames=cols.seg_frames,
                blk_frames=cols.blk_frames,
                seg_shape=cols.seg_shape,
                blk_shape=cols.blk_shape,
                seg_sums=cols.seg_sums,
                top_keys=cols.top_keys,
                top_extra=cols.top_extra,
            )

    def to_torch(self) -> dict:
        """The torch dict: `from_torch(d).to_torch() == d` for dicts; a bare list gains
        `device_traces` (one empty list per device) so PyTorch's tools accept it."""
        with no_gc():
            return self._to_torch()

    def _to_torch(self) -> dict:
        seg_lists = self._block_dicts()
        seg_rows = self._segment_dicts(seg_lists)
        n_dev = max(self.traces, default=-1) + 1
        if not self.traces and self.n_segments:
            n_dev = int(self.segments.device.max()) + 1
        traces = [
            self.traces[d].entries() if d in self.traces else [] for d in range(max(n_dev, 0))
        ]
        keys = self._top_keys
        if "device_traces" not in keys:
            keys = ("segments", "device_traces", *(k for k in keys if k != "segments"))
        known = {
            "segments": seg_rows,
            "device_traces": traces,
            "allocator_settings": self.allocator_settings,
            "external_annotations": self.external_annotations,
        }
        return {k: known[k] if k in known else self._top_extra[k] for k in keys}

    def _block_dicts(self) -> list[list[dict]]:
        b = self.blocks
        n = len(b)
        frames = self._blk_frames
        vals: dict[str, Any] = {
            "address": _taker(b.address),
            "size": _taker(b.size),
            "requested_size": _taker(b.requested_size),
            "state": lambda idx: [STATE_NAMES[c] for c in _take(b.state, idx)],
            "frames": frames if frames is not None else _empty_lists(n),
        }
        rows = self._blk_shape.build(n, vals)
        starts = self.segments.block_start.tolist()
        counts = self.segments.block_count.tolist()
        return [rows[a : a + c] for a, c in zip(starts, counts, strict=True)]

    def _segment_dicts(self, block_lists: list[list[dict]]) -> list[dict]:
        s = self.segments
        n = len(s)
        frames = self._seg_frames
        vals: dict[str, Any] = {k: _taker(getattr(s, k)) for k in _SEG_INT_KEYS}
        vals["segment_type"] = lambda idx: [
            "small" if x else "large" for x in _take(s.is_small, idx)
        ]
        vals["segment_pool_id"] = lambda idx: list(map(tuple, _take(s.pool_id, idx)))
        vals["is_expandable"] = _taker(s.is_expandable)
        vals["frames"] = frames if frames is not None else _empty_lists(n)
        vals["blocks"] = block_lists
        return self._seg_shape.build(n, vals)

    # -- columns --------------------------------------------------------------------------------

    @classmethod
    def from_columns(
        cls,
        *,
        device: IntColumn,
        address: IntColumn,
        total_size: IntColumn,
        stream: IntColumn,
        is_small: BoolColumn,
        block_count: IntColumn,
        size: IntColumn,
        requested_size: IntColumn,
        state: IntColumn,
        is_expandable: BoolColumn | None = None,
        pool_id: Sequence[tuple[int, int]] | np.ndarray | None = None,
        segment_frames: list | None = None,
        block_frames: list | None = None,
        traces: Mapping[int, Trace] | None = None,
        allocator_settings: dict | None = None,
        external_annotations: list | None = None,
    ) -> Snapshot:
        """Build from columns without any dict walk (the allocator model's fast path).

        Segment columns have one row per segment, block columns one row per block, segment by
        segment, in address order. Block addresses, `block_start`, each block's segment and
        the segments' allocated/active/requested sums are derived, so they are consistent.

        Parameters
        ----------
        device, address, total_size, stream : int arrays, one per segment
        is_small : bool array, one per segment (`segment_type == "small"`)
        block_count : int array, one per segment; sums to the number of blocks
        size, requested_size : int arrays, one per block
        state : int array of state codes (`INACTIVE`, `ALLOCATED`, `PENDING_FREE`), one per block
        is_expandable : bool array, default all False
        pool_id : (n, 2) int array, default all (0, 0)
        segment_frames, block_frames : lists of frames lists, default all []
        traces : {device: Trace}, default one empty trace per device up to the highest
        allocator_settings, external_annotations : kept as given (None: left out of `to_torch`)

        Returns
        -------
        Snapshot

        Examples
        --------
        >>> snap = Snapshot.from_columns(device=[0], address=[1 << 20], total_size=[2 << 20],
        ...     stream=[0], is_small=[True], block_count=[2], size=[512, (2 << 20) - 512],
        ...     requested_size=[500, 0], state=[ALLOCATED, INACTIVE])
        >>> snap.segment(0).allocated_size, snap.block(1).address - snap.block(0).address
        (512, 512)
        """
        seg_cols = {
            "device": device,
            "address": address,
            "total_size": total_size,
            "stream": stream,
            "block_count": block_count,
        }
        cols = {k: np.asarray(v, np.int64) for k, v in seg_cols.items()}
        n = len(cols["address"])
        small = np.asarray(is_small, bool)
        exp = np.zeros(n, bool) if is_expandable is None else np.asarray(is_expandable, bool)
        pool = np.zeros((n, 2), np.int64) if pool_id is None else np.asarray(pool_id, np.int64)
        for k, v in [*cols.items(), ("is_small", small), ("is_expandable", exp)]:
            if v.shape != (n,):
                raise SnapshotError(f"from_columns: {k} has shape {v.shape}, expected ({n},)")
        if pool.shape != (n, 2):
            raise SnapshotError(f"from_columns: pool_id has shape {pool.shape}, expected ({n}, 2)")
        sz = np.asarray(size, np.int64)
        m = len(sz)
        req = np.asarray(requested_size, np.int64)
        st = np.asarray(state, np.uint8)
        if req.shape != (m,) or st.shape != (m,):
            raise SnapshotError(f"from_columns: block columns differ in length ({m} sizes)")
        if int(cols["block_count"].sum()) != m:
            raise SnapshotError(
                f"from_columns: block_count sums to {int(cols['block_count'].sum())}, "
                f"but there are {m} blocks"
            )
        if m and st.max() > PENDING_FREE:
            raise SnapshotError(f"from_columns: unknown state code {int(st.max())}")
        frame_lists = (("segment_frames", segment_frames, n), ("block_frames", block_frames, m))
        for name, lst, want in frame_lists:
            if lst is not None and len(lst) != want:
                raise SnapshotError(f"from_columns: {name} has {len(lst)} rows, expected {want}")
        if traces is None:
            top = int(cols["device"].max()) + 1 if n else 0
            traces = {d: Trace.empty() for d in range(top)}
        return _assemble(
            cls,
            seg={**cols, "is_small": small, "is_expandable": exp, "pool_id": pool},
            blk={"size": sz, "requested_size": req, "state": st},
            blk_address=None,
            traces=dict(traces),
            allocator_settings=allocator_settings,
            external_annotations=external_annotations,
            seg_frames=None if segment_frames is None else list(segment_frames),
            blk_frames=None if block_frames is None else list(block_frames),
            seg_shape=_Shape.uniform(_SEG_KEYS),
            blk_shape=_Shape.uniform(_BLOCK_KEYS),
            seg_sums=None,
            top_keys=tuple(
                k
                for k in _TOP_KEYS
                if k not in ("allocator_settings", "external_annotations")
                or (allocator_settings if k == "allocator_settings" else external_annotations)
                is not None
            ),
            top_extra={},
        )


def _assemble(
    cls: type[Snapshot],
    *,
    seg: dict[str, np.ndarray],
    blk: dict[str, np.ndarray],
    blk_address: np.ndarray | tuple[np.ndarray, np.ndarray] | None,
    traces: dict[int, Trace],
    allocator_settings: dict | None,
    external_annotations: list | None,
    seg_frames: list | None,
    blk_frames: list | None,
    seg_shape: _Shape,
    blk_shape: _Shape,
    seg_sums: Mapping[str, np.ndarray | None] | None,
    top_keys: tuple[str, ...],
    top_extra: Mapping[str, Any],
) -> Snapshot:
    """Derive block_start, segment index, computed addresses and sums; freeze everything."""
    count = seg["block_count"]
    n, m = len(count), len(blk["size"])
    start = np.zeros(n, np.int64)
    if n:
        np.cumsum(count[:-1], out=start[1:])
    segment = np.repeat(np.arange(n, dtype=np.int64), count)
    size = blk["size"]
    state = blk["state"]
    if blk_address is None or isinstance(blk_address, tuple):  # some or all not in the file
        excl = np.zeros(m, np.int64)  # bytes before each block inside the whole table
        if m:
            np.cumsum(size[:-1], out=excl[1:])
        computed = seg["address"][segment] + excl - (excl[start[segment]] if m else 0)
        # torch's memory_viz computes them the same way: segment address plus the sizes before
        if blk_address is None:
            blk_address = computed
        else:
            given, has = blk_address
            blk_address = np.where(has, given, computed)
    sums = {}
    cs = np.zeros(m + 1, np.int64)
    for name in ("allocated_size", "active_size", "requested_size"):
        given = None if seg_sums is None else seg_sums.get(name)
        if given is not None:  # the file's own: `validate` compares them with the blocks
            sums[name] = given
            continue
        counted = state == ALLOCATED if name == "allocated_size" else state != INACTIVE
        w = blk["requested_size"] if name == "requested_size" else size
        np.cumsum(np.where(counted, w, 0), out=cs[1:])
        sums[name] = cs[start + count] - cs[start]
    segments = SegmentTable(
        device=_readonly(seg["device"]),
        address=_readonly(seg["address"]),
        total_size=_readonly(seg["total_size"]),
        allocated_size=_readonly(sums["allocated_size"]),
        active_size=_readonly(sums["active_size"]),
        requested_size=_readonly(sums["requested_size"]),
        stream=_readonly(seg["stream"]),
        is_small=_readonly(seg["is_small"]),
        is_expandable=_readonly(seg["is_expandable"]),
        pool_id=_readonly(seg["pool_id"]),
        block_start=_readonly(start),
        block_count=_readonly(count),
    )
    blocks = BlockTable(
        segment=_readonly(segment),
        address=_readonly(blk_address),
        size=_readonly(size),
        requested_size=_readonly(blk["requested_size"]),
        state=_readonly(state),
    )
    return cls(
        segments=segments,
        blocks=blocks,
        traces=traces,
        allocator_settings=allocator_settings,
        external_annotations=external_annotations,
        _seg_frames=seg_frames,
        _seg_shape=seg_shape,
        _blk_frames=blk_frames,
        _blk_shape=blk_shape,
        _top_keys=top_keys,
        _top_extra=top_extra,
    )


# ---------------------------------------------------------------------------------------------
# Reading torch dicts: one reader serves `Snapshot.from_torch` and `fragmentation(dict)`


@dataclass(frozen=True, eq=False)
class TorchColumns:
    """A torch snapshot dict (or bare segment list) read into numpy columns by `read_torch`.

    `seg` has one row per segment: device, address, total_size, stream, block_count (int64),
    is_small, is_expandable (bool) and pool_id ((n, 2) int64). `blk` has one row per block,
    segment by segment: size and requested_size (int64) and state (uint8 codes). A block's
    requested_size is what torch's `_memory_viz._block_extra` accounts for it: its
    requested_size, a torch 2.0 block's history[0] real_size, or its size where neither was
    recorded (torch 1.x).

    The rest is read only for a `Snapshot` (`full`): the segments' own allocated/active/
    requested sums (None where no segment has the key), block addresses (an array; None where
    no block has one; (given, has) where some do), frames lists and the rows' key layouts.
    """

    seg: dict[str, np.ndarray]
    blk: dict[str, np.ndarray]
    allocator_settings: dict | None
    external_annotations: list | None
    device_traces: list | None  # as given: `Snapshot.from_torch` reads the entries
    top_keys: tuple[str, ...]
    top_extra: Mapping[str, Any]
    seg_sums: Mapping[str, np.ndarray | None] = field(default_factory=dict)
    blk_address: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None
    seg_frames: list | None = None
    blk_frames: list | None = None
    seg_shape: _Shape = field(default=_Shape.uniform(_SEG_KEYS))
    blk_shape: _Shape = field(default=_Shape.uniform(_BLOCK_KEYS))

    def traced_devices(self) -> tuple[int, ...]:
        """Devices whose trace holds an entry (with the segments' devices: `Snapshot.devices`)."""
        traces = self.device_traces or []
        return tuple(d for d, t in enumerate(traces) if t)


def read_torch(obj: Any, *, full: bool = True) -> TorchColumns:
    """Read a torch snapshot into columns: the one walk over its segments and blocks.

    Both `Snapshot.from_torch` (`full`) and `fragmentation(dict)` (not `full`: only the keys
    the analysis reads) call it, so both read a value the same way and name a bad one with the
    same one-line SnapshotError. Where the analysis reads a key, the checks come first;
    `full` adds checks after them (block addresses, the segments' own sums), and
    `Snapshot.from_torch` reads the trace entries after that.

    Examples
    --------
    >>> cols = read_torch([{"address": 0, "total_size": 1024, "blocks": [
    ...     {"size": 1024, "state": "active_allocated"}]}], full=False)
    >>> cols.blk["requested_size"].tolist(), cols.seg["is_small"].tolist()
    ([1024], [False])
    """
    with no_gc():  # the source dict may hold 10^7 objects: a full GC pass costs ~0.5 s
        top = _read_top(obj)
        segs = top.pop("segments")
        try:
            cols = _read_plain(segs, full)
        except (KeyError, TypeError, ValueError, OverflowError):
            cols = None  # a value of another type or a key missing: the careful reader decides
        if cols is None:
            cols = _read_careful(segs, full)
        else:
            _check_totals(cols["seg"]["total_size"], cols["blk"])
        return TorchColumns(**top, **cols)


def _read_top(obj: Any) -> dict[str, Any]:
    """The top level: the segment list and what surrounds it."""
    if type(obj) is list:
        return {
            "segments": obj,
            "allocator_settings": None,
            "external_annotations": None,
            "device_traces": None,
            "top_keys": ("segments", "device_traces"),
            "top_extra": {},
        }
    if not isinstance(obj, dict):
        raise SnapshotError(
            f"not a snapshot: {type_phrase(obj)} (expected the dict of "
            "torch.cuda.memory._snapshot() or the list of torch.cuda.memory_snapshot())"
        )
    if "segments" not in obj:
        keys = ", ".join(map(short_repr, list(obj)[:8])) or "none"
        raise SnapshotError(f"not a snapshot: a dict without 'segments' (keys: {keys})")
    segs = obj["segments"]
    settings = obj.get("allocator_settings")
    notes = obj.get("external_annotations")
    traces = obj.get("device_traces")
    if type(segs) is not list:
        raise SnapshotError(f"'segments' is {type_phrase(segs)}, not a list")
    if settings is not None and not isinstance(settings, dict):
        raise SnapshotError(f"'allocator_settings' is {type_phrase(settings)}, not a dict")
    if notes is not None and not isinstance(notes, list):
        raise SnapshotError(f"'external_annotations' is {type_phrase(notes)}, not a list")
    if traces is not None and type(traces) is not list:
        raise SnapshotError(f"'device_traces' is {type_phrase(traces)}, not a list")
    return {
        "segments": segs,
        "allocator_settings": settings,
        "external_annotations": notes,
        "device_traces": traces,
        "top_keys": tuple(obj),
        "top_extra": {k: v for k, v in obj.items() if k not in _TOP_KEYS},
    }


def _seg_where(segs: list, i: int) -> str:
    s = segs[i]
    if type(s) is dict:
        dev, addr = s.get("device", "?"), s.get("address")
        dev = dev if type(dev) is int or dev == "?" else short_repr(dev)
        a = f"{addr:#x}" if type(addr) is int else short_repr(addr)
        return f"segment {i} (device {dev}, {a})"
    return f"segment {i}"


# What the analysis reads of each segment and block (`fragmentation(dict)`); a block's frames
# only for whether it has them (a torch 2.0 block has none: its requested size is in history).
_ANALYSIS_SEG_KEYS = (
    "blocks",
    "device",
    "address",
    "total_size",
    "stream",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
)
_ANALYSIS_BLOCK_KEYS = ("size", "requested_size", "state", "frames")
_SEG_KEY_SET = frozenset(_SEG_KEYS)
_BLOCK_KEY_SET = frozenset(_BLOCK_KEYS)
_SEG_INTS = frozenset(_SEG_INT_KEYS)
_BLOCK_INTS = frozenset(("address", "size", "requested_size"))
_SEG_SUMS = ("allocated_size", "active_size", "requested_size")
_RARE = frozenset(("device", "stream"))  # mostly 0: read, and converted only where not
_SMALL_CODE = {"large": 0, "small": 1}
_PAIR_TYPES = frozenset((tuple, list))
_DICT, _LIST, _TWO = frozenset((dict,)), frozenset((list,)), frozenset((2,))
# Segments per round of `_read_plain`: their dicts, blocks and values (under 1 MB) stay in the
# CPU cache between its passes, which whole-file passes would fetch from memory again each time.
_CHUNK = 256
_ZEROS = np.zeros(2 * _CHUNK, np.int64)
_ZEROS.flags.writeable = False


def _ints(values: list) -> np.ndarray:
    """`values` as int64 if each is an int (or bool: what `array("q")` takes), else TypeError
    or OverflowError. The int sum says they are in one C pass (a float makes it a float);
    `np.fromiter` then converts them about twice as fast as `array("q")`."""
    if type(sum(values)) is not int:
        raise TypeError("not all ints")
    return np.fromiter(values, np.int64, len(values))


def _ints_or_zeros(values: list) -> np.ndarray:
    if not any(values) and type(sum(values)) is int:  # all 0 (or False): nothing to convert
        return _ZEROS[: len(values)]
    return _ints(values)


def _read_plain(segs: list, full: bool) -> dict[str, Any] | None:
    """The common case, fast: every segment and every block an exact dict with the first one's
    keys (`full`; known keys only) or with the keys the analysis reads, every value of its type.

    None, or KeyError/TypeError/ValueError/OverflowError, for anything else: `_read_careful`
    reads the same values the same way, and names what is wrong. The columns are gathered
    _CHUNK segments at a time, one C-level pass (`map(itemgetter)`) per key, and converted
    while the chunk's objects are still in the cache.
    """
    if not segs or type(segs[0]) is not dict:
        return None
    seg_keys = tuple(segs[0])
    first = next((s["blocks"] for s in segs if type(s) is dict and s.get("blocks")), None)
    blk_keys: tuple[str, ...] = ()
    if first is not None:
        if type(first) is not list or type(first[0]) is not dict:
            return None
        blk_keys = tuple(first[0])
    if full:
        if not ({"address", "total_size", "blocks"} <= set(seg_keys) <= _SEG_KEY_SET):
            return None
        if blk_keys and not ({"size", "state"} <= set(blk_keys) <= _BLOCK_KEY_SET):
            return None
        read_seg, read_blk = seg_keys, blk_keys
    else:
        if not set(_ANALYSIS_SEG_KEYS) <= set(seg_keys):
            return None
        if blk_keys and not set(_ANALYSIS_BLOCK_KEYS) <= set(blk_keys):
            return None
        read_seg, read_blk = _ANALYSIS_SEG_KEYS, _ANALYSIS_BLOCK_KEYS if blk_keys else ()
    has = frozenset(read_seg)
    n_seg_keys, n_blk_keys = len(seg_keys), len(blk_keys)
    seg_ints = [(k, itemgetter(k), _ints_or_zeros if k in _RARE else _ints) for k in read_seg
                if k in _SEG_INTS]  # fmt: skip
    blk_ints = [(k, itemgetter(k)) for k in read_blk if k in _BLOCK_INTS]
    parts: dict[str, list] = {k: [] for k in (*has, "block_count")}  # segment columns
    bparts: dict[str, list] = {k: [] for k in read_blk}  # block columns
    get_blocks, get_type, get_pool, get_exp, get_frames, get_state = map(
        itemgetter,
        ("blocks", "segment_type", "segment_pool_id", "is_expandable", "frames", "state"),
    )
    seg_frames: list = []
    blk_frames: list = []
    state_code, small_code = _STATE_CODE.__getitem__, _SMALL_CODE.__getitem__
    keep_frames, check_frames = "frames" in read_blk and full, "frames" in read_blk and not full
    chain = itertools.chain.from_iterable
    for lo in range(0, len(segs), _CHUNK):
        chunk = segs[lo : lo + _CHUNK]
        k = len(chunk)
        if set(map(type, chunk)) != _DICT:
            return None
        if full and sum(map(len, chunk)) != n_seg_keys * k:
            return None  # a key more or less than the first segment's
        blists = list(map(get_blocks, chunk))
        if set(map(type, blists)) != _LIST:
            return None
        parts["block_count"].append(np.fromiter(map(len, blists), np.int64, k))
        for key, get, convert in seg_ints:
            parts[key].append(convert(list(map(get, chunk))))
        if "segment_type" in has:
            parts["segment_type"].append(bytes(map(small_code, map(get_type, chunk))))
        if "is_expandable" in has:
            flags = list(map(get_exp, chunk))
            parts["is_expandable"].append(bytes(map(bool, flags)) if any(flags) else bytes(k))
        if "segment_pool_id" in has:
            ids = list(map(get_pool, chunk))
            if set(map(type, ids)) - _PAIR_TYPES or set(map(len, ids)) != _TWO:
                return None
            parts["segment_pool_id"].append(_ints_or_zeros(list(chain(ids))))
        if full and "frames" in has:
            seg_frames += map(get_frames, chunk)
        blocks = list(chain(blists))
        if not blocks:
            continue
        if set(map(type, blocks)) != _DICT:
            return None
        if full and sum(map(len, blocks)) != n_blk_keys * len(blocks):
            return None
        for key, get in blk_ints:
            bparts[key].append(_ints(list(map(get, blocks))))
        bparts["state"].append(bytes(map(state_code, map(get_state, blocks))))
        if keep_frames:
            blk_frames += map(get_frames, blocks)
        elif check_frames:  # a block without frames is a torch 2.0 one: the careful reader's
            deque(map(get_frames, blocks), 0)

    n = len(segs)

    def ints(key: str, rows: int, parts: dict[str, list] = parts) -> np.ndarray:
        return np.concatenate(parts[key]) if key in parts else np.zeros(rows, np.int64)

    def flags(key: str) -> np.ndarray:
        return np.frombuffer(b"".join(parts[key]), np.uint8).astype(bool)

    total = ints("total_size", n)
    seg = {
        "device": ints("device", n),
        "address": ints("address", n),
        "total_size": total,
        "stream": ints("stream", n),
        "block_count": ints("block_count", n),
        # torch < 2.0 wrote no segment_type: a small segment is exactly 2 MiB
        "is_small": flags("segment_type") if "segment_type" in has else total == _SMALL_SEGMENT,
        "is_expandable": flags("is_expandable") if "is_expandable" in has else np.zeros(n, bool),
        "pool_id": ints("segment_pool_id", 2 * n).reshape(n, 2),
    }
    size = ints("size", 0, bparts)
    state = b"".join(bparts.get("state", ()))
    blk = {
        "size": size,
        "requested_size": ints("requested_size", 0, bparts) if "requested_size" in bparts else size,
        "state": np.frombuffer(state, np.uint8) if state else np.zeros(0, np.uint8),
    }
    out: dict[str, Any] = {"seg": seg, "blk": blk}
    if full:
        out.update(
            seg_sums={k: ints(k, n) if k in has else None for k in _SEG_SUMS},
            blk_address=ints("address", 0, bparts) if "address" in bparts else None,
            seg_frames=seg_frames if "frames" in has else None,
            blk_frames=blk_frames if keep_frames else None,
            seg_shape=_Shape.uniform(seg_keys),
            blk_shape=_Shape.uniform(blk_keys or _BLOCK_KEYS),
        )
    return out


def _read_careful(segs: list, full: bool) -> dict[str, Any]:
    """Any generation of torch dict, optional keys absent: the same columns as `_read_plain`,
    or a SnapshotError naming the first problem and where it is."""
    if set(map(type, segs)) - _DICT:
        i = next(i for i, s in enumerate(segs) if type(s) is not dict)
        raise SnapshotError(f"segment {i} is {type_phrase(segs[i])}, not a dict")
    n = len(segs)
    for k in ("address", "total_size", "blocks"):
        i = next((i for i, s in enumerate(segs) if k not in s), None)
        if i is not None:
            raise SnapshotError(f"{_seg_where(segs, i)} has no {k}")

    def seg_at(i: int) -> str:
        return _seg_where(segs, i)

    blists = list(map(itemgetter("blocks"), segs))
    if set(map(type, blists)) - _LIST:
        i = next(i for i, bl in enumerate(blists) if type(bl) is not list)
        raise SnapshotError(f"{seg_at(i)}: blocks is {type_phrase(blists[i])}, not a list")
    count = np.fromiter(map(len, blists), np.int64, n)

    seg: dict[str, np.ndarray] = {"block_count": count}
    for k, default in (("device", 0), ("address", None), ("total_size", None), ("stream", 0)):
        seg[k] = _int_column([s.get(k, default) for s in segs], k, seg_at)
    small = np.zeros(n, bool)
    for i, s in enumerate(segs):
        t = s.get("segment_type")
        try:
            small[i] = _SMALL_CODE[t] if t is not None else seg["total_size"][i] == _SMALL_SEGMENT
        except (KeyError, TypeError):
            raise SnapshotError(f"{seg_at(i)}: unknown segment_type {short_repr(t)}") from None
    seg["is_small"] = small
    seg["is_expandable"] = np.array([bool(s.get("is_expandable", False)) for s in segs], bool)
    seg["pool_id"] = _pool_column(segs, seg_at)

    blocks = list(itertools.chain.from_iterable(blists))
    blk, override, at = _blocks_careful(blocks, count, segs)
    _check_totals(seg["total_size"], blk)
    out: dict[str, Any] = {"seg": seg, "blk": blk}
    if full:  # what only a Snapshot keeps, checked after everything the analysis reads
        out.update(_blocks_full(blocks, at, override))
        shape = _Shape.of(segs, _SEG_KEYS)
        sums: dict[str, np.ndarray | None] = {}
        for k in _SEG_SUMS:
            has = shape.has(k, n)
            if has.all():
                sums[k] = _int_column(list(map(itemgetter(k), segs)), k, seg_at)
            elif has.any():
                raise SnapshotError(f"{seg_at(int(np.flatnonzero(~has)[0]))} has no {k}")
            else:
                sums[k] = None
        out["seg_sums"] = sums
        out["seg_frames"] = (
            [s.get("frames") for s in segs] if shape.has("frames", n).any() else None
        )
        out["seg_shape"] = shape
    return out


def _pool_column(segs: list, seg_at: Callable[[int], str]) -> np.ndarray:
    """(n, 2) int64: each segment's segment_pool_id, a tuple or list of two ints ((0, 0) absent)."""
    ids = [s.get("segment_pool_id", (0, 0)) for s in segs]
    try:
        if set(map(type, ids)) - _PAIR_TYPES or set(map(len, ids)) - _TWO:
            raise TypeError("not pairs")
        flat = array("q", list(itertools.chain.from_iterable(ids)))
        return np.frombuffer(flat, np.int64).reshape(len(ids), 2)
    except (TypeError, OverflowError, ValueError):
        for i, p in enumerate(ids):
            if not (
                type(p) in _PAIR_TYPES
                and len(p) == 2
                and _int64(p[0]) is not None
                and _int64(p[1]) is not None
            ):
                raise SnapshotError(
                    f"{seg_at(i)}: segment_pool_id {short_repr(p)} is not a pair of 64-bit ints"
                ) from None
        raise  # pragma: no cover  (a list that fails as a whole fails in one of its rows)


def _blocks_careful(
    blocks: list, count: np.ndarray, segs: list
) -> tuple[dict[str, np.ndarray], dict[int, dict[str, Any]], Callable[[int], str]]:
    """Size, requested_size and state of blocks of any generation; also the rows whose own
    requested_size the column does not hold, and how messages name a block."""
    m = len(blocks)
    seg_of = np.repeat(np.arange(len(count)), count)
    start = np.concatenate([[0], np.cumsum(count)])

    def at(j: int) -> str:
        s = int(seg_of[j])
        return f"{_seg_where(segs, s)}: block {j - int(start[s])}"

    if set(map(type, blocks)) - _DICT:
        j = next(j for j, b in enumerate(blocks) if type(b) is not dict)
        raise SnapshotError(f"{at(j)} is {type_phrase(blocks[j])}, not a dict")
    for k in ("size", "state"):
        j = next((j for j, b in enumerate(blocks) if k not in b), None)
        if j is not None:
            raise SnapshotError(f"{at(j)} has no {k}")
    size = _int_column(list(map(itemgetter("size"), blocks)), "size", at)
    requested, override = _requested_column(blocks, size, at)
    states = list(map(itemgetter("state"), blocks))
    try:
        state = np.fromiter(map(_STATE_CODE.__getitem__, states), np.uint8, m)
    except (KeyError, TypeError):
        j = next(j for j, s in enumerate(states) if _state_code(s) is None)
        raise SnapshotError(f"{at(j)} has unknown state {short_repr(states[j])}") from None
    return {"size": size, "requested_size": requested, "state": state}, override, at


def _state_code(state: Any) -> int | None:
    try:
        return _STATE_CODE[state]
    except (KeyError, TypeError):
        return None


def _blocks_full(
    blocks: list, at: Callable[[int], str], override: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """What a Snapshot keeps of blocks beyond the analysis: addresses, frames, key layouts."""
    m = len(blocks)
    shape = _Shape.of(blocks, _BLOCK_KEYS)
    if override:
        shape = replace(shape, override=override)
    addr_has = shape.has("address", m)
    address: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None
    if addr_has.all() and m:
        address = _int_column(list(map(itemgetter("address"), blocks)), "address", at)
    elif addr_has.any():  # some blocks without an address: `_assemble` fills those in
        fill = [b.get("address", 0) for b in blocks]
        address = (_int_column(fill, "address", at), addr_has)
    frames = [b.get("frames") for b in blocks] if shape.has("frames", m).any() else None
    return {"blk_address": address, "blk_frames": frames, "blk_shape": shape}


def _requested_column(
    blocks: list, size: np.ndarray, at: Callable[[int], str]
) -> tuple[np.ndarray, dict[int, dict[str, Any]]]:
    """What torch accounts each block for (`_memory_viz._block_extra`): requested_size; for a
    torch 2.0 block (no frames) its history[0] real_size, else its requested_size, else its size.

    Also the rows whose own requested_size the column does not hold (for `_Shape.override`).
    A malformed history is read as no history, as `Snapshot.block_frames` reads its frames.
    """
    missing = object()
    req = [b.get("requested_size", missing) for b in blocks]
    override: dict[int, dict[str, Any]] = {}
    for j, b in enumerate(blocks):
        if "frames" in b or not b.get("history"):
            continue
        real = _real_size(b["history"])
        if real is None:
            continue
        given = req[j]
        if given is not missing and not (type(given) is int and given == real):
            override[j] = {"requested_size": given}
        req[j] = real
    if any(r is missing for r in req):
        req = [s if r is missing else r for r, s in zip(req, size.tolist(), strict=True)]
    return _int_column(req, "requested_size", at), override


def _real_size(history: Any) -> int | None:
    """history[0]["real_size"] of a torch 2.0 block, or None where that is not an integer."""
    if type(history) not in _PAIR_TYPES or not history or type(history[0]) is not dict:
        return None
    return _int64(history[0].get("real_size"))


def _check_totals(total_size: np.ndarray, blk: Mapping[str, np.ndarray]) -> None:
    """Sums over a whole file must fit in int64, or every figure built on them would wrap."""
    for what, col in (
        ("the blocks add", blk["size"]),
        ("the requested sizes add", blk["requested_size"]),
        ("total_size adds", total_size),
    ):
        if not len(col):
            continue
        bound = max(int(col.max()), -int(col.min())) * len(col)
        if bound >= 1 << 63 and sum(map(abs, col.tolist())) >= 1 << 63:
            raise SnapshotError(f"segments: {what} up past 2^63 bytes")


def _trace_columns(raw: list | None) -> dict[int, Trace]:
    if raw is None:
        return {}
    return {d: Trace.from_entries(t, f"device_traces[{d}]") for d, t in enumerate(raw)}


# ---------------------------------------------------------------------------------------------
# Validation


def _check_settings(settings: dict | None) -> None:
    """The allocator_settings shape the analyses rely on (roundup_power2_divisions)."""
    rd = (settings or {}).get("roundup_power2_divisions")
    if rd is None:
        return
    if type(rd) is not dict:
        raise SnapshotError(
            f"allocator_settings: roundup_power2_divisions is {type_phrase(rd)}, not a dict"
        )
    for k, v in rd.items():
        if not (type(k) is int or (type(k) is str and k.isascii() and k.isdigit())):
            raise SnapshotError(
                f"allocator_settings: roundup_power2_divisions key {short_repr(k)} is not an "
                "interval (a non-negative integer)"
            )
        if not (type(v) is int and 0 <= v < 1 << 64 and v & (v - 1) == 0):
            raise SnapshotError(
                f"allocator_settings: roundup_power2_divisions[{short_repr(k)}] is "
                f"{short_repr(v)}, not 0 or a power of 2"
            )


def validate(snapshot: Snapshot) -> None:
    """Check that a snapshot is self-consistent; raise `SnapshotError` at the first problem.

    Vectorised over the columns: block sizes sum to total_size, blocks are contiguous from
    the segment address, allocated/active/requested sums match the blocks, sizes are not
    negative, and segments of a device do not overlap.

    Examples
    --------
    >>> snap = Snapshot.from_torch([{"address": 0, "total_size": 1024, "blocks": [
    ...     {"size": 512, "state": "inactive"}]}])
    >>> try:
    ...     validate(snap)
    ... except SnapshotError as e:
    ...     print(e)
    segment 0 (device 0, 0x0): blocks sum to 512 bytes but total_size is 1024
    """
    s, b = snapshot.segments, snapshot.blocks
    m = len(b)
    _check_settings(snapshot.allocator_settings)

    def first(mask: np.ndarray) -> int | None:
        hit = np.flatnonzero(mask)
        return int(hit[0]) if hit.size else None

    j = first(b.size <= 0)
    if j is not None:
        seg = int(b.segment[j])
        raise SnapshotError(
            f"{snapshot.where(seg)}: block {j - int(s.block_start[seg])} has size {int(b.size[j])}"
        )
    i = first(s.total_size <= 0)
    if i is not None:
        raise SnapshotError(f"{snapshot.where(i)}: total_size is {int(s.total_size[i])}")
    cs = np.zeros(m + 1, np.int64)
    end = s.block_start + s.block_count
    np.cumsum(b.size, out=cs[1:])
    block_sum = cs[end] - cs[s.block_start]
    i = first(block_sum != s.total_size)
    if i is not None:
        raise SnapshotError(
            f"{snapshot.where(i)}: blocks sum to {int(block_sum[i])} bytes but total_size is "
            f"{int(s.total_size[i])}"
        )
    offset = cs[:-1] - cs[s.block_start[b.segment]] if m else cs[:0]
    j = first(b.address != s.address[b.segment] + offset)
    if j is not None:
        seg = int(b.segment[j])
        raise SnapshotError(
            f"{snapshot.where(seg)}: block {j - int(s.block_start[seg])} is at "
            f"{int(b.address[j]):#x}, expected {int(s.address[seg] + offset[j]):#x} "
            "(blocks must be contiguous)"
        )
    for name, mask, w in (
        ("allocated_size", b.state == ALLOCATED, b.size),
        ("active_size", b.state != INACTIVE, b.size),
        ("requested_size", b.state != INACTIVE, b.requested_size),
    ):
        np.cumsum(np.where(mask, w, 0), out=cs[1:])
        got = cs[end] - cs[s.block_start]
        i = first(got != getattr(s, name))
        if i is not None:
            raise SnapshotError(
                f"{snapshot.where(i)}: {name} is {int(getattr(s, name)[i])} but its blocks "
                f"give {int(got[i])}"
            )
    order = np.lexsort((s.address, s.device))
    if len(order) > 1:
        dev, lo, hi = s.device[order], s.address[order], s.address[order] + s.total_size[order]
        k = first((dev[1:] == dev[:-1]) & (lo[1:] < hi[:-1]))
        if k is not None:
            a, c = int(order[k]), int(order[k + 1])
            raise SnapshotError(f"{snapshot.where(c)} overlaps {snapshot.where(a)}")
