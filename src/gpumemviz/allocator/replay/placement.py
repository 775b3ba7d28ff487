"""Where the model's segments go in a replay: the recorded addresses, and what the model holds.

`Provider` hands the model the base address of each new segment or expandable reservation (the
trace's next segment_alloc / segment_map, else an invented one), `Runs` counts segments as
snapshots show them, and `Reservations` says where each expandable reservation starts, as far
as the trace proves it. The driver (driver.py) uses all three.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpumemviz.allocator.addresses import DescendingAddresses, reservation_starts
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.allocator.replay.steps import Step
from gpumemviz.allocator.rules import page_size, reservation_size
from gpumemviz.allocator.trace import TraceRow

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchMapping

__all__ = ["INVENTED_TOP", "Provider", "ProviderState", "Reservations", "Runs"]

INVENTED_TOP = 1 << 60  # invented addresses live far above any real one


# `Provider.state()`: starts, ends, reserved, mapped runs, synced
ProviderState = tuple[list[int], list[int], set[int], "Runs", int]


class Provider:
    """Segment base addresses for the model: the recorded ones, else invented (descending).

    It keeps the address ranges the model holds (segments, and expandable reservations when
    the device total is known), so that a model that went its own way is never handed a
    recorded address it already uses (it gets an invented one instead). A reservation made by
    a malloc that then failed has no segment_map next to it: its base is the first later map
    of that stream and pool outside everything the model holds.
    """

    def __init__(self, steps: Sequence[Step], invent: bool, small_at: Callable[[int], bool]):
        self.steps = steps
        self.small_at = small_at  # pool of the segment_map at index j (from the alloc after it)
        self.window: Sequence[int] = ()  # indices of the segment entries next to the current alloc
        self.used: set[int] = set()
        self.pos = 0  # trace index of the current malloc
        self.small: bool | None = False  # its pool (None: read from the step at `pos`)
        self.invent = invent
        self.full = False  # reservations held with their whole extent (device total known)
        self.fallback = DescendingAddresses(INVENTED_TOP)
        self.surprises = 0  # the model asked when the trace shows nothing to answer with
        self.cut: list[tuple[str, int, int]] = []  # a new segment / map the cut hid (below)
        self.starts: list[int] = []  # ranges the model holds, sorted by start
        self.ends: list[int] = []
        self.reserved: set[int] = set()  # which of them are expandable reservations
        self.mapped = Runs(())  # the model's mapped expandable runs
        self.model: CachingAllocator | None = None
        self.synced = 0  # the model's trace_len() when its entries were last read

    def load(
        self,
        model: CachingAllocator,
        segments: Sequence[TorchMapping],
        bases: Sequence[tuple[int, bool, int]] = (),
    ) -> None:
        """Start over from a model loaded with `segments` and reservation `bases` (holding its
        reservations as `from_segments` builds them)."""
        self.model, self.synced = model, model.trace_len()
        self.starts, self.ends, self.reserved = [], [], set()
        self.mapped = Runs(segments)
        runs: dict[tuple[int, bool], list[tuple[int, int]]] = {}
        for seg in sorted(segments, key=lambda s: s["address"]):
            if seg.get("is_expandable"):
                key = (seg["stream"], seg["segment_type"] == "small")
                runs.setdefault(key, []).append((seg["address"], seg["total_size"]))
            else:
                self.hold(seg["address"], seg["total_size"])
        known: dict[tuple[int, bool], list[int]] = {}
        for stream, small, base in bases:
            known.setdefault((stream, small), []).append(base)
        for key in runs.keys() | known.keys():
            extent = self.extent(key[1])
            group = runs.get(key, [])
            if not extent:  # the model's reservations are not tracked: hold the runs
                for addr, size in group:
                    self.hold(addr, size)
                continue
            starts = reservation_starts([a for a, _ in group], sorted(known.get(key, ())), extent)
            for base in starts:
                self.hold(base, extent, reservation=True)

    def extent(self, small: bool) -> int:
        """Address space of one reservation (`rules.reservation_size`), or 0 when the total is
        unknown."""
        if not self.full or self.model is None:
            return 0
        page = page_size(small, self.model.config.large_segment_size)
        return reservation_size(self.model.device_total, page)

    def sync(self, entries: Sequence[TraceRow] | None = None) -> None:
        """Read the model's entries since the last look (or take them: `entries` must be
        exactly those): released segments, mapped runs, and reservations whose last page went
        (torch then releases the address space)."""
        model = self.model
        if model is None:
            return
        if entries is None:
            entries = model.trace_since(self.synced)
        touched = []
        for e in entries:
            a = e[0]
            if a == "segment_free":
                self.drop(e[1])
            elif a == "segment_map":
                self.mapped.map(e[1], e[2])
            elif a == "segment_unmap":
                self.mapped.unmap(e[1], e[2])
                touched.append(e[1])
        self.synced = model.trace_len()
        for addr in touched:
            i = bisect.bisect_right(self.starts, addr) - 1
            if (
                i >= 0
                and self.starts[i] in self.reserved
                and self.ends[i] > addr
                and not self.mapped.within(self.starts[i], self.ends[i])
            ):
                self.reserved.discard(self.starts[i])
                del self.starts[i], self.ends[i]

    def __call__(self, kind: str, size: int, stream: int) -> int:
        self.sync()
        expandable = kind != "segment"
        span = size if not expandable or self.full else 1
        if not self.invent:
            want = "segment_map" if expandable else "segment_alloc"
            for entry in self.cut:
                if entry[0] == want and not self.overlaps(entry[1], span):
                    self.cut.remove(entry)
                    self.hold(entry[1], span, reservation=expandable)
                    return entry[1]
            for j in self.window:
                if j not in self.used and self.steps[j][0] == want:
                    self.used.add(j)
                    addr = self.steps[j][1]
                    if not self.overlaps(addr, span):
                        self.hold(addr, span, reservation=expandable)
                        return addr
                    break
            else:
                if expandable and self.full:  # made by a malloc that failed: look ahead
                    steps = self.steps
                    small = self.small_at(self.pos - 1) if self.small is None else self.small
                    for j in range(self.pos + 1, len(steps)):
                        a, addr, _, st = steps[j]
                        if (
                            a == "segment_map"
                            and st == stream
                            and not self.overlaps(addr, 1)
                            and self.small_at(j) == small
                        ):
                            self.hold(addr, span, reservation=True)
                            return addr
            self.surprises += 1
        addr = self.fallback(kind, size, stream)
        self.hold(addr, span, reservation=expandable)
        return addr

    def overlaps(self, addr: int, size: int) -> bool:
        i = bisect.bisect_right(self.starts, addr)
        if i > 0 and self.ends[i - 1] > addr:
            return True
        return i < len(self.starts) and self.starts[i] < addr + size

    def hold(self, addr: int, size: int, reservation: bool = False) -> None:
        i = bisect.bisect_left(self.starts, addr)
        self.starts.insert(i, addr)
        self.ends.insert(i, addr + size)
        if reservation:
            self.reserved.add(addr)

    def drop(self, addr: int) -> None:
        i = bisect.bisect_left(self.starts, addr)
        if i < len(self.starts) and self.starts[i] == addr:
            del self.starts[i], self.ends[i]
            self.reserved.discard(addr)

    def state(self) -> ProviderState:
        return (
            self.starts[:],
            self.ends[:],
            set(self.reserved),
            copy.deepcopy(self.mapped),
            self.synced,
        )

    def restore(self, state: ProviderState, model: CachingAllocator) -> None:
        self.starts, self.ends, self.reserved, self.mapped, self.synced = state
        self.model = model


class Runs:
    """Count of segments as snapshots show them (expandable: one per mapped run)."""

    def __init__(self, segments: Sequence[TorchMapping]):
        self.plain = 0
        self.starts: list[int] = []
        self.ends: list[int] = []
        for s in sorted(segments, key=lambda s: s["address"]):
            if s.get("is_expandable"):
                self.map(s["address"], s["total_size"])
            else:
                self.plain += 1

    def __len__(self) -> int:
        return self.plain + len(self.starts)

    def map(self, addr: int, size: int) -> None:
        end = addr + size
        i = bisect.bisect_left(self.starts, addr)
        if i > 0 and self.ends[i - 1] == addr:
            i -= 1
            addr = self.starts[i]
            del self.starts[i], self.ends[i]
        if i < len(self.starts) and self.starts[i] == end:
            end = self.ends[i]
            del self.starts[i], self.ends[i]
        self.starts.insert(i, addr)
        self.ends.insert(i, end)

    def unmap(self, addr: int, size: int) -> None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0 or self.ends[i] < addr + size:
            return  # not ours to count (a model bug shows up in the scores instead)
        s, e = self.starts[i], self.ends[i]
        del self.starts[i], self.ends[i]
        for a, b in ((addr + size, e), (s, addr)):
            if b > a:
                self.starts.insert(i, a)
                self.ends.insert(i, b)

    def within(self, lo: int, hi: int) -> bool:
        """Does any mapped run reach into [lo, hi)?"""
        i = bisect.bisect_right(self.starts, lo) - 1
        if i >= 0 and self.ends[i] > lo:
            return True
        return i + 1 < len(self.starts) and self.starts[i + 1] < hi

    def apply(self, entries: Sequence[TraceRow]) -> None:
        for e in entries:
            a = e[0]
            if a == "segment_alloc":
                self.plain += 1
            elif a == "segment_free":
                self.plain -= 1
            elif a == "segment_map":
                self.map(e[1], e[2])
            elif a == "segment_unmap":
                self.unmap(e[1], e[2])


class Reservations:
    """Where each expandable reservation starts, as far as the trace proves it.

    A snapshot shows only mapped runs, and an expandable trace cut by the ring buffer may map
    pages below the lowest run it starts with. A reservation spans `extent` bytes, starts at
    or below every address mapped in its life, and lives while any page of it is mapped; a
    new one starts at its first map (torch's ExpandableSegment). So a map of a stream and
    pool that fits within one extent of a live reservation's mapped pages is in it, otherwise
    it starts a new one. Reservations alive together do not overlap: when the extent is the
    device's (`bounded`), one whose base is unknown ends at or below the next one above it.
    """

    def __init__(
        self,
        recording: Recording,
        start: Sequence[TorchMapping],
        small_at: Callable[[int], bool],
        extent: Callable[[bool], int],
        bounded: bool,
    ):
        """`start`: the recording's start state as segments (`recording.start_segments()`)."""
        self.lives: list[tuple[int, int, int, bool, int]] = []  # (from, to, stream, small, base)
        self.extent = extent
        done: list[tuple[list[Any], int]] = []  # (reservation, trace index it ended at)
        live: list[list[Any]] = []  # [from, stream, small, lowest, highest end, fixed, Runs]
        for seg in sorted(start, key=lambda s: s["address"]):
            if seg.get("is_expandable"):
                addr, size = seg["address"], seg["total_size"]
                small = seg["segment_type"] == "small"
                r = self._find(live, seg["stream"], small, addr, size, greedy=True)
                if r is None:
                    r = [-1, seg["stream"], small, addr, addr, False, Runs(())]
                    live.append(r)
                r[4] = addr + size
                r[6].map(addr, size)
        steps = recording.steps
        n = len(steps)
        mapping = recording.maps
        for j, (action, addr, size, stream) in enumerate(steps if mapping else ()):
            if action == "segment_map":
                small = small_at(j)
                r = self._find(live, stream, small, addr, size)
                if r is None:
                    r = [j, stream, small, addr, addr + size, True, Runs(())]
                    live.append(r)
                r[3], r[4] = min(r[3], addr), max(r[4], addr + size)
                r[6].map(addr, size)
            elif action == "segment_unmap":
                for r in live:
                    if r[1] == stream and r[6].within(addr, addr + size):
                        r[6].unmap(addr, size)
                        if not r[6].starts:  # its last page went: the reservation is released
                            live.remove(r)
                            done.append((r, j))
                        break
        done += [(r, n) for r in live]
        base: dict[int, int] = {}
        for r, to in sorted(done, key=lambda d: -d[0][3]):  # highest first
            b = r[3]
            if bounded and not r[5]:
                ext = extent(r[2])
                for q, qto in done:
                    if id(q) in base and q[3] > r[3] and q[0] < to and r[0] < qto:
                        b = min(b, base[id(q)] - ext)
                if b < r[4] - ext or b <= 0:  # the extent is smaller than the device's
                    b = r[3]
            base[id(r)] = b
            self.lives.append((r[0], to, r[1], r[2], b))

    def _find(
        self,
        live: list[list[Any]],  # the records of `_reservations` (mixed fields)
        stream: int,
        small: bool,
        addr: int,
        size: int,
        greedy: bool = False,
    ) -> list[Any] | None:
        """The live reservation a newly mapped [addr, addr+size) must be in, if any."""
        extent = self.extent(small)
        best: list[Any] | None = None
        for r in live:
            if r[1] != stream or r[2] != small:
                continue
            if r[5] or greedy:  # its base is known (greedy: the lowest run, as from_segments)
                fits = r[3] <= addr and addr + size <= r[3] + extent
            else:
                fits = max(r[4], addr + size) - min(r[3], addr) <= extent
            if fits and (best is None or abs(addr - r[3]) < abs(addr - best[3])):
                best = r
        return best

    def at(self, i: int) -> list[tuple[int, bool, int]]:
        """``(stream, small, base)`` of the reservations alive after trace entry i (-1: start)."""
        return [(st, sm, base) for frm, to, st, sm, base in self.lives if frm <= i < to]
