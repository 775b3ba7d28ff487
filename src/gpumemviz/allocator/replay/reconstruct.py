"""The state of a device at the start of its trace, by walking the trace backwards.

A recorded trace usually starts mid-story (ring buffer wrapped, recording switched on late), so
the segments at its start are not in the file. They follow from the final ``segments`` and the
trace, undoing each entry from the last to the first. The one real
ambiguity, the size of a block restored when undoing a free, is settled by the tail rule and the
boundary hint.
"""

from __future__ import annotations

import bisect
from bisect import bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator.replay.layout import (
    ALLOCATED,
    INACTIVE,
    PENDING_FREE,
    Block,
    Layout,
    LayoutError,
    Seg,
    block_address,
)
from gpumemviz.allocator.replay.steps import ALLOC_ACTIONS, SEGMENT_ACTIONS, Rules, Step, steps_of
from gpumemviz.allocator.replay.trail import Trail
from gpumemviz.allocator.rules import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_SIZE,
    is_small,
    page_size,
    should_split,
)

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchDict, TorchMapping

__all__ = ["ByAddress", "reconstruct", "reconstruct_layout"]

ByAddress = tuple[list[int], list[int], list[bool], np.ndarray]  # see `reconstruct_layout`
_GROWS = frozenset({"segment_alloc", "segment_map"})


def _what(i: int, step: Step) -> str:
    return f"trace event {i} ({step[0]} at {step[1]:#x}, {step[2]} B)"


class _Hints:
    """Where blocks started while a given block was live: the boundary hint.

    Built at the first question (many traces never ask one): the alloc, free_requested and
    free_completed entries sorted by address, then by position in the trace; with them from
    the trace's columns (`by_address`), the alloc that made the block each free releases.
    """

    def __init__(self, steps: Sequence[Step], by_address: ByAddress | None = None):
        self.steps = steps
        self.addrs: list[int] = []
        self.index: list[int] = []
        self.is_alloc: list[bool] = []
        self.since: np.ndarray | None = None  # per entry: the alloc it frees (-1: none)
        self.built = by_address is not None
        if by_address is not None:
            self.addrs, self.index, self.is_alloc, self.since = by_address

    def _build(self) -> None:
        steps = self.steps
        sel = [i for i, s in enumerate(steps) if s[0] in ALLOC_ACTIONS]
        addrs = [steps[i][1] for i in sel]
        order: Sequence[int]
        try:
            order = np.argsort(np.array(addrs, np.int64), kind="stable").tolist()
        except OverflowError:  # an address beyond int64: sort them as Python ints
            order = sorted(range(len(addrs)), key=addrs.__getitem__)
        self.addrs = [addrs[k] for k in order]
        self.index = [sel[k] for k in order]
        self.is_alloc = [steps[i][0] == "alloc" for i in self.index]
        self.built = True

    def boundary(
        self, addr: int, lo_end: int, hi_end: int, before: int, first: int = -1
    ) -> int | None:
        """The lowest block start X in (lo_end, hi_end] seen while the block at addr lived
        (freed at entry `before`); `first`, when known, is where `addrs` passes lo_end."""
        if not self.built:
            self._build()
        addrs, index = self.addrs, self.index
        since: int  # the alloc that made the block at addr
        if self.since is not None:
            since = int(self.since[before])
        else:
            lo = bisect.bisect_left(addrs, addr)
            k = bisect.bisect_left(index, before, lo, bisect.bisect_right(addrs, addr, lo)) - 1
            while k >= lo and not self.is_alloc[k]:
                k -= 1
            since = index[k] if k >= lo else -1
        j = first if first >= 0 else bisect.bisect_right(addrs, lo_end)
        while j < len(addrs) and addrs[j] <= hi_end:  # address by address, lowest first
            end = bisect.bisect_right(addrs, addrs[j], j)
            k = bisect.bisect_right(index, since, j, end)  # its first entry after `since`
            if k < end and index[k] < before:
                return addrs[j]
            j = end
        return None


def _restored_size(
    seg: Seg, end: int, addr: int, size: int, i: int, rules: Rules, hints: _Hints
) -> int:
    """Size of the block that a free at `addr` released (tail rule, boundary hint, oversize);
    the free block containing `addr` ends at `end`."""
    rounded = rules.round(size)
    if seg.small or seg.expandable:
        return rounded  # split whenever >= 512 B remain, so the block is exactly the request
    room = end - addr
    if rounded >= rules.max_split_size:
        return room  # oversize blocks are never split: the whole free run was the block
    rest = room - rounded
    if rest <= K_SMALL_SIZE:
        return room  # tail rule: a large-pool remainder <= 1 MiB is never a block of its own
    x = hints.boundary(addr, addr + rounded, addr + rounded + K_SMALL_SIZE, i)
    return rounded if x is None else x - addr


