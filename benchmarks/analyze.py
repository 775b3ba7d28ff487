"""How fast is `gpumemviz.fragmentation()` on a torch dict, next to torch's `segsum` and the floor?

The floor is a bare Python loop that reads each block's size, state and requested_size: no
analysis can walk a torch dict faster than that. Each repetition gets a fresh copy of the dict
(made outside the timed region), so no run profits from a previous one's caches. Target: within
2x of the floor, and well ahead of segsum, at every size.

`frag` is the installed package, which walks the dict in C (`_cwalk.c`) where it was compiled;
`py walk` is the same call with the Python walk that installs without a compiler use.

Run: .venv/bin/python benchmarks/analyze.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pickle
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import MIB, label, read_plain, real_files
from gpumemviz.fragmentation import fragmentation, walk


def floor(d: dict) -> int:
    """Read each block's size, state and requested_size, and nothing else."""
    n = 0
    for seg in d["segments"]:
        for b in seg["blocks"]:
            size = b["size"]
            state = b["state"]
            req = b["requested_size"]
            n += 1
    del size, state, req
    return n


def fragmentation_python_walk(d: dict) -> Any:
    """`fragmentation()` as it runs where no C compiler built `_cwalk`."""
    compiled, walk._cwalk = walk._cwalk, None
    try:
        return fragmentation(d)
    finally:
        walk._cwalk = compiled


def run_segsum(d: dict) -> None:
    from torch.cuda._memory_viz import segsum  # torch is slow to import

    with contextlib.redirect_stdout(io.StringIO()):
        segsum(d)


def synthetic(n_blocks: int, seed: int = 0) -> dict:
    """A torch-2.11-shaped snapshot of about n_blocks blocks: real-looking segments and states.

    Segments hold 1-8 blocks (mean about 4.5, the busiest real files hold 1.3-5), no two free
    blocks are adjacent, about a third of the blocks are free, sizes are multiples of 512.
    """
    rng = random.Random(seed)
    segs = []
    addr = 0x7F0000000000
    made = 0
    while made < n_blocks:
        nb = min(rng.randint(1, 8), n_blocks - made)
        small = rng.random() < 0.2
        blocks = []
        prev_free = False
        for _ in range(nb):
            size = rng.randint(1, 2048) * 512 if small else rng.randint(2049, 40960) * 512
            free = not prev_free and rng.random() < 0.35
            prev_free = free
            req = size - rng.randint(0, 511) if not free else rng.randint(1, size)
            blocks.append(
                {
                    "address": addr + sum(b["size"] for b in blocks),
                    "size": size,
                    "requested_size": req,
                    "state": "inactive" if free else "active_allocated",
                    "frames": [],
                }
            )
        total = sum(b["size"] for b in blocks)
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        segs.append(
            {
                "device": 0,
                "address": addr,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": sum(
                    b["requested_size"] for b in blocks if b["state"] == "active_allocated"
                ),
                "stream": 0,
                "segment_type": "small" if small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
        addr += -(-total // (2 * MIB)) * 2 * MIB
        made += nb
    return {"segments": segs, "device_traces": [[]], "allocator_settings": None}


def best_times(fns: list[Callable[[dict], Any]], blob: bytes, reps: list[int]) -> list[float]:
    """Smallest time of each function over its reps, each call on a fresh copy unpickled
    outside the timed region; the functions take turns, so a busy machine slows them alike."""
    best = [float("inf")] * len(fns)
    for r in range(max(reps)):
        for i, fn in enumerate(fns):
            if r >= reps[i]:
                continue
            d = read_plain(blob)
            t0 = time.perf_counter()
            fn(d)
            best[i] = min(best[i], time.perf_counter() - t0)
            del d
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no 10^6 case")
    args = ap.parse_args(argv)
    cases: list[tuple[str, bytes, int]] = []
    for p in real_files():
        cases.append((label(p, 14, 22), p.read_bytes(), 0))
    sizes = (10**4, 10**5) if args.quick else (10**4, 10**5, 10**6)
    for n in sizes:
        cases.append((f"synthetic 10^{len(str(n)) - 1}", pickle.dumps(synthetic(n), 4), n))
    print(f"walk: {'C (_cwalk)' if walk._cwalk is not None else 'Python (no _cwalk built)'}")
    head = (
        f"{'snapshot':<40} {'blocks':>8} {'floor ms':>9} {'frag ms':>9} {'py walk ms':>10} "
        f"{'segsum ms':>10} {'frag/floor':>10} {'py/floor':>8} {'segsum/frag':>11}"
    )
    print(head)
    print("-" * len(head))
    worst, least_ahead = 0.0, float("inf")
    for name, blob, _n in cases:
        d = read_plain(blob)
        n_blocks = sum(len(s["blocks"]) for s in d["segments"])
        del d
        reps = 7 if n_blocks >= 500_000 else (5 if args.quick else 15)
        slow = 2 if n_blocks >= 500_000 else reps  # segsum takes seconds there
        t_floor, t_frag, t_py, t_segsum = best_times(
            [floor, fragmentation, fragmentation_python_walk, run_segsum],
            blob,
            [reps, reps, reps, slow],
        )
        worst = max(worst, t_frag / t_floor)
        least_ahead = min(least_ahead, t_segsum / t_frag)
        print(
            f"{name:<40} {n_blocks:>8} {t_floor * 1e3:>9.2f} {t_frag * 1e3:>9.2f} "
            f"{t_py * 1e3:>10.2f} {t_segsum * 1e3:>10.2f} {t_frag / t_floor:>10.2f} "
            f"{t_py / t_floor:>8.2f} {t_segsum / t_frag:>11.1f}"
        )
    print(f"\nworst fragmentation/floor ratio: {worst:.2f} (target: <= 2)")
    print(f"least segsum/fragmentation ratio: {least_ahead:.1f} (target: well above 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
