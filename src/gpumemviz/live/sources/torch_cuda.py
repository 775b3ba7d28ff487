"""The live source: torch.cuda's caching allocator.

Rules this module keeps:

- gpumemviz never initialises CUDA. Until ``torch.cuda.is_initialized()`` a sample says
  "waiting for CUDA"; ``mem_get_info``, ``get_device_properties`` and the OOM observer would each
  create a context, so none is called before.
- ``memory_stats()`` every tick (a struct copy under the allocator lock, no CUDA call).
- Segment state from ``memory_snapshot(include_traces=False)`` where torch has it (2.11+). Older
  torch copies the whole recorded history on every call, so the source times each call and
  stretches the gap between them (``segment_interval_hint``) to keep that cost small.
- Every snapshot call appends a ``snapshot`` entry to the user's recorded history: while the
  user records history, segment state is read slowly; when gpumemviz turns recording on itself it
  passes ``skip_actions=["snapshot"]``.
- OOMs come from the process-wide observer (`gpumemviz.live.sources.oom_observer`), which runs in
  the user's allocating thread and judges each failure there; this source only installs its
  handler there, for its device.
"""

from __future__ import annotations

import inspect
import os
import time
from typing import TYPE_CHECKING, Any

from gpumemviz.live.sources.base import OomHandler, SourceCommandError, short_error
from gpumemviz.live.sources.nvml import NvmlReader, normalize_uuid
from gpumemviz.live.sources.oom_observer import add_handler, ensure_observer, remove_handler
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.sample import (
    SEGMENTS_NOT_READ,
    DeviceInfo,
    MemoryStats,
    NvmlInfo,
    OomEvent,
    Sample,
    check_device,
)

if TYPE_CHECKING:
    from gpumemviz.snapshot import Snapshot
    from gpumemviz.snapshot.schema import TorchDict, TorchList

__all__ = ["TorchCudaSource"]

WAITING = "waiting for CUDA: gpumemviz does not initialise it; the panel starts when your code does"
ASYNC_NOTE = (
    "the cudaMallocAsync backend keeps no segment map (CUDA's own pool owns the memory): "
    "showing stats and NVML only"
)
_SLOW_SNAPSHOT_S = 0.02  # a segment read costing more than this gets spaced out
_SNAPSHOT_DUTY = 0.01  # at most 1 % of wall time in fallback segment reads
_RECORDING_GAP_S = 10.0  # gap between segment reads while the user records history


def _torch() -> Any:  # Any: torch is read by duck typing, across versions
    import torch  # lazily: `import gpumemviz` never imports torch

    return torch


def _accepts(func: Any, name: str) -> bool:  # Any: a torch function, duck typed
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def _history_enabled(torch: Any) -> bool | None:  # Any: torch, duck typed (`_torch`)
    fn = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if fn is None:
        return None
    try:
        return bool(fn())
    except Exception:
        return None


