"""Long traces (10^4 to 3x10^6 entries): load, replay, the commands and the replay panel.

One script, five parts (`--part`, default `all`: each in turn):

- `overview`: per trace, each in a fresh subprocess so that one measurement's memory never counts
  in the next one's peak: the file's size; plain `pickle.loads` (time, peak memory); one model
  pass (the bare `CachingAllocator` driven through the alloc and free events); `load_snapshot`;
  `replay()`; `gpumemviz inspect`, `whatif --conf expandable_segments:True` and `report` (the
  CLI's `main()` in-process); `%gpumemviz --replay`'s source (`PlaybackSource` from the file,
  plus its first sample), its seek (seek + sample at random entries, median and max) and, while
  it plays with a sampler thread reading it, the longest a 2 ms sleep on the main thread (the
  kernel's) overshoots; and torch's own `torch.cuda._memory_viz.trace_plot` and `segsum` on the
  same dict. Then each target of issue 20 with its figure, met or not. Two shapes per size:
  `torch` (the allocator model's random workload written as torch writes it, every entry a fresh
  list of 20-100 frames over a few hundred shared frame dicts; `_traces.torch_shaped`) and
  `real` (a real file's trace tiled to the size, each copy's addresses and streams shifted;
  `_traces.tiled_real`). Peak memory is the subprocess's resident-set high-water mark above its
  level just before the measured call (`/proc/self/status`: VmHWM - VmRSS; ``--tracemalloc``
  uses tracemalloc's peak instead, after gc.collect(), several times slower on big traces).
  Times are wall clock, once.
- `load`: `load_snapshot` next to a plain `pickle.loads` of the same bytes (issue 20, point 1).
  Kinds: "stacks" (each entry's list copies one of 200 call stacks, as a training loop repeats
  its call sites), "mixed" (each entry's frames drawn one by one, the worst case for the
  loader's walk), "none" (no frames), and the overview's "torch" and "real". Baselines:
  `pickle.loads` with the GC paused (the floor: the unpickle alone) and plain `pickle.loads`
  (the GC on, as a user calls it). CPU seconds, the best of reps; memory is tracemalloc's peak
  after a full collection (as tests/io/test_io_bounds.py measures). Targets: time within 3x of
  `pickle.loads`, peak memory within 1.5x. The real files are in snapshot_io.py's memory table.
- `replay`: `replay()` and the commands on the model's training loop recorded with a ring of N
  entries (the oldest entries fall off, so the trace starts mid-story as a real one does;
  ``--frames`` gives every entry a torch-shaped stack), against one model pass and
  `pickle.loads`, each in a fresh interpreter (issue 20, points 2-3). Targets: `replay()` at
  least half the model pass's events/s; `inspect` within 1.3x (load + (1+n) passes), `whatif`
  within 1.3x (load + 2 passes), `report` within 1.5x (load + (1+n) passes), peak memory of
  each command within 2x of `pickle.loads`'s.
- `drive`: one replay pass (`drive`) against one bare model pass: the driver's per-entry
  overhead, recorded (scored against the recorded addresses) and what-if
  (`expandable_segments:True`, invented addresses). The recording is reconstructed once,
  outside the timings. Shapes: `train` (the `replay` part's training loop), `torch` and `real`.
  CPU seconds, best of ``--repeat``, the cyclic GC paused as `replay` pauses it; `init` is the
  drive's set-up (the model loaded from the start state), the rest is per entry. Each drive is
  part of "whatif within 1.3x (load + 2 model passes)".
- `phases`: where `gpumemviz report` (or `whatif`, ``--cmd``) spends its time and memory, step
  by step: one trace (``--shapes`` first shape, ``--sizes`` first size), the command run
  through the CLI's `main()` in a fresh subprocess with the steps of `STEPS` wrapped: per step
  its seconds, the resident set when it starts, its peak (VmHWM, reset at each step's start)
  and what it leaves (resident set after minus before), all in MiB, and its peak increment as a
  ratio to `pickle.loads`'s peak (measured in its own subprocess). Nested steps are indented; a
  step the code no longer has is left out.

Default sizes per part: overview and load 10^4, 10^5, 10^6 entries (about 10 minutes each on
two cores), replay 10^5 and 10^6, drive 10^5, phases 10^5; ``--sizes 10000,3000000`` picks
others (3x10^6 needs about 8 GB free and 25 minutes in the overview); ``--quick`` runs 10^4
entries only, once. ``--markdown`` prints the output as a section of
benchmarks/README.md (`make bench`).

Run: .venv/bin/python benchmarks/big_traces.py [--part overview|load|replay|drive|phases|all]
[--quick] [--sizes N,...] [--shapes S,...]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import REPO, SHIPPED_DIR, best, read_plain, run_main
from _traces import tiled_real, torch_shaped
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay import prepare
from gpumemviz.allocator.replay.driver import Driver
from gpumemviz.allocator.workloads import run, training_loop
from gpumemviz.io import load_snapshot, loads_restricted

REAL = (
    SHIPPED_DIR
    / "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
)
SEEKS = 40
OPS = ("pickle", "load", "model", "replay", "inspect", "whatif", "report", "panel", "trace_plot",
       "segsum")  # fmt: skip
GIB = 1 << 30
PARTS = ("overview", "load", "replay", "drive", "phases")


# --- overview, worker side: one measurement in this process -------------------------------------
def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> None:
    """Make VmHWM start again from the current RSS (Linux: write 5 to clear_refs)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _measure(fn: Any, use_tracemalloc: bool) -> tuple[float, int, Any]:
    """(seconds, peak bytes above the start, result) of ``fn()``."""
    gc.collect()
    if use_tracemalloc:
        tracemalloc.start()
    else:
        _reset_hwm()
    base = _status("VmRSS")
    loaded = set(sys.modules)
    t0 = time.perf_counter()
    result = fn()
    secs = time.perf_counter() - t0
    late = _late_imports(loaded)
    if late:
        print(f"big_traces: the measured call imported {', '.join(late)}", file=sys.stderr)
    if use_tracemalloc:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    else:
        peak = _status("VmHWM") - base
    return secs, peak, result


