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
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpumemviz.estimator.autocast import AutocastPolicy
from gpumemviz.snapshot.escaping import short_repr

__all__ = [
    "BLAS_OPS",
    "compiled_regions",
    "cuda_paths",
    "parse_arch",
    "patched",
    "recording_here",
    "sdpa_backend",
    "workspace_size",
]

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
    return parse_arch(arch)[0]


def parse_arch(arch: str | float | tuple[int, int]) -> tuple[int, int]:
    """A compute capability as (major, minor): "8.0", "sm_80", "90", 9.0, (8, 6), "hopper".

    >>> parse_arch("sm_86"), parse_arch("9.0"), parse_arch("ampere")
    ((8, 6), (9, 0), (8, 0))
    """
    if isinstance(arch, tuple):
        return int(arch[0]), int(arch[1])
    text = str(arch).strip().lower().removeprefix("sm_").removeprefix("sm")
    names = {
        "volta": (7, 0),
        "turing": (7, 5),
        "ampere": (8, 0),
        "ada": (8, 9),
        "hopper": (9, 0),
        "blackwell": (10, 0),
    }
    if text in names:
        return names[text]
    m = re.fullmatch(r"([0-9]+)(?:\.([0-9]+))?", text)
    if m is None:
        raise ValueError(
            f"arch must be a compute capability like '8.0' or '9.0' (or 'hopper'), "
            f"got {short_repr(arch)}"
        )
    whole = m.group(1)
    if m.group(2) is not None:
        return int(whole), int(m.group(2))
    # "90" (sm_90) is 9.0; "9" is 9.0 too
    return (int(whole[:-1]), int(whole[-1])) if len(whole) >= 2 else (int(whole), 0)


# The patches are installed once for all the threads recording at a time and removed when
# the last one finishes; each patched function behaves as torch's own outside a recording
# thread, so other threads never see them.
_LOCK = threading.Lock()
_THREAD = threading.local()
_installed: list[tuple[object, str, object]] = []  # (owner, attribute, torch's own value)
_users = [0]


def recording_here() -> bool:
    """This thread is recording a step (`torch.autocast("cuda")` is modelled)."""
    return bool(getattr(_THREAD, "paths", None))


def _paths_here() -> bool:
    """This thread is recording a step with CUDA's foreach / fused paths."""
    paths: list[bool] = getattr(_THREAD, "paths", [])
    return bool(paths) and paths[-1]


