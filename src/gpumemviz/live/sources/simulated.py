"""Demo data: the CPU model of the caching allocator running a workload at a human pace.

What a user without a GPU sees (and what the panel labels as demo data): a training or serving
program from `allocator.workloads` driven through `CachingAllocator` on its own thread, slowly
enough to watch segments fill, fragment and, for some workloads, run out of memory. An OOM goes
through the same path as a real one (an `OomEvent`, judged once in the thread that ran out of
memory, `gpumemviz.live.sources.oom.judge`, then handed to the OOM handlers), then the workload
restarts. Each malloc carries its call site (`allocator.sites`: the lines of a ``demo_train.py``
or ``demo_serve.py``), so the holders view, the map's stacks and the growth analysis of an
export read as they would for a real program recorded with stacks.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.pool_workloads import apply_pool_step
from gpumemviz.allocator.sites import Sites
from gpumemviz.allocator.workloads import WORKLOADS, Workload
from gpumemviz.live.sources.base import OomHandler, short_error
from gpumemviz.live.sources.oom import judge, oom_stream
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.sample import (
    SEGMENTS_NOT_READ,
    DeviceInfo,
    MemoryStats,
    NvmlInfo,
    OomEvent,
    Sample,
)
from gpumemviz.snapshot.schema import TorchDict

__all__ = ["SimulatedSource"]

_CONTEXT_BYTES = 512 << 20  # SYNTHETIC: what a CUDA context and libraries would hold outside
_TRACE_ENTRIES = 20_000  # the model's recorded history ring (export and OOM snapshots)
OOMS_KEPT = 2  # OOM events `SimulatedSource.ooms` keeps (newest last)
_TICK_S = 0.02  # the workload thread runs a slice of steps this often


class SimulatedSource:
    """Runs an allocator workload on its own thread; samples read the model.

    Parameters
    ----------
    workload : Workload or str, optional
        A workload or a name from ``allocator.workloads.WORKLOADS`` (default "training", which
        fragments and runs out of memory near the end).
    device : int
        The device index the samples carry.
    steps_per_second : float
        Allocator calls per second (default 400: a training run takes about 35 s).
    loop : bool
        Start again when the workload ends or runs out of memory (default True).
    pause_after_oom : float
        Seconds to hold the state at an OOM before starting again (default 3).
    autostart : bool
        Start the workload thread on the first `sample` (default True). With False, drive it with
        `step` (tests, and programs that stand in for a training loop).
    record_history : bool
        Record the model's allocation history, as torch's ``_record_memory_history`` (default
        True); `record_history` switches it later.

    Examples
    --------
    >>> src = SimulatedSource("training", autostart=False)
    >>> src.step(500)
    500
    >>> s = src.sample()
    >>> s.demo, s.stats.allocated > 0, s.segments.n_segments > 0
    (True, True, True)
    """

    demo = True

    def __init__(
        self,
        workload: Workload | str = "training",
        *,
        device: int = 0,
        steps_per_second: float = 400.0,
        loop: bool = True,
        pause_after_oom: float = 3.0,
        autostart: bool = True,
        record_history: bool = True,
    ) -> None:
        if isinstance(workload, str):
            if workload not in WORKLOADS:
                raise ValueError(
                    f"unknown workload {short_repr(workload)}; known: {sorted(WORKLOADS)}"
                )
            workload = WORKLOADS[workload]
        if not isinstance(workload, Workload):
            raise TypeError(f"workload must be a Workload or a name, got {type(workload).__name__}")
        if not steps_per_second > 0:
            raise ValueError(
                f"steps_per_second must be positive, got {short_repr(steps_per_second)}"
            )
        self.workload = workload
        self.device = device
        self.label = f"simulated: {workload.name} (demo data)"
        self.steps_per_second = float(steps_per_second)
        self.loop = loop
        self.pause_after_oom = float(pause_after_oom)
        self.autostart = autostart
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_oom: OomHandler | None = None  # set_oom_handler
        # add_oom_handler: handlers beside the sampler's, as the observer keeps them for torch
        self._extra_ooms: tuple[OomHandler, ...] = ()
        self._record = bool(record_history)
        self.runs = 0  # workload runs started
        # the newest OOMs only: each holds a full snapshot with its trace (~5 MiB), and a demo
        # panel left open loops through an OOM every ~40 s
        self.ooms: collections.deque[OomEvent] = collections.deque(maxlen=OOMS_KEPT)
        self.last_mark: str | None = None
        self._closed = False
        # the cumulative counters (OOMs, retries, ...) and peaks of the runs before this one: a
        # restart is a new workload in the same "process", whose counts only grow
        self._carried: dict[str, int] = {}
        self._model: CachingAllocator
        self._reset(first=True)

    capabilities = frozenset({"segments", "empty_cache", "export", "oom", "nvml"})

    def restart(self) -> None:
        """Start the workload again on a fresh model (what the demo's thread does after an OOM or
        the workload's end); the counts and peaks of earlier runs carry on."""
        with self._lock:
            self._reset()

    def _reset(self, *, first: bool = False) -> None:
        if not first:
            for key, value in self._model.memory_stats().items():
                if key.endswith(".peak"):
                    self._carried[key] = max(self._carried.get(key, 0), value)
                elif key.startswith("num_") or key.endswith((".allocated", ".freed")):
                    self._carried[key] = self._carried.get(key, 0) + value
        w = self.workload
        self._model = CachingAllocator(
            w.capacity,
            w.config,
            device=self.device,
            trace_max_entries=_TRACE_ENTRIES,
            record_trace=self._record,
        )
        self._sites: Sites = {}  # the call site of each malloc the program hands out next
        self._ops = iter(w.ops(self._sites))
        self._where: dict[int, int] = {}
        self._done = False
        self.runs += 1

    # driving ---------------------------------------------------------------------------------
    def step(self, n: int = 1, *, raise_oom: bool = False) -> int:
        """Run up to ``n`` allocator calls now (marks are not counted); returns how many ran.

        Stops early at the end of the workload or at an OOM (then the OOM handlers are called,
        in this thread, as torch calls its OOM observer). With ``raise_oom`` the model's
        `OutOfMemory` is raised after them, as torch raises its error after the observer: a
        program driving the model in its own thread fails as a real one would.
        """
        ran = 0
        event: OomEvent | None = None
        error: OutOfMemory | None = None
        with self._lock:
            while ran < n and not self._done:
                op = next(self._ops, None)
                if op is None:
                    self._done = True
                    break
                if op[0] == "mark":
                    self.last_mark = str(op[1])
                    continue
                ran += 1
                if op[0] == "malloc":
                    try:
                        at = self._sites.pop(op[1], None)
                        self._where[op[1]] = self._model.malloc(op[2], op[3], at)
                    except OutOfMemory as err:
                        self._done = True
                        event = self._oom_event(err)
                        error = err
                elif op[0] == "free":
                    self._model.free(self._where.pop(op[1]))
                elif op[0] == "empty_cache":
                    self._model.empty_cache()
                else:  # a private-pool step (CUDA graphs, MemPool)
                    apply_pool_step(self._model, op)
        if event is not None:  # outside the lock, like torch's observer
            self._deliver(event)
            if raise_oom and error is not None:
                raise error
        return ran

    def _oom_event(self, err: OutOfMemory) -> OomEvent:
        """The failure's raw facts, as torch's observer would see them."""
        snapshot = self._model.snapshot()
        limit = err.allowed if err.allowed is not None else err.capacity
        return OomEvent(
            time=time.time(),
            device=self.device,
            alloc_size=err.alloc_size,
            device_limit=limit,
            device_free=err.free,
            request_size=err.rounded_size,
            snapshot=snapshot,
            device_total=err.capacity,
            stream=oom_stream(snapshot, self.device),
        )

    def _deliver(self, event: OomEvent) -> None:
        event = judge(event)  # once per failure (never raises), then kept and handed on
        self.ooms.append(event)
        handler = self._on_oom
        if handler is not None:
            # the sampler's handler only queues; a broken one must not stop the demo
            with contextlib.suppress(Exception):
                handler(event)
        for extra in self._extra_ooms:  # the same judged event, as the observer hands it on
            with contextlib.suppress(Exception):
                extra(event)

    def _run(self) -> None:
        per_tick = max(1, round(self.steps_per_second * _TICK_S))
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.step(per_tick)
            if self._done:
                if not self.loop:
                    return
                wait = self.pause_after_oom if self.ooms and self._oom_recent() else 0.5
                if self._stop.wait(wait):
                    return
                self.restart()
                next_t = time.monotonic()
            next_t += _TICK_S
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def _oom_recent(self) -> bool:
        return bool(self.ooms) and time.time() - self.ooms[-1].time < 1.0

    def start(self) -> None:
        """Start the workload thread (the first `sample` does this when ``autostart``)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            thread = threading.Thread(target=self._run, name="gpumemviz-simulated", daemon=True)
            thread.start()
            self._thread = thread  # once started: a close() meanwhile never joins it unstarted

    # Source protocol -------------------------------------------------------------------------
    def sample(self, *, segments: bool = True) -> Sample:
        """Read the model's stats (and segment state); never raises."""
        if self.autostart and self._thread is None and not self._closed:
            self.start()
        t, mono = time.time(), time.monotonic()
        try:
            from gpumemviz.snapshot import Snapshot

            with self._lock:
                stats = MemoryStats.from_torch(self._memory_stats())
                raw = self._model.snapshot(include_traces=False, record=False) if segments else None
                mark = self.last_mark
            snap = Snapshot.from_torch(raw["segments"]) if raw is not None else None
        except Exception as exc:
            return Sample.failed(
                self.device, f"simulation: {short_error(exc)}", source_label=self.label, demo=True
            )
        notes = (f"demo data: {self.workload.name}" + (f", {mark}" if mark else ""),)
        return Sample(
            time=t,
            monotonic=mono,
            device=self.device,
            stats=stats,
            segments=snap,
            nvml=self._nvml(stats.reserved),
            source_label=self.label,
            demo=True,
            device_info=self._device_info(),
            segments_note=None if segments else SEGMENTS_NOT_READ,
            notes=notes,
        )

    def set_oom_handler(self, handler: OomHandler | None) -> None:
        """Install (or remove, with None) the function called with each OOM, judged, from the
        thread that ran out of memory (`ooms` keeps the judged events too)."""
        self._on_oom = handler

    def add_oom_handler(self, handler: OomHandler) -> None:
        """Also call ``handler`` with each OOM (the same judged event), beside the one
        `set_oom_handler` installs: what `gpumemviz.live.sources.oom_observer.add_handler` is for
        torch. It runs in the thread that ran out of memory, before `step` raises."""
        if handler not in self._extra_ooms:
            self._extra_ooms = (*self._extra_ooms, handler)

    def remove_oom_handler(self, handler: OomHandler) -> None:
        self._extra_ooms = tuple(h for h in self._extra_ooms if h != handler)

    def history_enabled(self) -> bool:
        """Whether the model records its allocation history now."""
        return self._record

    def record_history(self, enabled: bool = True, *, stacks: str = "python") -> None:
        """Record the model's allocation history (the default), or stop, as torch's
        ``_record_memory_history``: what `export` and the OOM snapshots carry as their trace.
        ``stacks`` is taken as `HistorySource` takes it; the allocations carry the demo
        program's call sites either way."""
        with self._lock:
            self._record = bool(enabled)
            self._model.set_recording(self._record)

    def _device_info(self) -> DeviceInfo:
        """The simulated device: the workload's capacity and a CUDA context's worth beside it."""
        return DeviceInfo(
            index=self.device,
            name="simulated caching allocator (demo)",
            total_memory=self.workload.capacity + _CONTEXT_BYTES,
            backend="native",
            allocator_settings=self.workload.config,
        )

    def _nvml(self, reserved: int) -> NvmlInfo:
        """What NVML would read beside `reserved`: the allocator's segments plus the context."""
        total = self.workload.capacity + _CONTEXT_BYTES
        used = reserved + _CONTEXT_BYTES
        return NvmlInfo(
            available=True,
            uuid=None,
            matched_by="simulated",
            total=total,
            used=used,
            free=total - used,
            utilization=None,
            non_pytorch=_CONTEXT_BYTES,
            split_reason="simulated device",
            synthetic=True,
        )

    def oom_sample(self, event: OomEvent) -> Sample:
        """The segment state at an OOM, with the device and NVML figures every other sample
        carries: the device's total stays known there (the panel's bar stays to its scale)."""
        from gpumemviz.snapshot import Snapshot

        snap = Snapshot.from_torch(event.snapshot) if event.snapshot is not None else None
        reserved = int(snap.segments.total_size.sum()) if snap is not None else event.reserved
        return Sample.for_oom(
            event,
            self.device,
            snap,
            source_label=self.label,
            demo=True,
            device_info=self._device_info(),
            nvml=self._nvml(reserved),
        )

    def empty_cache(self) -> dict[int, int]:
        """Release the model's cached segments; bytes released on this (simulated) device."""
        with self._lock:
            return {self.device: int(self._model.empty_cache())}

    def reset_peaks(self) -> None:
        """Start the model's peak figures again from the current ones (as
        ``torch.cuda.reset_peak_memory_stats``), so a panel can watch the next phase's peak."""
        with self._lock:
            self._model.reset_peak_stats()
            self._carried = {k: v for k, v in self._carried.items() if not k.endswith(".peak")}

    def _memory_stats(self) -> dict[str, int]:
        """The model's stats with the earlier runs' counts added (peaks: the higher)."""
        stats = dict(self._model.memory_stats())
        for key, value in self._carried.items():
            if key.endswith(".peak"):
                stats[key] = max(stats.get(key, 0), value)
            else:
                stats[key] = stats.get(key, 0) + value
        return stats

    def export(self) -> TorchDict:
        """The model's full snapshot (torch 2.11 format, with its recorded history)."""
        with self._lock:
            return self._model.snapshot(record=False)

    def close(self) -> None:
        """Stop the workload thread."""
        self._closed = True
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(1.0)