def _model_pass(d: dict[str, Any]) -> int:
    """The bare model through the trace's alloc and free events (device 0); events driven."""
    model = CachingAllocator(1 << 50, record_trace=False)
    at: dict[int, int] = {}
    n = 0
    for e in d["device_traces"][0]:
        a = e["action"]
        if a == "alloc":
            at[e["addr"]] = model.malloc(e["size"], e.get("stream", 0))
            n += 1
        elif a == "free_requested":
            p = at.pop(e["addr"], None)
            if p is not None:
                model.free(p)
                n += 1
    return n


def _play_stall(src: Any, seconds: float = 3.0) -> float:
    """Playing: a sampler thread reads the source (segments every sample) while this thread
    sleeps 2 ms at a time, as a kernel's own work would run; the longest overshoot, seconds."""
    from gpumemviz.live.sampler import Sampler

    src.play(speed=src.n / 30)
    sampler = Sampler(src, interval=0.05, segment_interval=0.05)
    sampler.start()
    worst, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        time.sleep(0.002)
        worst = max(worst, time.perf_counter() - t0 - 0.002)
    sampler.close()
    return worst


def _cli(argv: list[str]) -> str:
    from gpumemviz.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    if rc != 0:
        raise RuntimeError(f"gpumemviz {argv[0]} exited {rc}")
    return out.getvalue()


_PRELOAD = (
    "gpumemviz.allocator.replay.driver",
    "gpumemviz.analysis.advice_check",
    "gpumemviz.analysis.findings",
    "gpumemviz.analysis.ranks",
    "gpumemviz.cli.cmd_inspect",
    "gpumemviz.cli.cmd_report",
    "gpumemviz.cli.cmd_whatif",
    "gpumemviz.io",
    "gpumemviz.live.sources.playback",
    "gpumemviz.reporting.html_report",
)
"""What the measured calls import (lazily, inside the commands), imported before any clock
starts: an import is a fixed cost per process, not work on the trace (and without cached
bytecode, as under PYTHONDONTWRITEBYTECODE, it compiles every module from source)."""


def _preload() -> None:
    """Import what the measured calls import, so no row times Python's imports."""
    import importlib

    for name in _PRELOAD:
        importlib.import_module(name)


def _late_imports(before: set[str]) -> list[str]:
    """The package's modules imported since `before` (`sys.modules`' keys): a measured call
    that imports one timed it, and `_PRELOAD` misses it."""
    return sorted(m for m in set(sys.modules) - before if m.startswith("gpumemviz"))


