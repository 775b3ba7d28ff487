"""What a replay returns: one device's scored pass (`DeviceReplay`) and the whole snapshot's
(`ReplayResult`), and the error a snapshot that cannot be replayed raises (`ReplayError`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchDict, TorchMapping

__all__ = ["DeviceReplay", "ReplayError", "ReplayResult", "layout_key"]


def layout_key(segments: Sequence[TorchMapping]) -> list[tuple[Any, ...]]:  # dict values
    """Final segments (torch dicts) as comparable values: address, size, stream, expandable,
    blocks (address, size, state), sorted (what `DeviceReplay.final_matched` compares)."""
    return sorted(
        (
            s["address"],
            s["total_size"],
            s["stream"],
            bool(s.get("is_expandable")),
            tuple((b["address"], b["size"], b["state"]) for b in s["blocks"]),
        )
        for s in segments
    )


class ReplayError(ValueError):
    """A snapshot that cannot be replayed (no trace, an inconsistent trace); one line."""


@dataclass
class DeviceReplay:
    """One device's replay: decision scores, and the model's figures after every trace entry.

    The counts are commented field by field below. `reserved`, `allocated` and `segments` are
    numpy arrays with the model's figures after each trace entry (a what-if stops at its
    OOM); `mismatches` holds the first 20 misses as ``(trace index, kind, detail)``;
    `final_segments` the model's segments at the end (torch dicts).
    """

    device: int
    config: str
    what_if: bool
    capacity: int | None
    capacity_known: bool
    events: int
    # where `capacity` came from: "oom entry" (reserved + device_free at the recorded OOM),
    # "user" (replay's capacity argument) or "unknown" (no OOM recorded: the model never runs
    # out; a recorded per_process_memory_fraction is a share of a device total nobody recorded)
    capacity_source: str = "unknown"
    capacity_oom: int | None = None  # trace index of the oom entry it came from
    allocs: int = 0
    allocs_matched: int = 0  # end to end: the model ran on its own state throughout
    # re-synchronised to the recorded state after a miss: `allocs_matched_per_decision`; a
    # function until first read where it takes a pass of its own (`Prepared` defers it: only
    # the fidelity figures read it, not the commands' what-ifs and advice checks)
    per_decision: int | Callable[[], int] = field(default=0, repr=False, compare=False)
    segments_recorded: int = 0  # segment_alloc + segment_map entries the trace shows
    segments_matched: int = 0  # the model made the same one (action, address, size) there
    bursts: int = 0  # runs of segment_free / segment_unmap in the trace
    bursts_matched: int = 0  # the model released the same ranges in the same order
    explicit_bursts: list[int] = field(default_factory=list)  # replayed as empty_cache
    final_matched: bool | None = None  # the model's final segments equal the recorded ones
    oom: int | None = None  # trace index where the model ran out of memory (what-if: stop)
    recorded_oom: int | None = None  # trace index of the recorded oom entry, if any
    peak_reserved: int = 0
    peak_allocated: int = 0
    reserved: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    allocated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    segments: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mismatches: list[tuple[int, str, str]] = field(default_factory=list)  # the first 20
    final_segments: list[TorchDict] = field(default_factory=list)
    # traces with private pools: reserved bytes per pool ((0, 0): the default pools), the
    # model's peak and its final figure; empty without private pools
    pool_peak_reserved: dict[tuple[int, int], int] = field(default_factory=dict)
    pool_final_reserved: dict[tuple[int, int], int] = field(default_factory=dict)

    @property
    def allocs_matched_per_decision(self) -> int:
        """Allocs at the recorded address when the model is put back on the recorded state
        after each miss (computed on first read where `per_decision` is deferred)."""
        got = self.per_decision
        if callable(got):
            got = self.per_decision = got()
        return got

    @allocs_matched_per_decision.setter
    def allocs_matched_per_decision(self, value: int) -> None:
        self.per_decision = value

    @property
    def exact(self) -> bool:
        """Every decision as recorded (only meaningful with the recorded settings)."""
        return (
            self.allocs_matched == self.allocs
            and self.allocs_matched_per_decision == self.allocs
            and self.segments_matched == self.segments_recorded
            and self.bursts_matched == self.bursts
            and self.final_matched is not False
            and self.oom == self.recorded_oom
        )


@dataclass
class ReplayResult:
    """What `replay` found, per device and summed; `timelines` scrub the recorded history.

    Attributes
    ----------
    config, recorded_config : str
        The settings replayed, and the recorded ones ("" with `settings_recorded` False:
        PyTorch's defaults assumed, not seen).
    what_if : bool
        Whether any device ran under other settings or another capacity than recorded.
    devices : {int: DeviceReplay}
        The run asked for, per traced device.
    recorded : {int: DeviceReplay}
        The same trace under the recorded settings (the run `what_if` compares with), each
        device's driven when first read.
    timelines : {int: Recording}
        The recorded history per device (name kept: public), what `snapshot_at` reads.
    settings_recorded : bool
        False when the file has no ``allocator_settings``.

    The properties `allocs`, `allocs_matched`, `allocs_matched_per_decision`, `peak_reserved`,
    `oom` and `capacity_known` sum (or combine) the devices' own.

    Examples
    --------
    >>> from gpumemviz.allocator.model import CachingAllocator
    >>> from gpumemviz.allocator.replay import replay
    >>> a = CachingAllocator(1 << 30)
    >>> a.free(a.malloc(3 << 20))
    >>> r = replay(a.snapshot(), config="expandable_segments:True")
    >>> r.what_if, r.config, r.recorded_config, r.capacity_known, sorted(r.devices)
    (True, 'expandable_segments:True', '', False, [0])
    >>> r.peak_segments(0, "recording"), len(r.snapshot_at(0)["segments"])
    (1, 1)
    """

    config: str
    recorded_config: str
    what_if: bool
    devices: dict[int, DeviceReplay]
    # the same trace under the recorded settings: a pass is driven when its device is first
    # read (`Prepared.recorded`)
    recorded: Mapping[int, DeviceReplay]
    timelines: dict[int, Recording]
    # False when the file has no allocator_settings: `recorded_config` is then "" by
    # assumption (PyTorch's defaults), not because the defaults were seen
    settings_recorded: bool = True

    @property
    def allocs(self) -> int:
        """``alloc`` entries replayed, over all devices."""
        return sum(d.allocs for d in self.devices.values())

    @property
    def allocs_matched(self) -> int:
        """Allocs at the recorded address with the model on its own state throughout."""
        return sum(d.allocs_matched for d in self.devices.values())

    @property
    def allocs_matched_per_decision(self) -> int:
        """Allocs at the recorded address, re-synchronised to the recording after a miss."""
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
        """Whether every device's capacity was given or inferred from an ``oom`` entry."""
        return all(d.capacity_known for d in self.devices.values())

    def snapshot_at(self, event_index: int, device: int | None = None) -> TorchDict:
        """The recorded segments of `device` after trace entry `event_index` (-1: the start).

        `device` defaults to the lowest traced one; see `Recording.snapshot_at`. Raises
        `ReplayError` for a device without a trace.
        """
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
            raise ValueError(f"run must be predicted, replayed or recording, not {short_repr(run)}")
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
                    f"(recorded {at(self.timelines[dev].first_oom)})"
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
