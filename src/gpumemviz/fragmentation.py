"""Fragmentation analysis: where the reserved bytes of the caching allocator are, and what fits.

`fragmentation(snapshot)` walks the segments once and returns a frozen `FragmentationReport`:
per-device and total figures (reserved, allocated, free, trapped, releasable, largest free block,
external fragmentation), per-segment numpy columns, the worst segments, the per-segment
conservation law, and `can_fit(nbytes)`, which answers "would this allocation succeed?" by the
allocator's own rules (reference sections 2.6-2.13 and 8).

Two ways in, one report: a torch dict (or bare segment list) is walked directly in one tight pass
per segment, because that is what users hand us straight from `torch.cuda.memory._snapshot()`;
a `Snapshot` (and paths or bytes, through `gpumemviz.io.as_snapshot`) is reduced over its numpy
columns. Full validation belongs to `load_snapshot`; the dict path checks only what it reads.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ._callable import make_module_callable
from .allocator.config import AllocatorConfig, ConfigError
from .allocator.rules import (
    K_SMALL_BUFFER,
    UNLIMITED,
    allocation_size,
    is_small,
    oversize_rejects,
    page_size,
    round_size,
)
from .units import format_size, parse_size

__all__ = [
    "VERDICTS",
    "ConservationViolation",
    "FitAnswer",
    "FragmentationReport",
    "MemoryFigures",
    "PoolKey",
    "SegmentFigures",
    "SegmentSummary",
    "fragmentation",
]

#: How many segments `worst_segments` keeps per device (the CLI prints them all).
N_WORST = 5

#: `FitAnswer.verdict` values, in the order the allocator tries them (section 2.6).
VERDICTS = (
    "cached",
    "new_segment",
    "garbage_collect",
    "flush_and_retry",
    "out_of_memory",
    "room_unknown",
)

_ALLOCATED = "active_allocated"
_INACTIVE = "inactive"
_PENDING = "active_pending_free"


# --------------------------------------------------------------------------------------------
# Report values


@dataclass(frozen=True)
class PoolKey:
    """One best-fit pool of the allocator: a stream's small or large pool (private pools apart)."""

    device: int
    stream: int
    pool: str  # "small" | "large"
    pool_id: tuple[int, int] = (0, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "stream": self.stream,
            "pool": self.pool,
            "pool_id": list(self.pool_id),
        }


@dataclass(frozen=True)
class SegmentSummary:
    """One segment, for humans (the worst segments of a device)."""

    index: int  # row in `FragmentationReport.per_segment`
    device: int
    address: int
    total_size: int
    allocated: int
    pending_free: int
    free: int
    largest_free: int
    releasable: int
    stuck_free: int  # free bytes empty_cache cannot return
    stream: int
    pool: str
    is_expandable: bool
    n_blocks: int

    @property
    def external_fragmentation(self) -> float:
        return 0.0 if self.free == 0 else 1.0 - self.largest_free / self.free

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["external_fragmentation"] = self.external_fragmentation
        return d


@dataclass(frozen=True)
class ConservationViolation:
    """A segment whose blocks do not add up: allocated + free + pending != total_size."""

    index: int
    device: int
    address: int
    total_size: int
    blocks_sum: int

    @property
    def message(self) -> str:
        return (
            f"segment {self.index} (device {self.device}, 0x{self.address:x}): blocks sum to "
            f"{self.blocks_sum} bytes, total_size is {self.total_size}"
        )


