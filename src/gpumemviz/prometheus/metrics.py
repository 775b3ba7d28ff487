"""The metrics gpumemviz exports to Prometheus: names, types, help text and where each value
comes from, as one table that the collector, the docs and the Grafana dashboard's test read.

Bytes end in ``_bytes`` and counters in ``_total`` (Prometheus' naming rules). A figure a
device's samples do not have is left out, never exported as 0: NVML figures without a driver
(or the demo's stand-ins), segment figures before the first segment state, gpumemviz's peaks
before the first sample with stats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gpumemviz.analysis.fragmentation import MemoryFigures
    from gpumemviz.snapshot.sample import NvmlInfo, Sample

__all__ = ["INFO_NAME", "LABELS", "METRICS", "UP_NAME", "Metric", "Reading", "exported_names"]

LABELS = ("rank", "local_rank", "host", "device", "gpu_uuid", "pid")
"""The labels of every series: DCGM's and nvitop's series join on ``gpu_uuid`` and ``pid``."""


@dataclass(frozen=True, slots=True)
class Reading:
    """What one device's series are read from at a scrape.

    ``sample`` is the sampler's newest sample holding stats; ``figures`` the fragmentation
    figures of its newest segment state (None before one was read), taken at ``segments_time``.
    """

    sample: Sample | None
    figures: MemoryFigures | None = None
    segments_time: float | None = None

    @property
    def nvml(self) -> NvmlInfo | None:
        """The driver's figures, when NVML answered for real (never the demo's stand-ins)."""
        nvml = self.sample.nvml if self.sample is not None else None
        if nvml is None or not nvml.available or nvml.synthetic:
            return None
        return nvml


Read = Callable[[Reading], float | None]


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric family: ``name`` as exported (a counter's samples add ``_total``)."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    read: Read

    @property
    def sample_name(self) -> str:
        """The name its series carry in the exposition (and in PromQL)."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


def _stat(figure: str) -> Read:
    def read(r: Reading) -> float | None:
        st = r.sample.stats if r.sample is not None else None
        return None if st is None else float(getattr(st, figure))

    return read


def _free_in_reserved(r: Reading) -> float | None:
    st = r.sample.stats if r.sample is not None else None
    return None if st is None else float(st.reserved - st.active)


def _peak(field: str) -> Read:
    def read(r: Reading) -> float | None:
        peaks = r.sample.peaks if r.sample is not None else None
        return None if peaks is None else float(getattr(peaks, field))

    return read


def _nvml(field: str) -> Read:
    def read(r: Reading) -> float | None:
        nvml = r.nvml
        value = None if nvml is None else getattr(nvml, field)
        return None if value is None else float(value)

    return read


def _figure(field: str) -> Read:
    def read(r: Reading) -> float | None:
        return None if r.figures is None else float(getattr(r.figures, field))

    return read


def _sample_time(r: Reading) -> float | None:
    return None if r.sample is None else r.sample.time


def _segments_time(r: Reading) -> float | None:
    return r.segments_time


_TORCH = "torch.cuda.memory_stats"
METRICS: tuple[Metric, ...] = (
    Metric(
        "gpumemviz_reserved_bytes",
        "gauge",
        f"Bytes PyTorch's caching allocator holds from the device ({_TORCH} reserved_bytes).",
        _stat("reserved"),
    ),
    Metric(
        "gpumemviz_allocated_bytes",
        "gauge",
        f"Bytes in tensors ({_TORCH} allocated_bytes).",
        _stat("allocated"),
    ),
    Metric(
        "gpumemviz_active_bytes",
        "gauge",
        f"Allocated plus pending-free bytes ({_TORCH} active_bytes).",
        _stat("active"),
    ),
    Metric(
        "gpumemviz_free_in_reserved_bytes",
        "gauge",
        "Free bytes inside reserved segments (reserved - active).",
        _free_in_reserved,
    ),
    Metric(
        "gpumemviz_largest_free_block_bytes",
        "gauge",
        "The largest free block in reserved segments: the biggest tensor that fits without a new "
        "segment (newest segment state).",
        _figure("largest_free"),
    ),
    Metric(
        "gpumemviz_external_fragmentation_ratio",
        "gauge",
        "1 - largest free block / free bytes in segments, 0 to 1 (newest segment state).",
        _figure("external_fragmentation"),
    ),
    Metric(
        "gpumemviz_releasable_bytes",
        "gauge",
        "Bytes torch.cuda.empty_cache() would return to the device (newest segment state).",
        _figure("releasable"),
    ),
    Metric(
        "gpumemviz_alloc_retries",
        "counter",
        f"Times the allocator freed its cache and retried an allocation ({_TORCH} "
        "num_alloc_retries).",
        _stat("num_alloc_retries"),
    ),
    Metric(
        "gpumemviz_ooms",
        "counter",
        f"Out-of-memory errors the allocator raised ({_TORCH} num_ooms).",
        _stat("num_ooms"),
    ),
    Metric(
        "gpumemviz_peak_allocated_bytes",
        "gauge",
        "The most allocated bytes gpumemviz's samples saw (its own peak: torch's counters are "
        "never read nor reset for it).",
        _peak("allocated"),
    ),
    Metric(
        "gpumemviz_peak_reserved_bytes",
        "gauge",
        "The most reserved bytes gpumemviz's samples saw (its own peak).",
        _peak("reserved"),
    ),
    Metric(
        "gpumemviz_torch_peak_resets",
        "counter",
        "Resets of torch's peak counters that gpumemviz saw and did not make.",
        _peak("torch_resets"),
    ),
    Metric(
        "gpumemviz_nvml_used_bytes",
        "gauge",
        "Device memory in use as the driver sees it, all processes (NVML).",
        _nvml("used"),
    ),
    Metric(
        "gpumemviz_nvml_total_bytes",
        "gauge",
        "Device memory in total as the driver sees it (NVML).",
        _nvml("total"),
    ),
    Metric(
        "gpumemviz_non_pytorch_bytes",
        "gauge",
        "Device memory used outside PyTorch's allocator, all processes: NVML used - reserved.",
        _nvml("non_pytorch"),
    ),
    Metric(
        "gpumemviz_sample_timestamp_seconds",
        "gauge",
        "Unix time of the sample the stats figures come from.",
        _sample_time,
    ),
    Metric(
        "gpumemviz_segment_state_timestamp_seconds",
        "gauge",
        "Unix time of the segment state the largest block, fragmentation and releasable come from.",
        _segments_time,
    ),
)
"""Every metric gpumemviz exports per device, besides ``gpumemviz_device_info``."""

INFO_NAME = "gpumemviz_device_info"
"""Always 1, per device; its labels add ``name`` (the device), ``source`` and ``demo``."""


UP_NAME = "gpumemviz_up"
"""Per device: 1 while its sampler reads it, 0 with the reason (label ``reason``) while it does
not (a failed read, no sample yet, the simulated demo not asked for): a broken sampler never
looks like an idle device."""


def exported_names() -> list[str]:
    """Every series name a scrape can hold, as PromQL names it.

    Examples
    --------
    >>> "gpumemviz_alloc_retries_total" in exported_names()
    True
    """
    return sorted([m.sample_name for m in METRICS] + [INFO_NAME, UP_NAME])
