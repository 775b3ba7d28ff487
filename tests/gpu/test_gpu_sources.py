"""Live checks of the torch.cuda source, OOM capture and NVML on a real GPU (skipped without one).

Run on a GPU machine: ``PYTHONPATH=src python -m pytest -q -p no:cacheprovider tests/gpu``.
Where tests/data/gpu/ holds recorded data (tests/gpu/record_fixtures.py), the live results are
compared with it. Checks that must see a process where CUDA is not yet initialised, or that
provoke an OOM, run in a fresh subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import read_real

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "gpu"


def run_py(code: str, timeout: float = 120, env: dict | None = None) -> dict:
    """Run code in a fresh interpreter (CUDA not initialised); it prints one JSON line."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_never_initialises_cuda_and_says_waiting():
    out = run_py(
        """
        import json, time, torch
        from gpumemviz.live.sampler import Sampler
        from gpumemviz.live.sources.torch_cuda import TorchCudaSource
        src = TorchCudaSource(0)
        first = src.sample()
        s = Sampler(src, interval=0.05)
        s.start(); time.sleep(0.4); s.stop()
        waiting = {x.state for x in s.history}
        init_after = torch.cuda.is_initialized()
        x = torch.ones(1 << 20, device="cuda")  # the user's code initialises CUDA
        second = src.sample()
        print(json.dumps({"first": first.state, "waiting": sorted(waiting),
                          "init_after": init_after, "second": second.state,
                          "errors": list(second.errors)}))
        """
    )
    assert out["first"] == "waiting"
    assert out["waiting"] == ["waiting"]
    assert out["init_after"] is False
    assert out["second"] == "ok", out["errors"]


def test_live_sample_is_consistent():
    import torch

    from gpumemviz.live.sources.torch_cuda import TorchCudaSource

    keep = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 25)]
    src = TorchCudaSource(0)
    s = src.sample(segments=True)
    assert s.state == "ok", s.errors
    segs = s.segments
    assert int(segs.segments.total_size.sum()) == s.stats.reserved
    assert int(segs.segments.allocated_size.sum()) == s.stats.allocated
    assert s.device_info.total_memory == torch.cuda.get_device_properties(0).total_memory
    assert s.device_info.uuid
    assert "segments" in src.capabilities
    del keep


def test_stats_keys_match_the_recorded_ones():
    import torch

    recorded = RECORDED / "memory_stats_plain.json"
    if not recorded.exists():
        pytest.skip("no recorded memory_stats (run tests/gpu/record_fixtures.py)")
    torch.ones(1, device="cuda")
    live = set(torch.cuda.memory_stats(0))
    keys = set(json.loads(recorded.read_text()))
    # private-pool keys come and go; the fixed ones must all be there
    assert {k for k in keys if "private_pools" not in k} <= live


def test_empty_cache_reports_what_it_released():
    import torch

    from gpumemviz.live.sources.torch_cuda import TorchCudaSource

    x = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    del x
    released = TorchCudaSource(0).empty_cache()
    assert set(released) == set(range(torch.cuda.device_count()))
    assert released[0] >= 100 << 20


def test_capture_oom_writes_the_snapshot_at_the_failure(tmp_path):
    path = tmp_path / "oom.pickle"
    out = run_py(
        f"""
        import json, torch, gpumemviz
        cap = gpumemviz.capture_oom({str(path)!r})
        total = None
        with cap:
            x = torch.ones(1 << 20, device="cuda")
            total = torch.cuda.get_device_properties(0).total_memory
            try:
                torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                pass
        ev = cap.events[0] if cap.events else None
        print(json.dumps({{"written": str(cap.written), "error": cap.error,
                          "n": len(cap.events), "cause": ev and ev.cause,
                          "alloc": ev and ev.alloc_size, "total": total}}))
        """
    )
    assert out["written"] == str(path), out
    assert out["n"] == 1
    assert out["cause"] == "capacity"
    assert out["alloc"] >= out["total"]
    snap = read_real(path)
    assert snap["segments"] is not None and "device_traces" in snap


def test_nvml_matches_the_torch_device_by_uuid():
    import torch

    from gpumemviz.live.sources.torch_cuda import TorchCudaSource

    x = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
    s = TorchCudaSource(0).sample(segments=False)
    info = s.nvml
    if not info.available:
        pytest.skip(f"NVML not available on this GPU machine: {info.reason}")
    assert info.matched_by == "uuid"
    assert info.uuid == s.device_info.uuid
    assert info.total >= s.device_info.total_memory * 0.9
    assert info.used >= s.stats.reserved
    assert info.non_pytorch == info.used - s.stats.reserved
    assert info.split_reason is not None or info.this_process_other is not None
    del x


def test_sampler_on_the_gpu_stays_within_budget():
    import time

    import torch

    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.torch_cuda import TorchCudaSource

    torch.ones(1, device="cuda")
    s = Sampler(TorchCudaSource(0), interval=0.1, segment_interval=0.2)
    s.start()
    a = torch.randn(2048, 2048, device="cuda")
    t_end = time.monotonic() + 2.0
    while time.monotonic() < t_end:
        a = (a @ a).tanh()
    torch.cuda.synchronize()
    s.stop()
    st = s.status()
    assert st["ticks"] >= 8
    assert st["errors"] == 0, s.last_error
    assert st["cpu_share"] < 0.02 + 0.01
    assert s.history.latest_segments() is not None
