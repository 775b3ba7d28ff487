"""The estimate runs the step as CUDA would, not as meta does: CUDA autocast's casts, autograd's
in-place backward formulas, and torch's functions left as they were for every other thread."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch

from gpumemviz.estimator import autocast as ac
from gpumemviz.estimator import estimate
from gpumemviz.estimator.extras import patched
from gpumemviz.estimator.record import ALLOC
from gpumemviz.estimator.run import record_step

# ---------------------------------------------------------------- CUDA autocast on meta

# torch 2.13.0, aten/src/ATen/autocast_mode.h (installed as torch/include/ATen/autocast_mode.h),
# which autocast_mode.cpp registers for CUDA with KERNEL_CUDA:
# lines 820-853, AT_FORALL_LOWER_PRECISION_FP
LOWER = [
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
]
# lines 855-914, AT_FORALL_FP32
FP32 = [
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "frobenius_norm",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
]
# lines 916-927, AT_FORALL_FP32_SET_OPT_DTYPE
FP32_SET_OPT_DTYPE = [
    "prod",
    "softmax",
    "log_softmax",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "sum",
]
# lines 946-957, AT_FORALL_PROMOTE
PROMOTE = [
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
]

HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"


def _macro(text: str, name: str) -> set[str]:
    body = text.split(f"#define {name}(_)", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"_\((\w+)", body))


def test_the_lists_are_torch_2_13s():
    assert set(LOWER) == ac.LOWER_PRECISION
    assert set(FP32) == ac.FP32
    assert set(FP32_SET_OPT_DTYPE) == ac.FP32_SET_OPT_DTYPE
    assert set(PROMOTE) == ac.PROMOTE
    if torch.__version__.startswith("2.13") and HEADER.exists():  # the installed source
        text = HEADER.read_text()
        assert _macro(text, "AT_FORALL_LOWER_PRECISION_FP") == set(LOWER)
        assert _macro(text, "AT_FORALL_FP32") == set(FP32)
        assert _macro(text, "AT_FORALL_FP32_SET_OPT_DTYPE") == set(FP32_SET_OPT_DTYPE)
        assert _macro(text, "AT_FORALL_PROMOTE") == set(PROMOTE)


B, D, V = 8, 64, 32  # batch, width, classes


def _as_written(device):
    """A small mixed-precision step, as people write it."""
    w1 = torch.randn(D, D, device=device, requires_grad=True)
    w2 = torch.randn(V, D, device=device, requires_grad=True)
    x = torch.randn(B, D, device=device)
    y = torch.zeros(B, dtype=torch.long, device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = torch.einsum("bi,oi->bo", x, w1)  # lower precision
        g = torch.exp(h)  # fp32
        s = g.sum(-1, keepdim=True)  # fp32_set_opt_dtype
        p = torch.addcmul(h, g, s)  # promote: bf16 and fp32 -> fp32
        with torch.autocast("cuda", enabled=False):
            q = p * 2  # no casts inside a disabled region
        logits = q @ w2.t()  # lower precision (the weight's cast: w2.t() is a view)
        loss = torch.nn.functional.cross_entropy(logits, y)  # log_softmax in fp32
    loss.backward()


def _by_hand(device):
    """The same step with CUDA autocast's casts written out (what torch does on a GPU)."""
    bf16, f32 = torch.bfloat16, torch.float32
    w1 = torch.randn(D, D, device=device, requires_grad=True)
    w2 = torch.randn(V, D, device=device, requires_grad=True)
    x = torch.randn(B, D, device=device)
    y = torch.zeros(B, dtype=torch.long, device=device)
    h = torch.einsum("bi,oi->bo", x.to(bf16), w1.to(bf16))
    g = torch.exp(h.to(f32))
    s = g.sum(-1, keepdim=True, dtype=f32)
    p = torch.addcmul(h.to(f32), g, s)
    q = p * 2
    logits = q.to(bf16) @ w2.t().to(bf16)
    loss = torch.nn.functional.cross_entropy(logits.to(f32), y)
    loss.backward()


def test_autocast_regions_cast_as_cuda_does():
    written = record_step(_as_written)
    by_hand = record_step(_by_hand)
    sizes = [(e.op, e.size) for e in written.events if e.kind == ALLOC]
    assert sizes == [(e.op, e.size) for e in by_hand.events if e.kind == ALLOC]
    assert written.notes == []
    # each operator's dtype, read from its output size (B x D elements unless said)
    n = B * D
    forward = [s for s in sizes if s[0] != "randn"][:12]
    assert forward == [
        ("zeros", B * 8),  # the targets (int64)
        ("_to_copy", n * 2),  # x -> bf16 for einsum
        ("_to_copy", D * D * 2),  # w1 -> bf16 (a leaf weight: cached for the region)
        ("bmm", n * 2),  # einsum in bf16
        ("_to_copy", n * 4),  # h -> fp32 for exp
        ("exp", n * 4),
        ("sum", B * 4),  # the sum in fp32
        ("_to_copy", n * 4),  # h -> fp32: addcmul promotes to its widest input
        ("addcmul", n * 4),
        ("mul", n * 4),  # the disabled region: fp32 as written
        ("_to_copy", n * 2),  # q -> bf16 for the matmul
        ("_to_copy", V * D * 2),  # w2.t() -> bf16
    ]
    assert ("mm", B * V * 2) in sizes and ("_log_softmax", B * V * 4) in sizes
    # without the policy, the same program on meta runs in fp32: bigger, and no casts
    est_written = estimate(_as_written, capacity="1GiB")
    assert est_written.step_allocs == tuple(e.size for e in written.events if e.kind == ALLOC)


