"""How fast are `fragmentation()` and `Snapshot.from_torch` on a torch dict, next to the floor?

The floor is a bare Python loop that reads each block's size, state and requested_size: no
reader of a torch dict can be faster than that, and both entry points go through one reader
(`gpumemviz.snapshot.read_torch`). `fragmentation(dict)` reads the columns the analysis needs and
reduces them; `from_torch` also keeps each block's address and frames, so that `to_torch()`
gives the dict back. torch's own `segsum` is the yardstick a user already has. Each
repetition gets a fresh copy of the dict (made outside the timed region), so no run profits
from a previous one's caches.

Targets, at 10^4, 10^5 and 10^6 blocks: fragmentation/floor <= 3, from_torch/floor <= 5. The
real files are small (a few thousand blocks at most), so their ratios are mostly the fixed cost
of a report (numpy calls and the MemoryFigures values), not the walk; they are printed, not
judged.

Run: .venv/bin/python benchmarks/analyze.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pickle
import random
import time
from collections.abc import Callable
from typing import Any

from _common import MIB, label, read_plain, real_files, run_main
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.snapshot import Snapshot

TARGET_FRAGMENTATION = 3.0
TARGET_FROM_TORCH = 5.0


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
            out = fn(d)
            best[i] = min(best[i], time.perf_counter() - t0)
            del d, out
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no 10^6 case")
    args = ap.parse_args(argv)
    cases: list[tuple[str, bytes, bool]] = []
    for p in real_files():
        cases.append((label(p, 14, 22), p.read_bytes(), False))
    sizes = (10**4, 10**5) if args.quick else (10**4, 10**5, 10**6)
    for n in sizes:
        cases.append((f"synthetic 10^{len(str(n)) - 1}", pickle.dumps(synthetic(n), 4), True))
    head = (
        f"{'snapshot':<38} {'blocks':>8} {'floor ms':>9} {'frag ms':>9} {'from_torch ms':>13} "
        f"{'segsum ms':>10} {'frag/floor':>10} {'from_torch/floor':>16} {'segsum/frag':>11}"
    )
    print(head)
    print("-" * len(head))
    worst_frag = worst_torch = 0.0
    least_ahead = float("inf")
    for name, blob, judged in cases:
        d = read_plain(blob)
        n_blocks = sum(len(s["blocks"]) for s in d["segments"])
        del d
        reps = 7 if n_blocks >= 500_000 else (5 if args.quick else 15)
        slow = 2 if n_blocks >= 500_000 else reps  # segsum takes seconds there
        t_floor, t_frag, t_torch, t_segsum = best_times(
            [floor, fragmentation, Snapshot.from_torch, run_segsum],
            blob,
            [reps, reps, reps, slow],
        )
        if judged:
            worst_frag = max(worst_frag, t_frag / t_floor)
            worst_torch = max(worst_torch, t_torch / t_floor)
        least_ahead = min(least_ahead, t_segsum / t_frag)
        print(
            f"{name:<38} {n_blocks:>8} {t_floor * 1e3:>9.2f} {t_frag * 1e3:>9.2f} "
            f"{t_torch * 1e3:>13.2f} {t_segsum * 1e3:>10.2f} {t_frag / t_floor:>10.2f} "
            f"{t_torch / t_floor:>16.2f} {t_segsum / t_frag:>11.1f}"
        )
    print(
        f"\nsynthetic sizes: worst fragmentation/floor {worst_frag:.2f} "
        f"(target: fragmentation/floor <= {TARGET_FRAGMENTATION:g})"
    )
    print(
        f"synthetic sizes: worst from_torch/floor {worst_torch:.2f} "
        f"(target: from_torch/floor <= {TARGET_FROM_TORCH:g})"
    )
    print(f"least segsum/fragmentation ratio: {least_ahead:.1f} (target: well above 1)")
    return 0


if __name__ == "__main__":
    run_main(main, __doc__)
