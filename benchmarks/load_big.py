"""How fast and how lean is `load_snapshot` on traces of the length users record (10^4 to
10^6 entries), next to a plain `pickle.loads` of the same bytes? (Issue 20, point 1.)

Traces are shaped like torch's: each entry carries a fresh list of 20-100 frames drawn from a
few hundred shared frame dicts. Two kinds: "stacks" (each entry's list copies one of 200 call
stacks, as a training loop repeats its call sites) and "mixed" (each entry's frames drawn one by
one, the worst case for the loader's walk); plus "no frames" (the issue's 10^6-entry file
without frames). The real files are in benchmarks/snapshot_io.py's memory table.

Baselines, measured in the same run: `pickle.loads` with the GC paused (the floor: what the
unpickle alone costs) and plain `pickle.loads` (the GC on, as a user calls it). Times are CPU
seconds, the best of `reps`; memory is tracemalloc's peak, after a full collection (as
tests/test_io_bounds.py measures). Targets: time within 3x of `pickle.loads`, peak memory
within 1.5x.

Measured here (Dec 2026, 2 busy cores: +-15 %), load_snapshot / GC-paused floor, before -> after
the walk's batched run comparison and the trace columns' C-level passes: 10^4 entries stacks
5.4x -> 5.0x, mixed 13.6x -> 8.9x, none 9.3x -> 9.6x; 10^5 stacks 5.1x -> 4.6x, mixed 14.0x ->
7.8x, none 8.7x -> 7.9x; 10^6 stacks 4.7x -> 4.9x, mixed 8.2x -> 8.0x (14.0 s -> 10.0 s), none
7.7x -> 5.9x; memory 1.06-1.15x of pickle.loads before and after. Where the time goes (10^5,
multiples of the floor): the opcode scan about 1x, the unpickle 1x, the walk 1.2x (stacks),
3.4x (mixed; 7.6x before), 2.5-4x (none), the columns 0.5-2x. The 3x target is not met against
the floor; against plain pickle.loads (the GC on) it is from 10^5 entries up (1.1-3.0x).

Kinds "torch" and "real" are issue 20's shapes (benchmarks/_traces.py: `torch_shaped`, and
big_traces.REAL tiled to size). load_snapshot / plain pickle.loads, wall clock, best of 9-15,
old and new alternated in one process (Dec 2026, 2 busy cores), before -> after the trace
columns as strided slices of one layout's values, the walk's stacks (a frames list with 8
references or more read where first met), per-slice key sets and one type pass, and the scan's
argument bytes as dots: real 10^4 5.9x -> 5.5x, 10^5 4.2x -> 3.1x; torch 10^4 3.6x -> 3.3x,
10^5 1.65x -> 1.51x, 10^6 0.87x -> 0.76x; memory 1.06-1.16x -> 1.06-1.15x. Where it goes now
(CPU ms, real 10^4 / 10^5): scan 5.0 / 29, unpickle 5 / 41, walk 22 / 118 (was 23 / 154),
trace columns 3.9 / 36 (was 4.8 / 73), segments about 1 / 7, validate 0.3.

Run: .venv/bin/python benchmarks/load_big.py [--quick] [--sizes 10000,100000,1000000]
[--kinds stacks,mixed,none,torch,real]
"""

from __future__ import annotations

import argparse
import gc
import pickle
import random
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

from _common import best
from _traces import tiled_real, torch_shaped
from big_traces import REAL
from gpumemviz.io import load_snapshot, loads_restricted


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
    `torch_shaped`) and "real" (big_traces.REAL's trace tiled to `n` entries, `tiled_real`)."""
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


def peak(fn: Callable[[], Any]) -> int:
    """tracemalloc's peak over one call, after a full collection."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def row(name: str, data: bytes, reps: int) -> None:
    t_floor = best(lambda: loads_paused(data), reps)
    t_plain = best(lambda: pickle.loads(data), reps)
    t_load = best(lambda: load_snapshot(data), reps)
    m_loads = peak(lambda: pickle.loads(data))
    m_load = peak(lambda: load_snapshot(data))
    print(
        f"{name:<22} {len(data) / 1e6:>7.1f} {t_floor:>8.2f} {t_plain:>8.2f} {t_load:>8.2f} "
        f"{t_load / t_floor:>7.2f}x {t_load / t_plain:>7.2f}x {m_loads / 1e6:>8.1f} "
        f"{m_load / 1e6:>8.1f} {m_load / m_loads:>6.2f}x",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10^4 and 10^5 entries, one rep")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--kinds", default="stacks,mixed,none,torch,real")
    args = parser.parse_args()
    sizes = [10_000, 100_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    load_snapshot(b"\x80\x04]\x94.")  # imports and one-time caches first
    print(
        f"{'trace':<22} {'MB':>7} {'floor s':>8} {'loads s':>8} {'load s':>8} {'/floor':>8} "
        f"{'/loads':>8} {'loads MB':>8} {'load MB':>8} {'/loads':>7}"
    )
    for n in sizes:
        for kind in args.kinds.split(","):
            data = pickle.dumps(trace_of(n, kind), protocol=4)
            reps = 1 if args.quick or n >= 1_000_000 else 3
            row(f"{n:,} {kind}", data, reps)
            del data
    print(
        "floor: pickle.loads with the GC paused; loads: plain pickle.loads; load: load_snapshot "
        "(scan + unpickle + walk + columns + validate). CPU seconds, best of reps. MB: "
        "tracemalloc's peak. Targets: load/loads time <= 3x, memory <= 1.5x.",
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