@dataclass(frozen=True)
class MemoryFigures:
    """The figures of one device, or of all devices together (`device` is None).

    Every byte of `reserved` is exactly one of allocated, pending_free or free (when the
    conservation law holds). `internal_waste` and `requested` split `allocated`.
    """

    device: int | None
    reserved: int  # sum of segment total_size (mapped bytes for expandable runs)
    allocated: int  # sum of active_allocated block sizes
    active: int  # allocated + pending_free
    requested: int  # sum of requested_size of active_allocated blocks (torch's "allocated")
    pending_free: int  # freed by the user, waiting on record_stream events
    internal_waste: int  # allocated - requested: rounding and whole-block handouts
    free: int  # sum of inactive block sizes
    free_trapped: int  # free inside non-expandable segments that still hold an allocated block
    free_stuck: int  # free + pending_free - releasable: what stays free after empty_cache
    free_stuck_expandable: int  # the part of free_stuck in partial pages of expandable segments
    releasable: int  # what empty_cache would return from the default pool
    releasable_private: int  # the same for private pools (only once the pool is released)
    largest_free: int  # the largest inactive block, over all streams and pools
    external_fragmentation: float  # 1 - largest_free / free
    fragmentation_sq: float  # 1 - sum(free_i^2) / free^2
    segments: int  # segment entries (one per mapped run for expandable segments)
    blocks: int
    blocks_allocated: int
    blocks_pending_free: int
    blocks_free: int
    largest_free_by_pool: Mapping[PoolKey, int] = field(default_factory=dict)
    worst_segments: tuple[SegmentSummary, ...] = ()
    violations: tuple[ConservationViolation, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (the `--json` shape of `gpumemviz inspect`)."""
        d: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("device", "largest_free_by_pool", "worst_segments", "violations"):
                continue
            d[f.name] = getattr(self, f.name)
        d["largest_free_by_pool"] = [
            {**k.to_dict(), "largest_free": v} for k, v in self.largest_free_by_pool.items()
        ]
        d["worst_segments"] = [s.to_dict() for s in self.worst_segments]
        d["violations"] = [v.message for v in self.violations]
        return d


@dataclass(frozen=True, eq=False)
class SegmentFigures:
    """Per-segment figures as numpy columns, one row per segment in snapshot order."""

    device: np.ndarray  # i64
    address: np.ndarray  # i64
    total_size: np.ndarray  # i64
    allocated: np.ndarray  # i64
    pending_free: np.ndarray  # i64
    requested: np.ndarray  # i64 (active_allocated blocks only)
    free: np.ndarray  # i64
    largest_free: np.ndarray  # i64
    free_sq: np.ndarray  # f64: sum of squared inactive block sizes
    releasable: np.ndarray  # i64: what empty_cache would return from this segment
    n_blocks: np.ndarray  # i64
    stream: np.ndarray  # i64
    is_small: np.ndarray  # bool
    is_expandable: np.ndarray  # bool
    pool_id: np.ndarray  # (n, 2) i64

    def __len__(self) -> int:
        return len(self.total_size)

    @property
    def stuck_free(self) -> np.ndarray:
        """Free bytes left after empty_cache (which completes pending frees first): free +
        pending_free - releasable (trapped blocks, or slivers of expandable pages)."""
        return np.maximum(self.free + self.pending_free - self.releasable, 0)

    @property
    def external_fragmentation(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = 1.0 - self.largest_free / self.free
        return np.where(self.free > 0, frac, 0.0)


@dataclass(frozen=True)
class FitAnswer:
    """Whether a request of `nbytes` would succeed now, and why, by the allocator's rules.

    verdict: "cached" (fits in block `block_address`), "new_segment" (needs `new_bytes` from the
    device, which has room), "flush_and_retry" (fits only after the allocator's own sync, cache
    flush and retry), "out_of_memory", or "room_unknown" (needs `new_bytes` and no device_free
    was given).
    """

    verdict: str
    fits: bool | None
    nbytes: int
    rounded: int
    device: int
    stream: int
    pool: str
    block_address: int | None
    block_size: int | None
    new_bytes: int
    releasable: int
    device_free: int | None
    explanation: str

    def __str__(self) -> str:
        return self.explanation

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# --------------------------------------------------------------------------------------------
# The report


@dataclass(frozen=True, eq=False)
class FragmentationReport:
    """What `fragmentation()` returns: figures per device and in total, per-segment columns.

    The total figures are also readable directly: `report.largest_free` is
    `report.total.largest_free`.
    """

    total: MemoryFigures
    devices: Mapping[int, MemoryFigures]
    per_segment: SegmentFigures
    allocator_settings: Mapping[str, Any] | None
    config: AllocatorConfig
    expandable_mode: bool
    # inactive blocks, for can_fit: segment row, offset in the segment, size
    _free_segment: np.ndarray = field(repr=False)
    _free_offset: np.ndarray = field(repr=False)
    _free_size: np.ndarray = field(repr=False)
    _pend_segment: np.ndarray = field(repr=False)  # active_pending_free blocks, the same way
    _pend_offset: np.ndarray = field(repr=False)
    _pend_size: np.ndarray = field(repr=False)

    def __getattr__(self, name: str) -> Any:
        if name in _FIGURE_NAMES:
            return getattr(self.total, name)
        raise AttributeError(f"'FragmentationReport' object has no attribute {name!r}")

    @property
    def violations(self) -> tuple[ConservationViolation, ...]:
        return self.total.violations

    def device(self, device: int) -> MemoryFigures:
        """The figures of one device; ValueError naming the devices present if it is absent."""
        try:
            return self.devices[device]
        except (KeyError, TypeError):
            have = ", ".join(str(d) for d in self.devices) or "none"
            raise ValueError(f"no device {device} in this snapshot (devices: {have})") from None

    def to_dict(self) -> dict[str, Any]:
        """`{"total": {...}, "devices": {"0": {...}}}`: plain ints, floats, lists and strings."""
        return {
            "total": self.total.to_dict(),
            "devices": {str(d): f.to_dict() for d, f in self.devices.items()},
            "settings": {
                "recorded": self.allocator_settings is not None,
                "expandable_segments": self.expandable_mode,
                "max_split_size": (
                    None if self.config.max_split_size == UNLIMITED else self.config.max_split_size
                ),
                "roundup_power2_divisions": list(self.config.roundup_power2_divisions),
            },
        }

    def can_fit(
        self,
        nbytes: int | str,
        stream: int = 0,
        device: int = 0,
        device_free: int | str | None = None,
    ) -> FitAnswer:
        """Would `torch.empty(nbytes)` on `stream` succeed now, by the allocator's own rules?

        Parameters
        ----------
        nbytes : int or str
            The request ("1.5GiB" works too).
        stream : int
            The raw stream value as recorded in the snapshot (0 = default stream).
        device : int
            The device index.
        device_free : int or str, optional
            Bytes the driver has free (cudaMemGetInfo, or an `oom` entry's device_free). Without
            it, a request that needs new memory is answered "room_unknown".

        Returns
        -------
        FitAnswer
            `verdict` is one of `VERDICTS`; `explanation` is one sentence.

        Examples
        --------
        >>> seg = {"device": 0, "address": 0x7F0000000000, "total_size": 20 * 2**20,
        ...        "stream": 0, "segment_type": "large", "blocks": [
        ...     {"size": 4 * 2**20, "requested_size": 4_000_000, "state": "active_allocated"},
        ...     {"size": 16 * 2**20, "requested_size": 0, "state": "inactive"}]}
        >>> fragmentation([seg]).can_fit(10 * 2**20).verdict
        'cached'
        >>> fragmentation([seg]).can_fit(40 * 2**20, device_free=0).verdict
        'out_of_memory'
        """
        return _can_fit(self, nbytes, stream, device, device_free)


_FIGURE_NAMES = frozenset(f.name for f in fields(MemoryFigures)) - {"device"}


# --------------------------------------------------------------------------------------------
# Entry point


def fragmentation(snapshot: Any) -> FragmentationReport:
    """Measure the allocator's memory and its fragmentation in a snapshot.

    Parameters
    ----------
    snapshot : Snapshot, dict, list, str, os.PathLike or bytes
        A `gpumemviz.Snapshot`, the dict of `torch.cuda.memory._snapshot()`, the segment list of
        `torch.cuda.memory_snapshot()`, or a snapshot file (path or bytes).

    Returns
    -------
    FragmentationReport
        Per-device and total figures, per-segment columns and `can_fit`.

    Raises
    ------
    gpumemviz.SnapshotError
        When a segment or block lacks what the analysis reads (one line, saying where).

    Examples
    --------
    >>> seg = {"device": 0, "address": 0, "total_size": 2 * 2**20, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...     {"size": 512, "requested_size": 100, "state": "active_allocated"},
    ...     {"size": 2 * 2**20 - 512, "requested_size": 0, "state": "inactive"}]}
    >>> r = fragmentation({"segments": [seg]})
    >>> r.reserved, r.allocated, r.internal_waste, r.free_trapped, r.releasable
    (2097152, 512, 412, 2096640, 0)
    """
    if isinstance(snapshot, Mapping) and "segments" in snapshot:
        segs = snapshot["segments"]
        settings = snapshot.get("allocator_settings")
        traces = snapshot.get("device_traces")
        # devices: those holding a segment or a trace entry (as `Snapshot.devices`)
        traced = tuple(i for i, t in enumerate(traces) if t) if isinstance(traces, list) else ()
        if isinstance(segs, list):
            return _from_dict(segs, settings, traced)
    elif isinstance(snapshot, list):
        return _from_dict(snapshot, None, ())
    from .io import as_snapshot  # io is needed only off the dict path

    return _from_snapshot(as_snapshot(snapshot))


# --------------------------------------------------------------------------------------------
# The dict path: one pass per segment, locals only, no per-block calls


@dataclass(frozen=True)
class _Columns:
    """What both paths extract: segment columns plus the non-allocated blocks, in file order."""

    device: np.ndarray
    address: np.ndarray
    total_size: np.ndarray
    allocated: np.ndarray
    requested: np.ndarray
    n_blocks: np.ndarray
    stream: np.ndarray
    is_small: np.ndarray
    is_expandable: np.ndarray
    pool_id: np.ndarray
    free_segment: np.ndarray  # inactive blocks: segment row, offset in segment, size
    free_offset: np.ndarray
    free_size: np.ndarray
    pend_segment: np.ndarray  # active_pending_free blocks, the same way
    pend_offset: np.ndarray
    pend_size: np.ndarray


def _from_dict(segs: list, settings: Any, traced: tuple[int, ...]) -> FragmentationReport:
    try:
        if not isinstance(segs, list):
            raise TypeError("'segments' is not a list")
        legacy = segs and segs[0]["blocks"] and "frames" not in segs[0]["blocks"][0]
        walked = _walk_careful(segs) if legacy else _walk_fast(segs)
    except _BadState as e:
        raise _error(segs, f"unknown block state {e.args[0]!r}") from None
    except (KeyError, TypeError, AttributeError, OverflowError):
        # an older or hand-made file (no frames, is_expandable, segment_pool_id...): walk it
        # again the careful way, which raises a located SnapshotError on what is truly missing
        walked = _walk_careful(segs)
    per_seg, free_pos, pend_pos, smalls, odd = walked
    n = len(segs)
    try:
        flat = np.frombuffer(per_seg, np.int64)
        per = flat[:-1].reshape(n, _PER_SEG)
        device = np.zeros(n, dtype=np.int64)
        stream = np.zeros(n, dtype=np.int64)
        is_exp = np.zeros(n, dtype=bool)
        pool_id = np.zeros((n, 2), dtype=np.int64)
        if odd:  # rows with a device, stream, expandable flag or pool other than the default
            rows = np.array(odd, dtype=np.int64)
            device[rows] = [segs[i].get("device") or 0 for i in odd]
            stream[rows] = [segs[i].get("stream") or 0 for i in odd]
            is_exp[rows] = [bool(segs[i].get("is_expandable")) for i in odd]
            pool_id[rows] = [tuple(segs[i].get("segment_pool_id") or (0, 0)) for i in odd]
    except (ValueError, OverflowError, TypeError) as e:
        raise _error(segs, f"a value is not a 64-bit integer ({e})") from None
    is_small = np.zeros(n, dtype=bool)
    is_small[smalls] = True
    seg_start = flat[4:-1:_PER_SEG]
    blocks_end = np.append(seg_start[1:], flat[-1])  # the next segment's start
    free = _located(free_pos, seg_start)
    pend = _located(pend_pos, seg_start)
    # allocated bytes = what the blocks cover, less the free and pending-free blocks
    allocated = blocks_end - seg_start
    for part in (free, pend):
        seg, size = part["segment"], part["size"]
        allocated -= _group(seg, _starts(seg), size, n, np.add)
    cols = _Columns(
        device=device,
        address=per[:, 1],
        total_size=per[:, 2],
        allocated=allocated,
        requested=per[:, 0],
        n_blocks=per[:, 3],
        stream=stream,
        is_small=is_small,
        is_expandable=is_exp,
        pool_id=pool_id,
        **{f"free_{k}": v for k, v in free.items()},
        **{f"pend_{k}": v for k, v in pend.items()},
    )
    return _reduce(cols, settings, traced)


_Walked = tuple[array, array, array, list[int], list[int]]
# per segment: requested, address, total_size, n_blocks, position of its first block in the
# concatenation of all blocks, and (last segment only, appended after the walk) the end position
_PER_SEG = 5
_DEFAULT_POOL = (0, 0)


def _walk_fast(segs: list) -> _Walked:
    """The hot loop, for torch >= 2.1 dicts.

    It stores machine integers straight into `array`s while each value is in the CPU cache (a
    tuple per block would also wake the garbage collector, which then walks the whole freshly
    loaded snapshot), and records the rare things (another device, stream, pool, expandable
    segments) as row numbers, to read them again afterwards.
    """
    per_seg = array("q")
    free_pos = array("q")  # (position, size) pairs, flat
    pend_pos = array("q")
    smalls: list[int] = []
    odd: list[int] = []
    put = per_seg.append
    put_free = free_pos.append
    allocated_s, inactive_s, pending_s, small_s = _ALLOCATED, _INACTIVE, _PENDING, _SMALL
    default = _DEFAULT_POOL
    base = 0
    for si, seg in enumerate(segs):
        blocks = seg["blocks"]
        a = f = p = r = 0
        for b in blocks:
            size = b["size"]
            st = b["state"]
            if st == allocated_s:
                a += size
                r += b["requested_size"]
            elif st == inactive_s:
                put_free(base + a + f + p)
                put_free(size)
                f += size
            elif st == pending_s:
                pend_pos.extend((base + a + f + p, size))
                p += size
            else:
                raise _BadState(st)
        put(r)
        put(seg["address"])
        put(seg["total_size"])
        put(len(blocks))
        put(base)
        base += a + f + p
        if seg["segment_type"] == small_s:
            smalls.append(si)
        if (
            seg["device"]
            or seg["stream"]
            or seg["is_expandable"]
            or seg["segment_pool_id"] != default
        ):
            odd.append(si)
    put(base)
    return per_seg, free_pos, pend_pos, smalls, odd


def _walk_careful(segs: Any) -> _Walked:
    """Any generation, optional keys defaulted; torch 2.0 requested sizes come from `history`
    as in `_memory_viz._block_extra_legacy`. Raises a SnapshotError saying where."""
    per_seg = array("q")
    free_pos = array("q")
    pend_pos = array("q")
    smalls: list[int] = []
    odd: list[int] = []
    base = 0
    if not isinstance(segs, list):
        raise _snapshot_error("'segments' is not a list")
    si = -1
    try:
        for si, seg in enumerate(segs):
            if not isinstance(seg, Mapping):
                raise _snapshot_error(f"segment {si}: not a segment dict ({type(seg).__name__})")
            for key in ("blocks", "address", "total_size"):
                if key not in seg:
                    raise _snapshot_error(f"segment {si}: no {key!r}")
            blocks = seg["blocks"]
            if not isinstance(blocks, list):
                raise _snapshot_error(f"segment {si}: 'blocks' is not a list")
            r = off = 0
            for bi, b in enumerate(blocks):
                if not isinstance(b, Mapping):
                    raise _snapshot_error(f"segment {si}, block {bi}: not a block dict")
                size = b.get("size")
                st = b.get("state")
                if not isinstance(size, int) or isinstance(size, bool):
                    raise _snapshot_error(f"segment {si}, block {bi}: no integer 'size'")
                if st == _ALLOCATED:
                    r += _requested(b, size, si, bi)
                elif st == _INACTIVE:
                    free_pos.extend((base + off, size))
                elif st == _PENDING:
                    pend_pos.extend((base + off, size))
                else:
                    raise _snapshot_error(f"segment {si}, block {bi}: unknown block state {st!r}")
                off += size
            for key in ("address", "total_size"):
                if not isinstance(seg[key], int):
                    raise _snapshot_error(f"segment {si}: {key!r} is not an integer")
            per_seg.extend((r, seg["address"], seg["total_size"], len(blocks), base))
            base += off
            seg_type = seg.get("segment_type")
            if (
                (seg_type == _SMALL)
                if seg_type is not None
                else seg["total_size"] == K_SMALL_BUFFER
            ):
                smalls.append(si)
            pid = seg.get("segment_pool_id")
            if (
                seg.get("device")
                or seg.get("stream")
                or seg.get("is_expandable")
                or (pid and tuple(pid) != _DEFAULT_POOL)
            ):
                odd.append(si)
    except OverflowError:
        raise _snapshot_error(f"segment {si}: a size or address does not fit in 64 bits") from None
    per_seg.append(base)
    return per_seg, free_pos, pend_pos, smalls, odd


def _requested(b: Mapping[str, Any], size: int, si: int, bi: int) -> int:
    """`_memory_viz._block_extra`: requested_size, or the first history entry without frames."""
    if "frames" not in b:
        hist = b.get("history")
        if hist:
            try:
                return int(hist[0]["real_size"])
            except (KeyError, TypeError, IndexError, ValueError):
                raise _snapshot_error(f"segment {si}, block {bi}: malformed 'history'") from None
        return b.get("requested_size", size)
    req = b.get("requested_size")
    if not isinstance(req, int):
        raise _snapshot_error(f"segment {si}, block {bi}: no integer 'requested_size'")
    return req


def _located(flat: array, seg_start: np.ndarray) -> dict[str, np.ndarray]:
    """(position, size) pairs -> segment row, offset in the segment, size."""
    pairs = np.frombuffer(flat, np.int64).reshape(-1, 2)
    pos = pairs[:, 0]
    seg = np.searchsorted(seg_start, pos, side="right") - 1
    return {"segment": seg, "offset": pos - seg_start[seg], "size": pairs[:, 1]}


_SMALL = "small"


class _BadState(Exception):
    pass


def _snapshot_error(message: str) -> Exception:
    from .snapshot import SnapshotError  # only on the error path

    return SnapshotError(message)


def _error(segs: Any, what: str) -> Exception:
    """A located SnapshotError: the careful walk finds where; else say what went wrong."""
    try:
        _walk_careful(segs)
    except ValueError as e:  # SnapshotError is a ValueError
        return e
    return _snapshot_error(f"segments: {what}")


def _settings(settings: Any) -> tuple[AllocatorConfig, bool]:
    """The recorded allocator settings; a malformed settings string falls back to the dict.

    Parsed configs are remembered by the settings' repr (a sampler analyses the same settings
    twice a second, and parsing costs more than analysing a small snapshot).
    """
    if not isinstance(settings, Mapping):
        return _DEFAULT_CONFIG, False
    key = repr(settings)
    config = _CONFIGS.get(key)
    if config is None:
        try:
            config = AllocatorConfig.from_settings(settings)
        except ConfigError:
            rest = {k: v for k, v in settings.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
            config = AllocatorConfig.from_settings(rest)
        if len(_CONFIGS) >= 64:
            _CONFIGS.clear()
        _CONFIGS[key] = config
    return config, config.expandable_segments


_DEFAULT_CONFIG = AllocatorConfig()
_CONFIGS: dict[str, AllocatorConfig] = {}


# --------------------------------------------------------------------------------------------
# The Snapshot path: the same columns, taken from the Snapshot's numpy columns


def _from_snapshot(snap: Any) -> FragmentationReport:
    sg = snap.segments
    bl = snap.blocks
    n = len(sg.total_size)
    state = np.asarray(bl.state)
    size = np.asarray(bl.size, dtype=np.int64)
    start = np.asarray(sg.block_start, dtype=np.int64)
    count = np.asarray(sg.block_count, dtype=np.int64)
    seg_of = np.repeat(np.arange(n, dtype=np.int64), count)
    is_alloc = state == 1
    alloc = _seg_sum(np.where(is_alloc, size, 0), start, count)
    req = np.asarray(bl.requested_size, dtype=np.int64)
    req = _seg_sum(np.where(is_alloc, req, 0), start, count)
    offsets = np.zeros(len(size), dtype=np.int64)
    if len(size):
        excl = np.cumsum(size) - size  # exclusive prefix sum over all blocks
        offsets = excl - excl[start[seg_of]]
    fsel = np.flatnonzero(state == 0)
    psel = np.flatnonzero(state == 2)
    cols = _Columns(
        device=np.asarray(sg.device, dtype=np.int64),
        address=np.asarray(sg.address, dtype=np.int64),
        total_size=np.asarray(sg.total_size, dtype=np.int64),
        allocated=alloc,
        requested=req,
        n_blocks=count,
        stream=np.asarray(sg.stream, dtype=np.int64),
        is_small=np.asarray(sg.is_small, dtype=bool),
        is_expandable=np.asarray(sg.is_expandable, dtype=bool),
        pool_id=np.asarray(sg.pool_id, dtype=np.int64).reshape(n, 2),
        free_segment=seg_of[fsel],
        free_offset=offsets[fsel],
        free_size=size[fsel],
        pend_segment=seg_of[psel],
        pend_offset=offsets[psel],
        pend_size=size[psel],
    )
    return _reduce(cols, snap.allocator_settings, tuple(snap.devices))


def _seg_sum(values: np.ndarray, start: np.ndarray, count: np.ndarray) -> np.ndarray:
    cs = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=cs[1:])
    return cs[start + count] - cs[start]


# --------------------------------------------------------------------------------------------
# Shared: columns -> report


def _starts(seg: np.ndarray) -> np.ndarray:
    """Where each segment's run of blocks begins in `seg` (ascending: blocks come in file order)."""
    if not len(seg):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1])))