def test_autocast_warning_is_intercepted_and_torch_keeps_it_elsewhere():
    # pytest turns warnings into errors: an unintercepted "CUDA is not available" would fail
    est = estimate(_as_written, capacity="1GiB")
    assert est.fits and est.notes == ()
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            torch.autocast("cuda", dtype=torch.bfloat16)


def test_weight_casts_are_cached_until_the_outermost_region_exits():
    def step(device):
        w = torch.randn(D, D, device=device, requires_grad=True)
        x = torch.randn(B, D, device=device)
        with torch.autocast("cuda", dtype=torch.float16):
            for _ in range(3):
                x = x @ w  # one cast of w, used three times
        return x

    rec = record_step(step)
    casts = [e.size for e in rec.events if e.kind == ALLOC and e.op == "_to_copy"]
    assert casts == [B * D * 2, D * D * 2]  # x once (then already fp16), w once


def test_a_region_that_cannot_be_modelled_is_in_the_notes():
    def step(device):
        x = torch.randn(B, D, device=device)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return x @ x.t()

    est = estimate(step, capacity="1GiB")
    assert len(est.notes) == 1
    assert "torch.autocast('cpu')" in est.notes[0] and "test_cuda_semantics.py" in est.notes[0]
    assert "ran without casts" in str(est)


# ---------------------------------------------------------------- in-place backward


class _Net(torch.nn.Module):
    """Every backward formula that is in place in eager and out of place on meta."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Parameter(torch.randn(100, 32))
        self.a = torch.nn.Linear(32, 32, bias=False)
        self.b = torch.nn.Linear(32, 32, bias=False)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed[ids]  # backward: index_put_ with accumulate
        h = x + self.a(x)  # x used twice: the engine accumulates its gradient with add_
        h = h + self.b(h)
        top = h.max(dim=-1, keepdim=True).values  # backward: scatter_
        return (h - top).gather(-1, targets).sum()  # backward: scatter_add_


def _net_setup(device):
    with torch.device(device):
        torch.manual_seed(0)
        return _Net(), torch.randint(0, 100, (4, 8)), torch.randint(0, 32, (4, 8, 1))


def _net_step(state):
    net, ids, targets = state
    net(ids, targets).backward()


def test_backward_stays_in_place_as_a_plain_cpu_run():
    from torch.profiler import ProfilerActivity, profile

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no per-thread reduction buffers in the CPU run
    try:
        state = _net_setup("cpu")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _net_step(state)
    finally:
        torch.set_num_threads(threads)
    cpu = [
        e.nbytes()
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.nbytes() > 0
    ]
    est = estimate(_net_step, setup=_net_setup, capacity="1GiB", cuda_paths=False)
    assert list(est.step_allocs) == cpu
    rec = record_step(_net_step, setup=_net_setup, cuda_paths=False)
    assert rec.in_place >= 4  # add_ (twice), scatter_, scatter_add_, at least


# ---------------------------------------------------------------- threads


def _adamw_setup(device, *, fused=False):
    with torch.device(device):
        model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(3)))
    return model, torch.optim.AdamW(model.parameters(), fused=fused)


def _adamw_step(state):
    model, opt = state
    model(torch.randn(4, 64, device="meta")).sum().backward()
    opt.step()


def test_two_threads_estimating_at_once_leave_torch_as_it_was():
    from torch.optim import optimizer
    from torch.utils import _foreach_utils as fu

    def current():
        return (
            fu._get_foreach_kernels_supported_devices,
            optimizer._get_fused_kernels_supported_devices,
        )

    before = current()
    init = torch.autocast.__init__
    alone = estimate(_adamw_step, setup=_adamw_setup, capacity="1GiB").peak_allocated
    results: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(10):
                results.append(estimate(_adamw_step, setup=_adamw_setup).peak_allocated)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [alone] * 20
    assert patched() == 0
    assert current() == before and torch.autocast.__init__ is init
    fused = estimate(lambda s: _adamw_step(s), setup=lambda d: _adamw_setup(d, fused=True))
    assert fused.fits and any(e == 64 * 64 * 4 for e in fused.step_allocs)


def test_another_thread_never_sees_the_patches():
    from torch.optim import optimizer

    inside, leave = threading.Event(), threading.Event()
    seen: list[list[str]] = []

    def step(device):
        seen.append(list(optimizer._get_foreach_kernels_supported_devices()))
        inside.set()
        leave.wait(30)
        return torch.empty(4, device=device)

    t = threading.Thread(target=lambda: estimate(step))
    t.start()
    assert inside.wait(30)
    try:
        assert patched() > 0  # installed while the other thread records
        assert "meta" not in optimizer._get_foreach_kernels_supported_devices()
        if not torch.cuda.is_available():
            with pytest.warns(UserWarning, match="CUDA is not available"):
                torch.autocast("cuda")
    finally:
        leave.set()
        t.join()
    assert "meta" in seen[0]
    assert patched() == 0
