"""The driver of one replay pass: a fresh model fed one device's recorded trace, scored.

The model is handed only what a running program gives the allocator: size and stream for each
malloc, frees by allocation id, and, when it asks for a new segment, the base address the driver
gave (the trace's next segment_alloc / segment_map, from addresses.py). Recorded alloc addresses
are read only by the scorer (evidence.py: the scoring, and what recorded runs prove). `drive`,
at the end, is the entry point: one pass, scored.

`Driver` stays whole (over 500 lines): every method reads and moves the same state of the
pass (the model, its address provider, the deferred frees, the figures after each entry), and
each story it tries for a release run or a cut copies all of that state and rolls it back.
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator import stats as S
from gpumemviz.allocator.addresses import DescendingAddresses
from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.replay.evidence import (
    RELEASES,
    hidden_growth,
    same_entries,
    same_releases,
    score,
    without,
)
from gpumemviz.allocator.replay.evidence import pinch as find_pinch
from gpumemviz.allocator.replay.layout import Layout
from gpumemviz.allocator.replay.placement import (
    INVENTED_TOP,
    Provider,
    ProviderState,
    Reservations,
    Runs,
)
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.allocator.replay.result import DeviceReplay, ReplayError, layout_key
from gpumemviz.allocator.replay.steps import SEGMENT_ACTIONS
from gpumemviz.allocator.rules import is_small, page_size, reservation_size
from gpumemviz.allocator.trace import TraceRow

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchDict

__all__ = ["Driver", "drive"]

_DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_AB = 3 * S.ALLOCATED_BYTES  # allocated_bytes.all.current in the model's DeviceStats.cur
_UNKNOWN_TOTAL = 1 << 40  # device_total when nothing recorded says it (sizes the expandable VA)


def _never_saw(i: int) -> ReplayError:
    return ReplayError(f"trace event {i}: free of an allocation the replay never saw")


class Driver:
    """One pass over one device's trace with a fresh model (see `drive`)."""

    def __init__(
        self,
        recording: Recording,
        config: AllocatorConfig,
        capacity: int | None,
        *,
        what_if: bool,
        resync: bool,
        explicit: Collection[int],
        rename: Callable[[int], int] | None,
        device_total: int | None,
        max_mismatches: int,
    ):
        self.tl = recording
        self.steps = recording.steps
        self.config = config
        self.capacity = capacity
        self.cap = capacity if capacity is not None else 1 << 62
        self.total = device_total or capacity or _UNKNOWN_TOTAL
        self.what_if = what_if
        self.resync = resync
        self.explicit = explicit
        self.rename = rename or (lambda a: a)
        self.ids = rename  # None: allocation ids are the recorded addresses
        self.max_mismatches = max_mismatches
        rules = recording.rules
        steps = self.steps

        def small_at(j: int) -> bool:
            for k in range(j + 1, len(steps)):
                if steps[k][0] in ("alloc", "oom"):  # the malloc that mapped it
                    return is_small(rules.round(steps[k][2]))
            return False

        self.provider = Provider(self.steps, invent=what_if, small_at=small_at)
        self.provider.full = capacity is not None
        segments = recording.start_segments()  # (read only: shared by every pass)
        self.bases = Reservations(
            recording,
            segments,
            small_at,
            lambda small: reservation_size(self.total, page_size(small, config.large_segment_size)),
            bounded=capacity is not None,
        )
        self.out = DeviceReplay(
            device=recording.device,
            config=config.settings,
            what_if=what_if,
            capacity=capacity,
            capacity_known=capacity is not None,
            events=len(self.steps),
        )
        self.choices: list[int | None] = [None] * len(self.steps)
        self.stopped = False  # a what-if ran out of memory on an alloc the program made
        n = len(self.steps)
        # the model's figures after each trace entry (C arrays: 8 bytes an entry as numpy's,
        # but item assignment is faster). Reserved bytes and the segment count change only
        # where the general path runs: the inline paths leave them -1, and `_result` fills
        # each from the entry before (`_carried`); so does it the figures after the
        # free_completed of a free done at once (they are those after its free_requested)
        self.reserved = array("q", [-1]) * n
        self.allocated = array("q", [-1]) * n  # -1 too where a free's free_completed did nothing
        self.nsegs = array("q", [-1]) * n
        self.before = (0, 0, 0)  # reserved, the segment count and allocated when it began
        self.cut_at = -1  # the first malloc, when the cut hid the segment it made
        self.cut_grew: list[tuple[str, int, int]] = []
        self.plan = recording.pools
        self.cur_pool: tuple[int, int] | None = None  # the pool of the malloc being replayed
        self.pool_peak: dict[tuple[int, int], int] = {}
        start = self._start()
        if start is not recording.start:  # a cut hid the first malloc's new segment
            segments = start.to_segments(recording.device)
        self._load(segments, -1)

    # -- state ------------------------------------------------------------------------------
    def _load(self, segments: list[TorchDict], point: int) -> None:
        """A fresh model holding `segments`, the recorded state after trace entry `point`, with
        the reservations the trace proves; blocks alive there keep their recorded address.

        A block waiting on events (active_pending_free) is loaded allocated and then freed
        behind an event of its own made-up stream, so that its free_completed can finish
        exactly that block.
        """
        pending = [
            b["address"]
            for s in segments
            for b in s["blocks"]
            if b["state"] == "active_pending_free"
        ]
        if pending:
            segments = [
                {
                    **s,
                    "blocks": [
                        {**b, "state": "active_allocated"}
                        if b["state"] == "active_pending_free"
                        else b
                        for b in s["blocks"]
                    ],
                }
                for s in segments
            ]
        plan = self.plan
        if plan is not None:
            segments = [
                {**s, "segment_pool_id": plan.segment(s["address"], point)} for s in segments
            ]
        bases = self.bases.at(point)
        try:
            self.model = CachingAllocator.from_segments(
                segments,
                self.cap,
                self.config,
                self.tl.device,
                self.total,
                reservations=bases,
                address_provider=self.provider,
                trace_max_entries=1 << 16,  # one call never emits more
                trace_blocks=False,  # segment entries are all the driver reads
            )
        except ValueError as err:
            raise ReplayError(f"device {self.tl.device}: {err}") from None
        if plan is not None:  # every pool the trace uses exists, held by its MemPool or graph
            for pid in plan.ids:
                if pid not in self.model.pool_ids:
                    self.model.create_pool(pid)
                if plan.unnamed.get(pid, point + 1) <= point:  # deleted after its last alloc
                    self.model.release_pool(pid)
        self.runs = Runs(segments)
        # allocation id -> model address
        self.where: dict[int, int] = {
            self.rename(b["address"]): b["address"]
            for s in segments
            for b in s["blocks"]
            if b["state"] != "inactive"
        }
        self.deferred: dict[int, int] = {}  # id -> the made-up stream its free waits on
        for k, addr in enumerate(pending):
            fake = -(1 << 40) - k
            self.model.record_stream(addr, fake)
            self.model.free(self.where.pop(self.rename(addr)))
            self.deferred[self.rename(addr)] = fake
        self.provider.load(self.model, segments, bases)

    def _start(self) -> Layout:
        """The state the model starts from: the reconstructed one, unless the ring buffer cut
        between the first malloc's new segment (or mapped pages) and its alloc entry.

        The start state then already holds that segment, free. Both stories give the same
        entries; they differ only where the model would not pick that block by searching
        (max_split_size: an oversize block; a refilled hole of an expandable segment), and
        then only the story where the malloc makes it reproduces the recorded block. The
        hidden new segment or map is handed to the model like a recorded one.
        """
        tl, steps = self.tl, self.steps
        start = tl.start
        if self.what_if:
            return start
        i0 = next((i for i, st in enumerate(steps) if st[0] in ("alloc", "oom")), None)
        if i0 is None or steps[i0][0] != "alloc":
            return start
        if any(steps[j][0] in SEGMENT_ACTIONS for j in range(i0)):
            return start
        stories = hidden_growth(start, steps[i0], tl.rules, self.config)
        if not stories:
            return start
        before = tl.layout_at(i0 - 1)
        if self._trial(before, i0, None):
            return start
        for entry in stories:
            lay, first = without(before, entry), without(start, entry)
            if lay is not None and first is not None and self._trial(lay, i0, entry):
                self.cut_at, self.cut_grew = i0, [entry]
                self.provider.cut = [entry]
                self.provider.surprises = 0
                self.provider.fallback = DescendingAddresses(INVENTED_TOP)
                return first
        self.provider.surprises = 0
        self.provider.fallback = DescendingAddresses(INVENTED_TOP)
        return start

    def _trial(self, lay: Layout, i: int, entry: tuple[str, int, int] | None) -> bool:
        """Does the model, started from `lay` (the state before malloc `i`), put it at the
        recorded address, making exactly `entry` (None: nothing)?"""
        self.provider.cut = [entry] if entry else []
        self._load(lay.to_segments(self.tl.device), i - 1)
        _, addr, size, stream = self.steps[i]
        if self.plan is not None:
            self.cur_pool = self.plan.alloc[i]
        self.provider.window, self.provider.used, self.provider.pos = [], set(), i
        mark = self.model.trace_len()
        got, oomed = self._try(size, stream)
        grew = [(e[0], e[1], e[2]) for e in self.model.trace_since(mark) if e[0] in SEGMENT_ACTIONS]
        self.provider.cut = []
        return not oomed and got == addr and grew == ([entry] if entry else [])

    def _miss(self, i: int, kind: str, detail: str) -> None:
        if len(self.out.mismatches) < self.max_mismatches:
            self.out.mismatches.append((i, kind, detail))

    def _resynchronise(self, i: int) -> None:
        """Per-decision scoring: continue from the recorded layout after entry i."""
        self._load(self.tl.layout_at(i).to_segments(self.tl.device), i)

    def _take(self, i: int) -> int:
        key = self.rename(self.steps[i][1])
        a = self.where.pop(key, None)
        if a is None:
            raise _never_saw(i)
        return a

    def _own(self, mark: int, run: Sequence[int] = (), allocated: int = 0) -> list[TraceRow]:
        """The model's entries since `mark`; fills the figures at the recorded `run` entries.

        The entries of `run` are what the model did inside one call, so after the k-th of them
        the figures are those after the model's k-th segment entry.
        """
        entries = self.model.trace_since(mark)
        seg = [e for e in entries if e[0] in SEGMENT_ACTIONS]
        reserved = self.model.reserved - sum(_DELTA[e[0]] * e[2] for e in seg)
        k = 0
        for e in seg:
            reserved += _DELTA[e[0]] * e[2]
            self.runs.apply((e,))
            if k < len(run):
                j = run[k]
                self.reserved[j], self.allocated[j], self.nsegs[j] = (
                    reserved,
                    allocated,
                    len(self.runs),
                )
                k += 1
        for j in run[k:]:
            self.reserved[j], self.allocated[j], self.nsegs[j] = reserved, allocated, len(self.runs)
        provider = self.provider
        if provider.synced < mark:
            provider.sync()
        else:
            provider.sync(entries[provider.synced - mark :])
        return entries

    # -- scoring ----------------------------------------------------------------------------
    # -- entries ----------------------------------------------------------------------------
    def _standalone_run(self, run: list[int]) -> None:
        """Segment entries no malloc caused: an explicit empty_cache."""
        first = run[0]
        if self.what_if:
            if first in self.explicit:
                mark = self.model.trace_len()
                self.model.empty_cache()
                self._own(mark, run, self.model.allocated)
                self.out.explicit_bursts.append(first)
            else:  # recorded segment entries mean nothing under other settings
                self._own(self.model.trace_len(), run, self.model.allocated)
            return
        mark = self.model.trace_len()
        self.model.empty_cache()
        self.out.explicit_bursts.append(first)
        own = self._own(mark, run, self.model.allocated)
        if not score(self.out, self.steps, run[-1], own, run, self._miss) and self.resync:
            self._resynchronise(run[-1])

    def _checkpoint(self) -> tuple[CachingAllocator, Runs, dict[int, int], ProviderState]:
        """Everything a trial malloc may change, copied (the provider itself is shared)."""
        provider = self.provider
        return copy.deepcopy(
            (self.model, self.runs, self.deferred, provider.state()), {id(provider): provider}
        )

    def _rollback(
        self, saved: tuple[CachingAllocator, Runs, dict[int, int], ProviderState]
    ) -> None:
        """Back to `saved` (which stays intact for another rollback)."""
        provider = self.provider
        self.model, self.runs, self.deferred, state = copy.deepcopy(saved, {id(provider): provider})
        provider.restore(state, self.model)
        provider.used = set()

    def _complete(self, synced: Sequence[int]) -> None:
        """Finish deferred frees now (their events completed before this malloc began)."""
        for j in synced:
            fake = self.deferred.pop(self.rename(self.steps[j][1]), None)
            if fake is not None:
                self.model.complete_events(fake, process=True)
        self.provider.synced = self.model.trace_len()

    def _malloc(self, i: int, run: list[int], leading: Sequence[int] = ()) -> None:
        """An alloc or a recorded oom, with the segment entries recorded just before it.

        `leading`: deferred frees completed just before a release run; either this malloc's
        process_events finished them before its search, or its release synchronised them.
        Both are tried when it matters.
        """
        action, addr, size, stream = self.steps[i]
        if self.plan is not None:
            self.cur_pool = self.plan.alloc[i]
        provider = self.provider
        provider.window, provider.used = run, set()
        provider.pos, provider.small = i, is_small(self.tl.rules.round(size))
        rels = [j for j in run if self.steps[j][0] in RELEASES]
        pinch: int | None = None  # the capacity that makes this malloc run out, as recorded
        if rels and not self.what_if and self.capacity is None:
            pinch = find_pinch(self.steps, run, rels, self.tl.layout_at, self.model.reserved)
        if not rels or self.what_if or (self.capacity is None and pinch is None):
            explicit = bool(rels) and (rels[0] in self.explicit if self.what_if else True)
            if not (leading and action == "oom" and not rels and not self.what_if):
                self._complete(leading)
            mark = self.model.trace_len()
            allocated_before = self.model.allocated
            if explicit:
                self.model.empty_cache()
                self.out.explicit_bursts.append(rels[0])
            if leading and action == "oom" and not rels and not self.what_if:
                got, oomed = self._synced_oom(size, stream, leading)
            else:
                got, oomed = self._try(size, stream)
                if (
                    not run
                    and not oomed
                    and action == "alloc"
                    and i != self.cut_at
                    and self.model.trace_len() == mark
                ):  # the common case: no segment entry to score
                    assert got is not None
                    self._placed(i, addr, got)
                    return
        else:  # the model's own release after a failed cudaMalloc, or else an empty_cache
            saved = self._checkpoint()

            def attempt(story: str) -> tuple[int, int, int | None, bool, int]:
                """The malloc after `leading` finished ("before" it; "synced": by its own
                release), or after an explicit "empty_cache"; last: 2 when every segment
                entry is as recorded, 1 the releases only."""
                if story != "synced":
                    self._complete(leading)
                mark = self.model.trace_len()
                allocated_before = self.model.allocated
                if story == "empty_cache":
                    self.model.empty_cache()
                elif pinch is not None:
                    self.model.capacity = pinch
                got, oomed = self._try(size, stream)
                self.model.capacity = self.cap
                own = self.model.trace_since(mark)
                steps = self.steps
                same = same_entries(steps, own, run)
                level = 2 if same else int(same_releases(steps, own, rels))
                return mark, allocated_before, got, oomed, level

            stories = ["before", "synced"] if leading else ["before"]
            chosen = None
            partly = None  # the model's own release as recorded, growing otherwise
            for story in [*stories, "empty_cache"]:
                mark, allocated_before, got, oomed, level = attempt(story)
                if level == 2:
                    chosen = story
                    break
                if level == 1 and partly is None and story != "empty_cache":
                    partly = story
                self._rollback(saved)
            if chosen is None:
                chosen = partly or "empty_cache"
                mark, allocated_before, got, oomed, _ = attempt(chosen)
            if chosen == "empty_cache":
                self.out.explicit_bursts.append(rels[0])
        self._scored(i, run, mark, allocated_before, got, oomed)

    def _scored(
        self, i: int, run: list[int], mark: int, allocated_before: int, got: int | None, oomed: bool
    ) -> None:
        """`_malloc` once the model has served malloc `i` (from trace_len `mark` on): its own
        entries read, scored against the recorded `run` and counted."""
        action, addr, size, _ = self.steps[i]
        model = self.model
        own = self._own(mark, run, allocated_before)
        if i == self.cut_at:  # the new segment the cut hid is not scored as the model's own
            own = [e for e in own if (e[0], e[1], e[2]) not in self.cut_grew]
        differs = False
        if not self.what_if:
            differs = not score(self.out, self.steps, i, own, run, self._miss)
        out = self.out
        if action == "alloc":
            out.allocs += 1
            if oomed:
                if out.oom is None:
                    out.oom = i
                if self.what_if:
                    self.stopped = True  # the program would have died here
                    return
                self._miss(i, "oom", f"the model ran out of memory on an alloc of {size} B")
                # the program got this block: carry on from the recorded state (so an OOM
                # also ends the end-to-end run's own state)
                self._resynchronise(i)
                return
            else:
                assert got is not None  # not oomed: `_try` returned an address
                self.choices[i] = got
                self.where[self.rename(addr)] = got
                if self.what_if:
                    pass  # invented addresses: nothing to compare
                elif got != addr:
                    differs = True
                    self._miss(i, "alloc", f"model chose {got:#x}, recorded {addr:#x}")
                elif self._pool_differs(i, got):
                    differs = True
                else:
                    out.allocs_matched += 1
        else:
            if out.recorded_oom is None:
                out.recorded_oom = i
            if oomed:
                if out.oom is None:
                    out.oom = i
            else:
                self._miss(i, "oom", "the recorded OOM did not happen in the model")
                assert got is not None
                mark = model.trace_len()
                model.free(got)  # the program never got this block
                self._own(mark)
                differs = True
        if differs and self.resync and not self.what_if:
            self._resynchronise(i)

    def _placed(self, i: int, addr: int, got: int) -> None:
        """An alloc the model served from its cache (no segment entry, nothing recorded
        before it): what the general path does then, without its lists."""
        self.provider.synced = self.model.trace_len()
        out = self.out
        out.allocs += 1
        self.choices[i] = got
        self.where[self.rename(addr)] = got
        if self.what_if:
            return
        if got == addr and not self._pool_differs(i, got):
            out.allocs_matched += 1
            return
        if got != addr:
            self._miss(i, "alloc", f"model chose {got:#x}, recorded {addr:#x}")
        if self.resync:
            self._resynchronise(i)

    def _pool_differs(self, i: int, got: int) -> bool:
        """Whether alloc `i`, placed at `got`, landed in another pool than the ``pool_id`` its
        entry records (a miss, said as one); False where the entry records none."""
        said = self.plan.recorded[i] if self.plan is not None and self.plan.recorded else None
        if said is None:
            return False
        placed = self.model.pool_of(got)
        if placed == said:
            return False
        self._miss(i, "pool", f"model placed it in pool {placed}, recorded pool {said}")
        return True

    def _synced_oom(
        self, size: int, stream: int, leading: Sequence[int]
    ) -> tuple[int | None, bool]:
        """A recorded OOM after deferred frees completed: either they completed before the
        malloc (process_events) and did not help, or the OOM path's release synchronised them
        after the search had failed (then the retry only asks for a new segment). The story
        where the model runs out, as recorded, is kept."""
        saved = self._checkpoint()
        self._complete(leading)
        got, oomed = self._try(size, stream)
        if oomed:
            return got, oomed
        self._rollback(saved)
        got, oomed = self._try(size, stream)  # the release synchronises them
        if oomed:
            return got, oomed
        self._rollback(saved)
        self._complete(leading)
        return self._try(size, stream)

    def _try(self, size: int, stream: int) -> tuple[int | None, bool]:
        pool = self.cur_pool
        try:
            if pool is None:
                return self.model.malloc(size, stream), False
            with self.model.use_mem_pool(pool):  # the program's `use_mem_pool` or capture
                return self.model.malloc(size, stream), False
        except OutOfMemory:
            return None, True

    def _free_requested(self, i: int) -> bool:
        """True when the block is freed at once (its free_completed, next, then does nothing)."""
        a = self._take(i)
        steps = self.steps
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if (
            nxt is not None
            and nxt[0] == "free_completed"
            and nxt[1] == steps[i][1]
            and not self._release_follows(i + 1)
        ):  # freed at once (before a release, it may have waited on events until it)
            self.model.free(a)
            return self.rename(steps[i][1]) not in self.deferred
        self._defer(i, a, self.rename(steps[i][1]))
        return False

    def _defer(self, i: int, a: int, key: int) -> None:
        """Free the block at `a` (id `key`) behind an event of a made-up stream: it waits on
        other streams' work until its free_completed."""
        fake = -(1000 + i)
        self.model.record_stream(a, fake)
        self.model.free(a)
        self.deferred[key] = fake

    def _free_completed(self, i: int) -> None:
        key = self.rename(self.steps[i][1])
        fake = self.deferred.pop(key, None)
        if fake is not None:
            self.model.complete_events(fake, process=True)
        elif key in self.where:  # its free_requested fell off the start of the ring buffer
            self.model.free(self.where.pop(key))

    def _release_follows(self, i: int) -> bool:
        """Do the free_completed entries from i lead into segment_free / segment_unmap, or into
        an oom (whose release synchronises events even when it frees nothing)?"""
        steps = self.steps
        j = i + 1
        while j < len(steps) and steps[j][0] == "free_completed":
            j += 1
        return j < len(steps) and (steps[j][0] in RELEASES or steps[j][0] == "oom")

    def _finish_synced(self, leading: Sequence[int], synced: Sequence[int]) -> None:
        """Deferred frees whose events a release synchronised: the model's own release did the
        same (and then this does nothing), an explicit empty_cache did too. The figures after
        `synced` ones (inside the release run) are those after the run; `leading` ones were
        filled before it (`_fill`)."""
        m = self.model
        for j in (*leading, *synced):
            fake = self.deferred.pop(self.rename(self.steps[j][1]), None)
            if fake is not None:
                m.complete_events(fake, process=True)
        self._fill(synced)
        self.provider.synced = m.trace_len()

    def _fill(self, entries: Sequence[int]) -> None:
        """The model's figures now, after each of `entries` (a free changes neither reserved
        nor allocated once requested: torch counts a block out of allocated at free())."""
        m = self.model
        for j in entries:
            self.reserved[j], self.allocated[j], self.nsegs[j] = (
                m.reserved,
                m.allocated,
                len(self.runs),
            )

    def _pool_figures(self) -> None:
        """Each pool's reserved bytes now, kept as its peak."""
        peak = self.pool_peak
        for pid, v in self.model.pool_reserved().items():
            if v > peak.get(pid, -1):
                peak[pid] = v

    # -- the pass ---------------------------------------------------------------------------
    def run(self) -> DeviceReplay:
        """The pass: each entry in order, then the result.

        The two commonest entries, an alloc with nothing recorded before it and a free, run
        inline on locals (the model, its figures, the driver's dicts), read again after any
        other entry, which may have reloaded the model. Traces with private pools take the
        general path for every entry (their pool figures are read after each one).
        """
        steps = self.steps
        n = len(steps)
        once = self.tl.freed_at_once()  # each free whose free_completed, next, does nothing
        reserved, allocated, nsegs = self.reserved, self.allocated, self.nsegs
        run: list[int] = []  # segment entries waiting for the malloc that caused them
        synced: list[int] = []  # deferred frees completed inside that run (events synced)
        leading: list[int] = []  # deferred frees completed just before it
        done = n
        provider, out, choices = self.provider, self.out, self.choices
        ids, what_if, cut_at, resync = self.ids, self.what_if, self.cut_at, self.resync
        mismatches, max_mismatches = out.mismatches, self.max_mismatches
        fast = self.plan is None
        # the inline paths may run: no pools, no segment entry or deferred free waiting for
        # its malloc (read again after each entry the general path takes)
        inline = fast
        skip = -1  # the free_completed of a free done at once: its figures are carried
        allocs = missed = 0  # inline allocs, and those not at the recorded address (to `out`)
        m = self.model
        stats, where, deferred = m.stats.cur, self.where, self.deferred
        malloc, free, trace_len = m.malloc, m.free, m.trace_len
        self.before = (m.reserved, len(self.runs), m.allocated)
        # the model's trace_len() (segment entries only: frees emit none), read again after
        # any entry the general path takes; the provider has read up to it
        mark = trace_len()
        # an inline malloc has no recorded segment entry next to it; the pool of a new
        # segment is read from its step (the general path sets these for its own, and they
        # are set back after it)
        provider.window, provider.small = (), None
        ab = _AB  # (a local: read faster in the loop)
        for i in range(n):
            if i == skip:
                continue
            action, addr, size, stream = steps[i]
            if action == "alloc" and inline and i != cut_at:
                # an alloc with no segment entry and no deferred free recorded before it
                if not what_if:  # a what-if's provider invents every address: it reads none
                    provider.pos = i
                allocated_before = stats[ab]
                try:
                    got = malloc(size, stream)
                except OutOfMemory:
                    self._lone_rest(i, addr, mark, allocated_before, None, True)
                else:
                    if trace_len() == mark and (got == addr or what_if or not resync):
                        # the commonest: served from the cache (where it was recorded)
                        allocs += 1
                        if got != addr and not what_if:  # (a what-if invents addresses)
                            missed += 1
                            if len(mismatches) < max_mismatches:
                                mismatches.append(
                                    (i, "alloc", f"model chose {got:#x}, recorded {addr:#x}")
                                )
                        choices[i] = where[addr if ids is None else ids(addr)] = got
                        allocated[i] = stats[ab]
                        continue
                    self._lone_rest(i, addr, mark, allocated_before, got, False)
            elif action == "free_requested" and inline:
                key = addr if ids is None else ids(addr)
                a = where.pop(key, None)
                if a is None:
                    raise _never_saw(i)
                if once[i]:  # freed at once: its free_completed, next, does nothing
                    free(a)
                    if key not in deferred:
                        skip = i + 1  # its figures: those after this entry (`_result`)
                else:  # it waits on other streams' work until its free_completed (or release)
                    self._defer(i, a, key)
                # frees never release segments: nothing for the provider to read
                allocated[i] = stats[ab]
                continue
            else:
                provider.synced = trace_len()  # past the inline frees' entries (no segment)
                if action in SEGMENT_ACTIONS:
                    run.append(i)  # its figures are filled in when the run is replayed
                    inline = False
                    continue
                if (
                    action == "free_completed"
                    and self.rename(addr) in self.deferred
                    and (run or self._release_follows(i))
                ):  # completed around a release (empty_cache, or the last retry)
                    (synced if run else leading).append(i)
                    inline = False
                    continue
                if run and action not in ("alloc", "oom"):
                    self._complete(leading)
                    self._fill(leading)
                    self._standalone_run(run)
                    self._finish_synced(leading, synced)
                    run, synced, leading = [], [], []
                if action == "alloc" and not run and not leading and i != cut_at:
                    self._lone_malloc(i, addr, size, stream)  # pools, or the cut's alloc
                elif action in ("alloc", "oom"):
                    self._fill(leading)
                    self._malloc(i, run, leading)
                    self._after_malloc(i)
                    self._finish_synced(leading, synced)
                    run, synced, leading = [], [], []
                elif action == "free_requested":
                    if self._free_requested(i):
                        skip = i + 1
                    provider.synced = self.model.trace_len()
                elif action == "free_completed":
                    self._free_completed(i)
                    provider.synced = self.model.trace_len()
                inline = fast and not run and not leading
            provider.window, provider.small = (), None
            m = self.model  # it may have been reloaded: read everything again
            stats, where, deferred = m.stats.cur, self.where, self.deferred
            malloc, free, trace_len = m.malloc, m.free, m.trace_len
            reserved[i], allocated[i], nsegs[i] = m.reserved, stats[ab], len(self.runs)
            mark = provider.synced = trace_len()
            if self.plan is not None:
                self._pool_figures()
            if self.stopped:
                done = i + 1
                break
        out.allocs += allocs
        if not what_if:
            out.allocs_matched += allocs - missed
        if run and done == n:
            self._complete(leading)
            self._fill(leading)
            self._standalone_run(run)
            self._finish_synced(leading, synced)
        return self._result(done)

    def _lone_malloc(self, i: int, addr: int, size: int, stream: int) -> None:
        """An alloc with no segment entry and no deferred free recorded before it: what
        `_malloc` does then, without its lists (`run`'s inline path, with pools)."""
        m, provider = self.model, self.provider
        if self.plan is not None:
            self.cur_pool = self.plan.alloc[i]
        provider.window, provider.pos, provider.small = (), i, None
        provider.synced = mark = m.trace_len()
        allocated_before = m.allocated
        got, oomed = self._try(size, stream)
        self._lone_rest(i, addr, mark, allocated_before, got, oomed)

    def _lone_rest(
        self, i: int, addr: int, mark: int, allocated_before: int, got: int | None, oomed: bool
    ) -> None:
        """`_lone_malloc` once the model has served it (from trace_len `mark` on)."""
        if not oomed and self.model.trace_len() == mark:
            assert got is not None  # not oomed: `_try` returned an address
            self._placed(i, addr, got)
        else:
            self._scored(i, [], mark, allocated_before, got, oomed)
        self._after_malloc(i)
        self.provider.synced = self.model.trace_len()  # the model may have been reloaded

    def _after_malloc(self, i: int) -> None:  # a pool deleted after its last alloc, released
        plan, pid = self.plan, self.cur_pool
        if plan is not None and pid is not None and plan.unnamed.get(pid) == i:
            self.model.release_pool(pid)  # its last alloc: the pool was deleted

    def _result(self, done: int) -> DeviceReplay:
        """The pass's figures up to entry `done`, its final layout, and how it scored."""
        out, n = self.out, len(self.steps)
        out.reserved = _carried(self.reserved, self.before[0])[:done]
        out.allocated = _carried(self.allocated, self.before[2])[:done]
        out.segments = _carried(self.nsegs, self.before[1])[:done]
        start_reserved, start_allocated, _ = self.tl.start.totals()
        out.peak_reserved = max(int(out.reserved.max(initial=0)), start_reserved)
        out.peak_allocated = max(int(out.allocated.max(initial=0)), start_allocated)
        out.final_segments = self.model.snapshot(include_traces=False, record=False)["segments"]
        if self.plan is not None:
            self._pool_figures()
            out.pool_peak_reserved = dict(sorted(self.pool_peak.items()))
            out.pool_final_reserved = dict(sorted(self.model.pool_reserved().items()))
        if not self.what_if:
            recorded = self.tl.final.to_segments(self.tl.device)
            out.final_matched = layout_key(out.final_segments) == layout_key(recorded)
            if not out.final_matched:
                self._miss(n - 1, "final", "the model's final segments differ from the recorded")
        if not self.resync:
            out.allocs_matched_per_decision = out.allocs_matched
        return out


