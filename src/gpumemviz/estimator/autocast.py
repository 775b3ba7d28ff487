"""CUDA autocast on the meta device: the casts `torch.autocast("cuda", ...)` makes on a GPU.

On meta tensors CUDA autocast does nothing (its dispatch key belongs to CUDA tensors, and on a
machine without CUDA torch disables the region with a warning), so a mixed-precision step
would be estimated in fp32. While a step is recorded, `AutocastPolicy` applies CUDA autocast's
policy at the Python level, above autograd (so the backward sees the casts as on CUDA), using
the per-thread autocast state that `torch.autocast.__enter__` sets (enabled, dtype; nested
``enabled=False`` regions included):

- `LOWER_PRECISION`: floating inputs (not float64) are cast to the region's dtype;
- `FP32`: they are cast to float32;
- `FP32_SET_OPT_DTYPE`: the operator is called with ``dtype=torch.float32`` unless one is given;
- `PROMOTE`: they are cast to the widest floating type among them.

The lists are torch 2.13's (`ATen/autocast_mode.h`, installed with torch as
torch/include/ATen/autocast_mode.h: `AT_FORALL_LOWER_PRECISION_FP`, `AT_FORALL_FP32`,
`AT_FORALL_FP32_SET_OPT_DTYPE`, `AT_FORALL_PROMOTE`, which `autocast_mode.cpp` registers for
CUDA with `KERNEL_CUDA`). As on CUDA, the lower-precision copy of a float32 leaf that requires
grad (a weight) is cached until the outermost autocast region exits (not under
`torch.inference_mode()`, where torch does not cache).

What cannot be modelled is said in `notes`: an autocast region for another device (meta
tensors are not CPU tensors either), and one entered before the recording started.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = [
    "FP32",
    "FP32_SET_OPT_DTYPE",
    "LOWER_PRECISION",
    "PROMOTE",
    "AutocastPolicy",
    "policy_of",
]

# torch 2.13 ATen/autocast_mode.h, AT_FORALL_LOWER_PRECISION_FP (overload names dropped)
LOWER_PRECISION = frozenset(
    {
        *("_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d"),
        *("conv_transpose2d", "conv_transpose3d", "convolution", "prelu", "addmm", "addmv"),
        *("addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm"),
        *("baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell"),
        *("_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"),
        *("_scaled_dot_product_flash_attention", "scaled_dot_product_attention"),
    }
)
# torch 2.13 ATen/autocast_mode.h, AT_FORALL_FP32
FP32 = frozenset(
    {
        *("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p"),
        *("reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm"),
        *("native_layer_norm", "rms_norm", "group_norm", "frobenius_norm", "nuclear_norm"),
        *("cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss"),
        *("nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss"),
        *("huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss"),
        *("soft_margin_loss", "triplet_margin_loss", "multi_margin_loss"),
        *("binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm"),
        *("logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d"),
        *("upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d"),
        *("_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d"),
        *("_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d"),
        *("_upsample_bicubic2d_aa",),
    }
)
# torch 2.13 ATen/autocast_mode.h, AT_FORALL_FP32_SET_OPT_DTYPE
FP32_SET_OPT_DTYPE = frozenset(
    {
        *("prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm"),
        *("linalg_matrix_norm", "sum"),
    }
)
# torch 2.13 ATen/autocast_mode.h, AT_FORALL_PROMOTE
PROMOTE = frozenset(
    {
        *("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler"),
        *("index_put", "tensordot", "scatter_add"),
    }
)
# Python-level names of composites whose first listed operator decides their inputs' dtype
# on CUDA, where the inner operator cannot be seen from the Python level: cross entropy runs
# log_softmax(x, dtype=float32) first (torch's LossNLL.cpp, cross_entropy_loss)
_COMPOSITE_FP32 = frozenset({"cross_entropy", "cross_entropy_loss"})
# Python operators reaching a torch function mode under their dunder names
_DUNDER = {"__matmul__": "matmul", "__rmatmul__": "matmul", "__pow__": "pow", "__rpow__": "pow"}


def policy_of(name: str) -> str:
    """The CUDA autocast policy of an operator (its Python or aten name): "lower", "fp32",
    "fp32_set_opt_dtype", "promote" or "" (runs in its inputs' dtype).

    >>> policy_of("einsum"), policy_of("exp"), policy_of("sum"), policy_of("addcmul")
    ('lower', 'fp32', 'fp32_set_opt_dtype', 'promote')
    >>> policy_of("__matmul__"), policy_of("add")
    ('lower', '')
    """
    name = _DUNDER.get(name, name)
    if name in LOWER_PRECISION:
        return "lower"
    if name in FP32 or name in _COMPOSITE_FP32:
        return "fp32"
    if name in FP32_SET_OPT_DTYPE:
        return "fp32_set_opt_dtype"
    if name in PROMOTE:
        return "promote"
    return ""


class AutocastPolicy:
    """The casting half of a torch function mode: `apply(func, args, kwargs)` returns the
    arguments CUDA autocast would pass to `func` under the current thread's CUDA autocast
    state, and `enter` / `exit` follow the regions (for the weight-cast cache and `notes`)."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.regions: list[tuple[str, bool, bool]] = []  # (device, enabled, cache_enabled)
        self.cache: dict[int, tuple[weakref.ref[Any], Any]] = {}  # id(weight) -> its cast
        self.notes: list[str] = []
        self.casts = 0  # tensors cast

    # -- regions

    def enter(self, device: str, enabled: bool, where: str) -> None:
        """A `torch.autocast(device)` region starts (`where`: the user's frame)."""
        self.regions.append((device, enabled, True))
        if enabled and device != "cuda":
            note = (
                f"torch.autocast({device!r}) at {where or '?'} ran without casts: only CUDA "
                f"autocast is modelled on the meta device"
            )
            if note not in self.notes:
                self.notes.append(note)

    def exit(self, where: str) -> None:
        """A region ends; leaving the outermost one drops the cached weight casts."""
        if not self.regions:
            note = (
                f"an autocast region entered before the recording ended at {where or '?'}: "
                f"its casts were not modelled"
            )
            if note not in self.notes:
                self.notes.append(note)
            return
        self.regions.pop()
        if not self.regions:
            self.cache.clear()

    # -- casts

    def active(self) -> bool:
        """CUDA autocast is on in this thread."""
        return bool(self.torch.is_autocast_enabled("cuda"))

    def apply(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """`args`, `kwargs` as CUDA autocast passes them to `func` (when it is on)."""
        policy = policy_of(getattr(func, "__name__", ""))
        if not policy:
            return args, kwargs
        torch = self.torch
        if policy == "fp32_set_opt_dtype":
            first = args[0] if args else None
            if ("dtype" not in kwargs or kwargs["dtype"] is None) and self._eligible(first):
                kwargs = {**kwargs, "dtype": torch.float32}
            return args, kwargs
        if policy == "lower":
            to = torch.get_autocast_dtype("cuda")
        elif policy == "fp32":
            to = torch.float32
        else:  # promote: the widest floating type among the eligible inputs
            to = torch.get_autocast_dtype("cuda")
            for t in _flat(args, kwargs):
                if self._eligible(t):
                    to = torch.promote_types(to, t.dtype)
        cast = self._caster(to, policy == "lower")
        return tuple(_map(cast, a) for a in args), {k: _map(cast, v) for k, v in kwargs.items()}

    def _eligible(self, t: Any) -> bool:  # Any: anything an operator is given
        torch = self.torch
        return (
            isinstance(t, torch.Tensor)
            and t.device.type == "meta"
            and t.is_floating_point()
            and t.dtype is not torch.float64
        )

    def _caster(self, to: Any, lower: bool) -> Any:  # Any: a dtype; returns a function
        torch = self.torch
        # autocast_mode.cpp, cached_cast: lower-precision casts of fp32 leaves that require
        # grad, not under inference_mode (torch issue 158232)
        caching = (
            lower
            and to is not torch.float32
            and torch.is_autocast_cache_enabled()
            and not torch.is_inference_mode_enabled()
        )

        def cast(t: Any) -> Any:
            if not self._eligible(t) or t.dtype is to:
                return t
            self.casts += 1
            if not (
                caching
                and t.dtype is torch.float32
                and t.requires_grad
                and t.is_leaf
                and not t._is_view()
            ):
                return t.to(to)
            hit = self.cache.get(id(t))
            if hit is not None and hit[0]() is t:
                return hit[1]
            out = t.to(to)
            self.cache[id(t)] = (weakref.ref(t), out)
            return out

        return cast


def _map(f: Any, v: Any) -> Any:  # Any: operator arguments
    if isinstance(v, list | tuple):
        return type(v)(f(x) for x in v)
    return f(v)


def _flat(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, list | tuple):
            out.extend(v)
        else:
            out.append(v)
    return out
