"""The shared samplers: one per device, made on first use, read by every panel, the magic, the
panel's commands and the metrics exporter, so a device is read once however many front ends show
it. A front end given a source of the user's own builds its own `Sampler` instead.
"""

from __future__ import annotations

import threading

from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.default import cuda_device_count, default_source
from gpumemviz.snapshot.sample import check_device

__all__ = ["local_devices", "shared", "shared_devices"]

_SHARED: dict[int, Sampler] = {}
_SHARED_LOCK = threading.Lock()


def shared(device: int = 0) -> Sampler:
    """The one sampler per device that panels share (created on first use, not started).

    Parameters
    ----------
    device : int
        CUDA device index.

    Returns
    -------
    Sampler
        Reading `gpumemviz.live.sources.default_source` for that device.

    Examples
    --------
    >>> shared(0) is shared(0)
    True
    """
    check_device(device)
    with _SHARED_LOCK:
        sampler = _SHARED.get(device)
        if sampler is None:
            sampler = Sampler(default_source(device))
            _SHARED[device] = sampler
        return sampler


def shared_devices() -> list[int]:
    """The devices that have a shared sampler now, in order.

    Examples
    --------
    >>> sampler = shared(0)
    >>> 0 in shared_devices()
    True
    """
    with _SHARED_LOCK:
        return sorted(_SHARED)


def local_devices() -> list[int]:
    """The devices `shared` serves for ``device="all"``: every CUDA device torch sees here;
    ``[0]`` without CUDA, where the shared sampler of device 0 runs the simulator. Does not
    initialise CUDA.

    Examples
    --------
    >>> devices = local_devices()
    >>> devices[0], all(d >= 0 for d in devices)
    (0, True)
    """
    return list(range(cuda_device_count())) or [0]
