"""The Prometheus collector: at each scrape, one metric family per `metrics.METRICS` entry, built
from the samplers' newest samples (prometheus_client's custom-collector pattern).

Nothing is sampled here: the series are what the samplers already hold (the shared sampler per
device, the one the panels read), so a scrape costs no device read. The fragmentation figures
come from each device's newest segment state, computed once per state and kept: on the
sampler's thread as the state arrives (`SamplerCollector.listen`, while an endpoint serves),
else at the first scrape that finds it. A scrape then only formats figures already computed
(benchmarks/prometheus.py: 8 devices cost a scrape under 5 ms only this way).

Each device also has ``gpumemviz_up``: 1 while its sampler reads it, 0 with the reason while it
does not. The simulated demo (what a machine without a GPU samples) is served only when asked
for (``demo=True``): otherwise its figures are left out and its ``gpumemviz_up`` is 0 saying so,
so a node that lost CUDA never feeds plausible series to Grafana. `describe` names the families
so that prometheus_client's ``name[]`` filter finds them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.prometheus.metrics import INFO_NAME, LABELS, METRICS, UP_NAME, Reading

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric as Family

    from gpumemviz.analysis.fragmentation import MemoryFigures
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.snapshot.sample import Sample

__all__ = ["DEMO_NOT_SERVED", "SamplerCollector", "gpu_uuid"]

DEMO_NOT_SERVED = "no GPU: the simulated demo is not served (serve(demo=True) serves it)"


def gpu_uuid(sample: Sample | None) -> str:
    """The ``gpu_uuid`` label: ``GPU-`` and the UUID (as DCGM's ``UUID`` label and nvidia-smi
    write it), from NVML or else from torch's device properties; "" when neither knows it.

    >>> from gpumemviz.snapshot.sample import DeviceInfo, Sample
    >>> gpu_uuid(Sample(time=0.0, device=0, stats=None, device_info=DeviceInfo(0, uuid="8a7b")))
    'GPU-8a7b'
    >>> gpu_uuid(None)
    ''
    """
    if sample is None:
        return ""
    nvml, info = sample.nvml, sample.device_info
    uuid = nvml.uuid if nvml is not None and nvml.available and not nvml.synthetic else None
    uuid = uuid or (info.uuid if info is not None else None)
    return f"GPU-{uuid}" if uuid else ""


class SamplerCollector:
    """Builds the metric families from samplers at scrape time (register it in a registry).

    Parameters
    ----------
    samplers : {int: Sampler}
        Device index -> the sampler whose samples its series show.
    labels : {str: str}
        The labels every series carries besides ``device`` and ``gpu_uuid``: rank, local_rank,
        host and pid.
    demo : bool
        Serve a simulated device's figures (default True: the caller named the samplers);
        False: only its ``gpumemviz_up`` 0, saying why.
    """

    def __init__(
        self, samplers: Mapping[int, Sampler], labels: Mapping[str, str], *, demo: bool = True
    ) -> None:
        missing = set(LABELS) - {"device", "gpu_uuid"} - set(labels)
        if missing:
            raise ValueError(f"labels missing: {sorted(missing)}")
        self.samplers = dict(samplers)
        self.labels = dict(labels)
        self.demo = bool(demo)
        self._lock = threading.Lock()
        self._figures: dict[int, tuple[int, MemoryFigures | None]] = {}  # device -> (seq, ...)
        self._listeners: dict[int, Callable[[Sample], None]] = {}

    def listen(self) -> None:
        """Compute each new segment state's figures on its sampler's thread, as it arrives."""
        for device, sampler in self.samplers.items():
            if device not in self._listeners:
                fn = functools.partial(self._on_sample, device)
                self._listeners[device] = fn
                sampler.add_listener(fn)

    def close(self) -> None:
        """Stop listening (`listen`); scrapes still work, computing figures as they need."""
        for device, fn in self._listeners.items():
            self.samplers[device].remove_listener(fn)
        self._listeners.clear()

    def _on_sample(self, device: int, sample: Sample) -> None:
        if sample.segments is not None:
            self._segment_figures(device, sample)

    def up(self) -> list[tuple[list[str], str]]:
        """(label values, reason) per device: reason "" while it is read, else why not."""
        out = []
        for device, sampler in sorted(self.samplers.items()):
            latest = sampler.history.latest()
            if latest is None:
                reason = "no sample yet"
            elif latest.demo and not self.demo:
                reason = DEMO_NOT_SERVED
            elif latest.stats is None or latest.state == "error":
                reason = latest.errors[-1] if latest.errors else f"state {latest.state}"
            else:
                reason = ""
            values = {**self.labels, "device": str(device), "gpu_uuid": gpu_uuid(latest)}
            out.append(([values[k] for k in LABELS], reason[:200]))
        return out

    def readings(self) -> list[tuple[list[str], Reading]]:
        """(label values in `LABELS` order, reading) per device, from the newest samples (a
        simulated device only when ``demo``)."""
        out = []
        for device, sampler in sorted(self.samplers.items()):
            sample = sampler.history.latest_stats()
            seg = sampler.history.latest_segments()
            if not self.demo and any(s is not None and s.demo for s in (sample, seg)):
                continue
            figures = self._segment_figures(device, seg)
            reading = Reading(sample, figures, seg.time if figures is not None and seg else None)
            values = {
                **self.labels,
                "device": str(device),
                "gpu_uuid": gpu_uuid(sample or seg),
            }
            out.append(([values[k] for k in LABELS], reading))
        return out

    def _segment_figures(self, device: int, seg: Sample | None) -> MemoryFigures | None:
        if seg is None or seg.segments is None:
            return None
        with self._lock:
            hit = self._figures.get(device)
            if hit is not None and hit[0] == seg.seq:
                return hit[1]
        try:
            report = fragmentation(seg.segments)
        except Exception:  # a state the analysis refuses: its three series are left out
            figures = None
        else:  # a state with no segment at all: nothing reserved, so nothing free either
            figures = report.devices.get(device, None if report.devices else report.total)
        with self._lock:
            self._figures[device] = (seg.seq, figures)
        return figures

    def describe(self) -> Iterator[Family]:
        """The families by name and type, empty (the registry's ``name[]`` filter reads it)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for metric in METRICS:
            make = GaugeMetricFamily if metric.kind == "gauge" else CounterMetricFamily
            yield make(metric.name, metric.help, labels=LABELS)
        yield GaugeMetricFamily(INFO_NAME, "", labels=LABELS)
        yield GaugeMetricFamily(UP_NAME, "", labels=LABELS)

    def collect(self) -> Iterator[Family]:
        """The metric families of this scrape (prometheus_client calls it)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        rows = self.readings()
        for metric in METRICS:
            make = GaugeMetricFamily if metric.kind == "gauge" else CounterMetricFamily
            family = make(metric.name, metric.help, labels=LABELS)
            for values, reading in rows:
                value = metric.read(reading)
                if value is not None:
                    family.add_metric(values, value)
            if family.samples:
                yield family
        info = GaugeMetricFamily(
            INFO_NAME,
            "1 per device: its name, gpumemviz's source and whether it is demo data.",
            labels=(*LABELS, "name", "source", "demo"),
        )
        for values, reading in rows:
            s = reading.sample
            name = s.device_info.name if s is not None and s.device_info is not None else ""
            source = s.source_label if s is not None else ""
            demo = "true" if s is not None and s.demo else "false"
            info.add_metric([*values, name, source, demo], 1.0)
        if rows:
            yield info
        up = GaugeMetricFamily(
            UP_NAME,
            "1 per device while its sampler reads it; 0 with the reason while it does not.",
            labels=(*LABELS, "reason"),
        )
        for values, reason in self.up():
            up.add_metric([*values, reason], 0.0 if reason else 1.0)
        if up.samples:
            yield up
