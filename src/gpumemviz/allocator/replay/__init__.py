"""Replay: a recorded snapshot's trace run through the allocator model, decision by decision.

With the recorded settings the model makes every decision and is scored against the recording.
With other settings or another capacity ("what if"), segment addresses are invented and only
the address-free figures are compared (reserved, allocated and segments over time, peak
reserved, OOM): the recorded addresses say nothing about a run the recorded settings did not
make. `replay(snapshot)` here is the public `gpumemviz.replay`; the machinery sits in the
subpackage's modules:

- layout.py: `Layout`, one device's segments and blocks, moved by trace entries
- reconstruct.py: the state at the start of a trace, by walking it backwards
- lives.py: the same start and figures from each block's life, by array passes (no expandable
  segments; what `replay` reads)
- trail.py: what that walk keeps for the recording (figures, checkpoints, proof of exactness)
- steps.py: a trace as the walks read it (`Step` tuples) and the `Rules` that size blocks
- forward.py: one trace entry applied forwards at its recorded address
- recording.py: `Recording`, the recorded history after every entry (the ground truth)
- columns.py: a `Snapshot`'s trace read as steps from its numpy columns
- placement.py: where the model's segments go (the recorded addresses)
- driver.py: one device's pass through a fresh model, scored (`drive`)
- result.py: `DeviceReplay`, `ReplayResult`, `ReplayError`

The model is imported only when `replay` runs, so `recording.Recording` (what export and
playback read) does not load it.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.replay.layout import LayoutError
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.allocator.replay.result import DeviceReplay, ReplayError, ReplayResult
from gpumemviz.snapshot import Snapshot, SnapshotError, Trace
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.gc_pause import no_gc
from gpumemviz.snapshot.units import parse_size

if TYPE_CHECKING:
    from gpumemviz.io import SnapshotLike
    from gpumemviz.snapshot.schema import TorchMapping

__all__ = ["DeviceReplay", "Prepared", "ReplayError", "ReplayResult", "prepare", "replay"]


# --------------------------------------------------------------------------- the public entry


def _as_source(
    snapshot: SnapshotLike | TorchMapping,
) -> tuple[TorchMapping, Mapping[int, Trace] | None, AllocatorConfig]:
    """The torch dict replay reads, each device's trace as columns where it has them, and the
    recorded settings, parsed once for the whole replay.

    A `Snapshot`'s dict is built without its traces (a dict per entry: the most of its time
    and memory); the recordings read the traces' columns instead, and its settings are its own
    `config` (parsed when the snapshot was first asked). A torch dict's traces are read into
    columns too (`_columns_of`): the same values, at a fraction of the cost of reading each
    entry dict as replay walks.
    """
    if isinstance(snapshot, Mapping):
        if "segments" not in snapshot:
            raise ReplayError("snapshot dict has no 'segments' key")
        return snapshot, _columns_of(snapshot), _recorded_config(snapshot)
    if isinstance(snapshot, list):
        data: TorchMapping = {"segments": snapshot, "device_traces": []}
        return data, None, _recorded_config(data)
    if isinstance(snapshot, Snapshot):
        return snapshot.to_torch_segments(), snapshot.traces, snapshot.config
    to_torch = getattr(snapshot, "to_torch", None)
    if callable(to_torch):
        data = to_torch()
        return data, None, _recorded_config(data)
    try:
        from gpumemviz.io import load_snapshot
    except ImportError:  # pragma: no cover - io is part of the package
        raise ReplayError(
            f"cannot read a snapshot from {type(snapshot).__name__}: pass the torch dict"
        ) from None
    return _as_source(load_snapshot(snapshot))


def _recorded_config(snap: TorchMapping) -> AllocatorConfig:
    """A torch dict's ``allocator_settings``, parsed (torch's defaults where none)."""
    return AllocatorConfig.from_settings(snap.get("allocator_settings"))


def _columns_of(snap: TorchMapping) -> dict[int, Trace] | None:
    """Each device's trace of a torch dict as a `Snapshot` holds it; None where one does not
    read as columns (not a list, an entry not a dict), so the entry dicts are read and their
    errors named as before."""
    traces = snap.get("device_traces")
    if not isinstance(traces, list):
        return None
    try:
        # share=False: the caller's dict keeps every entry's stack anyway
        return {
            d: Trace.from_entries(t, f"device_traces[{d}]", share=False)
            for d, t in enumerate(traces)
        }
    except SnapshotError:
        return None


def _capacity_from_oom(tl: Recording, i: int | None) -> int | None:
    """Bytes the process could get: reserved at the recorded OOM (entry `i`, the first) plus
    the device_free it saw."""
    if i is None:
        return None
    before = int(tl.reserved[i - 1]) if i > 0 else tl.start.totals()[0]
    return before + tl.steps[i][1]


def _inferred_source(inferred: int | None) -> str:
    """Where a capacity not given came from: a recorded oom entry, or nowhere."""
    return "unknown" if inferred is None else "oom entry"


def _source(d: DeviceReplay, source: str, oom_at: int | None) -> None:
    d.capacity_source = source
    d.capacity_oom = oom_at if source == "oom entry" else None


def _as_config(config: str | AllocatorConfig | None, recorded: AllocatorConfig) -> AllocatorConfig:
    if config is None:
        return recorded
    if isinstance(config, AllocatorConfig):
        return config
    if isinstance(config, str):
        return AllocatorConfig.parse(config)
    raise TypeError(f"config must be a str or AllocatorConfig, got {type(config).__name__}")


def _as_capacity(value: object, what: str = "capacity") -> int | None:
    """Bytes from an int or a size string ("24GiB"), refusing zero and negatives."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    elif not isinstance(value, str | float):
        raise TypeError(f"{what} must be bytes or a size string, got {short_repr(value)}")
    if str(value).strip().startswith("-"):
        raise ValueError(f"{what} must be positive, got {short_repr(value)}")
    try:
        size = parse_size(value)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None
    if size <= 0:
        raise ValueError(f"{what} must be positive, got {short_repr(value)}")
    return size


