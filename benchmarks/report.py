"""The offline HTML report on large synthetic snapshots: seconds and bytes against the budget.

The budget (issue 8): at most 2x the input pickle's size, plus the renderer. Each snapshot is
written as a protocol-4 pickle first (frameless, the smallest a real file gets per block), then
`gpumemviz.report` reads it back and writes the page. Times are wall clock.

    .venv/bin/python benchmarks/report.py [--blocks 100000,1000000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _common import run_main
from gpumemviz.io import load_snapshot, save_snapshot
from gpumemviz.reporting.html_report import ANALYSIS_ALLOWANCE, SIZE_FACTOR, renderer_size, report
from gpumemviz.snapshot import Snapshot


def synthetic(n_blocks: int, per_segment: int, seed: int = 0) -> Snapshot:
    """n_blocks blocks of 512 B..2 MiB, `per_segment` to a segment, mixed states."""
    rng = np.random.default_rng(seed)
    nseg = n_blocks // per_segment
    size = rng.integers(1, 4096, n_blocks) * 512
    state = rng.choice([0, 1, 1, 2], n_blocks).astype(np.uint8)
    req = np.where(state > 0, size - rng.integers(0, 512, n_blocks), 0)
    total = np.add.reduceat(size, np.arange(0, n_blocks, per_segment))
    addr = (1 << 44) + np.concatenate([[0], np.cumsum(total + (2 << 20))[:-1]])
    return Snapshot.from_columns(
        device=np.zeros(nseg, np.int64),
        address=addr,
        total_size=total,
        stream=np.zeros(nseg, np.int64),
        is_small=np.zeros(nseg, bool),
        block_count=np.full(nseg, per_segment),
        size=size,
        requested_size=req,
        state=state,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="100000,1000000", help="comma-separated block counts")
    ap.add_argument("--per-segment", default="10,100,2000", help="blocks per segment, each")
    ap.add_argument("--quick", action="store_true", help="10^4 blocks only")
    args = ap.parse_args()
    if args.quick:
        args.blocks = "10000"
    rend = renderer_size()
    print(f"renderer (JS + CSS + page): {rend:,} bytes")
    head = f"{'blocks':>9} {'segments':>8} {'pickle MB':>9} {'load s':>7} {'report s':>8}"
    print(head + f" {'html MB':>8} {'budget MB':>9} {'used':>5}")
    with tempfile.TemporaryDirectory() as d:
        for n in (int(x) for x in args.blocks.split(",")):
            for per in (int(x) for x in args.per_segment.split(",")):
                src = save_snapshot(synthetic(n, per), Path(d) / "s.pickle")
                size = src.stat().st_size
                t0 = time.perf_counter()
                load_snapshot(src)
                t_load = time.perf_counter() - t0
                t0 = time.perf_counter()
                out = report(src, Path(d) / "r.html")
                t_rep = time.perf_counter() - t0
                html = out.stat().st_size
                budget = SIZE_FACTOR * size + rend + ANALYSIS_ALLOWANCE
                print(
                    f"{n:>9,} {n // per:>8,} {size / 1e6:>9.1f} {t_load:>7.2f} {t_rep:>8.2f}"
                    f" {html / 1e6:>8.1f} {budget / 1e6:>9.1f} {html / budget:>5.0%}"
                )
    print("report s includes loading the file (load s); budget = 2 x pickle + renderer + 8 KiB")


if __name__ == "__main__":
    run_main(main, __doc__)
