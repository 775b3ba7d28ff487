"""Why an allocation failed, judged from the snapshot taken at the failure.

A pure function of the torch snapshot dict, cheap enough for the user's allocating thread (the
OOM observer runs there): one walk over the device's segments, no Snapshot built. Shared by the
torch.cuda source and the simulated one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpumemviz.units import format_size

__all__ = ["OUTSIDE_SHARE", "classify_oom", "oom_request_size"]

OUTSIDE_SHARE = 0.2  # "memory outside PyTorch" when it exceeds this share of the device


def classify_oom(
    segments: Iterable[Mapping[str, Any]],
    device: int,
    *,
    alloc_size: int,
    device_total: int,
    device_free: int,
    request_size: int | None = None,
) -> dict[str, Any]:
    """Why an allocation failed: capacity, fragmentation, or memory outside PyTorch.

    Judged on the segment state taken inside the OOM observer, that is after the allocator
    released every fully free cached segment. ``alloc_size`` is the segment size torch tried;
    ``request_size`` (the rounded request from the ``oom`` trace entry) is used when known.

    Returns
    -------
    dict
        ``cause`` ("capacity" | "fragmentation" | "outside"), ``explanation`` (one sentence) and
        the figures: reserved, allocated, free_in_segments, largest_free_block, outside_bytes.

    Examples
    --------
    >>> MiB = 1 << 20
    >>> free, used = {"size": 10 * MiB, "state": "inactive"}, {"size": 10 * MiB, "state": "x"}
    >>> seg = {"device": 0, "total_size": 40 * MiB, "allocated_size": 20 * MiB,
    ...        "blocks": [free, used, free, used]}
    >>> classify_oom([seg], 0, alloc_size=16 * MiB, device_total=48 * MiB,
    ...              device_free=2 * MiB)["cause"]
    'fragmentation'
    """
    reserved = allocated = free = largest = 0
    for seg in segments:
        if seg.get("device", device) != device:
            continue
        reserved += int(seg.get("total_size", 0))
        allocated += int(seg.get("allocated_size", 0))
        for blk in seg.get("blocks", ()):
            if blk.get("state") == "inactive":
                size = int(blk.get("size", 0))
                free += size
                largest = max(largest, size)
    need = int(request_size) if request_size else int(alloc_size)
    outside = max(0, int(device_total) - int(device_free) - reserved)
    basis = (
        f"the request of {format_size(need)}"
        if request_size
        else f"the {format_size(need)} segment torch tried (request size unknown without history)"
    )
    if device_total and outside >= need and outside > OUTSIDE_SHARE * device_total:
        cause = "outside"
        explanation = (
            f"{format_size(outside)} of the device is used outside PyTorch's allocator (other "
            f"processes, NCCL, the CUDA context): without it {basis} would fit"
        )
    elif free >= need and largest < need:
        cause = "fragmentation"
        explanation = (
            f"{format_size(free)} is free inside reserved segments but the largest free block is "
            f"{format_size(largest)}, smaller than {basis}"
        )
    else:
        cause = "capacity"
        explanation = (
            f"{format_size(allocated)} is allocated of {format_size(reserved)} reserved with "
            f"{format_size(int(device_free))} left on the device: {basis} does not fit"
        )
    return {
        "cause": cause,
        "explanation": explanation,
        "reserved": reserved,
        "allocated": allocated,
        "free_in_segments": free,
        "largest_free_block": largest,
        "outside_bytes": outside,
    }


def oom_request_size(snapshot: Mapping[str, Any] | None, device: int) -> int | None:
    """The rounded request from the ``oom`` trace entry of that device, if recorded.

    Inside the observer that entry is the newest one (other threads may add a few after it).
    """
    if not snapshot:
        return None
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return None
    for entry in reversed(traces[device][-256:]):
        if entry.get("action") == "oom":
            return int(entry.get("size", 0)) or None
    return None
