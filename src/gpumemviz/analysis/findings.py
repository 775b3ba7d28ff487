"""One analysis that every front end shows: `analyze(source) -> Findings`.

The panel (live and replay), the terminal magic, `gpumemviz inspect`, the HTML report and
`gpumemviz diff` each used to chain fragmentation -> advice -> replay check -> OOM verdict on
their own, at their own moment, and disagreed on the same file (one showed unchecked advice
where another rejected it; one judged an OOM at the failing entry, another on the final state).
Here the chain is composed once: one read of the state gives the figures (the conservation law
exact), the pools, the holders, the OOM verdict with ranked actions, the advice (checked on the
recorded trace where there is one) and what could not be judged. Front ends only render it.

The OOM is judged where it happened: at the newest ``oom`` trace entry, on the segment state
the recorded history gives at that entry (the snapshot's own replay, `SharedReplay`, which the
advice check reuses); at a live sample's captured `OomEvent`; else, for a device whose final
state is as full as a snapshot taken at an OOM is (nothing empty_cache could return, almost no
free byte in reserved) and whose history was not recorded, on that final state. Every OOM gets
at least one ranked action with its expected effect in bytes, so a crash never reads as "nothing
worth changing".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator.rules import round_size
from gpumemviz.analysis.advice import advise, advise_each_device, oom_device_free
from gpumemviz.analysis.advice_check import (
    Checked,
    CheckedAdvice,
    SharedReplay,
    check_advice,
    setting_of,
)
from gpumemviz.analysis.forecast import Forecast, forecast, reserved_series
from gpumemviz.analysis.fragmentation import (
    FragmentationReport,
    MemoryFigures,
    PoolFigures,
    fragmentation,
)
from gpumemviz.analysis.fragmentation.oom import classify_event
from gpumemviz.analysis.frames import format_frame, user_frame
from gpumemviz.analysis.growth import Lifetime, Steps, Suspect, growth
from gpumemviz.analysis.holders import (
    HOLDER_KEYS,
    Holder,
    HolderRow,
    holder_rows,
    live_holders,
    metadata_text,
)
from gpumemviz.io import SnapshotLike, as_snapshot
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.sample import OomEvent, Sample
from gpumemviz.snapshot.tables import Trace
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.allocator.replay import Prepared
    from gpumemviz.snapshot.schema import JsonDict, TorchDict

__all__ = [
    "FULL_FREE_SHARE",
    "LIVE_UNCHECKED",
    "NOT_CHECKED",
    "OVERFLOWED",
    "Action",
    "AdviceItem",
    "Figures",
    "Findings",
    "OomFinding",
    "analyze",
]

#: A device whose free bytes in reserved are below this share of reserved, with nothing that
#: empty_cache could return, is as full as a snapshot taken inside an OOM is (the allocator
#: frees every unused cached segment before it gives up): judged as one when no history says
#: otherwise. Of the real recordings in tests/data/real only the one taken at an OOM is this full.
FULL_FREE_SHARE = 0.005
#: The note of live advice: no recorded trace to replay it on.
LIVE_UNCHECKED = (
    'advice is unchecked until a trace is recorded ("record history" turns checking on)'
)
#: Why setting advice was not checked when the caller turned the check off.
NOT_CHECKED = "not checked (check=False)"
#: The note of a file whose allocator_settings say the trace ring overflowed.
OVERFLOWED = (
    "the trace lost its oldest entries (trace_alloc_overflowed): what happened before its "
    "first entry is not recorded"
)


@dataclass(frozen=True)
class Figures:
    """The figures of the state shown, from one read: allocated + pending_free +
    free_in_reserved == reserved exactly (every byte of a segment is in one block).

    `releasable` is what empty_cache would return now, `stuck` the free (and pending) bytes
    that stay after it. `device_total`, `nvml_used` and `non_pytorch` are None where unknown.
    `entry` is the trace entry the state is at (None: not known), `time` its seconds.
    """

    reserved: int
    allocated: int
    pending_free: int
    free_in_reserved: int
    releasable: int
    stuck: int
    largest_free: int
    fragmentation: float
    device_total: int | None = None
    nvml_used: int | None = None
    non_pytorch: int | None = None
    entry: int | None = None
    time: float | None = None

    @classmethod
    def of(cls, m: MemoryFigures, **known: int | float | None) -> Figures:
        """The figures of a `MemoryFigures` (one device, or the total), plus what is known."""
        return cls(
            reserved=m.reserved,
            allocated=m.allocated,
            pending_free=m.pending_free,
            free_in_reserved=m.free,
            releasable=m.releasable,
            stuck=m.free_stuck,
            largest_free=m.largest_free,
            fragmentation=m.external_fragmentation,
            **known,  # type: ignore[arg-type]
        )

    def to_dict(self) -> JsonDict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Action:
    """One thing to do about an OOM: `kind`, a sentence, and its expected effect in bytes
    (`effect`: what it frees or the shortfall it covers)."""

    kind: str
    sentence: str
    effect: int

    def to_dict(self) -> JsonDict:
        return {"kind": self.kind, "sentence": self.sentence, "effect": self.effect}


@dataclass(frozen=True)
class OomFinding:
    """An OOM and why: `cause` is one of capacity, fragmentation, outside (memory held outside
    PyTorch), unknown; `basis` says where it was judged: "trace" (at the ``oom`` entry, on the
    replayed state there), "event" (a live capture), "final state" (no entry recorded; the
    final state is as full as one taken at an OOM). `request` is the bytes asked (torch's
    ``oom`` entry records them rounded), `rounded` as the allocator rounds them; both None
    when unknown. `actions` are ranked, the first the most direct."""

    device: int
    entry: int | None
    request: int | None
    rounded: int | None
    cause: str
    explanation: str
    basis: str
    reserved: int
    allocated: int
    free_in_reserved: int
    largest_free: int
    device_free: int | None
    outside: int
    frame: str | None
    actions: tuple[Action, ...]
    alloc_size: int | None = None  # the segment size torch tried (a live capture's), or None
    time: float | None = None  # seconds of the failure (the entry's time_us), None: unknown

    @property
    def sentence(self) -> str:
        """The OOM in one sentence: "OOM on cuda:1 of 4.94 GiB (capacity): ..."."""
        size = f" of {format_size(self.rounded)}" if self.rounded else ""
        return f"OOM on cuda:{self.device}{size} ({self.cause}): {self.explanation}"

    def to_dict(self) -> JsonDict:
        out: JsonDict = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["actions"] = [a.to_dict() for a in self.actions]
        out["sentence"] = self.sentence
        return out


@dataclass(frozen=True)
class AdviceItem:
    """One advice: `kind` (`gpumemviz.analysis.advice.ADVICE_KINDS`), its sentence, the device
    it is about, the setting it adds (None: advice that is not a setting) and whether the
    recorded trace's replay checked it (then the peaks before and after; `verdict` better,
    same or worse). `unchecked` says why a setting was not checked; `reason` is the replay's
    sentence (for a rejected advice: why it is not suggested)."""

    kind: str
    message: str
    device: int | None
    setting: str | None
    checked: bool
    verdict: str | None = None
    peak_reserved_before: int | None = None
    peak_reserved_after: int | None = None
    segments_before: int | None = None
    segments_after: int | None = None
    unchecked: str | None = None
    reason: str | None = None
    evidence: Mapping[str, int | float] = field(default_factory=dict)

    @classmethod
    def of(cls, c: Checked) -> AdviceItem:
        a, check = c.advice, c.check
        device = a.evidence.get("device")
        common = {
            "kind": a.kind,
            "message": a.message,
            "device": None if device is None else int(device),
            "setting": setting_of(a),
            "evidence": dict(a.evidence),
        }
        if check is None:
            return cls(checked=False, unchecked=c.unchecked, **common)  # type: ignore[arg-type]
        return cls(
            checked=True,
            verdict=check.verdict,
            peak_reserved_before=check.peak_reserved_before,
            peak_reserved_after=check.peak_reserved_after,
            segments_before=check.peak_segments_before,
            segments_after=check.peak_segments_after,
            reason=check.sentence(),
            **common,  # type: ignore[arg-type]
        )

    def to_dict(self) -> JsonDict:
        out: JsonDict = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["evidence"] = dict(self.evidence)
        return out


@dataclass(frozen=True)
class Findings:
    """What `analyze` found: one frozen value every front end renders.

    Attributes
    ----------
    device : int or None
        The device (None: every device together; `devices` holds each).
    figures : Figures
        The state shown, one read (the conservation law exact).
    memory : MemoryFigures
        Every figure of that state (requested, internal waste, worst segments, ...).
    pools : tuple of PoolFigures
        The default pool and each private pool holding a segment.
    oom : OomFinding or None
        The OOM (of the failing device, for several devices), with ranked actions.
    advice : tuple of AdviceItem
        What to change, most at stake first (per device, in device order).
    rejected : tuple of AdviceItem
        Setting advice the replay of the recorded trace refuted, with the reason.
    notes : tuple of str
        What could not be judged, and why.
    settings : str or None
        The recorded PYTORCH_CUDA_ALLOC_CONF ("" : defaults; None: not recorded).
    pools_in_use : bool
        The assumption on private pools the figures follow.
    devices : {int: Findings}
        Each device's own findings (empty for one device's findings).
    growth : tuple of Suspect
        Leak suspects: holders whose live bytes rise step over step (`analysis.growth`),
        fastest first; empty when nothing grows or the trace has no repeated steps.
    lifetimes : tuple of Lifetime
        How long each holder's allocations live (within a step, across steps, forever).
    steps : Steps or None
        The repeated steps `growth` was measured on (None: none found).
    forecast : Forecast or None
        The time to OOM at the present growth of reserved memory (`analysis.forecast`), where
        the trace has times, the device's capacity is known and the trend is clear.
    recorded : {str: int}
        How many trace entries (or frames) hold each newer torch field: ``user_metadata``,
        ``internal_metadata``, ``annotate``, ``pool_id``, ``forward_frames``, ``fx`` (frames
        of compiled code with FX fields), ``compile_context``; only the fields present.
    snapshot : Snapshot or None
        The state analysed (what `holders` groups).
    shared : SharedReplay or None
        Its replay (what `holders(at=...)` reads the state at an entry from).

    Examples
    --------
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...     {"size": 1 << 20, "requested_size": 1 << 20, "state": "active_allocated"},
    ...     {"size": 1 << 20, "requested_size": 0, "state": "inactive"}]}
    >>> f = analyze([seg])
    >>> f.device, list(f.devices), f.figures.free_in_reserved, f.advice, f.oom
    (None, [0], 1048576, (), None)
    """

    device: int | None
    figures: Figures
    memory: MemoryFigures = field(repr=False)
    pools: tuple[PoolFigures, ...]
    oom: OomFinding | None
    advice: tuple[AdviceItem, ...]
    rejected: tuple[AdviceItem, ...]
    notes: tuple[str, ...]
    settings: str | None
    pools_in_use: bool
    devices: Mapping[int, Findings] = field(default_factory=dict)
    growth: tuple[Suspect, ...] = ()
    lifetimes: tuple[Lifetime, ...] = field(default=(), repr=False)
    steps: Steps | None = field(default=None, repr=False)
    forecast: Forecast | None = None
    recorded: Mapping[str, int] = field(default_factory=dict, repr=False)
    snapshot: Snapshot | None = field(default=None, repr=False, compare=False)
    shared: SharedReplay | None = field(default=None, repr=False, compare=False)

    def holders(self, by: str = "frame", at: int | None = None) -> list[HolderRow]:
        """Who holds the allocated bytes, grouped `by` one of `HOLDER_KEYS`, most first.

        Parameters
        ----------
        by : str
            ``"frame"`` (the innermost user frame, "file:line"), ``"call_path"`` (a tuple of
            "file:line" from the outermost user frame in), ``"user_metadata"``,
            ``"annotation"``, ``"stream"`` or ``"pool"``.
        at : int, optional
            An index into the device's trace: the state after that entry, replayed (one
            device's findings, or findings of a one-device snapshot). Default: the state
            analysed.

        Returns
        -------
        list of HolderRow
            ``key``, ``bytes``, ``count`` (and the blocks): every allocated block in exactly
            one row (key None: not recorded), so the bytes sum exactly to allocated.

        Raises
        ------
        ValueError
            `by` unknown; `at` outside the trace, on several devices, or without a replay.

        Examples
        --------
        >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
        ...        "blocks": [{"size": 2 << 20, "requested_size": 2 << 20,
        ...                    "state": "active_allocated", "frames": []}]}
        >>> [(r.key, r.bytes, r.count) for r in analyze([seg]).holders("stream")]
        [(0, 2097152, 1)]
        """
        if by not in HOLDER_KEYS:
            raise ValueError(f"holders by {short_repr(by)}: by is one of {', '.join(HOLDER_KEYS)}")
        if self.snapshot is None:
            return []
        if at is None:
            return holder_rows(self.snapshot, by, device=self.device)
        device = self.device
        if device is None:
            if len(self.devices) != 1:
                raise ValueError("holders(at=...): name a device (these findings hold several)")
            device = next(iter(self.devices))
        trace = self.snapshot.traces.get(device)
        n = 0 if trace is None else len(trace)
        if not 0 <= at < n:
            raise ValueError(f"holders(at={at}): cuda:{device}'s trace has entries 0 to {n - 1}")
        shared = self.shared if self.shared is not None else SharedReplay(self.snapshot)
        prepared = shared.get()
        segments = _segments_at(prepared, device, at)
        if segments is None:
            why = prepared if isinstance(prepared, str) else "no recording of this device"
            raise ValueError(f"holders(at={at}): the trace cannot be replayed ({why})")
        state = Snapshot.from_torch({"segments": segments})
        return holder_rows(state, by, device=device, traces=self.snapshot.traces, upto=at)

    def for_device(self, device: int) -> Findings:
        """One device's findings (these, when they are that device's).

        Parameters
        ----------
        device : int

        Returns
        -------
        Findings

        Raises
        ------
        ValueError
            Naming the devices present.

        Examples
        --------
        >>> analyze([]).for_device(0)
        Traceback (most recent call last):
        ...
        ValueError: no device 0 in these findings (devices: none)
        """
        if self.device == device:
            return self
        if device in self.devices:
            return self.devices[device]
        have = ", ".join(map(str, self.devices)) or "none"
        raise ValueError(f"no device {device} in these findings (devices: {have})")

    def to_dict(self) -> JsonDict:
        """Plain JSON-safe data: what ``gpumemviz inspect --json`` prints.

        Returns
        -------
        dict
            ``device``, ``figures``, ``memory``, ``pools``, ``holders`` (``{by: [row, ...]}``
            for every `HOLDER_KEYS`), ``oom``, ``advice``, ``rejected``, ``notes``,
            ``settings``, ``pools_in_use``, ``growth`` (the suspects), ``lifetimes``,
            ``steps``, ``forecast``, ``recorded`` and ``devices`` (each device's own, keyed by
            its index as a string).

        Examples
        --------
        >>> sorted(analyze([]).to_dict())[:4]
        ['advice', 'device', 'devices', 'figures']
        """
        return _as_dict(self, None)


def _as_dict(found: Findings, holders: Mapping[str, list[HolderRow]] | None) -> JsonDict:
    """`Findings.to_dict`; `holders`: its rows by each key when the caller has them (the
    findings of a snapshot's only device group the same blocks as the snapshot's: the rows are
    grouped once, not once more per device)."""
    if holders is None:
        holders = {by: found.holders(by) for by in HOLDER_KEYS}
    only = _only_device(found)
    return {
        "device": found.device,
        "figures": found.figures.to_dict(),
        "memory": found.memory.to_dict(),
        "pools": [p.to_dict() for p in found.pools],
        "holders": {by: [r.to_dict() for r in rows] for by, rows in holders.items()},
        "oom": None if found.oom is None else found.oom.to_dict(),
        "advice": [a.to_dict() for a in found.advice],
        "rejected": [a.to_dict() for a in found.rejected],
        "notes": list(found.notes),
        "settings": found.settings,
        "pools_in_use": found.pools_in_use,
        "growth": [g.to_dict() for g in found.growth],
        "lifetimes": [x.to_dict() for x in found.lifetimes],
        "steps": None if found.steps is None else found.steps.to_dict(),
        "forecast": None if found.forecast is None else found.forecast.to_dict(),
        "recorded": dict(found.recorded),
        "devices": {
            str(d): _as_dict(f, holders if d == only and f.snapshot is found.snapshot else None)
            for d, f in found.devices.items()
        },
    }


def _only_device(found: Findings) -> int | None:
    """The device every segment of `found`'s snapshot is on, when `found` is the whole
    snapshot's (device None) and the snapshot has segments; else None."""
    snap = found.snapshot
    if found.device is not None or snap is None or not len(snap.segments.device):
        return None
    devices = np.unique(snap.segments.device)
    return int(devices[0]) if len(devices) == 1 else None


