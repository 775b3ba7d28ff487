"""Model snapshots are read by torch.cuda._memory_viz, and its totals equal memory_stats()."""

from __future__ import annotations

import contextlib
import io
import random
import re

import pytest

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.rules import MIB

mv = pytest.importorskip("torch.cuda._memory_viz")

CONFIGS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:40,roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
]


def _run(conf: str, seed: int, n: int = 1500) -> CachingAllocator:
    """A mixed program: small and large tensors, two streams, record_stream, empty_cache, OOMs."""
    rng = random.Random(seed)
    a = CachingAllocator(768 * MIB, conf)
    live: list[int] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5 or not live:
            size = rng.choice(
                [rng.randint(1, 8192), rng.randint(8192, 2 * MIB), rng.randint(2 * MIB, 80 * MIB)]
            )
            with contextlib.suppress(OutOfMemory):
                p = a.malloc(size, rng.choice([0, 0, 0, 0x7F00]))
                live.append(p)
                if rng.random() < 0.05:
                    a.record_stream(p, 0x7E00)
        elif r < 0.95:
            a.free(live.pop(rng.randrange(len(live))))
        elif r < 0.98:
            a.complete_events()
        else:
            a.empty_cache()
    return a


def _quiet(fn, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


@pytest.mark.parametrize("conf", CONFIGS)
@pytest.mark.parametrize("seed", [1, 2])
def test_memory_viz_reads_model_snapshots(conf, seed):
    a = _run(conf, seed)
    snap = a.snapshot()
    stats = a.memory_stats()
    segs = snap["segments"]
    assert segs, "the program should leave something reserved"
    assert sum(s["total_size"] for s in segs) == stats["reserved_bytes.all.current"]
    assert sum(s["allocated_size"] for s in segs) == stats["allocated_bytes.all.current"]
    assert sum(s["active_size"] for s in segs) == stats["active_bytes.all.current"]
    assert sum(s["requested_size"] for s in segs) == stats["requested_bytes.all.current"]
    nonexp = [s for s in segs if not s["is_expandable"]]
    assert len(nonexp) == stats["segment.all.current"]

    summary = mv.segsum(snap)  # asserts its own conservation laws
    assert f"segments: {len(segs)}\n" in summary
    assert f"total_reserved: {mv.Bytes(stats['reserved_bytes.all.current'])}\n" in summary
    requested_allocated = sum(
        b["requested_size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated"
    )
    assert f"total_allocated: {mv.Bytes(requested_allocated)}\n" in summary

    text = mv.trace(snap)
    n_alloc = sum(1 for e in snap["device_traces"][0] if e["action"] == "alloc")
    assert f"{len(snap['device_traces'][0])} entries" in text
    assert len(re.findall(r"^\w+ = \w+\[\d+:", text, re.M)) == n_alloc > 0

    flame = mv.segments(snap, format_flamegraph=lambda s: s)
    total = sum(int(line.rsplit(" ", 1)[1]) for line in flame.splitlines() if line)
    assert total == stats["reserved_bytes.all.current"]
    mem = mv.memory(snap, format_flamegraph=lambda s: s)
    # inactive blocks keep a stale requested_size (as in torch), so some "gaps" are negative
    assert sum(int(line.rsplit(" ", 1)[1]) for line in mem.splitlines() if line) == total
    _quiet(mv.compare, segs, segs, format_flamegraph=lambda s: s)
    assert mv.trace_plot(snap) and mv.segment_plot(snap)


def test_oom_entry_is_read_by_trace():
    a = CachingAllocator(64 * MIB)
    a.malloc(50 * MIB)
    with pytest.raises(OutOfMemory):
        a.malloc(30 * MIB)
    snap = a.snapshot()
    assert snap["device_traces"][0][-1]["action"] == "oom"
    assert "device_free" in snap["device_traces"][0][-1]
    assert "raise OutOfMemoryError # 30.0MiB requested, 14.0MiB free" in mv.trace(snap)


@pytest.mark.parametrize("conf", CONFIGS[:2])
def test_model_snapshots_are_read_by_gpumemviz_itself(conf):
    import pickle

    from gpumemviz.io import load_snapshot
    from gpumemviz.snapshot import Snapshot

    a = _run(conf, 3, 600)
    d = a.snapshot()
    assert Snapshot.from_torch(d).to_torch() == d
    s = load_snapshot(pickle.dumps(d, protocol=4))
    assert s.n_segments == len(d["segments"])
    assert s.n_blocks == sum(len(seg["blocks"]) for seg in d["segments"])
