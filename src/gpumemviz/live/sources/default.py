"""`default_source`: the source a panel gets when the user names none.

Apart from the protocol (`sources.base`), which every source imports: choosing imports the
sources it chooses between.
"""

from __future__ import annotations

from gpumemviz.live.sources.base import Source
from gpumemviz.snapshot.sample import check_device

__all__ = ["cuda_device_count", "default_source"]


def default_source(device: int = 0) -> Source:
    """The source a panel gets when the user names none.

    torch.cuda when CUDA is available; otherwise the simulated allocator (labelled as demo
    data). Choosing does not initialise CUDA.

    Parameters
    ----------
    device : int
        CUDA device index.

    Returns
    -------
    Source

    Examples
    --------
    >>> src = default_source(0)
    >>> isinstance(src, Source)
    True
    """
    check_device(device)
    try:
        import torch
    except ImportError:
        cuda = False
    else:
        cuda = torch.cuda.is_available()
    if cuda:
        from gpumemviz.live.sources.torch_cuda import TorchCudaSource

        return TorchCudaSource(device)
    from gpumemviz.live.sources.simulated import SimulatedSource

    return SimulatedSource(device=device)


def cuda_device_count() -> int:
    """How many CUDA devices torch sees: 0 without torch or CUDA. Does not initialise CUDA.

    Examples
    --------
    >>> cuda_device_count() >= 0
    True
    """
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # a broken driver: no device to list
        return 0
