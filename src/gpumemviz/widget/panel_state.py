"""What the panel's traits hold, computed from the panel: the ``controls`` dict (what the
buttons can do now), the header numbers taken from the fragmentation report, the OOM verdict
as plain values. Kept apart from widget/panel.py so the panel class holds only its methods."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

from gpumemviz.render.timeline import annotation_marks, recorded_points, trace_times

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from gpumemviz.analysis.findings import Findings, OomFinding
    from gpumemviz.analysis.fragmentation import FragmentationReport
    from gpumemviz.analysis.holders import HolderRow
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.base import TimeTravelSource
    from gpumemviz.render.timeline import Mark, Point
    from gpumemviz.snapshot import Snapshot
    from gpumemviz.snapshot.schema import JsonDict

__all__ = [
    "controls_state",
    "holders_of",
    "oom_trait",
    "plain",
    "recorded_timeline",
    "report_numbers",
    "source_times",
]


class _Panel(Protocol):
    """What `controls_state` reads of a MemoryPanel."""

    @property
    def sampler(self) -> Sampler | None: ...
    @property
    def subshell(self) -> str | None: ...
    @property
    def owns_sampler(self) -> bool: ...
    @property
    def shown_devices(self) -> tuple[int, ...]: ...
    def replay_times(self) -> np.ndarray | None: ...
    def devices(self) -> list[int]: ...


def controls_state(panel: _Panel, device: int | None) -> JsonDict:
    """The ``controls`` trait: {live, capabilities, paused, interval, routing, replay,
    can_reset_peaks, devices, device} (docs/internals.md, the wire)."""
    sampler = panel.sampler
    source = sampler.source if sampler is not None else None
    replay: JsonDict | None = None
    if source is not None and "time_travel" in getattr(source, "capabilities", ()):
        source = cast("TimeTravelSource", source)
        pos = int(source.position)
        replay = {"n": int(source.n), "position": pos, "times": False}
        times = panel.replay_times()
        if times is not None and len(times):
            replay.update(
                times=True,
                t_first=int(times[0]),
                t_last=int(times[-1]),
                time_us=int(times[pos]) if 0 <= pos < len(times) else None,
            )
    switcher = sampler is not None and not panel.owns_sampler and len(panel.shown_devices) < 2
    return {
        "live": sampler is not None,
        "capabilities": sorted(getattr(source, "capabilities", ()) or ()),
        "paused": bool(sampler.paused) if sampler is not None else False,
        "interval": float(sampler.interval) if sampler is not None else None,
        "routing": "subshell" if panel.subshell else "main",
        "replay": replay,
        "can_reset_peaks": callable(getattr(source, "reset_peaks", None)),
        # the switcher follows one shared sampler; a panel of strips switches by a click
        "devices": panel.devices() if switcher else [],
        "device": device,
    }


def holders_of(
    found: Findings, shown: Snapshot | None, entry: int | None = None, last: int | None = None
) -> tuple[Snapshot, dict[str, list[HolderRow]]] | None:
    """Who holds the memory shown, along every holder key, and the state the rows' blocks
    index: the findings' own holders (`Findings.holders`) where the state shown is theirs; a
    replay shown at `entry` before its `last` entry: `shown` grouped with the file's trace up
    to that entry (what `Findings.holders(at=entry)` answers, without replaying it again).
    None: nothing to group."""
    from gpumemviz.analysis.holders import HOLDER_KEYS, holder_rows

    snap = found.snapshot
    if snap is None:
        return None
    if entry is None or entry == last:
        return snap, {by: found.holders(by) for by in HOLDER_KEYS}
    if shown is None:
        return None
    device = found.device
    rows = {
        by: holder_rows(shown, by, device=device, traces=snap.traces, upto=entry)
        for by in HOLDER_KEYS
    }
    return shown, rows


def plain(entry: JsonDict) -> JsonDict:
    """JSON-safe copy of a command's reply (dict keys as strings).

    >>> plain({"released": {0: 5}, "ok": True})
    {'released': {'0': 5}, 'ok': True}
    """
    out = {}
    for k, v in entry.items():
        out[k] = {str(a): b for a, b in v.items()} if isinstance(v, dict) else v
    return out


def report_numbers(report: FragmentationReport, device: int | None) -> dict[str, int]:
    """Header numbers taken from the fragmentation report rather than from the painted rows:
    free_stuck (what empty_cache leaves free) and free_releasable (what it returns) count
    pending frees as empty_cache does, after syncing them, so the two add up to free plus
    pending, and the panel and ``gpumemviz inspect`` say the same."""
    figs = report.total if device is None else report.devices.get(device)
    if figs is None:
        return {"free_stuck": 0, "free_releasable": 0}
    return {"free_stuck": figs.free_stuck, "free_releasable": figs.releasable}


def oom_trait(oom: OomFinding) -> JsonDict:
    """The ``oom`` trait: `gpumemviz.analyze`'s verdict as plain values (they travel as
    JSON), with ``alloc_size`` (the size the header names: the segment torch tried, else the
    rounded request) and ``device_free`` as numbers (0 when unknown)."""
    out = oom.to_dict()
    out["alloc_size"] = int(oom.alloc_size or oom.rounded or 0)
    out["device_free"] = int(oom.device_free or 0)
    out["time"] = float(oom.time or 0.0)
    return out


def recorded_timeline(played: TimeTravelSource) -> tuple[list[Point], list[Mark]]:
    """A played-back recording's timeline: the recorded run itself (times from the trace,
    allocated and reserved per entry) and its ``external_annotations`` as markers."""
    device, replayed = int(played.device), played.recording
    points = recorded_points(_trace_of(played), replayed.allocated, replayed.reserved)
    return points, annotation_marks(played.external_annotations, device)


def _trace_of(played: TimeTravelSource) -> Sequence[object] | np.ndarray:
    """What `recorded_points` and `trace_times` read: the trace's ``time_us`` column when the
    source holds columns (opened from a file), else its entry dicts."""
    if played.columns is not None:
        return played.columns.time_us
    traces = played.raw.get("device_traces") or []
    device = int(played.device)
    return traces[device] if device < len(traces) else []


def source_times(source: object) -> np.ndarray | None:
    """A replayed source's entry times (`trace_times`), or None: not a replay, or a trace
    recorded without ``time_us`` (events only)."""
    columns = getattr(source, "columns", None)
    if columns is not None:  # a file's trace, as columns
        return trace_times(columns.time_us)
    raw = getattr(source, "raw", None)
    if not isinstance(raw, dict):
        return None
    traces = raw.get("device_traces") or []
    device = int(getattr(source, "device", 0))
    return trace_times(traces[device]) if device < len(traces) else None
