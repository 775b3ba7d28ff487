"""Replay a recorded snapshot through the allocator model, decision by decision; ask "what if".

With the recorded settings the model makes every decision and is scored against the recording
(drive.py does one device's pass). With other settings or another capacity, segment addresses
are invented and only address-free figures are compared (reference section 9.4).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._callable import make_module_callable
from ..units import format_size, parse_size
from .config import AllocatorConfig
from .drive import DeviceReplay, ReplayError, drive
from .layout import LayoutError
from .recording import Recording

__all__ = ["DeviceReplay", "ReplayError", "ReplayResult", "drive", "replay"]


# --------------------------------------------------------------------------- results


@dataclass
class ReplayResult:
    """What `replay` found, per device and summed; `timelines` scrub the recorded history."""

    config: str
    recorded_config: str
    what_if: bool
    devices: dict[int, DeviceReplay]
    recorded: dict[int, DeviceReplay]  # the same trace under the recorded settings
    timelines: dict[int, Recording]
    # False when the file has no allocator_settings: `recorded_config` is then "" by
    # assumption (PyTorch's defaults), not because the defaults were seen
    settings_recorded: bool = True

    @property
    def allocs(self) -> int:
        return sum(d.allocs for d in self.devices.values())

    @property
    def allocs_matched(self) -> int:
        return sum(d.allocs_matched for d in self.devices.values())

    @property
    def allocs_matched_per_decision(self) -> int:
        return sum(d.allocs_matched_per_decision for d in self.devices.values())

    @property
    def peak_reserved(self) -> int:
        """Largest reserved bytes the model reached, summed over devices' peaks."""
        return sum(d.peak_reserved for d in self.devices.values())

    @property
    def oom(self) -> int | None:
        """Trace index of the first model OOM (lowest device first), or None."""
        for d in sorted(self.devices):
            if self.devices[d].oom is not None:
                return self.devices[d].oom
        return None

    @property
    def capacity_known(self) -> bool:
        return all(d.capacity_known for d in self.devices.values())

    def snapshot_at(self, event_index: int, device: int | None = None) -> dict[str, Any]:
        """The recorded segments of `device` after trace entry `event_index` (-1: the start)."""
        if device is None:
            if not self.timelines:
                raise ReplayError("this snapshot has no traced device to scrub")
            device = min(self.timelines)
        if device not in self.timelines:
            raise ReplayError(f"device {device} has no trace (traced: {sorted(self.timelines)})")
        return self.timelines[device].snapshot_at(event_index)

    def figures(self, device: int | None = None) -> dict[str, np.ndarray]:
        """The model's figures beside the recorded ones, per trace entry, ready to plot.

        Keys ``reserved``, ``allocated``, ``segments`` (this run; a what-if that ran out of
        memory stops at its OOM, so these may be shorter) and ``recorded_reserved``,
        ``recorded_allocated``, ``recorded_segments`` (the whole trace).
        """
        if device is None:
            device = min(self.devices)
        d, tl = self.devices[device], self.timelines[device]
        return {
            "reserved": d.reserved,
            "allocated": d.allocated,
            "segments": d.segments,
            "recorded_reserved": tl.reserved,
            "recorded_allocated": tl.allocated,
            "recorded_segments": tl.segments,
        }

    def recorded_peak_reserved(self, device: int) -> int:
        """Peak reserved bytes of the recording itself (the trace's start included)."""
        tl = self.timelines[device]
        return max(int(tl.reserved.max(initial=0)), tl.start.totals()[0])

    def peak_segments(self, device: int, run: str = "predicted") -> int:
        """Peak segment count, the trace's start included, of one `run`: "predicted" (this
        replay), "replayed" (the replay under the recorded settings) or "recording" (the file)."""
        tl = self.timelines[device]
        if run == "recording":
            segments = tl.segments
        elif run in ("predicted", "replayed"):
            segments = (self.devices if run == "predicted" else self.recorded)[device].segments
        else:
            raise ValueError(f"run must be predicted, replayed or recording, not {run!r}")
        return max(int(segments.max(initial=0)), tl.start.totals()[2])

    def summary(self) -> str:
        """A few lines a person can read: match rates, or what-if peaks and OOMs beside the
        recorded ones; the capacity, or that it is unknown."""

        def at(i: int | None) -> str:
            return "none" if i is None else f"at event {i}"

        lines = []
        for dev, d in sorted(self.devices.items()):
            conf = d.config or "default settings"
            if not self.settings_recorded and d.config == self.recorded_config:
                conf = "settings not recorded: PyTorch's defaults assumed"
            head = f"device {dev} [{conf}] capacity {_capacity(d)}: "
            if d.what_if:
                lines.append(
                    head + f"peak reserved {format_size(d.peak_reserved)} (recorded "
                    f"{format_size(self.recorded_peak_reserved(dev))}), oom {at(d.oom)} "
                    f"(recorded {at(self.recorded[dev].recorded_oom)})"
                )
            else:
                lines.append(
                    head + f"{d.allocs_matched}/{d.allocs} allocs end to end, "
                    f"{d.allocs_matched_per_decision}/{d.allocs} per decision, segments "
                    f"{d.segments_matched}/{d.segments_recorded}, bursts "
                    f"{d.bursts_matched}/{d.bursts}, final layout "
                    f"{'equal' if d.final_matched else 'different'}"
                )
        return "\n".join(lines)


