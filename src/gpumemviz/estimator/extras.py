"""What CUDA allocates that a meta run does not: cuBLAS workspaces, and the optimizer paths.

cuBLAS workspaces: torch gives each cuBLAS handle, per stream, one workspace from the caching
allocator the first time the handle runs a matrix product, and keeps it
(`CublasHandlePool.cpp`: `getNewWorkspace`). Its size is `CUBLAS_WORKSPACE_CONFIG`
(":SIZE_KiB:COUNT" pairs summed) or torch's default, which depends on the architecture:
":4096:2:16:8" (8 MiB + 128 KiB) before Hopper, 32 MiB from Hopper (compute capability 9.x)
on. cuBLASLt shares that workspace by default (TORCH_CUBLASLT_UNIFIED_WORKSPACE). Handles are
per thread: the autograd engine runs a CUDA backward on its own device thread, so a training
step has a second handle and a second workspace.

Optimizer paths: for CUDA tensors torch's optimizers and `clip_grad_norm_` default to the
foreach kernels (`torch.utils._foreach_utils._get_foreach_kernels_supported_devices`), which
allocate their temporaries for every parameter at once; for meta tensors they would take the
per-parameter loop. `cuda_paths()` counts meta as a CUDA-like device while the step runs.

Attention: `scaled_dot_product_attention` picks its kernel by device; on meta it takes the math
path, which allocates the (queries x keys) score matrix that CUDA's fused kernels never make.
`cuda_paths()` sends it to the fused kernel CUDA would pick (`sdpa_backend`: flash attention
for fp16 / bf16 without a mask, else memory-efficient attention), whose meta kernels give
CUDA's outputs (the output and its log-sum-exp, kept for the backward).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpumemviz.snapshot.escaping import short_repr

__all__ = ["BLAS_OPS", "cuda_paths", "sdpa_backend", "workspace_size"]

# the aten operators (overload packets) that call cuBLAS / cuBLASLt on CUDA
BLAS_OPS = frozenset(
    {
        *("mm", "bmm", "addmm", "addmm_", "baddbmm", "baddbmm_", "addbmm", "addbmm_"),
        *("addmv", "addmv_", "mv", "dot", "vdot", "_addmm_activation", "_scaled_mm"),
        *("_int_mm", "linear", "matmul"),
    }
)

_PRE_HOPPER = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8"
_HOPPER_ON = 4096 * 1024 * 8  # ":4096:8"
_PAIR = re.compile(r":([0-9]+):([0-9]+)")


def workspace_size(arch: str | float | tuple[int, int] = "9.0", config: str | None = None) -> int:
    """Bytes of one cuBLAS workspace on a GPU of compute capability `arch`.

    `config` is a `CUBLAS_WORKSPACE_CONFIG` value (":4096:8", sizes in KiB times counts);
    None (or empty) means torch's default for `arch`.

    >>> workspace_size("8.0") == 8 * 2**20 + 128 * 2**10, workspace_size("9.0") // 2**20
    (True, 32)
    >>> workspace_size("8.0", ":4096:8") // 2**20
    32
    """
    if config:
        pairs = _PAIR.findall(config)
        if not pairs or _PAIR.sub("", config).strip():
            raise ValueError(
                f"CUBLAS_WORKSPACE_CONFIG {short_repr(config)} is not ':SIZE:COUNT' pairs"
            )
        return sum(int(a) * int(b) * 1024 for a, b in pairs)
    major = _major(arch)
    return _HOPPER_ON if major >= 9 else _PRE_HOPPER


def _major(arch: str | float | tuple[int, int]) -> int:
    if isinstance(arch, tuple):
        return int(arch[0])
    text = str(arch).strip().lower().removeprefix("sm_").removeprefix("sm")
    names = {"volta": 7, "turing": 7, "ampere": 8, "ada": 8, "hopper": 9, "blackwell": 10}
    if text in names:
        return names[text]
    m = re.fullmatch(r"([0-9]+)(?:\.([0-9]+))?", text)
    if m is None:
        raise ValueError(
            f"arch must be a compute capability like '8.0' or '9.0' (or 'hopper'), "
            f"got {short_repr(arch)}"
        )
    whole = m.group(1)
    # "90" (sm_90) is 9.0; "9" or "9.0" too
    return int(whole[:-1]) if m.group(2) is None and len(whole) >= 2 else int(whole)


@contextmanager
def cuda_paths(on: bool = True) -> Iterator[None]:
    """While inside, torch's foreach / fused device checks accept meta tensors (when `on`).

    Every loaded module holding torch's own `_get_foreach_kernels_supported_devices` or
    `_get_fused_kernels_supported_devices` (the optimizers, `clip_grad_norm_`) sees one that
    adds "meta"; the originals are put back on exit.
    """
    if not on:
        yield
        return
    from torch.utils import _foreach_utils as fu

    def with_meta(original: object) -> object:
        def devices() -> list[str]:
            return [*original(), "meta"]  # type: ignore[operator]

        return devices

    originals = {
        "_get_foreach_kernels_supported_devices": fu._get_foreach_kernels_supported_devices,
        "_get_fused_kernels_supported_devices": fu._get_fused_kernels_supported_devices,
    }
    patched: list[tuple[object, str, object]] = []
    for m in list(sys.modules.values()):
        for name, original in originals.items():
            # the module's own namespace: a module-level __getattr__ may import or warn
            if getattr(m, "__dict__", {}).get(name) is original:
                patched.append((m, name, original))
                setattr(m, name, with_meta(original))
    try:
        with _fused_attention():
            yield
    finally:
        for mod, name, original in patched:
            setattr(mod, name, original)


def sdpa_backend(
    dtype_name: str, head_dim: int, *, has_mask: bool, gqa: bool = False, ndim: int = 4
) -> str:
    """The kernel CUDA's `scaled_dot_product_attention` picks: "flash", "efficient" or "math".

    A simplification of torch's `sdp_utils.cpp` on sm80 and later: flash attention for fp16 /
    bf16 inputs without a mask and a head size that is a multiple of 8 up to 256; else
    memory-efficient attention for fp16 / bf16 / fp32 with a head size that is a multiple of 8;
    else the math path.

    >>> sdpa_backend("bfloat16", 64, has_mask=False), sdpa_backend("float32", 64, has_mask=True)
    ('flash', 'efficient')
    """
    if gqa or ndim != 4 or head_dim % 8:
        return "math"
    if dtype_name in ("float16", "bfloat16") and not has_mask and head_dim <= 256:
        return "flash"
    if dtype_name in ("float16", "bfloat16", "float32"):
        return "efficient"
    return "math"


@contextmanager
def _fused_attention() -> Iterator[None]:
    """While inside, `F.scaled_dot_product_attention` on meta tensors runs `sdpa_backend`'s
    fused kernel (its autograd formula included) instead of the math path."""
    import torch
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention
    aten = torch.ops.aten

    def fused(
        q: Any,
        k: Any,
        v: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:  # Any: tensors
        if not all(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in (q, k, v)):
            return None
        kind = sdpa_backend(
            str(q.dtype).removeprefix("torch."),
            int(q.size(-1)),
            has_mask=attn_mask is not None,
            gqa=enable_gqa,
            ndim=q.dim(),
        )
        if kind == "flash":
            return aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale
            )[0]
        if kind == "efficient":
            grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            return aten._scaled_dot_product_efficient_attention(
                q, k, v, attn_mask, grad, dropout_p, is_causal, scale=scale
            )[0]
        return None

    class FusedAttention(TorchFunctionMode):  # type: ignore[misc]
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:  # Any: torch's function-mode arguments
            kwargs = kwargs or {}
            if func is sdpa:
                out = fused(*args, **kwargs)
                if out is not None:
                    return out
            return func(*args, **kwargs)

    with FusedAttention():
        yield
