"""Kernel scratch: temporaries CUDA kernels take from the caching allocator that meta never makes,
and the device facts they depend on.

Reductions (`sum`, `mean`, and autograd's `sum_to`, which reduces a broadcast gradient with
`sum`): when one output's inputs are split across thread blocks, torch's reduction kernel
(aten/src/ATen/native/cuda/Reduce.cuh, `setReduceConfig` and `ReduceConfig`) allocates a
staging buffer of ``sizeof(acc) * num_outputs * ctas_per_output`` bytes (times
``block.x * output_vec_size`` when the block does not reduce along x) and ``4 * grid.x`` bytes
of semaphores, right after the output, and frees them (semaphores first) when the launch
returns. `ctas_per_output` depends on the GPU: its SM count and threads per SM.

Device facts: `device_facts` reads the compute capability and SM count from torch where CUDA is
already initialised (gpumemviz never initialises it), else from NVML (`pynvml`) where it is
installed, else the documented defaults of `ARCH_DEFAULTS` for the `arch` given ("9.0": an
H100 SXM, 132 SMs).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = ["ARCH_DEFAULTS", "DeviceFacts", "device_facts", "reduce_scratch"]

# compute capability -> (SM count of its common data-centre card, max threads per SM), from
# NVIDIA's published specifications (V100, T4, A100, A10/A40, L40S, H100 SXM, B200)
ARCH_DEFAULTS: dict[tuple[int, int], tuple[int, int]] = {
    (7, 0): (80, 2048),
    (7, 5): (40, 1024),
    (8, 0): (108, 2048),
    (8, 6): (84, 1536),
    (8, 9): (142, 1536),
    (9, 0): (132, 2048),
    (10, 0): (148, 2048),
}


@dataclass(frozen=True)
class DeviceFacts:
    """What the kernel scratch depends on: compute capability, SM count, threads per SM, and
    where they came from ("torch", "nvml" or "default")."""

    major: int
    minor: int
    sm_count: int
    threads_per_sm: int
    source: str = "default"

    @property
    def arch(self) -> str:
        return f"{self.major}.{self.minor}"


def device_facts(arch: tuple[int, int] | None = None, sm_count: int | None = None) -> DeviceFacts:
    """The GPU's facts: `arch` and `sm_count` as given, the rest from the device when one can
    be read without initialising CUDA, else from `ARCH_DEFAULTS` (arch 9.0 when none is given).

    >>> f = device_facts((8, 0))
    >>> (f.arch, f.sm_count, f.threads_per_sm) if f.source == "default" else ("8.0", 108, 2048)
    ('8.0', 108, 2048)
    """
    read = _read_device() if arch is None else None
    if read is not None:
        major, minor, sms, threads, source = read
    else:
        major, minor = arch if arch is not None else (9, 0)
        sms, threads = ARCH_DEFAULTS.get((major, minor), ARCH_DEFAULTS[(9, 0)])
        if (major, minor) not in ARCH_DEFAULTS:  # the same major's first, if any
            same = [k for k in ARCH_DEFAULTS if k[0] == major]
            sms, threads = ARCH_DEFAULTS[same[0]] if same else (sms, threads)
        source = "default"
    return DeviceFacts(major, minor, sm_count if sm_count else sms, threads, source)


def _read_device() -> tuple[int, int, int, int, str] | None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # never initialise CUDA here
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return p.major, p.minor, p.multi_processor_count, p.max_threads_per_multi_processor, "torch"
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        cores = pynvml.nvmlDeviceGetNumGpuCores(handle)
    except Exception:  # NVML missing or refusing: the defaults apply
        return None
    per_sm = 128 if (major, minor) in ((8, 6), (8, 9)) or major >= 10 else 64
    threads = ARCH_DEFAULTS.get((major, minor), (0, 2048))[1]
    return major, minor, max(1, cores // per_sm), threads, "nvml"


def _last_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def reduce_scratch(
    num_outputs: int,
    inputs_per_output: int,
    *,
    fastest: bool,
    acc_size: int,
    facts: DeviceFacts,
    output_vec_size: int = 4,
) -> tuple[int, int]:
    """Bytes of the staging buffer and of the semaphores torch's CUDA reduction kernel
    allocates for a contiguous input reduced to `num_outputs` values of `inputs_per_output`
    inputs each (`fastest`: the reduced dimension is the innermost), with an accumulator of
    `acc_size` bytes; (0, 0) when the kernel reduces within one thread block.

    Reduce.cuh's `setReduceConfig` for that layout (max_reduce_threads 512, 16 to 256 values
    per thread, the input vector size 4).

    >>> facts = device_facts((8, 0))
    >>> reduce_scratch(1024, 1024, fastest=False, acc_size=4, facts=facts)  # a 256-token sum_to
    (8388608, 32)
    >>> reduce_scratch(1024, 4096, fastest=False, acc_size=4, facts=facts)[0] // 2**20
    32
    >>> reduce_scratch(4096, 1024, fastest=True, acc_size=4, facts=facts)  # a row-wise sum
    (0, 0)
    """
    if num_outputs <= 0 or inputs_per_output <= 1:
        return 0, 0
    step_input = step_output = 1
    input_mult = [0, 0, 0]
    if fastest:
        output_vec_size = 1
        dim0, dim1 = inputs_per_output, num_outputs
        if dim0 > 128:
            dim0 //= 4  # vectorised along the input
    else:
        while output_vec_size > 1 and num_outputs % output_vec_size:
            output_vec_size //= 2
        dim0, dim1 = num_outputs // output_vec_size, inputs_per_output
    max_threads = 512 // output_vec_size
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_width = min(dim0_pow2, 32)
    block_height = min(dim1_pow2, max_threads // block_width)
    block_width = min(dim0_pow2, max_threads // block_height)
    num_threads = block_width * block_height
    if fastest:
        input_mult[0] = step_input
        step_input *= block_width
    else:
        step_output *= block_width
    values_per_thread = _div_up(inputs_per_output, step_input)
    if values_per_thread >= min(block_height * 16, 256):
        input_mult[1] = step_input
        step_input *= block_height
    else:
        step_output *= block_height
    values_per_thread = _div_up(inputs_per_output, step_input)
    target_grid = facts.sm_count * (facts.threads_per_sm // num_threads)
    grid_x = _div_up(num_outputs // output_vec_size, step_output)
    if not (input_mult[1] and values_per_thread >= 256 and grid_x <= target_grid):
        return 0, 0
    ctas = max(
        min(_div_up(target_grid, grid_x), _div_up(values_per_thread, 16)),
        _div_up(values_per_thread, 256),
    )
    if ctas <= 1:
        return 0, 0
    staging = acc_size * num_outputs * ctas
    if not input_mult[0]:
        staging *= block_width * output_vec_size
    return staging, 4 * grid_x