def _capacity(d: DeviceReplay) -> str:
    """The capacity and where it came from, in words."""
    if d.capacity is None:
        try:
            fraction = AllocatorConfig.parse(d.config).per_process_memory_fraction
        except ValueError:
            fraction = 1.0
        share = (
            f"; per_process_memory_fraction {fraction:g} is a share of a device total not recorded"
            if fraction < 1
            else ""
        )
        return f"unknown (no OOM recorded{share})"
    if d.capacity_source == "oom entry":
        return f"{format_size(d.capacity)} (from the oom entry at event {d.capacity_oom})"
    return f"{format_size(d.capacity)} (given)"


# --------------------------------------------------------------------------- the public entry


def _as_dict(snapshot: Any) -> Mapping[str, Any]:
    if isinstance(snapshot, Mapping):
        if "segments" not in snapshot:
            raise ReplayError("snapshot dict has no 'segments' key")
        return snapshot
    if isinstance(snapshot, list):
        return {"segments": snapshot, "device_traces": []}
    to_torch = getattr(snapshot, "to_torch", None)
    if callable(to_torch):
        return to_torch()
    try:
        from ..io import load_snapshot
    except ImportError:  # pragma: no cover - io is part of the package
        raise ReplayError(
            f"cannot read a snapshot from {type(snapshot).__name__}: pass the torch dict"
        ) from None
    return load_snapshot(snapshot).to_torch()


def _refuse_private_pools(snap: Mapping[str, Any], device: int) -> None:
    """Private pools (CUDA graphs, MemPool) are not modelled, and the recorded history keeps no
    pool: a segment of one would silently join the default pools, so refuse it by name."""
    for seg in snap.get("segments") or ():
        if seg.get("device", 0) != device:
            continue
        pid = tuple(seg.get("segment_pool_id") or (0, 0))
        if pid != (0, 0):
            raise ReplayError(
                f"device {device}: segment at {seg['address']:#x} belongs to private pool {pid} "
                "(CUDA graphs, MemPool); private pools are not modelled, so this trace cannot "
                "be replayed"
            )


def _capacity_from_oom(tl: Recording) -> int | None:
    """Bytes the process could get: reserved at the recorded OOM plus the device_free it saw."""
    i = _first_oom(tl)
    if i is None:
        return None
    before = int(tl.reserved[i - 1]) if i > 0 else tl.start.totals()[0]
    return before + tl.steps[i][1]


def _first_oom(tl: Recording) -> int | None:
    return next((i for i, step in enumerate(tl.steps) if step[0] == "oom"), None)


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


def _as_capacity(value: Any, what: str = "capacity") -> int | None:
    """Bytes from an int or a size string ("24GiB"), refusing zero and negatives."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    elif not isinstance(value, str | float):
        raise TypeError(f"{what} must be bytes or a size string, got {value!r}")
    if str(value).strip().startswith("-"):
        raise ValueError(f"{what} must be positive, got {value!r}")
    try:
        size = parse_size(value)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None
    if size <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return size


def _same_rules(a: AllocatorConfig, b: AllocatorConfig) -> bool:
    return a.changed() == b.changed()


def replay(
    snapshot: Any,
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
        `gpumemviz.units.parse_size` reads) for all, or {device: that}; it must be positive.
        Default: inferred from a recorded ``oom`` entry (reserved + device_free there);
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
        When the snapshot has no trace, its trace does not fit its segments, or a traced
        device holds a segment of a private pool (CUDA graphs, MemPool).

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
    if isinstance(capacity, Mapping):
        capacity = {d: _as_capacity(c, f"capacity of device {d}") for d, c in capacity.items()}
    else:
        capacity = _as_capacity(capacity)
    snap = _as_dict(snapshot)
    recorded_cfg = AllocatorConfig.from_settings(snap.get("allocator_settings"))
    cfg = _as_config(config, recorded_cfg)
    traces = snap.get("device_traces") or []
    traced = [d for d, t in enumerate(traces) if t]
    if not traced:
        raise ReplayError("snapshot has no trace to replay (recorded with history off?)")
    devices: dict[int, DeviceReplay] = {}
    recorded: dict[int, DeviceReplay] = {}
    timelines: dict[int, Recording] = {}
    any_what_if = False
    for dev in traced:
        _refuse_private_pools(snap, dev)
        try:
            tl = Recording.from_snapshot(snap, dev)
        except LayoutError as err:
            raise ReplayError(f"device {dev}: {err}") from None
        timelines[dev] = tl
        inferred = _capacity_from_oom(tl)
        oom_at = _first_oom(tl)
        total = inferred
        rec, _ = drive(tl, recorded_cfg, inferred, device_total=total)
        if rec.allocs_matched < rec.allocs or not rec.exact:
            per, _ = drive(tl, recorded_cfg, inferred, device_total=total, resync=True)
            rec.allocs_matched_per_decision = per.allocs_matched
        _source(rec, "unknown" if inferred is None else "oom entry", oom_at)
        recorded[dev] = rec
        cap = capacity.get(dev) if isinstance(capacity, Mapping) else capacity
        source = "user"
        if cap is None:
            cap = inferred
            source = rec.capacity_source
        what_if = not _same_rules(cfg, recorded_cfg) or cap != inferred
        any_what_if = any_what_if or what_if
        if what_if:
            devices[dev], _ = drive(
                tl,
                cfg,
                cap,
                what_if=True,
                explicit=set(rec.explicit_bursts),
                device_total=cap or total,
            )
            _source(devices[dev], source, oom_at)
        else:
            devices[dev] = rec
    return ReplayResult(
        config=cfg.settings,
        recorded_config=recorded_cfg.settings,
        what_if=any_what_if,
        devices=devices,
        recorded=recorded,
        timelines=timelines,
        settings_recorded=isinstance(snap.get("allocator_settings"), Mapping),
    )


# `import gpumemviz.allocator.replay` binds the package attribute to this module: keep it callable.
make_module_callable(__name__, replay)
