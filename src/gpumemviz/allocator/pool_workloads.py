"""Workload programs that use private pools: CUDA-graph capture and RL-style MemPools.

Two programs of allocator steps (see workloads.py for the step format), plus the pool steps
they add: ``("create_pool", pool_id)`` (`torch.cuda.MemPool()`), ``("begin_pool", pool_id)``
and ``("end_pool", pool_id)`` (`beginAllocateToPool` / `endAllocateToPool`: entering and
leaving `use_mem_pool`, or a graph capture's begin and end), ``("release_pool", pool_id)``
(a MemPool deleted, `use_mem_pool` left, a graph reset). `apply_pool_step` runs one on a
`CachingAllocator`. workloads.py wraps the programs as catalogue `Workload`s. Given a ``sites``
dict, a program puts each malloc's call site there (sites.py: `GraphSites`, `RlSites`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal

from gpumemviz.allocator.sites import GraphSites, RlSites, Sites
from gpumemviz.allocator.trace import Frames

if TYPE_CHECKING:
    from gpumemviz.allocator.model import CachingAllocator

__all__ = ["GRAPH_POOL", "Ids", "PoolStep", "apply_pool_step", "graph_program", "rl_program"]

PoolStep = tuple[Literal["create_pool", "begin_pool", "end_pool", "release_pool"], tuple[int, int]]
Step = (
    tuple[Literal["malloc"], int, int, int]
    | tuple[Literal["free"], int]
    | tuple[Literal["empty_cache"]]
    | tuple[Literal["mark"], str]
    | PoolStep
)

#: the pool a CUDA graph captures into (`torch.cuda.graph_pool_handle()` gives ids (n, 0))
GRAPH_POOL = (1, 0)
_CAPTURE_STREAM = 1  # torch captures on a side stream


def apply_pool_step(allocator: CachingAllocator, step: Sequence[object]) -> bool:
    """Run a pool step on `allocator`; False when `step` is not one (malloc, free, ...)."""
    kind = step[0]
    if kind not in ("create_pool", "begin_pool", "end_pool", "release_pool"):
        return False
    pid = step[1]
    assert isinstance(pid, tuple)
    if kind == "create_pool":
        allocator.create_pool(pid)
    elif kind == "begin_pool":
        allocator.begin_allocate_to_pool(pid)
    elif kind == "end_pool":
        allocator.end_allocate_to_pool(pid)
    else:
        allocator.release_pool(pid)
    return True


class Ids:
    """Fresh allocation ids for a program's ops: 1, 2, 3, ... (the catalogue's programs too)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def _forward(
    new: Ids,
    layers: int,
    act: Sequence[int],
    stream: int,
    keep: int,
    sites: Sites | None,
    at: Frames,
) -> Iterator[Step | list[int]]:
    """One forward pass: per layer the activations `act` (call site `at`), all freed but the
    last `keep` of the output (yielded last as the list of ids kept)."""
    kept: list[int] = []
    for _ in range(layers):
        ids = []
        for size in act:
            i = new()
            ids.append(i)
            if sites is not None:
                sites[i] = at
            yield ("malloc", i, size, stream)
        for i in ids[:-1]:
            yield ("free", i)
        kept.append(ids[-1])
        while len(kept) > keep:
            yield ("free", kept.pop(0))
    yield kept


