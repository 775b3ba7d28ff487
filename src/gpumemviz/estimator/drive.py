"""A meta recording driven through the caching allocator model: peaks, the state at the peak,
and the first allocation that fails under a capacity.

The events become one sequence of mallocs and frees (`plan`): the setup phase, the cuBLAS
workspaces (`extras.workspace_size`, one per handle; kept from warm-up when there is a setup,
else made where the first matrix product of the handle runs), then the measured step. `drive`
runs it once to find the peak (and any OOM), then again up to the peak for the snapshot, whose
blocks carry the operator and the user frame that allocated them.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumemviz.allocator import stats as S
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.rules import allocation_size, is_small, round_size
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.analysis.fragmentation.fit import FitAnswer
from gpumemviz.estimator.record import ALLOC, BLAS, FREE, Event, StepRecording
from gpumemviz.estimator.result import Estimate, EstimateOom
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.allocator.config import AllocatorConfig
    from gpumemviz.snapshot.schema import TorchDict

__all__ = ["Step", "drive", "fits", "plan"]

_AB = 3 * S.ALLOCATED_BYTES
_RB = 3 * S.RESERVED_BYTES
_SEG = 3 * S.SEGMENT
_FRAME = re.compile(r"(?P<file>.*):(?P<line>[0-9]+) in (?P<name>.*)")
WORKSPACE_OP = "cuBLAS workspace"


@dataclass(frozen=True, slots=True)
class Step:
    """One malloc (`free` False) or free of the plan; `key` ties a free to its malloc."""

    free: bool
    key: int
    size: int
    op: str
    frame: str
    phase: str


def plan(rec: StepRecording, *, workspace: int, warm: bool) -> tuple[list[Step], int, int]:
    """The mallocs and frees to drive, the index where the measured part starts, and the
    number of cuBLAS workspaces added.

    The measured part is the last run of the step; a recording whose last run stands for
    several steps (`StepRecording.repeats`, a warm-up reaching its steady state) has it driven
    that many times, the last one measured."""
    out: list[Step] = []
    handles: dict[str, int] = {}
    events = rec.events
    step_handles = [e for e in events if e.kind == BLAS and e.phase == "step"]
    first = rec.run_starts[0] if rec.run_starts else len(events)
    last = rec.run_starts[-1] if rec.run_starts else len(events)
    start = -1

    def add_workspace(handle: str, frame: str, phase: str) -> None:
        if handle in handles or workspace <= 0:
            return
        handles[handle] = key = -1 - len(handles)
        out.append(Step(False, key, workspace, WORKSPACE_OP, frame, phase))

    for i, e in enumerate(events):
        if i == first and warm:  # a recording after warm-up: the step's workspaces exist
            for b in step_handles:
                add_workspace(b.blas, b.frame, "setup")
        if i == last:
            start = len(out)
        if e.size == 0 and e.kind != BLAS:  # torch hands out nullptr and records nothing
            continue
        if e.kind == ALLOC:
            out.append(Step(False, e.key, e.size, e.op, e.frame, e.phase))
        elif e.kind == FREE:
            out.append(Step(True, e.key, e.size, "", "", e.phase))
        else:
            add_workspace(e.blas, e.frame, e.phase)
    if start < 0:
        start = len(out)
    if rec.repeats > 1 and len(rec.run_starts) >= 2:
        start = _repeat(out, events, rec.run_starts[-2], last, rec.repeats - 1)
    return out, start, len(handles)


_REPLAY = 1 << 40  # keys of a replayed run: its number times this, plus the allocation's index


def _repeat(out: list[Step], events: list[Event], prev: int, last: int, times: int) -> int:
    """Append the run `events[last:]` to `out` `times` more times; return where the last one
    starts. A free in the run of a storage the previous run made (`events[prev:last]`, the same
    allocations in the same order) frees the previous repetition's; a free of anything older
    is already done."""
    run = events[last:]
    mine = {e.key: i for i, e in enumerate(x for x in run if x.kind == ALLOC)}
    before = {e.key: i for i, e in enumerate(x for x in events[prev:last] if x.kind == ALLOC)}
    keys = [e.key for e in run if e.kind == ALLOC]  # the recorded run's own keys, by index
    start = len(out)
    for j in range(1, times + 1):
        start = len(out)
        previous = keys if j == 1 else [(j - 1) * _REPLAY + i for i in range(len(keys))]
        for e in run:
            if e.size == 0 or e.kind == BLAS:
                continue
            if e.kind == ALLOC:
                out.append(Step(False, j * _REPLAY + mine[e.key], e.size, e.op, e.frame, e.phase))
            elif e.key in mine:
                out.append(Step(True, j * _REPLAY + mine[e.key], e.size, "", "", e.phase))
            elif e.key in before:
                out.append(Step(True, previous[before[e.key]], e.size, "", "", e.phase))
    return start


def _frames(step: Step) -> list[dict[str, object]]:
    frames: list[dict[str, object]] = [
        # the operator itself, as a native frame (never "the user's line")
        {"filename": "<aten>", "line": 0, "name": f"aten::{step.op}" if step.op else "tensor"}
    ]
    m = _FRAME.fullmatch(step.frame)
    if m is not None:
        frames.append({"filename": m["file"], "line": int(m["line"]), "name": m["name"]})
    return frames


def drive(
    rec: StepRecording,
    *,
    capacity: int,
    config: str | AllocatorConfig,
    workspace: int,
    warm: bool,
    arch: str,
) -> Estimate:
    """Run the recording's plan through a `CachingAllocator` of `capacity` bytes."""
    t0 = time.perf_counter()
    steps, start, n_ws = plan(rec, workspace=workspace, warm=warm)
    a = CachingAllocator(capacity, config, record_trace=False)
    cur = a.stats.cur
    peak = peak_at = peak_reserved = 0
    start_allocated = start_reserved = start_segments = 0  # before step `start`
    # after a warm-up, the peaks are the measured step's (torch.cuda.reset_peak_memory_stats)
    reset = len(rec.run_starts) > 1 or rec.repeats > 1
    oom: EstimateOom | None = None
    i = -1
    try:
        for i in _applied(a, steps):  # a free never raises allocated or reserved
            if i + 1 == start:
                start_allocated, start_reserved = cur[_AB], cur[_RB]
                start_segments = cur[_SEG]
                if reset:
                    peak, peak_at, peak_reserved = cur[_AB], i + 1, cur[_RB]
            if cur[_AB] > peak:
                peak, peak_at = cur[_AB], i + 1
            if cur[_RB] > peak_reserved:
                peak_reserved = cur[_RB]
    except OutOfMemory as e:
        oom = _oom(a, steps[i + 1], e, capacity)
    snap = _snapshot_at(steps, peak_at, capacity, a.config)
    report = fragmentation(snap)
    step_allocs = tuple(s.size for s in steps[start:] if not s.free and s.op != WORKSPACE_OP)
    return Estimate(
        peak_allocated=peak,
        peak_reserved=peak_reserved,
        start_allocated=start_allocated,
        start_reserved=start_reserved,
        start_segments=start_segments,
        runs=max(1, len(rec.run_starts)),
        repeats=rec.repeats,
        segments=len(snap.segments),
        fragmentation=report,
        oom=oom,
        snapshot=snap,
        capacity=capacity,
        config=a.config.to_settings()["PYTORCH_CUDA_ALLOC_CONF"] or "",
        arch=arch,
        workspaces=n_ws,
        fake_ops=dict(rec.fake_ops),
        step_allocs=step_allocs,
        meta_seconds=rec.seconds,
        drive_seconds=time.perf_counter() - t0,
        notes=tuple(rec.notes),
    )