def analyze(
    source: SnapshotLike | Sample,
    *,
    device: int | None = None,
    check: bool = True,
    pools_in_use: bool = True,
    shared: SharedReplay | None = None,
    device_total: int | None = None,
) -> Findings:
    """Analyse a snapshot or a live sample: figures, pools, holders, OOM, checked advice.

    Parameters
    ----------
    source : Snapshot, torch dict or list, path or bytes, or Sample
        A snapshot file, a torch snapshot dict, a `Snapshot`, or a live `Sample` (its segment
        state, stats, NVML reading and captured OOM).
    device : int, optional
        Only this device. Default: every device; with several, `figures` are their totals,
        `devices` maps each to its own findings and `oom` is the failing device's.
    check : bool
        Replay setting advice on the recorded trace (`gpumemviz.analysis.advice_check`) and
        move the advice the replay refutes to `rejected`. Without a trace, or with False, the
        advice stays unchecked and `unchecked` says why.
    pools_in_use : bool
        Take every private pool as still in use (a snapshot does not record it).
    shared : SharedReplay, optional
        The snapshot's reconstruction to replay on (default: one of its own); pass one made
        on the same `Snapshot` to read its recordings afterwards (the HTML report's timeline).
    device_total : int, optional
        The device's memory in bytes, for the forecast (default: a live sample's, or what an
        ``oom`` entry of the trace shows: reserved there plus the device's free bytes).

    Returns
    -------
    Findings

    Raises
    ------
    ValueError
        `device` is not in the snapshot, or a sample holds no segment state.

    Examples
    --------
    >>> from gpumemviz.allocator.model import CachingAllocator
    >>> a = CachingAllocator(1 << 30); _ = a.malloc(3 << 20)
    >>> f = analyze(a.snapshot())
    >>> f.figures.allocated + f.figures.pending_free + f.figures.free_in_reserved \\
    ...     == f.figures.reserved
    True
    >>> f.oom is None, f.to_dict()["figures"]["allocated"]
    (True, 3145728)
    """
    if isinstance(source, Sample):
        return _analyze_sample(source, device, check, device_total)
    snap = as_snapshot(source)
    if shared is not None and shared.snap is not snap:
        raise ValueError("analyze: `shared` was made for another snapshot")
    return _analyze_snapshot(
        snap, device, check, pools_in_use, shared or SharedReplay(snap), device_total
    )


