"""MemoryPanel: the notebook panel (anywidget) that draws the segment map of a Snapshot or Sample.

State lives in traits, bulk rows travel as binary frames (gpumemviz.render.wire), and every trait
write and frame send happens on the panel's `Writer` thread (gpumemviz.widget.writer): callers (a
cell, the sampler's listener, the browser's messages) only enqueue. The front end is the built
bundle itself (`_esm` and `_css` are paths from gpumemviz.reporting.bundles), so anywidget's hot
reload (``ANYWIDGET_HMR=1``) follows a rebuild during development.

The module stays whole (about 850 lines, a third of them docstrings): it is the one class
whose methods all read and write the same traits, wire and writer queue, its browser messages
included (docs/internals.md, the wire: Browser -> Python); the pieces it uses without reaching
into it live in their own modules: writer thread, kernel subshells, trait values
(panel_state.py), the advice throttle (advising.py), the devices of a several-device panel
(devices.py). What the header's advice and OOM lines say is `gpumemviz.analyze`'s: the panel
composes no analysis of its own (widget/advising.py throttles it and checks advice off the
kernel's thread).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import anywidget
import numpy as np
import traitlets

from gpumemviz.live.forecast import Forecaster
from gpumemviz.render.glance import glance_set
from gpumemviz.render.holders import holder_marks, holders_view
from gpumemviz.render.rows import build_rows
from gpumemviz.render.stacks import Stacks
from gpumemviz.render.strips import snapshot_strip_set
from gpumemviz.render.timeline import (
    TimelineData,
)
from gpumemviz.render.wire import Wire, header_numbers
from gpumemviz.reporting.bundles import bundle_path
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.units import parse_size
from gpumemviz.widget.advising import BackgroundCheck, FindingsThrottle, advice_rows
from gpumemviz.widget.cells import name_notebook_cells
from gpumemviz.widget.devices import DeviceSet, recorded_ooms
from gpumemviz.widget.panel_state import (
    controls_state,
    holders_of,
    oom_trait,
    plain,
    recorded_timeline,
    report_numbers,
    source_times,
)
from gpumemviz.widget.subshell import delete_subshell, route_to_main, route_to_subshell
from gpumemviz.widget.writer import Writer

if TYPE_CHECKING:
    from gpumemviz.analysis.findings import Findings
    from gpumemviz.analysis.fragmentation import FragmentationReport
    from gpumemviz.analysis.holders import HolderRow
    from gpumemviz.io import SnapshotLike
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.base import Source, TimeTravelSource
    from gpumemviz.render.timeline import Point
    from gpumemviz.render.wire_frame import Frame
    from gpumemviz.snapshot.sample import Sample
    from gpumemviz.snapshot.schema import JsonDict, TorchDict

    # what waits for the writer thread: a snapshot to show, or the newest sample
    _Item = tuple[Literal["snapshot"], Snapshot] | tuple[Literal["sample"], Sample]


__all__ = ["MemoryPanel", "live_panels"]

_PANELS: weakref.WeakSet[MemoryPanel] = weakref.WeakSet()  # live panels, for gpumemviz.mark


def live_panels() -> list[MemoryPanel]:
    """The panels not closed yet (``gpumemviz.mark`` marks each one's timeline)."""
    return list(_PANELS)


class MemoryPanel(anywidget.AnyWidget):
    """The live segment map: one row per reserved segment, coloured by block state.

    Shows a snapshot (`from_snapshot`, `show_snapshot`) or follows a sampler (`attach`, as
    `gpumemviz.monitor` does). Its writer thread draws (`flush` waits); errors go to `errors`.

    Parameters
    ----------
    device : int, optional
        Only this device's segments (default: the sample's device; a snapshot's all).
    title : str
        Shown in the header (a sample's device name replaces it).
    subshell : bool
        Clicks on a kernel subshell of the panel's own, so they act while a cell runs
        (ipykernel 7.4+); False: on the main shell, after the running cell.
    **kwargs
        Trait values, passed to anywidget.

    Examples
    --------
    >>> from gpumemviz.snapshot import Snapshot
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...     {"size": 2 << 20, "requested_size": 2 << 20, "state": "active_allocated"}]}
    >>> panel = MemoryPanel.from_snapshot(Snapshot.from_torch([seg]))
    >>> panel.flush()
    True
    >>> panel.map_layout["n_rows"], panel.header["allocated"]
    (1, 2097152)
    >>> panel.close()
    """

    # paths, not text: anywidget reads the files, and watches them under ANYWIDGET_HMR=1
    _esm = bundle_path("widget.js")
    _css = bundle_path("widget.css")

    map_layout = traitlets.Dict().tag(sync=True)
    """Row count and groups (device, pool, stream, first row, count) of the segment map."""
    header = traitlets.Dict().tag(sync=True)
    """Figures shown above the map, in bytes (reserved, allocated, free, largest free, ...)."""
    status = traitlets.Unicode("").tag(sync=True)
    """One line: what is shown, or why nothing is ("waiting for CUDA")."""
    title = traitlets.Unicode("").tag(sync=True)
    """Device name or file name."""
    demo = traitlets.Bool(False).tag(sync=True)
    """True when the data comes from a simulated source (shows the "demo data" badge)."""
    advice: traitlets.List[dict[str, object]] = traitlets.List().tag(sync=True)
    """`gpumemviz.analyze`'s advice for what is shown: [{kind, message, device, setting,
    checked}], most at stake first, then its notes (kind "note": "checking...", unchecked)."""
    oom = traitlets.Dict().tag(sync=True)
    """`gpumemviz.analyze`'s OOM (`OomFinding.to_dict()`: cause, explanation, sentence,
    actions, ...) plus alloc_size, device_free and time; {} when there is none."""
    controls = traitlets.Dict().tag(sync=True)
    """What the buttons can do now: {live, capabilities, paused, interval, routing, replay}."""
    glance = traitlets.Dict().tag(sync=True)
    """Each device at a glance (`gpumemviz.render.glance.glance_set`): a bar per device whose
    parts are its findings' figures, the largest free block and the last OOM's request."""
    strips = traitlets.Dict().tag(sync=True)
    """Every device shown as a strip (`gpumemviz.render.strips.strip_set`); {} for one device."""
    holders = traitlets.Dict().tag(sync=True)
    """Who holds the allocated bytes shown (`gpumemviz.render.holders.holders_view` of the
    findings' holders): every key's top rows and the rest; {} before any findings. A click on
    a row asks for its blocks (a ``holder_blocks`` message, answered with `holder_marks`)."""
    forecast = traitlets.Dict().tag(sync=True)
    """The live time to OOM (`gpumemviz.live.forecast.LiveForecast.to_dict`: the sentence, the
    seconds with their interval, the level, the limit and ``t_last``); {} when the trend is not
    clear, or for a replay or a fixed snapshot. The timeline draws it."""

    ADVICE_EVERY_S = 1.0  # advice re-reads the whole snapshot: at most once a second

    def __init__(
        self,
        *,
        device: int | None = None,
        title: str = "",
        subshell: bool = True,
        device_total: int | None = None,
        **kwargs: Any,  # Any: anywidget's own trait values, passed on
    ) -> None:
        super().__init__(title=title, **kwargs)
        self._device = device
        self._wire = Wire()
        self._writer = Writer(f"gpumemviz-panel-{self.model_id[:8]}")
        self._latest: _Item | None = None
        self._latest_lock = threading.Lock()
        self.wire_stats: dict[str, int] = {"frames": 0, "bytes": 0, "last_bytes": 0, "max_bytes": 0}
        self.sampler: Sampler | None = None
        self.shown: Snapshot | None = None  # the segment state drawn last
        self._shown_report: FragmentationReport | None = None  # its analysis ("would N fit?")
        self._shown_device: int | None = None
        self._device_free: int | None = None
        self._device_total = device_total  # from_snapshot(device_total=): what "fit" counts
        self.command_log: list[JsonDict] = []  # handled commands, newest last
        self.timeline = TimelineData()
        self._recorded = False  # the timeline holds a replayed run's own series (not samples)
        self._times_of: tuple[Source, np.ndarray | None] | None = None  # (source, its times)
        self._last_point: Point | None = None
        self._timeline_of: Sampler | None = None  # the sampler whose points the timeline holds
        self._forecaster = Forecaster()  # the live forecast's headroom and pace
        self._owns_sampler = False
        self._throttle = FindingsThrottle(
            lambda: self.ADVICE_EVERY_S, self._writer.submit, self._publish
        )
        self._check = BackgroundCheck(self._writer.submit)  # advice replayed off this thread
        self._findings: Findings | None = None  # what the header shows, for the selected device
        self._device_findings: dict[int, Findings] = {}
        # a replay's findings (the file analysed once), by the source or device set they are of
        self._replay: tuple[object, Findings | None] | None = None
        self._devset: DeviceSet | None = None  # every device's sampler (attach_devices)
        # the holders shown: the state their blocks index, their rows by key, what they are of
        self._holding: tuple[Snapshot, dict[str, list[HolderRow]]] | None = None
        self._holding_of: tuple[object, ...] = ()
        self.on_msg(lambda _w, content, _b: self._on_browser_msg(content))
        # the kernel subshell that handles this panel's browser messages (None: the main shell)
        self.subshell: str | None = route_to_subshell(self.comm) if subshell else None
        if not subshell:
            route_to_main(self.comm)
        self.controls = controls_state(self, device)
        _PANELS.add(self)

    @classmethod
    def from_snapshot(
        cls,
        snapshot: SnapshotLike,
        *,
        device: int | None = None,
        title: str = "",
        device_total: int | str | None = None,
    ) -> MemoryPanel:
        """A panel showing one snapshot (a Snapshot, a torch snapshot dict, or a file path).

        Parameters
        ----------
        snapshot : Snapshot, dict, list, str or Path
        device : int, optional
            Show only this device's segments (default: all devices).
        title : str
            Shown in the header.
        device_total : int or str, optional
            The device's memory, where the caller knows it (an estimate's ``capacity``; bytes
            or a size string): "would N fit?" then counts what the driver could still give
            (device_total minus what the snapshot reserves) instead of saying it is unknown.

        Returns
        -------
        MemoryPanel

        Examples
        --------
        >>> panel = MemoryPanel.from_snapshot([], title="empty")
        >>> panel.flush(), panel.title, panel.map_layout["n_rows"]
        (True, 'empty', 0)
        >>> panel.close()
        """
        total = None if device_total is None else parse_size(device_total)
        panel = cls(device=device, title=title, device_total=total)
        panel.show_snapshot(snapshot)
        return panel

    def show_snapshot(self, snapshot: SnapshotLike) -> None:
        """Show a snapshot; returns at once (the writer thread draws it).

        Parameters
        ----------
        snapshot : Snapshot, torch dict or list, path or bytes
            Anything `gpumemviz.io.as_snapshot` accepts; read here, so a bad one raises here.

        Examples
        --------
        >>> seg = {"device": 0, "address": 0, "total_size": 512, "stream": 0,
        ...        "blocks": [{"size": 512, "state": "inactive"}]}
        >>> panel = MemoryPanel()
        >>> panel.show_snapshot([seg]); panel.flush()
        True
        >>> panel.map_layout["n_rows"], panel.header["free"]
        (1, 512)
        >>> panel.close()
        """
        snap = _as_snapshot(snapshot)
        self._offer(("snapshot", snap))

    def push_sample(self, sample: Sample) -> None:
        """Sampler listener: show a Sample. Only the newest waiting sample is drawn (an OOM on
        a sample it replaces is carried over). `attach` registers it; no example."""
        self._offer(("sample", sample))

    def attach(self, sampler: Sampler, *, owned: bool = False) -> None:
        """Follow a `gpumemviz.live.sampler.Sampler`: show its newest state now, then every sample.

        The panel only listens; an ``owned`` sampler (made for this panel alone) is also
        stopped when the panel closes. A shared one keeps running for its other panels.
        A source with ``time_travel`` (a replayed file) replaces the timeline with the
        recorded run and its annotations.

        Parameters
        ----------
        sampler : Sampler
        owned : bool
            Stop the sampler when the panel detaches or closes.

        Examples
        --------
        >>> from gpumemviz.live.sampler import Sampler
        >>> from gpumemviz.live.sources.simulated import SimulatedSource
        >>> sampler = Sampler(SimulatedSource(autostart=False))
        >>> panel = MemoryPanel()
        >>> panel.attach(sampler, owned=True)
        >>> _ = sampler.sample_once(); panel.flush()
        True
        >>> panel.status, panel.controls["live"]
        ('simulated: training (demo data)', True)
        >>> panel.close()
        """
        self.detach()
        self.sampler = sampler
        self._owns_sampler = owned
        # the timeline first: another sampler's (device's) points must not reach its history
        self._writer.submit(self._load_recorded)
        newest = sampler.history.latest_segments()
        if newest is not None:
            self.push_sample(newest)
        sampler.add_listener(self.push_sample)
        self._writer.submit(self._refresh_controls)

    def _load_recorded(self) -> None:
        """A played-back recording's timeline is the recorded run itself (times from the trace,
        allocated and reserved per entry) with its ``external_annotations`` as markers; samples
        add nothing."""
        source = getattr(self.sampler, "source", None)
        replay = source is not None and "time_travel" in getattr(source, "capabilities", ())
        was, self._recorded = self._recorded, bool(replay)
        other = self._timeline_of is not None and self._timeline_of is not self.sampler
        self._timeline_of = self.sampler
        self._forecaster.reset()
        self.forecast = {}
        if not replay:
            if was or other:  # back to sampling, or another device's: start an empty timeline
                self.timeline.reset([], [])
                self._last_point = None
                self.send(
                    {
                        "kind": "timeline",
                        "first": 0,
                        "points": [],
                        "reset": True,
                        "device": self._device,
                    }
                )
            return
        points, marks = recorded_timeline(cast("TimeTravelSource", source))
        self.timeline.reset(points, marks)
        self.send(
            {
                "kind": "timeline",
                "first": 0,
                "points": points,
                "reset": True,
                "marks": marks,
                "device": self._device,
            }
        )
        self._analyze_replay(cast("TimeTravelSource", source))

    def _analyze_replay(self, played: TimeTravelSource) -> None:
        """A replayed file is analysed once (every device of a panel of strips), its advice
        checked on the recorded trace off this thread; "checking..." until that is done."""
        from gpumemviz.analysis.findings import analyze

        key: object = self._devset if self._devset is not None else played
        if self._replay is not None and self._replay[0] is key:
            self._show_replay(played)
            return
        self._replay = (key, None)
        self.advice = advice_rows(None, checking=True)
        one = None if self._devset is not None else int(played.device)
        raw = getattr(played, "snapshot", None)  # a PlaybackSource's file, trace as columns
        if not isinstance(raw, Snapshot):
            raw = played.raw

        def done(found: Findings) -> None:
            if self._replay is not None and self._replay[0] is key:
                self._replay = (key, found)
                source = getattr(self.sampler, "source", None)
                if source is not None and "time_travel" in getattr(source, "capabilities", ()):
                    self._show_replay(cast("TimeTravelSource", source))

        self._check.start(lambda: analyze(raw, device=one, check=True), done)

    def _show_replay(self, played: TimeTravelSource) -> None:
        """The replay's findings for the device shown; its OOM once the entry shown reaches it."""
        found = self._replay[1] if self._replay is not None else None
        if found is None:
            return
        device = int(played.device)
        self._device_findings = dict(found.devices) if found.devices else {device: found}
        mine = self._device_findings.get(device, found)
        self._findings = mine
        self.advice = advice_rows(mine)
        oom = mine.oom
        reached = oom is not None and (oom.entry is None or int(played.position) >= oom.entry)
        self.oom = oom_trait(oom) if reached and oom is not None else {}
        self._draw_glance()
        self._replay_holders(played)

    @property
    def findings(self) -> Findings | None:
        """`gpumemviz.analyze`'s findings for the device shown (the selected one of a panel of
        strips): what the header, the advice lines and the OOM line show; None before any.

        Examples
        --------
        >>> panel = MemoryPanel.from_snapshot([]); _ = panel.flush()
        >>> panel.findings.advice, panel.findings.oom
        ((), None)
        >>> panel.close()
        """
        return self._findings

    @property
    def device_findings(self) -> dict[int, Findings]:
        """Each device's findings (``--device all``, a file of several devices; one entry
        for one device).

        Examples
        --------
        >>> seg = {"address": 0, "total_size": 512, "stream": 0,
        ...        "blocks": [{"size": 512, "state": "inactive"}]}
        >>> panel = MemoryPanel.from_snapshot([{**seg, "device": 0}, {**seg, "device": 1}])
        >>> _ = panel.flush(); sorted(panel.device_findings)
        [0, 1]
        >>> panel.close()
        """
        return dict(self._device_findings)

    def wait_checked(self, timeout: float = 60.0) -> bool:
        """Wait until the advice check running off the kernel's thread is done and shown
        (tests; the panel itself never waits).

        Parameters
        ----------
        timeout : float
            Seconds to wait at most.

        Returns
        -------
        bool
            False when the check or the drawing did not finish in time.

        Examples
        --------
        >>> panel = MemoryPanel.from_snapshot([])
        >>> panel.wait_checked(5.0)
        True
        >>> panel.close()
        """
        return self._check.wait(timeout) and self.flush(timeout)

    @property
    def owns_sampler(self) -> bool:
        """Whether the sampler was made for this panel alone (it stops when the panel closes)."""
        return self._owns_sampler

    def devices(self) -> list[int]:
        """Devices the switcher offers: CUDA's when torch already runs it, else the one shown
        (the ``controls`` trait carries them; no example)."""
        import sys

        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_available():
                return list(range(torch.cuda.device_count()))
        except Exception:  # a broken driver: offer what is shown
            pass
        return [self._device if self._device is not None else 0]

    @property
    def shown_devices(self) -> tuple[int, ...]:
        """The devices this panel shows: every strip's (``--device all``, a file of several
        devices), else the one device drawn (``()`` before anything is drawn).

        Examples
        --------
        >>> seg = {"address": 0, "total_size": 512, "stream": 0,
        ...        "blocks": [{"size": 512, "state": "inactive"}]}
        >>> panel = MemoryPanel.from_snapshot([{**seg, "device": 0}, {**seg, "device": 3}])
        >>> _ = panel.flush(); panel.shown_devices
        (0, 3)
        >>> panel.close()
        """
        if self._devset is not None:
            return self._devset.devices
        strips = self.strips.get("strips") or []
        if strips:
            return tuple(int(s["device"]) for s in strips)
        if self._shown_device is not None:
            return (self._shown_device,)
        return ()

    def attach_devices(
        self, samplers: Mapping[int, Sampler], *, selected: int | None = None, owned: bool = False
    ) -> None:
        """Show several devices: a strip each (header figures, binned map, OOMs) and the
        ``selected`` one's full map (`select_device` changes it; a strip click does too).

        Parameters
        ----------
        samplers : mapping of int to Sampler
            One sampler per device (`gpumemviz.live.shared.shared`, or one per played-back device).
        selected : int, optional
            The device drawn in full (default: the first with an OOM, else the first).
        owned : bool
            Close the samplers with the panel.

        Examples
        --------
        >>> from gpumemviz.live.sampler import Sampler
        >>> from gpumemviz.live.sources.simulated import SimulatedSource
        >>> feeds = {d: Sampler(SimulatedSource(device=d, autostart=False)) for d in (0, 1)}
        >>> panel = MemoryPanel()
        >>> panel.attach_devices(feeds, selected=1, owned=True)
        >>> for f in feeds.values(): _ = f.sample_once(segments=True)
        >>> _ = panel.flush(); panel.shown_devices, panel.strips["selected"]
        ((0, 1), 1)
        >>> panel.close()
        """
        self.detach_devices()
        devset = DeviceSet(samplers, owned=owned)
        if selected is None:
            ooms = [d for d in devset.devices if recorded_ooms(devset.samplers[d]) > 0]
            selected = (ooms or list(devset.devices))[0]
        if selected not in devset.samplers:
            raise ValueError(f"device {selected} is not among {list(devset.devices)}")
        self._devset = devset
        self._device = selected
        self.attach(devset.samplers[selected])
        devset.listen(self._offer_strip)
        self._writer.submit(self._draw_strips)

    def detach_devices(self) -> None:
        """Stop showing several devices (closing the panel does this).

        Examples
        --------
        >>> panel = MemoryPanel()
        >>> panel.detach_devices(); panel.shown_devices
        ()
        >>> panel.close()
        """
        devset, self._devset = self._devset, None
        if devset is not None:
            self.detach()
            devset.close()

    def select_device(self, device: int) -> None:
        """Draw ``device`` in full below the strips (what a click on its strip does).

        Parameters
        ----------
        device : int
            One of `shown_devices`.

        Raises
        ------
        ValueError
            When the panel shows no strip of that device.

        Examples
        --------
        >>> seg = {"address": 0, "total_size": 512, "stream": 0,
        ...        "blocks": [{"size": 512, "state": "inactive"}]}
        >>> panel = MemoryPanel.from_snapshot([{**seg, "device": 0}, {**seg, "device": 1}])
        >>> _ = panel.flush(); panel.select_device(1); _ = panel.flush()
        >>> panel.map_layout["groups"][0]["device"], panel.strips["selected"]
        (1, 1)
        >>> panel.close()
        """
        if device not in self.shown_devices or len(self.shown_devices) < 2:
            raise ValueError(f"no strip of device {device} here (devices: {self.shown_devices})")
        self._device = device
        if self._devset is not None:
            self.attach(self._devset.samplers[device])
            self._writer.submit(self._draw_strips)
        elif self.shown is not None:
            self._offer(("snapshot", self.shown))

    def follow_devices(self) -> None:
        """A replay the user moved: the other devices follow the selected one from now on
        (the seek and play commands call it)."""
        devset = self._devset
        if devset is not None and devset.replay and self._device is not None:
            devset.following = True
            devset.follow(self._device)

    def _offer_strip(self, device: int, sample: Sample) -> None:
        devset = self._devset
        if devset is None:
            return
        if devset.following and device == self._device:
            devset.follow(device)
        if devset.offer(device, sample):
            self._writer.submit(self._draw_strips)

    def _draw_strips(self) -> None:
        devset = self._devset
        if devset is not None:
            devset.update()
            self.strips = devset.payload(self._device)
            if not devset.replay and devset.findings:  # every device's bar, live
                mine = self._findings
                own = {} if mine is None or mine.device is None else {mine.device: mine}
                self._device_findings = {**devset.findings, **own}
                self._draw_glance()

    def follow_device(self, device: int, sampler: Sampler) -> None:
        """Show another device: follow its (shared) sampler from now on (the "device"
        command; no example)."""
        self._device = device
        self.attach(sampler)

    def detach(self) -> None:
        """Stop following the sampler (closing the panel does this too); an owned one stops.

        Examples
        --------
        >>> from gpumemviz.live.sampler import Sampler
        >>> from gpumemviz.live.sources.simulated import SimulatedSource
        >>> panel = MemoryPanel()
        >>> panel.attach(Sampler(SimulatedSource(autostart=False)))
        >>> panel.detach(); panel.sampler is None
        True
        >>> panel.close()
        """
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.remove_listener(self.push_sample)
            if self._owns_sampler:
                sampler.stop()
            self._writer.submit(self._refresh_controls)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything handed to the panel so far is drawn and sent (tests, export).

        Parameters
        ----------
        timeout : float
            Seconds to wait at most.

        Returns
        -------
        bool
            False when the writer did not finish in time.

        Examples
        --------
        >>> panel = MemoryPanel.from_snapshot([])
        >>> panel.flush(timeout=5), panel.errors
        (True, ())
        >>> panel.close()
        """
        return self._writer.wait(timeout)

    @property
    def views(self) -> dict[str, dict[str, int]]:
        """The browser views of this panel and the rows each shows: {id: {first, count, cells}}."""
        return self._wire.view_state()

    @property
    def errors(self) -> tuple[str, ...]:
        """Errors the writer thread caught (the panel never raises into user code)."""
        return tuple(self._writer.errors)

    def close(self) -> None:
        """Stop listening (an owned sampler stops), stop the writer thread, drop the panel's
        subshell and close the widget.

        Examples
        --------
        >>> panel = MemoryPanel.from_snapshot([])
        >>> panel.close()
        >>> panel in live_panels()
        False
        """
        _PANELS.discard(self)
        if getattr(self, "_devset", None) is not None:
            self.detach_devices()
        if getattr(self, "sampler", None) is not None:
            self.detach()
        throttle = getattr(self, "_throttle", None)
        if throttle is not None:
            throttle.cancel()
        check = getattr(self, "_check", None)
        if check is not None:
            check.cancel()
        writer = getattr(self, "_writer", None)  # absent when __init__ failed half-way
        if writer is not None:
            writer.stop()
        sid = getattr(self, "subshell", None)
        if sid:
            delete_subshell(sid)
            self.subshell = None
        super().close()

    # -- everything below runs on the writer thread, except the two entry points

    def _offer(self, item: _Item) -> None:
        with self._latest_lock:
            old = self._latest
            queued = old is not None
            lost = getattr(old[1], "oom", None) if old is not None and old[0] == "sample" else None
            if lost is not None and item[0] == "sample" and getattr(item[1], "oom", 1) is None:
                # a newer sample may replace a waiting one, but never drop its OOM
                item = ("sample", dataclasses.replace(item[1], oom=lost))
            self._latest = item
        if not queued:
            self._writer.submit(self._take_latest)

    def _take_latest(self) -> None:
        with self._latest_lock:
            item, self._latest = self._latest, None
        if item is None:
            return
        if item[0] == "snapshot":
            snap = item[1]
            self._show(snap, {}, status="snapshot")
            self.strips = snapshot_strip_set(snap, self._device)  # {} for one device
            self._analyze_snapshot(snap)
        else:
            self._apply_sample(item[1])
            self._add_point(item[1])  # after the header: the point carries its fragmentation
            self._forecast(item[1])

    def _analyze_snapshot(self, snap: Snapshot) -> None:
        """A fixed snapshot: its findings now, unchecked; with a recorded trace, checked off
        this thread ("checking..." until then)."""
        from gpumemviz.analysis.findings import analyze

        device = self._device
        if device is not None and device not in snap.devices:
            self._findings, self._device_findings = None, {}
            self.advice, self.oom = [], {}
            self._draw_glance()
            return
        traced = any(len(t) for t in snap.traces.values())
        self._throttle.analyze(lambda: analyze(snap, device=device, check=False), force=True)
        if traced:
            self.advice = advice_rows(self._findings, checking=True)
            self._check.start(lambda: analyze(snap, device=device, check=True), self._publish)

    def _publish(self, found: Findings) -> None:
        """Show findings: the advice lines, the OOM (a live one stays until the next)."""
        self._findings = found
        if self._devset is not None and not found.devices and found.device is not None:
            self._device_findings = {**self._devset.findings, found.device: found}
        elif found.devices:
            self._device_findings = dict(found.devices)
        elif found.device is not None:
            self._device_findings = {found.device: found}
        self.advice = advice_rows(found)
        if found.oom is not None:
            self.oom = oom_trait(found.oom)
        self._draw_glance()
        if not self._recorded:
            self._set_holders(found, None)

    def _draw_glance(self) -> None:
        """The ``glance`` trait from the findings shown (a bar per device); a replay's, of the
        entry shown (its findings are of the whole file)."""
        from gpumemviz.analysis.findings import Figures

        found = self._findings
        shown = found.device if found is not None else None
        per = self._device_findings or ({} if found is None or shown is None else {shown: found})
        at = None
        report = self._shown_report
        if self._recorded and report is not None and shown is not None and shown in report.devices:
            at = Figures.of(report.devices[shown])
        self.glance = glance_set(per, shown, self.oom, at)

    def _apply_sample(self, sample: Sample) -> None:
        extra: JsonDict = {}
        stats = getattr(sample, "stats", None)
        if stats is not None:
            extra |= {"num_alloc_retries": stats.num_alloc_retries, "num_ooms": stats.num_ooms}
        extra |= getattr(sample, "peak_figures", {})  # gpumemviz's own, never torch's counters
        nvml = getattr(sample, "nvml", None)
        if nvml is not None and nvml.available:
            extra |= {"nvml_total": nvml.total, "nvml_used": nvml.used}
            self._device_free = nvml.free
        info = getattr(sample, "device_info", None)
        if info is not None and info.name:  # several devices: the header names its own
            self.title = (
                info.name if self._devset is None else f"cuda:{sample.device} · {info.name}"
            )
        self.demo = bool(getattr(sample, "demo", False))
        oom = getattr(sample, "oom", None)
        source = getattr(self.sampler, "source", None)
        replay = "time_travel" in getattr(source, "capabilities", ())
        if replay:  # the file's findings; its OOM once the entry shown reaches it
            self._show_replay(cast("TimeTravelSource", source))
        if oom is not None:
            m = self.timeline.add_mark(oom.time, f"OOM ({oom.cause})", "oom")
            self.send({"kind": "marks", "marks": [m]})
        state = getattr(sample, "state", "ok")
        if state == "waiting":
            self.status = "waiting for CUDA"
            return
        errors = tuple(getattr(sample, "errors", ()))
        label = getattr(sample, "status_label", "") or "live"  # with the peaks' note
        if sample.segments is None:
            # a stats-only tick (segment state is read less often): the figures stay those of
            # the segments shown, one moment; the newer stats ride along with their time
            if stats is not None:
                extra |= {
                    "stats_allocated": stats.allocated,
                    "stats_reserved": stats.reserved,
                    "stats_time": sample.time,
                }
            self.header = {**self.header, **extra}
            if errors or self._wire.rows is None:
                self.status = errors[0] if errors else (sample.segments_note or label)
            return
        device = self._device if self._device is not None else sample.device
        extra["segments_time"] = sample.time
        self._show(sample.segments, extra, status=errors[0] if errors else label, device=device)
        if not replay:
            from gpumemviz.analysis.findings import analyze

            self._throttle.analyze(
                lambda: analyze(sample, device=device, check=False), force=oom is not None
            )

    def _add_point(self, sample: Sample) -> None:
        """Extend the timeline when a figure moved (equal samples add nothing, send nothing)."""
        device = getattr(sample, "device", None)
        if self._recorded or (None not in (device, self._device) and device != self._device):
            return  # a replay's timeline is the recording; a sample of another device: not ours
        point = TimelineData.point(sample, self.header.get("fragmentation"))
        if point is None:
            return
        last = self._last_point
        # allocated, reserved, NVML used and fragmentation; the time and non-PyTorch are not
        if last is not None and point[1:4] == last[1:4] and point[5] == last[5]:
            return
        self.timeline.append(point)
        self._last_point = point
        self.send(
            {
                "kind": "timeline",
                "first": self.timeline.count - 1,
                "points": [point],
                "device": device if device is not None else self._device,
            }
        )

    def _forecast(self, sample: Sample) -> None:
        """The live forecast from the sampler's history (live/forecast.py), at most once a
        second; a replay's timeline is the recording, and gets none."""
        device = getattr(sample, "device", None)
        if self._recorded or self.sampler is None:
            return
        if None not in (device, self._device) and device != self._device:
            return
        report = self._shown_report
        if sample.segments is not None and sample.segments is self.shown and report is not None:
            self._forecaster.note_segments(sample, report.largest_free)
        if self._forecaster.due(float(sample.time)):
            found = self._forecaster.forecast(self.sampler.history.samples())
            if found != self.forecast:
                self.forecast = found

    def add_marker(self, label: str, kind: str = "mark", t: float | None = None) -> None:
        """A marker on the timeline (``gpumemviz.mark`` puts one on every live panel).

        Parameters
        ----------
        label : str
        kind : {"mark", "cell", "oom"}
        t : float, optional
            ``time.time()`` seconds (default: now).

        Examples
        --------
        >>> panel = MemoryPanel.from_snapshot([])
        >>> panel.add_marker("epoch 1", t=5.0)
        >>> panel.timeline.marks()
        [{'t': 5.0, 'label': 'epoch 1', 'kind': 'mark'}]
        >>> panel.close()
        """
        m = self.timeline.add_mark(time.time() if t is None else t, label, kind)
        self._writer.submit(lambda: self.send({"kind": "marks", "marks": [m]}))

    def _show(
        self, snap: Snapshot, extra: JsonDict, status: str, device: int | None = None
    ) -> FragmentationReport:
        """Draw a snapshot; returns its fragmentation report (the advice reads it too)."""
        from gpumemviz.analysis.fragmentation import fragmentation

        device = self._device if device is None else device
        rows = build_rows(snap, device=device)
        report = fragmentation(snap)
        self.shown, self._shown_device, self._shown_report = snap, device, report
        name_notebook_cells()  # frames in this kernel's cells read "cell [5], line 14"
        regrouped = self._wire.set_rows(rows, Stacks(snap))
        layout = self._wire.layout()
        if regrouped or layout["max_size"] != self.map_layout.get("max_size"):
            self.map_layout = layout  # "to scale" rows follow the largest segment's size
        painted = header_numbers(rows)
        del painted["free_trapped"]  # the painted slivers; the header says free_stuck instead
        self.header = {**painted, **report_numbers(report, device), **extra}
        self.status = status
        if self._recorded:
            self._draw_glance()  # a replay's bar is the entry shown
        self._send_frames(self._wire.update())
        if self._recorded:  # a replay's holders are of the entry shown
            source = getattr(self.sampler, "source", None)
            if source is not None and "time_travel" in getattr(source, "capabilities", ()):
                self._replay_holders(cast("TimeTravelSource", source))
        return report

    def _replay_holders(self, played: TimeTravelSource) -> None:
        """The holders of the entry a replay shows, once its file's findings are there."""
        found = self._findings if self._replay is not None and self._replay[1] else None
        if found is not None:
            self._set_holders(found, (int(played.position), int(played.n) - 1))

    def _set_holders(self, found: Findings, at: tuple[int, int] | None) -> None:
        """The ``holders`` trait from `found` (at a replay's (entry, last entry)); recomputed
        only when the findings, the state shown or the entry changed."""
        of = (id(found), id(self.shown), at)
        if of == self._holding_of:
            return
        self._holding_of = of
        held = holders_of(found, self.shown, *(at or (None, None)))
        self._holding = held
        self.holders = {} if held is None else holders_view(lambda by: held[1][by])

    def _send_marks(self, view: str, by: str, index: int) -> None:
        """Answer a click on a holder: where its blocks lie in the map (`holder_marks`)."""
        held, rows = self._holding, self._wire.rows
        chosen = held[1].get(by, []) if held is not None else []
        msg: JsonDict = {"kind": "holder_blocks", "view": view, "by": by, "index": index}
        if held is None or rows is None or not 0 <= index < len(chosen):
            self.send({**msg, "row": [], "offset": [], "size": [], "bytes": 0, "count": 0})
            return
        marks = holder_marks(held[0], chosen[index], rows)
        label = chosen[index].label
        self.send({**msg, "label": label, "layout": self._wire.layout_version, **marks})

    def export(
        self, path: str | os.PathLike[str], *, redact_paths: bool = False, force: bool = False
    ) -> Path:
        """Write what the panel shows for sharing: a live source's full snapshot (recorded history
        included), or the fixed snapshot shown.

        Parameters
        ----------
        path : str or PathLike
            Where to write; the suffix picks the format as in `gpumemviz.export` (anything but
            .json or .csv is a torch pickle, protocol 4, that MemoryViz opens).
        redact_paths : bool
            Replace home directories and user names with placeholders first.
        force : bool
            Replace a read-only file (refused otherwise, as `gpumemviz.export` does).

        Returns
        -------
        Path
            The path written.

        Raises
        ------
        ValueError
            When the panel shows nothing yet, or its source cannot export.

        Examples
        --------
        >>> import pathlib, tempfile
        >>> panel = MemoryPanel.from_snapshot([]); _ = panel.flush()
        >>> with tempfile.TemporaryDirectory() as d:
        ...     panel.export(pathlib.Path(d) / "shown.json").read_text()
        '{"segments":[],"device_traces":[]}'
        >>> panel.close()
        """
        from gpumemviz.reporting.export import export

        if self.sampler is not None:
            source = self.sampler.source
            if "export" not in getattr(source, "capabilities", frozenset()):
                label = getattr(source, "label", type(source).__name__)
                raise ValueError(f"{label} cannot export a snapshot")
            data: TorchDict | Snapshot = source.export()
        elif self.shown is not None:
            data = self.shown
        else:
            raise ValueError("nothing shown yet: nothing to export")
        return export(data, path, redact_paths=redact_paths, force=force)

    def fit_inputs(self) -> tuple[FragmentationReport | None, int | None, int]:
        """What "would N fit?" reads: the report of the snapshot shown (computed when it was
        drawn), the device's free bytes (NVML, when known) and the device shown (the "fit"
        command; no example)."""
        snap, device = self.shown, self._shown_device
        if device is None:
            devices: np.ndarray | list[int] = (
                np.unique(snap.segments.device) if snap is not None else []
            )
            device = int(devices[0]) if len(devices) else 0
        free = self._device_free
        if free is None and self._device_total is not None and snap is not None:
            reserved = int(snap.segments.total_size[snap.segments.device == device].sum())
            free = max(0, self._device_total - reserved)
        return self._shown_report, free, device

    def command(self, name: str, **args: Any) -> JsonDict:  # Any: the browser's JSON values
        """Run a button's command now, on this thread (what a click does); returns the reply.

        Parameters
        ----------
        name : str
            empty_cache, export, pause, resume, interval, fit, seek, play, record_history,
            reset_peaks, device, select; a job panel's rank, rank_snapshot
            (`gpumemviz.widget.commands`).
        **args
            The command's arguments as the browser sends them (``value``, ``index``, ...).

        Returns
        -------
        dict
            ``{name, thread, ms, ok, text, ...}``: the reply the browser gets; a failure is
            ``ok`` False with a one-line ``text``, never an exception.

        Examples
        --------
        >>> panel = MemoryPanel.from_snapshot([])
        >>> reply = panel.command("pause")
        >>> reply["ok"], reply["text"]
        (False, 'this panel shows a fixed snapshot: there is no live source')
        >>> panel.close()
        """
        from gpumemviz.widget.commands import CommandError, run_command

        t0 = time.perf_counter()
        try:
            reply = {"ok": True, **run_command(self, name, args)}
        except CommandError as exc:
            reply = {"ok": False, "text": str(exc)}
        except Exception as exc:  # a source failing must not reach the kernel's comm handler
            reply = {"ok": False, "text": f"{name} failed: {type(exc).__name__}: {exc}"}
        thread = threading.current_thread().name
        entry = {"name": name, "thread": thread, "ms": (time.perf_counter() - t0) * 1e3, **reply}
        self.command_log.append(entry)
        del self.command_log[:-50]
        self._writer.submit(self._refresh_controls)  # paused, interval, replay position
        return entry

    def _on_browser_msg(self, content: JsonDict) -> None:
        """Act on one message from the front end (docs/internals.md, the wire: Browser ->
        Python); unknown kinds are ignored. A command runs on the thread the kernel hands the
        message to; views, block requests, timeline syncs and closes are queued for the writer
        thread. A strip click is the "select" command."""
        kind = content.get("kind") if isinstance(content, dict) else None
        if kind == "command":
            # done here, on the thread the kernel gave this message (a subshell while a cell
            # runs); only the reply and the traits go through the writer thread
            cid = str(content.get("id", ""))
            given = content.get("args")
            args = given if isinstance(given, dict) else {}
            entry = self.command(str(content.get("name", "")), **args)
            reply = {"kind": "reply", "id": cid, **plain(entry)}
            self._writer.submit(lambda: self.send(reply))
        elif kind == "view":
            view = str(content.get("view", ""))
            span = (int(content.get("first", 0)), int(content.get("count", 1)))
            cells = int(content.get("cells", 1024))
            self._writer.submit(lambda: self._send_frames(self._wire.set_view(view, *span, cells)))
        elif kind == "blocks":  # the zoom wants one row's exact blocks (its frame had cells)
            view, row = str(content.get("view", "")), int(content.get("row", -1))
            lo, hi = content.get("lo"), content.get("hi")
            win = (
                (int(lo), int(hi))
                if isinstance(lo, (int, float)) and isinstance(hi, (int, float))
                else (None, None)
            )
            self._writer.submit(lambda: self._send_frames(self._wire.exact_blocks(view, row, *win)))
        elif kind == "holder_blocks":  # a click on a holder: mark its blocks in the map
            view, by = str(content.get("view", "")), str(content.get("by", ""))
            index = int(content.get("index", -1))
            self._writer.submit(lambda: self._send_marks(view, by, index))
        elif kind == "stack":  # the hover wants a live block's stack its frame did not carry
            view, row, block = (
                str(content.get("view", "")),
                int(content.get("row", -1)),
                int(content.get("block", -1)),
            )
            self._writer.submit(lambda: self._send_stack(view, row, block))
        elif kind == "timeline_sync":
            since = int(content.get("since", 0))
            self._writer.submit(lambda: self._sync_timeline(since))
        elif kind == "close":
            view = str(content.get("view", ""))
            self._writer.submit(lambda: self._wire.drop_view(view))

    def allocation_stack(self, row: int, block: int) -> JsonDict | None:
        """The hover's stack of exact block `block` of map row `row`, asked of the live source
        for that one block (`TorchCudaSource.allocation_stack`: torch's record of one pointer,
        no snapshot). The browser asks with a ``stack`` message when it hovers an allocated
        block whose frame carried no stack.

        Parameters
        ----------
        row : int
            A row of the map shown (its layout now).
        block : int
            The block's index within the row.

        Returns
        -------
        dict or None
            ``{"lines", "user"}`` as `gpumemviz.render.stacks.stack_lines` gives them, or None:
            a replay or a fixed snapshot, a free block, a source without it, no stack recorded.

        Examples
        --------
        >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
        ...        "segment_type": "large",
        ...        "blocks": [{"size": 2 << 20, "state": "active_allocated"}]}
        >>> panel = MemoryPanel.from_snapshot([seg])
        >>> _ = panel.flush(); panel.allocation_stack(0, 0) is None  # a fixed snapshot: no source
        True
        >>> panel.close()
        """
        from gpumemviz.render.stacks import stack_lines
        from gpumemviz.snapshot.schema import ALLOCATED

        rows = self._wire.rows
        source = getattr(self.sampler, "source", None)
        lookup = getattr(source, "allocation_stack", None)
        if rows is None or self._recorded or not callable(lookup):
            return None
        if not 0 <= row < rows.n_rows or not 0 <= block < int(rows.block_count[row]):
            return None
        b = rows.blocks(row)
        if int(b["state"][block]) != ALLOCATED:
            return None
        frames = lookup(int(rows.address[row]) + int(b["offset"][block]))
        if not frames:
            return None
        lines, user = stack_lines(frames)
        return {"lines": lines, "user": user} if lines else None

    def _send_stack(self, view: str, row: int, block: int) -> None:
        stack = self.allocation_stack(row, block)
        layout = self._wire.layout_version
        self.send(
            {
                "kind": "stack",
                "view": view,
                "row": row,
                "block": block,
                "layout": layout,
                "stack": stack,
            }
        )

    def _sync_timeline(self, since: int) -> None:
        """Send the timeline's points from ``since`` on, with every marker (a view opened, or
        came back after a gap)."""
        first, points = self.timeline.since(since)
        self.send(
            {
                "kind": "timeline",
                "first": first,
                "points": points,
                "reset": True,
                "marks": self.timeline.marks(),
                "device": self._device,
            }
        )

    def replay_times(self) -> np.ndarray | None:
        """The replayed trace's entry times (`trace_times`), or None: not a replay, or a trace
        recorded without ``time_us`` (events only). The "seek" command and the replay
        controls read it; no example."""
        source = getattr(self.sampler, "source", None)
        cached = self._times_of
        if source is not None and (cached is None or cached[0] is not source):
            self._times_of = cached = (source, source_times(source))
        return cached[1] if source is not None and cached is not None else None

    def _refresh_controls(self) -> None:
        self.controls = controls_state(self, self._device)

    def _send_frames(self, frames: list[Frame]) -> None:
        for f in frames:
            self.send(f.content, f.buffers)
            n = f.nbytes
            s = self.wire_stats
            s["frames"] += 1
            s["bytes"] += n
            s["last_bytes"] = n
            s["max_bytes"] = max(s["max_bytes"], n)


def _as_snapshot(obj: SnapshotLike) -> Snapshot:
    from gpumemviz.io import as_snapshot

    return as_snapshot(obj)