def graph_program(
    *,
    layers: int,
    act: Sequence[int],
    eager_temps: Sequence[int],
    replays: int,
    sites: Sites | None = None,
) -> Iterator[Step]:
    """Eager warm-up, a capture into a graph pool, replays, a second graph sharing the pool.

    The warm-up runs the forward in the default pools; the capture (`torch.cuda.graph`) runs it
    again on the capture stream, routed to `GRAPH_POOL`: its intermediates are freed inside
    the pool during capture, its static output stays. A replay allocates nothing; the eager
    code around it (`eager_temps`) uses the default pools. The second graph (same pool, as
    `make_graphed_callables` or `pool=` does) reuses the first one's freed blocks. At the end
    graph 1 is reset and the cache emptied: the pool's memory stays, graph 2 still holds it.
    """
    new = Ids()
    yield ("mark", "warm-up (eager)")
    for _ in range(3):
        kept: list[int] = []
        for step in _forward(new, layers, act, 0, 1, sites, GraphSites.warmup):
            if isinstance(step, list):
                kept = step
            else:
                yield step
        yield from (("free", i) for i in kept)
    yield ("mark", "capture graph 1")
    yield ("begin_pool", GRAPH_POOL)
    outputs: list[int] = []
    for step in _forward(new, layers, act, _CAPTURE_STREAM, 1, sites, GraphSites.capture):
        if isinstance(step, list):
            outputs += step
        else:
            yield step
    yield ("end_pool", GRAPH_POOL)
    for r in range(replays):
        yield ("mark", f"replay {r + 1}")
        temps = []
        for size in eager_temps:
            i = new()
            temps.append(i)
            if sites is not None:
                sites[i] = GraphSites.replay_loss
            yield ("malloc", i, size, 0)
        yield from (("free", i) for i in temps)
    yield ("mark", "capture graph 2 (shares the pool)")
    yield ("begin_pool", GRAPH_POOL)
    half = [s // 2 for s in act]
    second = GraphSites.capture_second
    for step in _forward(new, layers, half, _CAPTURE_STREAM, 1, sites, second):
        if isinstance(step, list):
            outputs += step
        else:
            yield step
    yield ("end_pool", GRAPH_POOL)
    yield ("mark", "graph 1 reset, outputs dropped, empty_cache")
    yield from (("free", i) for i in outputs)
    yield ("release_pool", GRAPH_POOL)  # graph 1 reset
    yield ("empty_cache",)  # the pool is still held by graph 2: none of it comes back


def rl_program(
    *,
    weights: Sequence[int],
    kv_blocks: int,
    kv_block: int,
    train_acts: Sequence[int],
    grads_and_optimizer: Sequence[int],
    steps: int,
    sites: Sites | None = None,
) -> Iterator[Step]:
    """RL: weights and the KV cache in MemPools, offloaded and reloaded around training.

    The inference engine keeps its weights in MemPool (0, 1) and its KV cache in MemPool
    (0, 2) (as vLLM's sleep mode does with `use_mem_pool`). Each rollout allocates the KV
    cache; before training the engine offloads: the KV cache and weights are freed. Freed
    tensors stay cached in their pool (reserved) while the MemPool lives, so the KV pool is
    deleted (`release_pool`) and the cache emptied to give its memory to training; the weights
    pool is kept, so reloading the weights reuses its cached blocks at the same addresses.
    Training (gradients, optimizer state, activations) runs in the default pools.
    """
    new = Ids()
    weights_pool = (0, 1)
    yield ("create_pool", weights_pool)
    state: list[int] = []
    for step in range(steps):
        kv_pool = (0, 2 + step)  # a fresh KV MemPool each rollout (the last one was deleted)
        yield ("mark", f"rollout {step + 1}: load weights, allocate the KV cache")
        yield ("begin_pool", weights_pool)
        w_ids = []
        for size in weights:
            i = new()
            w_ids.append(i)
            if sites is not None:
                sites[i] = RlSites.weights
            yield ("malloc", i, size, 0)
        yield ("end_pool", weights_pool)
        yield ("release_pool", weights_pool)
        yield ("create_pool", kv_pool)
        yield ("begin_pool", kv_pool)
        kv_ids = []
        for _ in range(kv_blocks):
            i = new()
            kv_ids.append(i)
            if sites is not None:
                sites[i] = RlSites.kv_cache
            yield ("malloc", i, kv_block, 0)
        yield ("end_pool", kv_pool)
        yield ("release_pool", kv_pool)
        yield ("mark", f"rollout {step + 1}: offload (free KV cache and weights)")
        yield from (("free", i) for i in kv_ids)
        yield from (("free", i) for i in w_ids)
        yield ("release_pool", kv_pool)  # the KV MemPool deleted: freeable
        yield ("empty_cache",)  # KV memory back to the device; the weights pool stays cached
        yield ("mark", f"train step {step + 1}")
        if not state:
            for size in grads_and_optimizer:
                i = new()
                state.append(i)
                if sites is not None:
                    sites[i] = RlSites.optimizer
                yield ("malloc", i, size, 0)
        acts = []
        for size in train_acts:
            i = new()
            acts.append(i)
            if sites is not None:
                sites[i] = RlSites.activations
            yield ("malloc", i, size, 0)
        yield from (("free", i) for i in reversed(acts))