class TorchCudaSource:
    """Live samples of one CUDA device from torch's caching allocator.

    Parameters
    ----------
    device : int
        CUDA device index.
    nvml : bool
        Read NVML for device-wide memory and other processes (default True).

    Examples
    --------
    >>> src = TorchCudaSource(0)
    >>> src.sample().state in {"ok", "waiting", "unavailable"}
    True
    """

    label = "torch.cuda"
    demo = False

    def __init__(self, device: int = 0, *, nvml: bool = True) -> None:
        self.device = check_device(device)
        self._use_nvml = nvml
        self._nvml: NvmlReader | None = None
        self._info: DeviceInfo | None = None
        self._we_record = False  # gpumemviz turned history recording on
        self._fast_snapshot: bool | None = None  # memory_snapshot(include_traces=...) exists
        self._snapshot_cost = 0.0  # seconds the last fallback segment read took
        self._oom_on = False
        self._oom_handler: OomHandler | None = None
        self._extra_ooms: dict[OomHandler, OomHandler] = {}  # add_oom_handler: ours -> wrapped
        self._closed = False

    # capabilities --------------------------------------------------------------------------
    @property
    def capabilities(self) -> frozenset[str]:
        caps = {"empty_cache", "export", "oom", "record_history"}
        if self._info is None or self._info.backend != "cudaMallocAsync":
            caps.add("segments")
        if self._use_nvml:
            caps.add("nvml")
        return frozenset(caps)

    @property
    def segment_interval_hint(self) -> float:
        """Shortest sensible gap between segment reads, in seconds (0 when any gap is fine)."""
        gap = 0.0
        if self._snapshot_cost > _SLOW_SNAPSHOT_S:
            gap = self._snapshot_cost / _SNAPSHOT_DUTY
        try:
            torch = _torch()
            if torch.cuda.is_initialized() and not self._we_record and _history_enabled(torch):
                gap = max(gap, _RECORDING_GAP_S)
        except Exception:
            pass
        return gap

    # reading -------------------------------------------------------------------------------
    def _device_info(self, torch: Any) -> DeviceInfo:
        if self._info is None:
            cuda = torch.cuda
            props = cuda.get_device_properties(self.device)
            try:
                backend = str(cuda.get_allocator_backend())
            except Exception:
                backend = None
            settings = ""
            getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
            try:
                settings = str(getter()) if getter is not None else ""
            except Exception:
                settings = ""
            if not settings:
                settings = os.environ.get(
                    "PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", "")
                )
            major, minor = getattr(props, "major", None), getattr(props, "minor", None)
            self._info = DeviceInfo(
                index=self.device,
                name=str(getattr(props, "name", "")),
                total_memory=int(getattr(props, "total_memory", 0)),
                uuid=normalize_uuid(getattr(props, "uuid", None)),
                capability=(
                    (int(major), int(minor)) if major is not None and minor is not None else None
                ),
                backend=backend,
                allocator_settings=settings,
                torch_version=str(getattr(torch, "__version__", "")),
            )
        return self._info

    # Any: torch, duck typed (`_torch`); the result is a Snapshot or None
    def _segments(self, torch: Any) -> tuple[Snapshot | None, str | None]:
        """This device's segment state as a Snapshot, or None and why."""
        from gpumemviz.snapshot import Snapshot

        cuda = torch.cuda
        if self._fast_snapshot is None:
            self._fast_snapshot = _accepts(cuda.memory_snapshot, "include_traces")
        t0 = time.perf_counter()
        if self._fast_snapshot:
            raw = cuda.memory_snapshot(include_traces=False)
        else:
            raw = cuda.memory_snapshot()
            self._snapshot_cost = time.perf_counter() - t0
        mine = [s for s in raw if s.get("device", self.device) == self.device]
        note = None
        if not self._fast_snapshot and self._snapshot_cost > _SLOW_SNAPSHOT_S:
            note = (
                f"segment map every {self.segment_interval_hint:.0f} s: memory_snapshot took "
                f"{self._snapshot_cost * 1e3:.0f} ms (torch < 2.11 copies the recorded history)"
            )
        return Snapshot.from_torch(mine), note

    def sample(self, *, segments: bool = True) -> Sample:
        """Read stats, and segment state when ``segments``; never raises."""
        t, mono = time.time(), time.monotonic()
        base: dict[str, Any] = {  # Any: Sample's fields, of their own types
            "time": t,
            "monotonic": mono,
            "device": self.device,
            "source_label": self.label,
        }
        try:
            torch = _torch()
        except ImportError:
            return Sample(
                stats=None, state="unavailable", errors=("torch is not installed",), **base
            )
        try:
            cuda = torch.cuda
            if not cuda.is_available():
                reason = f"CUDA is not available (torch {getattr(torch, '__version__', '?')})"
                return Sample(stats=None, state="unavailable", errors=(reason,), **base)
            if not cuda.is_initialized():
                return Sample(
                    stats=None, state="waiting", segments_note=WAITING, notes=(WAITING,), **base
                )
            count = cuda.device_count()
            if self.device >= count:
                reason = f"no CUDA device {self.device} (this process sees {count})"
                return Sample(stats=None, state="unavailable", errors=(reason,), **base)
        except Exception as exc:
            return Sample(stats=None, state="error", errors=(short_error(exc),), **base)

        errors: list[str] = []
        info = None
        try:
            info = self._device_info(torch)
        except Exception as exc:
            errors.append(f"device properties: {short_error(exc)}")
        if self._oom_on:
            ensure_observer(defer=False)
        stats = None
        try:
            stats = MemoryStats.from_torch(cuda.memory_stats(self.device))
        except Exception as exc:
            errors.append(f"memory_stats: {short_error(exc)}")
        snap, note = None, None
        if info is not None and info.backend == "cudaMallocAsync":
            note = ASYNC_NOTE
        elif segments:
            try:
                snap, note = self._segments(torch)
            except Exception as exc:
                errors.append(f"memory_snapshot: {short_error(exc)}")
                note = "segment map not readable"
        else:
            note = SEGMENTS_NOT_READ
        reserved = stats.reserved if stats is not None else None
        nvml_info = None
        if self._use_nvml:
            if self._nvml is None:
                self._nvml = NvmlReader(self.device, info.uuid if info else None)
            nvml_info = self._nvml.read(reserved)
        dev_total = dev_free = None
        if nvml_info is None or not nvml_info.available:
            dev_free, dev_total = self._mem_get_info(cuda, stats)
            if (
                dev_total is not None
                and dev_free is not None
                and nvml_info is not None
                and reserved is not None
            ):
                # NVML is missing: the driver's own count still tells what PyTorch does not hold.
                nvml_info = NvmlInfo(
                    available=False,
                    reason=nvml_info.reason,
                    total=dev_total,
                    used=dev_total - dev_free,
                    free=dev_free,
                    non_pytorch=dev_total - dev_free - reserved,
                )
        return Sample(
            stats=stats,
            segments=snap,
            nvml=nvml_info,
            errors=tuple(errors),
            state="ok" if stats is not None else "error",
            device_info=info,
            segments_note=note,
            **base,
        )

    # Any: torch.cuda, duck typed
    def _mem_get_info(self, cuda: Any, stats: MemoryStats | None) -> tuple[int | None, int | None]:
        """cudaMemGetInfo, only on a device this process already uses (it creates a context)."""
        if stats is None or (stats.peak_reserved == 0 and stats.get("num_device_alloc", 0) == 0):
            return None, None
        try:
            free, total = cuda.mem_get_info(self.device)
            return int(free), int(total)
        except Exception:
            return None, None

    # OOM ------------------------------------------------------------------------------------
    def set_oom_handler(self, handler: OomHandler | None) -> None:
        """Install (or remove, with None) the function called with each OOM of this device.

        The handler runs in the user's allocating thread: it must only queue the event. The
        observer has judged the event there first (`gpumemviz.live.sources.oom.judge`).
        """
        if self._oom_handler is not None:
            remove_handler(self._oom_handler)
            self._oom_handler = None
        self._oom_on = handler is not None
        if handler is None:
            return
        device = self.device

        def on_oom(event: OomEvent) -> None:
            if event.device == device:
                handler(event)

        self._oom_handler = on_oom
        add_handler(on_oom)
        ensure_observer(defer=True)

    def add_oom_handler(self, handler: OomHandler) -> None:
        """Also call ``handler`` with each OOM of this device (the same judged event), beside
        the one `set_oom_handler` installs; in the user's allocating thread, before torch raises
        its error. Never initialises CUDA (the observer attaches as CUDA starts)."""
        device = self.device

        def on_oom(event: OomEvent) -> None:
            if event.device == device:
                handler(event)

        self._extra_ooms[handler] = on_oom
        add_handler(on_oom)
        ensure_observer(defer=True)

    def remove_oom_handler(self, handler: OomHandler) -> None:
        on_oom = self._extra_ooms.pop(handler, None)
        if on_oom is not None:
            remove_handler(on_oom)

    def history_enabled(self) -> bool | None:
        """Whether torch records allocation history now; None before CUDA is initialised (or
        where this torch cannot say)."""
        try:
            torch = _torch()
            if not torch.cuda.is_available() or not torch.cuda.is_initialized():
                return None
            return _history_enabled(torch)
        except Exception:
            return None

    def oom_sample(self, event: OomEvent) -> Sample:
        """The segment state at an OOM, as a sample (built off the user's thread)."""
        snap, errors = None, []
        if event.snapshot is not None:
            try:
                from gpumemviz.snapshot import Snapshot

                mine = {
                    **event.snapshot,
                    "segments": [
                        s
                        for s in event.snapshot.get("segments", ())
                        if s.get("device", self.device) == self.device
                    ],
                }
                snap = Snapshot.from_torch(mine)
            except Exception as exc:
                errors.append(f"OOM snapshot: {short_error(exc)}")
        elif event.snapshot_error:
            errors.append(f"OOM snapshot: {event.snapshot_error}")
        return Sample.for_oom(
            event,
            self.device,
            snap,
            errors=tuple(errors),
            source_label=self.label,
            device_info=self._info,
        )

    # commands ------------------------------------------------------------------------------
    def empty_cache(self) -> dict[int, int]:
        """Release cached memory; bytes released per device.

        torch's ``empty_cache`` flushes every device's cache, waits on pending events and calls
        cudaFree (which synchronises the device), so it stalls running work on all devices.
        """
        torch = _torch()
        cuda = torch.cuda
        if not cuda.is_available() or not cuda.is_initialized():
            raise SourceCommandError("cannot empty the cache: " + WAITING)
        devices = range(cuda.device_count())

        def reserved() -> dict[int, int]:
            return {
                d: int(cuda.memory_stats(d).get("reserved_bytes.all.current", 0)) for d in devices
            }

        before = reserved()
        cuda.empty_cache()
        after = reserved()
        return {d: before[d] - after.get(d, 0) for d in before}

    def allocation_stack(self, address: int) -> TorchList | None:
        """The frames (innermost first) that allocated the live block at `address`, from
        torch's own record of that one pointer (``torch.cuda.memory._allocation_traceback``,
        torch 2.13 on): what the panel's hover asks for, with no snapshot taken. None where
        torch has no such function, CUDA is not initialised, the address is not a live
        allocation's start, or history is not recorded; never raises."""
        try:
            torch = _torch()
            if not torch.cuda.is_available() or not torch.cuda.is_initialized():
                return None
            memory = torch.cuda.memory
            if not hasattr(memory, "_allocation_traceback"):
                return None
            frames = memory._allocation_traceback(int(address))
        except Exception:
            return None
        if not isinstance(frames, list) or not all(isinstance(f, dict) for f in frames):
            return None
        return frames or None

    def reset_peaks(self) -> None:
        """``torch.cuda.reset_peak_memory_stats`` on this device: the peak figures start again
        from the current ones. Never initialises CUDA."""
        torch = _torch()
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            raise SourceCommandError("cannot reset peaks: " + WAITING)
        torch.cuda.reset_peak_memory_stats(self.device)

    def export(self) -> TorchDict:
        """The full ``torch.cuda.memory._snapshot()`` dict (all devices, recorded history)."""
        torch = _torch()
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            raise SourceCommandError("nothing to export: " + WAITING)
        snapshot: TorchDict = torch.cuda.memory._snapshot()
        return snapshot

    def record_history(
        self,
        enabled: bool = True,
        *,
        max_entries: int = 100_000,
        stacks: str = "python",
        context: str = "all",
    ) -> None:
        """Turn torch's allocation history on (python stacks by default) or off.

        gpumemviz passes ``skip_actions=["snapshot"]`` so its own segment reads do not fill the
        ring. ``stacks="all"`` adds C++ frames; dumps then take minutes on big jobs.
        """
        if stacks not in {"python", "all"}:
            raise ValueError(f"stacks must be 'python' or 'all', got {short_repr(stacks)}")
        torch = _torch()
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            raise SourceCommandError("cannot record history: " + WAITING)
        record = torch.cuda.memory._record_memory_history
        if not enabled:
            record(enabled=None)
            self._we_record = False
            return
        kwargs: dict[str, Any] = {  # Any: torch's keyword arguments
            "enabled": "all",
            "context": context,
            "stacks": stacks,
            "max_entries": int(max_entries),
        }
        if _accepts(record, "skip_actions"):
            kwargs["skip_actions"] = ["snapshot"]
        record(**kwargs)
        self._we_record = "skip_actions" in kwargs

    def close(self) -> None:
        """Remove the OOM handler (the observer itself stays attached, as a no-op)."""
        self.set_oom_handler(None)
        for handler in list(self._extra_ooms):
            self.remove_oom_handler(handler)
        self._closed = True
