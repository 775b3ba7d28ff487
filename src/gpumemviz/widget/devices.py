"""Every device one panel shows: a sampler per device, each one's newest strip, and a replay's
devices moved together.

The panel draws one selected device in full (it follows that device's sampler as a one-device
panel does); this set listens to all of them and keeps each device's strip summary
(gpumemviz.render.strips), which the panel sends as its ``strips`` trait. For a replay (one
`PlaybackSource` per traced device), `follow` moves the other devices to the selected one's
position: to the entry at or before its recorded time when the traces carry ``time_us``, else
to the same share of their own entries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

import numpy as np

from gpumemviz.analysis.findings import analyze
from gpumemviz.render.rows import build_rows
from gpumemviz.render.strips import Summary, device_summary, strip_set
from gpumemviz.render.timeline import entry_at_time
from gpumemviz.widget.panel_state import source_times

if TYPE_CHECKING:
    from gpumemviz.analysis.findings import Findings
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.base import TimeTravelSource
    from gpumemviz.snapshot import Snapshot
    from gpumemviz.snapshot.sample import Sample

__all__ = ["BY_SHARE", "BY_TIME", "DeviceSet", "recorded_ooms"]

BY_TIME = "replay: every device at the same recorded time (the traces' time_us)"
BY_SHARE = (
    "replay: the traces carry no recorded times; each device moves by its own entry count "
    "(the same share of its entries)"
)


class DeviceSet:
    """The samplers of the devices one panel shows, in device order.

    Parameters
    ----------
    samplers : mapping of int to Sampler
        One per device.
    owned : bool
        Made for this panel alone: closed with it.

    Examples
    --------
    >>> from gpumemviz.live.sampler import Sampler
    >>> from gpumemviz.live.sources.simulated import SimulatedSource
    >>> ds = DeviceSet({d: Sampler(SimulatedSource(device=d, autostart=False))
    ...                 for d in (1, 0)}, owned=True)
    >>> ds.devices
    (0, 1)
    >>> ds.offer(1, ds.samplers[1].sample_once()), ds.update()
    (True, True)
    >>> [s["device"] for s in ds.payload(selected=1)["strips"]]
    [0, 1]
    >>> ds.close()
    """

    def __init__(self, samplers: Mapping[int, Sampler], *, owned: bool) -> None:
        if not samplers:
            raise ValueError("a device set needs at least one device")
        self.samplers = dict(sorted(samplers.items()))
        self.owned = owned
        self.summaries: dict[int, Summary] = {}
        #: each strip's segment state, the one moment its figures are read from
        self.shown: dict[int, Snapshot] = {}
        #: each device's `gpumemviz.analyze` findings of that state (live: unchecked)
        self.findings: dict[int, Findings] = {}
        self._newest: dict[int, Sample] = {}
        self._lock = threading.Lock()
        self._listeners: dict[int, Callable[[Sample], None]] = {}
        self._times: dict[int, np.ndarray | None] = {}
        self.following = False  # a replay the user moved: the others follow the selected one

    @property
    def devices(self) -> tuple[int, ...]:
        """The device indices, ascending."""
        return tuple(self.samplers)

    @property
    def replay(self) -> bool:
        """Whether every source is a recording played back (time travel)."""
        return all(
            "time_travel" in getattr(s.source, "capabilities", ()) for s in self.samplers.values()
        )

    def note(self) -> str:
        """The line under the strips: how a replay's devices move together ("" when live)."""
        if not self.replay:
            return ""
        return BY_TIME if all(self._times_of(d) is not None for d in self.devices) else BY_SHARE

    def listen(self, on_sample: Callable[[int, Sample], None]) -> None:
        """Call ``on_sample(device, sample)`` for every sample of every device (sampler threads)."""
        for d, sampler in self.samplers.items():
            fn = _bound(on_sample, d)
            self._listeners[d] = fn
            sampler.add_listener(fn)
            newest = sampler.history.latest_segments()
            if newest is not None:
                fn(newest)

    def offer(self, device: int, sample: Sample) -> bool:
        """Keep the newest sample of ``device``; True when none was waiting (draw one then)."""
        with self._lock:
            first = not self._newest
            self._newest[device] = sample
        return first

    def update(self) -> bool:
        """Turn the waiting samples into summaries (the panel's writer thread); True when a
        strip changed."""
        with self._lock:
            waiting, self._newest = self._newest, {}
        changed = False
        for d, sample in waiting.items():
            old = self.summaries.get(d)
            stats = sample.stats
            before = int(cast("int", old["ooms"])) if old else 0
            ooms = int(stats.num_ooms) if stats is not None else before
            if sample.segments is not None:
                rows = build_rows(sample.segments, device=d)
                new: Summary = device_summary(rows, device=d, ooms=ooms)
                self.shown[d] = sample.segments
                if not self.replay:  # a replay's findings are the file's (the panel's)
                    self.findings[d] = analyze(sample, device=d, check=False)
            elif old is not None:
                # a stats-only tick: the strip's figures stay those of its segments (one
                # moment); only the OOM count moves
                new = {**old, "ooms": ooms}
            else:
                continue
            if new != old:
                self.summaries[d] = new
                changed = True
        return changed

    def payload(self, selected: int | None) -> dict[str, object]:
        """The ``strips`` trait: a strip per device (a device not read yet: zeros, no bins)."""
        summaries = [self.summaries.get(d) or _empty(d) for d in self.devices]
        index = self.devices.index(selected) if selected in self.samplers else None
        return strip_set(summaries, selected=index, note=self.note())

    def follow(self, leader: int) -> None:
        """Move every other replayed device to the ``leader``'s position (see the module)."""
        if not self.replay or leader not in self.samplers:
            return
        lead = cast("TimeTravelSource", self.samplers[leader].source)
        pos, times = int(lead.position), self._times_of(leader)
        at = int(times[pos]) if times is not None and 0 <= pos < len(times) else None
        for d, sampler in self.samplers.items():
            if d == leader:
                continue
            src = cast("TimeTravelSource", sampler.source)
            own = self._times_of(d)
            if at is not None and own is not None:
                target = entry_at_time(own, at)
            elif pos < 0 or lead.n == 0:
                target = -1
            else:
                target = round((pos + 1) / lead.n * src.n) - 1
            target = max(-1, min(int(src.n) - 1, target))
            if target != int(src.position):
                src.seek(target)
                sampler.sample_once(segments=True)

    def _times_of(self, device: int) -> np.ndarray | None:
        if device not in self._times:
            self._times[device] = source_times(self.samplers[device].source)
        return self._times[device]

    def close(self) -> None:
        """Stop listening; close the samplers when owned."""
        for d, fn in self._listeners.items():
            self.samplers[d].remove_listener(fn)
        self._listeners.clear()
        if self.owned:
            for sampler in self.samplers.values():
                sampler.close()


def _bound(on_sample: Callable[[int, Sample], None], device: int) -> Callable[[Sample], None]:
    def listener(sample: Sample) -> None:
        on_sample(device, sample)

    return listener


def _empty(device: int) -> Summary:
    return {"device": device, "reserved": 0, "allocated": 0, "free": 0, "ooms": 0, "bins": []}


def recorded_ooms(sampler: Sampler) -> int:
    """OOMs a sampler's source recorded (a replay: in its whole trace) or has seen so far."""
    columns = getattr(sampler.source, "columns", None)
    if columns is not None:  # a file's trace, as columns: no dict per entry built
        names = columns.action_names
        return int(np.count_nonzero(columns.action == names.index("oom"))) if "oom" in names else 0
    raw = getattr(sampler.source, "raw", None)
    if isinstance(raw, dict):
        traces = raw.get("device_traces") or []
        d = int(getattr(sampler.source, "device", 0))
        trace = traces[d] if d < len(traces) else []
        return sum(1 for e in trace if isinstance(e, dict) and e.get("action") == "oom")
    newest = sampler.history.latest()
    return int(newest.stats.num_ooms) if newest is not None and newest.stats else 0
