"""The samplers the front ends run: one shared per device, or one for a source the user names.

The sampler and the sources sit below the analysis layer, so they cannot judge an OOM
themselves; this module builds every sampler the panel, the magic and the panel's commands use,
and hands each the analysis layer's `classify_event` (`gpumemviz.analysis.fragmentation.oom`),
which the
sampler passes to its source with the OOM handler. Each OOM is judged once, where it happens.
"""

from __future__ import annotations

import threading

from gpumemviz.analysis.fragmentation.oom import classify_event
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.base import Source
from gpumemviz.live.sources.default import cuda_device_count, default_source
from gpumemviz.snapshot.sample import check_device

__all__ = ["local_devices", "sampler_for", "shared", "shared_devices"]

_SHARED: dict[int, Sampler] = {}
_SHARED_LOCK = threading.Lock()


def sampler_for(source: Source, interval: float = 0.5) -> Sampler:
    """A sampler of its own for ``source`` (not started), with OOMs judged by `classify_event`.

    Parameters
    ----------
    source : Source
        Where samples come from.
    interval : float
        Seconds between reads (default 0.5).

    Examples
    --------
    >>> from gpumemviz.live.sources import UnavailableSource
    >>> sampler_for(UnavailableSource(0, "no GPU here")).classify is classify_event
    True
    """
    return Sampler(source, interval=interval, classify=classify_event)


def shared(device: int = 0) -> Sampler:
    """The one sampler per device that panels share (created on first use, not started).

    Parameters
    ----------
    device : int
        CUDA device index.

    Returns
    -------
    Sampler
        Reading `gpumemviz.live.sources.default_source` for that device, with OOMs judged by
        `classify_event`.

    Examples
    --------
    >>> shared(0) is shared(0)
    True
    """
    check_device(device)
    with _SHARED_LOCK:
        sampler = _SHARED.get(device)
        if sampler is None:
            sampler = sampler_for(default_source(device))
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
    """Every CUDA device torch sees here (``device="all"``); ``[0]`` without CUDA, where the
    shared sampler of device 0 runs the simulator. Does not initialise CUDA.

    Examples
    --------
    >>> devices = local_devices()
    >>> devices[0], all(d >= 0 for d in devices)
    (0, True)
    """
    return list(range(cuda_device_count())) or [0]
