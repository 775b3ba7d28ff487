"""An OOM as a source sees it: the failed request as torch recorded it (the newest ``oom`` trace
entry of a device, read from the snapshot taken at the failure), and the verdict on why it
failed, given where it happens (`judge`: `gpumemviz.analysis.fragmentation.oom.classify_event`,
once per failure, in the thread that ran out of memory).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpumemviz.analysis.fragmentation.oom import classify_event
from gpumemviz.live.sources.base import short_error

if TYPE_CHECKING:
    from gpumemviz.snapshot.sample import OomEvent
    from gpumemviz.snapshot.schema import TorchMapping

__all__ = ["judge", "oom_request_size", "oom_stream"]


def judge(event: OomEvent) -> OomEvent:
    """The event with the analysis layer's verdict (`classify_event`); never raises.

    Sources call it once per failure, where the OOM happens (torch's observer in the user's
    allocating thread, the simulator's stepping thread), before any handler sees the event. A
    verdict that fails leaves the raw facts, with ``cause`` "unknown" and an ``explanation``
    saying why: an OOM handler must never raise into the user's loop.

    Examples
    --------
    >>> from gpumemviz.snapshot.sample import OomEvent
    >>> MiB = 1 << 20
    >>> full = {"device": 0, "total_size": 60 * MiB,
    ...         "blocks": [{"size": 60 * MiB, "state": "active_allocated"}]}
    >>> raw = OomEvent(time=0.0, device=0, alloc_size=20 * MiB, device_limit=64 * MiB,
    ...                device_free=2 * MiB, device_total=64 * MiB, snapshot={"segments": [full]})
    >>> judge(raw).cause
    'capacity'
    >>> broken = dataclasses.replace(raw, snapshot={"segments": None})
    >>> judge(broken).cause, judge(broken).explanation
    ('unknown', "not classified: TypeError: 'NoneType' object is not iterable")
    """
    try:
        return classify_event(event)
    except Exception as exc:
        return dataclasses.replace(
            event, cause="unknown", explanation=f"not classified: {short_error(exc)}"
        )


def _newest_oom(snapshot: TorchMapping | None, device: int) -> TorchMapping | None:
    """The newest ``oom`` trace entry of that device, if recorded.

    Inside the observer that entry is the newest one (other threads may add a few after it).
    """
    if not snapshot:
        return None
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return None
    entry: TorchMapping
    for entry in reversed(traces[device][-256:]):
        if entry.get("action") == "oom":
            return entry
    return None


def oom_request_size(snapshot: TorchMapping | None, device: int) -> int | None:
    """The rounded request from the ``oom`` trace entry of that device, if recorded."""
    entry = _newest_oom(snapshot, device)
    return None if entry is None else int(entry.get("size", 0)) or None


def oom_stream(snapshot: TorchMapping | None, device: int) -> int | None:
    """The raw stream of the newest ``oom`` trace entry of that device, if recorded."""
    entry = _newest_oom(snapshot, device)
    s = None if entry is None else entry.get("stream")
    return int(s) if isinstance(s, int) else None
