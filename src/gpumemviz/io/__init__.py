"""Reading and writing snapshot files, safely.

Snapshot files come from strangers, and `pickle.load` runs whatever a file asks for. Here a
restricted unpickler (unpickle.py) accepts only the plain types a snapshot holds and refuses
every global, after an opcode pre-scan (opscan.py); a size limit (limits.py), a memory budget
(budget.py) and the plain-data walk (walk.py: types, depth, cycles, each container once) stop
a hostile file from exhausting memory, time or recursion. snapshot_files.py loads and saves
snapshots (from paths, pipes, bytes or stdin); writes are atomic (atomic.py: temp file in the
same folder, fsync, rename), so a crash never leaves half a file.
"""

from __future__ import annotations

from gpumemviz.io.atomic import STDOUT, atomic_write, check_target, claim_new_file, is_stdout
from gpumemviz.io.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH
from gpumemviz.io.opscan import scan_pickle
from gpumemviz.io.rank_folder import rank_files
from gpumemviz.io.snapshot_files import (
    SnapshotLike,
    as_snapshot,
    load_snapshot,
    read_input,
    save_snapshot,
    write_torch,
)
from gpumemviz.io.unpickle import loads_restricted
from gpumemviz.io.walk import check_plain
from gpumemviz.snapshot import validate

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "STDOUT",
    "SnapshotLike",
    "as_snapshot",
    "atomic_write",
    "check_plain",
    "check_target",
    "claim_new_file",
    "is_stdout",
    "load_snapshot",
    "loads_restricted",
    "rank_files",
    "read_input",
    "save_snapshot",
    "scan_pickle",
    "validate",
    "write_torch",
]