def overview_worker(op: str, path: str, use_tracemalloc: bool) -> dict[str, Any]:
    if op not in ("pickle", "trace_plot", "segsum"):
        _preload()
    data = Path(path).read_bytes()
    out: dict[str, Any] = {}
    if op == "pickle":
        secs, peak, _ = _measure(lambda: read_plain(data), use_tracemalloc)
        return {"secs": secs, "peak": peak}
    if op == "load":
        secs, peak, _ = _measure(lambda: load_snapshot(data), use_tracemalloc)
        return {"secs": secs, "peak": peak}
    if op in ("inspect", "whatif", "report"):
        data = b""
        tmp = tempfile.mkdtemp()
        argv = {"inspect": ["inspect", path, "--json"],
                "whatif": ["whatif", path, "--conf", "expandable_segments:True"],
                "report": ["report", path, "-o", str(Path(tmp) / "r.html")]}[op]  # fmt: skip
        secs, peak, text = _measure(lambda: _cli(argv), use_tracemalloc)
        out = {"secs": secs, "peak": peak}
        if op == "inspect":  # n: the settings the replay checked (one pass each)
            out["n"] = checked_settings(json.loads(text))
        if op == "report":
            out["html"] = (Path(tmp) / "r.html").stat().st_size
        return out
    if op == "panel":
        data = b""
        from gpumemviz.live.sources.playback import PlaybackSource

        def open_() -> Any:
            src = PlaybackSource(path)
            src.seek(src.n - 1)
            src.sample()
            return src

        secs, peak, src = _measure(open_, use_tracemalloc)
        rng = random.Random(0)
        seeks = []
        for _ in range(SEEKS):
            i = rng.randrange(-1, src.n)
            t0 = time.perf_counter()
            src.seek(i)
            src.sample()
            seeks.append(time.perf_counter() - t0)
        return {"secs": secs, "peak": peak, "seek_med": statistics.median(seeks),
                "seek_max": max(seeks), "stall": _play_stall(src)}  # fmt: skip
    d = read_plain(data)
    data = b""
    if op == "model":
        secs, _, n = _measure(lambda: _model_pass(d), False)
        return {"secs": secs, "events": n}
    if op == "replay":
        from gpumemviz.allocator.replay import replay

        secs, peak, r = _measure(lambda: replay(d), use_tracemalloc)
        return {"secs": secs, "peak": peak, "matched": [r.devices[0].allocs_matched,
                                                         r.devices[0].allocs]}  # fmt: skip
    from torch.cuda import _memory_viz as mv

    fn = mv.trace_plot if op == "trace_plot" else mv.segsum
    secs, peak, _ = _measure(lambda: fn(d), use_tracemalloc)
    return {"secs": secs, "peak": peak}


