"""What the figures (render/figures.py) read of their inputs, as protocols.

render/ sits above the sampler and the allocator in the layer table and does not import them, so
the figures read a Sampler, a History, a `gpumemviz.replay` result and a workload outcome by
duck typing; these protocols name the attributes they read, for the type checker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from gpumemviz.snapshot.sample import HasHistory, HasSamples, Sample

__all__ = [
    "DeviceRun",
    "Floats",
    "OutcomeLike",
    "Plotly",
    "ReplayRun",
    "Row",
    "Series",
    "TimelineInput",
    "Trajectory",
]

Plotly = Any  # plotly's modules, figures and traces: plotly ships no types
Series = dict[str, Any]  # what `timeline` draws: arrays, the axis title, the capacity or None
Row = dict[str, Any]  # one outcome's plain values (str, int, bool or None)
Floats = Sequence[float] | np.ndarray


class Trajectory(Protocol):
    """Figures after every step: an `allocator.replay.recording.Recording`."""

    @property
    def allocated(self) -> np.ndarray: ...
    @property
    def reserved(self) -> np.ndarray: ...


class DeviceRun(Protocol):
    """One device's run of a replay (`allocator.replay.result.DeviceReplay`)."""

    @property
    def config(self) -> str: ...
    @property
    def capacity(self) -> int | None: ...
    @property
    def capacity_known(self) -> bool: ...
    @property
    def oom(self) -> int | None: ...
    @property
    def recorded_oom(self) -> int | None: ...


class ReplayRun(Protocol):
    """A `gpumemviz.replay` result (`allocator.replay.result.ReplayResult`)."""

    @property
    def devices(self) -> Mapping[int, DeviceRun]: ...
    @property
    def recorded(self) -> Mapping[int, DeviceRun]: ...
    @property
    def timelines(self) -> Mapping[int, Trajectory]: ...
    @property
    def recorded_config(self) -> str: ...
    def figures(self, device: int | None = None) -> dict[str, np.ndarray]: ...


class OutcomeLike(Trajectory, Protocol):
    """An `allocator.workloads.run` outcome (`allocator.workloads.Outcome`)."""

    @property
    def workload(self) -> str: ...
    @property
    def config(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    @property
    def completed(self) -> bool: ...
    @property
    def oom_step(self) -> int | None: ...
    @property
    def peak_reserved(self) -> int: ...
    @property
    def peak_allocated(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def free_in_segments_at_oom(self) -> int | None: ...


TimelineInput = HasHistory | HasSamples | Sample | Sequence[Sample] | ReplayRun | OutcomeLike
"""What `timeline` draws: a Sampler, a History, Samples, a replay result or a workload outcome."""