# ------------------------------------------------------------------------------- snapshot


def _analyze_snapshot(
    snap: Snapshot,
    only: int | None,
    check: bool,
    pools_in_use: bool,
    shared: SharedReplay,
    device_total: int | None,
) -> Findings:
    report = fragmentation(snap, pools_in_use=pools_in_use)
    devices = list(report.devices)
    if only is not None:
        report.device(only)  # raises, naming the devices present
        devices = [only]
    oom_free = oom_device_free(snap)
    found = advise_each_device(report, oom_free, devices)
    checked = (
        check_advice(snap, found, shared=shared)
        if check
        else CheckedAdvice(
            [Checked(a, unchecked=NOT_CHECKED if setting_of(a) else None) for a in found], []
        )
    )
    settings = _settings_text(report)
    overflowed = bool((snap.allocator_settings or {}).get("trace_alloc_overflowed"))
    per: dict[int, Findings] = {}
    for d in devices:
        trace = snap.traces.get(d)
        entry = len(trace) - 1 if trace is not None and len(trace) else None
        when = _entry_time(snap, d, entry)
        notes: list[str] = []
        oom, at_oom = _trace_oom(snap, d, shared, notes)
        m = report.devices[d]
        if oom is None:
            oom = _full_state_oom(snap, d, m, trace is not None and _has_allocs(snap, d))
        shown = tuple(AdviceItem.of(c) for c in checked.shown if _device_of(c) in (d, None))
        refused = tuple(AdviceItem.of(c) for c in checked.rejected if _device_of(c) == d)
        if any(a.setting is not None and not a.checked for a in shown):
            why = {a.unchecked for a in shown if a.unchecked}
            notes += [f"setting advice unchecked: {w}" for w in sorted(why)]
        if overflowed:
            notes.append(OVERFLOWED)
        if oom is not None:  # what held the memory when it ran out
            held = tuple(live_holders(snap if at_oom is None else at_oom, device=d))
            oom = replace(oom, actions=_actions(oom, m, held, report))
        suspects, lifetimes, steps = (
            growth(trace, snap.external_annotations, d, m.allocated)
            if trace is not None
            else ((), (), None)
        )
        capacity = device_total or _oom_capacity(oom)
        per[d] = Findings(
            device=d,
            figures=Figures.of(m, entry=entry, time=when, device_total=device_total),
            memory=m,
            pools=m.pools,
            oom=oom,
            advice=shown,
            rejected=refused,
            notes=tuple(notes),
            settings=settings,
            pools_in_use=pools_in_use,
            growth=suspects,
            lifetimes=lifetimes,
            steps=steps,
            forecast=_trace_forecast(trace, m.reserved, capacity, steps),
            recorded=_recorded(trace),
            snapshot=snap,
            shared=shared,
        )
    if only is not None:
        return per[only]
    failing = [f.oom for f in per.values() if f.oom is not None]
    notes_all = [f"cuda:{d}: {n}" for d, f in per.items() for n in f.notes]
    forecasts = [f.forecast for f in per.values() if f.forecast is not None]
    recorded: dict[str, int] = {}
    for f in per.values():
        for k, v in f.recorded.items():
            recorded[k] = recorded.get(k, 0) + v
    return Findings(
        device=None,
        figures=Figures.of(report.total),
        memory=report.total,
        pools=tuple(p for f in per.values() for p in f.pools),
        oom=failing[0] if failing else None,
        advice=tuple(a for f in per.values() for a in f.advice),
        rejected=tuple(a for f in per.values() for a in f.rejected),
        notes=tuple(notes_all) if len(per) > 1 else tuple(n for f in per.values() for n in f.notes),
        settings=settings,
        pools_in_use=pools_in_use,
        devices=per,
        growth=tuple(g for f in per.values() for g in f.growth),
        lifetimes=tuple(x for f in per.values() for x in f.lifetimes),
        steps=per[devices[0]].steps if len(per) == 1 else None,
        forecast=min(forecasts, key=lambda x: x.seconds) if forecasts else None,
        recorded=recorded,
        snapshot=snap,
        shared=shared,
    )


