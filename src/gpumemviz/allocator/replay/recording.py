"""The recorded history of one device, at the recorded addresses, after every entry.

This is the ground truth the model is scored against, and what the panel scrubs through:
`snapshot_at(i)` restores the nearest checkpoint and applies the few entries after it. Its
figures and checkpoints come from the reconstruction's walk backwards where that walk is proven
to be what applying the trace forwards gives (trail.py); otherwise from a forward pass. A
recording that is read for its figures (`seekable=False`: a replay, a report) takes them from
the blocks' lives where it can (lives.py, array passes) and makes its checkpoints at its first
seek.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumemviz.allocator.replay.columns import (
    alloc_entries,
    by_address,
    freed_at_once,
    steps_from_columns,
)
from gpumemviz.allocator.replay.forward import apply_step
from gpumemviz.allocator.replay.layout import Layout, LayoutError
from gpumemviz.allocator.replay.lives import reconstruct_lives
from gpumemviz.allocator.replay.pools import PoolPlan, plan_pools, recorded_pools
from gpumemviz.allocator.replay.reconstruct import reconstruct_layout
from gpumemviz.allocator.replay.steps import Rules, Step, steps_of
from gpumemviz.allocator.replay.trail import Trail, spacing
from gpumemviz.snapshot.gc_pause import PROMOTE_OVER, no_gc, promote

if TYPE_CHECKING:
    from gpumemviz.allocator.config import AllocatorConfig
    from gpumemviz.snapshot import Trace
    from gpumemviz.snapshot.schema import TorchDict, TorchList, TorchMapping

__all__ = ["Recording", "apply_step"]

_GROWS = ("segment_alloc", "segment_map")
Alloc = tuple[int, int, "TorchList"]  # (entry index, address, frames) of an alloc entry
_Stacks = tuple[dict[int, tuple[list[int], list["TorchList"]]], dict[int, "TorchList"]]
_SHRINKS = ("segment_free", "segment_unmap")


def _dict_allocs(trace: list[TorchDict]) -> list[Alloc]:
    """`alloc_entries` of a trace held as torch's entry dicts."""
    return [
        (i, int(e["addr"]), e.get("frames") or [])
        for i, e in enumerate(trace)
        if e.get("action") == "alloc"
    ]


def _freed_at_once(steps: Sequence[Step]) -> list[bool]:
    """`columns.freed_at_once` read from the steps (a recording without columns)."""
    n = len(steps)
    out = [False] * n
    for i in range(n - 1):
        action, addr, _, _ = steps[i]
        if action == "free_requested" and steps[i + 1][0] == "free_completed":
            if steps[i + 1][1] != addr:
                continue
            j = i + 2
            while j < n and steps[j][0] == "free_completed":
                j += 1
            out[i] = j == n or steps[j][0] not in _WAITS
    return out


_WAITS = ("segment_free", "segment_unmap", "oom")  # a free before these may have waited


def _device_settings(snapshot: TorchMapping) -> TorchMapping | None:
    return snapshot.get("allocator_settings") if isinstance(snapshot, Mapping) else None


