"""The values `fragmentation()` returns: figures, per-segment columns and the report (its
`can_fit` answer, `FitAnswer`, is `fit`'s). Plain frozen dataclasses; the logic lives in the
sibling modules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.rules import UNLIMITED
from gpumemviz.analysis.fragmentation.fit import FitAnswer, can_fit
from gpumemviz.analysis.fragmentation.tables import FreeBlocks, SegmentFigures
from gpumemviz.snapshot.units import parse_size

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import JsonDict, TorchMapping

#: How many segments `worst_segments` keeps per device (the CLI prints them all).
N_WORST = 5

#: The headline `MemoryFigures` fields, in display order (diff and the HTML report show these);
#: the two fragmentation ratios are floats, the rest integers.
FIGURE_NAMES = (
    "reserved",
    "allocated",
    "active",
    "requested",
    "pending_free",
    "internal_waste",
    "free",
    "free_trapped",
    "releasable",
    "largest_free",
    "external_fragmentation",
    "fragmentation_sq",
    "segments",
    "blocks",
)

# --------------------------------------------------------------------------------------------
# Report values


@dataclass(frozen=True)
class PoolKey:
    """One best-fit pool of the allocator: a stream's small or large pool (private pools apart)."""

    device: int
    stream: int
    pool: str  # "small" | "large"
    pool_id: tuple[int, int] = (0, 0)

    def to_dict(self) -> JsonDict:
        return {
            "device": self.device,
            "stream": self.stream,
            "pool": self.pool,
            "pool_id": list(self.pool_id),
        }


