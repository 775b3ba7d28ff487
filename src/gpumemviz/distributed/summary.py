"""What a rank publishes about one device: the strip of `gpumemviz.render.strips` plus who and
where the rank is, its allocator counters and its last OOM verdict.

The allocator part is `device_summary` of the newest segment state the sampler read (so a
rank's strip means what a device's strip means in the multi-device panel); the rank fields say
which process it is, how fresh the figures are, and how close the device is to running out.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from gpumemviz.distributed.keys import Json, short_text
from gpumemviz.render.rows import build_rows
from gpumemviz.render.strips import STRIP_BINS, device_summary
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.sample import OomEvent, Sample

__all__ = ["RankIdentity", "empty_map", "map_summary", "oom_verdict", "rank_summary"]

_EXPLANATION_CHARS = 300  # the verdict's explanation kept in a summary


@dataclass(frozen=True)
class RankIdentity:
    """Which process publishes: its ranks, host and pid."""

    rank: int
    local_rank: int
    host: str
    pid: int

    @classmethod
    def here(cls, rank: int, local_rank: int) -> RankIdentity:
        return cls(int(rank), int(local_rank), short_text(socket.gethostname(), 64), os.getpid())


def empty_map(device: int, bins: int = STRIP_BINS) -> Json:
    """The allocator part of a device with no segment state read yet: zeros, an empty map."""
    empty = Snapshot.from_torch([])
    return dict(device_summary(build_rows(empty), device=device, bins=bins))


def map_summary(sample: Sample, bins: int = STRIP_BINS) -> Json:
    """`device_summary` of the sample's segment state (of its device), with its OOM count."""
    stats = sample.stats
    ooms = stats.num_ooms if stats is not None else 0
    if sample.segments is None:
        out = empty_map(sample.device, bins)
        out["ooms"] = int(ooms)
        return out
    rows = build_rows(sample.segments, sample.device)
    return dict(device_summary(rows, device=sample.device, ooms=ooms, bins=bins))


def oom_verdict(event: OomEvent) -> Json:
    """The last OOM as a summary carries it: cause, explanation (cut), sizes, time."""
    return {
        "time": round(float(event.time), 3),
        "cause": short_text(event.cause, 40),
        "explanation": short_text(event.explanation, _EXPLANATION_CHARS),
        "alloc_size": int(event.alloc_size),
        "device_free": int(event.device_free),
    }


def _total(sample: Sample) -> int | None:
    info, nvml = sample.device_info, sample.nvml
    if info is not None and info.total_memory:
        return int(info.total_memory)
    if nvml is not None and nvml.total:
        return int(nvml.total)
    return None


def headroom(summary: Json) -> int | None:
    """Bytes the device could still hand one allocation: its largest free block in reserved
    memory, or what the device has left outside it (``device_free``), whichever is larger;
    None when neither the device's free nor its total is known."""
    free = summary.get("device_free")
    if not isinstance(free, int):
        total, reserved = summary.get("total"), summary.get("reserved")
        if not isinstance(total, int) or not isinstance(reserved, int):
            return None
        free = max(0, total - reserved)
    largest = summary.get("largest_free")
    return max(free, largest if isinstance(largest, int) else 0)


def rank_summary(
    who: RankIdentity,
    sample: Sample,
    allocator: Json,
    *,
    now: float,
    interval: float,
    last_oom: Json | None,
    snapshots: bool,
    oom_files: bool = False,
) -> Json:
    """One (rank, device) summary: `allocator` (a `map_summary`) plus the rank fields.

    Keys added: rank, local_rank, host, pid, time (of publishing), sample_time (of the figures),
    interval, state, source, demo, alloc_retries, total, device_free, headroom, last_oom,
    snapshots (whether the rank writes snapshots on request), oom_files (whether it writes its
    snapshot at an OOM, its own or another rank's).
    """
    stats = sample.stats
    nvml = sample.nvml
    out: dict[str, Any] = {  # Any: JSON values
        "rank": who.rank,
        "local_rank": who.local_rank,
        "host": who.host,
        "pid": who.pid,
        **allocator,
        "time": round(now, 3),
        "sample_time": round(float(sample.time), 3),
        "interval": float(interval),
        "state": short_text(sample.state, 20),
        "source": short_text(sample.source_label, 60),
        "demo": bool(sample.demo),
        "alloc_retries": int(stats.num_alloc_retries) if stats is not None else 0,
        "total": _total(sample),
        "device_free": int(nvml.free) if nvml is not None and nvml.free is not None else None,
        "last_oom": last_oom,
        "snapshots": bool(snapshots),
        "oom_files": bool(oom_files),
    }
    if stats is not None:  # the counter is read every tick; the map only now and then
        out["ooms"] = max(int(out.get("ooms", 0)), int(stats.num_ooms))
    if sample.errors:
        out["error"] = short_text(sample.errors[-1], 120)
    out["headroom"] = headroom(out)
    return out
