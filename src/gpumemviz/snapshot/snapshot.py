"""The `Snapshot`: PyTorch allocator state as numpy columns, with frozen views for humans.

Rows stay in the file's order, so `Snapshot.from_torch(d).to_torch() == d` for every modern
file: each row remembers its key set (its "layout", `RowShape`) and any key we do not know, and
frames lists are referenced, never copied. Building columns never creates one Python object per
block, so a 10^6-block file stays cheap. The module stays whole (about 650 lines): its
constructors, views and torch round trip all work on the one frozen value's private fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from gpumemviz.snapshot.columns import readonly, row_index, take, taker
from gpumemviz.snapshot.gc_pause import no_gc
from gpumemviz.snapshot.schema import (
    ALLOCATED,
    BLOCK_KEYS,
    INACTIVE,
    PENDING_FREE,
    SEG_INT_KEYS,
    SEG_KEYS,
    STATE_NAMES,
    TOP_KEYS,
    BoolColumn,
    IntColumn,
    SnapshotError,
    TorchDict,
    TorchList,
    TorchMapping,
)
from gpumemviz.snapshot.settings import AllocatorConfig, ConfigError
from gpumemviz.snapshot.shapes import RowShape
from gpumemviz.snapshot.tables import Block, BlockTable, Segment, SegmentTable, Trace
from gpumemviz.snapshot.torch_reader import read_torch
from gpumemviz.snapshot.units import format_size


def _legacy_frames(extra: TorchMapping | None) -> TorchList | None:
    """The frames of a torch 2.0 block: its `history[0]` (as `_memory_viz._block_extra_legacy`
    reads it), None without one."""
    history = extra.get("history") if extra else None
    if isinstance(history, list) and history and isinstance(history[0], dict):
        frames = history[0].get("frames")
        return frames if isinstance(frames, list) else None
    return None


_STACKS = frozenset({list, tuple})


def _stack(frames: object) -> tuple[TorchDict, ...]:
    """A row's frames as a tuple; () when none were recorded or they are not a list."""
    return tuple(frames) if isinstance(frames, list | tuple) else ()


def _empty_lists(n: int) -> Callable[[np.ndarray | None], list[TorchList]]:
    """A fresh [] per row: rows built by `from_columns` have no frames, and must not share one."""
    return lambda idx: [[] for _ in range(n if idx is None else len(idx))]


