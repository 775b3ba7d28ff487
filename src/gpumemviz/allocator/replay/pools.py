"""Which private pool each recorded allocation went to: `PoolPlan`, inferred from the recording.

A trace entry does not say which pool (`torch.cuda.MemPool`, a CUDA graph's) an alloc was
routed to, but the segments do: a snapshot names each segment's `segment_pool_id`, and every
alloc lands in a segment. So each segment's life in the trace (from the start or its
segment_alloc / segment_map to its segment_free / unmap) takes the pool of the final segment it
still is at the end; a segment that is gone by then takes the pool in force when it was made:
that of the nearest alloc in time (earlier first) whose segment is known, unless the trace
proves that pool was held when the segment was released (one of its segments sat entirely free
and stayed through that release): then the segments released together were a pool of their own,
deleted before the snapshot (an "unnamed" pool, id (-1, k), released after its last alloc).
An alloc's pool is its segment's; an OOM entry takes the pool of the alloc before it.
Newer torch writes a ``pool_id`` on each trace entry: where an entry has one, it is that entry's
pool (and its segment's, for a segment entry or the first alloc of a segment that is gone),
the inference above only filling in where entries have none.
docs/allocator.md, Replay: private pools, states the rule and its limits.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from gpumemviz.allocator.replay.layout import INACTIVE
from gpumemviz.allocator.replay.steps import Step

if TYPE_CHECKING:
    from gpumemviz.allocator.replay.layout import Layout
    from gpumemviz.snapshot.schema import TorchMapping

__all__ = ["PoolId", "PoolPlan", "plan_pools", "recorded_pools"]

PoolId = tuple[int, int]
_DEFAULT: PoolId = (0, 0)


def _pid(seg: TorchMapping) -> PoolId:
    p = seg.get("segment_pool_id") or _DEFAULT
    return (int(p[0]), int(p[1]))


class PoolPlan:
    """The pool of each alloc entry and of each segment at any point of one device's trace.

    `alloc[i]` is the private pool of alloc / oom entry i (None: the default pools, and for
    every other entry); `ids` the private pools seen; `segment(base, point)` the pool of the
    segment at `base` after entry `point` (-1: the start). `unnamed` maps each pool the
    snapshot no longer shows to the entry of its last alloc, after which it was deleted.
    `recorded[i]` is the ``pool_id`` trace entry i carries ((0, 0): the default pools; None
    where it has none), or `recorded` is None when no entry has one: the replay checks each
    alloc it places against it.
    """

    __slots__ = ("_lives", "alloc", "ids", "recorded", "unnamed")

    def __init__(
        self,
        alloc: list[PoolId | None],
        ids: list[PoolId],
        lives: dict[int, tuple[list[int], list[PoolId]]],
        unnamed: dict[PoolId, int] | None = None,
        recorded: list[PoolId | None] | None = None,
    ) -> None:
        self.alloc = alloc
        self.recorded = recorded
        self.ids = ids
        self._lives = lives
        self.unnamed = unnamed or {}

    def segment(self, base: int, point: int) -> PoolId:
        """The pool of the segment (or mapped run) starting at `base` after entry `point`."""
        life = self._lives.get(base)
        if life is None:
            return self._enclosing(base, point)
        k = bisect.bisect_right(life[0], point) - 1
        return life[1][max(k, 0)]

    def recorded_peaks(self, start: Layout, steps: Sequence[Step]) -> dict[PoolId, int]:
        """Each pool's peak reserved bytes in the recording ((0, 0): the default pools)."""
        cur: dict[PoolId, int] = {}
        for base in start.bases:
            pid = self.segment(base, -1)
            cur[pid] = cur.get(pid, 0) + start.segs[base].size
        peak = dict(cur)
        for j, (action, addr, size, _) in enumerate(steps):
            if action in ("segment_alloc", "segment_map"):
                pid = self.segment(addr, j)
                v = cur[pid] = cur.get(pid, 0) + size
                if v > peak.get(pid, 0):
                    peak[pid] = v
            elif action in ("segment_free", "segment_unmap"):
                pid = self.segment(addr, j - 1)
                cur[pid] = cur.get(pid, 0) - size
        return dict(sorted(peak.items()))

    def _enclosing(self, addr: int, point: int) -> PoolId:
        """A mapped run that starts inside a known range (expandable): that range's pool."""
        best: tuple[int, PoolId] | None = None
        for base, (starts, pids) in self._lives.items():
            if base <= addr and (best is None or base > best[0]):
                k = bisect.bisect_right(starts, point) - 1
                best = (base, pids[max(k, 0)])
        return best[1] if best is not None else _DEFAULT


