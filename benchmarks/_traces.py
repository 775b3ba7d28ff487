"""Big torch-shaped traces for benchmarks/big_traces.py (and any test or benchmark that needs a
long recorded history): the allocator model driven through a random workload, written as torch
writes a snapshot with history, and a real trace tiled to any length.

Real traces carry a stack of 30-90 frames on every entry, drawn from a few hundred distinct frame
dicts that the pickle shares, with a fresh list per entry: that shape, not the entry count alone,
is what loading costs. `torch_shaped` gives every entry (and every live block) such a stack;
`tiled_real` repeats a real file's trace with each copy's addresses shifted so the copies never
meet, which keeps the trace consistent with the final segments.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from gpumemviz.allocator.model import CachingAllocator

MIB = 1 << 20
GIB = 1 << 30
_STREAM_STEP = 0x10000  # tile k's streams: the file's plus k times this
_SITE = "/opt/conda/lib/python3.11/site-packages/torch"


def frame_pool(n_frames: int = 400, seed: int = 0) -> list[dict[str, Any]]:
    """`n_frames` distinct frame dicts, shaped like torch's (name, filename, line)."""
    rng = random.Random(seed)
    files = [f"{_SITE}/nn/modules/m{i}.py" for i in range(20)] + ["??"] * 5
    return [
        {"name": f"fn_{i}", "filename": rng.choice(files), "line": rng.randrange(1, 3000)}
        for i in range(n_frames)
    ]


def stack_templates(
    frames: list[dict[str, Any]], n_stacks: int = 300, seed: int = 1
) -> list[list[dict[str, Any]]]:
    """Call stacks of 20-100 frames over the shared `frames` (entries copy one: a fresh list)."""
    rng = random.Random(seed)
    return [rng.choices(frames, k=rng.randrange(20, 101)) for _ in range(n_stacks)]


def _size(rng: random.Random) -> int:
    """Request sizes: mostly small tensors, some activations, a few large buffers."""
    r = rng.random()
    if r < 0.55:
        return rng.randrange(1, 1 << 20)  # small pool
    if r < 0.95:
        return rng.randrange(1 << 20, 32 << 20)
    return rng.randrange(32 << 20, 256 << 20)


def torch_shaped(n_entries: int, seed: int = 0, frames: bool = True) -> dict[str, Any]:
    """A snapshot dict whose device 0 trace has exactly `n_entries` entries (torch's ring,
    ``max_entries=n_entries``, so it starts mid-run as long recordings do).

    The allocator model runs a random workload (a few thousand live tensors, frees in random
    order, an ``empty_cache`` now and then so segments are freed too); every trace entry and
    every live block gets a stack of 20-100 frames from 300 call sites over 400 shared frame
    dicts (`frames=False`: empty stacks).
    """
    rng = random.Random(seed)
    model = CachingAllocator(640 * GIB, trace_max_entries=n_entries)
    live: list[int] = []
    target = 3000
    step = 0
    while model.trace_len() < n_entries + 2 * target or step < 4 * target:
        step += 1
        if step % 20000 == 0:
            model.empty_cache()
        if live and (len(live) >= target or rng.random() < len(live) / (2 * target)):
            k = rng.randrange(len(live))
            live[k], live[-1] = live[-1], live[k]
            model.free(live.pop())
        else:
            live.append(model.malloc(_size(rng), stream=0))
    snap = model.snapshot(record=False)
    trace = snap["device_traces"][0]
    assert len(trace) == n_entries, (len(trace), n_entries)
    if frames:
        stacks = stack_templates(frame_pool(seed=seed), seed=seed + 1)
        by_addr: dict[int, list[dict[str, Any]]] = {}
        for e in trace:
            stack = list(rng.choice(stacks))
            e["frames"] = stack
            if e["action"] == "alloc":
                by_addr[e["addr"]] = stack
        for seg in snap["segments"]:
            for b in seg["blocks"]:
                if b["state"] != "inactive":
                    b["frames"] = list(by_addr.get(b["address"]) or rng.choice(stacks))
    return snap


def _span(segments: list[dict[str, Any]], trace: list[dict[str, Any]]) -> tuple[int, int]:
    """The lowest and highest address the segments and trace touch."""
    lo, hi = 1 << 62, 0
    for s in segments:
        lo, hi = min(lo, s["address"]), max(hi, s["address"] + s["total_size"])
    for e in trace:
        if "addr" in e:
            lo, hi = min(lo, e["addr"]), max(hi, e["addr"] + e.get("size", 0))
    return lo, hi


def tiled_real(snapshot: dict[str, Any], n_entries: int, device: int = 0) -> dict[str, Any]:
    """`snapshot` (a real file's dict, one traced device) with its trace repeated to
    `n_entries` entries: copy k has every segment, block and trace address shifted by k times
    the span the file touches (rounded up to 1 GiB), its streams moved to streams of its own
    (so no copy reuses another's cached blocks, which torch would have done), and its
    ``time_us`` after copy k-1's.

    Each copy only touches its own range and streams, so the whole trace starts from the union
    of the copies' start states and ends on the union of their final segments: consistent, and the
    stacks stay the file's own (shared frame dicts).
    """
    trace = snapshot["device_traces"][device]
    segs = [s for s in snapshot["segments"] if int(s.get("device", 0)) == device]
    lo, hi = _span(segs, trace)
    shift = -(-(hi - lo) // GIB) * GIB
    times = [e["time_us"] for e in trace if isinstance(e.get("time_us"), int)]
    dt = (max(times) - min(times) + 1) if times else 0
    copies = -(-n_entries // len(trace))
    out_trace: list[dict[str, Any]] = []
    out_segs: list[dict[str, Any]] = []
    for k in range(copies):
        off = k * shift
        for e in trace:
            e2 = dict(e)
            if "addr" in e2:
                e2["addr"] += off
            if k and "stream" in e2:
                e2["stream"] += k * _STREAM_STEP
            if times and isinstance(e2.get("time_us"), int):
                e2["time_us"] += k * dt
            out_trace.append(e2)
        for s in segs:
            s2 = dict(s)
            s2["address"] += off
            if k:
                s2["stream"] = s2.get("stream", 0) + k * _STREAM_STEP
            s2["blocks"] = [
                {**b, "address": b["address"] + off} if "address" in b else dict(b)
                for b in s["blocks"]
            ]
            out_segs.append(s2)
    # cut the last copy short: only a whole copy is consistent with its final segments, so
    # the cut copy keeps the entries of whole copies and the tail drops from the front instead
    extra = len(out_trace) - n_entries
    out = {k: v for k, v in snapshot.items() if k not in ("segments", "device_traces")}
    out = copy.copy(out)
    out["segments"] = out_segs
    traces: list[list[dict[str, Any]]] = [[] for _ in snapshot["device_traces"]]
    traces[device] = out_trace[extra:]  # a ring drops the oldest entries, as torch's does
    out["device_traces"] = traces
    return out