def _pool_of_range(lay: Layout, steps: Sequence[Step], i: int, rules: Rules) -> bool:
    """Small pool? for a mapped range restored by undoing an unmap at step i."""
    _, addr, size, stream = steps[i]
    for near in (lay.segment_at(addr - 1), lay.segs.get(addr + size)):
        if near is not None and near.expandable and near.stream == stream:
            return near.small
    for j in range(i - 1, -1, -1):  # the latest earlier alloc inside the range says
        a, x, sz, _ = steps[j]
        if a == "alloc" and addr <= x < addr + size:
            return is_small(rules.round(sz))
    return size % page_size(False) != 0


def reconstruct_layout(
    final: Layout,
    steps: Sequence[Step],
    rules: Rules,
    trail: Trail | None = None,
    by_address: ByAddress | None = None,
) -> Layout:
    """Undo `steps` from the last to the first on a copy of `final`.

    Parameters
    ----------
    final
        The layout after the last step (left unchanged).
    steps
        The trace as `steps_of` gives it.
    rules
        Rounding and max_split_size of the recorded settings.
    trail
        When given, filled with the figures and checkpoints of the layouts passed through,
        and with whether each step applied forwards retraces the walk (`Trail.exact`).
    by_address
        The alloc, free_requested and free_completed steps sorted by address, then index:
        (addresses, indices, is it an alloc, and per step the alloc that made the block a free
        releases), when the caller has them (`columns.by_address`); otherwise sorted from
        `steps` if the walk needs them.

    Returns
    -------
    Layout
        The layout before the first step.

    Raises
    ------
    LayoutError
        When a step does not fit (its index and what is wrong are in the message).
    """
    lay = final.copy()
    hints = _Hints(steps, by_address)
    if trail is None:
        for i in range(len(steps) - 1, -1, -1):
            _undo(lay, steps, i, rules, None, hints)
    else:
        _walk(lay, steps, rules, trail, hints)
    # a block still pending here had its free requested before the trace began (a deferred
    # free, or the ring buffer cut between the two entries): it starts active_pending_free
    return lay


def _undo(
    lay: Layout, steps: Sequence[Step], i: int, rules: Rules, trail: Trail | None, hints: _Hints
) -> None:
    """Undo step i on `lay` (every action, every check; the walk's own loop inlines the
    commonest cases of the first three)."""
    step = steps[i]
    action, addr, size, stream = step
    try:
        if action == "alloc":
            seg, k = lay.block_at(addr, "undo alloc")
            if trail is not None:
                trail.alloc_delta[i] = seg.blocks[k][1]
                if trail.exact:
                    _check_alloc(trail, seg, k, size, rules)
            lay.release_at(seg, k, "undo alloc")
        elif action == "free_completed":
            found = lay.segment_at(addr)
            if found is None:
                raise LayoutError(f"{addr:#x} is in no segment")
            seg = found
            blocks = seg.blocks
            k = seg.index(addr)
            b = blocks[k]
            if b[2] != INACTIVE:
                raise LayoutError(f"{addr:#x} is not free")
            bsize = _restored_size(seg, b[0] + b[1], addr, size, i, rules, hints)
            if trail is not None and _merges(blocks, k, b, addr, bsize):
                trail.exact = False
            lay.carve_at(seg, k, addr, bsize, PENDING_FREE, size, "undo free")
        elif action == "free_requested":
            seg, k = lay.block_at(addr, "undo free_requested")
            if trail is not None:
                if seg.blocks[k][2] != PENDING_FREE:
                    trail.exact = False
                trail.alloc_delta[i] = -seg.blocks[k][1]
            lay.set_state_at(seg, k, ALLOCATED, "undo free_requested")
        elif action in SEGMENT_ACTIONS:
            if trail is not None:
                before = Trail.window(lay, addr, size) if trail.exact else []
                trail.reserved_delta[i] = size if action in _GROWS else -size
            if action == "segment_alloc":
                lay.remove_segment(addr, size, "undo segment_alloc")
            elif action == "segment_free":
                small = size == page_size(True)
                lay.add_segment(addr, size, stream, small, "undo segment_free")
            elif action == "segment_map":
                lay.unmap_range(addr, size, "undo segment_map")
            else:
                small = _pool_of_range(lay, steps, i, rules)
                lay.map_range(addr, size, stream, small, "undo segment_unmap")
            if trail is not None and trail.exact:
                trail.check_segment_step(lay, before, steps, i, rules)
    except LayoutError as err:
        raise LayoutError(f"{_what(i, step)}: {err}") from None


def _merges(blocks: Sequence[Block], k: int, b: Block, addr: int, bsize: int) -> bool:
    """Whether the block [addr, +bsize) carved out of free block k (`b`) when undoing its free
    touches a free neighbour: forwards, that free would merge with it, and the walk keeps them
    apart."""
    return (k > 0 and addr == b[0] and blocks[k - 1][2] == INACTIVE) or (
        k + 1 < len(blocks) and addr + bsize == b[0] + b[1] and blocks[k + 1][2] == INACTIVE
    )


