"""The failed request as torch recorded it: the newest ``oom`` trace entry of a device, read from
the snapshot taken at the failure. Why it failed is
`gpumemviz.analysis.fragmentation.oom.classify_oom`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchMapping

__all__ = ["oom_request_size", "oom_stream"]


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