class Recording:
    """One device's recorded layouts after every trace entry, with checkpoints for fast jumps.

    Build it with `Recording.from_snapshot` (it reconstructs the start and checks that the
    trace applied forwards at the recorded addresses ends on the recorded final segments:
    proven entry by entry during the reconstruction, or by a forward pass). Index ``i``
    means "after trace entry i"; ``-1`` is the reconstructed state at the start of the trace.
    ``len()`` is the number of entries; `reserved`, `allocated` and `segments` are numpy
    arrays of the recorded figures after each entry; `start` and `final` are the first and
    last `Layout`; `layout_at`, `snapshot_at` and `frames_after` jump to any entry. `pools`
    (from `from_snapshot`) is the private pool of each alloc (`pools.PoolPlan`), or None.
    """

    def __init__(
        self,
        start: Layout,
        steps: Sequence[Step],
        rules: Rules,
        *,
        device: int = 0,
        settings: TorchMapping | None = None,
        every: int = 128,
        seekable: bool = True,
        walked: tuple[Trail, Layout] | None = None,
        trace: list[TorchDict] | None = None,
        columns: Trace | None = None,
        segments: Iterable[TorchMapping] = (),
        allocs: Iterable[tuple[int, int, TorchList]] | Callable[[], Iterable[Alloc]] = (),
    ):
        """`walked`: the trail of the walk that reconstructed `start` and the final layout it
        began from; used when the trail is exact, else the trace is applied forwards.
        `seekable`: False when the walk kept no checkpoint past the start (what a replay or a
        report reads are the figures): `layout_at` then makes them, forwards from the start,
        as far as it is first asked to go.

        `trace` (the entries as torch dicts) or `columns` (the trace as a `Snapshot`'s
        columns) is what `snapshot_at` hands out as ``device_traces``; without either, dicts
        are built from `steps`. `segments` (the final ones) and `allocs` (index, address,
        frames of each alloc entry, or a function giving them) give the blocks' stacks
        (`frames_after`): read at its first call, which `replay` never makes (a dict and two
        lists per address that only a seek reads).
        """
        self.device = device
        self.steps = list(steps)
        self.rules = rules
        self.settings = settings
        self.every = every
        self.start = start.copy()
        self._checkpoints: list[Layout] = []
        self._checkpoint_at: list[int] = []  # the entry each checkpoint is the layout before
        # the entry of the next checkpoint `layout_at` makes forwards (-1: all are made); the
        # lock keeps two threads (a sampler's and the kernel's) from making the same ones
        self._unmade = -1
        self._making = threading.Lock()
        if walked is not None and walked[0].exact:
            self._from_trail(*walked)
            if not seekable and len(self.steps):
                self._unmade = spacing(self._checkpoints[-1].copy(), every)
        else:
            self._forward(start)
        self._trace = trace
        self._columns = columns  # the trace's columns, when built from them
        # allocation stacks: per address, the alloc entries there (indices, frames) and the
        # stacks of blocks alive before the trace (the layout itself carries none), from
        # these sources at the first `frames_after`
        self._frame_sources = (list(segments), allocs)
        self._stacks: _Stacks | None = None
        # which private pool each alloc went to (None: the segments name none)
        self.pools: PoolPlan | None = None
        self._start_segments: list[TorchDict] | None = None  # `start_segments`, once built
        self._kinds: frozenset[str] | None = None  # the actions present, once read
        self._at_once: list[bool] | None = None  # `freed_at_once`, once read

    def _from_trail(self, trail: Trail, final: Layout) -> None:
        """The figures and checkpoints the backward walk kept (it proved that applying each
        entry forwards retraces it, so they are the forward pass's), ending on `final`."""
        reserved, allocated, _ = self.start.totals()
        self.reserved = reserved + np.cumsum(np.frombuffer(trail.reserved_delta, np.int64))
        self.allocated = allocated + np.cumsum(np.frombuffer(trail.alloc_delta, np.int64))
        self.segments = trail.nsegs
        self._checkpoints = trail.checkpoints
        self._checkpoint_at = trail.checkpoint_at
        self.final = final

    def _forward(self, start: Layout) -> None:
        """Apply every entry forwards from `start`: figures after each, checkpoints, `final`."""
        n = len(self.steps)
        # C arrays while filling: 8 bytes an entry as numpy's, but item assignment is faster
        res = array("q", bytes(8 * n))
        alc = array("q", bytes(8 * n))
        nsegs = array("q", bytes(8 * n))
        lay = start.copy()
        reserved, allocated, _ = lay.totals()
        self._checkpoints = []
        self._checkpoint_at = []
        steps, rules = self.steps, self.rules
        at = 0
        with no_gc():  # a list per block: the cyclic GC would rescan them all, often
            for i in range(n):
                if i == at:
                    at = i + spacing(lay, self.every)
                    self._checkpoints.append(lay.copy())
                    self._checkpoint_at.append(i)
                action, _addr, size, _ = steps[i]
                try:
                    allocated += apply_step(lay, steps, i, rules)
                except LayoutError as err:
                    raise LayoutError(f"trace event {i} ({action}): {err}") from None
                if action in _GROWS:
                    reserved += size
                elif action in _SHRINKS:
                    reserved -= size
                res[i] = reserved
                alc[i] = allocated
                nsegs[i] = len(lay.segs)
        self.reserved = np.frombuffer(res, dtype=np.int64)
        self.allocated = np.frombuffer(alc, dtype=np.int64)
        self.segments = np.frombuffer(nsegs, dtype=np.int64)
        self.final = lay

    @classmethod
    def from_snapshot(
        cls,
        snapshot: TorchMapping,
        device: int = 0,
        *,
        columns: Trace | None = None,
        config: AllocatorConfig | None = None,
        seekable: bool = True,
        **kw: Any,  # Any: `__init__`'s options
    ) -> Recording:
        """Reconstruct the start of `device`'s trace, and its layout after every entry.

        Parameters
        ----------
        snapshot
            A torch snapshot dict (``segments`` and ``device_traces``).
        device
            Which device's trace.
        columns
            That trace as a `Snapshot`'s columns (then the dict's ``device_traces`` entries
            are not read; `snapshot_at` hands out the dict's own entries where it holds them,
            else builds entry dicts when first asked).
        config
            The dict's ``allocator_settings`` already parsed (a `Snapshot`'s `config`, or the
            replay's recorded settings); None: parsed here.
        seekable
            False where the caller reads the figures and seeks rarely if ever (a replay, a
            report): the walk keeps no checkpoints (a copy of each segment it changes, per
            checkpoint), and `layout_at` makes them forwards when first asked.
        **kw
            ``every``: checkpoint spacing in trace entries (default 128; heavier layouts
            get wider spacing, up to `MAX_SPACING`).

        Examples
        --------
        >>> base = 0x7F0000000000
        >>> snap = {"segments": [{"device": 0, "address": base, "total_size": 2 << 20,
        ...     "stream": 0, "segment_type": "small", "blocks": [
        ...         {"address": base, "size": 512, "requested_size": 100,
        ...          "state": "active_allocated"},
        ...         {"address": base + 512, "size": (2 << 20) - 512, "state": "inactive"}]}],
        ...     "device_traces": [[
        ...         {"action": "segment_alloc", "addr": base, "size": 2 << 20, "stream": 0},
        ...         {"action": "alloc", "addr": base, "size": 100, "stream": 0}]]}
        >>> tl = Recording.from_snapshot(snap)
        >>> len(tl.snapshot_at(-1)["segments"]), len(tl.snapshot_at(1)["segments"])
        (0, 1)
        """
        settings = _device_settings(snapshot)
        rules = Rules(config) if config is not None else Rules.from_settings(settings)
        segs = [s for s in snapshot["segments"] if int(s.get("device", 0)) == device]
        final = Layout.from_segments(segs)
        trace: list[TorchDict] | None = None
        steps = steps_from_columns(columns) if columns is not None else None
        if steps is None:
            if columns is not None:
                trace = columns.entries()
            else:
                traces = snapshot.get("device_traces") or []
                trace = list(traces[device]) if device < len(traces) else []
            steps = steps_of(trace)
        lives = None
        if not seekable and trace is None and columns is not None:
            lives = reconstruct_lives(final, columns, rules)  # None: the walk answers
        if lives is not None:
            start = lives.start
            trail = Trail.filled(lives.alloc_delta, lives.reserved_delta, lives.nsegs, start)
        else:
            trail = Trail(len(steps), kw.get("every", 128) if seekable else len(steps) + 1)
            sorted_steps = by_address(columns) if trace is None and columns is not None else None
            start = reconstruct_layout(final, steps, rules, trail, sorted_steps)
        allocs: Callable[[], Iterable[Alloc]]  # read at the first seek, if any
        if trace is not None:
            allocs = partial(_dict_allocs, trace)
        else:
            assert columns is not None  # steps came from them
            allocs = partial(alloc_entries, columns)
        entries = trace
        held = snapshot.get("device_traces") or []
        if trace is None and device < len(held) and len(held[device]) == len(steps):
            entries = list(held[device])  # a dict's own entries: `snapshot_at` reads them
        tl = cls(
            start,
            steps,
            rules,
            device=device,
            settings=settings,
            seekable=seekable,
            walked=(trail, final),
            trace=entries,
            columns=columns,
            segments=segs,
            allocs=allocs,
            **kw,
        )
        if trace is not None:
            said = [e.get("pool_id") for e in trace]
        else:
            assert columns is not None  # steps came from them
            said = columns.values("pool_id")
        tl.pools = plan_pools(start, steps, segs, tl.layout_at, recorded_pools(said))
        if tl.final is final:  # the walk's trail was exact: it began from `final`
            return tl
        got, want = tl.final.key(requested=False), final.key(requested=False)
        if got != want:
            diff = [a[0] for a, b in zip(got, want, strict=False) if a != b]
            longer = got if len(got) > len(want) else want
            where = diff[0] if diff else longer[min(len(got), len(want))][0]
            raise LayoutError(
                f"device {device}: replaying the trace from the reconstructed start does not "
                f"give the recorded final segments (first difference at segment {where:#x})"
            )
        return tl

    def _keep_frames(self) -> _Stacks:
        """Where each block's stack comes from: its trace `alloc` entry (index, address,
        frames), except that a block alive at the end (or since before the trace) takes the
        file's stack at its address, which is what torch stored for it. Built once, into
        locals first (a sampler thread may ask at the same time: both build the same)."""
        if self._stacks is not None:
            return self._stacks
        with no_gc():
            stacks = self._build_frames()
        # a one-off build kept for good (two lists per address), made in a seek's own pause:
        # made old at once, or the next collections would scan it all (a 0.12 s pause in a
        # later seek at 10^6 entries)
        if len(stacks[0]) > PROMOTE_OVER // 3:
            promote()
        return stacks

    def _build_frames(self) -> _Stacks:
        """`_keep_frames`' table, built."""
        segments, allocs = self._frame_sources
        by_addr: dict[int, tuple[list[int], list[TorchList]]] = {}
        start_frames: dict[int, TorchList] = {}
        for i, addr, frames in allocs() if callable(allocs) else allocs:
            at, stacks = by_addr.setdefault(addr, ([], []))
            at.append(i)
            stacks.append(frames)
        for s in segments:
            addr = int(s["address"])
            for b in s["blocks"]:
                if b["state"] != "inactive":
                    hist = b.get("history") or [{}]  # torch 2.0 keeps the stack there
                    here = int(b.get("address", addr))
                    frames = b.get("frames") or hist[0].get("frames") or []
                    got = by_addr.get(here)
                    if got:  # the last alloc here made the block that is still alive
                        got[1][-1] = frames
                    else:
                        start_frames[here] = frames
                addr += int(b["size"])
        self._stacks = (by_addr, start_frames)
        return self._stacks

    def frames_after(self, event_index: int) -> Callable[[int], TorchList]:
        """``frames(address)``: the stack of the active block there after `event_index`.

        What `snapshot_at` hands to `Layout.to_segments` (usable with `layout_at` too).
        """

        by_addr, start_frames = self._keep_frames()

        def frames(addr: int) -> TorchList:
            got = by_addr.get(addr)
            if got is not None:
                j = bisect.bisect_right(got[0], event_index) - 1
                if j >= 0:
                    return got[1][j]
            return start_frames.get(addr, [])

        return frames

    def __len__(self) -> int:
        return len(self.steps)

    def start_segments(self) -> list[TorchDict]:
        """`start` as torch segment dicts of this device, built at the first call (every
        replay pass loads its model from them): read them, do not modify."""
        if self._start_segments is None:
            self._start_segments = self.start.to_segments(self.device)
        return self._start_segments

    def freed_at_once(self) -> list[bool]:
        """Per entry: a free_requested whose free_completed (same address) comes next, with no
        release or oom after the free_completed entries that follow (the block is freed at
        once; before a release it may have waited on events until it). Read once, from the
        columns where the recording has them, and shared by every replay pass."""
        if self._at_once is None:
            if self._columns is not None:
                self._at_once = freed_at_once(self._columns)
            else:
                self._at_once = _freed_at_once(self.steps)
        return self._at_once

    def _actions(self) -> frozenset[str]:
        """The actions the trace's entries have, read once (from the columns where it has
        them: one numpy pass)."""
        if self._kinds is None:
            if self._columns is not None:
                names = self._columns.action_names
                self._kinds = frozenset(names[a] for a in np.unique(self._columns.action))
            else:
                self._kinds = frozenset(map(itemgetter(0), self.steps))  # (C loops)
        return self._kinds

    @property
    def first_oom(self) -> int | None:
        """The index of the first ``oom`` entry (the recorded OOM), or None."""
        if "oom" not in self._actions():
            return None
        if self._columns is not None:  # one numpy pass
            oom = self._columns.action_names.index("oom")
            return int(np.flatnonzero(self._columns.action == oom)[0])
        return list(map(itemgetter(0), self.steps)).index("oom")  # (C loops)

    @property
    def maps(self) -> bool:
        """Whether any entry maps or unmaps expandable pages (most traces map nothing)."""
        return not self._actions().isdisjoint(("segment_map", "segment_unmap"))

    @property
    def releases(self) -> bool:
        """Whether any entry gives memory back to the device (segment_free, segment_unmap):
        without one there is no release run, explicit (empty_cache) or not."""
        return not self._actions().isdisjoint(_SHRINKS)

    def _make_checkpoints(self, event_index: int) -> None:
        """Checkpoints not made by the walk (`seekable` False), made forwards from the last
        one until the next would lie past `event_index`: the layouts the walk would have
        kept (its trail proved that applying each entry forwards retraces it)."""
        with self._making:
            n = len(self.steps)
            at, lay = self._checkpoint_at[-1], self._checkpoints[-1].copy()
            steps, rules, nxt = self.steps, self.rules, self._unmade
            with no_gc():  # a list per block: the cyclic GC would rescan them all, often
                while 0 <= nxt <= event_index and nxt < n:
                    for i in range(at, nxt):
                        apply_step(lay, steps, i, rules)
                    at, nxt = nxt, nxt + spacing(lay, self.every)
                    self._checkpoints.append(lay.copy())  # first: a reader bisects the other
                    self._checkpoint_at.append(at)
            self._unmade = nxt if nxt < n else -1

    @property
    def checkpoints(self) -> list[tuple[int, Layout]]:
        """``(i, layout before entry i)`` of each checkpoint `layout_at` starts from, in
        ascending order (the layouts are copies: changing one changes no checkpoint)."""
        if self._unmade >= 0:
            self._make_checkpoints(len(self.steps) - 1)
        return [
            (at, lay.copy()) for at, lay in zip(self._checkpoint_at, self._checkpoints, strict=True)
        ]

    def layout_at(self, event_index: int) -> Layout:
        """A fresh copy of the layout after entry `event_index` (-1: the start)."""
        n = len(self.steps)
        if not -1 <= event_index < n:
            raise IndexError(f"event index {event_index} outside [-1, {n - 1}]")
        if event_index < 0:
            return self.start.copy()
        if 0 <= self._unmade <= event_index:
            self._make_checkpoints(event_index)
        k = bisect.bisect_right(self._checkpoint_at, event_index) - 1
        lay = self._checkpoints[k].copy()
        for i in range(self._checkpoint_at[k], event_index + 1):
            apply_step(lay, self.steps, i, self.rules)
        return lay

    def snapshot_at(self, event_index: int) -> TorchDict:
        """The torch snapshot dict of this device after trace entry `event_index`.

        ``device_traces`` holds the entries up to and including `event_index`. Each active
        block carries the stack of the trace entry that allocated it, or, alive at the end or
        since before the trace, the stack the file has at its address. Segments that did not
        change between jumps are the same dicts as before: read them, do not modify.
        """
        frames = self.frames_after(event_index)  # (its table is built outside the pause)
        with no_gc():  # thousands of short-lived lists: the cyclic GC only slows this down
            lay = self.layout_at(event_index)
            segments = lay.to_segments(self.device, shared=True, frames=frames)
        traces: list[list[TorchDict]] = [[] for _ in range(self.device + 1)]
        traces[self.device] = self._entries()[: event_index + 1]
        out: TorchDict = {"segments": segments, "device_traces": traces}
        if self.settings is not None:
            out["allocator_settings"] = dict(self.settings)
        return out

    def _entries(self) -> list[TorchDict]:
        """The trace as torch dicts (the recorded ones when built from a snapshot)."""
        if self._trace is None and self._columns is not None:
            self._trace = self._columns.entries()
        if self._trace is None:
            self._trace = [
                {"action": a, "addr": x, "size": s, "stream": st}
                if a != "oom"
                else {"action": a, "device_free": x, "size": s, "stream": st}
                for a, x, s, st in self.steps
            ]
        return self._trace