def _device_of(c: Checked) -> int | None:
    d = c.advice.evidence.get("device")
    return None if d is None else int(d)


def _settings_text(report: FragmentationReport) -> str | None:
    if report.allocator_settings is None:
        return None
    conf = report.allocator_settings.get("PYTORCH_CUDA_ALLOC_CONF")
    return conf if isinstance(conf, str) else ""


def _entry_time(snap: Snapshot, device: int, entry: int | None) -> float | None:
    if entry is None:
        return None
    t = int(snap.traces[device].time_us[entry])
    return t / 1e6 if t > 0 else None


def _has_allocs(snap: Snapshot, device: int) -> bool:
    trace = snap.traces[device]
    names = list(trace.action_names)
    return bool(len(trace)) and bool((trace.action == names.index("alloc")).any())


def _trace_oom(
    snap: Snapshot, device: int, shared: SharedReplay, notes: list[str]
) -> tuple[OomFinding | None, Snapshot | None]:
    """The newest ``oom`` entry of the device's trace, judged on the state replayed to it
    (returned too, None when the final state stood in for it)."""
    trace = snap.traces.get(device)
    if trace is None or not len(trace) or "oom" not in trace.action_names:
        return None, None
    hits = np.flatnonzero(trace.action == list(trace.action_names).index("oom"))
    if not len(hits):
        return None, None
    i = int(hits[-1])
    e = trace.entry(i)
    prepared = shared.get()
    segments = _segments_at(prepared, device, i)
    at_oom = None if segments is None else Snapshot.from_torch({"segments": segments})
    if segments is None:
        why = prepared if isinstance(prepared, str) else "no recording of this device"
        notes.append(f"the OOM at entry {i} is judged on the final state: {why}")
        final = snap.to_torch_segments()["segments"]
        segments = [s for s in final if s.get("device") == device]
    size = int(e.get("size", 0) or 0)
    free = max(0, int(e.get("device_free", 0) or 0))
    reserved = sum(int(s.get("total_size", 0)) for s in segments)
    stream = e.get("stream")
    stamp = e.get("time_us")
    event = classify_event(
        OomEvent(
            time=stamp / 1e6 if isinstance(stamp, (int, float)) and stamp > 0 else 0.0,
            device=device,
            alloc_size=size,
            device_limit=reserved + free,
            device_free=free,
            request_size=size or None,
            snapshot={"segments": segments, "allocator_settings": snap.allocator_settings},
            device_total=reserved + free,
            stream=stream if isinstance(stream, int) else None,
        )
    )
    frames = e.get("frames")
    return _finding(event, entry=i, basis="trace", frames=frames, settings=snap), at_oom