def _group(
    seg: np.ndarray, starts: np.ndarray, values: np.ndarray, n: int, ufunc: np.ufunc
) -> np.ndarray:
    """Reduce `values` per segment (zero where a segment has none)."""
    out = np.zeros(n, dtype=values.dtype)
    if len(starts):
        out[seg[starts]] = ufunc.reduceat(values, starts)
    return out


def _free_sq(seg: np.ndarray, starts: np.ndarray, size: np.ndarray, n: int) -> np.ndarray:
    """Per-segment sum of squared free block sizes, as float64.

    Squares of real block sizes overflow int64 (an 80 GiB block squared is 2^72), so the sum is
    taken exactly in units of 512 bytes (every real size is a multiple) and scaled by 2^18,
    exactly; odd sizes fall back to Python integers. Either way the result is the exact sum
    rounded once, so both paths give the same bits.
    """
    if not len(size):
        return np.zeros(n, dtype=np.float64)
    units = size >> 9
    if not np.any(size & 511) and int(size.max()) < (1 << 40):
        exact = _group(seg, starts, units * units, n, np.add)
        if int(exact.max()) < (1 << 62):
            return exact.astype(np.float64) * float(1 << 18)
    out = [0] * n
    for s, sz in zip(seg.tolist(), size.tolist(), strict=True):
        out[s] += sz * sz
    return np.array([float(v) for v in out], dtype=np.float64)


