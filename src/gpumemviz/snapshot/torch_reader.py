"""Reading torch dicts: the one walk over a snapshot's segments and blocks, into numpy columns.

`read_torch` serves both `Snapshot.from_torch` (every column) and `fragmentation(dict)` (only
the columns the analysis reads), so both read a value the same way and name a bad one with the
same message. A fast reader takes the common case; a careful one reads any generation of torch
dict and names the first problem. The two stay side by side in one module (about 500 lines)
so that they read every value the same way; benchmarks/analyze.py measures them.
"""

from __future__ import annotations

import itertools
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

import numpy as np

from gpumemviz.snapshot.columns import as_int64, int_column
from gpumemviz.snapshot.escaping import short_repr, type_phrase
from gpumemviz.snapshot.gc_pause import no_gc
from gpumemviz.snapshot.schema import (
    BLOCK_KEYS,
    SEG_INT_KEYS,
    SEG_KEYS,
    STATE_NAMES,
    TOP_KEYS,
    SnapshotError,
    TorchDict,
    TorchList,
    TorchMapping,
)
from gpumemviz.snapshot.shapes import RowShape

_STATE_CODE = {name: code for code, name in enumerate(STATE_NAMES)}
_SMALL_SEGMENT = 2 << 20  # a small-pool segment is exactly 2 MiB (kSmallBuffer)


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
    allocator_settings: TorchDict | None
    external_annotations: TorchList | None  # torch's items, unread here
    device_traces: TorchList | None  # as given: `Snapshot.from_torch` reads the entries
    top_keys: tuple[str, ...]
    top_extra: TorchMapping
    seg_sums: Mapping[str, np.ndarray | None] = field(default_factory=dict)
    blk_address: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None
    seg_frames: TorchList | None = None  # each row's frames as given
    blk_frames: TorchList | None = None
    seg_shape: RowShape = field(default=RowShape.uniform(SEG_KEYS))
    blk_shape: RowShape = field(default=RowShape.uniform(BLOCK_KEYS))

    def traced_devices(self) -> tuple[int, ...]:
        """Devices whose trace holds an entry (with the segments' devices: `Snapshot.devices`)."""
        traces = self.device_traces or []
        return tuple(d for d, t in enumerate(traces) if t)


def read_torch(obj: object, *, full: bool = True) -> TorchColumns:
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


def _read_top(obj: object) -> dict[str, Any]:  # Any: TorchColumns' fields
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
        "top_extra": {k: v for k, v in obj.items() if k not in TOP_KEYS},
    }


def _seg_where(segs: TorchList, i: int) -> str:
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
_SEG_KEY_SET = frozenset(SEG_KEYS)
_BLOCK_KEY_SET = frozenset(BLOCK_KEYS)
_SEG_INTS = frozenset(SEG_INT_KEYS)
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


def _getter(keys: tuple[Any, ...]) -> Callable[[str], itemgetter[Any]]:
    """`itemgetter` of a row's key, by the first row's own key object: a decoded file's rows
    share their key strings (pickle and json memoize them), so each lookup matches by identity,
    not by comparing the strings (each pass over the rows: ~13% less)."""
    own: dict[Any, Any] = {k: k for k in keys}
    return lambda key: itemgetter(own.get(key, key))


def _ints(values: TorchList) -> np.ndarray:
    """`values` as int64 if each is an int (or bool: what `array("q")` takes), else TypeError
    or OverflowError. The int sum says they are in one C pass (a float makes it a float);
    `np.fromiter` then converts them about twice as fast as `array("q")`."""
    if type(sum(values)) is not int:
        raise TypeError("not all ints")
    return np.fromiter(values, np.int64, len(values))


def _ints_or_zeros(values: TorchList) -> np.ndarray:
    if not any(values) and type(sum(values)) is int:  # all 0 (or False): nothing to convert
        return _ZEROS[: len(values)]
    return _ints(values)