@dataclass(frozen=True)
class PoolFigures:
    """One pool of one device: the default pool, or a private pool (a CUDA graph's, a MemPool).

    allocated + pending_free + free == reserved, as for a device. A snapshot does not record a
    private pool's use count, so whether empty_cache may release it is an assumption
    (`fragmentation(..., pools_in_use=)`, in `in_use`): `releasable` is what empty_cache returns
    from the pool now, `releasable_after_release` what it returns on top once the pool is
    released (its MemPool deleted, its graph reset): non-zero only for a pool taken as in use.
    """

    device: int
    pool_id: tuple[int, int]
    kind: str  # snapshot.pools.POOL_KINDS: "default", "graph", "mempool", "private"
    label: str  # "default pool", "CUDA graph pool (3, 0)", "MemPool (0, 2)", ...
    in_use: bool  # assumed in use (the default pool always is)
    reserved: int
    allocated: int
    pending_free: int
    free: int
    largest_free: int
    releasable: int  # what empty_cache returns from this pool now
    releasable_after_release: int  # what it returns on top once the pool is released
    segments: int

    @property
    def external_fragmentation(self) -> float:
        """1 - largest_free / free (0.0 when free is 0)."""
        return 0.0 if self.free <= 0 else 1.0 - self.largest_free / self.free

    @property
    def note(self) -> str:
        """ "only after the pool is released" where its free segments wait on that, else ""."""
        return "only after the pool is released" if self.releasable_after_release else ""

    def to_dict(self) -> JsonDict:
        d: JsonDict = {f.name: getattr(self, f.name) for f in fields(self)}
        d["pool_id"] = list(self.pool_id)
        d["external_fragmentation"] = self.external_fragmentation
        d["note"] = self.note
        return d


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
    pool_id: tuple[int, int] = (0, 0)  # the private pool, (0, 0) the default pool

    @property
    def external_fragmentation(self) -> float:
        return 0.0 if self.free == 0 else 1.0 - self.largest_free / self.free

    def to_dict(self) -> JsonDict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["pool_id"] = list(self.pool_id)
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
    conservation law holds). `internal_waste` and `requested` split `allocated`. Bytes unless
    the field's comment says otherwise. Notes on some fields:

    - `requested`: torch 2.0 blocks give ``history[0].real_size`` (as MemoryViz's
      ``_block_extra_legacy``); stale requested sizes of inactive blocks are never read. This
      is segsum's ``total_allocated``, not torch's ``requested_bytes`` stat (which also counts
      pending frees).
    - `free_trapped` equals torch's ``inactive_split_bytes`` over those segments, except that
      a segment holding only pending frees and free blocks counts there and not here.
    - `free_stuck` includes expandable slivers; the panel and the HTML report paint it as
      trapped.
    - `releasable`: segments with no allocated block (pending frees included: empty_cache
      syncs events first), plus the whole free pages of expandable runs (2 MiB small,
      large_segment_size large).
    - `external_fragmentation` is 0.0 when `free` is 0.
    - `releasable` counts the private pools taken as released (`fragmentation(...,
      pools_in_use=)`; by default none: a snapshot does not record a pool's use count);
      `releasable_private` is what the pools taken as in use would add once released.
    - `pools`: one `PoolFigures` per pool holding a segment (default pool first, then by id).
    - `largest_free_by_pool`: {`PoolKey`: bytes}; `worst_segments`: at most `N_WORST`, most
      stuck free bytes first; `violations`: segments where allocated + free + pending !=
      total_size (reported, never raised).
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
    releasable: int  # what empty_cache would return now (default pool, released pools)
    releasable_private: int  # the same in private pools in use (only once they are released)
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
    pools: tuple[PoolFigures, ...] = ()

    def to_dict(self) -> JsonDict:
        """Plain JSON-ready values (the `--json` shape of `gpumemviz inspect`)."""
        d: JsonDict = {}
        skip = ("device", "largest_free_by_pool", "worst_segments", "violations", "pools")
        for f in fields(self):
            if f.name in skip:
                continue
            d[f.name] = getattr(self, f.name)
        d["largest_free_by_pool"] = [
            {**k.to_dict(), "largest_free": v} for k, v in self.largest_free_by_pool.items()
        ]
        d["worst_segments"] = [s.to_dict() for s in self.worst_segments]
        d["violations"] = [v.message for v in self.violations]
        d["pools"] = [p.to_dict() for p in self.pools]
        return d

    def pool(self, pool_id: tuple[int, int]) -> PoolFigures | None:
        """The figures of one pool (None: it holds no segment here)."""
        key = tuple(pool_id)
        return next((p for p in self.pools if p.pool_id == key), None)


# --------------------------------------------------------------------------------------------
# The report


@dataclass(frozen=True, eq=False)
class FragmentationReport:
    """What `fragmentation()` returns: figures per device and in total, per-segment columns.

    The total figures are also readable directly: `report.largest_free` is
    `report.total.largest_free` (every `MemoryFigures` field but `device`).

    Attributes
    ----------
    total : MemoryFigures
        All devices together (its `device` is None).
    devices : {int: MemoryFigures}
        Devices holding a segment or a trace entry, as `Snapshot.devices`.
    per_segment : SegmentFigures
        Numpy columns, one row per segment in snapshot order.
    allocator_settings : dict or None
        The snapshot's recorded settings, as given.
    config : AllocatorConfig
        Parsed from them (PyTorch's defaults when none were recorded).
    expandable_mode : bool
        Recorded ``expandable_segments``, else inferred from expandable segments.
    pools_in_use : bool or frozenset of (int, int)
        The assumption on private pools (a snapshot does not record their use count): True,
        all in use (the default); False, all released; a set: exactly those in use. A pool in
        use keeps its free segments through empty_cache.
    free_blocks : FreeBlocks
        The inactive and pending-free blocks (segment row, offset, size), what `can_fit`
        searches.

    Examples
    --------
    >>> from gpumemviz import fragmentation
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...     {"size": 512, "requested_size": 100, "state": "active_allocated"},
    ...     {"size": (2 << 20) - 512, "requested_size": 0, "state": "inactive"}]}
    >>> r = fragmentation([seg])
    >>> r.free == r.total.free == r.device(0).free, list(r.devices), len(r.per_segment)
    (True, [0], 1)
    >>> r.worst_segments[0].stuck_free, r.expandable_mode, r.violations
    (2096640, False, ())
    """

    total: MemoryFigures
    devices: Mapping[int, MemoryFigures]
    per_segment: SegmentFigures
    allocator_settings: TorchMapping | None
    config: AllocatorConfig
    expandable_mode: bool
    pools_in_use: bool | frozenset[tuple[int, int]]
    free_blocks: FreeBlocks = field(repr=False)

    def __getattr__(self, name: str) -> Any:  # Any: the total's figure of that name
        if name in _FIGURE_NAMES:
            return getattr(self.total, name)
        raise AttributeError(f"'FragmentationReport' object has no attribute {name!r}")

    @property
    def violations(self) -> tuple[ConservationViolation, ...]:
        """Segments whose blocks do not add up to total_size (all devices; never raised)."""
        return self.total.violations

    def device(self, device: int) -> MemoryFigures:
        """The figures of one device.

        Parameters
        ----------
        device : int
            A device index.

        Returns
        -------
        MemoryFigures

        Raises
        ------
        ValueError
            Naming the devices present, when `device` holds no segment or trace entry.

        Examples
        --------
        >>> from gpumemviz import fragmentation
        >>> fragmentation([]).device(0)
        Traceback (most recent call last):
        ...
        ValueError: no device 0 in this snapshot (devices: none)
        """
        try:
            return self.devices[device]
        except (KeyError, TypeError):
            have = ", ".join(str(d) for d in self.devices) or "none"
            raise ValueError(f"no device {device} in this snapshot (devices: {have})") from None

    def to_dict(self) -> JsonDict:
        """The report as plain JSON values: the ``gpumemviz inspect --json`` shape.

        Returns
        -------
        dict
            ``{"total": {...}, "devices": {"0": {...}}, "settings": {"recorded",
            "expandable_segments", "max_split_size", "roundup_power2_divisions"},
            "pools_in_use": true | false | [[a, b], ...]}``; each figures dict is
            `MemoryFigures.to_dict()`. Plain ints, floats, lists and strings.

        Examples
        --------
        >>> from gpumemviz import fragmentation
        >>> d = fragmentation([]).to_dict()
        >>> d["total"]["reserved"], d["devices"], d["settings"]["max_split_size"]
        (0, {}, None)
        """
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
            "pools_in_use": (
                self.pools_in_use
                if isinstance(self.pools_in_use, bool)
                else [list(p) for p in sorted(self.pools_in_use)]
            ),
        }

    def can_fit(
        self,
        nbytes: int | str,
        stream: int = 0,
        device: int = 0,
        device_free: int | str | None = None,
        pool: tuple[int, int] = (0, 0),
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
        pool : (int, int)
            The pool the request goes to: (0, 0), the default pool; a private pool's id for a
            request made under ``torch.cuda.use_mem_pool`` or during a graph capture.

        Returns
        -------
        FitAnswer
            `verdict` is one of `VERDICTS` (Notes); `explanation` is one sentence.

        Raises
        ------
        ValueError
            When `device` is not in the snapshot, a size is not one `parse_size` reads, or
            `pool` is not a pair of ints.

        Notes
        -----
        The verdicts, in the order the allocator tries them (docs/allocator.md, The malloc
        path):

        - "cached": fits in the cached block at `block_address` (best fit, the oversize rules
          on that one candidate, the expandable-size walk).
        - "new_segment": needs `new_bytes` from the device, which has room (the allocation
          size, or in expandable mode the pages `find_expandable_block`/`map_block` would map);
          with max_split_size set, possibly after `release_available_cached_blocks` returned
          cached oversize segments of the pool (which counts no retry).
        - "garbage_collect": fits once ``garbage_collection_threshold``'s collection frees the
          unused large segments it is sure to free (no retry).
        - "flush_and_retry": `releasable` + device_free covers the bytes needed after the
          allocator's sync, flush and retry (in expandable mode the flush also unmaps the whole
          free pages of the tail it grows).
        - "out_of_memory".
        - "room_unknown": needs new memory and no `device_free` was given (`fits` is None).

        A recorded ``per_process_memory_fraction`` caps reserved + allocation size at fraction
        x (device_free + reserved) at every step. Only the request's pool is searched: each
        private pool has its own small and large pools, so a request in the default pool never
        takes a private pool's free block, nor the reverse (the answer names a private pool's
        block that would have fitted); the flush returns the default pool's free segments and
        those of private pools taken as released (`pools_in_use`). Pending
        frees are not reused (their events may not have completed). Checked against
        `CachingAllocator.from_segments` on every real file and on random states (expandable
        with pending frees; fraction caps with and without GC; max_split_size states where
        oversize segments go back first).

        Examples
        --------
        >>> from gpumemviz import fragmentation
        >>> seg = {"device": 0, "address": 0x7F0000000000, "total_size": 20 * 2**20,
        ...        "stream": 0, "segment_type": "large", "blocks": [
        ...     {"size": 4 * 2**20, "requested_size": 4_000_000, "state": "active_allocated"},
        ...     {"size": 16 * 2**20, "requested_size": 0, "state": "inactive"}]}
        >>> fragmentation([seg]).can_fit(10 * 2**20).verdict
        'cached'
        >>> fragmentation([seg]).can_fit(40 * 2**20, device_free=0).verdict
        'out_of_memory'
        """
        req = parse_size(nbytes)
        room = None if device_free is None else parse_size(device_free)
        figures = self.device(device)  # ValueError naming the devices present
        return can_fit(
            self.per_segment,
            self.free_blocks,
            self.config,
            self.expandable_mode,
            reserved=figures.reserved,
            releasable=figures.releasable,
            nbytes=req,
            stream=stream,
            device=device,
            device_free=room,
            pool_id=pool,
        )


_FIGURE_NAMES = frozenset(f.name for f in fields(MemoryFigures)) - {"device"}
