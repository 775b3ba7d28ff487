"""A GPT-2-shaped language model and its steps, written for the estimate tests and benchmark.

Shaped like the model of the licensed recording
tests/data/real/Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle
(PROVENANCE.md): pre-norm RMSNorm, rotary position embedding, SwiGLU, attention written by hand
(scores, mask with `torch.where`, a softmax that subtracts the max), fp32, no bias, untied
embedding and head. Written here from those facts; the operator order follows the recording's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

MEDIUM = {"d_model": 1024, "d_ff": 4096, "layers": 24, "heads": 16, "vocab": 10_000}
SMALL = {"d_model": 64, "d_ff": 256, "layers": 2, "heads": 4, "vocab": 512}


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        nn.init.trunc_normal_(self.weight, std=math.sqrt(2 / (d_in + d_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = x * rms
        return (self.weight * x).to(dtype)


class Rotary(nn.Module):
    def __init__(self, context: int, d_head: int, theta: float = 10_000.0) -> None:
        super().__init__()
        inv = theta ** -(torch.arange(0, d_head, 2) / d_head)
        angles = torch.outer(torch.arange(context), inv)
        self.register_buffer("cache", torch.stack((angles.cos(), angles.sin())), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        pairs = x.unflatten(-1, (half, 2)).movedim(-1, 0)
        x1, x2 = pairs.unbind(0)
        cos, sin = self.cache[:, : x.size(-2), :].unbind(0)
        a = cos * x1 - sin * x2
        b = sin * x1 + cos * x2
        return torch.cat((a, b), dim=-1)


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    x = x - torch.max(x, dim=dim, keepdim=True)[0]
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(k.shape[-1])
    scores = torch.where(mask, scores, float("-inf"))
    weights = softmax(scores, dim=-1)
    return torch.einsum("...qk,...kd->...qd", weights, v)


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int, rope: Rotary) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (Linear(d_model, d_model) for _ in range(3))
        self.out = Linear(d_model, d_model)
        self.rope = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(-3, -2) for t in (q, k, v))
        q = self.rope(q)
        k = self.rope(k)
        t = x.size(-2)
        pos = torch.arange(t, device=x.device)
        mask = pos[:, None] >= pos[None, :]
        y = attention(q, k, v, mask)
        y = y.transpose(-3, -2).reshape(*y.shape[:-3], t, -1)
        return self.out(y)


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = (
            Linear(d_model, d_ff),
            Linear(d_ff, d_model),
            Linear(d_model, d_ff),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, rope: Rotary) -> None:
        super().__init__()
        self.ln1, self.ln2 = RMSNorm(d_model), RMSNorm(d_model)
        self.attn = Attention(d_model, heads, rope)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_attn = self.attn(self.ln1(x))  # named: it lives until the block returns
        h = x + x_attn
        x_ffn = self.ffn(self.ln2(h))
        return h + x_ffn


class GPT(nn.Module):
    def __init__(
        self, *, d_model: int, d_ff: int, layers: int, heads: int, vocab: int, context: int
    ) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.empty(vocab, d_model))
        nn.init.trunc_normal_(self.embed, std=1.0)
        rope = Rotary(context, d_model // heads)
        self.blocks = nn.ModuleList(Block(d_model, heads, d_ff, rope) for _ in range(layers))
        self.ln = RMSNorm(d_model)
        self.head = Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        embedded = self.embed[ids, :]  # named: it lives until forward returns
        x = embedded
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


@dataclass
class State:
    model: GPT
    ids: torch.Tensor
    targets: torch.Tensor
    kept: torch.Tensor  # the warm-up batches, kept alive as the recorded program keeps them
    optimizer: torch.optim.Optimizer | None = None
    autocast: bool = False  # forward (and loss) under torch.autocast("cuda", bfloat16)
    kept_targets: torch.Tensor | None = None  # the warm-up targets, kept alive too


def cross_entropy(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The recorded program's own loss: a log-softmax written by hand, then gather and mean."""
    x = inputs - torch.max(inputs, dim=-1, keepdim=True)[0]
    log_probs = x - torch.log(torch.sum(torch.exp(x), dim=-1, keepdim=True))
    return torch.mean(torch.gather(-log_probs, -1, targets.unsqueeze(-1)))


class AdamW(torch.optim.Optimizer):
    """The recorded program's own AdamW: one parameter at a time, its moments rebuilt each
    step (`state.get("m", torch.zeros_like(grad))` makes the zeros every step)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps=1e-8, wd=0.01) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": wd})

    def step(self, closure=None):  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.data
                state = self.state[p]
                alpha = group["lr"]
                beta_1, beta_2 = group["betas"]
                t = state.get("t", 1)
                prev_m = state.get("m", torch.zeros_like(grad))
                prev_v = state.get("v", torch.zeros_like(grad))
                m = beta_1 * prev_m + ((1 - beta_1) * grad)
                v = beta_2 * prev_v + ((1 - beta_2) * torch.square(grad))
                alpha_t = alpha * (math.sqrt(1 - beta_2**t) / (1 - beta_1**t))
                p.data -= alpha_t * m / (torch.sqrt(v) + group["eps"])
                p.data -= alpha * group["weight_decay"] * p.data
                state["m"], state["v"], state["t"] = m, v, t + 1


def make_setup(
    shape: dict[str, int],
    batch: int,
    context: int,
    *,
    warmup: int = 5,
    train: bool = False,
    autocast: bool = False,
    program_optimizer: bool = False,
):
    """`setup(device)` as the recorded program does it: the model, then its inputs (the warm-up
    batches it keeps, then the measured one), the optimizer for a training step
    (`program_optimizer`: the program's own AdamW, made before the inputs as it does; else
    torch's)."""

    def setup(device: torch.device) -> State:
        with torch.device(device):
            model = GPT(**shape, context=context)
            opt: torch.optim.Optimizer | None = None
            if program_optimizer:
                opt = AdamW(model.parameters())
            vocab = shape["vocab"]
            kept = torch.randint(0, vocab, (warmup, batch, context))
            ids = torch.randint(0, vocab, (1, batch, context))[0]
            kept_targets = None
            if train:
                kept_targets = torch.randint(0, vocab, (warmup, batch, context))
                targets = torch.randint(0, vocab, (1, batch, context))[0]
            else:
                targets = ids
        if train and opt is None:
            opt = torch.optim.AdamW(model.parameters())
        return State(model, ids, targets, kept, opt, autocast, kept_targets)

    return setup


def inference_step(state: State) -> None:
    state.model.eval()
    with (
        torch.inference_mode(),
        torch.autocast("cuda", dtype=torch.bfloat16, enabled=state.autocast),
    ):
        state.model(state.ids)


def training_step(state: State) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=state.autocast):
        logits = state.model(state.ids)
        if isinstance(state.optimizer, AdamW):  # the program's own loss with its own AdamW
            loss = cross_entropy(logits, state.targets)
        else:
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), state.targets.flatten())
    loss.backward()
    assert state.optimizer is not None
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