def run_op(op: str, path: Path, use_tracemalloc: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", op, str(path)]
    if use_tracemalloc:
        cmd.append("--tracemalloc")
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": tail[:60]}
    for line in p.stderr.splitlines():
        if line.startswith("big_traces:"):  # a measured call that imported a module
            print(f"{line} ({op}, {path.name})", file=sys.stderr)
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def make_file(shape: str, n: int, folder: Path) -> Path:
    d = torch_shaped(n) if shape == "torch" else tiled_real(loads_restricted(REAL.read_bytes()), n)
    path = folder / f"{shape}_{n}.pickle"
    path.write_bytes(pickle.dumps(d))
    return path


def _fmt_s(r: dict[str, Any]) -> str:
    return r["error"] if "error" in r else f"{r['secs']:.2f}"


def part_overview(args: argparse.Namespace) -> None:
    sizes = _sizes(args, [10**4], [10**4, 10**5, 10**6])
    print("overview: load, replay, the commands and the replay panel against plain pickle.loads")
    print("times in s; mem: peak MiB (x: ratio to pickle.loads); model: one model pass\n")
    head = (f"{'shape':<6}{'entries':>9}{'MiB':>7} {'pickle s/MiB':>13} {'model s':>8} "
            f"{'load s(x)':>11} {'mem(x)':>7} {'replay s':>9} {'ev/s(x model)':>15} "
            f"{'inspect s(x) n':>15} {'whatif s(x)':>12} {'report s(x)':>12} {'KiB':>5} "
            f"{'cmd mem x':>9} {'open s(x)':>10} {'seek ms med/max':>16} "
            f"{'play stall ms':>13} {'trace_plot s':>12} {'segsum s':>9}")  # fmt: skip
    print(head)
    print("-" * len(head))
    verdicts: list[tuple[str, str, str, bool]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for shape in (args.shapes or "torch,real").split(","):
                path = make_file(shape, n, Path(tmp))
                mib = path.stat().st_size / (1 << 20)
                r = {op: run_op(op, path, args.tracemalloc) for op in OPS}
                path.unlink()
                print(_row(shape, n, mib, r))
                sys.stdout.flush()
                verdicts += _targets(f"{shape} {n}", r)
    print("\ntargets (issue 20)")
    for row, what, figure, met in verdicts:
        print(f"  {row:<14} {what:<46} {figure:<24} {'met' if met else 'NOT MET'}")


def _x(a: dict[str, Any], b: dict[str, Any], key: str = "secs") -> float:
    return a[key] / b[key] if key in a and b.get(key) else float("nan")


def _row(shape: str, n: int, mib: float, r: dict[str, dict[str, Any]]) -> str:
    p, m, ld, rp = r["pickle"], r["model"], r["load"], r["replay"]
    base = (ld.get("secs", 0), m.get("secs", 0))
    nn = r["inspect"].get("n", 0)

    def cmd(op: str, passes: float) -> str:
        got = r[op]
        if "error" in got:
            return got["error"][:12]
        return f"{got['secs']:.1f}({got['secs'] / (base[0] + passes * base[1]):.2f})"

    peaks = [r[op].get("peak", 0) for op in ("inspect", "whatif", "report")]
    ev = m.get("events", 0)
    rate = ev / rp["secs"] if "secs" in rp else float("nan")
    mrate = ev / m["secs"] if m.get("secs") else float("nan")
    pn = r["panel"]
    return (
        f"{shape:<6}{n:>9}{mib:>7.1f} {_fmt_s(p):>6}/{p.get('peak', 0) / (1 << 20):<6.0f} "
        f"{_fmt_s(m):>8} {_fmt_s(ld):>5}({_x(ld, p):.1f}) {_x(ld, p, 'peak'):>7.2f} "
        f"{_fmt_s(rp):>9} {rate:>8.0f}({rate / mrate:.2f}) "
        f"{cmd('inspect', 1 + nn):>13} {nn:>1} {cmd('whatif', 2):>12} {cmd('report', 1 + nn):>12} "
        f"{r['report'].get('html', 0) / 1024:>5.0f} {max(peaks) / max(p.get('peak', 1), 1):>9.2f} "
        f"{cmd('panel', 1):>10} "
        f"{pn.get('seek_med', 0) * 1e3:>7.1f}/{pn.get('seek_max', 0) * 1e3:<8.1f} "
        f"{pn.get('stall', 0) * 1e3:>13.1f} "
        f"{_fmt_s(r['trace_plot']):>12} {_fmt_s(r['segsum']):>9}"
    )


def _targets(row: str, r: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, bool]]:
    p, m, ld, rp = r["pickle"], r["model"], r["load"], r["replay"]
    if any("error" in x for x in (p, m, ld)):
        return [(row, "measurements failed", "", False)]
    nn = r["inspect"].get("n", 0)
    out = []

    def add(what: str, value: float, limit: float, unit: str = "x") -> None:
        out.append((row, what, f"{value:.2f}{unit} (<= {limit}{unit})", value <= limit))

    add("load_snapshot time / pickle.loads", _x(ld, p), 3)
    add("load_snapshot memory / pickle.loads", _x(ld, p, "peak"), 1.5)
    if "secs" in rp:
        rate, mrate = m["events"] / rp["secs"], m["events"] / m["secs"]
        out.append((row, "replay events/s / model pass's", f"{rate / mrate:.2f} (>= 0.5)",
                    rate / mrate >= 0.5))  # fmt: skip
    for op, passes, limit in (("inspect", 1 + nn, 1.3), ("whatif", 2, 1.3),
                              ("report", 1 + nn, 1.5), ("panel", 1, 1.3)):  # fmt: skip
        if "secs" in r[op]:
            add(f"{op} / (load + {passes} passes)", r[op]["secs"] / (ld["secs"] +
                passes * m["secs"]), limit)  # fmt: skip
        if op != "panel" and "peak" in r[op]:
            add(f"{op} memory / pickle.loads", r[op]["peak"] / p["peak"], 2)
    if "seek_max" in r["panel"]:
        add("panel seek, worst of random entries", r["panel"]["seek_max"] * 1e3, 100, " ms")
        add("playing: longest stall of the kernel's thread", r["panel"]["stall"] * 1e3, 100, " ms")
    return out


# --- load: load_snapshot against pickle.loads -------------------------------------------------
def torch_trace(n: int, kind: str, seed: int = 0) -> dict[str, Any]:
    """A torch-shaped snapshot whose trace has `n` entries (alloc, free_requested,
    free_completed), its frames of the given `kind` ("stacks", "mixed" or "none")."""
    rng = random.Random(seed)
    pool = [
        {"name": f"fn_{i}", "filename": f"/src/pkg/mod_{i % 40}.py", "line": 10 + i}
        for i in range(300)
    ]
    stacks = [rng.choices(pool, k=rng.randint(20, 100)) for _ in range(200)]

    def frames() -> list[dict[str, Any]]:
        if kind == "stacks":
            return list(rng.choice(stacks))
        if kind == "mixed":
            return rng.choices(pool, k=rng.randint(20, 100))
        return []

    entries: list[dict[str, Any]] = []
    live: list[tuple[int, int]] = []
    addr, t = 1 << 32, 1_700_000_000_000_000
    while len(entries) < n:
        if live and (rng.random() < 0.5 or len(live) > 1000):
            a, size = live.pop(rng.randrange(len(live)))
            actions = ["free_requested", "free_completed"]
        else:
            a, size = addr, 512 * rng.randint(1, 4096)
            live.append((a, size))
            addr += size
            actions = ["alloc"]
        for action in actions:
            t += 3
            entries.append(
                {
                    "action": action,
                    "addr": a,
                    "size": size,
                    "stream": 0,
                    "time_us": t,
                    "compile_context": "N/A",
                    "user_metadata": "",
                    "frames": frames(),
                }
            )
    total = addr - (1 << 32)
    segment = {
        "device": 0,
        "address": 1 << 32,
        "total_size": total,
        "allocated_size": 0,
        "active_size": 0,
        "requested_size": 0,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [{"address": 1 << 32, "size": total, "requested_size": 0, "state": "inactive"}],
    }
    return {
        "segments": [segment],
        "device_traces": [entries[:n]],
        "allocator_settings": {},
        "external_annotations": [],
    }


def trace_of(n: int, kind: str) -> dict[str, Any]:
    """`kind`: one of `torch_trace`'s, or issue 20's shapes: "torch" (benchmarks/_traces.py
    `torch_shaped`) and "real" (REAL's trace tiled to `n` entries, `tiled_real`)."""
    if kind == "torch":
        return torch_shaped(n)
    if kind == "real":
        return tiled_real(loads_restricted(REAL.read_bytes()), n)
    return torch_trace(n, kind)


def loads_paused(data: bytes) -> Any:  # Any: whatever the pickle holds
    gc.disable()
    try:
        return pickle.loads(data)
    finally:
        gc.enable()


def _tm_peak(fn: Callable[[], Any]) -> int:
    """tracemalloc's peak over one call, after a full collection."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def load_row(name: str, data: bytes, reps: int) -> None:
    t_floor = best(lambda: loads_paused(data), reps)
    t_plain = best(lambda: pickle.loads(data), reps)
    t_load = best(lambda: load_snapshot(data), reps)
    m_loads = _tm_peak(lambda: pickle.loads(data))
    m_load = _tm_peak(lambda: load_snapshot(data))
    print(
        f"{name:<22} {len(data) / 1e6:>7.1f} {t_floor:>8.2f} {t_plain:>8.2f} {t_load:>8.2f} "
        f"{t_load / t_floor:>7.2f}x {t_load / t_plain:>7.2f}x {m_loads / 1e6:>8.1f} "
        f"{m_load / 1e6:>8.1f} {m_load / m_loads:>6.2f}x",
        flush=True,
    )


def part_load(args: argparse.Namespace) -> None:
    sizes = _sizes(args, [10**4], [10**4, 10**5, 10**6])
    load_snapshot(b"\x80\x04]\x94.")  # imports and one-time caches first
    print("load: load_snapshot against pickle.loads, by trace kind")
    print(
        f"{'trace':<22} {'MB':>7} {'floor s':>8} {'loads s':>8} {'load s':>8} {'/floor':>8} "
        f"{'/loads':>8} {'loads MB':>8} {'load MB':>8} {'/loads':>7}"
    )
    for n in sizes:
        for kind in (args.shapes or "stacks,mixed,none,torch,real").split(","):
            data = pickle.dumps(trace_of(n, kind), protocol=4)
            reps = 1 if args.quick or n >= 1_000_000 else 3
            load_row(f"{n:,} {kind}", data, reps)
            del data
    print(
        "floor: pickle.loads with the GC paused; loads: plain pickle.loads; load: load_snapshot "
        "(scan + unpickle + walk + columns + validate). CPU seconds, best of reps. MB: "
        "tracemalloc's peak. Targets: load/loads time <= 3x, memory <= 1.5x."
    )


# --- replay: replay() and the commands on training-loop traces --------------------------------
def make_trace(entries: int, frames: bool, seed: int = 0) -> dict[str, Any]:
    """A training run's snapshot whose trace ring holds `entries` entries."""
    iterations = max(2, entries // 1200 + 2)  # about 1,700 entries per iteration (GPT-2 medium)
    a = CachingAllocator(64 * GIB, "", trace_max_entries=entries)
    run(training_loop(iterations=iterations, capacity=64 * GIB), a)
    snap = a.snapshot()
    trace = snap["device_traces"][0]
    if frames:
        rng = random.Random(seed)
        pool = [{"filename": f"/src/m{k % 40}.py", "line": k, "name": f"f{k}"} for k in range(600)]
        for e in trace:
            e["frames"] = [pool[rng.randrange(600)] for _ in range(rng.randrange(20, 101))]
    return snap


def model_pass(snap: dict[str, Any]) -> tuple[float, int]:
    """Seconds of one bare model pass (`_model_pass`), and the trace's entries."""
    t = time.perf_counter()
    _model_pass(snap)
    return time.perf_counter() - t, len(snap["device_traces"][0])


_CHILD = r"""
import json, pickle, resource, sys, time
sys.path.insert(0, "src")
sys.path.insert(0, "benchmarks")
what, path = sys.argv[1], sys.argv[2]
from big_traces import _preload
_preload()  # no row times Python's imports
data = open(path, "rb").read()
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
rss0 = hwm()
t = time.perf_counter()
if what == "pickle":
    pickle.loads(data)
elif what == "load":
    from gpumemviz.io import load_snapshot
    load_snapshot(data)
elif what == "pass":
    from big_traces import model_pass
    snap = pickle.loads(data)
    t = time.perf_counter() - model_pass(snap)[0]
elif what == "replay":
    from gpumemviz.io import load_snapshot
    from gpumemviz.allocator.replay import replay
    s = load_snapshot(data)
    t = time.perf_counter()
    replay(s)
else:
    from gpumemviz.cli import main
    import contextlib, io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(what.split() + [path])
dt = time.perf_counter() - t
peak = hwm() - rss0
n = 0
if what.startswith("inspect --json"):  # advice checks by replay: one pass per settings string
    got = json.loads(buf.getvalue())
    n = len({a["setting"] for a in got["advice"] + got["rejected"] if a.get("checked")})
print(json.dumps({"s": dt, "rss": peak * 1024, "n": n}))
"""


def checked_settings(findings: dict[str, Any]) -> int:
    """The settings `inspect --json` checked by replaying the trace (`Findings.to_dict`: its
    ``advice`` and ``rejected`` items with ``checked``): one replay pass each."""
    items = list(findings.get("advice") or []) + list(findings.get("rejected") or [])
    return len({a["setting"] for a in items if isinstance(a, dict) and a.get("checked")})


def child(what: str, path: str) -> tuple[float, int, int]:
    """Seconds and peak memory growth of `what` in a fresh interpreter (file bytes already
    read there: the growth is what the step itself needs)."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, what, path],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": "src"},
    )  # fmt: skip
    if out.returncode:
        raise SystemExit(f"{what}: {out.stderr.strip().splitlines()[-1]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got["s"], got["rss"], got.get("n", 0)


def part_replay(args: argparse.Namespace) -> None:
    commands = "inspect --json,whatif --conf expandable_segments:True,report -o -"
    print(f"replay: replay() and the commands on training-loop traces, frames={args.frames}")
    for n in _sizes(args, [10**4], [10**5, 10**6]):
        snap = make_trace(n, args.frames)
        events = len(snap["device_traces"][0])
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "trace.pickle")
            Path(path).write_bytes(pickle.dumps(snap, protocol=4))
            del snap
            size = Path(path).stat().st_size
            p_s, p_rss, _ = child("pickle", path)
            l_s, _, _ = child("load", path)
            pass_s, _, _ = child("pass", path)
            print(f"\n{events} entries ({size / 2**20:.0f} MiB), frames={args.frames}")
            print(f"  pickle.loads {p_s:.2f} s, peak {p_rss / 2**20:.0f} MiB; "
                  f"load_snapshot {l_s:.2f} s; model pass {pass_s:.2f} s "
                  f"({events / pass_s:,.0f} events/s)")  # fmt: skip
            r_s, r_rss, _ = child("replay", path)
            ratio = (events / r_s) / (events / pass_s)
            print(f"  replay() {r_s:.2f} s = {events / r_s:,.0f} events/s = {ratio:.2f}x the "
                  f"model pass's (target >= 0.50); peak {r_rss / 2**20:.0f} MiB")  # fmt: skip
            n_checked = 0
            for cmd in commands.split(","):
                c_s, c_rss, got_n = child(cmd, path)
                n_checked = max(n_checked, got_n)
                passes = 2 if cmd.startswith("whatif") else 1 + n_checked
                target = 1.5 if cmd.startswith("report") else 1.3
                floor = l_s + passes * pass_s
                print(f"  {cmd:<40} {c_s:6.2f} s = {c_s / floor:5.2f}x (load + {passes} passes"
                      f", n={n_checked}; target {target}x), peak {c_rss / max(p_rss, 1):.2f}x "
                      f"pickle.loads's (target 2x)")  # fmt: skip


# --- drive: one drive against one model pass -------------------------------------------------
def _cpu(fn: Callable[[], Any]) -> float:
    gc.collect()
    gc.disable()
    try:
        t = time.process_time()
        fn()
        return time.process_time() - t
    finally:
        gc.enable()


def drive_row(shape: str, snap: dict[str, Any], repeat: int) -> str:
    p = prepare(snap)
    dev = next(iter(p.timelines))
    tl, cap = p.timelines[dev], p.inferred[dev]
    recorded = AllocatorConfig.from_settings(snap.get("allocator_settings"))
    what_if = AllocatorConfig.parse("expandable_segments:True")
    explicit = set(p.recorded[dev].explicit_bursts)

    def driver(wif: bool) -> Driver:
        return Driver(tl, what_if if wif else recorded, cap, what_if=wif, resync=False,
                      explicit=explicit if wif else (), rename=None, device_total=cap,
                      max_mismatches=20)  # fmt: skip

    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, fn in (
            ("model", lambda: _model_pass(snap)),
            ("rec", lambda: driver(False).run()),
            ("wif", lambda: driver(True).run()),
            ("rec_init", lambda: driver(False)),
            ("wif_init", lambda: driver(True)),
        ):
            best[name] = min(best.get(name, float("inf")), _cpu(fn))
    m = best["model"]
    return (
        f"{shape:<6} {len(tl.steps):>8} {m:>8.3f} "
        f"{best['rec']:>8.3f} {best['rec'] / m:>6.2f}x {best['rec_init']:>7.3f} "
        f"{best['wif']:>8.3f} {best['wif'] / m:>6.2f}x {best['wif_init']:>7.3f}"
    )


def part_drive(args: argparse.Namespace) -> None:
    repeat = 1 if args.quick else args.repeat
    real = loads_restricted(REAL.read_bytes())
    print("drive: one replay pass (drive) against one bare model pass")
    print("CPU s, best of", repeat, "; x: ratio to the model pass; init: the drive's set-up")
    print(f"{'shape':<6} {'entries':>8} {'model':>8} {'rec':>8} {'x':>7} {'init':>7} "
          f"{'whatif':>8} {'x':>7} {'init':>7}")  # fmt: skip
    for n in _sizes(args, [10**4], [10**5]):
        for shape in (args.shapes or "train,torch,real").split(","):
            if shape == "train":
                snap = make_trace(n, False)
            else:
                snap = torch_shaped(n) if shape == "torch" else tiled_real(real, n)
            print(drive_row(shape, snap, repeat), flush=True)


# --- phases: report and whatif step by step --------------------------------------------------
#: (module, attribute) wrapped, in the order they are looked up; "Class.method" for methods.
STEPS = (
    ("gpumemviz.io", "load_snapshot"),
    ("gpumemviz.reporting.html_report", "as_snapshot"),
    ("gpumemviz.reporting.html_report", "_data"),
    ("gpumemviz.reporting.html_report", "build_rows"),
    ("gpumemviz.reporting.html_report", "fragmentation"),
    ("gpumemviz.reporting.html_report", "check_advice"),
    ("gpumemviz.analysis.advice_check", "prepare"),
    ("gpumemviz.analysis.advice_check", "_replay"),
    ("gpumemviz.analysis.holders", "live_holders"),
    ("gpumemviz.analysis.holders", "trace_holders"),
    ("gpumemviz.reporting.html_report", "_timelines"),
    ("gpumemviz.snapshot", "Snapshot.to_torch"),
    ("gpumemviz.allocator.replay.recording", "Recording.from_snapshot"),
    ("gpumemviz.allocator.replay.recording", "reconstruct_lives"),
    ("gpumemviz.allocator.replay.recording", "reconstruct_layout"),
    ("gpumemviz.allocator.replay.recording", "steps_from_columns"),
    ("gpumemviz.allocator.replay.recording", "plan_pools"),
    ("gpumemviz.allocator.replay.driver", "drive"),
    ("gpumemviz.reporting.html_report", "_map"),
    ("gpumemviz.reporting.html_report", "page_parts"),
    ("gpumemviz.reporting.html_report", "atomic_write"),
    ("gpumemviz.allocator.replay", "Prepared._prepare"),
    ("gpumemviz.allocator.replay", "Prepared.replay"),
)


def _wrap(rows: list[Any], depth: list[int], peaks: list[int], fn: Any, label: str) -> Any:
    """`fn` timed, its peak taken from VmHWM reset at its start (the caller's peak so far kept
    in `peaks`, the stack of open steps)."""

    @functools.wraps(fn)
    def step(*a: Any, **k: Any) -> Any:
        before, hwm = _status("VmRSS"), _status("VmHWM")
        peaks[-1] = max(peaks[-1], hwm)
        _reset_hwm()
        peaks.append(0)
        i = len(rows)
        rows.append(None)
        depth[0] += 1
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            secs = time.perf_counter() - t
            depth[0] -= 1
            peak = max(peaks.pop(), _status("VmHWM"))
            peaks[-1] = max(peaks[-1], peak)
            rows[i] = (depth[0], label, secs, before, peak, _status("VmRSS") - before)

    return step


def _install(rows: list[Any], peaks: list[int]) -> None:
    """Wrap every step of `STEPS` the code has; `peaks` is [the peak outside any step]."""
    import importlib

    depth = [0]
    for mod_name, attr in STEPS:
        mod = importlib.import_module(mod_name)
        owner, name = mod, attr
        if "." in attr:
            owner = getattr(mod, attr.split(".")[0], None)
            name = attr.split(".")[1]
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is None:
            continue
        if isinstance(owner, type) and isinstance(owner.__dict__.get(name), classmethod):
            raw = owner.__dict__[name].__func__
            setattr(owner, name, classmethod(_wrap(rows, depth, peaks, raw, attr)))
        else:
            setattr(owner, name, _wrap(rows, depth, peaks, fn, attr))


def phase_worker(cmd: str, path: str) -> dict[str, Any]:
    _preload()
    rows: list[Any] = []
    peaks = [0]  # VmHWM is reset at each step: the peaks before each reset are kept here
    _install(rows, peaks)
    out = Path(tempfile.mkdtemp()) / "r.html"
    argv = {"report": ["report", path, "-o", str(out)],
            "whatif": ["whatif", path, "--conf", "expandable_segments:True"]}[cmd]  # fmt: skip
    from gpumemviz.cli import main

    gc.collect()
    _reset_hwm()
    base = _status("VmRSS")
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        main(argv)
    secs = time.perf_counter() - t
    peak = max(peaks[0], _status("VmHWM")) - base
    return {"secs": secs, "peak": peak, "base": base, "rows": rows}


def part_phases(args: argparse.Namespace) -> None:
    shape = (args.shapes or "real").split(",")[0]
    entries = _sizes(args, [10**4], [10**5])[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = make_file(shape, entries, Path(tmp))
        pk = run_op("pickle", path, False)
        p = subprocess.run(
            [sys.executable, __file__, "--phase-worker", args.cmd, str(path)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        r = json.loads(p.stdout.strip().splitlines()[-1])
    mib, base = 1 << 20, r["base"]
    print(f"phases: {args.cmd}, {shape} trace of {entries} entries: {r['secs']:.2f} s, peak "
          f"{r['peak'] / mib:.0f} MiB = {r['peak'] / pk['peak']:.2f}x pickle.loads's "
          f"{pk['peak'] / mib:.0f} MiB ({pk['secs']:.2f} s)\n")  # fmt: skip
    print(f"{'step':<34}{'s':>7}{'at MiB':>8}{'peak MiB':>9}{'leaves':>8}{'x pickle':>9}")
    for depth, label, secs, before, peak, left in r["rows"]:
        rise = (peak - before) / pk["peak"]
        print(f"{'  ' * depth + label:<34}{secs:>7.2f}{(before - base) / mib:>8.1f}"
              f"{(peak - base) / mib:>9.1f}{left / mib:>+8.1f}{rise:>9.2f}")  # fmt: skip


# --- the command line -------------------------------------------------------------------------
def _sizes(args: argparse.Namespace, quick: list[int], full: list[int]) -> list[int]:
    """The sizes a part runs: ``--sizes`` when given, else its quick or full default."""
    if args.sizes:
        return [int(s) for s in args.sizes.split(",")]
    return quick if args.quick else full


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", choices=(*PARTS, "all"))
    ap.add_argument("--sizes", help="comma-separated entries (default: each part's own)")
    ap.add_argument("--shapes", help="comma-separated shapes or kinds (default: each part's own)")
    ap.add_argument("--quick", action="store_true", help="small sizes only, one repetition")
    ap.add_argument("--tracemalloc", action="store_true", help="overview: peaks by tracemalloc")
    ap.add_argument("--frames", action="store_true", help="replay: a torch-shaped stack per entry")
    ap.add_argument("--repeat", type=int, default=3, help="drive: best of R (default 3)")
    ap.add_argument("--cmd", default="report", choices=("report", "whatif"), help="phases")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--phase-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(overview_worker(args.worker[0], args.worker[1], args.tracemalloc)))
        return 0
    if args.phase_worker:
        print(json.dumps(phase_worker(args.phase_worker[0], args.phase_worker[1])))
        return 0
    run = {"overview": part_overview, "load": part_load, "replay": part_replay,
           "drive": part_drive, "phases": part_phases}  # fmt: skip
    for i, name in enumerate(PARTS if args.part == "all" else (args.part,)):
        if i:
            print()
        run[name](args)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    run_main(main, __doc__)
