"""The start of a trace and its figures from each block's life: array passes over the columns.

The backward walk (reconstruct.py) undoes every entry on a layout, a few list moves in Python per
entry: about one model pass. Without expandable mappings a layout is only its segments and its
live blocks, the gaps between them being free (torch merges free neighbours at once), so the
whole story is a table of lives: each block lives from its alloc (or from before the trace) to
its free_completed (or past the end), each segment from its segment_alloc to its segment_free.
Sorting the entries by address gives those lives at once; what the walk decides, the size of
each block, follows from which blocks are alive next to it at one moment, asked of all blocks
together (`_Live`). Python then touches only what the start layout holds.

The answer is the walk's: the same start layout, and the figures the trace applied forwards
from it gives (which the walk proves entry by entry). Every check a forward pass makes is
made here too, on the whole table (each alloc at the start of a free gap, inside one segment
alive then, each free of a block in the right state, the lives of a segment holding its
blocks', the end matching the recorded segments); where one fails, or where the walk would
not prove itself exact (tests/allocator/test_replay_lives.py compares the two on every
recorded file), `reconstruct_lives` returns None and the caller walks.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator.replay.layout import ALLOCATED, INACTIVE, PENDING_FREE, Layout, Seg
from gpumemviz.allocator.rules import K_MIN_BLOCK_SIZE, K_SMALL_SIZE, page_size
from gpumemviz.snapshot.schema import ACTIONS

if TYPE_CHECKING:
    from gpumemviz.allocator.replay.steps import Rules
    from gpumemviz.snapshot import Trace

__all__ = ["Lives", "reconstruct_lives"]

BUDGET_PER_QUESTION = 64
"""Neighbours looked at per question, on average, before the walk is left to answer (`_scan`)."""

_INF = np.iinfo(np.int64).max


class Lives:
    """What `reconstruct_lives` found: `start` (the layout before the first entry) and, per
    entry, the change in allocated and reserved bytes it makes forwards and the segment count
    after it (int64 arrays)."""

    __slots__ = ("alloc_delta", "nsegs", "reserved_delta", "start")

    def __init__(
        self, start: Layout, alloc_delta: np.ndarray, reserved_delta: np.ndarray, nsegs: np.ndarray
    ):
        self.start = start
        self.alloc_delta = alloc_delta
        self.reserved_delta = reserved_delta
        self.nsegs = nsegs


class _Live:
    """Which of a set of lives are alive at a moment, asked for many at once.

    Each life has a key (an index into sorted distinct `values`: an address, or where a block
    ends), a first entry `born` (-1: before the trace) and a last one `gone` (`n`: past the
    end). "Alive at t" means in the layout before entry t: born < t <= gone. `apart`: the
    lives of one key never overlap in time (a block's lives at its address), so the last one
    born before t is the only one that may be alive then.
    """

    def __init__(
        self, keys: np.ndarray, born: np.ndarray, gone: np.ndarray, n: int, apart: bool = False
    ):
        self.span = n + 2  # born + 1 and gone + 1 lie in [0, n + 1]
        order = np.lexsort((born, keys))
        self.births = keys[order] * self.span + born[order] + 1
        self.keys = keys[order]
        self.gone = gone[order]
        self.deaths = None if apart else np.sort(keys * self.span + gone + 1)

    def alive(self, key: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether any life of `key` is alive at `t` (element-wise)."""
        q = key * self.span + t + 1
        born = np.searchsorted(self.births, q, "left")  # lives born before t, and all below
        if self.deaths is None:
            last = np.maximum(born - 1, 0)
            return (born > 0) & (self.keys[last] == key) & (self.gone[last] >= t)  # type: ignore[no-any-return]
        return born > np.searchsorted(self.deaths, q, "left")  # type: ignore[no-any-return]


def _scan(
    start: np.ndarray,
    step: int,
    go_on: Callable[[np.ndarray, np.ndarray], np.ndarray],
    test: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray | None:
    """Per question q, the first index from ``start[q]`` on, moving by `step`, that passes
    ``test(index, q)`` while ``go_on(index, q)`` holds, else -1 (both take arrays). None
    once the questions together have looked at more than `_budget` indices: a crowded trace
    costs more here than walking it, and the work stays linear in the trace."""
    out = np.full(len(start), -1, np.int64)
    todo = np.arange(len(start))
    cand = start.copy()
    left = _budget(len(start))
    while len(todo):
        c = cand[todo]
        keep = go_on(c, todo)
        todo, c = todo[keep], c[keep]
        left -= len(todo)
        if left < 0:
            return None
        hit = test(c, todo)
        out[todo[hit]] = c[hit]
        todo = todo[~hit]
        cand[todo] += step
    return out


def _budget(questions: int) -> int:
    """Indices `_scan` may look at for this many questions (a few each, on average)."""
    return BUDGET_PER_QUESTION * questions + 65536


def _first_above(
    values: np.ndarray,
    first: np.ndarray,
    limit: np.ndarray,
    test: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray | None:
    """Per question, the first of `values` (sorted) from index `first` on, at most `limit`,
    that passes ``test(index into values, question)``, else `_INF` (`_scan`)."""
    top = len(values) - 1

    def go_on(c: np.ndarray, q: np.ndarray) -> np.ndarray:
        return (c <= top) & (values[np.minimum(c, top)] <= limit[q])  # type: ignore[no-any-return]

    at = _scan(first, 1, go_on, test)
    if at is None:
        return None
    return np.where(at >= 0, values[np.maximum(at, 0)] if len(values) else _INF, _INF)


def reconstruct_lives(final: Layout, trace: Trace, rules: Rules) -> Lives | None:
    """The walk's start layout and figures, by array passes over `trace`'s columns.

    Parameters
    ----------
    final
        The layout after the last entry (left unchanged).
    trace
        The device's trace as columns (every entry with an address, size and stream).
    rules
        Rounding and max_split_size of the recorded settings.

    Returns
    -------
    Lives or None
        None where the trace maps expandable pages, where a check fails or where the walk
        would not be exact: the walk then answers (with its error, where there is one).
    """
    names = trace.action_names
    code = {name: names.index(name) if name in names else -1 for name in ACTIONS}
    act = np.asarray(trace.action, np.int64)
    n = len(act)
    if n == 0 or code["segment_map"] in act or code["segment_unmap"] in act:
        return None
    if any(seg.expandable for seg in final.segs.values()):
        return None
    addr, size, stream = trace.addr, trace.size, trace.stream
    segs = _segment_lives(final, act, addr, size, stream, code, n)
    if segs is None:
        return None
    blocks = _block_lives(final, act, addr, size, code, n)
    if blocks is None:
        return None
    sized = _sizes(blocks, segs, rules, n)
    if sized is None:
        return None
    start = _start_layout(segs, blocks, sized)
    if start is None:
        return None
    alloc_delta = np.zeros(n, np.int64)
    born, req_at = blocks["born"], blocks["requested"]
    traced = born >= 0
    alloc_delta[born[traced]] = sized[traced]
    freed = req_at >= 0
    freed &= req_at < n
    alloc_delta[req_at[freed]] = -sized[freed]
    grows = act == code["segment_alloc"]
    shrinks = act == code["segment_free"]
    reserved_delta = np.where(grows, size, 0) - np.where(shrinks, size, 0)
    nsegs = len(start.segs) + np.cumsum(grows.astype(np.int64) - shrinks)
    return Lives(start, alloc_delta, reserved_delta, nsegs)


_Table = dict[str, np.ndarray]


def _runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start of each run of equal `keys`, run id of each element) of sorted `keys`."""
    first = np.ones(len(keys), bool)
    first[1:] = keys[1:] != keys[:-1]
    return np.flatnonzero(first), np.cumsum(first) - 1


def _segment_lives(
    final: Layout,
    act: np.ndarray,
    addr: np.ndarray,
    size: np.ndarray,
    stream: np.ndarray,
    code: dict[str, int],
    n: int,
) -> _Table | None:
    """Each segment's lives: base, size, small, stream, born (its segment_alloc, -1: before
    the trace), gone (its segment_free, n + 1: past the end), sorted by base then born. A base
    may hold segments of other sizes in turn; no two alive at once may overlap."""
    at = np.flatnonzero((act == code["segment_alloc"]) | (act == code["segment_free"]))
    at = at[np.argsort(addr[at], kind="stable")]
    fbase = np.array(final.bases, np.int64)
    fsize = np.array([final.segs[b].size for b in final.bases], np.int64)
    fsmall = np.array([final.segs[b].small for b in final.bases], bool)
    fstream = np.array([final.segs[b].stream for b in final.bases], np.int64)
    grows = act[at] == code["segment_alloc"]
    base, sz = addr[at], size[at]
    starts, run = _runs(base)
    pos = np.arange(len(at)) - starts[run]
    if (grows != (grows[starts][run] ^ (pos % 2 == 1))).any():
        return None  # at one base, a segment_alloc and its segment_free take turns
    # lives: one per segment_alloc, one more where a base's first entry frees it (alive at
    # the start), and each recorded segment with no entry (alive throughout)
    opens = grows | (pos == 0)
    life = np.cumsum(opens) - 1
    m = int(opens.sum())
    if (sz != sz[opens][life]).any():
        return None  # a segment freed with another size than it was made with
    born = np.full(m, -1, np.int64)
    gone = np.full(m, n + 1, np.int64)
    born[life[grows]] = at[grows]
    gone[life[~grows]] = at[~grows]
    lbase, lsize, lstream = base[opens], sz[opens], stream[at][opens]
    alive_end = gone == n + 1
    in_final = np.isin(lbase, fbase)
    last = np.append(starts[1:], len(at))[: len(starts)] - 1
    if (np.isin(base[starts], fbase) != grows[last]).any():
        return None  # alive at the end, yet not a recorded segment, or the reverse
    where = np.searchsorted(fbase, lbase[alive_end])
    if not in_final[alive_end].all() or (fsize[where] != lsize[alive_end]).any():
        return None
    # a segment freed in the trace was small if it was one small page (the walk's rule); one
    # made in the trace is made as its entry says, and the recorded one must agree
    lsmall = lsize == page_size(True)
    made = born[alive_end] >= 0
    if (fsmall[where][made] != lsmall[alive_end][made]).any():
        return None
    if (fstream[where][made] != lstream[alive_end][made]).any():
        return None
    lsmall[alive_end] = fsmall[where]
    lstream[alive_end] = fstream[where]
    quiet = ~np.isin(fbase, base)
    q = int(quiet.sum())
    table = {
        "base": np.concatenate([lbase, fbase[quiet]]),
        "size": np.concatenate([lsize, fsize[quiet]]),
        "small": np.concatenate([lsmall, fsmall[quiet]]),
        "stream": np.concatenate([lstream, fstream[quiet]]),
        "born": np.concatenate([born, np.full(q, -1, np.int64)]),
        "gone": np.concatenate([gone, np.full(q, n + 1, np.int64)]),
    }
    order = np.lexsort((table["born"], table["base"]))
    table = {k: v[order] for k, v in table.items()}
    tb, te = table["base"], table["base"] + table["size"]
    tborn, tgone = table["born"], table["gone"]
    # no two lives overlap while both are alive: each against those starting inside it
    top = len(tb) - 1
    clash = _scan(
        np.arange(1, len(tb) + 1),
        1,
        lambda c, k: (c <= top) & (tb[np.minimum(c, top)] < te[k]),
        lambda c, k: (tborn[c] < tgone[k]) & (tborn[k] < tgone[c]),
    )
    if clash is None or (clash >= 0).any():
        return None
    return table


def _segment_of(
    segs: _Table, addr: np.ndarray, born: np.ndarray, gone: np.ndarray
) -> np.ndarray | None:
    """Per block life, the segment life holding it: covering its address, made before it
    and freed after it (the one alive then); None where one has none."""
    tb, te = segs["base"], segs["base"] + segs["size"]
    tborn, tgone = segs["born"], segs["gone"]
    last = np.searchsorted(tb, addr, "right") - 1
    k = _scan(
        last,
        -1,
        lambda c, q: c >= 0,
        lambda c, q: (
            (te[c] > addr[q])
            & ((tborn[c] < born[q]) | ((tborn[c] < 0) & (born[q] < 0)))
            & (tgone[c] > gone[q])
        ),
    )
    if k is None or (k < 0).any():
        return None
    return k


def _block_lives(
    final: Layout, act: np.ndarray, addr: np.ndarray, size: np.ndarray, code: dict[str, int], n: int
) -> _Table | None:
    """Each block's life from the alloc, free_requested and free_completed entries at its
    address: addr, born (the alloc, -1: before the trace), requested (the free_requested,
    -1: before the trace, n: never), gone (the free_completed, n: never), state at the start
    and at the end, requested size; each recorded active block with no entry alive throughout.
    Sorted by address then born."""
    kinds = np.full(len(act), -1, np.int64)
    for k, name in enumerate(("alloc", "free_requested", "free_completed")):
        if code[name] >= 0:
            kinds[act == code[name]] = k
    at = np.flatnonzero(kinds >= 0)
    at = at[np.argsort(addr[at], kind="stable")]
    kind, a = kinds[at], addr[at]
    starts, run = _runs(a)
    pos = np.arange(len(at)) - starts[run]
    if (kind != (kind[starts][run] + pos) % 3).any():  # alloc, free_requested, free_completed
        return None
    opens = (kind == 0) | (pos == 0)
    life = np.cumsum(opens) - 1
    m = int(opens.sum())
    born = np.full(m, -1, np.int64)
    requested = np.full(m, n, np.int64)
    gone = np.full(m, n, np.int64)
    alloc_size = np.full(m, -1, np.int64)
    done_size = np.full(m, -1, np.int64)
    first_kind = kind[opens]
    requested[first_kind == 2] = -1  # pending from before the trace
    sel = kind == 0
    born[life[sel]] = at[sel]
    alloc_size[life[sel]] = size[at[sel]]
    sel = kind == 1
    requested[life[sel]] = at[sel]
    sel = kind == 2
    gone[life[sel]] = at[sel]
    done_size[life[sel]] = size[at[sel]]
    laddr = a[opens]
    # the first entry at each address: the boundary hint reads it (`_sizes`)
    first_entry = np.full(m, _INF, np.int64)
    first_entry[life[starts]] = at[starts]
    # recorded active blocks (ascending: the bases are, and each segment's blocks)
    segments = [final.segs[base].blocks for base in final.bases]
    flat = chain.from_iterable(chain.from_iterable(segments))
    fb = np.fromiter(flat, np.int64).reshape(-1, 4)  # (address, size, state, requested)
    seg_of = np.repeat(np.arange(len(segments)), [len(blocks) for blocks in segments])
    free = fb[:, 2] == INACTIVE
    if (free[1:] & free[:-1] & (seg_of[1:] == seg_of[:-1])).any():
        return None  # two free neighbours: the walk keeps them apart
    faddr, fsize, fstate, freq = fb[~free].T
    alive_end = gone == n
    end_addr = laddr[alive_end]
    if not np.array_equal(np.sort(end_addr), np.sort(faddr[np.isin(faddr, a)])):
        return None  # alive at the end, yet not a recorded active block, or the reverse
    fi = np.searchsorted(faddr, end_addr)
    end_state = np.where(requested[alive_end] < n, PENDING_FREE, ALLOCATED)
    if (fstate[fi] != end_state).any():
        return None
    final_size = np.full(m, -1, np.int64)
    final_size[alive_end] = fsize[fi]
    req = np.where(done_size >= 0, done_size, -1)
    req[alive_end] = freq[fi]
    # the walk is exact only where an alloc's request is the block's recorded one
    traced = born >= 0
    if (alloc_size[traced] != req[traced]).any():
        return None
    quiet = ~np.isin(faddr, a)
    q = int(quiet.sum())
    table = {
        "addr": np.concatenate([laddr, faddr[quiet]]),
        "born": np.concatenate([born, np.full(q, -1, np.int64)]),
        "requested": np.concatenate(
            [requested, np.where(fstate[quiet] == PENDING_FREE, -1, n).astype(np.int64)]
        ),
        "gone": np.concatenate([gone, np.full(q, n, np.int64)]),
        "final_size": np.concatenate([final_size, fsize[quiet]]),
        "req": np.concatenate([req, freq[quiet]]),
        "alloc_size": np.concatenate([alloc_size, np.full(q, -1, np.int64)]),
        "done_size": np.concatenate([done_size, np.full(q, -1, np.int64)]),
        "first_entry": np.concatenate([first_entry, np.full(q, _INF, np.int64)]),
    }
    order = np.lexsort((table["born"], table["addr"]))
    return {k: v[order] for k, v in table.items()}


def _sizes(blocks: _Table, segs: _Table, rules: Rules, n: int) -> np.ndarray | None:
    """Each block life's size: where the trace allocs it, what the alloc carves from the free
    gap it starts (split or whole); where it was alive before the trace and freed in it, what
    the walk restores (the tail rule, the boundary hint); else the recorded size. None where
    a life lies outside the segment lives, or an alloc does not start a free gap it fits."""
    addr, born, gone = blocks["addr"], blocks["born"], blocks["gone"]
    k = _segment_of(segs, addr, born, gone)
    if k is None:
        return None
    small = segs["small"][k]
    seg_base, seg_end = segs["base"][k], segs["base"][k] + segs["size"][k]
    values, ukey = np.unique(addr, return_inverse=True)
    live = _Live(ukey, born, gone, n, apart=True)
    mss = rules.max_split_size
    size: np.ndarray = blocks["final_size"].copy()

    def rounded(requests: np.ndarray) -> np.ndarray:
        if not rules.divisions:  # `round_size` without roundup divisions, at C speed
            plain: np.ndarray = -(-requests // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
            at_least: np.ndarray = np.maximum(plain, K_MIN_BLOCK_SIZE)
            return at_least
        distinct, at = np.unique(requests, return_inverse=True)
        return np.array([rules.round(int(x)) for x in distinct], np.int64)[at]

    def first_live(q: np.ndarray, t: np.ndarray, limit: np.ndarray) -> np.ndarray | None:
        """The first live block start above each question's address, at most `limit`."""
        return _first_above(values, ukey[q] + 1, limit, lambda c, j: live.alive(c, t[j]))

    # blocks the trace allocs: carved at their alloc from the free gap they start
    q = np.flatnonzero(born >= 0)
    r = rounded(blocks["alloc_size"][q])
    a, end = addr[q], seg_end[q]
    never = ~small[q] & (r >= mss)  # oversize: never split
    known = np.where(small[q], a + r + K_MIN_BLOCK_SIZE - 1, a + r + K_SMALL_SIZE)
    known = np.where(never, end, known)  # a gap this short is handed out whole
    nxt = first_live(q, born[q], np.minimum(known, end - 1))
    if nxt is None:
        return None
    room = np.where(nxt != _INF, nxt - a, np.where(end <= known, end - a, _INF))
    if (room < r).any():
        return None
    carved = np.where(room == _INF, r, room)
    alive_end = gone[q] == n
    if (carved[alive_end] != size[q][alive_end]).any():
        return None  # the recorded block is not what the alloc carves
    size[q] = carved
    # blocks alive before the trace and freed in it: the walk's restored size
    q = np.flatnonzero((born < 0) & (gone < n))
    if len(q):
        r = rounded(blocks["done_size"][q])
        a, end, t = addr[q], seg_end[q], gone[q] + 1
        sm = small[q]
        wide = ~sm & (r < mss)
        known = np.where(sm, a + r - 1, np.where(wide, a + r + K_SMALL_SIZE, end))
        nxt = first_live(q, t, np.minimum(known, end - 1))
        if nxt is None:
            return None
        room = np.where(nxt != _INF, nxt - a, np.where(end <= known, end - a, _INF))
        restored = np.where(sm, r, room)
        if (sm & (room != _INF)).any():
            return None  # a live block, or the segment's end, inside the small block
        tail = wide & (room != _INF)  # the tail rule: at most 1 MiB would remain
        hint = wide & (room == _INF)
        restored[tail] = room[tail]
        if hint.any():
            # the boundary hint: the lowest address in (a + r, a + r + 1 MiB] with an entry
            # before the free
            ufirst = np.minimum.reduceat(
                blocks["first_entry"], np.unique(ukey, return_index=True)[1]
            )
            h = np.flatnonzero(hint)
            lo = np.searchsorted(values, a[h] + r[h], "right")
            x = _first_above(
                values, lo, a[h] + r[h] + K_SMALL_SIZE, lambda c, j: ufirst[c] < gone[q[h]][j]
            )
            if x is None:
                return None
            restored[h] = np.where(x != _INF, x - a[h], r[h])
        size[q] = restored
    # each alloc starts its gap: at its segment's base, or where a live block ends then
    ends, ekey = np.unique(addr + size, return_inverse=True)
    after = _Live(ekey, born, gone, n)
    q = np.flatnonzero(born >= 0)
    a = addr[q]
    e = np.searchsorted(ends, a)
    found = e < len(ends)
    found[found] = ends[e[found]] == a
    starts_gap = a == seg_base[q]
    check = ~starts_gap & found
    starts_gap[check] = after.alive(e[check], born[q][check])
    if not starts_gap.all():
        return None
    return size


def _start_layout(segs: _Table, blocks: _Table, size: np.ndarray) -> Layout | None:
    """The layout before the first entry: the segments alive then, each holding the blocks
    alive then and free gaps between them; None where a block lies outside them or two
    overlap."""
    first = blocks["born"] < 0
    addr, bsize = blocks["addr"][first], size[first]
    state = np.where(blocks["requested"][first] < 0, PENDING_FREE, ALLOCATED)
    req = blocks["req"][first]
    if (addr[1:] < addr[:-1] + bsize[:-1]).any():
        return None
    alive = segs["born"] < 0
    sbase, ssize = segs["base"][alive], segs["size"][alive]
    lo = np.searchsorted(addr, sbase, "left")
    hi = np.searchsorted(addr, sbase + ssize, "left")
    if int((hi - lo).sum()) != len(addr):
        return None  # a block alive at the start in no segment alive then
    held = hi > lo
    last = hi[held] - 1
    if (addr[last] + bsize[last] > (sbase + ssize)[held]).any():
        return None  # past its segment's end
    addr_l, size_l, state_l, req_l = addr.tolist(), bsize.tolist(), state.tolist(), req.tolist()
    out = []
    for base, total, small, stream, i, j in zip(
        sbase.tolist(),
        ssize.tolist(),
        segs["small"][alive].tolist(),
        segs["stream"][alive].tolist(),
        lo.tolist(),
        hi.tolist(),
        strict=True,
    ):
        at, row = base, []
        for k in range(i, j):
            x = addr_l[k]
            if x > at:
                row.append((at, x - at, INACTIVE, 0))
            row.append((x, size_l[k], state_l[k], req_l[k]))
            at = x + size_l[k]
        if at < base + total:
            row.append((at, base + total - at, INACTIVE, 0))
        out.append(Seg(stream, small, False, row))
    return Layout(out)