def _install() -> None:
    """Put the thread-aware wrappers in place (called under `_LOCK`, by the first user)."""
    import torch
    from torch.amp import autocast_mode
    from torch.utils import _foreach_utils as fu

    def with_meta(original: Any) -> Any:  # Any: torch's device-list functions
        def devices() -> list[str]:
            found = list(original())
            return [*found, "meta"] if _paths_here() else found

        return devices

    originals = {
        "_get_foreach_kernels_supported_devices": fu._get_foreach_kernels_supported_devices,
        "_get_fused_kernels_supported_devices": fu._get_fused_kernels_supported_devices,
    }
    wrappers = {name: with_meta(f) for name, f in originals.items()}
    for m in list(sys.modules.values()):
        for name, original in originals.items():
            # the module's own namespace: a module-level __getattr__ may import or warn
            if getattr(m, "__dict__", {}).get(name) is original:
                _installed.append((m, name, original))
                setattr(m, name, wrappers[name])

    cls = autocast_mode.autocast
    init = cls.__dict__["__init__"]

    def autocast_init(
        self: Any,
        device_type: str,
        dtype: Any = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:  # Any: torch.autocast and a dtype
        if device_type != "cuda" or not recording_here():
            init(self, device_type, dtype, enabled, cache_enabled)
            return
        # torch's own __init__ would warn "CUDA is not available ... Disabling autocast" and
        # disable the region; on the meta device `AutocastPolicy` applies CUDA's casts
        self.device = "cuda"
        self.fast_dtype = torch.get_autocast_dtype("cuda") if dtype is None else dtype
        self.custom_backend_name = torch._C._get_privateuse1_backend_name()
        self._cache_enabled = (
            torch.is_autocast_cache_enabled() if cache_enabled is None else cache_enabled
        )
        self._enabled = enabled

    _installed.append((cls, "__init__", init))
    cls.__init__ = autocast_init

    # torch imports dynamo during meta runs anyway; imported here, its hook is in place before
    # the step can enter a compiled region
    import torch._dynamo.eval_frame as frames

    # torch.compile's regions run eager, and are noted
    set_frame = frames.__dict__["_maybe_set_eval_frame"]

    def eager_in_recordings(callback: Any) -> Any:  # Any: dynamo's callback
        if callback is None or not recording_here():
            return set_frame(callback)
        # a compiled function is entered by a recording thread: under the recording's
        # dispatch mode torch.compile would skip the function for good (its code marked
        # to run eager in every later call); run it eager without telling dynamo
        wrapper = sys._getframe(1)
        fn = wrapper.f_locals.get("fn")
        code = getattr(fn, "__code__", None)
        name = getattr(fn, "__qualname__", repr(fn))
        where = f"{name} ({code.co_filename}:{code.co_firstlineno})" if code else name
        regions: list[str] = getattr(_THREAD, "compiled", [])
        if where not in regions:
            regions.append(where)
        _THREAD.compiled = regions
        return set_frame(None)

    _installed.append((frames, "_maybe_set_eval_frame", set_frame))
    setattr(frames, "_maybe_set_eval_frame", eager_in_recordings)  # noqa: B010


def _uninstall() -> None:
    """Put torch's own functions back (called under `_LOCK`, by the last user)."""
    while _installed:
        owner, name, original = _installed.pop()
        setattr(owner, name, original)


def compiled_regions() -> list[str]:
    """The torch.compile regions this thread ran eager while recording ("name (file:line)"),
    taken (the list starts again empty)."""
    regions: list[str] = getattr(_THREAD, "compiled", [])
    _THREAD.compiled = []
    return regions


def patched() -> int:
    """How many of torch's functions are replaced right now (0 outside any recording)."""
    with _LOCK:
        return len(_installed)


@contextmanager
def cuda_paths(on: bool = True) -> Iterator[AutocastPolicy]:
    """While inside, this thread runs meta tensors as CUDA would: the foreach / fused device
    checks accept meta (when `on`), `scaled_dot_product_attention` takes CUDA's fused kernel
    (when `on`), and `torch.autocast("cuda", ...)` regions cast as on CUDA (always: the yielded
    `AutocastPolicy`, whose `notes` say what could not be modelled).

    Every loaded module holding torch's own `_get_foreach_kernels_supported_devices` or
    `_get_fused_kernels_supported_devices` (the optimizers, `clip_grad_norm_`) and
    `torch.autocast.__init__` get wrappers that behave as torch's own in any other thread;
    they are installed by the first thread in and removed by the last one out.
    """
    with _LOCK:
        if _users[0] == 0:
            try:
                _install()
            except BaseException:
                _uninstall()
                raise
        _users[0] += 1
    if not hasattr(_THREAD, "paths"):
        _THREAD.paths = []
    _THREAD.paths.append(on)
    try:
        policy = AutocastPolicy()
        with _cuda_functions(policy, fused=on):
            yield policy
    finally:
        _THREAD.paths.pop()
        with _LOCK:
            _users[0] -= 1
            if _users[0] == 0:
                _uninstall()


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


def _cuda_functions(policy: AutocastPolicy, *, fused: bool) -> Any:  # Any: a function mode
    """The torch function mode of `cuda_paths`: CUDA autocast's casts (`policy`) and, when
    `fused`, `F.scaled_dot_product_attention` on meta tensors through `sdpa_backend`'s fused
    kernel (its autograd formula included) instead of the math path.

    It is a `PreDispatchTorchFunctionMode` because that is the mode `torch.autocast` tells
    when a region starts and ends (`_enter_autocast`, `_exit_autocast`)."""
    import torch
    from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
    from torch.fx.experimental.proxy_tensor import PreDispatchTorchFunctionMode

    from gpumemviz.estimator.callers import library_dirs, user_frame

    sdpa = torch.nn.functional.scaled_dot_product_attention
    aten = torch.ops.aten
    skip = library_dirs()

    def fused_sdpa(
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

    class CudaFunctions(PreDispatchTorchFunctionMode):  # type: ignore[misc]
        def __init__(self) -> None:  # no tracer: only the autocast notifications are wanted
            torch.overrides.TorchFunctionMode.__init__(self)

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:  # Any: torch's function-mode arguments
            kwargs = kwargs or {}
            if func is _enter_autocast:
                policy.enter(str(args[0]), bool(args[2]), user_frame(skip))
                return None
            if func is _exit_autocast:
                policy.exit(user_frame(skip))
                return None
            casting = policy.active()
            if casting:
                args, kwargs = policy.apply(func, args, kwargs)
            if fused and func is sdpa:
                out = fused_sdpa(*args, **kwargs)
                if out is not None:
                    return out
            return func(*args, **kwargs)

    return CudaFunctions()