# Any (here and in `_read_careful`): TorchColumns' fields, of their own types
def _read_plain(segs: TorchList, full: bool) -> dict[str, Any] | None:
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
    seg_get, blk_get = _getter(seg_keys), _getter(blk_keys)
    seg_ints = [(k, seg_get(k), _ints_or_zeros if k in _RARE else _ints) for k in read_seg
                if k in _SEG_INTS]  # fmt: skip
    blk_ints = [(k, blk_get(k)) for k in read_blk if k in _BLOCK_INTS]
    parts: dict[str, TorchList] = {k: [] for k in (*has, "block_count")}  # segment columns
    bparts: dict[str, TorchList] = {k: [] for k in read_blk}  # block columns
    get_blocks, get_type, get_pool, get_exp = map(
        seg_get, ("blocks", "segment_type", "segment_pool_id", "is_expandable")
    )
    get_frames, get_state = blk_get("frames"), blk_get("state")
    seg_frames: TorchList = []
    blk_frames: TorchList = []
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
            expandable = list(map(get_exp, chunk))
            parts["is_expandable"].append(
                bytes(map(bool, expandable)) if any(expandable) else bytes(k)
            )
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
        m = len(blocks)
        if set(map(type, blocks)) != _DICT:
            return None
        if full and sum(map(len, blocks)) != n_blk_keys * m:
            return None
        for key, get in blk_ints:
            bparts[key].append(_ints(list(map(get, blocks))))
        bparts["state"].append(np.fromiter(map(state_code, map(get_state, blocks)), np.uint8, m))
        if keep_frames:
            blk_frames += map(get_frames, blocks)
        elif check_frames:  # a block without frames is a torch 2.0 one: the careful reader's
            deque(map(get_frames, blocks), 0)

    n = len(segs)

    def ints(key: str, rows: int, parts: dict[str, TorchList] = parts) -> np.ndarray:
        if key not in parts:
            return np.zeros(rows, np.int64)
        got = parts[key]  # one chunk's own array (not a view of _ZEROS) is the column itself
        return got[0] if len(got) == 1 and got[0].base is None else np.concatenate(got)

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
    state = bparts.get("state")
    blk = {
        "size": size,
        "requested_size": ints("requested_size", 0, bparts) if "requested_size" in bparts else size,
        "state": (state[0] if len(state) == 1 else np.concatenate(state))
        if state
        else np.zeros(0, np.uint8),
    }
    out: dict[str, Any] = {"seg": seg, "blk": blk}
    if full:
        out.update(
            seg_sums={k: ints(k, n) if k in has else None for k in _SEG_SUMS},
            blk_address=ints("address", 0, bparts) if "address" in bparts else None,
            seg_frames=seg_frames if "frames" in has else None,
            blk_frames=blk_frames if keep_frames else None,
            seg_shape=RowShape.uniform(seg_keys),
            blk_shape=RowShape.uniform(blk_keys or BLOCK_KEYS),
        )
    return out


def _read_careful(segs: TorchList, full: bool) -> dict[str, Any]:
    """Any generation of torch dict, optional keys absent: the same columns as `_read_plain`,
    or a SnapshotError naming the first problem and where it is."""
    if set(map(type, segs)) - _DICT:
        bad = next(i for i, s in enumerate(segs) if type(s) is not dict)
        raise SnapshotError(f"segment {bad} is {type_phrase(segs[bad])}, not a dict")
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
        seg[k] = int_column([s.get(k, default) for s in segs], k, seg_at)
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
        shape = RowShape.of(segs, SEG_KEYS)
        sums: dict[str, np.ndarray | None] = {}
        for k in _SEG_SUMS:
            has = shape.has(k, n)
            if has.all():
                sums[k] = int_column(list(map(itemgetter(k), segs)), k, seg_at)
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