def _same_rules(a: AllocatorConfig, b: AllocatorConfig) -> bool:
    return a.changed() == b.changed()


def replay(
    snapshot: SnapshotLike | TorchMapping,
    config: str | AllocatorConfig | None = None,
    capacity: int | str | Mapping[int, int | str] | None = None,
) -> ReplayResult:
    """Replay a recorded snapshot's traces through the allocator model, one model per device.

    With the recorded settings the model makes every decision and is scored against the
    recorded addresses (end to end and per decision), new segments, release bursts and the final
    layout. With other settings (`config`) or another `capacity`, it answers "what if":
    segment addresses are invented, and the address-free figures (reserved, allocated and
    segments over time, peak reserved, OOM) are given beside the recorded run's.

    Parameters
    ----------
    snapshot
        A torch snapshot dict (``segments`` + ``device_traces``), a `Snapshot`, or a path /
        bytes that `gpumemviz.io.load_snapshot` reads.
    config
        ``PYTORCH_CUDA_ALLOC_CONF`` settings (str or `AllocatorConfig`); None: the recorded ones.
    capacity
        Bytes the process can get on each device: bytes or a size string ("24GiB", what
        `gpumemviz.snapshot.units.parse_size` reads) for all, or {device: that}; it must be
        positive. Default: inferred from a recorded ``oom`` entry (reserved + device_free there);
        otherwise unknown (`capacity_known` is False) and the model never runs out. A
        recorded ``per_process_memory_fraction`` gives no size (the device total is not
        recorded). Each device's ``capacity_source`` says which: "oom entry", "user" or
        "unknown".

    Returns
    -------
    ReplayResult

    Raises
    ------
    ReplayError
        When the snapshot has no trace, or its trace does not fit its segments.
    ValueError
        A zero or negative capacity ("capacity must be positive, got ..."), or a size string
        `parse_size` refuses; TypeError for a capacity of another type.

    Examples
    --------
    Replay what the allocator model itself recorded (Recording.from_snapshot's example shows a
    hand-written trace):

    >>> from gpumemviz.allocator.model import CachingAllocator
    >>> a = CachingAllocator(1 << 30)
    >>> x, y = a.malloc(100), a.malloc(3 << 20)
    >>> a.free(x)
    >>> r = replay(a.snapshot())
    >>> r.allocs, r.allocs_matched, r.allocs_matched_per_decision, r.peak_reserved
    (2, 2, 2, 23068672)
    """
    caps: dict[int, int | None] | int | None
    if isinstance(capacity, Mapping):
        caps = {d: _as_capacity(c, f"capacity of device {d}") for d, c in capacity.items()}
    else:
        caps = _as_capacity(capacity)
    snap, traces, recorded = _as_source(snapshot)
    cfg = _as_config(config, recorded)
    return Prepared(snap, traces, recorded).replay(cfg, caps)


class _RecordedPasses(Mapping[int, DeviceReplay]):
    """Each traced device's pass under the recorded settings, driven when first read.

    A what-if reads the recorded pass only for the release runs it classed as empty_cache
    calls: where the trace has none (no segment_free or segment_unmap), `whatif` answers
    from the recording and one pass, and the recorded one is never driven unless read.
    """

    def __init__(self, prepared: Prepared):
        self._prepared = prepared
        self._done: dict[int, DeviceReplay] = {}

    def __getitem__(self, dev: int) -> DeviceReplay:
        got = self._done.get(dev)
        if got is None:
            if dev not in self._prepared.timelines:
                raise KeyError(dev)
            with no_gc():
                got = self._done[dev] = self._prepared.recorded_pass(dev)
        return got

    def __iter__(self) -> Iterator[int]:
        return iter(self._prepared.timelines)

    def __len__(self) -> int:
        return len(self._prepared.timelines)


