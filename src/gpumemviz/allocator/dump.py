"""The model's state written out in torch's format: `CachingAllocator.snapshot()`.

The dict `torch.cuda.memory._snapshot()` returns: segments with their blocks, device_traces
from the trace ring, allocator_settings. `SnapshotMixin` is mixed into `model.CachingAllocator`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumemviz.allocator.blocks import ModelBlock
from gpumemviz.allocator.state import AllocatorState
from gpumemviz.allocator.trace import OOM, SNAPSHOT
from gpumemviz.snapshot import ACTIONS

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchDict

__all__ = ["SnapshotMixin"]


class SnapshotMixin(AllocatorState):
    """`snapshot()` of a `CachingAllocator`."""

    def snapshot(self, *, include_traces: bool = True, record: bool = True) -> TorchDict:
        """The torch 2.11 `_snapshot()` dict: segments, device_traces, allocator_settings, ...

        As in torch, a `snapshot` trace entry (size = total active bytes) is appended after the
        trace is read, so it shows up in the next snapshot; `record=False` skips it.
        """
        heads: list[ModelBlock] = []
        for m in self._all_blocks():
            if m.mapped and (m.prev is None or not m.prev.mapped):
                heads.append(m)
        heads.sort(key=lambda h: h.ptr)
        segments = []
        total_active = 0
        dev = self.device
        for h in heads:
            blocks = []
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
                blocks.append(
                    {
                        "address": addr,
                        "size": b.size,
                        "requested_size": b.requested,
                        "state": state,
                        "frames": [],
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
                    "device": dev,
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
                    "blocks": blocks,
                }
            )
        traces: list[list[TorchDict]] = [[] for _ in range(dev + 1)]
        if include_traces:
            out = traces[dev]
            for a, addr, size, s, t in self._trace:
                e: TorchDict = {"action": ACTIONS[a]}
                e["device_free" if a == OOM else "addr"] = addr
                e["size"] = size
                e["stream"] = s
                e["time_us"] = t
                e["compile_context"] = "N/A"
                e["user_metadata"] = ""
                out.append(e)
        if record and self._record:
            self._emit(SNAPSHOT, 0, total_active, 0)
        return {
            "segments": segments,
            "device_traces": traces,
            "allocator_settings": self.config.to_settings(),
            "external_annotations": [],
        }

    def _all_blocks(self) -> list[ModelBlock]:
        """The mapped blocks: free ones from the pools, then allocated and pending ones."""
        out: list[ModelBlock] = [k[3] for k in self._small.blocks]
        out += [k[3] for k in self._large.blocks]
        if self._pools:
            for pool in self._private_block_pools():
                out += [k[3] for k in pool.blocks]
        out += self._allocated.values()
        out += self._pending.values()
        return out