def _segments_at(prepared: Prepared | str, device: int, i: int) -> list[TorchDict] | None:
    if isinstance(prepared, str):
        return None
    rec = prepared.timelines.get(device)
    if rec is None or i >= len(rec):
        return None
    return rec.layout_at(i).to_segments(rec.device, shared=True, frames=rec.frames_after(i))


def _finding(
    event: OomEvent, *, entry: int | None, basis: str, frames: object, settings: Snapshot | None
) -> OomFinding:
    request = event.request_size
    rounded = None
    if request:
        divisions = None
        if settings is not None:
            try:
                divisions = settings.config.roundup_power2_divisions
            except ValueError:
                divisions = None
        rounded = round_size(int(request), divisions)
    frame = None
    if isinstance(frames, list) and frames:
        top = user_frame(frames)
        frame = None if top is None else format_frame(top)
    return OomFinding(
        device=int(event.device),
        entry=entry,
        request=None if request is None else int(request),
        rounded=rounded,
        cause=str(event.cause),
        explanation=str(event.explanation),
        basis=basis,
        reserved=int(event.reserved),
        allocated=int(event.allocated),
        free_in_reserved=int(event.free_in_segments),
        largest_free=int(event.largest_free_block),
        device_free=int(event.device_free),
        outside=int(event.outside_bytes),
        frame=frame,
        actions=(),
        alloc_size=int(event.alloc_size) if event.alloc_size else None,
        time=float(event.time) if event.time > 0 else None,
    )


