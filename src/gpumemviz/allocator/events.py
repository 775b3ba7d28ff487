"""Cross-stream use in the model: `record_stream` and the events a deferred free waits on.

A block used on other streams (`record_stream`) is freed only once an event per stream has
completed: `complete_events` marks them, and the next malloc (`process_events`) or
empty_cache (`synchronize_and_free_events`) frees the block. `StreamEventsMixin` is mixed into
`model.CachingAllocator`.
"""

from __future__ import annotations

from collections import deque

from gpumemviz.allocator.blocks import ModelBlock
from gpumemviz.allocator.state import AllocatorState

__all__ = ["StreamEventsMixin"]


class StreamEventsMixin(AllocatorState):
    """The stream-use events of a `CachingAllocator`."""

    def _free_deferred(self, b: ModelBlock) -> None:
        """A free of a block with stream uses: it waits on one event per stream."""
        streams = b.stream_uses
        assert streams
        b.stream_uses = None
        b.event_count += len(streams)
        self._pending[b.ptr] = b
        for s in streams:
            q = self._events.get(s)
            if q is None:
                q = self._events[s] = deque()
            q.append([b, False])

    def record_stream(self, addr: int, stream: int) -> None:
        """`recordStream`: the block is also used on `stream`; its free waits for that work."""
        b = self._allocated.get(addr)
        if b is None:
            raise ValueError(f"record_stream: {addr:#x} is not the address of an allocated block")
        if stream == b.stream:
            return
        if b.stream_uses is None:
            b.stream_uses = set()
        b.stream_uses.add(stream)

    def complete_events(self, stream: int | None = None, *, process: bool = False) -> int:
        """The GPU finished the work recorded on `stream` (all streams when None).

        The events become complete; as in torch, the blocks are freed at the next `malloc`
        (its `process_events`) or `empty_cache`, or now when `process=True`. Returns the number
        of events marked complete.
        """
        n = 0
        for s, q in self._events.items():
            if stream is None or s == stream:
                for e in q:
                    if not e[1]:
                        e[1] = True
                        n += 1
        if process:
            self._process_events()
        return n

    def _process_events(self) -> None:
        """`process_events`: per stream, completed events in FIFO order free their blocks."""
        events = self._events
        for s in list(events):
            q = events[s]
            while q and q[0][1]:
                b = q.popleft()[0]
                b.event_count -= 1
                if b.event_count == 0:
                    del self._pending[b.ptr]
                    self._free_block(b)
            if not q:
                del events[s]

    def _synchronize_and_free_events(self) -> None:
        """`synchronize_and_free_events`: wait for every event, free what they held."""
        self.stats.num_sync_all_streams += 1
        events = self._events
        self._events = {}
        for q in events.values():
            for b, _ in q:
                b.event_count -= 1
                if b.event_count == 0:
                    del self._pending[b.ptr]
                    self._free_block(b)
