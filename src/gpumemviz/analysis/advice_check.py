"""Check setting advice against the snapshot's own recorded trace before suggesting it.

`advise()` reads one moment (the fragmentation it sees); a setting it suggests is a hypothesis
about the whole run. Where the snapshot records a trace for the advice's device, this module
replays that trace (`allocator.replay`, the same replay `gpumemviz whatif` runs) once with the
recorded settings and once more per advised setting added to them (every check shares one
reconstruction and one recorded pass, `replay.prepare`), and compares peak reserved, peak
segments and the OOM. Only advice whose kind is an allocator setting is checked
(`CHECKED_KINDS`); the others, and advice for a device without a trace, pass unchanged.

Advice the replay shows to be worse (a higher peak reserved, an OOM the recorded settings did
not have, or an earlier one) is moved to a separate `rejected` list with its numbers rather
than dropped: a reader who sees heavy fragmentation expects the setting, and the numbers say
why it is not suggested (and can be reproduced with `gpumemviz whatif`).

`SharedReplay` holds that one reconstruction, made on first use; a caller that passes its own
(the HTML report) reads the recordings afterwards instead of building them again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpumemviz.allocator.config import AllocatorConfig, ConfigError
from gpumemviz.allocator.replay import Prepared, ReplayError, ReplayResult, prepare
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.analysis.advice import Advice
from gpumemviz.io import SnapshotLike, as_snapshot
from gpumemviz.snapshot import ACTIONS, Snapshot, SnapshotError
from gpumemviz.snapshot.escaping import error_line
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import JsonDict

__all__ = [
    "CHECKED_KINDS",
    "Checked",
    "CheckedAdvice",
    "ReplayCheck",
    "SharedReplay",
    "check_advice",
    "setting_of",
]

#: Advice kinds that name an allocator setting, so a replay can try them.
CHECKED_KINDS = ("expandable_segments", "max_split_size_mb")

BETTER, SAME, WORSE = "better", "same", "worse"


@dataclass(frozen=True)
class ReplayCheck:
    """One advice replayed: the recorded trace with the recorded settings ("before") and with
    the advised setting added ("after"). OOMs are trace entry indexes (None: none)."""

    device: int
    setting: str  # what the advice adds, e.g. "max_split_size_mb:32"
    settings: str  # the PYTORCH_CUDA_ALLOC_CONF replayed: recorded + the advice's
    events: int
    capacity: int | None  # None: unknown (no OOM recorded), the model never runs out
    peak_reserved_before: int
    peak_reserved_after: int
    peak_segments_before: int
    peak_segments_after: int
    oom_before: int | None
    oom_after: int | None
    seconds: float  # wall time of the replay with the setting

    @property
    def verdict(self) -> str:
        """`better`, `same` or `worse`: an OOM first, then peak reserved."""
        a, b = self.oom_before, self.oom_after
        if a is None and b is not None:
            return WORSE  # runs out where the recorded settings did not
        if a is not None and b is None:
            return BETTER  # the recorded OOM is avoided
        if a is not None and b is not None and a != b:
            return BETTER if b > a else WORSE
        if self.peak_reserved_after < self.peak_reserved_before:
            return BETTER
        if self.peak_reserved_after > self.peak_reserved_before:
            return WORSE
        return SAME

    def sentence(self) -> str:
        """The one sentence the advice's message gains."""
        fs = format_size
        s = (
            f"Replay of the recorded trace with {self.setting}: peak reserved "
            f"{fs(self.peak_reserved_before)} -> {fs(self.peak_reserved_after)}, peak segments "
            f"{self.peak_segments_before} -> {self.peak_segments_after}"
        )
        a, b = self.oom_before, self.oom_after
        if a is not None and b is None:
            s += f", the OOM at entry {a} avoided"
        elif a is None and b is not None:
            s += f", but an OOM at entry {b} that the recorded settings did not have"
        elif a is not None and b is not None:
            s += f", OOM at entry {a} -> {b}" if a != b else f", the OOM at entry {a} reproduced"
        tail = {BETTER: ".", SAME: " (no gain).", WORSE: ": worse, so not suggested."}
        return s + tail[self.verdict]

    def evidence(self) -> dict[str, int | float]:
        """Numbers for `Advice.evidence` (-1: no OOM / capacity unknown, evidence is numeric)."""
        return {
            "replay_peak_reserved": self.peak_reserved_before,
            "replay_peak_reserved_with_setting": self.peak_reserved_after,
            "replay_peak_segments": self.peak_segments_before,
            "replay_peak_segments_with_setting": self.peak_segments_after,
            "replay_oom_at": -1 if self.oom_before is None else self.oom_before,
            "replay_oom_at_with_setting": -1 if self.oom_after is None else self.oom_after,
            "replay_capacity": -1 if self.capacity is None else self.capacity,
        }

    def to_dict(self) -> JsonDict:
        return {
            "device": self.device,
            "setting": self.setting,
            "settings": self.settings,
            "verdict": self.verdict,
            "events": self.events,
            "capacity": self.capacity,
            "capacity_known": self.capacity is not None,
            "before": {
                "peak_reserved": self.peak_reserved_before,
                "peak_segments": self.peak_segments_before,
                "oom_at": self.oom_before,
            },
            "after": {
                "peak_reserved": self.peak_reserved_after,
                "peak_segments": self.peak_segments_after,
                "oom_at": self.oom_after,
            },
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class Checked:
    """One advice after the check: `check` is its replay (None when not replayed), and
    `unchecked` says why a setting advice was not replayed (None otherwise)."""

    advice: Advice
    check: ReplayCheck | None = None
    unchecked: str | None = None

    def to_dict(self) -> JsonDict:
        """`Advice.to_dict()` plus `replay` (the check, or None) and `replay_skipped`."""
        out = self.advice.to_dict()
        out["replay"] = None if self.check is None else self.check.to_dict()
        out["replay_skipped"] = self.unchecked
        return out


@dataclass(frozen=True)
class CheckedAdvice:
    """What `check_advice` returns: the advice to show, in `advise()`'s order, and the advice
    the replay refuted (kept with its numbers, never shown as a suggestion)."""

    shown: list[Checked]
    rejected: list[Checked]

    @property
    def advice(self) -> list[Advice]:
        """The advice to show, as `advise()` returns it."""
        return [c.advice for c in self.shown]


def setting_of(advice: Advice) -> str | None:
    """The PYTORCH_CUDA_ALLOC_CONF pair an advice suggests, or None for other kinds."""
    if advice.kind == "expandable_segments":
        return "expandable_segments:True"
    if advice.kind == "max_split_size_mb":
        mib = advice.evidence.get("suggested_max_split_size_mb")
        return None if mib is None else f"max_split_size_mb:{int(mib)}"
    return None


class SharedReplay:
    """A snapshot's one reconstruction (`allocator.replay.prepare`), made on first use.

    `check_advice` prepares through it only when an advice needs a replay; the caller then
    reads `recordings()` (the recorded history of each traced device) rather than reconstruct
    the trace once more.
    """

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self._got: Prepared | str | None = None

    def get(self) -> Prepared | str:
        """The prepared snapshot, or why its trace cannot be replayed."""
        if self._got is None:
            self._got = _prepare(self.snap)
        return self._got

    def recordings(self) -> dict[int, Recording]:
        """Each traced device's `Recording`, when the replay was prepared (else empty)."""
        return dict(self._got.timelines) if isinstance(self._got, Prepared) else {}


def check_advice(
    snapshot: SnapshotLike, advice: Iterable[Advice], *, shared: SharedReplay | None = None
) -> CheckedAdvice:
    """Replay each setting advice on the snapshot's recorded trace; keep what is not worse.

    Parameters
    ----------
    snapshot : Snapshot or anything `io.as_snapshot` accepts
        The snapshot the advice was computed from (its trace and recorded settings).
    advice : iterable of Advice
        What `advise()` returned, in its order.
    shared : SharedReplay, optional
        The reconstruction to replay on, made on first need (default: one of its own); pass
        one built on the same snapshot to read its recordings afterwards.

    Returns
    -------
    CheckedAdvice
        `shown` keeps the input order, minus the rejected; a checked advice is a copy whose
        message ends with the replay's sentence and whose evidence has `replay_*` numbers.
        Advice that cannot be replayed (no trace for its device, a private pool, a setting
        the recorded ones cannot take) is shown unchanged, with the reason in `unchecked`.
    """
    snap = as_snapshot(snapshot)
    if shared is not None and shared.snap is not snap:
        raise ValueError("check_advice: `shared` was made for another snapshot")
    base = _recorded_config(snap)
    runs: dict[str, tuple[ReplayResult, float] | str] = {}  # one replay per settings string
    prepared = SharedReplay(snap) if shared is None else shared  # every check shares it
    shown: list[Checked] = []
    rejected: list[Checked] = []
    for a in advice:
        setting = setting_of(a)
        if setting is None or "device" not in a.evidence:
            shown.append(Checked(a))
            continue
        device = int(a.evidence["device"])
        config = _config_for(snap, base, device, setting)
        if isinstance(config, str):
            shown.append(Checked(a, unchecked=config))
            continue
        if config.settings not in runs:
            runs[config.settings] = _replay(prepared.get(), config)
        run = runs[config.settings]
        if isinstance(run, str):
            shown.append(Checked(a, unchecked=run))
            continue
        check = _check(*run, device, setting, config.settings)
        out = replace(
            a,
            message=f"{a.message} {check.sentence()}",
            evidence={**a.evidence, **check.evidence()},
        )
        (rejected if check.verdict == WORSE else shown).append(Checked(out, check))
    return CheckedAdvice(shown, rejected)


def _recorded_config(snap: Snapshot) -> AllocatorConfig | str:
    try:
        return snap.config
    except ConfigError as e:
        return f"the recorded settings cannot be read: {e}"


def _config_for(
    snap: Snapshot, base: AllocatorConfig | str, device: int, setting: str
) -> AllocatorConfig | str:
    """The settings to replay the advice with, or why it cannot be replayed."""
    if isinstance(base, str):
        return base
    why = _unreplayable(snap, device)
    return why if why is not None else _with_setting(base, setting)


def _unreplayable(snap: Snapshot, device: int) -> str | None:
    """Why this device's trace cannot be replayed, or None when it can."""
    trace = snap.traces.get(device)
    if trace is None or not len(trace):
        return f"no recorded trace for device {device}"
    if not (trace.action == ACTIONS.index("alloc")).any():
        # nothing the setting could decide differently: "no gain" would be no evidence
        return f"the recorded trace of device {device} has no allocation to replay"
    return None


def _with_setting(base: AllocatorConfig, setting: str) -> AllocatorConfig | str:
    """The recorded settings with one more `key:value`: the recorded fields are kept (the
    settings dict can hold values its string lacks) and only the advised field changes."""
    try:
        extra = AllocatorConfig.parse(setting)
    except ConfigError as e:
        return f"{setting} is not a valid setting: {e}"
    key = setting.split(":", 1)[0]
    if key == "max_split_size_mb" and extra.max_split_size < base.large_segment_size:
        return f"{setting} is below large_segment_size_mb, PyTorch would refuse it"
    kept = [p for p in base.settings.split(",") if p.strip() and p.split(":")[0].strip() != key]
    settings = ",".join([*kept, setting])
    if key == "max_split_size_mb":
        return replace(base, settings=settings, max_split_size=extra.max_split_size)
    return replace(base, settings=settings, expandable_segments=extra.expandable_segments)


def _prepare(snap: Snapshot) -> Prepared | str:
    """The snapshot reconstructed and scored once (`replay.prepare`), or why it cannot be."""
    try:
        return prepare(snap)
    except (ReplayError, SnapshotError, ValueError) as e:
        return f"the trace cannot be replayed: {error_line(e)}"


def _replay(prepared: Prepared | str, config: AllocatorConfig) -> tuple[ReplayResult, float] | str:
    """One what-if pass (every traced device) on the shared reconstruction, or why it could
    not run; the seconds are the what-if pass's own."""
    if isinstance(prepared, str):
        return prepared
    t = time.perf_counter()
    try:
        result = prepared.replay(config)
        # the recorded pass each check compares with (`_check`), driven here if not yet,
        # where its error is caught
        _ = [result.recorded[dev] for dev in result.devices]
    except (ReplayError, SnapshotError, ValueError) as e:
        return f"the trace cannot be replayed: {error_line(e)}"
    return result, time.perf_counter() - t


def _check(
    result: ReplayResult, seconds: float, device: int, setting: str, settings: str
) -> ReplayCheck:
    before, after = result.recorded[device], result.devices[device]
    return ReplayCheck(
        device=device,
        setting=setting,
        settings=settings,
        events=len(result.timelines[device]),
        capacity=after.capacity if after.capacity_known else None,
        peak_reserved_before=int(before.peak_reserved),
        peak_reserved_after=int(after.peak_reserved),
        peak_segments_before=result.peak_segments(device, "replayed"),
        peak_segments_after=result.peak_segments(device, "predicted"),
        oom_before=before.oom,
        oom_after=after.oom,
        seconds=seconds,
    )