def _reduce(cols: _Columns, settings: Any, devices: tuple[int, ...]) -> FragmentationReport:
    config, expandable_mode = _settings(settings)
    n = len(cols.total_size)
    if not expandable_mode and not isinstance(settings, Mapping):
        expandable_mode = bool(cols.is_expandable.any())
    fseg, fsize = cols.free_segment, cols.free_size
    fstarts = _starts(fseg)
    free = _group(fseg, fstarts, fsize, n, np.add)
    pend = _group(cols.pend_segment, _starts(cols.pend_segment), cols.pend_size, n, np.add)
    # Whole segments come back when nothing in them is allocated (empty_cache syncs first).
    releasable = np.where(cols.allocated == 0, cols.total_size, 0)
    for row in np.flatnonzero(cols.is_expandable).tolist():
        page = page_size(bool(cols.is_small[row]), config.large_segment_size)
        releasable[row] = _expandable_releasable(cols, row, page)
    c = SegmentFigures(
        device=cols.device,
        address=cols.address,
        total_size=cols.total_size,
        allocated=cols.allocated,
        pending_free=pend,
        requested=cols.requested,
        free=free,
        largest_free=_group(fseg, fstarts, fsize, n, np.maximum),
        free_sq=_free_sq(fseg, fstarts, fsize, n),
        releasable=releasable,
        n_blocks=cols.n_blocks,
        stream=cols.stream,
        is_small=cols.is_small,
        is_expandable=cols.is_expandable,
        pool_id=cols.pool_id,
    )
    present = [int(c.device[0])] if n and (c.device == c.device[0]).all() else c.device.tolist()
    dev_ids = sorted({*devices, *present})
    stuck = c.stuck_free
    default_pool = ~c.pool_id.any(axis=1)
    conserved = c.allocated + c.pending_free + c.free == c.total_size
    rel_default = np.where(default_pool, releasable, 0)
    # every integer figure is a column sum: one reduction per device for all of them
    sums = np.stack(
        [
            c.total_size,
            c.allocated,
            c.pending_free,
            c.free,
            c.requested,
            c.n_blocks,
            np.where((c.allocated > 0) & ~c.is_expandable, c.free, 0),
            rel_default,
            releasable - rel_default,
            np.where(c.is_expandable & default_pool, stuck, 0),
        ]
    )
    by_device: dict[int, MemoryFigures] = {}
    if len(dev_ids) == 1:
        kw = _figures(c, cols, None, sums, conserved, stuck)
        by_device[dev_ids[0]] = MemoryFigures(device=dev_ids[0], **kw)
        total = MemoryFigures(device=None, **kw)
    else:
        for d in dev_ids:
            rows = np.flatnonzero(c.device == d)
            by_device[d] = MemoryFigures(
                device=d, **_figures(c, cols, rows, sums, conserved, stuck)
            )
        total = _total(list(by_device.values()), c)
    return FragmentationReport(
        total=total,
        devices=by_device,
        per_segment=c,
        allocator_settings=settings if isinstance(settings, Mapping) else None,
        config=config,
        expandable_mode=expandable_mode,
        _free_segment=cols.free_segment,
        _free_offset=cols.free_offset,
        _free_size=cols.free_size,
        _pend_segment=cols.pend_segment,
        _pend_offset=cols.pend_offset,
        _pend_size=cols.pend_size,
    )