def _walk(lay: Layout, steps: Sequence[Step], rules: Rules, trail: Trail, hints: _Hints) -> None:
    """`reconstruct_layout` with a trail: `_undo` per step, except that an alloc, a
    free_completed and a free_requested that fit run inline on locals (most of a trace; a
    function call and two lookups fewer each; a free_completed's restored size too), a
    free_requested just before its free_completed with it. Anything else, a step that does
    not fit included, goes to `_undo`, which does the same and raises the same errors."""
    bases, segs, owned = lay.bases, lay.segs, lay.owned
    alloc_delta, seg_at, seg_count = trail.alloc_delta, trail.seg_at, trail.seg_count
    exact = trail.exact  # a local copy, stored back wherever it is cleared
    rounded, round_, mss = rules.rounded, rules.round, rules.max_split_size
    # without roundup divisions a request rounds up to 512 bytes (`rules.round_size`): that
    # sum, inline, costs less than the cache's look-up (most sizes of a long trace differ)
    plain = not rules.divisions
    next_at = trail.next_at
    boundary = hints.boundary
    # the sorted addresses `boundary` reads, when already sorted (`by_address`): a window
    # holding no address at all needs no call (most restored sizes)
    haddrs = hints.addrs if hints.built else None
    skip = -1  # a free_requested undone with the free_completed after it
    for i in range(len(steps) - 1, -1, -1):
        if i == skip:
            if i <= next_at or i == 0:
                trail.checkpoint(lay, i)
                next_at = trail.next_at
                owned = lay.owned
            continue
        action, addr, size, _ = steps[i]
        if action in ALLOC_ACTIONS and (j := bisect_right(bases, addr) - 1) >= 0:
            seg = segs[bases[j]]
            blocks = seg.blocks
            k = bisect_right(blocks, addr, key=block_address) - 1  # >= 0: the seg starts <= addr
            b = blocks[k]
            state = b[2]
            if action == "alloc" and b[0] == addr and state != INACTIVE:
                bsize = b[1]
                alloc_delta[i] = bsize
                prev_free = k > 0 and blocks[k - 1][2] == INACTIVE
                next_free = k + 1 < len(blocks) and blocks[k + 1][2] == INACTIVE
                if exact:  # `_check_alloc`, inlined
                    if state != ALLOCATED or b[3] != size or prev_free:
                        exact = trail.exact = False
                    else:
                        room = bsize + blocks[k + 1][1] if next_free else bsize
                        if plain:
                            r = (size + 511) & -512 if size > 512 else 512
                        else:
                            r = rounded.get(size) or round_(size)
                        if seg.small or seg.expandable:
                            split = room - r >= K_MIN_BLOCK_SIZE
                        else:
                            split = r < mss and room - r > K_SMALL_SIZE
                        if (r if split else room) != bsize:
                            exact = trail.exact = False
                # `Layout.release_at`, inlined. An owned segment was copied by this walk
                # (`Layout.own`, inlined too), so no one has cached its dict: nothing to drop
                if seg not in owned:
                    blocks = blocks[:]
                    segs[bases[j]] = seg = Seg(seg.stream, seg.small, seg.expandable, blocks)
                    owned.add(seg)
                start, merged, req, lo, hi = addr, bsize, 0, k, k + 1
                if next_free:
                    merged += blocks[k + 1][1]
                    hi += 1
                if prev_free:
                    p = blocks[k - 1]
                    start, merged, req, lo = p[0], p[1] + merged, p[3], k - 1
                blocks[lo:hi] = [(start, merged, INACTIVE, req)]
            elif action == "free_requested" and b[0] == addr and state != INACTIVE:
                if state != PENDING_FREE:
                    exact = trail.exact = False
                alloc_delta[i] = -b[1]
                if seg not in owned:
                    blocks = blocks[:]
                    segs[bases[j]] = seg = Seg(seg.stream, seg.small, seg.expandable, blocks)
                    owned.add(seg)
                blocks[k] = (addr, b[1], ALLOCATED, b[3])
            elif action == "free_completed" and state == INACTIVE and addr < (end := b[0] + b[1]):
                # `_restored_size`, inlined
                if plain:
                    r = (size + 511) & -512 if size > 512 else 512
                else:
                    r = rounded.get(size) or round_(size)
                if seg.small or seg.expandable:
                    bsize = r
                elif r >= mss or end - addr - r <= K_SMALL_SIZE:
                    bsize = end - addr  # oversize, or the tail rule
                elif haddrs is not None and (
                    (w := bisect_right(haddrs, addr + r)) == len(haddrs)
                    or haddrs[w] > addr + r + K_SMALL_SIZE
                ):
                    bsize = r  # no block starts in the window: `boundary` says None
                else:
                    x = boundary(
                        addr, addr + r, addr + r + K_SMALL_SIZE, i, -1 if haddrs is None else w
                    )
                    bsize = r if x is None else x - addr
                if addr + bsize > end:
                    _undo(lay, steps, i, rules, trail, hints)  # not inside the block: it says so
                else:
                    if (k > 0 and addr == b[0] and blocks[k - 1][2] == INACTIVE) or (
                        addr + bsize == end and k + 1 < len(blocks) and blocks[k + 1][2] == INACTIVE
                    ):  # `_merges`, inlined
                        exact = trail.exact = False
                    if seg not in owned:  # `Layout.carve_at` and `Layout.own`, inlined
                        blocks = blocks[:]
                        segs[bases[j]] = seg = Seg(seg.stream, seg.small, seg.expandable, blocks)
                        owned.add(seg)
                    state = PENDING_FREE
                    if (
                        i > next_at
                        and i > 0  # no checkpoint between the two
                        and (before := steps[i - 1])[0] == "free_requested"
                        and before[1] == addr
                    ):  # freed at once: undo its free_requested too, as `_undo` would
                        state = ALLOCATED
                        skip = i - 1
                        alloc_delta[skip] = -bsize
                    new = [(addr, bsize, state, size)]
                    if addr > b[0]:
                        new.insert(0, (b[0], addr - b[0], INACTIVE, 0))
                    if addr + bsize < end:
                        new.append((addr + bsize, end - addr - bsize, INACTIVE, 0))
                    blocks[k : k + 1] = new
            else:
                _undo(lay, steps, i, rules, trail, hints)
                exact = trail.exact
        else:
            if action in SEGMENT_ACTIONS:  # the only entries that change the count
                seg_at.append(i)
                seg_count.append(len(segs))
            _undo(lay, steps, i, rules, trail, hints)
            exact = trail.exact
        if i <= next_at or i == 0:
            trail.checkpoint(lay, i)
            next_at = trail.next_at
            owned = lay.owned  # the copy left every segment shared: a new set
    trail.finish(len(segs))