class _Life:
    __slots__ = ("allocs", "base", "end", "freed", "pid", "start")

    def __init__(self, base: int, size: int, start: int) -> None:
        self.base = base
        self.end = base + size
        self.start = start
        self.freed = -1  # the segment_free entry that ended it (-1: alive at the end)
        self.pid: PoolId | None = None
        self.allocs: list[int] = []


def _nearest(known: list[tuple[int, PoolId]], i: int) -> PoolId:
    """The pool of the known alloc nearest to entry i, the earlier one first."""
    if not known:
        return _DEFAULT
    k = bisect.bisect_right(known, (i, (1 << 62, 0)))
    return known[k - 1][1] if k > 0 else known[0][1]


def _held(
    lives: Sequence[_Life], pid: PoolId, j: int, steps: Sequence[Step], layout_at: LayoutAt
) -> bool:
    """Did a segment of `pid` sit entirely free and stay through the release at entry j?"""
    lo = j
    while lo > 0 and steps[lo - 1][0] == "segment_free":
        lo -= 1
    hi = j
    while hi + 1 < len(steps) and steps[hi + 1][0] == "segment_free":
        hi += 1
    released = {steps[k][1] for k in range(lo, hi + 1)}
    lay = layout_at(lo - 1)
    for life in lives:
        if life.pid != pid or life.start >= lo or (0 <= life.freed < lo):
            continue
        seg = lay.segs.get(life.base)
        if seg is None or seg.expandable or life.base in released:
            continue
        if all(b[2] == INACTIVE for b in seg.blocks):
            return True
    return False


LayoutAt = Callable[[int], "Layout"]