def _expandable_releasable(cols: _Columns, row: int, page: int) -> int:
    """Whole pages inside the free runs of one mapped run, once pending frees complete (2.13).

    Pages are counted from the run's start, which is a page boundary of its reservation.
    """
    runs = sorted(
        [
            *_blocks_of(cols.free_segment, cols.free_offset, cols.free_size, row),
            *_blocks_of(cols.pend_segment, cols.pend_offset, cols.pend_size, row),
        ]
    )
    out = 0
    i = 0
    while i < len(runs):
        begin, end = runs[i][0], runs[i][0] + runs[i][1]
        i += 1
        while i < len(runs) and runs[i][0] == end:  # a pending block next to a free one
            end += runs[i][1]
            i += 1
        out += max(end // page * page - -(-begin // page) * page, 0)
    return out


def _blocks_of(
    seg: np.ndarray, offset: np.ndarray, size: np.ndarray, row: int
) -> list[tuple[int, int]]:
    """(offset, size) of one segment's blocks; `seg` is ascending, so two binary searches."""
    lo, hi = np.searchsorted(seg, [row, row + 1])
    return list(zip(offset[lo:hi].tolist(), size[lo:hi].tolist(), strict=True))


def _figures(
    c: SegmentFigures,
    cols: _Columns,
    rows: np.ndarray | None,
    sums: np.ndarray,
    conserved: np.ndarray,
    stuck: np.ndarray,
) -> dict[str, Any]:
    """The figures of the segments in `rows` (None: all), as MemoryFigures keyword arguments."""
    if rows is None:
        col = sums.sum(axis=1).tolist()
        lfree = c.largest_free
        sumsq = float(c.free_sq.sum())
        n_free_blocks = len(cols.free_segment)
        n_pending = len(cols.pend_segment)
    else:
        col = sums[:, rows].sum(axis=1).tolist()
        lfree = c.largest_free[rows]
        sumsq = float(c.free_sq[rows].sum())
        in_dev = np.zeros(len(c), dtype=bool)
        in_dev[rows] = True
        n_free_blocks = int(in_dev[cols.free_segment].sum())
        n_pending = int(in_dev[cols.pend_segment].sum())
    reserved, allocated, pending, free, requested, n_blocks, trapped, rel, rel_private, sliver = col
    largest = int(lfree.max()) if len(lfree) else 0
    return {
        "reserved": reserved,
        "allocated": allocated,
        "active": allocated + pending,
        "requested": requested,
        "pending_free": pending,
        "internal_waste": allocated - requested,
        "free": free,
        "free_trapped": trapped,
        "free_stuck": max(free + pending - rel, 0),
        "free_stuck_expandable": sliver,
        "releasable": rel,
        "releasable_private": rel_private,
        "largest_free": largest,
        "external_fragmentation": _ext(largest, free),
        "fragmentation_sq": _frag_sq(sumsq, free),
        "segments": len(lfree),
        "blocks": n_blocks,
        "blocks_allocated": n_blocks - n_free_blocks - n_pending,
        "blocks_pending_free": n_pending,
        "blocks_free": n_free_blocks,
        "largest_free_by_pool": _largest_by_pool(c, rows),
        "worst_segments": _worst(c, rows, stuck),
        "violations": _violations(c, rows, conserved),
    }


def _total(figs: list[MemoryFigures], c: SegmentFigures) -> MemoryFigures:
    free = sum(f.free for f in figs)
    largest = max((f.largest_free for f in figs), default=0)
    sumsq = float(c.free_sq.sum())
    by_pool: dict[PoolKey, int] = {}
    worst: list[SegmentSummary] = []
    violations: list[ConservationViolation] = []
    for f in figs:
        by_pool.update(f.largest_free_by_pool)
        worst.extend(f.worst_segments)
        violations.extend(f.violations)
    worst.sort(key=lambda s: (-s.stuck_free, s.index))

    def add(name: str) -> int:
        return sum(getattr(f, name) for f in figs)

    return MemoryFigures(
        device=None,
        reserved=add("reserved"),
        allocated=add("allocated"),
        active=add("active"),
        requested=add("requested"),
        pending_free=add("pending_free"),
        internal_waste=add("internal_waste"),
        free=free,
        free_trapped=add("free_trapped"),
        free_stuck=add("free_stuck"),
        free_stuck_expandable=add("free_stuck_expandable"),
        releasable=add("releasable"),
        releasable_private=add("releasable_private"),
        largest_free=largest,
        external_fragmentation=_ext(largest, free),
        fragmentation_sq=_frag_sq(sumsq, free),
        segments=add("segments"),
        blocks=add("blocks"),
        blocks_allocated=add("blocks_allocated"),
        blocks_pending_free=add("blocks_pending_free"),
        blocks_free=add("blocks_free"),
        largest_free_by_pool=by_pool,
        worst_segments=tuple(worst[:N_WORST]),
        violations=tuple(violations),
    )


def _ext(largest: int, free: int) -> float:
    return 0.0 if free <= 0 else 1.0 - largest / free


def _frag_sq(sumsq: float, free: int) -> float:
    return 0.0 if free <= 0 else 1.0 - sumsq / (float(free) * float(free))


def _pool_name(small: bool) -> str:
    return "small" if small else "large"


def _largest_by_pool(c: SegmentFigures, rows: np.ndarray | None) -> dict[PoolKey, int]:
    idx = np.flatnonzero(c.free > 0) if rows is None else rows[c.free[rows] > 0]
    if not len(idx):
        return {}
    keys = (c.device[idx], c.stream[idx], c.pool_id[idx, 0], c.pool_id[idx, 1])
    small = c.is_small[idx]
    lfree = c.largest_free[idx]
    out: dict[PoolKey, int] = {}
    uniform = not (keys[1].any() or keys[2].any() or keys[3].any())  # stream 0, default pool
    if uniform and (rows is not None or not (keys[0] != keys[0][0]).any()):
        d, s, pa, pb = (int(k[0]) for k in keys)
        for flag in (False, True):
            sel = lfree[small == flag]
            if len(sel):
                out[PoolKey(d, s, _pool_name(flag), (pa, pb))] = int(sel.max())
        return out
    best: dict[tuple, int] = {}  # plain tuples first: one PoolKey per pool, not per segment
    rows_keys = zip(*(k.tolist() for k in keys), small.tolist(), strict=True)
    for key, v in zip(rows_keys, lfree.tolist(), strict=True):
        if v > best.get(key, -1):
            best[key] = v
    for (d, s, pa, pb, flag), v in best.items():
        out[PoolKey(d, s, _pool_name(flag), (pa, pb))] = v
    return out


def _worst(
    c: SegmentFigures, rows: np.ndarray | None, stuck_all: np.ndarray
) -> tuple[SegmentSummary, ...]:
    idx = np.arange(len(c)) if rows is None else rows
    stuck = stuck_all[idx]
    nz = np.flatnonzero(stuck > 0)
    if not len(nz):
        return ()
    if len(nz) > N_WORST:
        part = np.argpartition(-stuck[nz], N_WORST - 1)[:N_WORST]
        nz = nz[part]
    chosen = sorted(idx[nz].tolist(), key=lambda i: (-int(stuck_all[i]), i))
    return tuple(_summary(c, i, int(stuck_all[i])) for i in chosen)


def _summary(c: SegmentFigures, i: int, stuck: int) -> SegmentSummary:
    free = int(c.free[i])
    rel = int(c.releasable[i])
    return SegmentSummary(
        index=i,
        device=int(c.device[i]),
        address=int(c.address[i]),
        total_size=int(c.total_size[i]),
        allocated=int(c.allocated[i]),
        pending_free=int(c.pending_free[i]),
        free=free,
        largest_free=int(c.largest_free[i]),
        releasable=rel,
        stuck_free=stuck,
        stream=int(c.stream[i]),
        pool=_pool_name(bool(c.is_small[i])),
        is_expandable=bool(c.is_expandable[i]),
        n_blocks=int(c.n_blocks[i]),
    )


def _violations(
    c: SegmentFigures, rows: np.ndarray | None, conserved: np.ndarray
) -> tuple[ConservationViolation, ...]:
    idx = np.arange(len(c)) if rows is None else rows
    bad = idx[~conserved[idx]]
    return tuple(
        ConservationViolation(
            index=int(i),
            device=int(c.device[i]),
            address=int(c.address[i]),
            total_size=int(c.total_size[i]),
            blocks_sum=int(c.allocated[i] + c.pending_free[i] + c.free[i]),
        )
        for i in bad.tolist()
    )


# --------------------------------------------------------------------------------------------
# can_fit


def _can_fit(
    r: FragmentationReport,
    nbytes: int | str,
    stream: int,
    device: int,
    device_free: int | str | None,
) -> FitAnswer:
    req = parse_size(nbytes)
    room = None if device_free is None else parse_size(device_free)
    r.device(device)  # ValueError naming the devices present
    cfg = r.config
    rounded = round_size(req, cfg.divisions)
    small = is_small(rounded)
    pool = _pool_name(small)
    c = r.per_segment
    where = f"stream {stream}'s {pool} pool" if stream else f"the {pool} pool"
    base: dict[str, Any] = {
        "nbytes": req,
        "rounded": rounded,
        "device": device,
        "stream": stream,
        "pool": pool,
    }
    asked = format_size(req) + ("" if rounded == req else f" (rounded to {format_size(rounded)})")

    # (a) best fit among cached inactive blocks of this device, stream and pool (section 2.7)
    seg = r._free_segment
    ok = (
        (c.device[seg] == device)
        & (c.stream[seg] == stream)
        & (c.is_small[seg] == small)
        & (c.pool_id[seg, 0] == 0)
        & (c.pool_id[seg, 1] == 0)
        & (r._free_size >= rounded)
    )
    exp_blk = c.is_expandable[seg]
    if not r.expandable_mode:
        ok &= ~exp_blk  # expandable blocks are skipped once the mode is off
    cand = np.flatnonzero(ok)
    rejected = ""
    if len(cand):
        addr = c.address[seg[cand]] + r._free_offset[cand]
        order = np.lexsort((addr, r._free_size[cand]))
        cand, addr = cand[order], addr[order]
        pick = 0
        if r.expandable_mode and exp_blk[cand[0]]:
            pick = _expandable_walk(r, cand)
        i = int(cand[pick])
        bsize = int(r._free_size[i])
        baddr = int(addr[pick])
        if not oversize_rejects(
            bsize, rounded, cfg.max_split_size, cfg.max_non_split_rounding_size
        ):
            return FitAnswer(
                verdict="cached",
                fits=True,
                block_address=baddr,
                block_size=bsize,
                new_bytes=0,
                releasable=r.devices[device].releasable,
                device_free=room,
                explanation=(
                    f"{asked} fits in the cached free block at 0x{baddr:x} "
                    f"({format_size(bsize)}) of {where} on device {device}: "
                    "no new memory is needed."
                ),
                **base,
            )
        rejected = (
            f" (its best-fit block at 0x{baddr:x}, {format_size(bsize)}, is refused by the "
            f"max_split_size rules)"
        )

    # (b) new memory: a cudaMalloc'd segment, or pages mapped beyond a free expandable tail
    if r.expandable_mode:
        need, how = _pages_to_map(r, rounded, stream, device, small)
    else:
        need = allocation_size(rounded, cfg.large_segment_size)
        how = f"a new {format_size(need)} segment"
    releasable = r.devices[device].releasable
    head = f"No cached block of {where} on device {device} fits {asked}{rejected}; it needs {how}"
    if room is None:
        return FitAnswer(
            verdict="room_unknown",
            fits=None,
            block_address=None,
            block_size=None,
            new_bytes=need,
            releasable=releasable,
            device_free=None,
            explanation=(
                f"{head}, and the device's free memory is unknown (pass device_free; the "
                f"allocator's own flush could add {format_size(releasable)})."
            ),
            **base,
        )
    reserved = r.devices[device].reserved
    alloc = allocation_size(rounded, cfg.large_segment_size)
    fraction = cfg.per_process_memory_fraction
    # per_process_memory_fraction caps reserved at fraction x device total (free + reserved);
    # alloc_block checks the cap against the segment size, in expandable mode too
    cap = int(fraction * (room + reserved)) if fraction < 1.0 else None

    def fits_with(freed: int, pages: int) -> bool:
        """Does an attempt succeed once `freed` bytes went back and it maps `pages`?"""
        return pages <= room + freed and (cap is None or reserved - freed + alloc <= cap)

    capped = (
        "" if cap is None else f" (per_process_memory_fraction caps reserved at {format_size(cap)})"
    )
    gc_low, gc_high = _garbage_collected(r, device, cap, cfg.garbage_collection_threshold)
    if fits_with(0, need):
        verdict, fits = "new_segment", True
        gc_first = (
            " (the allocator's garbage collection frees some unused segments first)"
            if gc_high
            else ""
        )
        tail = f", which the device has ({format_size(room)} free){capped}{gc_first}."
    elif gc_high and fits_with(gc_low, need):
        verdict, fits = "garbage_collect", True
        tail = (
            f"{capped}: it succeeds without a retry once the allocator's garbage collection "
            f"(reserved above garbage_collection_threshold) frees at least {format_size(gc_low)} "
            "of its oldest unused segments."
        )
    else:
        # the flush also unmaps the whole free pages of the tail it would grow, so in
        # expandable mode the retry needs the pages of the flushed layout
        after = (
            _pages_to_map(r, rounded, stream, device, small, flushed=True)[0]
            if r.expandable_mode
            else need
        )
        then = "" if after == need else f" ({format_size(after)} of pages after the flush)"
        if fits_with(releasable, after):
            verdict, fits = "flush_and_retry", True
            maybe = (
                " (the garbage collection before it may already free enough, depending on the "
                "segments' ages)"
                if gc_high and fits_with(gc_high, need)
                else ""
            )
            tail = (
                f": only {format_size(room)} is free on the device{capped}, so it succeeds only "
                f"through the allocator's own sync, flush of {format_size(releasable)} of cached "
                f"segments{then} and retry (num_alloc_retries){maybe}."
            )
        else:
            verdict, fits = "out_of_memory", False
            tail = (
                f": the device has {format_size(room)} free{capped} and the allocator's flush "
                f"adds only {format_size(releasable)}{then}, so it is out of memory (a manual "
                "empty_cache would not help: the allocator flushes before it raises)."
            )
    return FitAnswer(
        verdict=verdict,
        fits=fits,
        block_address=None,
        block_size=None,
        new_bytes=need,
        releasable=releasable,
        device_free=room,
        explanation=head + tail,
        **base,
    )


def _garbage_collected(
    r: FragmentationReport, device: int, cap: int | None, threshold: float
) -> tuple[int, int]:
    """What `garbage_collect_cached_blocks` frees before a new segment (section 2.11): at least
    and at most, in bytes. It runs only with a fraction cap and a threshold, while reserved is
    above threshold x cap, and frees whole unused large non-expandable segments oldest first
    (by an age the snapshot does not record) until reserved is back under the threshold."""
    if cap is None or threshold <= 0.0:
        return 0, 0
    reserved = r.devices[device].reserved
    limit = int(threshold * cap)
    if reserved <= limit:
        return 0, 0
    c = r.per_segment
    whole = (
        (c.device == device)
        & ~c.is_small
        & ~c.is_expandable
        & ~c.pool_id.any(axis=1)
        & (c.free == c.total_size)
    )
    freeable = int(c.total_size[whole].sum())
    return min(freeable, reserved - limit), freeable


def _expandable_walk(r: FragmentationReport, cand: np.ndarray) -> int:
    """Section 2.7 step 3: prefer blocks that cannot grow over a growable (tail) block.

    A block's "expandable size" is its size plus the unmapped range after it: for the last free
    block of a mapped run, the gap to the next run of the same stream and pool, or (after the
    last run) the rest of the reservation, which the snapshot does not record and which counts
    as unbounded. The walk moves on while the next candidate's expandable size is smaller.
    """
    c = r.per_segment

    def grows(k: int) -> float:
        i = int(cand[k])
        row = int(r._free_segment[i])
        size = int(r._free_size[i])
        if int(r._free_offset[i]) + size != int(c.total_size[row]):
            return float(size)
        nxt = _next_run(c, row)
        end = int(c.address[row] + c.total_size[row])
        return float("inf") if nxt is None else float(size + int(c.address[nxt]) - end)

    pick = 0
    here = grows(0)
    while pick + 1 < len(cand) and c.is_expandable[r._free_segment[cand[pick + 1]]]:
        there = grows(pick + 1)
        if not there < here:
            break
        pick += 1
        here = there
    return pick


def _next_run(c: SegmentFigures, row: int) -> int | None:
    """The next mapped run above `row` of the same device, stream and pool, if any."""
    same = np.flatnonzero(
        c.is_expandable
        & (c.device == c.device[row])
        & (c.stream == c.stream[row])
        & (c.is_small == c.is_small[row])
        & (c.pool_id[:, 0] == c.pool_id[row, 0])
        & (c.pool_id[:, 1] == c.pool_id[row, 1])
        & (c.address > c.address[row])
    )
    return None if not len(same) else int(same[np.argmin(c.address[same])])


def _pages_to_map(
    r: FragmentationReport,
    rounded: int,
    stream: int,
    device: int,
    small: bool,
    flushed: bool = False,
) -> tuple[int, str]:
    """Bytes an expandable allocation maps, as `find_expandable_block` and `map_block` do.

    The unmapped ranges of the stream's pool are tried in address order: the gaps between its
    mapped runs (one reservation, starting at the lowest run, is assumed: the snapshot does not
    record reservations), then the space after the last run. A range is taken when, counted
    from the free block just before it and through every free block and unmapped range after
    it, there are `rounded` bytes in a row; then only the missing part is mapped, in whole pages
    (section 9.2). `flushed`: the layout after the allocator's own flush, which completes the
    pending frees and unmaps every whole free page first, so the tail it grows shrinks.
    """
    c = r.per_segment
    page = page_size(small, r.config.large_segment_size)
    rows = np.flatnonzero(
        (c.device == device)
        & (c.stream == stream)
        & (c.is_small == small)
        & c.is_expandable
        & (c.pool_id[:, 0] == 0)
        & (c.pool_id[:, 1] == 0)
    )
    rows = rows[np.argsort(c.address[rows], kind="stable")].tolist()
    runs: list[tuple[int, int, int, int]] = []  # (address, total, free head, free tail)
    for row in rows:
        runs.extend(_flushed_pieces(r, row, page) if flushed else [_run_shape(r, row)])
    base = int(c.address[rows[0]]) if rows else 0
    found = _first_fit(runs, base, rounded, page)
    if found is not None:
        mapped, tail, gap_at = found
        where = (
            f"after the {format_size(tail)} free tail at 0x{gap_at - tail:x}"
            if tail
            else f"at 0x{gap_at:x} of its reservation"
        )
        return mapped, f"{mapped // page} more {format_size(page)} page(s) mapped {where}"
    need = -(-rounded // page) * page
    return need, f"{need // page} {format_size(page)} page(s) of a new expandable segment"


def _first_fit(
    runs: list[tuple[int, int, int, int]], base: int, rounded: int, page: int
) -> tuple[int, int, int] | None:
    """`find_expandable_block` over mapped runs (address, total, free head, free tail) of one
    reservation from `base`: (bytes mapped, free tail used, address of the unmapped range), or
    None when no unmapped range of the reservation serves (a new reservation then)."""
    if not runs:
        return None
    # the reservation in address order: ("gap", size) and ("run", total, head, tail)
    items: list[tuple[str, float, int, int]] = []
    at = base
    for addr, total, head, tail in runs:
        if addr > at:
            items.append(("gap", float(addr - at), 0, 0))
        items.append(("run", float(total), head, tail))
        at = addr + total
    items.append(("gap", float("inf"), 0, 0))
    ends = []  # address of each item's end
    at = base
    for _kind, size, _, _ in items:
        at = at + int(size) if size != float("inf") else at
        ends.append(at)
    for g, (kind, _, _, _) in enumerate(items):
        if kind != "gap":
            continue
        tail = items[g - 1][3] if g and items[g - 1][0] == "run" else 0
        have, mapped = tail, 0
        for kind2, size, head, _ in items[g:]:
            if have >= rounded:
                break
            if kind2 == "gap":
                take = min(size, rounded - have)
                pages = -(-int(take) // page) * page
                mapped += pages
                have += pages
            else:
                have += head
                if head != size:
                    break
        if have >= rounded:
            return mapped, tail, ends[g - 1] if g else base
    return None


def _flushed_pieces(r: FragmentationReport, row: int, page: int) -> list[tuple[int, int, int, int]]:
    """A mapped run after the flush: its free and pending-free ranges lose their whole pages,
    which splits it into mapped pieces (address, total, free head, free tail)."""
    start = int(r.per_segment.address[row])
    total = int(r.per_segment.total_size[row])
    blocks = sorted(
        [
            *_blocks_of(r._free_segment, r._free_offset, r._free_size, row),
            *_blocks_of(r._pend_segment, r._pend_offset, r._pend_size, row),
        ]
    )
    ranges: list[list[int]] = []  # merged free ranges, offsets in the run
    for off, size in blocks:
        if ranges and ranges[-1][1] == off:
            ranges[-1][1] = off + size
        else:
            ranges.append([off, off + size])
    pieces: list[tuple[int, int, int, int]] = []
    lo = head = 0  # the current piece's start and free head (offsets in the run)
    for b, e in ranges:
        ub, ue = -(-b // page) * page, e // page * page
        if ub >= ue:  # no whole page inside: the range stays mapped
            if b == lo:
                head = e - b
            continue
        if ub > lo:  # a piece ends here, with the sliver [b, ub) as its free tail
            pieces.append((start + lo, ub - lo, head, ub - b))
        lo, head = ue, e - ue
    if lo < total:
        last_b, last_e = ranges[-1] if ranges else (0, 0)
        pieces.append((start + lo, total - lo, head, total - last_b if last_e == total else 0))
    return pieces


def _run_shape(r: FragmentationReport, row: int) -> tuple[int, int, int, int]:
    """A mapped run's address, total size, free head and free tail."""
    sel = np.flatnonzero(r._free_segment == row)
    total = int(r.per_segment.total_size[row])
    offs = r._free_offset[sel]
    sizes = r._free_size[sel]
    lead = int(sizes[offs == 0].sum())
    tail = int(sizes[offs + sizes == total].sum())
    return int(r.per_segment.address[row]), total, lead, tail


make_module_callable(__name__, fragmentation)
