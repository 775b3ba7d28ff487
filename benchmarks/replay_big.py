"""Replay and the commands on 10^5 / 10^6-entry traces, against a model pass (issue 20, 2-3).

Each trace is the allocator model's training loop recorded with a ring of N entries (the
oldest entries fall off, so the trace starts mid-story as a real one does); "torch-shaped"
gives every entry a fresh list of 20-100 frames drawn from a few hundred shared frame dicts.
Floors, measured in the same run: `pickle.loads` of the file (time, peak memory) and one
model pass (a bare `CachingAllocator` driven through the trace's alloc and free entries).
Targets: `replay()` at least half the model pass's events/s; `inspect` within 1.3x (load +
(1+n) passes), `whatif` within 1.3x (load + 2 passes), `report` within 1.5x (load + (1+n)
passes), peak memory of each command within 2x of `pickle.loads`'s.

Run: .venv/bin/python benchmarks/replay_big.py [--sizes 100000,1000000] [--frames]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.workloads import run, training_loop

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30


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
    """Seconds of one bare model pass (`big_traces._model_pass`), and the trace's entries."""
    from big_traces import _model_pass

    t = time.perf_counter()
    _model_pass(snap)
    return time.perf_counter() - t, len(snap["device_traces"][0])


_CHILD = r"""
import json, pickle, resource, sys, time
sys.path.insert(0, "src")
sys.path.insert(0, "benchmarks")
what, path = sys.argv[1], sys.argv[2]
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
    from replay_big import model_pass
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
    n = len({a["replay"]["settings"] for a in got["advice"] + got["rejected_advice"]
             if a.get("replay")})
print(json.dumps({"s": dt, "rss": peak * 1024, "n": n}))
"""


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--frames", action="store_true", help="torch-shaped stacks on every entry")
    ap.add_argument(
        "--commands", default="inspect --json,whatif --conf expandable_segments:True,report -o -"
    )
    args = ap.parse_args()
    for n in [int(x) for x in args.sizes.split(",")]:
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
            n = 0
            for cmd in args.commands.split(","):
                c_s, c_rss, got_n = child(cmd, path)
                n = max(n, got_n)
                passes = 2 if cmd.startswith("whatif") else 1 + n
                target = 1.5 if cmd.startswith("report") else 1.3
                floor = l_s + passes * pass_s
                print(f"  {cmd:<40} {c_s:6.2f} s = {c_s / floor:5.2f}x (load + {passes} passes"
                      f", n={n}; target {target}x), peak {c_rss / max(p_rss, 1):.2f}x "
                      f"pickle.loads's (target 2x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
