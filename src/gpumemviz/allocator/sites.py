"""The call sites of the demo programs: believable user stacks for their allocations.

The workloads (workloads.py, pool_workloads.py) are programs of allocator steps, not Python
code, so nothing records where a tensor was asked for. Without a stack the demo's holders view,
the map's hover and the growth analysis have nothing to say; these sites stand in for the
stacks torch records with ``_record_memory_history(stacks="python")``: frame dicts
``{"filename", "line", "name"}``, innermost first, torch's own frames (``torch/...``) inside the
user's lines as a real stack has them. The lines are those of four short scripts a user of the
demo can picture: ``demo_train.py`` (a GPT training loop), ``demo_serve.py`` (an LLM server),
``demo_graphs.py`` (CUDA graphs) and ``demo_rl.py`` (RL with MemPools).

A program hands a malloc's site out through the ``sites`` dict its `Workload.ops` is given
(malloc id -> frames), so the steps keep their shape. Each site is one list, shared by every
malloc made there (and its outer frames by every site below them): a long demo run holds a
few hundred frame dicts, not one list per allocation. Nobody changes them.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpumemviz.allocator.trace import Frames
from gpumemviz.snapshot.schema import TorchDict

__all__ = ["GraphSites", "RlSites", "ServeSites", "Sites", "TrainSites"]

Sites = dict[int, Frames]
"""Call sites handed out by a program: malloc id -> frames (innermost first)."""


def _frame(filename: str, line: int, name: str) -> TorchDict:
    return {"filename": filename, "line": line, "name": name}


def _site(inner: Sequence[TorchDict], outer: Sequence[TorchDict]) -> Frames:
    """A site: its own frames (innermost first), then the shared frames of its caller."""
    return [*inner, *outer]


_LINEAR = _frame("torch/nn/modules/linear.py", 125, "forward")
_MODULE_CALL = _frame("torch/nn/modules/module.py", 1750, "_call_impl")
_LAYER_NORM = _frame("torch/nn/modules/normalization.py", 217, "forward")
_BACKWARD = (
    _frame("torch/autograd/graph.py", 825, "_engine_run_backward"),
    _frame("torch/autograd/__init__.py", 353, "backward"),
    _frame("torch/_tensor.py", 648, "backward"),
)


class TrainSites:
    """``demo_train.py``: a GPT trained with AdamW (`workloads._training_program`).

    Its lines: ``Attention.forward`` (38 scores, 39 softmax, 40 context), ``MLP.forward`` (45
    fc1, 46 gelu), ``Block.forward`` (52 ln1, 53 qkv, 54 the attention and its residual, 55
    ln2, 56 the MLP), ``GPT.forward`` (69 the embedding, 71 the loop over the blocks, 74 the
    head), ``train_step`` (94 the batch, 97 the forward, 99 the leak, 100 the loss, 101
    backward, 112 the optimizer step), ``load_weights`` (122, 124), ``main`` and the module.
    """

    f = "demo_train.py"
    main = (_frame(f, 131, "main"), _frame(f, 140, "<module>"))
    model_call = (_MODULE_CALL, _frame(f, 97, "train_step"), *main)
    gpt = (_frame(f, 71, "forward"), *model_call)  # GPT.forward calling one block
    block = (_MODULE_CALL, *gpt)
    attn = (_MODULE_CALL, _frame(f, 54, "forward"), *block)
    mlp = (_MODULE_CALL, _frame(f, 56, "forward"), *block)

    embedding_weights = _site([_frame(f, 122, "load_weights")], main)
    layer_weights = _site([_frame(f, 124, "load_weights")], main)
    tokens = _site([_frame(f, 94, "train_step")], main)
    embedding = _site([_frame(f, 69, "forward")], model_call)
    ln1 = _site([_LAYER_NORM, _MODULE_CALL, _frame(f, 52, "forward")], block)
    qkv = _site([_LINEAR, _MODULE_CALL, _frame(f, 53, "forward")], block)
    scores = _site([_frame(f, 38, "forward")], attn)
    probs = _site([_frame(f, 39, "forward")], attn)
    context = _site([_frame(f, 40, "forward")], attn)
    residual = _site([_frame(f, 54, "forward")], block)
    ln2 = _site([_LAYER_NORM, _MODULE_CALL, _frame(f, 55, "forward")], block)
    fc1 = _site([_LINEAR, _MODULE_CALL, _frame(f, 45, "forward")], mlp)
    gelu = _site([_frame(f, 46, "forward")], mlp)
    checkpoint = _site([], gpt)  # checkpointing keeps only each block's input
    # the leak: a list that keeps one tensor per step for good, as a logging bug would
    history = _site([_frame(f, 99, "train_step")], main)
    logits = _site([_LINEAR, _MODULE_CALL, _frame(f, 74, "forward")], model_call)
    log_softmax = _site([_frame(f, 100, "train_step")], main)
    backward = _site(_BACKWARD, [_frame(f, 101, "train_step"), *main])
    optimizer = _site(
        [
            _frame("torch/optim/adamw.py", 169, "_init_group"),
            _frame("torch/optim/adamw.py", 230, "step"),
        ],
        [_frame(f, 112, "train_step"), *main],
    )


class ServeSites:
    """``demo_serve.py``: an LLM server with continuous batching (`_server_program`)."""

    f = "demo_serve.py"
    main = (_frame(f, 118, "serve"), _frame(f, 131, "<module>"))
    admit = (_frame(f, 88, "admit"), *main)
    decode = (_frame(f, 102, "decode_step"), *main)

    layer_weights = _site([_frame(f, 24, "load_model")], main)
    embedding_weights = _site([_frame(f, 26, "load_model")], main)
    kv_reserve = _site([_frame(f, 41, "reserve")], admit)  # prompt + max_new_tokens up front
    kv_prompt_pages = _site([_frame(f, 47, "allocate_pages")], admit)
    prefill = _site([_frame(f, 90, "admit")], main)
    decode_logits = _site([_frame(f, 104, "decode_step")], main)
    kv_new_page = _site([_frame(f, 47, "allocate_pages")], decode)


class GraphSites:
    """``demo_graphs.py``: eager warm-up, two captures into one graph pool, replays
    (`pool_workloads.graph_program`)."""

    f = "demo_graphs.py"
    main = (_frame(f, 70, "<module>"),)
    layer = (_frame(f, 18, "forward"), _MODULE_CALL)
    warmup = _site([*layer, _frame(f, 33, "warm_up")], main)
    capture = _site([*layer, _frame(f, 40, "capture")], main)
    capture_second = _site([*layer, _frame(f, 62, "capture_second")], main)
    replay_loss = _site([_frame(f, 52, "replay_loop")], main)


class RlSites:
    """``demo_rl.py``: rollouts with the engine's weights and KV cache in MemPools, then
    training (`pool_workloads.rl_program`)."""

    f = "demo_rl.py"
    main = (_frame(f, 90, "run"), _frame(f, 101, "<module>"))
    weights = _site([_frame(f, 31, "wake_up")], main)
    kv_cache = _site([_frame(f, 38, "allocate_kv_cache")], main)
    optimizer = _site([_frame(f, 66, "train_step")], main)
    activations = _site([_frame(f, 62, "train_step")], main)
