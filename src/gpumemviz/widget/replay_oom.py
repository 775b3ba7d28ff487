"""The OOM verdict of a replayed recording: the newest ``oom`` trace entry at or before the entry
shown, judged as a live OOM is (`gpumemviz.analysis.fragmentation.oom.classify_event`) on the
recorded segment state at that entry. A replay has no OOM observer, so without this its header said
"OOMs 0" and gave no verdict even when the recording holds the failure the user came for."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.analysis.fragmentation.oom import classify_event
from gpumemviz.snapshot.sample import OomEvent

if TYPE_CHECKING:
    from gpumemviz.live.sources.base import TimeTravelSource
    from gpumemviz.snapshot.schema import TorchDict

__all__ = ["ReplayedOoms"]


class ReplayedOoms:
    """Verdicts of one replayed device's recorded OOMs, each judged once.

    Examples
    --------
    >>> from gpumemviz.live.sources.playback import PlaybackSource
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "large", "blocks": [{"address": 0, "size": 2 << 20,
    ...        "requested_size": 2 << 20, "state": "active_allocated"}]}
    >>> trace = [{"action": "oom", "size": 4 << 20, "stream": 0, "device_free": 0}]
    >>> src = PlaybackSource({"segments": [seg], "device_traces": [trace]}, loop=False)
    >>> src.seek(0); ReplayedOoms(src).at_position().cause
    'capacity'
    >>> src.seek(-1); ReplayedOoms(src).at_position() is None
    True
    """

    def __init__(self, played: TimeTravelSource) -> None:
        self.played = played
        columns = played.columns
        if columns is not None:  # a file's trace: its oom entries found in the action column
            code = columns.action_names.index("oom")
            self._at = np.flatnonzero(columns.action == code).tolist()
            self._entry: Callable[[int], TorchDict] = columns.entry
        else:
            traces = played.raw.get("device_traces") or []
            d = int(played.device)
            trace = traces[d] if d < len(traces) else []
            self._at = [
                i for i, e in enumerate(trace) if isinstance(e, dict) and e.get("action") == "oom"
            ]
            self._entry = trace.__getitem__
        self._judged: dict[int, OomEvent] = {}

    def at_position(self) -> OomEvent | None:
        """The newest recorded OOM at or before the entry shown, with its verdict; None
        before the first."""
        pos = int(self.played.position)
        seen = [i for i in self._at if i <= pos]
        if not seen:
            return None
        i = seen[-1]
        if i not in self._judged:
            self._judged[i] = self._judge(i)
        return self._judged[i]

    def _judge(self, i: int) -> OomEvent:
        e = self._entry(i)
        rec = self.played.recording
        # `snapshot_at(i)`'s segments, without its copy of the trace up to i (a dict per entry)
        segments = rec.layout_at(i).to_segments(rec.device, shared=True, frames=rec.frames_after(i))
        reserved = sum(int(s.get("total_size", 0)) for s in segments)
        free = max(0, int(e.get("device_free", 0) or 0))
        size = int(e.get("size", 0) or 0)
        stamp = e.get("time_us")
        stream = e.get("stream")
        raw = OomEvent(
            time=stamp / 1e6 if isinstance(stamp, (int, float)) and stamp > 0 else 0.0,
            device=int(self.played.device),
            alloc_size=size,
            device_limit=reserved + free,
            device_free=free,
            request_size=size or None,
            snapshot={
                "segments": segments,
                "allocator_settings": self.played.allocator_settings,
            },
            device_total=reserved + free,
            stream=stream if isinstance(stream, int) else None,
        )
        return classify_event(raw)
