"""Workload programs: realistic sizes, determinism, and the effect each one teaches, as numbers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.workloads import (
    GIB,
    GPT2_MEDIUM,
    ITERATION_MARK,
    LLAMA_7B,
    WORKLOADS,
    Workload,
    inference_server,
    run,
    training_loop,
)
from gpumemviz.analysis.frames import user_frame


def _check_program(w: Workload) -> dict[str, int]:
    """Every free names a live id, ids are not reused, sizes are positive ints; pool steps
    (CUDA graphs, MemPool) end each routing they begin."""
    live: set[int] = set()
    seen: set[int] = set()
    counts = dict.fromkeys(
        ("malloc", "free", "mark", "empty_cache", "create_pool", "begin_pool", "end_pool"), 0
    )
    counts["release_pool"] = 0
    routing: list[tuple[int, int]] = []
    for op in w.ops():
        counts[op[0]] += 1
        if op[0] == "malloc":
            _, i, size, stream = op
            assert i not in seen and isinstance(size, int) and size > 0 and stream in (0, 1)
            assert stream == 0 or routing  # the side stream only captures
            seen.add(i)
            live.add(i)
        elif op[0] == "free":
            live.remove(op[1])
        elif op[0] == "begin_pool":
            routing.append(op[1])
        elif op[0] == "end_pool":
            assert routing.pop() == op[1]
    assert routing == []
    return counts


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_programs_are_well_formed_and_deterministic(name):
    w = WORKLOADS[name]
    counts = _check_program(w)
    assert counts["malloc"] > 1000 and counts["mark"] > 0
    assert list(w.ops()) == list(w.ops())
    assert w.capacity > 0 and w.description


def test_sizes_follow_the_model_shape():
    # GPT-2 medium: ~355 M parameters in bf16 are the first mallocs of the training loop
    ops = list(training_loop(iterations=1).ops())
    n_weights = GPT2_MEDIUM.layers * len(GPT2_MEDIUM.layer_weights()) + 1
    weights = [op[2] for op in ops if op[0] == "malloc"][:n_weights]
    assert 350e6 < sum(weights) / 2 < 360e6
    # attention scores: batch × heads × seq² × 2 bytes, for the drawn sequence length
    s = training_loop(iterations=1).params["seq_lens"][0]
    att = 8 * GPT2_MEDIUM.heads * s * s * 2
    assert sum(1 for op in ops if op[0] == "malloc" and op[2] == att) >= GPT2_MEDIUM.layers
    # Llama-7B-like: ~6.6 G parameters in fp16; a token's K and V over 32 layers is 512 KiB
    assert LLAMA_7B.kv_bytes_per_token() == 512 * 1024
    per_layer = sum(LLAMA_7B.layer_weights()) / 2
    assert 6.4e9 < per_layer * LLAMA_7B.layers + LLAMA_7B.vocab * LLAMA_7B.hidden < 6.9e9


def test_the_seed_changes_the_sequence_lengths():
    a = training_loop(seed=1).params["seq_lens"]
    b = training_loop(seed=2).params["seq_lens"]
    assert a != b and all(128 <= s <= 1024 and s % 64 == 0 for s in a + b)


def test_training_ooms_with_gigabytes_free_unless_segments_are_expandable():
    plain = run(WORKLOADS["training"])
    assert not plain.completed and isinstance(plain.oom, OutOfMemory)
    assert plain.free_in_segments_at_oom > 2 * GIB
    assert plain.oom.reserved <= plain.capacity
    assert "reserved by PyTorch but unallocated" in str(plain.oom)
    expandable = run(WORKLOADS["training_expandable"])
    assert expandable.capacity == plain.capacity
    assert expandable.completed and expandable.oom_step is None
    assert expandable.peak_reserved < plain.capacity
    # the same program: it needs less memory than the capacity, fragmentation made it fail
    assert expandable.peak_allocated < plain.capacity - GIB


def test_checkpointing_and_a_smaller_batch_lower_peak_reserved():
    plain = run(replace(WORKLOADS["training"], capacity=64 * GIB))  # room to finish
    ckpt = run(WORKLOADS["training_checkpointed"])
    small = run(WORKLOADS["training_small_batch"])
    assert plain.completed and ckpt.completed and small.completed
    assert ckpt.peak_reserved < 0.6 * plain.peak_reserved
    assert small.peak_reserved < 0.75 * plain.peak_reserved
    assert ckpt.peak_allocated < small.peak_allocated < plain.peak_allocated


def test_a_paged_kv_cache_serves_what_a_contiguous_one_cannot():
    contiguous = run(WORKLOADS["inference_contiguous"])
    paged = run(WORKLOADS["inference_paged"])
    assert contiguous.capacity == paged.capacity
    assert not contiguous.completed and paged.completed
    assert paged.peak_reserved < paged.capacity - 2 * GIB
    # with fewer requests at once both finish, and paging needs gigabytes less
    c8 = run(inference_server(paged=False, concurrency=8))
    p8 = run(inference_server(paged=True, concurrency=8))
    assert c8.completed and p8.completed
    assert p8.peak_reserved < c8.peak_reserved - 4 * GIB


def test_outcome_figures_are_per_step_and_consistent():
    o = run(training_loop(iterations=2, capacity=64 * GIB))
    assert len(o.reserved) == len(o.allocated) == len(o.segments) == o.steps
    assert np.all(o.reserved >= o.allocated)
    assert int(o.reserved.max()) == o.peak_reserved
    assert int(o.allocated.max()) == o.peak_allocated
    assert o.marks[0] == (0, "weights") and any("backward 1" in m for _, m in o.marks)
    stats = o.allocator.memory_stats()
    assert stats["reserved_bytes.all.current"] == o.reserved[-1]
    assert stats["segment.all.current"] == o.segments[-1]
    assert "completed" in o.summary()


def test_run_drives_a_given_allocator():
    w = WORKLOADS["training"]
    a = CachingAllocator(w.capacity, "max_split_size_mb:256")
    o = run(w, a)
    assert o.allocator is a and o.completed  # oversize blocks stay whole: no OOM either


def test_with_config_keeps_the_program():
    w = WORKLOADS["inference_paged"].with_config("expandable_segments:True")
    assert w.config == "expandable_segments:True" and "expandable" in w.name
    assert list(w.ops())[:50] == list(WORKLOADS["inference_paged"].ops())[:50]


def test_an_unknown_step_is_refused():
    w = Workload("bad", GIB, "", "broken", program=lambda: iter([("launch", 1)]))
    with pytest.raises(ValueError, match="unknown step"):
        run(w)


def test_kept_gradients_are_allocated_once():
    def grads_mallocs(keep: bool) -> int:
        ops = list(training_loop(iterations=3, keep_grads=keep).ops())
        return sum(1 for op in ops if op[0] == "malloc")

    per_step = 1 + GPT2_MEDIUM.layers * len(GPT2_MEDIUM.layer_weights())
    assert grads_mallocs(False) - grads_mallocs(True) == 2 * per_step


def test_summaries_count_operations_and_training_iterations_apart():
    outcomes = {name: run(w) for name, w in WORKLOADS.items()}
    for o in outcomes.values():
        text = o.summary()
        assert " step" not in text
        if o.completed:
            assert f"completed {o.operations} operations" in text
        else:
            assert f"OOM at operation {o.oom_step}" in text
        assert o.operations == o.steps == len(o.reserved)
    plain, ckpt = outcomes["training_expandable"], outcomes["training_checkpointed"]
    # checkpointing recomputes activations: more operations for the same 12 iterations
    assert ckpt.operations > plain.operations
    assert ckpt.iterations == ckpt.iterations_completed == plain.iterations_completed == 12
    assert "(12 training iterations)" in ckpt.summary()
    oom = outcomes["training"]
    started = sum(1 for at, m in oom.marks if m.startswith(ITERATION_MARK) and at <= oom.oom_step)
    assert oom.iterations_completed == started - 1 < 12
    assert f"OOM at operation {oom.oom_step} in training iteration {started} of 12" in oom.summary()
    server = outcomes["inference_paged"]
    assert server.iterations is None and server.iterations_completed is None
    assert "iteration" not in server.summary()


def test_an_oom_before_the_first_iteration_says_so():
    o = run(training_loop(iterations=3, capacity=64 << 20))
    assert o.oom_step is not None and o.iterations_completed == 0
    assert "before the first training iteration" in o.summary()


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_malloc_gets_a_shared_call_site_with_a_user_line(name):
    w = WORKLOADS[name]
    sites: dict[int, list] = {}
    ops, given = [], {}
    for op in w.ops(sites):
        ops.append(op)
        if op[0] == "malloc":
            given[op[1]] = sites.pop(op[1])  # handed out before its malloc
    assert ops == list(w.ops()) and not sites  # the same steps, nothing left behind
    lists = {id(f): f for f in given.values()}
    assert len(lists) <= 30  # one list per line of the demo program, shared
    for frames in lists.values():
        user = user_frame(frames)
        assert user is not None and user["filename"].startswith("demo_")
        assert all(set(f) == {"filename", "line", "name"} for f in frames)


def test_run_with_frames_gives_the_snapshot_stacks():
    w = training_loop(iterations=1)
    a = CachingAllocator(w.capacity, w.config)
    run(w, a, frames=True)
    snap = a.snapshot(record=False)
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert live and all(b["frames"] for b in live)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert all(user_frame(e["frames"])["filename"] == "demo_train.py" for e in allocs)
    bare = CachingAllocator(w.capacity, w.config)
    run(w, bare)  # no frames unless asked: a trace as recorded without stacks
    assert all("frames" not in e for e in bare.snapshot()["device_traces"][0])
