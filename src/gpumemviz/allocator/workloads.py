"""Workload programs for the allocator model: demos, tests and notebooks without a GPU.

A workload is plain data: a name, the memory the process can get, the allocator settings, a
description, and `ops()`, a deterministic program of ``("malloc", id, size, stream)``,
``("free", id)``, ``("empty_cache",)`` and ``("mark", label)`` steps. Sizes come from a model
shape (hidden size, layers, heads, sequence length, dtype), as a PyTorch program would request
them. `run` drives a `CachingAllocator` through a workload and returns the outcome as numbers.
A malloc's call site (the line of a demo script that would ask for it, sites.py) travels beside
the steps, in the dict `Workload.ops` is given, so every reader of the steps sees them unchanged.

The private-pool programs (CUDA graphs, RL MemPools) are in pool_workloads.py; this module
wraps them as `Workload`s. It stays whole (over 500 lines): its two program builders
(training, inference) share the
counter that hands out allocation ids, and `run`, its `Outcome` and the catalogue `WORKLOADS`
are short. It is not replay machinery: replay/ runs recorded traces, this makes new programs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.pool_workloads import (
    Ids,
    PoolStep,
    apply_pool_step,
    graph_program,
    rl_program,
)
from gpumemviz.allocator.sites import ServeSites, Sites, TrainSites
from gpumemviz.allocator.trace import Frames
from gpumemviz.snapshot.escaping import short_repr

__all__ = [
    "ITERATION_MARK",
    "WORKLOADS",
    "Op",
    "Outcome",
    "TransformerShape",
    "Workload",
    "cuda_graph_workload",
    "inference_server",
    "rl_mempool_workload",
    "run",
    "training_loop",
]

GIB = 1 << 30
# ("malloc", id, size, stream), ("free", id), ("empty_cache",), ("mark", label), and the
# private-pool steps of pool_workloads.py (("create_pool", id) and the rest)
Op = (
    tuple[Literal["malloc"], int, int, int]
    | tuple[Literal["free"], int]
    | tuple[Literal["empty_cache"]]
    | tuple[Literal["mark"], str]
    | PoolStep
)


@dataclass(frozen=True)
class TransformerShape:
    """A decoder-only transformer, enough to size its tensors."""

    hidden: int
    layers: int
    heads: int
    vocab: int
    ffn: int = 0  # MLP width; 0 means 4 × hidden
    dtype_bytes: int = 2  # bf16 / fp16
    gated: bool = False  # SwiGLU MLP (gate, up and down projections), as in Llama

    @property
    def mlp(self) -> int:
        return self.ffn or 4 * self.hidden

    def layer_weights(self) -> list[int]:
        """Byte sizes of one layer's parameter tensors (qkv, out proj, MLP in/out, norms)."""
        h, f, d = self.hidden, self.mlp, self.dtype_bytes
        sizes = [3 * h * h * d, 3 * h * d, h * h * d, h * d, h * f * d, f * d, f * h * d, h * d]
        return [*sizes, h * f * d] if self.gated else sizes

    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.hidden * self.dtype_bytes


#: A training program's mark that starts an iteration ("iteration 3 (seq 512)"); `run` counts
#: them, so outcomes say training iterations apart from allocator operations.
ITERATION_MARK = "iteration "

# GPT-2 medium (355M parameters) and a Llama-2-7B-like shape
GPT2_MEDIUM = TransformerShape(hidden=1024, layers=24, heads=16, vocab=50257)
LLAMA_7B = TransformerShape(hidden=4096, layers=32, heads=32, vocab=32000, ffn=11008, gated=True)
# a 1.3B-parameter Llama-like policy, the size of an RL fine-tuning run on one GPU
RL_1B = TransformerShape(hidden=2048, layers=24, heads=16, vocab=32000, ffn=5504, gated=True)