def plan_pools(
    start: Layout,
    steps: Sequence[Step],
    final_segments: Iterable[TorchMapping],
    layout_at: LayoutAt | None = None,
    recorded: list[PoolId | None] | None = None,
) -> PoolPlan | None:
    """The pools of one device's trace, or None when neither its final segments nor its
    entries name a private pool.

    `start` is the reconstructed layout before the first entry, `final_segments` the
    snapshot's segments of the device, `layout_at(i)` the recorded layout after entry i (to
    tell a held pool from a freeable one; without it that test is skipped), `recorded[i]`
    the ``pool_id`` entry i carries (None where it has none; `recorded_pools` reads them).
    """
    finals = sorted((int(s["address"]), int(s["total_size"]), _pid(s)) for s in final_segments)
    named = recorded is not None and any(p not in (None, _DEFAULT) for p in recorded)
    if not named and all(p == _DEFAULT for _, _, p in finals):
        return None
    fbases = [f[0] for f in finals]

    def final_pid(addr: int) -> PoolId | None:
        k = bisect.bisect_right(fbases, addr) - 1
        if k >= 0 and addr < finals[k][0] + finals[k][1]:
            return finals[k][2]
        return None

    lives: list[_Life] = []
    live: dict[int, _Life] = {}
    bases: list[int] = []

    def open_(base: int, size: int, at: int) -> None:
        life = _Life(base, size, at)
        lives.append(life)
        if base not in live:
            bisect.insort(bases, base)
        live[base] = life

    def close(base: int, at: int) -> None:
        life = live.pop(base, None)
        if life is not None:
            life.freed = at
            del bases[bisect.bisect_left(bases, base)]

    for base in start.bases:
        open_(base, start.segs[base].size, -1)
    for i, (action, addr, size, _) in enumerate(steps):
        if action in ("segment_alloc", "segment_map"):
            open_(addr, size, i)
        elif action in ("segment_free", "segment_unmap"):
            close(addr, i)
        elif action == "alloc":
            k = bisect.bisect_right(bases, addr) - 1
            if k >= 0:
                life = live[bases[k]]
                if addr < life.end or life.base == addr:
                    life.allocs.append(i)
    for life in live.values():  # alive at the end: the snapshot names its pool
        life.pid = final_pid(life.base)
    told: set[int] = set()  # lives whose pool an entry names (kept, never renamed)
    if recorded is not None:
        for n, life in enumerate(lives):
            at = [life.start] if life.start >= 0 else []
            said = next((recorded[i] for i in at + life.allocs if recorded[i] is not None), None)
            if said is not None and life.pid is None:
                life.pid = said
                told.add(n)
    known = sorted((i, life.pid) for life in lives if life.pid is not None for i in life.allocs)
    unnamed: dict[PoolId, int] = {}
    by_burst: dict[tuple[PoolId, int], PoolId] = {}
    guesses = [life for life in lives if life.pid is None]
    for life in guesses:
        first = life.allocs[0] if life.allocs else life.start
        life.pid = _nearest(known, first)
    final_ids = {p for _, _, p in finals}
    for n in sorted(told):  # a named pool gone by the end whose segment was released: deleted
        life = lives[n]
        if life.pid not in final_ids and life.freed >= 0 and steps[life.freed][0] == "segment_free":
            assert life.pid is not None
            last_alloc = max(life.allocs, default=life.start)
            unnamed[life.pid] = max(unnamed.get(life.pid, -1), last_alloc)
    for life in guesses:
        assert life.pid is not None
        if (
            layout_at is None
            or life.pid == _DEFAULT
            or life.freed < 0
            or steps[life.freed][0] != "segment_free"
            or not _held(lives, life.pid, life.freed, steps, layout_at)
        ):
            continue
        lo = life.freed
        while lo > 0 and steps[lo - 1][0] == "segment_free":
            lo -= 1
        last_alloc = max(life.allocs, default=life.start)
        key = (life.pid, lo)
        if key not in by_burst:
            by_burst[key] = (-1, len(by_burst) + 1)
        life.pid = by_burst[key]
        unnamed[life.pid] = max(unnamed.get(life.pid, -1), last_alloc)
    alloc: list[PoolId | None] = [None] * len(steps)
    for life in lives:
        if life.pid != _DEFAULT:
            for i in life.allocs:
                alloc[i] = life.pid
    last: PoolId | None = None
    for i, step in enumerate(steps):  # an oom entry: the pool of the alloc before it
        said = recorded[i] if recorded is not None else None
        if said is not None and step[0] in ("alloc", "oom"):  # the entry names its pool
            alloc[i] = None if said == _DEFAULT else said
        if step[0] == "alloc":
            last = alloc[i]
        elif step[0] == "oom":
            alloc[i] = last
    by_base: dict[int, tuple[list[int], list[PoolId]]] = {}
    for life in sorted(lives, key=lambda x: x.start):
        starts, pids = by_base.setdefault(life.base, ([], []))
        starts.append(life.start)
        pids.append(life.pid or _DEFAULT)
    ids = sorted({p for _, _, p in finals if p != _DEFAULT} | {p for p in alloc if p is not None})
    return PoolPlan(alloc, ids, by_base, unnamed, recorded if named else None)


def recorded_pools(values: list[object]) -> list[PoolId | None] | None:
    """Each entry's ``pool_id`` (newer torch writes one per entry) as a pool id, None where an
    entry has none or an unreadable one (the inference decides there); None when no entry has
    one.

    Examples
    --------
    >>> recorded_pools([(1, 0), None, [0, 0], "x"])
    [(1, 0), None, (0, 0), None]
    >>> recorded_pools([None, None]) is None
    True
    """
    if values.count(None) == len(values):  # older torch: no entry has one (a C-level pass)
        return None
    out: list[PoolId | None] = []
    for v in values:
        pid: PoolId | None = None
        if isinstance(v, (tuple, list)) and len(v) == 2:
            a, b = v
            if type(a) is int and type(b) is int:
                pid = (a, b)
        out.append(pid)
    return out if any(p is not None for p in out) else None
