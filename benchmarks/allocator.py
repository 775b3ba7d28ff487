"""malloc/free events per second of the allocator model on a transformer-like training loop.

The model runs with stats and trace recording on (a 100k-entry ring, like a typical
`max_entries`), against a bare best-fit loop (bisect over sorted free blocks, no splitting, no
stats) replaying the same events in the same run. Target: 500k events/s. Times are CPU time
of this process (`time.process_time`), so other work on a shared machine does not count.

    .venv/bin/python benchmarks/allocator.py [--iters N] [--repeat R]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from bisect import bisect_left, insort
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _common import run_main
from gpumemviz.allocator.model import CachingAllocator

MIB = 1 << 20
Op = tuple[int, int, int]  # (kind 0 = malloc / 1 = free, handle, size)


def training_program(iters: int, seed: int = 0) -> list[Op]:
    """A small transformer's training steps, with variable sequence lengths.

    Parameters and optimizer state stay allocated; each step allocates per-layer activations
    whose size follows the batch's sequence length, frees them in reverse during backward while
    gradients and temporaries come and go, then an optimizer step with small temporaries.
    """
    rng = random.Random(seed)
    ops: list[Op] = []
    handle = 0

    def malloc(size: int) -> int:
        nonlocal handle
        handle += 1
        ops.append((0, handle, size))
        return handle

    def free(h: int) -> None:
        ops.append((1, h, 0))

    hidden, layers, batch, vocab = 1024, 12, 8, 32000
    params = []
    for _ in range(layers):
        params += [
            malloc(4 * hidden * hidden * 4),
            malloc(hidden * 4),
            malloc(4 * hidden * hidden * 4),
        ]
        params += [malloc(hidden * 4) for _ in range(4)]
    params.append(malloc(vocab * hidden * 4))
    for _ in range(iters):
        seq = rng.choice([128, 192, 256, 320, 384, 512])
        tokens = batch * seq
        saved = []
        x = malloc(tokens * hidden * 4)
        for _ in range(layers):
            ln = malloc(tokens * hidden * 4)
            qkv = malloc(tokens * 3 * hidden * 4)
            scores = malloc(batch * 16 * seq * seq * 2)
            attn = malloc(tokens * hidden * 4)
            free(scores)
            mlp = malloc(tokens * 4 * hidden * 4)
            act = malloc(tokens * 4 * hidden * 4)
            out = malloc(tokens * hidden * 4)
            stats = [malloc(rng.choice([256, 512, 2048, 4096])) for _ in range(4)]
            saved.append([ln, qkv, attn, mlp, act, out, *stats])
        logits = malloc(tokens * vocab * 2)
        loss = malloc(4)
        free(logits)
        grads = []
        for layer in reversed(saved):
            g = malloc(tokens * 4 * hidden * 4)
            tmp = malloc(tokens * hidden * 4)
            small = [malloc(rng.choice([512, 1024, 8192])) for _ in range(3)]
            for h in reversed(layer):
                free(h)
            free(tmp)
            for h in small:
                free(h)
            free(g)
            grads += [malloc(4 * hidden * hidden * 4), malloc(4 * hidden * hidden * 4)]
        free(x)
        free(loss)
        for g in grads:  # optimizer step
            t = malloc(4 * hidden * hidden * 4)
            free(t)
            free(g)
    for p in params:
        free(p)
    return ops


def run_model(ops: list[Op], conf: str, record_trace: bool = True) -> float:
    a = CachingAllocator(80 << 30, conf, record_trace=record_trace, trace_max_entries=100_000)
    malloc, free = a.malloc, a.free
    addr: dict[int, int] = {}
    t0 = time.process_time()
    for kind, h, size in ops:
        if kind == 0:
            addr[h] = malloc(size)
        else:
            free(addr.pop(h))
    dt = time.process_time() - t0
    assert a.memory_stats()["allocation.all.current"] == 0
    assert a.trace_len() >= len(ops) or not record_trace
    return dt


def run_bare(ops: list[Op]) -> float:
    """Best fit with bisect over (size, addr) free blocks; no splitting, merging or stats."""
    free_blocks: list[tuple[int, int]] = []
    held: dict[int, tuple[int, int]] = {}
    cursor = 1 << 40
    t0 = time.process_time()
    for kind, h, size in ops:
        if kind == 0:
            size = (size + 511) & ~511
            i = bisect_left(free_blocks, (size,))
            if i < len(free_blocks):
                held[h] = free_blocks.pop(i)
            else:
                cursor -= size
                held[h] = (size, cursor)
        else:
            insort(free_blocks, held.pop(h))
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=300, help="training steps (default 300)")
    ap.add_argument("--repeat", type=int, default=3, help="best of R runs (default 3)")
    ap.add_argument("--quick", action="store_true", help="30 steps, one run")
    args = ap.parse_args()
    if args.quick:
        args.iters, args.repeat = 30, 1
    ops = training_program(args.iters)
    n = len(ops)
    rows = [("bare best-fit loop", min(run_bare(ops) for _ in range(args.repeat)))]
    for conf in ("", "expandable_segments:True", "max_split_size_mb:64"):
        t = min(run_model(ops, conf) for _ in range(args.repeat))
        rows.append((f"model {conf or '(defaults)'}", t))
    t = min(run_model(ops, "", record_trace=False) for _ in range(args.repeat))
    rows.append(("model (defaults), trace off", t))
    bare = rows[0][1]
    print(f"training loop: {args.iters} steps, {n:,} malloc/free events, best of {args.repeat}")
    print(f"{'engine':<36} {'seconds':>8} {'events/s':>12} {'vs bare':>8}")
    for name, t in rows:
        print(f"{name:<36} {t:8.3f} {n / t:12,.0f} {bare / t:8.2f}")
    print("target: 500,000 events/s for the model with stats and trace recording on")


if __name__ == "__main__":
    run_main(main, __doc__)
