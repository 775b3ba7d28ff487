"""The `Source` protocol: one small surface between the outside world and the sampler.

Like httpx's transports, every source is a real in-process alternative (torch.cuda, the simulated
allocator, a replayed file), so the whole suite runs without a GPU. Sources never raise from
`sample()`: a failed read is a `Sample` with ``state="error"`` and a reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gpumemviz.snapshot.escaping import error_line
from gpumemviz.snapshot.sample import OomEvent, Sample

if TYPE_CHECKING:
    from gpumemviz.allocator.replay.recording import Recording
    from gpumemviz.snapshot import Trace
    from gpumemviz.snapshot.schema import TorchDict, TorchList, TorchMapping

__all__ = [
    "CAPABILITIES",
    "HistorySource",
    "OomHandler",
    "Source",
    "SourceCommandError",
    "TimeTravelSource",
    "UnavailableSource",
    "short_error",
]

# What a source may say it can do; the panel greys out buttons for the rest.
CAPABILITIES = frozenset(
    {"segments", "empty_cache", "export", "oom", "record_history", "nvml", "time_travel"}
)


class SourceCommandError(RuntimeError):
    """A command (empty_cache, export, ...) that this source cannot carry out; says why."""


@runtime_checkable
class Source(Protocol):
    """Anything that turns the outside world into `Sample` values.

    Required: ``label`` (shown in the panel), ``device``, ``demo`` (True for made-up data, which
    the panel labels as demo data), ``capabilities`` (a subset of `CAPABILITIES`), and the methods
    below. Optional, looked up with ``getattr`` by the sampler:

    - ``segment_interval_hint: float``: the shortest sensible gap between segment reads (for
      example, slow while the user records allocator history);
    - ``set_oom_handler(fn | None)``: install the function the OOM observer calls with an
      `OomEvent` (from the user's allocating thread), or remove it. The source judges each event
      once, where the OOM happens, before it is kept or handed on
      (`gpumemviz.live.sources.oom.judge`: the analysis layer's verdict);
    - ``oom_sample(event) -> Sample``: turn an `OomEvent` into a sample with its segment state.
    - ``add_oom_handler(fn)`` / ``remove_oom_handler(fn)``: more handlers beside the one
      ``set_oom_handler`` installs, given the same judged event (`gpumemviz.distributed` writes
      a rank's OOM files there, in the allocating thread, before the error is raised);
    - ``history_enabled() -> bool | None`` and ``record_history(enabled)``: whether the source
      records allocation history (None: cannot say yet), and turning it on.
    """

    # read-only: a source may hold them as attributes or compute them (properties)
    @property
    def label(self) -> str: ...
    @property
    def device(self) -> int: ...
    @property
    def demo(self) -> bool: ...
    @property
    def capabilities(self) -> frozenset[str]: ...

    def sample(self, *, segments: bool = True) -> Sample:
        """Read stats (always) and segment state (when ``segments``); never raises."""
        ...

    def empty_cache(self) -> dict[int, int]:
        """Release cached memory; returns bytes released per device."""
        ...

    def export(self) -> TorchDict:
        """The full torch snapshot dict (memory_viz compatible)."""
        ...

    def close(self) -> None:
        """Stop background work and drop hooks; the source is unusable afterwards."""
        ...


class TimeTravelSource(Source, Protocol):
    """A source with the ``time_travel`` capability: a recorded run, scrubbed entry by entry
    (`gpumemviz.live.sources.playback.PlaybackSource`)."""

    @property
    def n(self) -> int:
        """Trace entries in the recording."""
        ...

    @property
    def position(self) -> int:
        """The entry shown now (-1: the state before the first)."""
        ...

    @property
    def raw(self) -> TorchDict:
        """The recorded torch snapshot dict (built on first use when opened from a file)."""
        ...

    @property
    def columns(self) -> Trace | None:
        """The replayed device's trace as columns (opened from a `Snapshot` or a file), or
        None (given a torch dict: its entries are in `raw`)."""
        ...

    @property
    def allocator_settings(self) -> TorchMapping | None:
        """The recorded ``allocator_settings``."""
        ...

    @property
    def external_annotations(self) -> TorchList | None:
        """The recorded ``external_annotations``."""
        ...

    @property
    def recording(self) -> Recording:
        """The recorded history, applied forwards."""
        ...

    def seek(self, index: int) -> None: ...
    def play(self, speed: float | None = None) -> None: ...


class HistorySource(Source, Protocol):
    """A source with the ``record_history`` capability (`TorchCudaSource`)."""

    def record_history(self, enabled: bool = True, *, stacks: str = "python") -> None: ...


def short_error(exc: BaseException) -> str:
    """One line naming the exception: what the panel shows and the sample stores."""
    text, name = error_line(exc), type(exc).__name__  # bounded, whatever the exception holds
    return name if text == name else f"{name}: {text}"


class UnavailableSource:
    """A source that only says why nothing can be shown (no CUDA, no simulator).

    It is real, not a placeholder: the panel draws its samples as a message.
    """

    label = "unavailable"
    demo = False
    capabilities: frozenset[str] = frozenset()

    def __init__(self, device: int, reason: str) -> None:
        self.device = device
        self.reason = reason

    def sample(self, *, segments: bool = True) -> Sample:
        return Sample(
            time=time.time(),
            device=self.device,
            stats=None,
            errors=(self.reason,),
            source_label=self.label,
            state="unavailable",
            monotonic=time.monotonic(),
        )

    def empty_cache(self) -> dict[int, int]:
        raise SourceCommandError(f"cannot empty the cache: {self.reason}")

    def export(self) -> TorchDict:
        raise SourceCommandError(f"nothing to export: {self.reason}")

    def close(self) -> None:
        return None


OomHandler = Callable[[OomEvent], object]
"""Called with each OOM event (judged), in the user's allocating thread: it must only queue the
event."""