def _pool_column(segs: TorchList, seg_at: Callable[[int], str]) -> np.ndarray:
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
                and as_int64(p[0]) is not None
                and as_int64(p[1]) is not None
            ):
                raise SnapshotError(
                    f"{seg_at(i)}: segment_pool_id {short_repr(p)} is not a pair of 64-bit ints"
                ) from None
        raise  # pragma: no cover  (a list that fails as a whole fails in one of its rows)


def _blocks_careful(
    blocks: TorchList, count: np.ndarray, segs: TorchList
) -> tuple[dict[str, np.ndarray], dict[int, TorchDict], Callable[[int], str]]:
    """Size, requested_size and state of blocks of any generation; also the rows whose own
    requested_size the column does not hold, and how messages name a block."""
    m = len(blocks)
    seg_of = np.repeat(np.arange(len(count)), count)
    start = np.concatenate([[0], np.cumsum(count)])

    def at(j: int) -> str:
        s = int(seg_of[j])
        return f"{_seg_where(segs, s)}: block {j - int(start[s])}"

    if set(map(type, blocks)) - _DICT:
        bad = next(j for j, b in enumerate(blocks) if type(b) is not dict)
        raise SnapshotError(f"{at(bad)} is {type_phrase(blocks[bad])}, not a dict")
    for k in ("size", "state"):
        j = next((j for j, b in enumerate(blocks) if k not in b), None)
        if j is not None:
            raise SnapshotError(f"{at(j)} has no {k}")
    size = int_column(list(map(itemgetter("size"), blocks)), "size", at)
    requested, override = _requested_column(blocks, size, at)
    states = list(map(itemgetter("state"), blocks))
    try:
        state = np.fromiter(map(_STATE_CODE.__getitem__, states), np.uint8, m)
    except (KeyError, TypeError):
        j = next(j for j, s in enumerate(states) if _state_code(s) is None)
        raise SnapshotError(f"{at(j)} has unknown state {short_repr(states[j])}") from None
    return {"size": size, "requested_size": requested, "state": state}, override, at


def _state_code(state: Any) -> int | None:  # Any: a value from the file, hashable or not
    try:
        return _STATE_CODE[state]
    except (KeyError, TypeError):
        return None


def _blocks_full(
    blocks: TorchList, at: Callable[[int], str], override: dict[int, TorchDict]
) -> dict[str, Any]:  # Any: TorchColumns' fields
    """What a Snapshot keeps of blocks beyond the analysis: addresses, frames, key layouts."""
    m = len(blocks)
    shape = RowShape.of(blocks, BLOCK_KEYS)
    if override:
        shape = replace(shape, override=override)
    addr_has = shape.has("address", m)
    address: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None
    if addr_has.all() and m:
        address = int_column(list(map(itemgetter("address"), blocks)), "address", at)
    elif addr_has.any():  # some blocks without an address: `_assemble` fills those in
        fill = [b.get("address", 0) for b in blocks]
        address = (int_column(fill, "address", at), addr_has)
    frames = [b.get("frames") for b in blocks] if shape.has("frames", m).any() else None
    return {"blk_address": address, "blk_frames": frames, "blk_shape": shape}


def _requested_column(
    blocks: TorchList, size: np.ndarray, at: Callable[[int], str]
) -> tuple[np.ndarray, dict[int, TorchDict]]:
    """What torch accounts each block for (`_memory_viz._block_extra`): requested_size; for a
    torch 2.0 block (no frames) its history[0] real_size, else its requested_size, else its size.

    Also the rows whose own requested_size the column does not hold (for `RowShape.override`).
    A malformed history is read as no history, as `Snapshot.block_frames` reads its frames.
    """
    missing = object()
    req = [b.get("requested_size", missing) for b in blocks]
    override: dict[int, TorchDict] = {}
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
    return int_column(req, "requested_size", at), override


def _real_size(history: Any) -> int | None:  # Any: whatever the file holds
    """history[0]["real_size"] of a torch 2.0 block, or None where that is not an integer."""
    if type(history) not in _PAIR_TYPES or not history or type(history[0]) is not dict:
        return None
    return as_int64(history[0].get("real_size"))


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
