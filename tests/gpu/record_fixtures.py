"""Record real allocator data on a GPU machine into tests/data/gpu/ (at most 5 minutes).

Run on a machine with CUDA, from the repository root, with nothing beyond torch, pytest and
nvidia-ml-py installed:

    PYTHONPATH=src python tests/gpu/record_fixtures.py [--out tests/data/gpu] [--only PART,...]

Every part runs in its own subprocess with its own timeout, so one failure (a CUDA error, an OOM
that poisons the context, a hang) loses nothing else, and ``PYTORCH_CUDA_ALLOC_CONF`` can differ
per part (it is read once, when CUDA initialises). Each part writes its files and prints one
``SUMMARY {json}`` line; the parent collects them into MANIFEST.json and prints a table.

Parts:
  history_plain        memory_stats keys, _snapshot() and memory_snapshot(include_traces=False)
                       after a short training loop with history recorded; call timings
  history_expandable   the same with expandable_segments:True
  record_stream        a block freed while another stream still uses it (active_pending_free)
  oom                  a capacity OOM and a fragmentation OOM (under a memory-fraction cap), with
                       the observer's arguments and the snapshot taken inside the observer
  nvml                 NVML memory, utilisation, process list and UUIDs, and torch's UUIDs
  empty_cache_thread   torch.cuda.empty_cache() from a second thread during training
  gpumemviz_live       gpumemviz's own TorchCudaSource and Sampler on the GPU (if importable)
  mempool              torch.cuda.MemPool runs with history: use_mem_pool, a freed block reused
                       in its pool, a no_split pool, a use_on_oom pool lending a block, and the
                       pool deleted then emptied; MemPool.snapshot() and use_count() beside it
  cuda_graph           torch.cuda.graph capture with history: eager warm-up, capture into a
                       pool, replays, a second graph sharing the pool, graph 1 reset
  new_fields           what newer torch records where it can: user_metadata
                       (_set_memory_metadata) around the forward pass, an annotation
                       (_annotate_tensor / _annotate_memory) on a live tensor, FX frame fields
                       of a compiled function, _allocation_traceback of one live tensor; which
                       of these this torch has is in new_fields.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "gpu"
MAX_ENTRIES = 4000  # trace ring per device: keeps each pickle to a few MB
PARTS: dict[str, dict[str, Any]] = {
    "history_plain": {"timeout": 45, "env": {}},
    "history_expandable": {
        "timeout": 45,
        "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    },
    "record_stream": {"timeout": 30, "env": {}},
    "oom": {"timeout": 60, "env": {}},
    "nvml": {"timeout": 25, "env": {}},
    "empty_cache_thread": {"timeout": 40, "env": {}},
    "gpumemviz_live": {"timeout": 30, "env": {}},
    "mempool": {"timeout": 60, "env": {}},
    "cuda_graph": {"timeout": 60, "env": {}},
    "new_fields": {"timeout": 90, "env": {}},
}


# ------------------------------------------------------------------------------------------------
# helpers (child side)
# ------------------------------------------------------------------------------------------------
def _dump(obj: Any, path: Path) -> int:
    """Pickle protocol 4 (what memory_viz reads); returns the size."""
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=4)
    return path.stat().st_size


def _json(obj: Any, path: Path) -> int:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, default=repr))
    return path.stat().st_size


def _struct(s: Any) -> dict[str, Any]:
    """A ctypes structure from pynvml as a dict (vars() of one is empty)."""
    return {name: getattr(s, name) for name, *_ in getattr(s, "_fields_", [])}


def _device_facts(torch: Any) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    facts = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_name": props.name,
        "total_memory": props.total_memory,
        "capability": [props.major, props.minor],
        "uuid": str(getattr(props, "uuid", "")),
        "device_count": torch.cuda.device_count(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "PYTORCH_ALLOC_CONF": os.environ.get("PYTORCH_ALLOC_CONF"),
    }
    try:
        facts["allocator_backend"] = torch.cuda.get_allocator_backend()
    except Exception as exc:
        facts["allocator_backend"] = f"error: {exc!r}"
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    facts["allocator_settings_string"] = getter() if getter else None
    return facts


def _train(torch: Any, steps: int, width: int = 1024) -> list[float]:
    """A small MLP with assorted tensor sizes: small (<1 MiB), medium and large (>10 MiB)."""
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width),
        torch.nn.ReLU(),
        torch.nn.Linear(4 * width, width),
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for step in range(steps):
        batch = 64 + 32 * (step % 5)  # varying shapes: splits and reuse
        x = torch.randn(batch, width, device="cuda")
        small = torch.ones(100, device="cuda")  # small pool
        loss = model(x).pow(2).mean() + small.sum() * 0
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 7 == 0:
            big = torch.empty(3 * 1024 * 1024 * 4 + step * 4096, dtype=torch.uint8, device="cuda")
            del big
        losses.append(float(loss))
    torch.cuda.synchronize()
    return losses


def _time(fn: Any, reps: int = 5) -> float:
    """Median wall seconds of fn()."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    out.sort()
    return out[len(out) // 2]


def _accepts(fn: Any, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ------------------------------------------------------------------------------------------------
# parts
# ------------------------------------------------------------------------------------------------
def part_history(out: Path, tag: str) -> dict[str, Any]:
    import torch

    summary: dict[str, Any] = {}
    record = torch.cuda.memory._record_memory_history
    kwargs = {"max_entries": MAX_ENTRIES, "stacks": "python"}
    torch.cuda.init()
    record(**kwargs)
    losses = _train(torch, steps=40)
    stats = torch.cuda.memory_stats(0)
    fast = _accepts(torch.cuda.memory_snapshot, "include_traces")
    summary["memory_snapshot_has_include_traces"] = fast
    segs = (
        torch.cuda.memory_snapshot(include_traces=False) if fast else torch.cuda.memory_snapshot()
    )
    full = torch.cuda.memory._snapshot()
    summary["files"] = {
        f"memory_stats_{tag}.json": _json(stats, out / f"memory_stats_{tag}.json"),
        f"segments_{tag}.pickle": _dump(segs, out / f"segments_{tag}.pickle"),
        f"snapshot_{tag}.pickle": _dump(full, out / f"snapshot_{tag}.pickle"),
    }
    timings = {
        "memory_stats_s": _time(lambda: torch.cuda.memory_stats(0)),
        "mem_get_info_s": _time(lambda: torch.cuda.mem_get_info(0)),
        "snapshot_full_s": _time(torch.cuda.memory._snapshot, reps=3),
        "memory_snapshot_default_s": _time(torch.cuda.memory_snapshot, reps=3),
    }
    if fast:
        timings["memory_snapshot_no_traces_s"] = _time(
            lambda: torch.cuda.memory_snapshot(include_traces=False)
        )
    is_hist = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    meta = {
        **_device_facts(torch),
        "record_kwargs": kwargs,
        "history_enabled_flag": is_hist() if is_hist else None,
        "timings": timings,
        "n_stats_keys": len(stats),
        "n_segments": len(segs),
        "n_blocks": sum(len(s["blocks"]) for s in segs),
        "trace_lengths": [len(t) for t in full.get("device_traces", [])],
        "top_level_keys": sorted(full),
        "segment_keys": sorted(full["segments"][0]) if full["segments"] else [],
        "block_keys": sorted(full["segments"][0]["blocks"][0]) if full["segments"] else [],
        "trace_keys": sorted({k for t in full["device_traces"] for e in t for k in e}),
        "actions": sorted({e["action"] for t in full["device_traces"] for e in t}),
        "allocator_settings": full.get("allocator_settings"),
        "losses_finite": all(v == v for v in losses),
    }
    record(enabled=None)
    summary["files"][f"meta_{tag}.json"] = _json(meta, out / f"meta_{tag}.json")
    summary.update(
        n_segments=meta["n_segments"],
        n_blocks=meta["n_blocks"],
        expandable=any(s.get("is_expandable") for s in segs),
        timings_ms={k: round(v * 1e3, 3) for k, v in timings.items()},
    )
    return summary


def part_record_stream(out: Path) -> dict[str, Any]:
    import torch

    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    side = torch.cuda.Stream()
    x = torch.empty(8 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # 8 MiB
    addr = x.data_ptr()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # keep the side stream busy (~1 s)
        x.add_(1)
    x.record_stream(side)
    del x  # freed on the default stream while `side` still uses it: pending free
    snap = torch.cuda.memory._snapshot()
    states = [b["state"] for s in snap["segments"] for b in s["blocks"] if b.get("address") == addr]
    torch.cuda.synchronize()
    after = torch.cuda.memory._snapshot()  # the event has completed by now
    states_after = [
        b["state"] for s in after["segments"] for b in s["blocks"] if b.get("address") == addr
    ]
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats(0)
    files = {
        "record_stream.pickle": _dump(snap, out / "record_stream.pickle"),
        "record_stream_after.pickle": _dump(after, out / "record_stream_after.pickle"),
    }
    facts = {
        "addr": addr,
        "state_while_pending": states,
        "state_after_sync": states_after,
        "active_bytes_after": stats.get("active_bytes.all.current"),
    }
    files["record_stream.json"] = _json(facts, out / "record_stream.json")
    return {"files": files, **facts}


def part_oom(out: Path) -> dict[str, Any]:
    import torch

    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    calls: list[dict[str, Any]] = []
    snaps: list[Any] = []

    def observer(device: int, alloc: int, device_total: int, device_free: int) -> None:
        try:
            calls.append(
                {"device": device, "alloc": alloc, "arg3": device_total, "device_free": device_free,
                 "time": time.time(), "thread": threading.current_thread().name}
            )  # fmt: skip
            snaps.append(torch.cuda.memory._snapshot())
        except Exception as exc:  # never raise into the allocating code
            calls.append({"error": repr(exc)})

    torch._C._cuda_attach_out_of_memory_observer(observer)
    capture = None
    try:  # gpumemviz's own capture, if the package is importable (PYTHONPATH=src)
        import gpumemviz

        capture = gpumemviz.capture_oom(out / "oom_capture_oom.pickle")
    except Exception as exc:
        calls.append({"gpumemviz_import_error": repr(exc)})
    total = torch.cuda.get_device_properties(0).total_memory
    result: dict[str, Any] = {"device_total": total, "cases": {}}

    def provoke(name: str, fn: Any) -> None:
        n_before, c_before = len(snaps), len(calls)
        case: dict[str, Any] = {}
        try:
            fn()
            case["raised"] = None
        except torch.OutOfMemoryError as exc:
            case["raised"] = str(exc).splitlines()[0][:400]
        # the last observer call is the failure of interest (a fill loop may OOM before it)
        case["observer_calls"] = calls[c_before:][-3:]
        case["n_observer_calls"] = len(calls) - c_before
        case["stats_num_ooms"] = torch.cuda.memory_stats(0).get("num_ooms")
        if len(snaps) > n_before:
            _dump(snaps[-1], out / f"oom_{name}.pickle")
            case["file"] = f"oom_{name}.pickle"
            trace = snaps[-1]["device_traces"][0]
            case["last_trace_actions"] = [e["action"] for e in trace[-3:]]
            ooms = [
                {k: v for k, v in e.items() if k != "frames"} for e in trace if e["action"] == "oom"
            ]
            case["oom_entries"] = ooms[-2:]
        result["cases"][name] = case

    # 1. capacity: one request larger than the device
    def capacity() -> None:
        torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda")

    if capture is not None:
        with capture:
            provoke("capacity", capacity)
        result["capture_oom_written"] = str(capture.written) if capture.written else None
        result["capture_oom_error"] = capture.error
        result["capture_oom_causes"] = [e.cause for e in capture.events]
    else:
        provoke("capacity", capacity)
    torch.cuda.empty_cache()
    time.sleep(1.1)  # past gpumemviz's repeat window

    # 2. fragmentation under a memory-fraction cap: holes of 12 MiB, then a 24 MiB request
    frac = min(0.5, (2 << 30) / total)
    torch.cuda.set_per_process_memory_fraction(frac, 0)
    result["fraction"] = frac
    keep: list[Any] = []
    holes: list[Any] = []

    def fragmentation() -> None:
        try:
            while True:  # 8 MiB tensors: two per 20 MiB segment (+4 MiB tail)
                keep.append(torch.empty(8 << 20, dtype=torch.uint8, device="cuda"))
                holes.append(torch.empty(8 << 20, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass  # the cap is full
        holes.clear()  # every segment keeps one live block: nothing is releasable
        # 24 MiB: more than any 12 MiB hole and than what is left under the cap
        torch.empty(24 << 20, dtype=torch.uint8, device="cuda")

    provoke("fragmentation", fragmentation)
    keep.clear()
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(enabled=None)
    files = {"oom.json": _json(result, out / "oom.json")}
    for name in ("capacity", "fragmentation"):
        f = out / f"oom_{name}.pickle"
        if f.exists():
            files[f.name] = f.stat().st_size
    if (out / "oom_capture_oom.pickle").exists():
        files["oom_capture_oom.pickle"] = (out / "oom_capture_oom.pickle").stat().st_size
    return {
        "files": files,
        "observer_args": {k: c.get("observer_calls") for k, c in result["cases"].items()},
        "capture_oom_causes": result.get("capture_oom_causes"),
    }


def part_nvml(out: Path) -> dict[str, Any]:
    import pynvml
    import torch

    def read_all() -> list[dict[str, Any]]:
        devs = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            d: dict[str, Any] = {"index": i}
            for key, fn in (
                ("uuid", pynvml.nvmlDeviceGetUUID),
                ("name", pynvml.nvmlDeviceGetName),
                ("memory", lambda h: _struct(pynvml.nvmlDeviceGetMemoryInfo(h))),
                ("utilization", lambda h: _struct(pynvml.nvmlDeviceGetUtilizationRates(h))),
                ("mig_mode", pynvml.nvmlDeviceGetMigMode),
                (
                    "processes",
                    lambda h: [
                        {"pid": p.pid, "usedGpuMemory": p.usedGpuMemory}
                        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                    ],
                ),
            ):
                try:
                    v = fn(h)
                    d[key] = v.decode() if isinstance(v, bytes) else v
                except Exception as exc:
                    d[key] = f"error: {exc!r}"
            devs.append(d)
        return devs

    pynvml.nvmlInit()
    facts: dict[str, Any] = {"pid": os.getpid(), "driver": pynvml.nvmlSystemGetDriverVersion()}
    facts["before_cuda_init"] = read_all()
    x = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")  # 256 MiB, our own use
    torch.cuda.synchronize()
    facts["torch"] = _device_facts(torch)
    facts["torch_uuids"] = [
        str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())
    ]
    facts["torch_reserved"] = torch.cuda.memory_reserved(0)
    facts["mem_get_info"] = list(torch.cuda.mem_get_info(0))
    facts["after_cuda_init"] = read_all()
    del x
    ours = [
        p
        for d in facts["after_cuda_init"]
        if isinstance(d.get("processes"), list)
        for p in d["processes"]
        if p["pid"] == os.getpid()
    ]
    files = {"nvml.json": _json(facts, out / "nvml.json")}
    return {
        "files": files,
        "our_pid_listed": bool(ours),
        "torch_uuid": facts["torch_uuids"][:1],
        "nvml_uuids": [d.get("uuid") for d in facts["after_cuda_init"]],
    }


def part_empty_cache_thread(out: Path) -> dict[str, Any]:
    import torch

    torch.cuda.init()
    stop = threading.Event()
    calls: list[dict[str, Any]] = []

    def flusher() -> None:
        while not stop.is_set():
            before = torch.cuda.memory_reserved(0)
            t0 = time.perf_counter()
            try:
                torch.cuda.empty_cache()
                err = None
            except Exception as exc:
                err = repr(exc)
            calls.append(
                {"ms": (time.perf_counter() - t0) * 1e3, "before": before,
                 "after": torch.cuda.memory_reserved(0), "error": err}
            )  # fmt: skip
            stop.wait(0.05)

    t = threading.Thread(target=flusher, name="flusher")
    t0 = time.perf_counter()
    t.start()
    try:
        losses = _train(torch, steps=150)
    finally:
        stop.set()
        t.join(10)
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    _train(torch, steps=150)
    alone = time.perf_counter() - t1
    facts = {
        "calls": len(calls),
        "errors": [c["error"] for c in calls if c["error"]],
        "max_ms": max((c["ms"] for c in calls), default=None),
        "median_ms": sorted(c["ms"] for c in calls)[len(calls) // 2] if calls else None,
        "released_total": sum(max(0, c["before"] - c["after"]) for c in calls),
        "losses_finite": all(v == v for v in losses),
        "train_s_with_flusher": wall,
        "train_s_alone": alone,
        "flusher_alive_after_join": t.is_alive(),
    }
    return {
        "files": {"empty_cache_thread.json": _json(facts, out / "empty_cache_thread.json")},
        **facts,
    }


def part_gpumemviz_live(out: Path) -> dict[str, Any]:
    import torch

    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.torch_cuda import TorchCudaSource

    src = TorchCudaSource(0)
    waiting = src.sample()
    facts: dict[str, Any] = {
        "before_init_state": waiting.state,
        "initialised_by_us": torch.cuda.is_initialized(),
    }
    s = Sampler(src, interval=0.1, segment_interval=0.3)
    s.start()
    _train(torch, steps=100)
    time.sleep(0.5)
    s.stop()
    hist = s.history.samples()
    last_seg = s.history.latest_segments()
    facts.update(
        status={k: v for k, v in s.status().items() if k != "last_error"},
        last_error=s.last_error,
        n_samples=len(hist),
        states=sorted({x.state for x in hist}),
        errors=sorted({e for x in hist for e in x.errors})[:10],
        mean_cpu_ms=1e3 * sum(x.cpu_time for x in hist) / max(len(hist), 1),
        segment_blocks=last_seg.segments.n_blocks if last_seg else None,
        reserved_matches=(
            bool(last_seg)
            and int(last_seg.segments.segments.total_size.sum()) == last_seg.stats.reserved
        ),
        nvml=repr(hist[-1].nvml)[:600] if hist else None,
        device_info=repr(hist[-1].device_info) if hist else None,
    )
    released = src.empty_cache()
    facts["empty_cache_released"] = released
    return {"files": {"gpumemviz_live.json": _json(facts, out / "gpumemviz_live.json")}, **facts}


def _pools_of(snap: dict[str, Any]) -> dict[str, int]:
    """Reserved bytes per segment_pool_id (as "a,b")."""
    out: dict[str, int] = {}
    for seg in snap["segments"]:
        key = ",".join(str(x) for x in seg.get("segment_pool_id", (0, 0)))
        out[key] = out.get(key, 0) + seg["total_size"]
    return out


def part_mempool(out: Path) -> dict[str, Any]:
    """MemPools as RL frameworks use them, with history: the replay's inference and the
    model's pool rules (tests/test_gpu_pools.py) are checked against this."""
    import torch

    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    mib = 1 << 20
    sizes = (1000, 5 * mib, 30 * mib)
    eager = [torch.empty(3 * mib, dtype=torch.uint8, device="cuda") for _ in range(3)]
    weights_pool = torch.cuda.MemPool()
    kv_pool = torch.cuda.MemPool()
    facts: dict[str, Any] = {
        "weights_pool": list(weights_pool.id),
        "kv_pool": list(kv_pool.id),
        "use_count_created": weights_pool.use_count(),
    }
    with torch.cuda.use_mem_pool(weights_pool):
        facts["use_count_inside"] = weights_pool.use_count()
        weights = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
    with torch.cuda.use_mem_pool(kv_pool):
        kv = [torch.empty(64 * mib, dtype=torch.uint8, device="cuda") for _ in range(4)]
    addrs = [w.data_ptr() for w in weights]
    del weights  # offload: the blocks stay cached in the weights pool
    torch.cuda.empty_cache()
    facts["pools_after_offload"] = _pools_of(torch.cuda.memory._snapshot())
    with torch.cuda.use_mem_pool(weights_pool):  # reload: the cached blocks come back
        weights = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
    facts["reload_same_addresses"] = [w.data_ptr() for w in weights] == addrs
    facts["weights_pool_snapshot_segments"] = len(weights_pool.snapshot())
    del kv
    del kv_pool  # the MemPool deleted: its use_count drops to 0, empty_cache frees it
    torch.cuda.empty_cache()
    facts["pools_after_kv_deleted"] = _pools_of(torch.cuda.memory._snapshot())
    split_pool = torch.cuda.MemPool(no_split=True)
    with torch.cuda.use_mem_pool(split_pool):
        tiny = torch.empty(1000, dtype=torch.uint8, device="cuda")
    seg = next(
        s
        for s in torch.cuda.memory._snapshot()["segments"]
        if tuple(s["segment_pool_id"]) == tuple(split_pool.id)
    )
    facts["no_split_blocks"] = [b["size"] for b in seg["blocks"]]
    del tiny, eager
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    files = {"mempool.pickle": _dump(snap, out / "mempool.pickle")}
    files["mempool.json"] = _json(facts, out / "mempool.json")
    return {"files": files, **facts}


def part_cuda_graph(out: Path) -> dict[str, Any]:
    """CUDA-graph capture with history: warm-up, capture into a pool, replays, a second graph
    sharing the pool, graph 1 reset (graph 2 keeps the pool)."""
    import torch

    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    static_in = torch.randn(256, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch's docs do
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        out1 = model(static_in)
    for _ in range(5):
        static_in.copy_(torch.randn(256, 1024, device="cuda"))
        g1.replay()
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=g1.pool()):  # shares graph 1's pool
        out2 = model(out1)
    g2.replay()
    facts: dict[str, Any] = {
        "pool": list(g1.pool()),
        "pools_captured": _pools_of(torch.cuda.memory._snapshot()),
    }
    del out1
    g1.reset()
    torch.cuda.empty_cache()  # graph 2 still holds the pool: nothing of it comes back
    facts["pools_after_reset"] = _pools_of(torch.cuda.memory._snapshot())
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    del out2, g2
    files = {"cuda_graph.pickle": _dump(snap, out / "cuda_graph.pickle")}
    files["cuda_graph.json"] = _json(facts, out / "cuda_graph.json")
    return {"files": files, **facts}


def part_new_fields(out: Path) -> dict[str, Any]:
    import torch

    mem = torch.cuda.memory
    facts: dict[str, Any] = {"torch": torch.__version__, "errors": {}}

    def attempt(name: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # an API this torch lacks or refuses: recorded, not fatal
            facts["errors"][name] = repr(exc)[:300]
            return None

    record = mem._record_memory_history
    kwargs: dict[str, Any] = {"max_entries": MAX_ENTRIES, "stacks": "python"}
    if _accepts(record, "augment_with_fx_traces"):
        kwargs["augment_with_fx_traces"] = True
    facts["record_kwargs"] = dict(kwargs)
    record(**kwargs)
    set_meta = getattr(mem, "_set_memory_metadata", None)
    facts["has_set_memory_metadata"] = set_meta is not None
    model = torch.nn.Linear(1024, 1024).cuda()
    x = torch.randn(256, 1024, device="cuda")
    for step in range(6):
        if set_meta is not None:
            attempt("set_memory_metadata", lambda step=step: set_meta(f"forward step {step}"))
        y = model(x).relu()
        if set_meta is not None:
            attempt("set_memory_metadata", lambda: set_meta(""))
        y.sum().backward()
    kept = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    for name in ("_annotate_tensor", "_annotate_memory"):
        fn = getattr(mem, name, None)
        facts[f"has{name}"] = fn is not None
        if fn is not None:
            attempt(name, lambda fn=fn: fn(kept, "kept buffer"))
    compiled = attempt("compile", lambda: torch.compile(lambda t: (t * 2).sin() + 1))
    if compiled is not None:
        attempt("compiled_call", lambda: compiled(torch.randn(1 << 16, device="cuda")))
    traceback_of = getattr(mem, "_allocation_traceback", None)
    facts["has_allocation_traceback"] = traceback_of is not None
    if traceback_of is not None:
        got = attempt("allocation_traceback", lambda: traceback_of(kept.data_ptr()))
        facts["allocation_traceback_type"] = type(got).__name__
    torch.cuda.synchronize()
    snap = mem._snapshot()
    record(enabled=None)
    entries = [e for t in snap.get("device_traces", []) for e in t]
    facts["trace_keys"] = sorted({k for e in entries for k in e})
    facts["actions"] = sorted({e["action"] for e in entries})
    facts["frame_keys"] = sorted({k for e in entries for f in e.get("frames", []) for k in f})
    facts["allocator_settings"] = snap.get("allocator_settings")
    files = {"new_fields.pickle": _dump(snap, out / "new_fields.pickle")}
    files["new_fields.json"] = _json(facts, out / "new_fields.json")
    return {"files": files, **{k: v for k, v in facts.items() if k != "errors"}}


def run_part(name: str, out: Path) -> dict[str, Any]:
    if name == "history_plain":
        return part_history(out, "plain")
    if name == "history_expandable":
        return part_history(out, "expandable")
    return globals()[f"part_{name}"](out)


# ------------------------------------------------------------------------------------------------
# parent
# ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", default="", help="comma-separated parts (default: all)")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    if args.part:  # child: run one part, print its summary line
        try:
            summary = {"ok": True, **run_part(args.part, args.out)}
        except BaseException as exc:
            summary = {"ok": False, "error": repr(exc), "traceback": traceback.format_exc()[-3000:]}
        print("SUMMARY " + json.dumps(summary, default=repr), flush=True)
        return 0 if summary["ok"] else 1

    import torch  # importing does not initialise CUDA; each part does that in its own process

    if not torch.cuda.is_available():
        print(f"CUDA is not available (torch {torch.__version__}): nothing to record")
        return 2
    parts = [p for p in args.only.split(",") if p] or list(PARTS)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown parts {unknown}; known: {sorted(PARTS)}")
    manifest: dict[str, Any] = {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "note": "real data recorded on a GPU by tests/gpu/record_fixtures.py; not synthetic",
        "parts": {},
    }
    t_all = time.monotonic()
    for name in parts:
        spec = PARTS[name]
        env = {k: v for k, v in os.environ.items() if not k.endswith("ALLOC_CONF")}
        env.update(spec["env"], PYTHONUNBUFFERED="1")  # each part sets its own allocator conf
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        t0 = time.monotonic()
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--part",
            name,
            "--out",
            str(args.out),
        ]
        try:
            proc = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=spec["timeout"]
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SUMMARY ")]
            summary = json.loads(lines[-1][8:]) if lines else {
                "ok": False, "error": f"no summary (rc {proc.returncode})",
                "stderr": proc.stderr[-2000:],
            }  # fmt: skip
            if proc.returncode and summary.get("ok"):
                summary["ok"] = False
            if not summary.get("ok"):
                summary.setdefault("stderr", proc.stderr[-2000:])
        except subprocess.TimeoutExpired as exc:
            summary = {"ok": False, "error": f"timed out after {spec['timeout']} s",
                       "stderr": (exc.stderr or b"")[-2000:].decode("utf8", "replace")
                       if isinstance(exc.stderr, bytes) else str(exc.stderr)[-2000:]}  # fmt: skip
        summary["seconds"] = round(time.monotonic() - t0, 2)
        manifest["parts"][name] = summary
        print(
            f"{name:<20} {'ok' if summary.get('ok') else 'FAILED':<7} {summary['seconds']:>6.1f} s"
        )
    manifest["total_seconds"] = round(time.monotonic() - t_all, 1)
    (args.out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, default=repr))
    print()
    for name, summary in manifest["parts"].items():
        brief = {k: v for k, v in summary.items() if k not in {"files", "traceback", "stderr"}}
        print(f"== {name}: {json.dumps(brief, default=repr)[:700]}")
        if not summary.get("ok"):
            print("   " + str(summary.get("traceback") or summary.get("stderr", ""))[-800:])
        for f, size in (summary.get("files") or {}).items():
            print(f"   {f:<34} {size:>10,} bytes")
    n_ok = sum(1 for s in manifest["parts"].values() if s.get("ok"))
    print(f"\n{n_ok}/{len(parts)} parts ok in {manifest['total_seconds']} s -> {args.out}")
    return 0 if n_ok == len(parts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
