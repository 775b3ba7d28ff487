"""The model's blocks and trace entries written out in torch's format, for `snapshot()`.

`CachingAllocator.snapshot()` (model.py) hands its mapped blocks to `torch_segments` and its
trace ring to `torch_trace`; both only read what they are given, so the dict
`torch.cuda.memory._snapshot()` returns is built here without touching the allocator's state.
An active block's ``frames`` and a trace entry's are the call site list `malloc` was given,
shared, not copied (as the model shares it between the block and its entries).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpumemviz.allocator.blocks import ModelBlock
from gpumemviz.allocator.trace import OOM, TraceEntry
from gpumemviz.snapshot import ACTIONS

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchDict

__all__ = ["torch_segments", "torch_trace"]


def torch_segments(blocks: Iterable[ModelBlock], device: int) -> tuple[list[TorchDict], int]:
    """The segment dicts of the mapped `blocks` (in address order), and their active bytes.

    Every mapped block must be given (in any order): each mapped run starts a segment at the
    block whose predecessor is absent or unmapped, and the run is read along `next`.
    """
    heads: list[ModelBlock] = []
    for m in blocks:
        if m.mapped and (m.prev is None or not m.prev.mapped):
            heads.append(m)
    heads.sort(key=lambda h: h.ptr)
    segments: list[TorchDict] = []
    total_active = 0
    for h in heads:
        out = []
        total = alloc = active = req = 0
        addr = h.ptr
        b: ModelBlock | None = h
        while b is not None and b.mapped:
            is_active = b.allocated or b.event_count > 0 or bool(b.stream_uses)
            state = (
                "active_allocated"
                if b.allocated
                else ("active_pending_free" if is_active else "inactive")
            )
            out.append(
                {
                    "address": addr,
                    "size": b.size,
                    "requested_size": b.requested,
                    "state": state,
                    "frames": (b.frames or []) if is_active else [],
                }
            )
            addr += b.size
            total += b.size
            if b.allocated:
                alloc += b.size
            if is_active:
                active += b.size
                req += b.requested
            b = b.next
        total_active += active
        segments.append(
            {
                "device": device,
                "address": h.ptr,
                "total_size": total,
                "allocated_size": alloc,
                "active_size": active,
                "requested_size": req,
                "stream": h.stream,
                "segment_type": "small" if h.pool.small else "large",
                "segment_pool_id": (0, 0) if h.pool.owner is None else h.pool.owner.id,
                "is_expandable": h.seg is not None,
                "frames": [],
                "blocks": out,
            }
        )
    return segments, total_active


def torch_trace(entries: Iterable[TraceEntry]) -> list[TorchDict]:
    """Trace ring entries as torch's ``device_traces`` dicts (an `oom` one's addr is
    ``device_free``; ``frames`` where the entry has a call site)."""
    out: list[TorchDict] = []
    for a, addr, size, s, t, frames in entries:
        e: TorchDict = {"action": ACTIONS[a]}
        e["device_free" if a == OOM else "addr"] = addr
        e["size"] = size
        e["stream"] = s
        e["time_us"] = t
        e["compile_context"] = "N/A"
        e["user_metadata"] = ""
        if frames is not None:
            e["frames"] = frames
        out.append(e)
    return out