def _check_alloc(trail: Trail, seg: Seg, k: int, size: int, rules: Rules) -> None:
    """Clear `trail.exact` unless the alloc, applied forwards once block k of `seg` is freed
    (and merged), carves exactly that block again (state, size, requested size)."""
    blocks = seg.blocks
    b = blocks[k]
    if b[2] != ALLOCATED or b[3] != size or (k > 0 and blocks[k - 1][2] == INACTIVE):
        trail.exact = False
        return
    room = b[1]
    if k + 1 < len(blocks) and blocks[k + 1][2] == INACTIVE:
        room += blocks[k + 1][1]
    rounded = rules.round(size)
    split = should_split(
        room,
        rounded,
        small=seg.small,
        expandable=seg.expandable,
        max_split_size=rules.max_split_size,
    )
    if (rounded if split else room) != b[1]:
        trail.exact = False


def reconstruct(
    segments: Sequence[TorchMapping],
    trace: Sequence[TorchMapping],
    *,
    device: int = 0,
    settings: TorchMapping | None = None,
) -> list[TorchDict]:
    """Segments of `device` at the start of its trace, in torch's snapshot format.

    Parameters
    ----------
    segments
        The snapshot's final ``segments`` (any devices; only `device`'s are used).
    trace
        That device's ``device_traces`` entry list, oldest first.
    device
        Which device.
    settings
        The snapshot's ``allocator_settings`` (roundup divisions and max_split_size decide
        block sizes); None for torch's defaults.

    Returns
    -------
    list of dict
        Torch-format segment dicts; blocks allocated before the trace began are
        ``active_allocated`` with the requested size their free recorded
        (``active_pending_free`` when that free was requested before the trace began).

    Raises
    ------
    LayoutError
        When an entry does not fit the state (the message names the entry).

    Examples
    --------
    >>> seg = {"device": 0, "address": 0x7F0000000000, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "small", "blocks": [
    ...            {"address": 0x7F0000000000, "size": 2 << 20, "state": "inactive"}]}
    >>> trace = [{"action": "free_requested", "addr": 0x7F0000000000, "size": 100},
    ...          {"action": "free_completed", "addr": 0x7F0000000000, "size": 100}]
    >>> [(b["size"], b["state"]) for b in reconstruct([seg], trace)[0]["blocks"]]
    [(512, 'active_allocated'), (2096640, 'inactive')]
    """
    mine = [s for s in segments if int(s.get("device", 0)) == device]
    final = Layout.from_segments(mine)
    start = reconstruct_layout(final, steps_of(trace), Rules.from_settings(settings))
    return start.to_segments(device)
