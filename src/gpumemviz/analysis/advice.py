"""Advice backed by evidence: what to change when the allocator wastes memory, and why.

Each rule reads a `FragmentationReport` (plus, where given, torch's `memory_stats()` and the
device's capacity) and returns an `Advice` carrying the numbers that triggered it. A rule never
suggests a setting that the recorded `allocator_settings` (or the PYTORCH_CUDA_ALLOC_CONF string
you pass) already turn on. Thresholds are named constants; each comment says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator.config import AllocatorConfig, ConfigError
from gpumemviz.allocator.rules import UNLIMITED
from gpumemviz.analysis.fragmentation import FragmentationReport, MemoryFigures, fragmentation
from gpumemviz.io import SnapshotLike
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import JsonDict, TorchMapping

__all__ = [
    "ADVICE_KINDS",
    "EXTERNAL_FRAGMENTATION_HIGH",
    "FREE_BYTES_MIN",
    "FREE_SHARE_MIN",
    "NEAR_CAPACITY",
    "OVERSIZE_SPLIT_SHARE",
    "POOL_BYTES_MIN",
    "RETRIES_CLIMBING",
    "Advice",
    "advise",
    "advise_each_device",
    "oom_device_free",
]

ADVICE_KINDS = (
    "expandable_segments",
    "max_split_size_mb",
    "no_empty_cache_in_loop",
    "smaller_batch_or_checkpointing",
    "share_graph_pool",
    "release_idle_pool",
)

# Half the cached free bytes cannot serve a request as large as the largest free block: past
# this point a request bigger than that block needs new memory although the total would do.
EXTERNAL_FRAGMENTATION_HIGH = 0.5
# Free memory below this share of reserved is too little to be worth a setting change.
FREE_SHARE_MIN = 0.10
# ...and below this many bytes (a dozen default 20 MiB segments), likewise.
FREE_BYTES_MIN = 256 << 20
# Oversize splits "dominate" when most of the trapped free bytes sit in segments larger than
# large_segment_size (made for one big request) that smaller requests then split.
OVERSIZE_SPLIT_SHARE = 0.5
# One flush-and-retry can be warm-up; from the third, the allocator flushes as a habit, and each
# one synchronises the device.
RETRIES_CLIMBING = 3
# Live tensors alone fill this share of the device: no allocator setting can make room.
NEAR_CAPACITY = 0.9
# A private pool's advice asks for a code change: worth it from a few default 20 MiB segments.
POOL_BYTES_MIN = 64 << 20


@dataclass(frozen=True)
class Advice:
    """One suggestion: its `kind` (see `ADVICE_KINDS`), a sentence, and the numbers behind it.

    ``str()`` is the message. Frozen; `advise` makes them, and
    `gpumemviz.analysis.advice_check.check_advice` returns checked copies.

    Attributes
    ----------
    kind : str
        One of `ADVICE_KINDS`: "expandable_segments", "max_split_size_mb",
        "no_empty_cache_in_loop", "smaller_batch_or_checkpointing", "share_graph_pool",
        "release_idle_pool".
    message : str
        What to do and why, for a person.
    evidence : {str: int or float}
        The figures the rule read (bytes, counts, ratios).

    Examples
    --------
    >>> a = Advice("expandable_segments", "Set expandable_segments:True.", {"free": 1 << 30})
    >>> str(a), a.evidence["free"]
    ('Set expandable_segments:True.', 1073741824)
    """

    kind: str
    message: str
    evidence: Mapping[str, int | float] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> JsonDict:
        """Plain JSON values, as ``gpumemviz inspect --json`` writes each advice.

        Returns
        -------
        dict
            ``{"kind", "message", "evidence"}``.

        Examples
        --------
        >>> Advice("max_split_size_mb", "Try max_split_size_mb:512.").to_dict()
        {'kind': 'max_split_size_mb', 'message': 'Try max_split_size_mb:512.', 'evidence': {}}
        """
        return {"kind": self.kind, "message": self.message, "evidence": dict(self.evidence)}


def advise(
    report: FragmentationReport | SnapshotLike,
    settings: TorchMapping | str | None = None,
    stats: TorchMapping | None = None,
    *,
    device_total: int | None = None,
    device: int | None = None,
) -> list[Advice]:
    """Suggest allocator settings or program changes, each with its evidence.

    Parameters
    ----------
    report : FragmentationReport or anything `fragmentation()` accepts
        The analysed snapshot.
    settings : dict or str, optional
        The allocator settings in force: a snapshot's `allocator_settings` dict or a
        PYTORCH_CUDA_ALLOC_CONF string. Default: those recorded in the snapshot.
    stats : mapping, optional
        `torch.cuda.memory_stats(device)`; enables the flush-and-retry rule.
    device_total : int, optional
        Bytes PyTorch can use on the device (for example reserved + device_free at an OOM);
        enables the near-capacity rule.
    device : int, optional
        Only this device (default: every device in the report).

    Returns
    -------
    list of Advice
        Most bytes at stake first; empty when nothing is worth changing.

    Notes
    -----
    A setting already on (named in `settings`, or recorded) is never suggested. The
    "no_empty_cache_in_loop" rule needs `stats`, "smaller_batch_or_checkpointing" needs
    `device_total`. The thresholds are this module's constants.

    Private pools (`MemoryFigures.pools`): "share_graph_pool" when two or more CUDA graphs
    each hold their own pool (ids (n, 0): captured without ``pool=``), with the bytes one
    shared pool would save if the graphs run one after another (all but the largest pool's
    reserved); "release_idle_pool" when private pools with nothing allocated (assumed in use),
    or taken as released and still caching, hold at least `POOL_BYTES_MIN` together (one advice
    per device and case, naming the largest pools). A snapshot does not record whether a pool
    is still in use: the advice follows the report's `pools_in_use` assumption and says which.

    Examples
    --------
    >>> used = {"size": 2**20, "requested_size": 2**20, "state": "active_allocated"}
    >>> seg = {"device": 0, "address": 0, "total_size": 2**30, "stream": 0,
    ...        "segment_type": "large", "blocks": [
    ...     {"size": 2**28, "requested_size": 0, "state": "inactive"}, used,
    ...     {"size": 2**28, "requested_size": 0, "state": "inactive"}, used,
    ...     {"size": 2**29 - 2**21, "requested_size": 0, "state": "inactive"}]}
    >>> [a.kind for a in advise({"segments": [seg]})]
    ['expandable_segments', 'max_split_size_mb']
    >>> advise({"segments": [seg]}, "expandable_segments:True")
    []
    """
    if not isinstance(report, FragmentationReport):
        report = fragmentation(report)
    config = _config(report, settings)
    out: list[tuple[int, Advice]] = []
    figures = report.devices if device is None else {device: report.device(device)}
    for d, f in figures.items():
        name = f"device {d}" if len(report.devices) > 1 else "the device"
        for rule in (_expandable, _max_split):
            a = rule(report, f, d, config, name)
            if a is not None:
                out.append(a)
        if device_total is not None:
            a = _near_capacity(f, d, device_total, name)
            if a is not None:
                out.append(a)
        out += _pool_advice(f, d, name)
    if stats is not None:
        a = _retries(stats)
        if a is not None:
            out.append(a)
    out.sort(key=lambda x: -x[0])
    return [a for _, a in out]


def advise_each_device(
    report: FragmentationReport, oom_free: Mapping[int, int], devices: Iterable[int] | None = None
) -> list[Advice]:
    """`advise()` one device at a time, each with `device_total` = its reserved + the driver's
    free bytes at its last OOM (`oom_device_free`) where one was recorded, so the near-capacity
    rule applies per device: the advice `gpumemviz inspect` and the HTML report both show.

    `devices` defaults to every device in the report; the result keeps their order, each
    device's advice most bytes first.
    """
    out: list[Advice] = []
    for d in report.devices if devices is None else devices:
        total = report.devices[d].reserved + oom_free[d] if d in oom_free else None
        out += advise(report, device=d, device_total=total)
    return out


def _config(report: FragmentationReport, settings: TorchMapping | str | None) -> AllocatorConfig:
    """What is already on: the recorded settings, or the ones the caller names."""
    if settings is None:
        return report.config
    if isinstance(settings, str):
        try:
            return AllocatorConfig.parse(settings, cuda_build=False)
        except ConfigError as e:
            raise ValueError(f"not a PYTORCH_CUDA_ALLOC_CONF string: {e}") from None
    if isinstance(settings, Mapping):
        return AllocatorConfig.from_settings(settings)
    raise TypeError(f"settings must be a dict or a str, got {type(settings).__name__}")


def _expandable(
    r: FragmentationReport, f: MemoryFigures, d: int, config: AllocatorConfig, name: str
) -> tuple[int, Advice] | None:
    if config.expandable_segments or (r.expandable_mode and config is r.config):
        return None  # on already (recorded, or seen in the segments when nothing was recorded)
    if not _free_matters(f) or f.external_fragmentation < EXTERNAL_FRAGMENTATION_HIGH:
        return None
    stuck = max(f.free - f.releasable, f.free_trapped)
    msg = (
        f"External fragmentation on {name} is {f.external_fragmentation:.0%}: "
        f"{format_size(f.free)} is cached free but the largest block is "
        f"{format_size(f.largest_free)}, and {format_size(f.free_trapped)} is trapped in "
        "partly used segments. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so "
        "segments grow in place instead of leaving holes."
    )
    evidence = {
        "device": d,
        "external_fragmentation": f.external_fragmentation,
        "free": f.free,
        "largest_free": f.largest_free,
        "free_trapped": f.free_trapped,
        "reserved": f.reserved,
    }
    return stuck, Advice("expandable_segments", msg, evidence)


def _max_split(
    r: FragmentationReport, f: MemoryFigures, d: int, config: AllocatorConfig, name: str
) -> tuple[int, Advice] | None:
    if config.max_split_size != UNLIMITED or config.expandable_segments:
        return None
    if not _free_matters(f) or f.free_trapped < FREE_BYTES_MIN:
        return None
    c = r.per_segment
    big = (
        (c.device == d)
        & ~c.is_expandable
        & ~c.is_small
        & (c.allocated > 0)
        & (c.total_size > config.large_segment_size)
    )
    trapped_big = int(c.free[big].sum())
    if trapped_big < OVERSIZE_SPLIT_SHARE * f.free_trapped:
        return None
    median_mib = float(np.median(c.total_size[big])) / (1 << 20)
    mib = max(32, 1 << (int(median_mib).bit_length() - 1))
    msg = (
        f"On {name}, {format_size(trapped_big)} of the {format_size(f.free_trapped)} trapped "
        f"free memory sits in {int(big.sum())} large segments (median "
        f"{format_size(median_mib * (1 << 20))}) that smaller requests have split. Set "
        f"PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{mib} so blocks of {mib} MiB or more are "
        "kept whole for large requests."
    )
    evidence = {
        "device": d,
        "free_trapped": f.free_trapped,
        "trapped_in_large_split_segments": trapped_big,
        "large_split_segments": int(big.sum()),
        "suggested_max_split_size_mb": mib,
    }
    return trapped_big, Advice("max_split_size_mb", msg, evidence)


def _retries(stats: TorchMapping) -> tuple[int, Advice] | None:
    def get(key: str) -> int:
        v = stats.get(key, 0) if hasattr(stats, "get") else 0
        return int(v or 0)

    retries = get("num_alloc_retries")
    if retries < RETRIES_CLIMBING:
        return None
    syncs = get("num_sync_all_streams")
    manual = max(syncs - retries, 0)
    msg = (
        f"The allocator has flushed its cache and retried cudaMalloc {retries} times "
        f"(num_alloc_retries), each a full device sync"
        + (f", and the cache was emptied {manual} more times by hand" if manual else "")
        + ". Keep torch.cuda.empty_cache() out of the training loop and lower peak memory, so "
        "the cache can settle."
    )
    evidence = {
        "num_alloc_retries": retries,
        "num_sync_all_streams": syncs,
        "manual_flushes": manual,
        "num_device_alloc": get("num_device_alloc"),
        "num_device_free": get("num_device_free"),
    }
    return get("reserved_bytes.all.current"), Advice("no_empty_cache_in_loop", msg, evidence)


def _near_capacity(
    f: MemoryFigures, d: int, device_total: int, name: str
) -> tuple[int, Advice] | None:
    if device_total <= 0 or f.allocated < NEAR_CAPACITY * device_total:
        return None
    msg = (
        f"Live tensors alone take {format_size(f.allocated)} of the "
        f"{format_size(device_total)} {name} offers ({f.allocated / device_total:.0%}): no "
        "allocator setting can make room. Use a smaller batch, activation checkpointing "
        "(torch.utils.checkpoint) or lower precision."
    )
    evidence = {"device": d, "allocated": f.allocated, "device_total": device_total}
    return f.allocated, Advice("smaller_batch_or_checkpointing", msg, evidence)


def _pool_advice(f: MemoryFigures, d: int, name: str) -> list[tuple[int, Advice]]:
    """The private-pool rules of `advise` (Notes there) for one device."""
    out: list[tuple[int, Advice]] = []
    graphs = [p for p in f.pools if p.kind == "graph" and p.reserved > 0]
    if len(graphs) >= 2:
        largest = max(p.reserved for p in graphs)
        total = sum(p.reserved for p in graphs)
        saved = total - largest
        if saved >= POOL_BYTES_MIN:
            msg = (
                f"{len(graphs)} CUDA graphs on {name} each hold their own memory pool "
                f"({format_size(total)} reserved in all, the largest {format_size(largest)}). "
                "If they run one after another, capture them into one shared pool "
                "(pool=torch.cuda.graph_pool_handle(), the same handle for each "
                f"torch.cuda.graph): that would hold about {format_size(largest)}, saving up to "
                f"{format_size(saved)}."
            )
            evidence = {
                "device": d,
                "graph_pools": len(graphs),
                "reserved_in_graph_pools": total,
                "largest_graph_pool": largest,
                "bytes_saved": saved,
            }
            out.append((saved, Advice("share_graph_pool", msg, evidence)))
    private = [p for p in f.pools if p.kind != "default"]
    # assumed in use with nothing live in it; or taken as released, still caching segments
    idle = [p for p in private if p.in_use and p.allocated == 0 and p.pending_free == 0]
    cached = [p for p in private if not p.in_use and p.releasable]
    for pools, in_use in ((idle, True), (cached, False)):
        freed = sum(p.releasable + p.releasable_after_release for p in pools)
        if freed < POOL_BYTES_MIN:
            continue
        pools = sorted(pools, key=lambda p: -(p.releasable + p.releasable_after_release))
        named = ", ".join(
            f"{p.label} {format_size(p.releasable + p.releasable_after_release)}" for p in pools[:3]
        ) + (f" and {len(pools) - 3} more" if len(pools) > 3 else "")
        what = pools[0].label if len(pools) == 1 else f"{len(pools)} private pools ({named})"
        if in_use:
            msg = (
                f"{what} on {name} hold{'s' if len(pools) == 1 else ''} "
                f"{format_size(freed)} with nothing allocated. If "
                f"{'its' if len(pools) == 1 else 'their'} graph or MemPool is no longer needed, "
                f"release {'it' if len(pools) == 1 else 'them'} (graph.reset(), or drop the last "
                "reference to the MemPool) and call "
                f"torch.cuda.empty_cache() to return {format_size(freed)}; a snapshot does not "
                "record whether a pool is still in use, so each was assumed to be."
            )
        else:
            msg = (
                f"{what} on {name}, taken as released (pools_in_use), still cache "
                f"{format_size(freed)} in segments with nothing allocated: "
                f"torch.cuda.empty_cache() returns {format_size(freed)} to the device."
            )
        evidence = {
            "device": d,
            "pools": len(pools),
            "largest_pool_a": pools[0].pool_id[0],
            "largest_pool_b": pools[0].pool_id[1],
            "reserved": sum(p.reserved for p in pools),
            "bytes_freed": freed,
            "assumed_in_use": int(in_use),
        }
        out.append((freed, Advice("release_idle_pool", msg, evidence)))
    return out


def _free_matters(f: MemoryFigures) -> bool:
    return f.free >= FREE_BYTES_MIN and f.free >= FREE_SHARE_MIN * max(f.reserved, 1)


def oom_device_free(snapshot: Snapshot | TorchMapping) -> dict[int, int]:
    """Per device, the `device_free` of the last `oom` trace entry (what the driver had left).

    With the snapshot taken at the OOM, reserved + device_free is what PyTorch could use: pass
    it to `advise(..., device_total=...)`.

    Examples
    --------
    >>> oom_device_free({"segments": [], "device_traces": [[
    ...     {"action": "oom", "device_free": 1024, "size": 4096, "stream": 0}]]})
    {0: 1024}
    """
    out: dict[int, int] = {}
    traces = getattr(snapshot, "traces", None)
    if isinstance(traces, Mapping):  # a Snapshot: numpy columns
        for d, t in traces.items():
            names = list(getattr(t, "action_names", ()))
            if "oom" not in names or not len(t):
                continue
            hits = np.flatnonzero(np.asarray(t.action) == names.index("oom"))
            if len(hits) and int(t.device_free[hits[-1]]) >= 0:
                out[int(d)] = int(t.device_free[hits[-1]])
        return out
    if isinstance(snapshot, Mapping):
        for d, entries in enumerate(snapshot.get("device_traces") or []):
            for e in reversed(entries or []):
                if isinstance(e, Mapping) and e.get("action") == "oom":
                    free = e.get("device_free")
                    if isinstance(free, int):
                        out[d] = free
                    break
    return out
