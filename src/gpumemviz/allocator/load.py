"""Starting the model from a known state: `CachingAllocator.from_segments`.

Torch-format segment dicts (a snapshot's, or a replay's layout) become the model's blocks,
pools, live allocations and pending frees; expandable runs are placed in reservations by
`addresses.reservation_starts`. `LoadMixin` is mixed into `model.CachingAllocator`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpumemviz.allocator import stats as S
from gpumemviz.allocator.addresses import reservation_starts
from gpumemviz.allocator.blocks import BlockPool, ModelBlock, Reservation, link
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.rules import page_size, reservation_size
from gpumemviz.allocator.state import AllocatorState
from gpumemviz.snapshot.escaping import short_repr

if TYPE_CHECKING:
    from typing_extensions import Self

    from gpumemviz.snapshot.schema import TorchMapping

__all__ = ["LoadMixin"]


def _pool_id(seg: TorchMapping) -> tuple[int, int]:
    pid = seg.get("segment_pool_id") or (0, 0)
    try:
        a, b = pid
        return (int(a), int(b))
    except (TypeError, ValueError):
        raise ValueError(
            f"from_segments: segment at {seg['address']:#x} has a bad segment_pool_id "
            f"{short_repr(pid)}"
        ) from None


class LoadMixin(AllocatorState):
    """`from_segments` and the state loading of a `CachingAllocator`."""

    @classmethod
    def from_segments(
        cls,
        segments: Iterable[TorchMapping],
        capacity: int,
        config: str | AllocatorConfig = "",
        device: int = 0,
        device_total: int | None = None,
        *,
        reservations: Iterable[tuple[int, bool, int]] = (),
        **kwargs: Any,  # Any: the constructor's keyword options
    ) -> Self:
        """A model whose state is the given torch-format segments (of `device`).

        Inactive blocks go back into their pools, `active_allocated` blocks become live
        allocations (free them by address), `active_pending_free` blocks wait on an event of an
        unknown stream (-1) that `complete_events()` completes. Expandable runs of one
        (stream, pool) are placed in one address reservation starting at the lowest run when
        they fit in it (unmapped gaps between them stay unmapped). A snapshot does not show
        where a reservation starts: `reservations` gives known bases as ``(stream, small,
        base)``; the runs of that stream and pool from `base` to the end of its address space
        go in a reservation starting there (unmapped below the lowest run), and one with no
        run in it is held entirely unmapped. Stats start at the walk of the state (peak =
        current). A segment of a private pool (`segment_pool_id` other than (0, 0)) goes into
        that pool, created with one reference (its MemPool or graph alive); `reservations` place
        the default pools' runs only. Overlapping reservations and a run crossing its
        reservation's end raise ValueError.
        Extra keyword arguments go to the constructor.
        """
        self = cls(capacity, config, device, device_total, **kwargs)
        segs = [s for s in segments if s.get("device", device) == device]
        exp_runs: dict[tuple[int, bool, tuple[int, int]], list[TorchMapping]] = {}
        for seg in segs:
            pid = _pool_id(seg)
            small = seg.get("segment_type") == "small"
            if seg.get("is_expandable"):
                exp_runs.setdefault((seg["stream"], small, pid), []).append(seg)
                continue
            pool = self._block_pool(pid, small)
            self._load_run(seg, pool, None)
            if pool.owner is not None:
                pool.owner.malloc_count += 1
                pool.owner.reserved += seg["total_size"]
            self._total += seg["total_size"]
        bases: dict[tuple[int, bool], list[int]] = {}
        for stream, small, base in reservations:
            bases.setdefault((stream, bool(small)), []).append(base)
            exp_runs.setdefault((stream, bool(small), (0, 0)), [])
        for (stream, small, pid), runs in exp_runs.items():
            self._load_expandable(
                stream,
                small,
                sorted(runs, key=lambda s: s["address"]),
                sorted(bases.get((stream, small), ())) if pid == (0, 0) else [],
                self._block_pool(pid, small),
            )
        # stats: current values from the state, peak = allocated = current
        st = self.stats
        st.seed_current(S.walk_stats(segs))
        over_alloc = sum(1 for b in self._allocated.values() if b.size >= self._mss)
        over_seg = sum(
            1 for s in segs if not s.get("is_expandable") and s["total_size"] >= self._mss
        )
        for stat, v in ((S.OVERSIZE_ALLOCATIONS, over_alloc), (S.OVERSIZE_SEGMENTS, over_seg)):
            i = 3 * stat
            st.cur[i] = st.peak[i] = st.alloc[i] = v
        return self

    def _block_pool(self, pid: tuple[int, int], small: bool) -> BlockPool:
        """The default pool of that size class, or that of private pool `pid` (made once)."""
        if pid == (0, 0):
            return self._small if small else self._large
        if pid not in self._pools:
            self._create_or_incref(pid)
        pp = self._pools[pid]
        return pp.small if small else pp.large

    def _load_run(self, seg: TorchMapping, pool: BlockPool, es: Reservation | None) -> ModelBlock:
        """Chain the blocks of one segment dict (or mapped run) and file each where it belongs."""
        stream = seg["stream"]
        addr = seg["address"]
        prev: ModelBlock | None = None
        head: ModelBlock | None = None
        blocks = seg["blocks"]
        if not blocks:
            raise ValueError(f"from_segments: segment at {addr:#x} has no blocks")
        for bd in blocks:
            b = ModelBlock(addr, bd["size"], stream, pool, es, True)
            b.requested = bd.get("requested_size", 0)
            link(b, prev, None)
            state = bd["state"]
            if state == "active_allocated":
                b.allocated = True
                self._allocated[b.ptr] = b
            elif state == "active_pending_free":
                b.event_count = 1
                self._pending[b.ptr] = b
                q = self._events.get(-1)
                if q is None:
                    q = self._events[-1] = deque()
                q.append([b, False])
            elif state == "inactive":
                pool.insert(b)
            else:
                raise ValueError(
                    f"from_segments: block at {addr:#x} has unknown state {short_repr(state)}"
                )
            head = head or b
            prev = b
            addr += b.size
        if addr - seg["address"] != seg["total_size"]:
            raise ValueError(
                f"from_segments: blocks of segment {seg['address']:#x} add up to "
                f"{addr - seg['address']} bytes, total_size says {seg['total_size']}"
            )
        assert head is not None
        return head

    def _load_expandable(
        self,
        stream: int,
        small: bool,
        runs: list[TorchMapping],
        bases: list[int],
        pool: BlockPool,
    ) -> None:
        """Place sorted mapped `runs` of `pool` in reservations: one at each known base of
        sorted `bases` (holding the runs within its address space), else one at the lowest
        run left."""
        extent = reservation_size(self.device_total, page_size(small, self._lss))
        i = 0
        floor = 0  # end of the last reservation placed
        for base in reservation_starts([run["address"] for run in runs], bases, extent):
            if base < floor:
                raise ValueError(
                    f"from_segments: reservation at {base:#x} overlaps the one below it"
                )
            es = self._new_reservation(stream, small, base)
            end = floor = es.base + es.size
            cursor = es.base
            last: ModelBlock | None = None
            while i < len(runs) and runs[i]["address"] + runs[i]["total_size"] <= end:
                run = runs[i]
                if run["address"] > cursor:  # unmapped gap
                    gap = ModelBlock(cursor, run["address"] - cursor, stream, pool, es, False)
                    link(gap, last, None)
                    pool.insert_unmapped(gap)
                    last = gap
                head = self._load_run(run, pool, es)
                if last is not None:
                    last.next = head
                    head.prev = last
                b = head
                while b.next is not None:
                    b = b.next
                last = b
                cursor = run["address"] + run["total_size"]
                self._total += run["total_size"]
                if pool.owner is not None:
                    pool.owner.malloc_count += 1
                    pool.owner.reserved += run["total_size"]
                i += 1
            if i < len(runs) and runs[i]["address"] < end:
                if runs[i]["address"] == es.base:
                    raise ValueError(
                        f"from_segments: expandable run at {es.base:#x} is larger than "
                        f"the address space of one reservation ({es.size} bytes)"
                    )
                raise ValueError(
                    f"from_segments: expandable run at {runs[i]['address']:#x} crosses the end "
                    f"of the reservation at {es.base:#x} ({es.size} bytes)"
                )
            if cursor < end:  # the unmapped tail (the whole reservation when nothing is mapped)
                tail = ModelBlock(cursor, end - cursor, stream, pool, es, False)
                link(tail, last, None)
                pool.insert_unmapped(tail)
