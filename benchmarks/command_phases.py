"""Where `gpumemviz report` and `whatif` spend their time and memory, phase by phase.

big_traces.py measures each command whole against plain `pickle.loads`; this script says which
step the figures come from. One trace per row (`_traces.torch_shaped` or `_traces.tiled_real`,
as big_traces.py makes them), the command run through the CLI's `main()` in a fresh subprocess
with the steps below wrapped: per step its seconds, the resident set when it starts, its peak
(VmHWM, reset at each step's start) and what it leaves (resident set after minus before), all in
MiB, and its peak increment as a ratio to `pickle.loads`'s peak (measured in its own
subprocess, the baseline). Nested steps are indented; a step the code no longer has is left out.

    .venv/bin/python benchmarks/command_phases.py [--shape real] [--entries 100000] [--cmd report]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import big_traces as bt

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
    ("gpumemviz.allocator.replay.driver", "drive"),
    ("gpumemviz.reporting.html_report", "_map"),
    ("gpumemviz.reporting.html_report", "page_parts"),
    ("gpumemviz.reporting.html_report", "atomic_write"),
    ("gpumemviz.allocator.replay", "Prepared._prepare"),
    ("gpumemviz.allocator.replay", "Prepared.replay"),
)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _wrap(rows: list[Any], depth: list[int], peaks: list[int], fn: Any, label: str) -> Any:
    """`fn` timed, its peak taken from VmHWM reset at its start (the caller's peak so far kept
    in `peaks`, the stack of open steps)."""

    @functools.wraps(fn)
    def step(*a: Any, **k: Any) -> Any:
        before, hwm = _status("VmRSS"), _status("VmHWM")
        peaks[-1] = max(peaks[-1], hwm)
        bt._reset_hwm()
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


def worker(cmd: str, path: str) -> dict[str, Any]:
    bt._preload()
    rows: list[Any] = []
    peaks = [0]  # VmHWM is reset at each step: the peaks before each reset are kept here
    _install(rows, peaks)
    out = Path(tempfile.mkdtemp()) / "r.html"
    argv = {"report": ["report", path, "-o", str(out)],
            "whatif": ["whatif", path, "--conf", "expandable_segments:True"]}[cmd]  # fmt: skip
    from gpumemviz.cli import main

    gc.collect()
    bt._reset_hwm()
    base = _status("VmRSS")
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        main(argv)
    secs = time.perf_counter() - t
    peak = max(peaks[0], _status("VmHWM")) - base
    return {"secs": secs, "peak": peak, "base": base, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="real", choices=("torch", "real"))
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--cmd", default="report", choices=("report", "whatif"))
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1])))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = bt.make_file(args.shape, args.entries, Path(tmp))
        pk = bt.run_op("pickle", path, False)
        p = subprocess.run(
            [sys.executable, __file__, "--worker", args.cmd, str(path)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        r = json.loads(p.stdout.strip().splitlines()[-1])
    mib, base = 1 << 20, r["base"]
    print(f"{args.cmd}, {args.shape} trace of {args.entries} entries: {r['secs']:.2f} s, peak "
          f"{r['peak'] / mib:.0f} MiB = {r['peak'] / pk['peak']:.2f}x pickle.loads's "
          f"{pk['peak'] / mib:.0f} MiB ({pk['secs']:.2f} s)\n")  # fmt: skip
    print(f"{'step':<34}{'s':>7}{'at MiB':>8}{'peak MiB':>9}{'leaves':>8}{'x pickle':>9}")
    for depth, label, secs, before, peak, left in r["rows"]:
        rise = (peak - before) / pk["peak"]
        print(f"{'  ' * depth + label:<34}{secs:>7.2f}{(before - base) / mib:>8.1f}"
              f"{(peak - base) / mib:>9.1f}{left / mib:>+8.1f}{rise:>9.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
