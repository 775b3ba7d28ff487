"""One replay pass (`drive`) against one bare model pass: the driver's per-entry overhead.

A "model pass" is the bare `CachingAllocator` driven through the trace's alloc and free entries
(big_traces.py's baseline); a drive is one device's pass through a fresh model as `replay`
runs it, recorded (scored against the recorded addresses) and what-if
(`expandable_segments:True`, invented addresses). The recording is reconstructed once, outside
the timings. Three shapes: `train` (the model's training loop, replay_big.make_trace),
`torch` (_traces.torch_shaped) and `real` (a real file tiled, _traces.tiled_real). CPU seconds,
best of `--repeat`, the cyclic GC paused as `replay` pauses it; `fixed` is the drive's set-up
and result (the model loaded from the start state, the final layout compared), the rest is per
entry. Issue 20: each drive is part of "whatif within 1.3x (load + 2 model passes)".

Run: .venv/bin/python benchmarks/drive_overhead.py [--sizes 100000,1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

from _traces import tiled_real, torch_shaped
from big_traces import REAL, _model_pass
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.replay import prepare
from gpumemviz.allocator.replay.driver import Driver
from gpumemviz.io import loads_restricted
from replay_big import make_trace


def _cpu(fn: Callable[[], Any]) -> float:
    gc.collect()
    gc.disable()
    try:
        t = time.process_time()
        fn()
        return time.process_time() - t
    finally:
        gc.enable()


def row(shape: str, snap: dict[str, Any], repeat: int) -> str:
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000", help="comma-separated trace entries")
    ap.add_argument("--shapes", default="train,torch,real")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    real = loads_restricted(REAL.read_bytes())
    print("CPU s, best of", args.repeat, "; x: ratio to the model pass; init: the drive's set-up")
    print(f"{'shape':<6} {'entries':>8} {'model':>8} {'rec':>8} {'x':>7} {'init':>7} "
          f"{'whatif':>8} {'x':>7} {'init':>7}")  # fmt: skip
    for n in (int(s) for s in args.sizes.split(",")):
        for shape in args.shapes.split(","):
            if shape == "train":
                snap = make_trace(n, False)
            else:
                snap = torch_shaped(n) if shape == "torch" else tiled_real(real, n)
            print(row(shape, snap, args.repeat), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