def fits(
    rec: StepRecording, *, capacity: int, config: str | AllocatorConfig, workspace: int, warm: bool
) -> bool:
    """Whether every malloc of the recording's plan succeeds within `capacity` (one pass, no
    snapshot: what `max_batch` asks at each batch)."""
    steps, _, _ = plan(rec, workspace=workspace, warm=warm)
    try:
        deque(_applied(CachingAllocator(capacity, config, record_trace=False), steps), 0)
    except OutOfMemory:
        return False
    return True


def _applied(a: CachingAllocator, steps: list[Step]) -> Iterator[int]:
    """Apply `steps` to `a` in order, yielding each one's index once it is done; a malloc that
    does not fit raises its OutOfMemory (the step after the last index yielded)."""
    ptrs: dict[int, int] = {}
    for i, s in enumerate(steps):
        if s.free:
            p = ptrs.pop(s.key, None)
            if p is not None:
                a.free(p)
        else:
            ptrs[s.key] = a.malloc(s.size)
        yield i


def _snapshot_at(steps: list[Step], upto: int, capacity: int, config: AllocatorConfig) -> Snapshot:
    """The model's state after the first `upto` steps, its live blocks labelled."""
    a = CachingAllocator(capacity, config)
    live: dict[int, tuple[int, Step]] = {}
    for s in steps[:upto]:
        if s.free:
            got = live.pop(s.key, None)
            if got is not None:
                a.free(got[0])
        else:
            live[s.key] = (a.malloc(s.size), s)
    d: TorchDict = a.snapshot(record=False)
    by_addr = dict(live.values())
    for seg in d["segments"]:
        for b in seg["blocks"]:
            made = by_addr.get(b["address"])
            if made is not None and b["state"] == "active_allocated":
                b["frames"] = _frames(made)
    return Snapshot.from_torch(d)


def _oom(a: CachingAllocator, s: Step, e: OutOfMemory, capacity: int) -> EstimateOom:
    d = a.snapshot(include_traces=False, record=False)
    reserved = sum(int(seg["total_size"]) for seg in d["segments"])
    room = max(0, capacity - reserved)
    if d["segments"]:
        verdict = fragmentation(d).can_fit(s.size, device_free=room)
    else:  # nothing reserved: the report knows no device, and no cache could have helped
        cfg = a.config
        rounded = round_size(s.size, cfg.divisions)
        small = is_small(rounded)
        new = allocation_size(rounded, cfg.large_segment_size)
        verdict = FitAnswer(
            verdict="out_of_memory",
            fits=False,
            nbytes=s.size,
            rounded=rounded,
            device=0,
            stream=0,
            pool="small" if small else "large",
            block_address=None,
            block_size=None,
            new_bytes=new,
            releasable=0,
            device_free=room,
            explanation=f"{format_size(s.size)} needs a new {format_size(new)} segment and "
            f"only {format_size(room)} is free on the device, with nothing cached.",
        )
    return EstimateOom(s.size, s.op, s.frame, s.phase, verdict, str(e))
