"""The bounds every untrusted input is held to, pickle or JSON: its size and its nesting.

(Its memory while loading: `budget`; plain types, depth and cycles: `walk`.)
"""

from __future__ import annotations

from gpumemviz.snapshot import SnapshotError
from gpumemviz.snapshot.units import format_size

DEFAULT_MAX_BYTES = 4 << 30
"""Largest file `load_snapshot` reads (4 GiB); Chrome already fails on 1 GB snapshots."""
DEFAULT_MAX_DEPTH = 64
"""Deepest nesting of containers accepted; a torch snapshot is about 9 levels deep."""


def check_size(n: int, max_bytes: int, what: str) -> None:
    """Refuse `n` bytes of input over `max_bytes`; `what` names the input in the message."""
    if n > max_bytes:
        raise SnapshotError(
            f"{what} is {format_size(n)}, over the {format_size(max_bytes)} limit "
            f"(max_bytes={max_bytes})"
        )
