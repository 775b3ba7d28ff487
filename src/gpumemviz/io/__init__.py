"""Reading and writing snapshot files, safely.

Snapshot files come from strangers, and `pickle.load` runs whatever a file asks for. Here a
restricted unpickler (unpickle.py) accepts only the plain types a snapshot holds and refuses
every global; size and nesting limits (limits.py) stop a hostile file from exhausting memory or
recursion. snapshot_files.py loads and saves snapshots; writes are atomic (atomic.py: temp file
in the same folder, fsync, rename), so a crash never leaves half a file.
"""

from __future__ import annotations

from ..snapshot import validate
from .atomic import STDOUT, atomic_write, check_target, claim_new_file, is_stdout
from .limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, check_plain
from .snapshot_files import SnapshotLike, as_snapshot, load_snapshot, save_snapshot, write_torch
from .unpickle import loads_restricted, scan_pickle

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
    "save_snapshot",
    "scan_pickle",
    "validate",
    "write_torch",
]
