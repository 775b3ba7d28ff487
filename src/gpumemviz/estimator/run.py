"""`estimate(step, setup=, capacity=, config=)`: will a step fit, before running it on a GPU.

Records the step on the meta device (`record`), adds what CUDA adds (`extras`) and drives the
allocator model (`drive`). The arguments are checked here, each with a one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.estimator.drive import drive
from gpumemviz.estimator.extras import BLAS_OPS, parse_arch, workspace_size
from gpumemviz.estimator.record import StepRecording, record
from gpumemviz.estimator.scratch import DeviceFacts, device_facts
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.units import parse_size

if TYPE_CHECKING:
    from gpumemviz.estimator.result import Estimate

__all__ = ["estimate", "estimate_recording", "record_step", "resolve_facts"]


def estimate(
    step: Callable[[Any], Any],
    *,
    setup: Callable[[Any], Any] | None = None,
    capacity: int | str = "80GiB",
    config: str = "",
    arch: str | None = None,
    cublas_workspace_config: str | None = None,
    cuda_paths: bool = True,
    warmup: int | None = None,
    sm_count: int | None = None,
) -> Estimate:
    """Predict a step's GPU memory, fragmentation included, from a run on the meta device.

    Parameters
    ----------
    step : callable
        The measured part. With `setup`, ``step(state)``; without, ``step(device)`` and all
        it allocates counts. `device` is ``torch.device("meta")``: build tensors and modules
        on it (``with torch.device(device):``).
    setup : callable, optional
        ``state = setup(device)`` runs first: what it allocates (model, optimizer state,
        inputs) is live when the step starts, as in a recording that starts after warm-up
        (the step's cuBLAS workspaces exist too).
    capacity : int or str
        Bytes the process can get on the device ("80GiB"), as in ``gpumemviz whatif
        --capacity``: an H100 80 GB card gives a process about 79 GiB.
    config : str
        ``PYTORCH_CUDA_ALLOC_CONF`` settings, e.g. "expandable_segments:True".
    arch : str, optional
        The GPU's compute capability ("8.0" A100, "9.0" H100): torch's default cuBLAS
        workspace is 8 MiB + 128 KiB before Hopper and 32 MiB from it on. None: the GPU's,
        read from torch where CUDA is already initialised or from NVML, else "9.0"
        (`scratch.device_facts`).
    sm_count : int, optional
        The GPU's SM count, which sizes the reductions' staging buffers; None: the GPU's, or
        the usual card of `arch` (`scratch.ARCH_DEFAULTS`: 108 for 8.0, 132 for 9.0).
    cublas_workspace_config : str, optional
        A ``CUBLAS_WORKSPACE_CONFIG`` value (":4096:8") instead of torch's default.
    cuda_paths : bool
        Take the foreach / fused optimizer paths torch takes on CUDA (default True).
    warmup : int, optional
        The program runs `warmup` steps before the measured one (with `setup`): the step
        runs on meta until two runs in a row allocate the same (an optimizer's first step
        makes its state), and the last run is driven for the remaining steps, so the measured
        step meets the warmed-up cache (its segments and fragmentation). The peaks are the
        measured step's, as after ``torch.cuda.reset_peak_memory_stats()``.

    Returns
    -------
    Estimate
        `peak_allocated`, `peak_reserved`, `segments` (at the peak), `fragmentation`, `oom`
        (None, or the first failing allocation with its `can_fit` verdict, operator and user
        frame) and `snapshot` (the predicted state at the peak).

    Raises
    ------
    ValueError
        On a capacity, config or arch that cannot be read.

    Examples
    --------
    >>> import torch
    >>> def step(device):
    ...     x = torch.randn(1024, 1024, device=device)  # 4 MiB
    ...     return (x @ x).sum()
    >>> est = estimate(step, capacity="1GiB", arch="8.0")
    >>> est.peak_allocated // 2**20, est.fits  # x, x @ x, the 8 MiB cuBLAS workspace
    (16, True)
    >>> oom = estimate(step, capacity="16MiB").oom  # x alone needs a 20 MiB segment
    >>> oom.op, oom.size // 2**20, oom.can_fit.verdict
    ('randn', 4, 'out_of_memory')
    """
    facts = resolve_facts(arch, sm_count)
    cap, conf, ws = check_args(capacity, config, facts.arch, cublas_workspace_config)
    rec = record_step(step, setup=setup, cuda_paths=cuda_paths, warmup=warmup, facts=facts)
    return estimate_recording(
        rec,
        capacity=cap,
        config=conf,
        workspace=ws,
        warm=setup is not None and warmup is None,
        arch=facts.arch,
    )


def resolve_facts(arch: str | None, sm_count: int | None) -> DeviceFacts:
    """The device facts for `arch` and `sm_count` as given (None: read or defaulted)."""
    if sm_count is not None and (
        isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count < 1
    ):
        raise ValueError(f"sm_count must be a positive int, got {short_repr(sm_count)}")
    return device_facts(None if arch is None else parse_arch(arch), sm_count)


def check_args(
    capacity: int | str, config: str, arch: str, cublas_workspace_config: str | None
) -> tuple[int, AllocatorConfig, int]:
    """The capacity in bytes, the parsed config and the workspace size, or a ValueError."""
    if isinstance(capacity, bool) or not isinstance(capacity, int | str):
        raise ValueError(
            f"capacity must be bytes or a size like '80GiB', got {short_repr(capacity)}"
        )
    cap = parse_size(capacity)
    if cap <= 0:
        raise ValueError(f"capacity must be positive, got {short_repr(capacity)}")
    if not isinstance(config, str):
        raise ValueError(
            f"config must be a PYTORCH_CUDA_ALLOC_CONF string, got {short_repr(config)}"
        )
    conf = AllocatorConfig.parse(config)
    if conf.backend != "native":
        raise ValueError(
            f"config {short_repr(config)}: only the native caching allocator is modelled"
        )
    return cap, conf, workspace_size(arch, cublas_workspace_config)


def record_step(
    step: Callable[[Any], Any],
    *,
    setup: Callable[[Any], Any] | None = None,
    cuda_paths: bool = True,
    warmup: int | None = None,
    facts: DeviceFacts | None = None,
) -> StepRecording:
    """The meta run alone (what `max_batch` reuses for every allocator setting)."""
    if warmup is not None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(
                f"warmup must be a number of steps (0 or more), got {short_repr(warmup)}"
            )
        if setup is None:
            raise ValueError("warmup needs a setup: the steps carry its state from one to the next")
    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    if setup is not None and not callable(setup):
        raise TypeError(f"setup must be callable or None, got {type(setup).__name__}")
    return record(setup, step, cuda_paths=cuda_paths, blas_ops=BLAS_OPS, warmup=warmup, facts=facts)


def estimate_recording(
    rec: StepRecording,
    *,
    capacity: int,
    config: AllocatorConfig,
    workspace: int,
    warm: bool,
    arch: str,
) -> Estimate:
    """Drive a recording through the allocator model (no meta run)."""
    return drive(rec, capacity=capacity, config=config, workspace=workspace, warm=warm, arch=arch)
