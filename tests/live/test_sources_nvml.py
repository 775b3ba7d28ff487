"""sources/nvml.py: the real pynvml without a driver, and a SYNTHETIC stand-in driver.

The failure path runs the real nvidia-ml-py module on this machine (no libnvidia-ml). The values
path swaps a stand-in for the driver calls only; every figure it serves is synthetic, and the
errors it raises are pynvml's own exception classes.
"""

from __future__ import annotations

import os
import types

import pynvml
import pytest

from gpumemviz.live.sources import nvml as nvml_mod
from gpumemviz.live.sources.nvml import NvmlReader, normalize_uuid

GiB = 1 << 30


@pytest.fixture(autouse=True)
def fresh_init():
    nvml_mod._reset_for_tests()
    yield
    nvml_mod._reset_for_tests()


def test_without_a_driver_nvml_is_not_available_with_the_reason():
    info = NvmlReader(0, "GPU-1234").read(torch_reserved=GiB)
    assert info.available is False
    assert info.reason == (
        "NVML not available: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    )
    assert info.used is None and info.non_pytorch is None
    # the failed init is remembered: a second read does not retry the library every tick
    assert NvmlReader(0).read().reason == info.reason


def test_the_real_library_error_is_what_we_think_it_is():
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()


class SyntheticDriver:
    """SYNTHETIC: two GPUs (physical order differs from CUDA order) and one MIG slice."""

    def __init__(self, processes=None, mig_processes_hidden=False):
        self.gpus = {
            "GPU-aaaa-0000": {"total": 80 * GiB, "used": 30 * GiB, "util": 97},
            "GPU-bbbb-1111": {"total": 80 * GiB, "used": 5 * GiB, "util": 3},
            "MIG-cccc-2222": {"total": 10 * GiB, "used": 2 * GiB, "util": None},
        }
        self.order = ["GPU-aaaa-0000", "GPU-bbbb-1111"]
        self.processes = processes or {}
        self.inits = 0

    def install(self, mp: pytest.MonkeyPatch) -> None:
        d = self

        def err(code):
            return pynvml.NVMLError(code)

        def by_uuid(uuid):
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
            if uuid not in d.gpus:
                raise err(pynvml.NVML_ERROR_NOT_FOUND)
            return uuid

        def by_index(i):
            if i >= len(d.order):
                raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return d.order[i]

        def util(h):
            if d.gpus[h]["util"] is None:
                raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return types.SimpleNamespace(gpu=d.gpus[h]["util"], memory=0)

        def mem(h):
            g = d.gpus[h]
            return types.SimpleNamespace(
                total=g["total"], used=g["used"], free=g["total"] - g["used"]
            )

        def procs(h):
            return [
                types.SimpleNamespace(pid=pid, usedGpuMemory=used)
                for pid, used in d.processes.get(h, [])
            ]

        def init():
            d.inits += 1

        mp.setattr(pynvml, "nvmlInit", init)
        mp.setattr(pynvml, "nvmlDeviceGetHandleByUUID", by_uuid)
        mp.setattr(pynvml, "nvmlDeviceGetHandleByIndex", by_index)
        mp.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(d.order))
        mp.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: h)
        mp.setattr(pynvml, "nvmlDeviceGetMemoryInfo", mem)
        mp.setattr(pynvml, "nvmlDeviceGetUtilizationRates", util)
        mp.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", procs)
        mp.setattr(pynvml, "nvmlDeviceGetMaxMigDeviceCount", lambda h: 0)


def test_device_is_matched_by_uuid_not_by_index(monkeypatch):
    pid = os.getpid()
    drv = SyntheticDriver(
        processes={"GPU-bbbb-1111": [(pid, 4 * GiB), (999_999, GiB // 2)]}  # SYNTHETIC
    )
    drv.install(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    # torch's device 0 is the physical GPU 1; torch reports its UUID without the prefix
    info = NvmlReader(0, uuid="BBBB-1111").read(torch_reserved=3 * GiB)
    assert info.available and info.matched_by == "uuid"
    assert (info.total, info.used, info.utilization) == (80 * GiB, 5 * GiB, 3)
    assert info.non_pytorch == 2 * GiB  # device used - torch reserved, all processes together
    assert info.this_process_other == 1 * GiB  # our NVML figure - reserved
    assert info.other_processes == GiB // 2
    assert info.split_reason is None
    assert info.processes == ((pid, 4 * GiB), (999_999, GiB // 2))
    assert drv.inits == 1
    NvmlReader(0, uuid="BBBB-1111").read()
    assert drv.inits == 1  # NVML is initialised once per process


def test_without_uuid_cuda_visible_devices_is_honoured(monkeypatch):
    SyntheticDriver().install(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    info = NvmlReader(0).read()
    assert info.used == 5 * GiB
    assert info.matched_by == "index via CUDA_VISIBLE_DEVICES=1,0"
    assert info.uuid == "bbbb-1111"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert "not in CUDA_VISIBLE_DEVICES" in NvmlReader(1).read().reason


def test_container_pids_leave_the_split_out_and_say_why(monkeypatch):
    SyntheticDriver(processes={"GPU-aaaa-0000": [(4242, 29 * GiB)]}).install(monkeypatch)
    info = NvmlReader(0, uuid="aaaa-0000").read(torch_reserved=28 * GiB)
    assert info.non_pytorch == 2 * GiB
    assert info.this_process_other is None and info.other_processes is None
    assert "host PIDs" in info.split_reason


def test_mig_instance_without_per_process_figures(monkeypatch):
    pid = os.getpid()
    SyntheticDriver(processes={"MIG-cccc-2222": [(pid, None)]}).install(monkeypatch)
    info = NvmlReader(0, uuid="MIG-cccc-2222").read(torch_reserved=GiB)
    assert info.available and info.total == 10 * GiB
    assert info.utilization is None  # NVML_ERROR_NOT_SUPPORTED under MIG
    assert info.non_pytorch == GiB
    assert "per-process" in info.split_reason


def test_unknown_uuid_and_driver_errors_become_not_available(monkeypatch):
    drv = SyntheticDriver()
    drv.install(monkeypatch)
    info = NvmlReader(0, uuid="dead-beef").read()
    assert info.available is False
    assert (
        info.reason == "NVML not available: LookupError: no NVML device has torch's UUID dead-beef"
    )

    def lost(h):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lost)
    info = NvmlReader(0, uuid="aaaa-0000").read()
    assert info.available is False
    assert info.reason.startswith("NVML not available: NVMLError_GpuIsLost: GPU is lost")


def test_normalize_uuid_forms():
    assert normalize_uuid(b"GPU-AB\0") == "ab"
    assert normalize_uuid("MIG-x") == "x"
    assert normalize_uuid("") is None
