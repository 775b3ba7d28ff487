"""How fast are `load_snapshot`, `Snapshot.from_torch` and `to_torch`, next to a bare unpickle?

The floor is the C unpickler with every global refused and the GC paused: no safe reader can
be faster. `load_snapshot` adds the plain-data/nesting walk, `from_torch` (columns) and
`validate`. Times are CPU seconds (time.process_time), the best of a few repetitions, so a
busy machine distorts them less. Target: `from_torch` at most ~1 µs per block from 10^4 blocks
up. `load_snapshot` measured 5-9x the floor (Nov 2026); most of it is the plain-data walk,
the price of refusing sets and deep nesting without trusting the file. The opcode pre-scan
(`scan_pickle`, against memo-index and declared-length bombs and EXT opcodes) is its own column.

Run: .venv/bin/python benchmarks/snapshot_io.py [--quick]
"""

from __future__ import annotations

import pickle

from _common import best, label, quick_or_full, read_plain, real_files, uniform_snapshot
from gpumemviz.io import check_plain, load_snapshot, scan_pickle
from gpumemviz.snapshot import Snapshot, validate


def floor(data: bytes) -> object:
    """The restricted C unpickler with the GC paused: no safe reader can be faster."""
    return read_plain(data, gc_paused=True)


def row(name: str, data: bytes, reps: int) -> None:
    d = floor(data)
    snap = Snapshot.from_torch(d)
    n = max(snap.n_blocks, 1)
    t_floor = best(lambda: floor(data), reps)
    t_scan = best(lambda: scan_pickle(data), reps)
    t_walk = best(lambda: check_plain(d), reps)
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


def main() -> None:
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
        "walk: check_plain (types, depth); "
        "cols: from_torch; load: load_snapshot (scan + unpickle + walk + cols + validate). "
        "CPU times."
    )


if __name__ == "__main__":
    main()
