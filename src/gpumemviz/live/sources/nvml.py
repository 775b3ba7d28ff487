"""NVML (nvidia-ml-py): what the driver sees of a device, matched to torch's device by UUID.

torch's device index is not NVML's index: CUDA_VISIBLE_DEVICES reorders and hides devices, and
MIG instances are devices of their own. So the reader finds the NVML handle by the UUID torch
reports, and says how it matched. Every NVML failure becomes ``NvmlInfo(available=False,
reason=...)``; nothing here raises.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, TypedDict

from gpumemviz.live.sources.base import short_error
from gpumemviz.snapshot.sample import NvmlInfo

__all__ = ["NvmlReader", "normalize_uuid"]

_INIT_LOCK = threading.Lock()


class _InitState(TypedDict):
    ok: bool
    error: str | None
    tried_at: float | None


_INIT_STATE: _InitState = {"ok": False, "error": None, "tried_at": None}
_RETRY_S = 60.0  # a failed nvmlInit is retried at most this often (a driver may appear)


def normalize_uuid(uuid: object) -> str | None:
    """Lower-case UUID without the "GPU-"/"MIG-" prefix, so torch's and NVML's forms compare.

    >>> normalize_uuid("GPU-8A7B-01"), normalize_uuid("8a7b-01"), normalize_uuid(None)
    ('8a7b-01', '8a7b-01', None)
    """
    if uuid is None:
        return None
    if isinstance(uuid, bytes):
        uuid = uuid.decode("ascii", "replace")
    text = str(uuid).strip().strip("\0").lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text or None


def _pynvml() -> Any:  # Any: pynvml ships no types
    import pynvml  # nvidia-ml-py; lazily, so `import gpumemviz` stays light

    return pynvml


def _ensure_init() -> str | None:
    """Initialise NVML once per process; the reason it is not available, or None."""
    with _INIT_LOCK:
        if _INIT_STATE["ok"]:
            return None
        now = time.monotonic()
        tried = _INIT_STATE["tried_at"]
        if tried is not None and now - tried < _RETRY_S:
            return _INIT_STATE["error"]
        _INIT_STATE["tried_at"] = now
        try:
            nv = _pynvml()
        except ImportError:
            _INIT_STATE["error"] = "nvidia-ml-py is not installed (pip install gpumemviz[nvml])"
            return _INIT_STATE["error"]
        try:
            nv.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            _INIT_STATE["error"] = short_error(exc)
            return _INIT_STATE["error"]
        _INIT_STATE["ok"] = True
        _INIT_STATE["error"] = None
        return None


def _reset_for_tests() -> None:
    """Forget the init result (tests swap a stand-in driver in and out)."""
    with _INIT_LOCK:
        _INIT_STATE.update({"ok": False, "error": None, "tried_at": None})


def _text(value: object) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Reads one torch device's memory, utilisation and process list through NVML.

    Parameters
    ----------
    device : int
        The torch (CUDA runtime) device index, used only when no UUID is known.
    uuid : str, optional
        The device UUID as torch reports it (``get_device_properties(d).uuid``).
    """

    def __init__(self, device: int, uuid: str | None = None) -> None:
        self.device = device
        self.uuid = normalize_uuid(uuid)
        self._handle: Any = None  # Any: pynvml's handle (pynvml ships no types)
        self._matched_by: str | None = None

    def _find_handle(self, nv: Any) -> tuple[Any, str]:  # Any: pynvml and its handle
        if self.uuid:
            for prefix in ("GPU-", "MIG-"):
                try:
                    return nv.nvmlDeviceGetHandleByUUID(prefix + self.uuid), "uuid"
                except Exception:  # try the other prefix, then a scan
                    continue
            for handle in self._all_handles(nv):
                try:
                    if normalize_uuid(nv.nvmlDeviceGetUUID(handle)) == self.uuid:
                        return handle, "uuid"
                except Exception:  # a device that will not say is not ours
                    continue
            raise LookupError(f"no NVML device has torch's UUID {self.uuid}")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return nv.nvmlDeviceGetHandleByIndex(self.device), "index (torch gave no UUID)"
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if self.device >= len(entries):
            raise LookupError(f"device {self.device} is not in CUDA_VISIBLE_DEVICES={visible}")
        entry = entries[self.device]
        if entry.isdigit():
            how = f"index via CUDA_VISIBLE_DEVICES={visible}"
            return nv.nvmlDeviceGetHandleByIndex(int(entry)), how
        return nv.nvmlDeviceGetHandleByUUID(entry), "uuid from CUDA_VISIBLE_DEVICES"

    @staticmethod
    def _all_handles(nv: Any) -> list[Any]:  # Any: pynvml and its handles
        handles = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            handles.append(h)
            try:
                n_mig = nv.nvmlDeviceGetMaxMigDeviceCount(h)
            except Exception:
                n_mig = 0
            for j in range(n_mig or 0):
                try:
                    handles.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j))
                except Exception:  # an empty MIG slot
                    continue
        return handles

    def read(self, torch_reserved: int | None = None) -> NvmlInfo:
        """Device memory, utilisation and processes; never raises.

        Parameters
        ----------
        torch_reserved : int, optional
            Bytes PyTorch's allocator holds on this device, to compute memory used outside it.
        """
        reason = _ensure_init()
        if reason is not None:
            return NvmlInfo.unavailable(f"NVML not available: {reason}")
        nv = _pynvml()
        try:
            if self._handle is None:
                self._handle, self._matched_by = self._find_handle(nv)
            mem = nv.nvmlDeviceGetMemoryInfo(self._handle)
            total, used, free = int(mem.total), int(mem.used), int(mem.free)
        except Exception as exc:
            self._handle = None
            return NvmlInfo.unavailable(f"NVML not available: {short_error(exc)}")
        uuid = self.uuid
        if uuid is None:
            try:
                uuid = normalize_uuid(_text(nv.nvmlDeviceGetUUID(self._handle)))
            except Exception:
                uuid = None
        try:
            utilization: int | None = int(nv.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except Exception:  # not supported under MIG
            utilization = None
        processes: list[tuple[int, int | None]] = []
        split_reason: str | None = None
        try:
            for p in nv.nvmlDeviceGetComputeRunningProcesses(self._handle):
                used_p = getattr(p, "usedGpuMemory", None)
                processes.append((int(p.pid), None if used_p is None else int(used_p)))
        except Exception as exc:
            split_reason = f"NVML process list not available: {short_error(exc)}"
        non_pytorch = None if torch_reserved is None else used - int(torch_reserved)
        this_other = others = None
        if split_reason is None:
            pid = os.getpid()
            ours = [u for p, u in processes if p == pid]
            if not ours:
                split_reason = (
                    f"our PID {pid} is not in NVML's process list "
                    "(inside a container NVML reports host PIDs)"
                )
            elif ours[0] is None or any(u is None for p, u in processes if p != pid):
                split_reason = "NVML does not report per-process memory here (MIG?)"
            elif torch_reserved is None:
                split_reason = "torch reserved bytes unknown"
            else:
                this_other = ours[0] - int(torch_reserved)
                others = sum(u or 0 for p, u in processes if p != pid)
        return NvmlInfo(
            available=True,
            uuid=uuid,
            matched_by=self._matched_by,
            total=total,
            used=used,
            free=free,
            utilization=utilization,
            processes=tuple(processes),
            non_pytorch=non_pytorch,
            this_process_other=this_other,
            other_processes=others,
            split_reason=split_reason,
        )
