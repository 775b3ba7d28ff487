"""The snapshot data model: PyTorch allocator state as numpy columns, with frozen views for humans.

Every other module reads snapshots through this package. `read_torch` (torch_reader.py) is the
one reader of torch dicts: `Snapshot.from_torch` (snapshot.py) and `fragmentation(dict)`
(which reads only the columns it needs) both go through it. The rest: schema.py (states,
actions, key orders, `SnapshotError`), shapes.py (each row's key layout), tables.py (the
columns and the frozen views), validation.py (`validate`), and the helpers columns.py,
messages.py and gc_pause.py.
"""

from __future__ import annotations

from gpumemviz.snapshot.schema import (
    ACTIONS,
    ALLOCATED,
    INACTIVE,
    PENDING_FREE,
    STATE_NAMES,
    SnapshotError,
)
from gpumemviz.snapshot.snapshot import Snapshot
from gpumemviz.snapshot.tables import Block, BlockTable, Segment, SegmentTable, Trace
from gpumemviz.snapshot.torch_reader import TorchColumns, read_torch
from gpumemviz.snapshot.validation import validate

__all__ = [
    "ACTIONS",
    "ALLOCATED",
    "INACTIVE",
    "PENDING_FREE",
    "STATE_NAMES",
    "Block",
    "BlockTable",
    "Segment",
    "SegmentTable",
    "Snapshot",
    "SnapshotError",
    "TorchColumns",
    "Trace",
    "read_torch",
    "validate",
]
