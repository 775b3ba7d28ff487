"""How fast are `load_snapshot`, `Snapshot.from_torch` and `to_torch`, next to a bare unpickle,
and how much memory does loading take per input byte, on real files and on hostile ones?

The floor is the C unpickler with every global refused and the GC paused: no safe reader can
be faster. `load_snapshot` adds the opcode pre-scan (`scan_pickle`: memo-index and
declared-length bombs, EXT opcodes, sets), the plain-data walk (`check_plain`: types, depth,
cycles, each container once), `from_torch` (columns) and `validate`. Times are CPU seconds
(time.process_time), the best of a few repetitions, so a busy machine distorts them less.
Target: `from_torch` at most ~1 µs per block from 10^4 blocks up.

Memory (second table) is tracemalloc's peak while loading, per input byte, for `load_snapshot`
and for a plain `pickle.loads` of the same bytes, and their ratio. Targets: on real files at
most 1.5x what `pickle.loads` needs; on any input at most 12x its size plus 64 MiB, in time
linear in its size (tools/hostile.py's patterns, at --hostile-mib MiB each; a refused one says
so). Before these bounds (Dec 2026): real files 1.3-2.5x `pickle.loads`; 8 MiB of EMPTY_SET
1.9 GB; 8 MiB of EMPTY_DICT 1.1 GB; a 1 MB list reachable at 60 depths 5 s. After: real files
1.03-1.16x (2.5x of a few KiB for a 1 KiB file: the Snapshot's fixed parts), hostile ones at
most 17 bytes per byte (refused past 10x + 48 MiB), and `load_snapshot` of the 16 real files
0.36 s of CPU where it took 0.48 s (the walk reads each container once, and an equal frames
list as one comparison; the scan tries the commonest opcodes first).

Run: .venv/bin/python benchmarks/snapshot_io.py [--quick] [--hostile-mib 8]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import pickle
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from _common import (
    REPO,
    best,
    label,
    quick_or_full,
    read_plain,
    real_files,
    run_main,
    uniform_snapshot,
)
from gpumemviz.io import check_plain, load_snapshot, scan_pickle
from gpumemviz.snapshot import Snapshot, SnapshotError, validate

MIB = 1 << 20


def _hostile() -> Any:
    """tools/hostile.py, the patterns the loader is held to."""
    path = REPO / "tools" / "hostile.py"
    spec = importlib.util.spec_from_file_location("gpumemviz_tools_hostile", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def floor(data: bytes) -> object:
    """The restricted C unpickler with the GC paused: no safe reader can be faster."""
    return read_plain(data, gc_paused=True)


def row(name: str, data: bytes, reps: int) -> None:
    d = floor(data)
    # the walk first: it reads reference counts, and a Snapshot keeps some of `d`'s objects
    t_walk = best(lambda: check_plain(d), reps)
    snap = Snapshot.from_torch(d)
    n = max(snap.n_blocks, 1)
    t_floor = best(lambda: floor(data), reps)
    t_scan = best(lambda: scan_pickle(data), reps)
    t_cols = best(lambda: Snapshot.from_torch(d), reps)
    t_valid = best(lambda: validate(snap), reps)
    t_back = best(snap.to_torch, reps)
    t_load = best(lambda: load_snapshot(data), reps)
    print(
        f"{name:<34} {len(data) / 1e6:>7.1f} {snap.n_blocks:>9,} {t_floor * 1e3:>9.1f} "
        f"{t_scan * 1e3:>8.1f} {t_walk * 1e3:>9.1f} {t_cols * 1e3:>9.1f} {t_cols / n * 1e6:>6.2f} "
        f"{t_valid * 1e3:>8.1f} {t_back * 1e3:>9.1f} {t_load * 1e3:>9.1f} "
        f"{t_load / t_floor:>6.1f}x"
    )


def peak(fn: Callable[[], Any]) -> tuple[str, int, float]:
    """(outcome, tracemalloc's peak in bytes, CPU seconds) of one call. A full collection
    first empties the free lists of dicts, lists and tuples, so every call pays for each object
    it builds (else one may reuse what another freed: 33 or 49 KB for one 5 KB pickle.loads)."""
    gc.collect()
    tracemalloc.start()
    t0 = time.process_time()
    try:
        fn()
        outcome = "ok"
    except SnapshotError as e:
        outcome = "refused" if str(e).startswith("refused") else "error: " + str(e)[:40]
    finally:
        seconds = time.process_time() - t0
        top = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return outcome, top, seconds


def memory_row(name: str, data: bytes, plain: bool = True) -> None:
    # imports and one-time caches first (the file itself where it loads): what counts is the load
    load_snapshot(data if plain else b"[]")
    outcome, ours, seconds = peak(lambda: load_snapshot(data))
    n = len(data)
    if plain:
        _, theirs, _ = peak(lambda: pickle.loads(data))
        vs = f"{theirs / n:>9.1f} {ours / theirs:>7.2f}x"
    else:  # hostile: a plain unpickle may take gigabytes
        vs = f"{'-':>9} {'-':>8}"
    print(f"{name:<34} {n / 1e6:>7.1f} {ours / n:>9.1f} {vs} {seconds:>7.2f} {outcome}")


def main() -> None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--hostile-mib", type=float, default=8.0)
    known, sys.argv[1:] = extra.parse_known_args()
    reps, sizes = quick_or_full(__doc__)
    print(
        f"{'snapshot':<34} {'MB':>7} {'blocks':>9} {'floor ms':>9} {'scan ms':>8} {'walk ms':>9} "
        f"{'cols ms':>9} {'µs/blk':>6} {'valid ms':>8} {'to_torch':>9} {'load ms':>9} "
        f"{'/floor':>7}"
    )
    for path in real_files():
        row(label(path), path.read_bytes(), reps)
    for n in sizes:
        row(f"synthetic {n:,} blocks", pickle.dumps(uniform_snapshot(n), protocol=4), reps)
    print(
        "floor: restricted C unpickle, GC paused; scan: scan_pickle (opcode pre-scan); "
        "walk: check_plain (types, depth, cycles); "
        "cols: from_torch; load: load_snapshot (scan + unpickle + walk + cols + validate). "
        "CPU times.\n"
    )
    print(
        f"{'memory while loading':<34} {'MB':>7} {'load/B':>9} {'loads/B':>9} {'/loads':>8} "
        f"{'load s':>7} outcome"
    )
    for path in real_files():
        memory_row(label(path), path.read_bytes())
    hostile = _hostile()
    size = int(known.hostile_mib * MIB)
    for name, make in hostile.PATTERNS.items():
        memory_row(f"hostile {name}", make(size), plain=False)
    print(
        "load/B, loads/B: tracemalloc's peak per input byte, load_snapshot and pickle.loads; "
        "/loads: their ratio (target <= 1.5 on real files); hostile: target <= 12 bytes per "
        "byte + 64 MiB, refused once past 10x + 48 MiB."
    )


if __name__ == "__main__":
    run_main(main, __doc__)
