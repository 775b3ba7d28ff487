"""What a torch snapshot is made of: block states, trace actions, each row's key order, and the
error every reader of one raises.

The constants are torch's own vocabulary; the key tuples are the key order of a torch 2.11 dict,
which the rows `Snapshot.from_columns` builds follow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# What `from_columns` accepts for a column: a numpy array, or any sequence numpy converts.
IntColumn = Sequence[int] | np.ndarray
BoolColumn = Sequence[bool] | np.ndarray

# A dict as torch writes it (the snapshot, a segment, a block, a trace entry, a frame, the
# allocator settings, memory_stats): its values are whatever that torch version put there, and
# unknown keys are kept and passed on, so they stay Any; every reader checks the values it takes.
TorchDict = dict[str, Any]
TorchMapping = Mapping[str, Any]  # the same, read only
TorchList = list[Any]  # a list as torch writes it (segments, blocks, a trace, frames), as given
# A dict bound for JSON (the panel's messages and replies, report data): plain values of any
# JSON type, nested.
JsonDict = dict[str, Any]


class SnapshotError(ValueError):
    """A snapshot that cannot be read or is inconsistent; the message says what and where.

    A `ValueError`. The message is always one line: every value from the file in it goes
    through the helpers of ``snapshot/escaping.py`` (bounded repr, unprintables escaped), and a
    segment is named by `Snapshot.where` ("segment 3 (device 0, 0x7f5d00000000): block 7 has
    no size"). Every reader raises it: `Snapshot.from_torch`, `validate`,
    `gpumemviz.load_snapshot` and the analyses that take a torch dict.

    Parameters
    ----------
    message : str
        The one-line message.

    Examples
    --------
    >>> from gpumemviz import Snapshot
    >>> try:
    ...     Snapshot.from_torch([{"device": 0, "address": 0, "total_size": 512,
    ...                           "blocks": [{"state": "inactive"}]}])
    ... except SnapshotError as e:
    ...     print(e)
    segment 0 (device 0, 0x0): block 0 has no size
    """


INACTIVE, ALLOCATED, PENDING_FREE = 0, 1, 2
STATE_NAMES = ("inactive", "active_allocated", "active_pending_free")
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
)

# Key order of a torch 2.11 dict; rows built by `from_columns` use these layouts.
# The first segment keys are int columns of SegmentTable under the same names.
SEG_INT_KEYS = (
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
)
SEG_KEYS = (
    *SEG_INT_KEYS,
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
)
BLOCK_KEYS = ("address", "size", "requested_size", "state", "frames")
TRACE_KEYS = (
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "compile_context",
    "user_metadata",
    "frames",
    "device_free",
)
TOP_KEYS = ("segments", "device_traces", "allocator_settings", "external_annotations")
