"""`copy.deepcopy` of the model, written out rather than left to the generic copy.

A model's blocks form linked chains, which the generic deepcopy would follow by recursion;
`CloneMixin.__deepcopy__` re-links the copies in loops instead, so long chains are fine, and
gives the copy its own trace clock. Mixed into `model.CachingAllocator`.
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from typing import TYPE_CHECKING, Any

from gpumemviz.allocator import stats as S
from gpumemviz.allocator.blocks import BlockPool, ModelBlock, PrivatePool, Reservation
from gpumemviz.allocator.state import AllocatorState

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["CloneMixin"]

# attributes __deepcopy__ rebuilds itself rather than deep-copying
_NOT_DEEPCOPIED = frozenset(
    (
        "_small",
        "_large",
        "_allocated",
        "_pending",
        "_events",
        "stats",
        "_clock",
        "_tappend",
        "_tick",
        "_pools",
        "_capture_deferred",
    )
)


class CloneMixin(AllocatorState):
    """`copy.deepcopy` of a `CachingAllocator`."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:  # Any: deepcopy's memo
        """An independent copy (blocks re-linked without recursion, so long chains are fine)."""
        new = object.__new__(type(self))
        memo[id(self)] = new
        olds: dict[int, ModelBlock] = {}
        old_pools = [self._small, self._large, *self._private_block_pools()]
        for pool in old_pools:
            for k in pool.blocks:
                olds[id(k[3])] = k[3]
            for u in pool.unmapped:
                olds[id(u[2])] = u[2]
        for b in self._allocated.values():
            olds[id(b)] = b
        for b in self._pending.values():
            olds[id(b)] = b
        pools = {id(self._small): BlockPool(True), id(self._large): BlockPool(False)}
        new_private: dict[tuple[int, int], PrivatePool] = {}
        for pid, pp in self._pools.items():
            npp = new_private[pid] = PrivatePool(pid, pp.small.no_split)
            npp.use_count, npp.malloc_count, npp.use_on_oom, npp.reserved = (
                pp.use_count,
                pp.malloc_count,
                pp.use_on_oom,
                pp.reserved,
            )
            pools[id(pp.small)], pools[id(pp.large)] = npp.small, npp.large
        segs: dict[int, Reservation] = {}
        clones: dict[int, ModelBlock] = {}
        for key, b in olds.items():
            c = object.__new__(ModelBlock)
            for name in ModelBlock.__slots__:
                setattr(c, name, getattr(b, name))
            c.pool = pools[id(b.pool)]
            if b.seg is not None:
                es = segs.get(id(b.seg))
                if es is None:
                    o = b.seg
                    es = segs[id(o)] = Reservation(o.base, o.size, o.page, o.stream, o.small)
                c.seg = es
            if b.stream_uses:
                c.stream_uses = set(b.stream_uses)
            clones[key] = c
        for c in clones.values():
            if c.prev is not None:
                c.prev = clones[id(c.prev)]
            if c.next is not None:
                c.next = clones[id(c.next)]
        for old_pool in old_pools:
            np_ = pools[id(old_pool)]
            np_.gc_count = old_pool.gc_count
            np_.blocks = [(a, b, c, clones[id(d)]) for a, b, c, d in old_pool.blocks]
            np_.unmapped = [(a, b, clones[id(c)]) for a, b, c in old_pool.unmapped]
        for name, value in self.__dict__.items():
            if name in _NOT_DEEPCOPIED:
                continue
            setattr(new, name, copy.deepcopy(value, memo))
        new._clock = self._clock
        new._tappend = new._trace.append if self._tappend is not None else None
        # the default clock ticked once per entry: the copy's own counter goes on from there
        new._tick = (
            itertools.count(self.trace_len() + 1).__next__
            if self._default_clock
            else new._counted_tick
        )
        new._small = pools[id(self._small)]
        new._large = pools[id(self._large)]
        new._pools = new_private
        new._capture_deferred = [clones[id(b)] for b in self._capture_deferred]
        new._allocated = {p: clones[id(b)] for p, b in self._allocated.items()}
        new._pending = {p: clones[id(b)] for p, b in self._pending.items()}
        new._events = {
            s: deque([clones[id(b)], done] for b, done in q) for s, q in self._events.items()
        }
        st = S.DeviceStats(self.stats.max_split_size)
        for name in S.DeviceStats.__slots__:
            v = getattr(self.stats, name)
            setattr(st, name, list(v) if isinstance(v, list) else v)
        new.stats = st
        return new
