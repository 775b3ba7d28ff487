"""How fast are the sharing paths: sites, redaction, export, diff, next to a plain pickle.dump?

The floor is `pickle.dump(snapshot.to_torch(), protocol=4)` into memory: an export cannot write
less. `export` adds the atomic file write (and `redact_paths=True` the redaction walk);
`live_holders` groups the allocated blocks by their first user frame; `diff` is two
fragmentation reports and two site tables. Synthetic snapshots have realistic stacks: 2,000
distinct 30-frame stacks under /home/NAME, shared between blocks and trace entries as torch's
pickles share them. Times are CPU seconds (time.process_time), best of a few repetitions.
Targets: `export` within 2x of the floor from 10^4 blocks up; `redact_paths` (on the Snapshot,
no dicts built) a few µs per block; sites and diff under a second at 10^6 blocks. Real files
redact slower per block: their traces hold ~10^5 distinct frame dicts, each rebuilt.

Run: .venv/bin/python benchmarks/export.py [--quick]
"""

from __future__ import annotations

import io
import pickle
import random
import tempfile
from pathlib import Path

from _common import MIB, best, label, quick_or_full, real_files, run_main, uniform_snapshot
from gpumemviz.analysis.diff import diff
from gpumemviz.analysis.frames import redact_paths, redact_torch
from gpumemviz.analysis.holders import live_holders
from gpumemviz.io import load_snapshot
from gpumemviz.reporting.export import export, trace_rows
from gpumemviz.snapshot import Snapshot


def stacks(n: int, depth: int = 30, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    torch_frames = [
        {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
        {"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "c10::cuda::malloc"},
        {"filename": "/home/alice/env/lib/python3.11/site-packages/torch/nn/modules/module.py",
         "line": 1790, "name": "_call_impl"},
    ]  # fmt: skip
    out = []
    for _ in range(n):
        user = [
            {"filename": f"/home/alice/proj/m{rng.randrange(50)}.py",
             "line": rng.randrange(1, 900), "name": f"f{rng.randrange(200)}"}
            for _ in range(depth - len(torch_frames))
        ]  # fmt: skip
        out.append(torch_frames + user)
    return out


def synthetic(n_blocks: int, n_trace: int = 0, seed: int = 0) -> dict:
    """The uniform synthetic dict with 2,000 shared stacks and an optional trace."""
    rng = random.Random(seed)
    pool = stacks(2000, seed=seed)
    d = uniform_snapshot(n_blocks, stacks=pool, seed=seed)
    segments = d["segments"]
    base = segments[-1]["address"] + 100 * MIB if segments else 1 << 40
    trace = d["device_traces"][0]
    for i in range(n_trace // 2):  # alloc/free pairs in a segment outside the final state
        a = base + (i % 64) * MIB
        f = rng.choice(pool)
        trace.append({"action": "alloc", "addr": a, "size": MIB - 8, "stream": 0,
                      "time_us": 10 * i, "frames": f})  # fmt: skip
        trace.append({"action": "free_requested", "addr": a, "size": MIB - 8, "stream": 0,
                      "time_us": 10 * i + 5, "frames": f})  # fmt: skip
    return d


def row(name: str, snap: Snapshot, reps: int, folder: Path) -> None:
    d = snap.to_torch()
    n = max(snap.n_blocks, 1)
    t_floor = best(lambda: pickle.dump(d, io.BytesIO(), protocol=4), reps)
    t_export = best(lambda: export(snap, folder / "x.pickle"), reps)
    t_redact = best(lambda: redact_paths(snap), reps)
    t_redact_dict = best(lambda: redact_torch(d), reps)
    t_red_export = best(lambda: export(snap, folder / "r.pickle", redact_paths=True), reps)
    t_sites = best(lambda: live_holders(snap), reps)
    t_csv = best(lambda: trace_rows(snap), reps) if any(len(t) for t in snap.traces.values()) else 0
    t_diff = best(lambda: diff(snap, snap), reps)
    print(
        f"{name:<34} {snap.n_blocks:>9,} {t_floor * 1e3:>8.1f} {t_export * 1e3:>9.1f} "
        f"{t_export / max(t_floor, 1e-9):>6.2f}x {t_redact * 1e3:>9.1f} "
        f"{t_redact / n * 1e6:>6.2f} {t_redact_dict * 1e3:>9.1f} {t_red_export * 1e3:>9.1f} "
        f"{t_sites * 1e3:>8.1f} {t_csv * 1e3:>8.1f} {t_diff * 1e3:>8.1f}"
    )


def main() -> None:
    reps, sizes = quick_or_full(__doc__)
    print(
        f"{'snapshot':<34} {'blocks':>9} {'floor ms':>8} {'export ms':>9} {'/floor':>7} "
        f"{'redact ms':>9} {'µs/blk':>6} {'dict ms':>9} {'red+exp':>9} {'sites ms':>8} "
        f"{'csv ms':>8} {'diff ms':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for path in real_files():
            row(label(path), load_snapshot(path), reps, folder)
        for n in sizes:
            snap = Snapshot.from_torch(synthetic(n, n_trace=min(n, 10**5)))
            row(f"synthetic {n:,} blocks", snap, reps, folder)
    print(
        "floor: pickle.dump(to_torch()) in memory; export: atomic protocol-4 file; redact: "
        "redact_paths on the Snapshot; dict: redact_torch on the torch dict; red+exp: "
        "export(redact_paths=True); sites: live_holders; csv: trace_rows (trace of up to 10^5 "
        "entries); diff: diff(s, s). CPU times."
    )


if __name__ == "__main__":
    run_main(main, __doc__)
