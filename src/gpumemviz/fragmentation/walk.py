"""The dict path: one pass over a torch dict's blocks, in C where the extension is built.

`_cwalk` (compiled from _cwalk.c by hatch_build.py) reads plain torch >= 2.1 dicts and returns
finished per-segment columns; anything else (no extension, older or hand-made files, bad
values) goes through the Python walks here, which give the same columns and name what is wrong.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..allocator.config import AllocatorConfig
from ..allocator.rules import K_SMALL_BUFFER, page_size
from .reduce import SUM_ROWS, _Columns, _columns, _reduce, _settings
from .report import FragmentationReport

try:
    from . import _cwalk
except ImportError:  # no C compiler at install time: the Python walk gives the same report
    _cwalk = None

_ALLOCATED = "active_allocated"
_INACTIVE = "inactive"
_PENDING = "active_pending_free"


def _from_dict(segs: list, settings: Any, traced: tuple[int, ...]) -> FragmentationReport:
    parsed = _settings(settings)
    cols = _columns_c(segs, parsed[0]) if _cwalk is not None else None
    if cols is None:
        cols = _columns_python(segs, parsed[0])
    return _reduce(cols, settings, traced, parsed)


# the columns of _cwalk.c's seg_cols after the SUM_ROWS, in its COL_* order
_C_COLUMNS = (
    "address",
    "largest_free",
    "releasable",
    "stuck",
    "flags",
    "device",
    "stream",
    "pool_a",
    "pool_b",
)
_FLAG_SMALL, _FLAG_ODD, _FLAG_BROKEN, _FLAG_EXPANDABLE = 1, 2, 4, 8

#: What `_cwalk.VERSION` must say: a library compiled from an older _cwalk.c is not used.
C_WALK_VERSION = 4
if _cwalk is not None and (
    getattr(_cwalk, "VERSION", None) != C_WALK_VERSION
    or getattr(_cwalk, "SEG_COLS", None) != len(SUM_ROWS) + len(_C_COLUMNS)
    or os.environ.get("GPUMEMVIZ_NO_C")
):
    _cwalk = None  # stale (rebuild: python hatch_build.py), or switched off on purpose


def _columns_c(segs: Any, config: AllocatorConfig) -> _Columns | None:
    """The C walk's columns, or None where it leaves the file to the Python walk.

    Like the Python walk it reads plain torch >= 2.1 dicts first, and, where that fails, walks
    again the careful way (torch 2.0 `history`, absent optional keys); the first block decides.
    """
    try:
        careful = bool(segs) and _legacy(segs)
    except (KeyError, TypeError, IndexError):
        return None  # the Python walk names what is wrong
    pages = (page_size(True), page_size(False, config.large_segment_size))
    walked = _cwalk.walk(segs, *pages, careful)
    if walked is None and not careful:
        walked = _cwalk.walk(segs, *pages, True)
    if walked is None:
        return None
    seg_cols, free_sq, *blocks = walked
    n = len(segs)
    table = np.frombuffer(seg_cols, np.int64).reshape(len(SUM_ROWS) + len(_C_COLUMNS), n)
    address, largest_free, releasable, stuck, flags, device, stream, *pool = table[len(SUM_ROWS) :]
    plain = not (flags & _FLAG_ODD).any()  # all on device 0, stream 0, the default pool
    free_seg, free_off, free_size, pend_seg, pend_off, pend_size = (
        np.frombuffer(b, np.int64) for b in blocks
    )
    pool_id = np.stack(pool, axis=1)
    return _Columns(
        sums=table[: len(SUM_ROWS)],
        device=device,
        address=address,
        stream=stream,
        is_small=(flags & _FLAG_SMALL).astype(bool),
        is_expandable=(flags & _FLAG_EXPANDABLE).astype(bool),
        pool_id=pool_id,
        largest_free=largest_free,
        free_sq=np.frombuffer(free_sq, np.float64),
        releasable=releasable,
        stuck=stuck,
        bad_rows=np.flatnonzero(flags & _FLAG_BROKEN),
        one_device=plain or not (device != device[0]).any(),
        default_pools=plain or not (stream.any() or pool_id.any()),
        free_segment=free_seg,
        free_offset=free_off,
        free_size=free_size,
        pend_segment=pend_seg,
        pend_offset=pend_off,
        pend_size=pend_size,
    )


def _rare_columns(segs: list, odd: list[int]) -> dict[str, np.ndarray]:
    """device, stream, is_expandable and pool_id: defaults, read again in the `odd` rows."""
    n = len(segs)
    device = np.zeros(n, dtype=np.int64)
    stream = np.zeros(n, dtype=np.int64)
    is_exp = np.zeros(n, dtype=bool)
    pool_id = np.zeros((n, 2), dtype=np.int64)
    if odd:  # rows with a device, stream, expandable flag or pool other than the default
        try:
            rows = np.array(odd, dtype=np.int64)
            device[rows] = [segs[i].get("device") or 0 for i in odd]
            stream[rows] = [segs[i].get("stream") or 0 for i in odd]
            is_exp[rows] = [bool(segs[i].get("is_expandable")) for i in odd]
            pool_id[rows] = [tuple(segs[i].get("segment_pool_id") or (0, 0)) for i in odd]
        except (ValueError, OverflowError, TypeError) as e:
            raise _error(segs, f"a value is not a 64-bit integer ({e})") from None
    return {"device": device, "stream": stream, "is_expandable": is_exp, "pool_id": pool_id}


def _columns_python(segs: list, config: AllocatorConfig) -> _Columns:
    try:
        if not isinstance(segs, list):
            raise TypeError("'segments' is not a list")
        walked = _walk_careful(segs) if segs and _legacy(segs) else _walk_fast(segs)
    except _BadState as e:
        raise _error(segs, f"unknown block state {_short(e.args[0])}") from None
    except (KeyError, TypeError, AttributeError, OverflowError):
        # an older or hand-made file (no frames, is_expandable, segment_pool_id...): walk it
        # again the careful way, which raises a located SnapshotError on what is truly missing
        walked = _walk_careful(segs)
    per_seg, free, pend, smalls, odd = walked
    n = len(segs)
    per = np.frombuffer(per_seg, np.int64).reshape(n, _PER_SEG)
    is_small = np.zeros(n, dtype=bool)
    is_small[smalls] = True
    return _columns(
        **_rare_columns(segs, odd),
        address=per[:, 1],
        total_size=per[:, 2],
        allocated=per[:, 4],
        requested=per[:, 0],
        n_blocks=per[:, 3],
        is_small=is_small,
        **_blocks(free, "free"),
        **_blocks(pend, "pend"),
        config=config,
    )


def _blocks(flat: array, prefix: str) -> dict[str, np.ndarray]:
    """(segment row, offset in the segment, size) triples -> three `_columns` arguments."""
    triples = np.frombuffer(flat, np.int64).reshape(-1, 3)
    return {f"{prefix}_{k}": triples[:, i] for i, k in enumerate(("segment", "offset", "size"))}


def _legacy(segs: list) -> bool:
    """A torch 2.0 file: blocks carry `history`, not `frames` (the first block decides)."""
    blocks = segs[0]["blocks"]
    return bool(blocks) and "frames" not in blocks[0]


_Walked = tuple[array, array, array, list[int], list[int]]
# per segment: requested, address, total_size, n_blocks, allocated; inactive and pending-free
# blocks as (segment row, offset in the segment, size) triples
_PER_SEG = 5
_DEFAULT_POOL = (0, 0)
# what every block of a file may add up to: offsets and sums stay 64-bit integers
_MAX_FILE_BYTES = (1 << 63) - 1


def _walk_fast(segs: list) -> _Walked:
    """The Python walk for torch >= 2.1 dicts, where `_cwalk` is not built.

    It stores machine integers straight into `array`s while each value is in the CPU cache (a
    tuple per block would also wake the garbage collector, which then walks the whole freshly
    loaded snapshot), and records the rare things (another device, stream, pool, expandable
    segments) as row numbers, to read them again afterwards. Raises KeyError, TypeError or
    OverflowError on anything else, for the careful walk to name.
    """
    per_seg = array("q")
    free = array("q")
    pend = array("q")
    smalls: list[int] = []
    odd: list[int] = []
    put = per_seg.append
    put_free = free.extend
    allocated_s, inactive_s, pending_s, small_s = _ALLOCATED, _INACTIVE, _PENDING, _SMALL
    default = _DEFAULT_POOL
    total = 0
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
                put_free((si, a + f + p, size))
                f += size
            elif st == pending_s:
                pend.extend((si, a + f + p, size))
                p += size
            else:
                raise _BadState(st)
        put(r)
        put(seg["address"])
        put(seg["total_size"])
        put(len(blocks))
        put(a)
        total += a + f + p
        if seg["segment_type"] == small_s:
            smalls.append(si)
        if (
            seg["device"]
            or seg["stream"]
            or seg["is_expandable"]
            or seg["segment_pool_id"] != default
        ):
            odd.append(si)
    if total > _MAX_FILE_BYTES:
        raise OverflowError("the blocks add up past 2^63 bytes")
    return per_seg, free, pend, smalls, odd


def _walk_careful(segs: Any) -> _Walked:
    """Any generation, optional keys defaulted; torch 2.0 requested sizes come from `history`
    as in `_memory_viz._block_extra_legacy`. Raises a SnapshotError saying where."""
    per_seg = array("q")
    free = array("q")
    pend = array("q")
    smalls: list[int] = []
    odd: list[int] = []
    total = 0
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
            r = a = off = 0
            for bi, b in enumerate(blocks):
                if not isinstance(b, Mapping):
                    raise _snapshot_error(f"segment {si}, block {bi}: not a block dict")
                size = b.get("size")
                st = b.get("state")
                if not isinstance(size, int) or isinstance(size, bool):
                    raise _snapshot_error(f"segment {si}, block {bi}: no integer 'size'")
                if st == _ALLOCATED:
                    r += _requested(b, size, si, bi)
                    a += size
                elif st == _INACTIVE:
                    free.extend((si, off, size))
                elif st == _PENDING:
                    pend.extend((si, off, size))
                else:
                    raise _snapshot_error(
                        f"segment {si}, block {bi}: unknown block state {_short(st)}"
                    )
                off += size
            for key in ("address", "total_size"):
                if not isinstance(seg[key], int):
                    raise _snapshot_error(f"segment {si}: {key!r} is not an integer")
            per_seg.extend((r, seg["address"], seg["total_size"], len(blocks), a))
            total += off
            seg_type = seg.get("segment_type")
            if (
                (seg_type == _SMALL)
                if seg_type is not None
                else seg["total_size"] == K_SMALL_BUFFER
            ):
                smalls.append(si)
            pid = seg.get("segment_pool_id")
            if pid and not (isinstance(pid, (list, tuple)) and len(pid) == 2):
                raise _snapshot_error(f"segment {si}: 'segment_pool_id' is not a pair")
            if (
                seg.get("device")
                or seg.get("stream")
                or seg.get("is_expandable")
                or (pid and tuple(pid) != _DEFAULT_POOL)
            ):
                odd.append(si)
    except OverflowError:
        raise _snapshot_error(f"segment {si}: a size or address does not fit in 64 bits") from None
    if total > _MAX_FILE_BYTES:
        raise _snapshot_error("segments: the blocks add up past 2^63 bytes")
    return per_seg, free, pend, smalls, odd


def _requested(b: Mapping[str, Any], size: int, si: int, bi: int) -> int:
    """`_memory_viz._block_extra`: requested_size, or the first history entry without frames."""
    if "frames" not in b:
        hist = b.get("history")
        if hist:
            try:
                return int(hist[0]["real_size"])
            except (KeyError, TypeError, IndexError, ValueError):
                raise _snapshot_error(f"segment {si}, block {bi}: malformed 'history'") from None
        req = b.get("requested_size", size)
    else:
        req = b.get("requested_size")
    if not isinstance(req, int):
        raise _snapshot_error(f"segment {si}, block {bi}: no integer 'requested_size'")
    return req


def _short(value: Any) -> str:
    """A value for an error message: bounded and depth-limited (values come from files)."""
    from ..snapshot import short_repr  # only on the error path

    return short_repr(value)


_SMALL = "small"


class _BadState(Exception):
    pass


def _snapshot_error(message: str) -> Exception:
    from ..snapshot import SnapshotError  # only on the error path

    return SnapshotError(message)


def _error(segs: Any, what: str) -> Exception:
    """A located SnapshotError: the careful walk finds where; else say what went wrong."""
    try:
        _walk_careful(segs)
    except ValueError as e:  # SnapshotError is a ValueError
        return e
    return _snapshot_error(f"segments: {what}")