class Prepared:
    """A snapshot made ready for any number of replays: each traced device's start state
    reconstructed (`prepare`), its pass under the recorded settings driven when first read
    (`recorded`), and shared by every call from then on.

    `replay` drives the model once per what-if; the reconstruction and the recorded pass are
    shared by every call (what the advice check does with several settings).
    """

    def __init__(
        self,
        snap: TorchMapping,
        traces: Mapping[int, Trace] | None = None,
        recorded: AllocatorConfig | None = None,
    ):
        """`traces`: each device's trace as columns (then `snap`'s ``device_traces`` are not
        read); `recorded`: `snap`'s ``allocator_settings`` already parsed (a `Snapshot`'s
        `config`; None: parsed here)."""
        self.recorded_cfg = recorded if recorded is not None else _recorded_config(snap)
        self.settings_recorded = isinstance(snap.get("allocator_settings"), Mapping)
        self.traces = traces
        if traces is not None:
            traced = sorted(d for d, t in traces.items() if len(t))
        else:
            traced = [d for d, t in enumerate(snap.get("device_traces") or []) if t]
        if not traced:
            raise ReplayError("snapshot has no trace to replay (recorded with history off?)")
        self.recorded: Mapping[int, DeviceReplay] = _RecordedPasses(self)
        self.timelines: dict[int, Recording] = {}
        self.inferred: dict[int, int | None] = {}
        self.oom_at: dict[int, int | None] = {}
        # a list per block and per entry: the cyclic GC would rescan them often; they are kept
        # (recordings, checkpoints), so made old at once on leaving
        with no_gc(promote_built=True):
            for dev in traced:
                self._prepare(snap, dev)

    def _prepare(self, snap: TorchMapping, dev: int) -> None:
        """Reconstruct device `dev`."""
        try:
            columns = self.traces[dev] if self.traces is not None else None
            # what a replay reads are the figures; a seek makes its checkpoints when it comes
            tl = Recording.from_snapshot(
                snap, dev, columns=columns, config=self.recorded_cfg, seekable=False
            )
        except LayoutError as err:
            raise ReplayError(f"device {dev}: {err}") from None
        self.timelines[dev] = tl
        oom_at = self.oom_at[dev] = tl.first_oom
        self.inferred[dev] = _capacity_from_oom(tl, oom_at)

    def recorded_pass(self, dev: int) -> DeviceReplay:
        """Device `dev`'s pass under the recorded settings, scored (what `recorded` holds)."""
        from gpumemviz.allocator.replay.driver import (
            drive,  # the model loads here, not with the package
        )

        tl, inferred, oom_at = self.timelines[dev], self.inferred[dev], self.oom_at[dev]
        rec, _ = drive(tl, self.recorded_cfg, inferred, device_total=inferred)
        if rec.allocs_matched < rec.allocs or not rec.exact:
            cfg = self.recorded_cfg

            def per_decision() -> int:  # a pass of its own: run when the figure is read
                with no_gc():
                    per, _ = drive(tl, cfg, inferred, device_total=inferred, resync=True)
                return per.allocs_matched

            rec.per_decision = per_decision
        _source(rec, _inferred_source(inferred), oom_at)
        return rec

    def replay(
        self,
        config: str | AllocatorConfig | None = None,
        capacity: dict[int, int | None] | int | None = None,
    ) -> ReplayResult:
        """`replay`'s answer for these settings and capacity (bytes; {device: bytes})."""
        from gpumemviz.allocator.replay.driver import drive

        cfg = _as_config(config, self.recorded_cfg)
        devices: dict[int, DeviceReplay] = {}
        any_what_if = False
        for dev, tl in self.timelines.items():
            inferred, oom_at = self.inferred[dev], self.oom_at[dev]
            cap = capacity.get(dev) if isinstance(capacity, dict) else capacity
            source = "user"
            if cap is None:
                cap = inferred
                source = _inferred_source(inferred)
            what_if = not _same_rules(cfg, self.recorded_cfg) or cap != inferred
            any_what_if = any_what_if or what_if
            if what_if:
                # the release runs the recorded pass found to be empty_cache calls (none
                # without a release entry: then that pass need not run for this one)
                explicit = set(self.recorded[dev].explicit_bursts) if tl.releases else set()
                with no_gc():
                    devices[dev], _ = drive(
                        tl,
                        cfg,
                        cap,
                        what_if=True,
                        explicit=explicit,
                        device_total=cap or inferred,
                    )
                _source(devices[dev], source, oom_at)
            else:
                devices[dev] = self.recorded[dev]
        return ReplayResult(
            config=cfg.settings,
            recorded_config=self.recorded_cfg.settings,
            what_if=any_what_if,
            devices=devices,
            recorded=self.recorded,
            timelines=dict(self.timelines),
            settings_recorded=self.settings_recorded,
        )


def prepare(snapshot: SnapshotLike | TorchMapping) -> Prepared:
    """Reconstruct and score a snapshot once, for several `Prepared.replay` calls.

    Takes what `replay` takes; raises `ReplayError` as it does.
    """
    return Prepared(*_as_source(snapshot))
