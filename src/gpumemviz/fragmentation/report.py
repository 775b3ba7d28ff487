"""The values `fragmentation()` returns: figures, per-segment columns and the report (its
`can_fit` answer, `FitAnswer`, is `fit`'s). Plain frozen dataclasses; the logic lives in the
sibling modules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from ..allocator.config import AllocatorConfig
from ..allocator.rules import UNLIMITED
from .fit import FitAnswer, can_fit

if TYPE_CHECKING:
    from ..snapshot.schema import JsonDict, TorchMapping

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

    def to_dict(self) -> JsonDict:
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

    def to_dict(self) -> JsonDict:
        """Plain JSON-ready values (the `--json` shape of `gpumemviz inspect`)."""
        d: JsonDict = {}
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
        stuck: np.ndarray = np.maximum(self.free + self.pending_free - self.releasable, 0)
        return stuck

    @property
    def external_fragmentation(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = 1.0 - self.largest_free / self.free
        return np.where(self.free > 0, frac, 0.0)


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
    allocator_settings: TorchMapping | None
    config: AllocatorConfig
    expandable_mode: bool
    # inactive blocks, for can_fit: segment row, offset in the segment, size
    _free_segment: np.ndarray = field(repr=False)
    _free_offset: np.ndarray = field(repr=False)
    _free_size: np.ndarray = field(repr=False)
    _pend_segment: np.ndarray = field(repr=False)  # active_pending_free blocks, the same way
    _pend_offset: np.ndarray = field(repr=False)
    _pend_size: np.ndarray = field(repr=False)

    def __getattr__(self, name: str) -> Any:  # Any: the total's figure of that name
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

    def to_dict(self) -> JsonDict:
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
        >>> from gpumemviz.fragmentation import fragmentation
        >>> seg = {"device": 0, "address": 0x7F0000000000, "total_size": 20 * 2**20,
        ...        "stream": 0, "segment_type": "large", "blocks": [
        ...     {"size": 4 * 2**20, "requested_size": 4_000_000, "state": "active_allocated"},
        ...     {"size": 16 * 2**20, "requested_size": 0, "state": "inactive"}]}
        >>> fragmentation([seg]).can_fit(10 * 2**20).verdict
        'cached'
        >>> fragmentation([seg]).can_fit(40 * 2**20, device_free=0).verdict
        'out_of_memory'
        """
        return can_fit(self, nbytes, stream, device, device_free)


_FIGURE_NAMES = frozenset(f.name for f in fields(MemoryFigures)) - {"device"}