@dataclass(frozen=True)
class Workload:
    """A program of allocator calls with the capacity and settings it runs under.

    Attributes
    ----------
    name, description
        What it is and the effect a user should learn from it.
    capacity
        Bytes of device memory the process can get.
    config
        ``PYTORCH_CUDA_ALLOC_CONF`` settings.
    program, params
        ``program(**params)`` yields the steps; `ops()` calls it.
    iterations
        Training iterations the program runs (each starts with an `ITERATION_MARK` mark), or
        None for a workload without them.
    """

    name: str
    capacity: int
    config: str
    description: str
    program: Callable[..., Iterator[Op]] = field(repr=False)
    params: Mapping[str, Any] = field(default_factory=dict)  # Any: `program`'s keywords
    iterations: int | None = None

    def ops(self, sites: Sites | None = None) -> Iterator[Op]:
        """The steps, freshly generated (deterministic: the same every time): ``("malloc", id,
        size, stream)``, ``("free", id)``, ``("empty_cache",)`` and ``("mark", label)``.

        With a dict `sites`, each malloc's call site (frames, innermost first: see sites.py) is
        put in ``sites[id]`` before the malloc is yielded; pop it there to pass it to
        `CachingAllocator.malloc`. The steps are the same with or without it.
        """
        if sites is None:
            return self.program(**self.params)
        return self.program(**self.params, sites=sites)

    def with_config(self, config: str) -> Workload:
        """The same program under other allocator settings."""
        return replace(self, config=config, name=f"{self.name} [{config or 'default'}]")


# --------------------------------------------------------------------------- training


def _mallocs(
    new: Ids, sized: Iterable[tuple[int, Frames]], sites: Sites | None
) -> Generator[Op, None, list[int]]:
    """Allocate one tensor per (size, call site) on stream 0, each site handed out in `sites`
    (when given); the generator's return value is their ids."""
    ids = []
    for size, at in sized:
        i = new()
        ids.append(i)
        if sites is not None:
            sites[i] = at
        yield ("malloc", i, size, 0)
    return ids


def _frees(ids: Iterable[int]) -> Iterator[Op]:
    for i in ids:
        yield ("free", i)


def _training_program(
    shape: TransformerShape,
    batch: int,
    seq_lens: tuple[int, ...],
    checkpointing: bool,
    keep_grads: bool = False,
    leak_bytes: int = 0,
    sites: Sites | None = None,
) -> Iterator[Op]:
    """An eager training loop: AdamW, all tensors in one dtype; call sites from
    `sites.TrainSites` (``demo_train.py``).

    Per layer the forward saves ln1, qkv, softmax probabilities, context, residual, ln2, fc1 and
    gelu (the scores are a temporary); backward allocates the gradient temporaries, frees the
    layer's saved tensors, and (first step, or every step with grads set to None) the weight
    gradients. AdamW's two states per parameter appear at the first optimizer step. With
    ``leak_bytes`` each step's forward keeps one more tensor of that size alive for good (a list
    that keeps an activation per step, as a logging bug would): a slow net growth under the
    sawtooth, until the device runs out.
    """
    d = shape.dtype_bytes
    new = Ids()
    T = TrainSites
    yield ("mark", "weights")
    sizes = [shape.vocab * shape.hidden * d]
    sizes += [size for _ in range(shape.layers) for size in shape.layer_weights()]
    weights = [(sizes[0], T.embedding_weights), *((s, T.layer_weights) for s in sizes[1:])]
    yield from _mallocs(new, weights, sites)
    adam: list[int] = []
    grads: list[int] = []
    for it, s in enumerate(seq_lens):
        yield ("mark", f"{ITERATION_MARK}{it} (seq {s})")
        tok = batch * s * shape.hidden * d  # one activation of the residual width
        att = batch * shape.heads * s * s * d  # attention scores / probabilities
        mlp = batch * s * shape.mlp * d
        logits = batch * s * shape.vocab * d
        # token ids, embedding output
        inputs = yield from _mallocs(new, ((batch * s * 8, T.tokens), (tok, T.embedding)), sites)
        # saved by one layer: ln1, qkv, probabilities, context, residual, ln2, fc1, gelu
        layer_acts = (
            (tok, T.ln1),
            (3 * tok, T.qkv),
            (att, T.probs),
            (tok, T.context),
            (tok, T.residual),
            (tok, T.ln2),
            (mlp, T.fc1),
            (mlp, T.gelu),
        )
        saved: list[list[int]] = []
        for _layer in range(shape.layers):
            if checkpointing:  # keep only the layer input; run the layer, free everything
                keep = yield from _mallocs(new, ((tok, T.checkpoint),), sites)
                tmp = yield from _mallocs(new, (*layer_acts, (att, T.scores)), sites)
                yield from _frees(tmp)
                saved.append(keep)
                continue
            layer = yield from _mallocs(new, layer_acts[:2], sites)  # ln1, qkv
            scores = yield from _mallocs(new, ((att, T.scores),), sites)
            layer += yield from _mallocs(new, layer_acts[2:3], sites)  # softmax probabilities
            yield from _frees(scores)
            layer += yield from _mallocs(new, layer_acts[3:], sites)  # ctx, res, ln2, fc1, gelu
            saved.append(layer)
        if leak_bytes:  # kept by the program, never freed
            yield from _mallocs(new, ((leak_bytes, T.history),), sites)
        # logits, fp32 log-softmax
        head = yield from _mallocs(new, ((logits, T.logits), (2 * logits, T.log_softmax)), sites)
        yield ("mark", f"backward {it}")
        dlogits = yield from _mallocs(new, ((logits, T.backward),), sites)
        yield from _frees(head)
        dx = yield from _mallocs(new, ((tok, T.backward),), sites)
        yield from _frees(dlogits)
        first = not grads
        if first:
            grads += yield from _mallocs(new, ((sizes[0], T.backward),), sites)
        for layer_i in range(shape.layers - 1, -1, -1):
            if checkpointing:  # recompute the layer's activations first
                saved[layer_i] += yield from _mallocs(new, layer_acts, sites)
            if first:
                layer_grads = ((g, T.backward) for g in reversed(shape.layer_weights()))
                grads += yield from _mallocs(new, layer_grads, sites)
            temps = yield from _mallocs(
                new, ((t, T.backward) for t in (mlp, mlp, att, att, 3 * tok)), sites
            )
            yield from _frees(saved[layer_i])
            yield from _frees(temps)
            nx = yield from _mallocs(new, ((tok, T.backward),), sites)
            yield from _frees(dx)
            dx = nx
        yield from _frees((*dx, *inputs))
        yield ("mark", f"optimizer step {it}")
        if not adam:  # AdamW state (exp_avg, exp_avg_sq) appears at the first step
            states = ((size, T.optimizer) for size in sizes for _ in range(2))
            adam += yield from _mallocs(new, states, sites)
        if not keep_grads:  # zero_grad(set_to_none=True)
            yield from _frees(grads)
            grads = []