def _full_state_oom(
    snap: Snapshot, device: int, m: MemoryFigures, history: bool
) -> OomFinding | None:
    """A device without recorded history whose final state is as full as one taken inside an
    OOM (`FULL_FREE_SHARE`): judged on that state (the request is unknown)."""
    if history or m.reserved <= 0 or m.releasable or m.releasable_private:
        return None
    if m.free + m.pending_free > FULL_FREE_SHARE * m.reserved:
        return None
    explanation = (
        f"no OOM entry is recorded (history was off), but the final state is as full as a "
        f"snapshot taken at an OOM: {format_size(m.allocated)} is allocated of "
        f"{format_size(m.reserved)} reserved, {format_size(m.free)} free in reserved (largest "
        f"block {format_size(m.largest_free)}) and nothing that empty_cache could return, so "
        f"any request over {format_size(m.largest_free)} needed new memory from the device"
    )
    return OomFinding(
        device=device,
        entry=None,
        request=None,
        rounded=None,
        cause="capacity",
        explanation=explanation,
        basis="final state",
        reserved=m.reserved,
        allocated=m.allocated,
        free_in_reserved=m.free,
        largest_free=m.largest_free,
        device_free=None,
        outside=0,
        frame=None,
        actions=(),
    )


def _actions(
    oom: OomFinding, m: MemoryFigures, holders: tuple[Holder, ...], report: FragmentationReport
) -> tuple[Action, ...]:
    """The ranked actions for an OOM, each with its expected effect in bytes: the one that
    answers the cause first, then what the holders and pools offer. Never empty."""
    out: list[Action] = []
    need = oom.rounded or 0
    room = oom.device_free if oom.device_free is not None else 0
    shortfall = max(need - room, 0)
    top = next((h for h in holders if h.frame is not None), None)
    if oom.cause == "fragmentation":
        if not report.config.expandable_segments:
            out.append(
                Action(
                    "expandable_segments",
                    "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so free memory "
                    f"grows into one block: {format_size(oom.free_in_reserved)} is free in "
                    f"reserved but the largest block is {format_size(oom.largest_free)}",
                    oom.free_in_reserved,
                )
            )
        out.append(
            Action(
                "empty_cache_before_step",
                "call torch.cuda.empty_cache() before the step that fails, so the allocator "
                f"maps {format_size(need)} in one piece rather than searching split blocks",
                need,
            )
        )
    elif oom.cause == "outside":
        out.append(
            Action(
                "free_outside",
                f"free the device memory held outside PyTorch ({format_size(oom.outside)}: "
                "other processes, NCCL buffers, another framework's pool)",
                oom.outside,
            )
        )
    if oom.cause in ("capacity", "unknown") and need:
        out.append(
            Action(
                "smaller_batch_or_checkpointing",
                "smaller batch or activation checkpointing: the step needs "
                f"{format_size(shortfall or need)} more than the device has",
                shortfall or need,
            )
        )
    if top is not None and top.bytes > 0:
        out.append(
            Action(
                "shrink_holder",
                f"hold less at {top.label} ({format_size(top.bytes)} live, the largest holder): "
                "a smaller batch, activation checkpointing or lower precision there",
                top.bytes,
            )
        )
    if m.releasable_private:
        out.append(
            Action(
                "release_idle_pool",
                f"release the private pools no longer needed: {format_size(m.releasable_private)}"
                " would return to the device",
                m.releasable_private,
            )
        )
    if not out:  # an OOM always gets a way out with a figure
        out.append(
            Action(
                "smaller_batch_or_checkpointing",
                "smaller batch, activation checkpointing or lower precision: live tensors hold "
                f"{format_size(oom.allocated)} of the {format_size(oom.reserved)} reserved",
                oom.allocated,
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------------- sample


def _analyze_sample(
    sample: Sample, only: int | None, check: bool, device_total: int | None
) -> Findings:
    """A live read: its one segment state, stats, NVML reading and captured OOM."""
    snap = sample.segments
    if snap is None:
        raise ValueError(f"the sample of cuda:{sample.device} holds no segment state")
    device = sample.device if only is None else only
    report = fragmentation(snap)
    m = report.devices.get(device)
    if m is None:
        m = fragmentation([]).total
    info, nvml, stats = sample.device_info, sample.nvml, sample.stats
    settings = (info.allocator_settings or None) if info is not None else None
    total = (info.total_memory or None) if info is not None else None
    if total is None and nvml is not None and nvml.available:
        total = nvml.total
    if total is None and sample.oom is not None and sample.oom.device_total:
        total = sample.oom.device_total  # an OOM's sample made before the device was first read
    if device_total:
        total = device_total
    found = (
        advise(report, settings, stats, device_total=total, device=device)
        if device in report.devices
        else []
    )
    traced = bool(snap.traces.get(device) is not None and len(snap.traces[device]))
    notes: list[str] = []
    if traced and check:
        checked = check_advice(snap, found)
    else:
        why = NOT_CHECKED if traced else LIVE_UNCHECKED
        checked = CheckedAdvice(
            [Checked(a, unchecked=why if setting_of(a) else None) for a in found], []
        )
        if not traced:
            notes.append(LIVE_UNCHECKED)
    oom = None
    if sample.oom is not None and sample.oom.device == device:
        oom = _finding(sample.oom, entry=None, basis="event", frames=None, settings=None)
        held = tuple(live_holders(snap, device=device))
        oom = replace(oom, actions=_actions(oom, m, held, report))
    trace = snap.traces.get(device)
    suspects, lifetimes, steps = (
        growth(trace, snap.external_annotations, device, m.allocated)
        if trace is not None
        else ((), (), None)
    )
    nvml_used = nvml.used if nvml is not None and nvml.available else None
    non_pytorch = nvml.non_pytorch if nvml is not None and nvml.available else None
    return Findings(
        device=device,
        figures=Figures.of(
            m, device_total=total, nvml_used=nvml_used, non_pytorch=non_pytorch, time=sample.time
        ),
        memory=m,
        pools=m.pools,
        oom=oom,
        advice=tuple(AdviceItem.of(c) for c in checked.shown),
        rejected=tuple(AdviceItem.of(c) for c in checked.rejected),
        notes=tuple(notes),
        settings=settings if settings is not None else _settings_text(report),
        pools_in_use=True,
        growth=suspects,
        lifetimes=lifetimes,
        steps=steps,
        forecast=_trace_forecast(trace, m.reserved, total, steps),
        recorded=_recorded(trace),
        snapshot=snap,
        shared=SharedReplay(snap),
    )


# ------------------------------------------------------------------- forecast and fields


def _oom_capacity(oom: OomFinding | None) -> int | None:
    """The device's memory as an ``oom`` entry shows it: reserved there plus the free bytes
    the device reported (None without one)."""
    if oom is None or oom.basis != "trace" or oom.device_free is None:
        return None
    return oom.reserved + oom.device_free or None


def _trace_forecast(
    trace: Trace | None, reserved: int, capacity: int | None, steps: Steps | None
) -> Forecast | None:
    """The forecast from a timed trace's reserved bytes (None without times or capacity)."""
    if trace is None or not capacity:
        return None
    series = reserved_series(trace, reserved)
    if series is None:
        return None
    step_seconds = None
    if steps is not None:
        t = trace.time_us[np.asarray(steps.starts, np.int64)]
        if (t > 0).all():
            step_seconds = float(np.median(np.diff(t))) / 1e6 or None
    return forecast(*series, capacity, step_seconds=step_seconds)


def _recorded(trace: Trace | None) -> dict[str, int]:
    """How many entries hold each newer torch field (only those present)."""
    if trace is None or not len(trace):
        return {}
    out: dict[str, int] = {}
    names = trace.action_names
    if "annotate" in names:
        out["annotate"] = int((trace.action == names.index("annotate")).sum())
    # the counts of torch's "nothing" values run at C speed (`list.count`); a Python loop
    # runs only where something else was recorded
    for key in ("user_metadata", "internal_metadata"):
        values = trace.values(key)
        n = len(values) - values.count(None)
        if n and n > values.count(""):
            n = sum(1 for v in values if metadata_text(v) is not None)
        else:
            n = 0
        if n:
            out[key] = n
    nothing: dict[str, tuple[object, ...]] = {
        "pool_id": ([], ()),
        "forward_frames": ([], ()),
        "compile_context": ("", "N/A"),
    }
    for key, others in nothing.items():
        values = trace.values(key)
        n = len(values) - values.count(None)
        if n:
            n -= sum(map(values.count, others))
        if n:
            out[key] = n
    # each distinct frames list judged once (lists are shared), its uses counted at C speed
    frames = trace.frames()
    fx_frame: dict[int, bool] = {}  # id(frame) -> is an FX frame (frame dicts are shared too)
    with_fx = []
    for list_id, fr in dict(zip(map(id, frames), frames, strict=True)).items():
        for f in fr:
            is_fx = fx_frame.get(id(f))
            if is_fx is None:
                is_fx = fx_frame[id(f)] = isinstance(f, dict) and any(
                    str(k).startswith("fx_") for k in f
                )
            if is_fx:
                with_fx.append(list_id)
                break
    n = 0
    if with_fx:
        uses = Counter(map(id, frames))
        n = sum(uses[list_id] for list_id in with_fx)
    if n:
        out["fx"] = n
    return {k: out[k] for k in sorted(out)}
