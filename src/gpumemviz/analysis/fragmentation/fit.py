"""`FragmentationReport.can_fit`: would a request succeed now, by the allocator's rules, and the
`FitAnswer` it gives."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator.rules import (
    UNLIMITED,
    allocation_size,
    is_small,
    oversize_rejects,
    round_size,
)
from gpumemviz.analysis.fragmentation._util import pool_name
from gpumemviz.analysis.fragmentation.expandable_fit import expandable_walk, pages_to_map
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.pools import pool_label
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.allocator.config import AllocatorConfig
    from gpumemviz.analysis.fragmentation.tables import FreeBlocks, SegmentFigures
    from gpumemviz.snapshot.schema import JsonDict

#: `FitAnswer.verdict` values, in the order the allocator tries them
#: (docs/allocator.md, The malloc path).
VERDICTS = (
    "cached",
    "new_segment",
    "garbage_collect",
    "flush_and_retry",
    "out_of_memory",
    "room_unknown",
)


@dataclass(frozen=True)
class FitAnswer:
    """Whether a request of `nbytes` would succeed now, and why, by the allocator's rules.

    `verdict` is one of `VERDICTS`, each explained under `FragmentationReport.can_fit`;
    `explanation` (also ``str()``) is one sentence; `to_dict()` gives plain values.
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
    pool_id: tuple[int, int] = (0, 0)  # the private pool asked for; (0, 0): the default pool

    def __str__(self) -> str:
        return self.explanation

    def to_dict(self) -> JsonDict:
        """The fields as a dict of plain values."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def can_fit(
    c: SegmentFigures,
    free: FreeBlocks,
    cfg: AllocatorConfig,
    expandable_mode: bool,
    *,
    reserved: int,
    releasable: int,
    nbytes: int,
    stream: int,
    device: int,
    device_free: int | None,
    pool_id: object,
) -> FitAnswer:
    """`FragmentationReport.can_fit` on the report's tables and settings; `reserved` and
    `releasable` are the device's figures, `nbytes` and `device_free` parsed already; a bad
    `pool_id` raises ValueError."""
    req, room = nbytes, device_free
    pid = _pool_id(pool_id)
    rounded = round_size(req, cfg.divisions)
    small = is_small(rounded)
    pool = pool_name(small)
    where = f"stream {stream}'s {pool} pool" if stream else f"the {pool} pool"
    if pid != (0, 0):
        where += f" of {pool_label(pid)}"
    base: JsonDict = {
        "nbytes": req,
        "rounded": rounded,
        "device": device,
        "stream": stream,
        "pool": pool,
        "pool_id": pid,
    }
    asked = format_size(req) + ("" if rounded == req else f" (rounded to {format_size(rounded)})")

    # (a) best fit among cached inactive blocks of this device, stream and pool: each private
    # pool has its own small and large pools (docs/allocator.md, Best fit)
    seg = free.segment
    same = (c.device[seg] == device) & (c.stream[seg] == stream) & (c.is_small[seg] == small)
    big_enough = free.size >= rounded
    mine = (c.pool_id[seg, 0] == pid[0]) & (c.pool_id[seg, 1] == pid[1])
    ok = same & mine & big_enough
    exp_blk = c.is_expandable[seg]
    if not expandable_mode:
        ok &= ~exp_blk  # expandable blocks are skipped once the mode is off
    cand = np.flatnonzero(ok)
    rejected = ""
    if len(cand):
        addr = c.address[seg[cand]] + free.offset[cand]
        order = np.lexsort((addr, free.size[cand]))
        cand, addr = cand[order], addr[order]
        pick = 0
        if expandable_mode and exp_blk[cand[0]]:
            pick = expandable_walk(c, free, cand)
        i = int(cand[pick])
        bsize = int(free.size[i])
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
                releasable=releasable,
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
    rejected += _other_pools(c, free, same & ~mine & big_enough, pid)

    # (b) new memory: a cudaMalloc'd segment, or pages mapped beyond a free expandable tail
    if expandable_mode:
        need, how = pages_to_map(
            c, free, cfg.large_segment_size, rounded, stream, device, small, pool_id=pid
        )
    else:
        need = allocation_size(rounded, cfg.large_segment_size)
        how = f"a new {format_size(need)} segment"
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
                f"{head}, and the device's free memory is unknown here, so whether the "
                f"driver can give it cannot be said (the allocator's own flush could add "
                f"{format_size(releasable)})."
            ),
            **base,
        )
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
    gc_low, gc_high = _garbage_collected(c, reserved, device, cap, cfg.garbage_collection_threshold)
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
    elif not gc_high and fits_with(
        oversize := _oversize_released(
            c, free, cfg.max_split_size, rounded, stream, device, small, pid
        ),
        need,
    ):
        verdict, fits = "new_segment", True
        tail = (
            f": only {format_size(room)} is free on the device{capped}, but first the allocator "
            f"returns {format_size(oversize)} of cached oversize segments (max_split_size) to "
            "the driver; then the new segment fits, without a flush or a retry."
        )
    else:
        # the flush also unmaps the whole free pages of the tail it would grow, so in
        # expandable mode the retry needs the pages of the flushed layout
        after = (
            pages_to_map(
                c,
                free,
                cfg.large_segment_size,
                rounded,
                stream,
                device,
                small,
                flushed=True,
                pool_id=pid,
            )[0]
            if expandable_mode
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


def _pool_id(pool_id: object) -> tuple[int, int]:
    """`pool` as a pair of ints, or a one-line ValueError."""
    if (
        isinstance(pool_id, tuple | list)
        and len(pool_id) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in pool_id)
    ):
        return int(pool_id[0]), int(pool_id[1])
    raise ValueError(f"pool must be a pair of ints such as (0, 0), got {short_repr(pool_id)}")


def _other_pools(c: SegmentFigures, free: FreeBlocks, sel: np.ndarray, pid: tuple[int, int]) -> str:
    """Where another pool of the device holds a free block big enough: the request cannot use
    it (each pool keeps its own blocks), and the answer says so."""
    idx = np.flatnonzero(sel)
    if not len(idx):
        return ""
    best = int(idx[np.argmax(free.size[idx])])
    row = int(free.segment[best])
    other = (int(c.pool_id[row, 0]), int(c.pool_id[row, 1]))
    return (
        f" ({_named(other)} holds a free {format_size(int(free.size[best]))} block, but a "
        f"request in {_named(pid)} cannot use another pool's blocks)"
    )


def _named(pool_id: tuple[int, int]) -> str:
    return "the default pool" if pool_id == (0, 0) else pool_label(pool_id)


def _oversize_released(
    c: SegmentFigures,
    free: FreeBlocks,
    mss: int,
    rounded: int,
    stream: int,
    device: int,
    small: bool,
    pool_id: tuple[int, int] = (0, 0),
) -> int:
    """What `release_available_cached_blocks` returns to the driver before the flush (0: it
    fails, and the flush follows); it takes from the request's own pool, private or not.
    Only with max_split_size set: the pool's smallest cached
    block of at least max(request, max_split_size), or else its largest oversize blocks,
    largest first, until as many bytes came back (as the allocator model)."""
    if mss == UNLIMITED:
        return 0
    seg = free.segment
    idx = np.flatnonzero(
        (c.device[seg] == device)
        & (c.stream[seg] == stream)
        & (c.is_small[seg] == small)
        & (c.pool_id[seg, 0] == pool_id[0])
        & (c.pool_id[seg, 1] == pool_id[1])
    )
    if not len(idx):
        return 0
    size = free.size[idx]
    rows = seg[idx]
    order = np.lexsort((c.address[rows] + free.offset[idx], size))  # the pool's order
    sizes: list[int] = size[order].tolist()
    # cudaFree takes whole segments: the allocator never splits an oversize block, so a cached
    # one is a whole non-expandable segment (a hand-made file may say otherwise: kept)
    whole = (free.offset[idx] == 0) & (size == c.total_size[rows]) & ~c.is_expandable[rows]
    freeable = whole[order].tolist()
    key = max(rounded, mss)
    i = bisect_left(sizes, key)
    if i < len(sizes) and freeable[i]:
        return sizes[i]
    released = 0
    for j in range(i - 1, -1, -1):  # largest first, oversize ones only
        if released >= key or sizes[j] < mss:
            break
        if freeable[j]:
            released += sizes[j]
    return released if released >= key else 0


def _garbage_collected(
    c: SegmentFigures, reserved: int, device: int, cap: int | None, threshold: float
) -> tuple[int, int]:
    """What `garbage_collect_cached_blocks` frees before a new segment: at least and at most,
    in bytes (docs/allocator.md, Garbage collection). It runs only with a fraction cap and a
    threshold, while reserved is above threshold x cap, and frees whole unused large
    non-expandable segments oldest first (by an age the snapshot does not record) until
    reserved is back under the threshold; `reserved` is the device's."""
    if cap is None or threshold <= 0.0:
        return 0, 0
    limit = int(threshold * cap)
    if reserved <= limit:
        return 0, 0
    whole = (
        (c.device == device)
        & ~c.is_small
        & ~c.is_expandable
        & ~c.pool_id.any(axis=1)
        & (c.free == c.total_size)
    )
    freeable = int(c.total_size[whole].sum())
    return min(freeable, reserved - limit), freeable