def training_loop(
    *,
    shape: TransformerShape = GPT2_MEDIUM,
    batch: int = 8,
    iterations: int = 12,
    min_seq: int = 128,
    max_seq: int = 1024,
    checkpointing: bool = False,
    keep_grads: bool = False,
    leak_bytes: int = 0,
    config: str = "",
    capacity: int = 37 * GIB // 2,
    seed: int = 5,
    name: str | None = None,
) -> Workload:
    """A transformer training loop whose sequence length changes every iteration.

    Parameters
    ----------
    shape
        Model shape (default GPT-2 medium, bf16).
    batch, iterations
        Batch size and number of training steps.
    min_seq, max_seq
        Sequence lengths are drawn (seeded) from multiples of 64 in this range.
    checkpointing
        Activation checkpointing: keep only each layer's input, recompute in backward.
    keep_grads
        ``zero_grad(set_to_none=False)``: gradients stay allocated from the first backward on
        (default: set to None after each step, reallocated in the next backward).
    leak_bytes
        Bytes each step keeps alive for good (default 0: none): a slow leak under the sawtooth.
    config, capacity
        Allocator settings and the bytes the process can get.
    seed
        Seed of the sequence-length draw.

    Returns
    -------
    Workload

    Examples
    --------
    >>> w = training_loop(iterations=2)
    >>> sum(1 for op in w.ops() if op[0] == "malloc") > 1000
    True
    """
    rng = random.Random(seed)
    seq_lens = tuple(rng.randrange(min_seq, max_seq + 1, 64) for _ in range(iterations))
    what = "with activation checkpointing" if checkpointing else f"batch {batch}"
    leak = (
        f" Each step keeps {leak_bytes >> 20} MiB more alive for good (a leak): the sawtooth"
        " climbs until the device runs out."
        if leak_bytes
        else ""
    )
    return Workload(
        name=name or f"training ({what})",
        capacity=capacity,
        config=config,
        description=(
            f"GPT-style training ({shape.layers} layers, hidden {shape.hidden}), {what}, "
            f"sequence length varying in [{min_seq}, {max_seq}]: activations of changing sizes "
            "are carved from segments that gradients and optimizer state also land in." + leak
        ),
        program=_training_program,
        params={
            "shape": shape,
            "batch": batch,
            "seq_lens": seq_lens,
            "checkpointing": checkpointing,
            "keep_grads": keep_grads,
            "leak_bytes": leak_bytes,
        },
        iterations=iterations,
    )


