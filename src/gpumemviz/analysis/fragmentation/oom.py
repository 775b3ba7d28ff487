"""Why an allocation failed, judged from the snapshot taken at the failure.

A pure function of the torch segment dicts, cheap enough for the user's allocating thread (the
OOM observer runs there): the fragmentation report's dict path (one walk over the segments, no
Snapshot built) and its `can_fit`, so the verdict follows the allocator's own rules: a request
is served only from its own stream's small or large pool. The sources (in `gpumemviz.live`, the
layer above) build an `OomEvent` of the raw facts (reading the ``oom`` trace entry's request
size and stream, `gpumemviz.live.sources.oom`) and judge it once with `classify_event`, where
the failure happens (`gpumemviz.live.sources.oom.judge`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from gpumemviz.analysis.fragmentation.columns import from_torch
from gpumemviz.analysis.fragmentation.fit import FitAnswer
from gpumemviz.analysis.fragmentation.report import FragmentationReport
from gpumemviz.snapshot import SnapshotError
from gpumemviz.snapshot.escaping import error_line
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:  # the event type only; a source's OomEvent is judged, never built, here
    from gpumemviz.snapshot.sample import OomEvent
    from gpumemviz.snapshot.schema import JsonDict, TorchMapping

__all__ = ["CAUSES", "OUTSIDE_SHARE", "classify_event", "classify_oom"]

OUTSIDE_SHARE = 0.2  # "memory outside PyTorch" when it exceeds this share of the device
CAUSES = ("capacity", "fragmentation", "outside", "unknown")


def classify_oom(
    segments: Iterable[TorchMapping],
    device: int,
    *,
    alloc_size: int,
    device_total: int,
    device_free: int,
    request_size: int | None = None,
    stream: int | None = None,
    settings: TorchMapping | None = None,
) -> JsonDict:
    """Why an allocation failed: capacity, fragmentation, memory outside PyTorch, or unknown.

    Judged on the segment state taken inside the OOM observer, that is after the allocator
    released every fully free cached segment, by the rules of
    `FragmentationReport.can_fit`: only free blocks of the request's own stream and pool (small
    iff the rounded request is <= 1 MiB, default pool) can serve it, under the max_split_size
    rules. "fragmentation": that pool holds enough free bytes, but no block it may use;
    "capacity": it does not (free memory elsewhere is named); "unknown": the segments cannot
    be read, the answer depends on a stream that is not known, or the snapshot says the request
    would succeed (memory freed after the failure). When the device reports room for the new
    memory the request needs, a per-process memory limit refused it, and the sentence says so.

    Parameters
    ----------
    segments : iterable of dict
        The torch segment dicts (``snapshot["segments"]``); other devices' are ignored.
    device : int
        The device that failed.
    alloc_size : int
        The segment size torch tried (the observer's ``alloc``).
    device_total, device_free : int
        The device's total memory (0 if unknown) and what the driver had free.
    request_size : int, optional
        The rounded request (from the ``oom`` trace entry, see
        `gpumemviz.live.sources.oom.oom_request_size`); without it
        ``alloc_size`` is judged.
    stream : int, optional
        The raw stream of the request (the ``oom`` entry's, see
        `gpumemviz.live.sources.oom.oom_stream`). Without it every
        stream holding a segment on the device is tried, and a disagreement is "unknown".
    settings : dict, optional
        The snapshot's ``allocator_settings`` (roundup divisions, max_split_size).

    Returns
    -------
    dict
        ``cause`` (one of `CAUSES`), ``explanation`` (one sentence) and the device's figures:
        reserved, allocated, free_in_segments, largest_free_block (over all streams and pools),
        outside_bytes.

    Examples
    --------
    >>> MiB = 1 << 20
    >>> free, used = {"size": 10 * MiB, "state": "inactive"}, {"size": 10 * MiB,
    ...                                                         "state": "active_allocated"}
    >>> seg = {"device": 0, "total_size": 40 * MiB, "blocks": [free, used, free, used]}
    >>> classify_oom([seg], 0, alloc_size=16 * MiB, device_total=48 * MiB,
    ...              device_free=2 * MiB)["cause"]
    'fragmentation'
    >>> small = {"device": 0, "total_size": 2 * MiB, "segment_type": "small",
    ...          "blocks": [{"size": MiB, "state": "inactive"}, {"size": MiB, "state": "x"}]}
    >>> classify_oom([small], 0, alloc_size=20 * MiB, device_total=48 * MiB, device_free=0,
    ...              request_size=512 * 1024)["cause"]  # a block state torch never writes
    'unknown'
    """
    need = int(request_size) if request_size else int(alloc_size)
    basis = (
        f"the request of {format_size(need)}"
        if request_size
        else f"the {format_size(need)} segment torch tried (request size unknown without history)"
    )
    facts: JsonDict = {
        "reserved": 0,
        "allocated": 0,
        "free_in_segments": 0,
        "largest_free_block": 0,
        "outside_bytes": 0,
    }
    try:
        report = _report(segments, settings)
    except (SnapshotError, ValueError) as e:
        why = error_line(e)
        return _verdict("unknown", f"the segments at the OOM could not be read: {why}", facts)
    figures = report.devices.get(device)
    if figures is not None:
        facts.update(
            reserved=figures.reserved,
            allocated=figures.allocated,
            free_in_segments=figures.free,
            largest_free_block=figures.largest_free,
        )
    reserved = facts["reserved"]
    outside = max(0, int(device_total) - int(device_free) - reserved)
    facts["outside_bytes"] = outside
    if device_total and outside >= need and outside > OUTSIDE_SHARE * device_total:
        return _verdict(
            "outside",
            f"{format_size(outside)} of the device is used outside PyTorch's allocator (other "
            f"processes, NCCL, the CUDA context): without it {basis} would fit",
            facts,
        )
    room = max(0, int(device_free))
    if device_total:  # the allocator cannot map more than the device holds beside `reserved`
        room = min(room, max(0, int(device_total) - reserved))
    if figures is None:
        return _verdict(
            "capacity",
            f"nothing is reserved on device {device}: {basis} needs new memory and "
            + (
                f"the device reports {format_size(room)} free, so a per-process memory limit "
                "refused it"
                if need <= room
                else f"the device has only {format_size(room)} free"
            ),
            facts,
        )
    if stream is not None:
        streams = [int(stream)]
    else:
        c = report.per_segment
        streams = sorted({0, *(int(s) for s in c.stream[c.device == device])})
    judged = [_judge(report, device, s, need, room, basis) for s in streams]
    causes = {cause for cause, _ in judged}
    if len(causes) == 1:
        cause, explanation = judged[0]
        return _verdict(cause, explanation, facts)
    each = "; ".join(
        f"{'it would succeed' if cause == 'unknown' else cause} on stream {s}"
        for s, (cause, _) in zip(streams, judged, strict=True)
    )
    return _verdict(
        "unknown",
        f"the failed request's stream is not recorded and the answer depends on it: {each}",
        facts,
    )


def classify_event(event: OomEvent) -> OomEvent:
    """The event with the verdict of `classify_oom` on the facts it carries.

    Fills in ``cause``, ``explanation``, ``reserved``, ``allocated``, ``free_in_segments``,
    ``largest_free_block`` and ``outside_bytes``, judged on the event's snapshot (its segments
    and ``allocator_settings``) with its sizes, ``device_total``, ``request_size`` and
    ``stream``. Without a snapshot the cause is "unknown" and the explanation says why.

    Parameters
    ----------
    event : OomEvent
        As a source built it at the failure.

    Returns
    -------
    OomEvent
        A copy with the verdict (the event itself is frozen).

    Examples
    --------
    >>> from gpumemviz.snapshot.sample import OomEvent
    >>> MiB = 1 << 20
    >>> full = {"device": 0, "total_size": 60 * MiB,
    ...         "blocks": [{"size": 60 * MiB, "state": "active_allocated"}]}
    >>> raw = OomEvent(time=0.0, device=0, alloc_size=20 * MiB, device_limit=64 * MiB,
    ...                device_free=2 * MiB, device_total=64 * MiB, snapshot={"segments": [full]})
    >>> raw.cause, classify_event(raw).cause
    ('unknown', 'capacity')
    """
    snapshot = event.snapshot
    if snapshot is None:
        facts: JsonDict = {
            "cause": "unknown",
            "explanation": f"no snapshot at the OOM: {event.snapshot_error}",
        }
    else:
        facts = classify_oom(
            snapshot.get("segments", ()),
            event.device,
            alloc_size=event.alloc_size,
            device_total=event.device_total,
            device_free=event.device_free,
            request_size=event.request_size,
            stream=event.stream,
            settings=snapshot.get("allocator_settings"),
        )
    return dataclasses.replace(event, **facts)


def _report(segments: Iterable[TorchMapping], settings: object) -> FragmentationReport:
    """The fragmentation report of the segments; hand-made ones without addresses get some."""
    segs = segments if isinstance(segments, list) else list(segments)
    if any(isinstance(seg, Mapping) and "address" not in seg for seg in segs):
        at, filled = 0, []
        for seg in segs:
            if isinstance(seg, Mapping) and "address" not in seg:
                seg = {**seg, "address": at}
            if isinstance(seg, Mapping):
                size = seg.get("total_size")
                at += size if isinstance(size, int) and size > 0 else 0
            filled.append(seg)
        segs = filled
    return from_torch({"segments": segs, "allocator_settings": settings})  # as fragmentation()


def _judge(
    report: FragmentationReport, device: int, stream: int, need: int, room: int, basis: str
) -> tuple[str, str]:
    """The cause on one stream, by `can_fit` and the free bytes of the request's own pool."""
    fit: FitAnswer = report.can_fit(need, stream=stream, device=device, device_free=room)
    where = f"stream {stream}'s {fit.pool} pool" if stream else f"the {fit.pool} pool"
    if fit.verdict == "cached":
        return "unknown", _succeeds(
            basis,
            f"the free block at 0x{fit.block_address:x} ({format_size(fit.block_size or 0)}) "
            f"of {where} fits it",
        )
    if fit.verdict == "flush_and_retry":  # the observer runs after that flush: something changed
        return "unknown", _succeeds(
            basis, f"the allocator's own flush of {format_size(fit.releasable)} makes room"
        )
    if fit.verdict == "garbage_collect":  # the collection runs before any new memory is asked for
        return "unknown", _succeeds(
            basis, "the allocator's garbage collection of unused segments makes room"
        )
    # out_of_memory, or new_segment: the device had room, yet the allocator failed, so a
    # per-process limit (set_per_process_memory_fraction) refused the new memory
    limit = (
        f"; the device reported {format_size(room)} free, enough for the "
        f"{format_size(fit.new_bytes)} of new memory it needs, so a per-process memory limit "
        "refused that"
        if fit.verdict == "new_segment"
        else ""
    )
    c = report.per_segment
    mine = (
        (c.device == device)
        & (c.stream == stream)
        & (c.is_small == (fit.pool == "small"))
        & (c.pool_id[:, 0] == 0)
        & (c.pool_id[:, 1] == 0)
    )
    pool_free = int(c.free[mine].sum())
    pool_largest = int(c.largest_free[mine].max()) if mine.any() else 0
    figures = report.devices[device]
    if pool_free >= fit.rounded:
        why = (
            f"its largest free block ({format_size(pool_largest)}) is refused by the "
            "max_split_size rules"
            if pool_largest >= fit.rounded
            else f"its largest free block is {format_size(pool_largest)}"
        )
        return (
            "fragmentation",
            f"{format_size(pool_free)} is free in {where} but no block there can serve "
            f"{basis}: {why}{limit}",
        )
    elsewhere = figures.free - pool_free
    other = (
        f"; the other {format_size(elsewhere)} free in cached blocks (largest "
        f"{format_size(figures.largest_free)}) belongs to other pools or streams, which this "
        "request cannot use"
        if elsewhere > 0
        else ""
    )
    return (
        "capacity",
        f"{format_size(figures.allocated)} is allocated of {format_size(figures.reserved)} "
        f"reserved with {format_size(room)} left on the device and "
        f"{format_size(pool_free)} free in {where}: {basis} does not fit{other}{limit}",
    )


def _succeeds(basis: str, detail: str) -> str:
    return (
        f"the snapshot at the failure says {basis} would succeed ({detail}): memory was freed "
        "after the failure, before the snapshot was taken"
    )


def _verdict(cause: str, explanation: str, facts: JsonDict) -> JsonDict:
    return {"cause": cause, "explanation": explanation, **facts}