def _carried(figures: array[int], first: int) -> np.ndarray:
    """`figures` with each -1 (an entry the pass did not fill) replaced by the figure before
    it, `first` before the first filled one.

    Examples
    --------
    >>> _carried(array("q", [-1, 5, -1, -1, 7, -1]), 3).tolist()
    [3, 5, 5, 5, 7, 7]
    >>> _carried(array("q", [-1, -1]), 3).tolist(), _carried(array("q"), 3).tolist()
    ([3, 3], [])
    """
    values = np.frombuffer(figures, np.int64)
    at = np.flatnonzero(values >= 0)  # each filled figure repeats up to the next one
    out = np.empty(len(values), np.int64)
    head = int(at[0]) if len(at) else len(values)
    out[:head] = first
    out[head:] = np.repeat(values[at], np.diff(at, append=len(values)))
    return out


def drive(
    recording: Recording,
    config: AllocatorConfig,
    capacity: int | None,
    *,
    what_if: bool = False,
    resync: bool = False,
    explicit: Collection[int] = (),
    rename: Callable[[int], int] | None = None,
    device_total: int | None = None,
    max_mismatches: int = 20,
) -> tuple[DeviceReplay, list[int | None]]:
    """Run one device's trace through a fresh model; score it against the recorded addresses.

    Parameters
    ----------
    recording
        The recorded history (start state, entries, recorded layouts for re-synchronising).
    config
        Settings the model runs with.
    capacity
        Bytes the process can get (None: unlimited, so the model never runs out).
    what_if
        Invent segment addresses instead of taking the recorded ones; recorded release runs
        listed in `explicit` are replayed as empty_cache, other recorded segment entries are
        ignored, and the pass stops at the model's first OOM.
    resync
        After any decision that differs from the recording, rebuild the model from the recorded
        layout (the per-decision score). Without it the model runs on its own state.
    explicit
        What-if only: first indices of the release runs that were explicit empty_cache calls.
    rename
        Maps a recorded alloc/free address to the allocation id the driver files the model's
        block under (default: the address itself). The model never sees ids, so any
        one-to-one renaming must give the same choices.
    device_total
        The device's total memory (sizes the expandable address reservations).

    Returns
    -------
    (DeviceReplay, choices)
        ``choices[i]`` is the model's address for alloc entry i (None elsewhere).
    """
    d = Driver(
        recording,
        config,
        capacity,
        what_if=what_if,
        resync=resync,
        explicit=explicit,
        rename=rename,
        device_total=device_total,
        max_mismatches=max_mismatches,
    )
    return d.run(), d.choices