@dataclass(frozen=True, eq=False)
class Snapshot:
    """PyTorch caching-allocator state (segments, blocks, traces) as numpy columns.

    Build one with `Snapshot.from_torch(dict_or_list)`, `Snapshot.from_columns(...)` or
    `gpumemviz.load_snapshot(path)`; `to_torch()` gives the dict back. Frames lists, settings and
    annotations are shared with the source dict, not copied: treat them as read-only. The value
    is frozen and its numpy columns are read-only.

    Attributes
    ----------
    segments : SegmentTable
        Segment columns, one row per segment in file order (devices in order, addresses
        ascending inside a device).
    blocks : BlockTable
        Block columns, segment by segment in address order.
    traces : {int: Trace}
        One per ``device_traces`` list, keyed by device index (devices whose trace is empty
        are present too); ``{}`` for a bare segment list.
    allocator_settings : dict or None
        The file's ``allocator_settings``, as given.
    external_annotations : list or None
        The file's ``external_annotations``, as given.

    Examples
    --------
    >>> snap = Snapshot.from_torch({"segments": [{"device": 0, "address": 4096,
    ...     "total_size": 2097152, "stream": 0, "segment_type": "small", "blocks": [
    ...         {"size": 512, "state": "active_allocated", "requested_size": 100},
    ...         {"size": 2096640, "state": "inactive", "requested_size": 0}]}],
    ...     "device_traces": [[], []]})
    >>> snap
    <Snapshot devices=[0] segments=1 blocks=2 trace_entries=0 reserved=2.00 MiB>
    >>> snap.segments.total_size.tolist(), snap.blocks.state.tolist(), sorted(snap.traces)
    ([2097152], [1, 0], [0, 1])
    """

    segments: SegmentTable
    blocks: BlockTable
    traces: Mapping[int, Trace]
    allocator_settings: TorchDict | None = None
    external_annotations: TorchList | None = None  # torch's items, as given
    _seg_frames: TorchList | None = field(default=None, repr=False)
    _seg_shape: RowShape = field(default=RowShape.uniform(SEG_KEYS), repr=False)
    _blk_frames: TorchList | None = field(default=None, repr=False)
    _blk_shape: RowShape = field(default=RowShape.uniform(BLOCK_KEYS), repr=False)
    _top_keys: tuple[str, ...] = field(default=TOP_KEYS, repr=False)
    _top_extra: TorchMapping = field(default_factory=dict, repr=False)

    # -- sizes and views ------------------------------------------------------------------------

    @property
    def n_segments(self) -> int:
        """Number of segment rows (``len(self.segments)``)."""
        return len(self.segments)

    @property
    def n_blocks(self) -> int:
        """Number of block rows (``len(self.blocks)``)."""
        return len(self.blocks)

    @property
    def devices(self) -> tuple[int, ...]:
        """Devices that hold a segment or a trace entry, ascending."""
        seen = set(np.unique(self.segments.device).tolist())
        seen.update(d for d, t in self.traces.items() if len(t))
        return tuple(sorted(seen))

    @property
    def config(self) -> AllocatorConfig:
        """The recorded `allocator_settings`, parsed on first use and kept: every analysis,
        replay and advice check of this snapshot reads this one value.

        Returns
        -------
        AllocatorConfig
            `AllocatorConfig.from_settings(allocator_settings)`: torch's defaults when none
            were recorded.

        Raises
        ------
        ConfigError
            When the recorded settings do not parse; each use raises it again, with the
            message of the one parse.

        Examples
        --------
        >>> snap = Snapshot.from_torch({"segments": [], "allocator_settings": {
        ...     "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1}})
        >>> snap.config.expandable_segments, snap.config is snap.config
        (True, True)
        """
        parsed = self._parsed_settings
        if isinstance(parsed, ConfigError):
            raise ConfigError(*parsed.args) from None
        return parsed

    @cached_property
    def _parsed_settings(self) -> AllocatorConfig | ConfigError:
        """The one parse of the recorded settings, or why they do not parse (a frozen
        dataclass with a ``__dict__``: `cached_property` stores it there)."""
        try:
            return AllocatorConfig.from_settings(self.allocator_settings)
        except ConfigError as err:
            return err

    def __repr__(self) -> str:
        reserved = int(self.segments.total_size.sum())
        n_trace = sum(len(t) for t in self.traces.values())
        return (
            f"<Snapshot devices={list(self.devices)} segments={self.n_segments} "
            f"blocks={self.n_blocks} trace_entries={n_trace} reserved={format_size(reserved)}>"
        )

    def block(self, i: int) -> Block:
        """Block `i` (in table order) as a frozen value, for humans.

        Parameters
        ----------
        i : int
            Row in `blocks`; negative counts from the end.

        Returns
        -------
        Block
            Its frames as a tuple (a torch 2.0 block's come from its ``history[0]``).

        Raises
        ------
        IndexError
            When `i` is out of range.

        Examples
        --------
        >>> snap = Snapshot.from_torch([{"address": 4096, "total_size": 1024, "blocks": [
        ...     {"size": 1024, "state": "active_allocated", "requested_size": 1000}]}])
        >>> b = snap.block(0)
        >>> b.address, b.size, b.requested_size, b.state
        (4096, 1024, 1000, 'active_allocated')
        """
        i = row_index(i, self.n_blocks, "block", "blocks")
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
            frames=_stack(frames),
        )

    def block_frames(self) -> TorchList:
        """Each block's allocation stack, in table order: the file's frames list (shared, not
        copied), a torch 2.0 block's `history[0]` frames, or `[]` when none was recorded (or
        what the file holds there is not a list).

        One list for all blocks, so stack analysis (sites, hover) costs no per-block objects.
        `Trace.frames()` is the same per trace entry.

        Returns
        -------
        list of list
            One frames list per block (treat as read-only).

        Examples
        --------
        >>> frame = {"filename": "train.py", "line": 3, "name": "step"}
        >>> snap = Snapshot.from_torch([{"address": 0, "total_size": 1024, "blocks": [
        ...     {"size": 512, "state": "active_allocated", "frames": [frame]},
        ...     {"size": 512, "state": "inactive"}]}])
        >>> snap.block_frames()
        [[{'filename': 'train.py', 'line': 3, 'name': 'step'}], []]
        """
        n = self.n_blocks
        base = self._blk_frames
        out = [[]] * n if base is None else [f if type(f) in _STACKS else [] for f in base]
        for i, extra in self._blk_shape.extra.items():
            if base is None or base[i] is None:
                legacy = _legacy_frames(extra)
                if legacy is not None:
                    out[i] = legacy
        return out

    def map_objects(self, fn: Callable[[TorchDict], TorchDict]) -> Snapshot:
        """A snapshot whose Python objects (everything that is not a numpy column) went
        through `fn`; the columns are shared.

        `fn` gets one plain dict and returns one of the same shape: ``seg_frames`` and
        ``blk_frames`` (a frames list per row, or None), ``seg_extra`` and ``blk_extra``
        ({row: {unknown key: value}}, torch 2.0 `history` included), ``traces`` ({device:
        {"objects": {frames/compile_context/user_metadata: per-entry list or None},
        "extra": {entry: {key: value}}, "action_names": [str]}}), ``allocator_settings``,
        ``external_annotations`` and ``top_extra``. This is how path redaction rewrites every
        string of a 10^6-block snapshot without building its dicts.

        Parameters
        ----------
        fn : callable
            Takes the dict above and returns one of the same shape (it may return new values
            for any of the keys; unchanged ones stay shared).

        Returns
        -------
        Snapshot
            The same columns (shared) with `fn`'s objects.

        Examples
        --------
        >>> snap = Snapshot.from_torch({"segments": [], "allocator_settings": {"a": 1}})
        >>> snap.map_objects(lambda d: {**d, "allocator_settings": {"a": 2}}).allocator_settings
        {'a': 2}
        """
        payload: TorchDict = {
            "seg_frames": self._seg_frames,
            "blk_frames": self._blk_frames,
            "seg_extra": dict(self._seg_shape.extra),
            "blk_extra": dict(self._blk_shape.extra),
            "traces": {d: t.object_parts() for d, t in self.traces.items()},
            "allocator_settings": self.allocator_settings,
            "external_annotations": self.external_annotations,
            "top_extra": dict(self._top_extra),
        }
        out = fn(payload)
        traces = {d: t.with_object_parts(out["traces"][d]) for d, t in self.traces.items()}
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
        """Segment `i` (in file order) with its blocks, as a frozen value, for humans.

        Parameters
        ----------
        i : int
            Row in `segments`; negative counts from the end.

        Returns
        -------
        Segment
            With ``.blocks`` (a tuple of `Block`) and ``.end`` (one past the last byte).

        Raises
        ------
        IndexError
            When `i` is out of range.

        Examples
        --------
        >>> snap = Snapshot.from_torch([{"address": 4096, "total_size": 1024, "blocks": [
        ...     {"size": 1024, "state": "inactive"}]}])
        >>> seg = snap.segment(-1)
        >>> seg.segment_type, seg.end, [b.state for b in seg.blocks]
        ('large', 5120, ['inactive'])
        """
        i = row_index(i, self.n_segments, "segment", "segments")
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
            frames=_stack(frames),
            blocks=tuple(self.block(j) for j in range(start, start + count)),
        )

    def where(self, seg: int) -> str:
        """'segment 3 (device 0, 0x7f5d00000000)': how messages name a segment.

        Every `SnapshotError` about a segment starts with this.

        Parameters
        ----------
        seg : int
            Row in `segments`.

        Returns
        -------
        str

        Examples
        --------
        >>> Snapshot.from_torch([{"device": 1, "address": 0x7F5D00000000, "total_size": 512,
        ...     "blocks": [{"size": 512, "state": "inactive"}]}]).where(0)
        'segment 0 (device 1, 0x7f5d00000000)'
        """
        s = self.segments
        return f"segment {seg} (device {int(s.device[seg])}, {int(s.address[seg]):#x})"

    # -- torch dicts ----------------------------------------------------------------------------

    @classmethod
    def from_torch(cls, obj: TorchDict | TorchList) -> Snapshot:
        """Read a torch snapshot: the `_snapshot()` dict of any generation, or a segment list.

        Checks only what building the columns needs (types, required keys, states);
        `validate` checks the rest. ``Snapshot.from_torch(d).to_torch() == d`` for every dict,
        the torch 2.0 legacy file included: each row keeps its key set, unknown keys are kept,
        and ``segment_pool_id`` comes back a tuple even from JSON lists. Frames lists, settings
        and annotations are shared, not copied.

        Parameters
        ----------
        obj : dict or list
            `torch.cuda.memory._snapshot()` (2.0 legacy blocks with `history` included), or
            the bare list `torch.cuda.memory_snapshot()` returns.

        Returns
        -------
        Snapshot

        Raises
        ------
        SnapshotError
            One line naming what is wrong and where.

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

    def to_torch_segments(self) -> TorchDict:
        """`to_torch()` with every trace left empty: the segments and settings that replay,
        playback and export read beside the traces' own columns (no dict per trace entry).

        Returns
        -------
        dict
            The torch dict, ``device_traces`` holding no entries.

        Examples
        --------
        >>> snap = Snapshot.from_torch({"segments": [], "device_traces": [[
        ...     {"action": "alloc", "addr": 0, "size": 512, "stream": 0}]]})
        >>> snap.to_torch_segments()
        {'segments': [], 'device_traces': []}
        """
        return replace(self, traces={}).to_torch()

    def to_torch(self) -> TorchDict:
        """The torch dict: `from_torch(d).to_torch() == d` for dicts; a bare list gains
        `device_traces` (one empty list per device up to the highest) so PyTorch's tools
        accept it.

        Returns
        -------
        dict
            ``{"segments", "device_traces", ...}`` in torch's key order; frames lists, settings
            and annotations are the snapshot's own (shared, not copied).

        Examples
        --------
        >>> d = {"segments": [], "device_traces": [[]], "custom": 1}
        >>> Snapshot.from_torch(d).to_torch() == d
        True
        >>> Snapshot.from_torch([{"device": 1, "address": 0, "total_size": 512,
        ...     "blocks": [{"size": 512, "state": "inactive"}]}]).to_torch()["device_traces"]
        [[], []]
        """
        with no_gc():
            return self._to_torch()

    def _to_torch(self) -> TorchDict:
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

    def _block_dicts(self) -> list[list[TorchDict]]:
        b = self.blocks
        n = len(b)
        frames = self._blk_frames
        vals: dict[str, Any] = {  # Any: `RowShape.build`'s columns
            "address": taker(b.address),
            "size": taker(b.size),
            "requested_size": taker(b.requested_size),
            "state": lambda idx: [STATE_NAMES[c] for c in take(b.state, idx)],
            "frames": frames if frames is not None else _empty_lists(n),
        }
        rows = self._blk_shape.build(n, vals)
        starts = self.segments.block_start.tolist()
        counts = self.segments.block_count.tolist()
        return [rows[a : a + c] for a, c in zip(starts, counts, strict=True)]

    def _segment_dicts(self, block_lists: list[list[TorchDict]]) -> list[TorchDict]:
        s = self.segments
        n = len(s)
        frames = self._seg_frames
        vals: dict[str, Any] = {k: taker(getattr(s, k)) for k in SEG_INT_KEYS}  # build's columns
        vals["segment_type"] = lambda idx: [
            "small" if x else "large" for x in take(s.is_small, idx)
        ]
        vals["segment_pool_id"] = lambda idx: list(map(tuple, take(s.pool_id, idx)))
        vals["is_expandable"] = taker(s.is_expandable)
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
        segment_frames: TorchList | None = None,
        block_frames: TorchList | None = None,
        traces: Mapping[int, Trace] | None = None,
        allocator_settings: TorchDict | None = None,
        external_annotations: TorchList | None = None,
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
            seg_shape=RowShape.uniform(SEG_KEYS),
            blk_shape=RowShape.uniform(BLOCK_KEYS),
            seg_sums=None,
            top_keys=tuple(
                k
                for k in TOP_KEYS
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
    allocator_settings: TorchDict | None,
    external_annotations: TorchList | None,
    seg_frames: TorchList | None,
    blk_frames: TorchList | None,
    seg_shape: RowShape,
    blk_shape: RowShape,
    seg_sums: Mapping[str, np.ndarray | None] | None,
    top_keys: tuple[str, ...],
    top_extra: TorchMapping,
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
        own = None if seg_sums is None else seg_sums.get(name)
        if own is not None:  # the file's own: `validate` compares them with the blocks
            sums[name] = own
            continue
        counted = state == ALLOCATED if name == "allocated_size" else state != INACTIVE
        w = blk["requested_size"] if name == "requested_size" else size
        np.cumsum(np.where(counted, w, 0), out=cs[1:])
        sums[name] = cs[start + count] - cs[start]
    segments = SegmentTable(
        device=readonly(seg["device"]),
        address=readonly(seg["address"]),
        total_size=readonly(seg["total_size"]),
        allocated_size=readonly(sums["allocated_size"]),
        active_size=readonly(sums["active_size"]),
        requested_size=readonly(sums["requested_size"]),
        stream=readonly(seg["stream"]),
        is_small=readonly(seg["is_small"]),
        is_expandable=readonly(seg["is_expandable"]),
        pool_id=readonly(seg["pool_id"]),
        block_start=readonly(start),
        block_count=readonly(count),
    )
    blocks = BlockTable(
        segment=readonly(segment),
        address=readonly(blk_address),
        size=readonly(size),
        requested_size=readonly(blk["requested_size"]),
        state=readonly(state),
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


def _trace_columns(raw: TorchList | None) -> dict[int, Trace]:
    if raw is None:
        return {}
    return {d: Trace.from_entries(t, f"device_traces[{d}]") for d, t in enumerate(raw)}
