"""A trace as every walk over it reads it: `Step` tuples, and the `Rules` that size blocks.

`steps_of` turns torch's trace dicts into steps; `Rules` rounds a request and knows
max_split_size, which is all a walk needs to know how large a block an alloc carved. The
backward walk (reconstruct.py), the forward moves (forward.py), the trail (trail.py), the
recording and the driver all share these, so they live below all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.replay.layout import LayoutError
from gpumemviz.allocator.rules import round_size
from gpumemviz.snapshot.escaping import short_repr

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchMapping

__all__ = ["ALLOC_ACTIONS", "SEGMENT_ACTIONS", "Rules", "Step", "steps_of"]

Step = tuple[str, int, int, int]  # (action, addr or device_free, size, stream)
ALLOC_ACTIONS = frozenset({"alloc", "free_requested", "free_completed"})
SEGMENT_ACTIONS = frozenset({"segment_alloc", "segment_free", "segment_map", "segment_unmap"})


class Rules:
    """The settings that decide block sizes (roundup divisions, max_split_size), ready to use."""

    __slots__ = ("config", "divisions", "max_split_size", "rounded")

    def __init__(self, config: AllocatorConfig | None = None):
        self.config = config or AllocatorConfig()
        self.divisions = self.config.divisions
        self.max_split_size = self.config.max_split_size
        self.rounded: dict[int, int] = {}  # size -> round(size), as asked (sizes repeat)

    @classmethod
    def from_settings(cls, settings: TorchMapping | None) -> Rules:
        """From a torch dict's ``allocator_settings`` (None: torch's defaults); a `Snapshot`
        has them parsed already: ``Rules(snap.config)``."""
        return cls(AllocatorConfig.from_settings(settings))

    def round(self, size: int) -> int:
        got = self.rounded.get(size)
        if got is None:
            got = self.rounded[size] = round_size(size, self.divisions)
        return got


def steps_of(trace: Sequence[TorchMapping]) -> list[Step]:
    """Trace dicts as compact tuples, the form every walk over a trace uses.

    Parameters
    ----------
    trace
        One device's ``device_traces`` entries.

    Returns
    -------
    list of (action, addr, size, stream)
        For an ``oom`` entry the addr field holds ``device_free``.

    Raises
    ------
    LayoutError
        When an entry lacks its action or has a non-integer field.

    Examples
    --------
    >>> steps_of([{"action": "oom", "device_free": 5, "size": 512, "stream": 0}])
    [('oom', 5, 512, 0)]
    """
    out = []
    for i, e in enumerate(trace):
        try:
            action = e["action"]
            addr = e["device_free"] if action == "oom" else e.get("addr", 0)
            out.append((action, int(addr), int(e.get("size", 0)), int(e.get("stream", 0))))
        except (KeyError, TypeError, ValueError) as err:
            raise LayoutError(f"trace entry {i}: malformed ({short_repr(err)})") from None
    return out