# --------------------------------------------------------------------------- inference


def _server_program(
    shape: TransformerShape,
    requests: tuple[tuple[int, int], ...],
    concurrency: int,
    max_new_tokens: int,
    page_tokens: int,
    sites: Sites | None = None,
) -> Iterator[Op]:
    """Continuous batching: each request prefills, decodes, and frees its KV cache; call
    sites from `sites.ServeSites` (``demo_serve.py``)."""
    per_token = shape.kv_bytes_per_token()
    d = shape.dtype_bytes
    new = Ids()
    S = ServeSites
    yield ("mark", "weights")
    weights = [
        (size, S.layer_weights) for _ in range(shape.layers) for size in shape.layer_weights()
    ]
    weights.append((shape.vocab * shape.hidden * d, S.embedding_weights))
    yield from _mallocs(new, weights, sites)
    queue = list(enumerate(requests))
    active: dict[int, dict[str, Any]] = {}  # Any: a request's mixed fields
    step = 0
    while queue or active:
        while queue and len(active) < concurrency:
            rid, (prompt, out) = queue.pop(0)
            yield ("mark", f"request {rid} arrives (prompt {prompt}, output {out})")
            r: dict[str, Any] = {"tokens": prompt, "left": out, "pages": []}
            if page_tokens:
                pages = [(page_tokens * per_token, S.kv_prompt_pages)] * -(-prompt // page_tokens)
                r["pages"] += yield from _mallocs(new, pages, sites)
            else:  # reserve prompt + max_new_tokens up front, as a static cache does
                whole = ((prompt + max_new_tokens) * per_token, S.kv_reserve)
                r["pages"] += yield from _mallocs(new, (whole,), sites)
            # prefill activations
            act = yield from _mallocs(new, ((prompt * shape.hidden * d * 4, S.prefill),), sites)
            yield from _frees(act)
            active[rid] = r
        # one decode step for the batch: a small activation, and new pages where needed
        step += 1
        act = yield from _mallocs(new, ((len(active) * shape.vocab * d, S.decode_logits),), sites)
        for rid in list(active):
            r = active[rid]
            r["tokens"] += 1
            r["left"] -= 1
            if page_tokens and r["tokens"] > len(r["pages"]) * page_tokens:
                page = ((page_tokens * per_token, S.kv_new_page),)
                r["pages"] += yield from _mallocs(new, page, sites)
            if r["left"] == 0:
                yield ("mark", f"request {rid} done")
                for p in r["pages"]:
                    yield ("free", p)
                del active[rid]
        yield from _frees(act)


def inference_server(
    *,
    paged: bool,
    shape: TransformerShape = LLAMA_7B,
    n_requests: int = 48,
    concurrency: int = 12,
    max_new_tokens: int = 1024,
    page_tokens: int = 32,
    capacity: int = 22 * GIB,
    config: str = "",
    seed: int = 0,
    name: str | None = None,
) -> Workload:
    """An LLM server with continuous batching; KV cache contiguous per request, or paged.

    Parameters
    ----------
    paged
        False: each request reserves one contiguous KV buffer for prompt + max_new_tokens.
        True: the cache grows in fixed blocks of `page_tokens` tokens (vLLM's PagedAttention).
    shape
        Model shape (default a Llama-2-7B-like model in fp16).
    n_requests, concurrency
        Requests served, and how many run at once.
    max_new_tokens
        The generation limit (what a contiguous cache must reserve).
    page_tokens
        Tokens per KV block when paged.
    capacity, config
        Bytes the process can get, allocator settings.
    seed
        Seed of the prompt and output lengths.

    Returns
    -------
    Workload

    Examples
    --------
    >>> w = inference_server(paged=True, n_requests=2)
    >>> next(w.ops())
    ('mark', 'weights')
    """
    rng = random.Random(seed)
    requests = tuple(
        (rng.randrange(32, 1025), rng.randrange(16, max_new_tokens + 1)) for _ in range(n_requests)
    )
    how = f"paged in blocks of {page_tokens} tokens" if paged else "contiguous per request"
    return Workload(
        name=name or f"inference server (KV cache {how})",
        capacity=capacity,
        config=config,
        description=(
            f"{n_requests} requests, {concurrency} at a time, KV cache {how}: a contiguous "
            "cache reserves the whole generation limit and leaves holes of every size; "
            "fixed-size blocks hold only the tokens made and any freed block fits any request."
        ),
        program=_server_program,
        params={
            "shape": shape,
            "requests": requests,
            "concurrency": concurrency,
            "max_new_tokens": max_new_tokens,
            "page_tokens": page_tokens if paged else 0,
        },
    )


# --------------------------------------------------------------------------- running


@dataclass
class Outcome:
    """What a workload did to the allocator, as numbers.

    ``steps`` counts allocator operations (malloc, free, empty_cache; marks are not counted)
    and ``oom_step`` is the operation that ran out; ``reserved``, ``allocated`` and
    ``segments`` (numpy) hold the figures after each operation (``segments`` is torch's
    ``segment.all.current``: expandable memory is not counted); ``marks`` are (operation,
    label) pairs. A training workload also says ``iterations`` (planned) and
    ``iterations_completed``; both are None for workloads without training iterations.
    """

    workload: str
    config: str
    capacity: int
    completed: bool
    oom_step: int | None
    oom: OutOfMemory | None
    peak_reserved: int
    peak_allocated: int
    steps: int
    reserved: np.ndarray
    allocated: np.ndarray
    segments: np.ndarray
    marks: list[tuple[int, str]]
    allocator: CachingAllocator = field(repr=False)
    iterations: int | None = None
    iterations_completed: int | None = None

    @property
    def operations(self) -> int:
        """Allocator operations run (the same count as `steps`)."""
        return self.steps

    @property
    def free_in_segments_at_oom(self) -> int | None:
        """Reserved but unallocated bytes when the OOM hit (None without an OOM)."""
        return None if self.oom is None else self.oom.reserved - self.oom.allocated

    def summary(self) -> str:
        """One line: completed or where it ran out (operation, and training iteration where
        the workload has them), and the peaks."""
        gib = 1 << 30
        head = f"{self.workload}: "
        done = self.iterations_completed
        if self.completed:
            head += f"completed {self.steps} operations"
            if done is not None:
                head += f" ({done} training iterations)"
        else:
            free = self.free_in_segments_at_oom or 0
            head += f"OOM at operation {self.oom_step}"
            if done is not None and any(m.startswith(ITERATION_MARK) for _, m in self.marks):
                head += f" in training iteration {done + 1} of {self.iterations}"
            elif done is not None:
                head += " before the first training iteration"
            head += f" with {free / gib:.2f} GiB free inside reserved segments"
        return (
            f"{head}; peak reserved {self.peak_reserved / gib:.2f} GiB, peak allocated "
            f"{self.peak_allocated / gib:.2f} GiB of {self.capacity / gib:.2f} GiB"
        )


def run(
    workload: Workload, allocator: CachingAllocator | None = None, *, frames: bool = False
) -> Outcome:
    """Drive an allocator through `workload` until it ends or runs out of memory.

    Parameters
    ----------
    workload
        The program, capacity and settings.
    allocator
        The model to drive (default: a fresh `CachingAllocator(workload.capacity,
        workload.config, record_trace=False)`; pass one that records its trace to replay or
        export the run).
    frames
        Give each malloc its call site (`Workload.ops`'s sites), so the allocator's snapshot
        and trace carry stacks (default False: none, as a program recorded without stacks).

    Returns
    -------
    Outcome

    Examples
    --------
    >>> o = run(training_loop(iterations=1))
    >>> o.completed, o.peak_reserved >= o.peak_allocated > 0
    (True, True)
    """
    a = allocator or CachingAllocator(workload.capacity, workload.config, record_trace=False)
    where: dict[int, int] = {}
    reserved: list[int] = []
    allocated: list[int] = []
    segments: list[int] = []
    marks: list[tuple[int, str]] = []
    oom: OutOfMemory | None = None
    oom_step: int | None = None
    step = started = 0
    sites: Sites | None = {} if frames else None
    for op in workload.ops(sites):
        if op[0] == "malloc":
            try:
                where[op[1]] = a.malloc(op[2], op[3], None if sites is None else sites.pop(op[1]))
            except OutOfMemory as err:
                oom, oom_step = err, step
                break
        elif op[0] == "free":
            a.free(where.pop(op[1]))
        elif op[0] == "empty_cache":
            a.empty_cache()
        elif op[0] == "mark":
            marks.append((step, op[1]))
            started += str(op[1]).startswith(ITERATION_MARK)
            continue
        elif apply_pool_step(a, op):
            continue  # not an allocator operation of its own: no figures
        else:
            raise ValueError(f"workload {short_repr(workload.name)}: unknown step {short_repr(op)}")
        reserved.append(a.reserved)
        allocated.append(a.allocated)
        segments.append(a.n_segments)
        step += 1
    ms = a.memory_stats()
    return Outcome(
        workload=workload.name,
        config=workload.config,
        capacity=workload.capacity,
        completed=oom is None,
        oom_step=oom_step,
        oom=oom,
        peak_reserved=ms["reserved_bytes.all.peak"],
        peak_allocated=ms["allocated_bytes.all.peak"],
        steps=step,
        reserved=np.asarray(reserved, np.int64),
        allocated=np.asarray(allocated, np.int64),
        segments=np.asarray(segments, np.int64),
        marks=marks,
        allocator=a,
        iterations=workload.iterations,
        iterations_completed=None
        if workload.iterations is None
        else started - (oom is not None and started > 0),
    )


def cuda_graph_workload(
    *,
    shape: TransformerShape = GPT2_MEDIUM,
    batch: int = 16,
    seq: int = 2048,
    replays: int = 300,
    capacity: int = 12 * GIB,
    config: str = "",
    name: str | None = None,
) -> Workload:
    """CUDA graphs: eager warm-up, capture into a graph pool, replays, a second graph sharing
    the pool, then both reset (`pool_workloads.graph_program`)."""
    tokens = batch * seq
    h, d = shape.hidden, shape.dtype_bytes
    act = [tokens * h * d, 3 * tokens * h * d, tokens * shape.mlp * d, tokens * h * d]
    return Workload(
        name=name or "cuda_graph",
        capacity=capacity,
        config=config,
        description=(
            "torch.cuda.graph: the capture's memory lives in a private pool that the default "
            "pools cannot reuse, kept until every graph sharing it is reset"
        ),
        program=graph_program,
        params={
            "layers": shape.layers,
            "act": act,
            "eager_temps": [tokens * h * d, tokens * 4],
            "replays": replays,
        },
    )


def rl_mempool_workload(
    *,
    shape: TransformerShape = RL_1B,
    kv_gib: float = 6.0,
    kv_block: int = 256 << 20,
    steps: int = 4,
    capacity: int = 24 * GIB,
    config: str = "",
    name: str | None = None,
) -> Workload:
    """RL rollout and training: weights and KV cache in MemPools, offloaded and reloaded
    between steps (`pool_workloads.rl_program`)."""
    weights = [s for _ in range(shape.layers) for s in shape.layer_weights()]
    n_params_bytes = sum(weights)
    h, d = shape.hidden, shape.dtype_bytes
    return Workload(
        name=name or "rl_mempools",
        capacity=capacity,
        config=config,
        description=(
            "MemPools: freed tensors stay cached in their pool until the MemPool is deleted; "
            "the KV cache's pool is dropped before training, the weights' pool reused on reload"
        ),
        program=rl_program,
        params={
            "weights": weights,
            "kv_blocks": int(kv_gib * GIB) // kv_block,
            "kv_block": kv_block,
            "train_acts": [8 * 1024 * h * d] * (2 * shape.layers),
            "grads_and_optimizer": [n_params_bytes, 2 * n_params_bytes],
            "steps": steps,
        },
    )


def _catalogue() -> dict[str, Workload]:
    train = training_loop(name="training")
    return {
        w.name: w
        for w in (
            train,
            replace(train.with_config("expandable_segments:True"), name="training_expandable"),
            training_loop(checkpointing=True, name="training_checkpointed"),
            training_loop(batch=4, name="training_small_batch"),
            # a fixed sequence length (an even sawtooth) and a leak of 128 MiB per step: the
            # reserved memory climbs step over step until the OOM, about 80 s into the demo
            training_loop(
                iterations=200,
                min_seq=512,
                max_seq=512,
                leak_bytes=128 << 20,
                capacity=12 * GIB,
                name="leak",
            ),
            inference_server(paged=False, name="inference_contiguous"),
            inference_server(paged=True, name="inference_paged"),
            cuda_graph_workload(),
            rl_mempool_workload(),
        )
    }


# The catalogue the demo, the magic's --demo and the notebooks name: training,
# training_expandable, training_checkpointed, training_small_batch, leak, inference_contiguous,
# inference_paged, cuda_graph, rl_mempools.
WORKLOADS: dict[str, Workload] = _catalogue()
