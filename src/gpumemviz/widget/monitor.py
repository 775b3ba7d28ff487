"""The notebook's entry points for live panels: `monitor` opens one, `mark` marks every one."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpumemviz.widget.panel import MemoryPanel, live_panels

if TYPE_CHECKING:
    from gpumemviz.live.sources.base import Source

__all__ = ["mark", "monitor"]


def mark(label: str) -> None:
    """Put a step marker ("epoch 3") on the timeline of every live panel.

    Parameters
    ----------
    label : str
        Shown at the marker (as text).

    Examples
    --------
    >>> import gpumemviz
    >>> panel = gpumemviz.MemoryPanel.from_snapshot([])
    >>> gpumemviz.mark("epoch 3")
    >>> [m["label"] for m in panel.timeline.marks()]
    ['epoch 3']
    >>> panel.close()
    """
    t = time.time()
    for panel in live_panels():
        panel.add_marker(str(label), "mark", t)


def monitor(
    device: int | str = 0,
    interval: float = 0.5,
    source: Source | None = None,
    *,
    subshell: bool = True,
    job: str | None = None,
) -> MemoryPanel:
    """A live panel of one device's caching allocator, updated in the background.

    Parameters
    ----------
    device : int or "all"
        CUDA device index (default 0), or ``"all"``: every CUDA device torch sees, a strip
        each (header figures, binned map, OOMs) above the full map of one (click a strip to
        choose it); ``panel.shown_devices`` lists them.
    interval : float
        Seconds between reads (default 0.5). The device's shared sampler takes this interval.
    source : Source, optional
        Where samples come from. Default: the device's shared sampler
        (`gpumemviz.live.shared.shared`), reading `gpumemviz.live.sources.default_source`:
        torch.cuda when CUDA is available, otherwise the simulated allocator, labelled as demo data.
    subshell : bool
        Handle the panel's clicks on a kernel subshell, so they act while a cell runs (default
        True, where the kernel allows it); False queues them until the running cell finishes.
    job : str, optional
        ``"HOST:PORT"`` of a torch.distributed job whose ranks run
        `gpumemviz.distributed.publish` (torchrun's MASTER_ADDR:MASTER_PORT): a
        `gpumemviz.widget.job.JobPanel` instead, a strip per (rank, device), the rank closest
        to OOM first, re-read every `interval` seconds (give no device nor source).

    Returns
    -------
    MemoryPanel
        Displayed when it is a cell's last expression; ``panel.sampler`` is the sampler it
        follows; ``panel.close()`` stops following it (a shared sampler keeps running, one
        made for ``source`` stops).

    Examples
    --------
    >>> from gpumemviz.live.sources import UnavailableSource
    >>> panel = monitor(source=UnavailableSource(0, "no GPU here"), interval=0.1)
    >>> sampler = panel.sampler
    >>> sampler.running
    True
    >>> panel.close()  # its own sampler stops with it
    >>> sampler.running
    False
    """
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.shared import local_devices, shared

    if job is not None:
        return _job_panel(job, device, interval, source, subshell)
    if device == "all":
        if source is not None:
            raise ValueError("device='all' reads every device's shared sampler: give no source")
        samplers = {d: shared(d) for d in local_devices()}
        panel = MemoryPanel(subshell=subshell)
        for s in samplers.values():
            s.set_interval(interval)
        panel.attach_devices(samplers)
        for s in samplers.values():
            s.start()
        return panel
    if not isinstance(device, int) or isinstance(device, bool):
        from gpumemviz.snapshot.escaping import short_repr

        raise ValueError(f"device must be an index or 'all', got {short_repr(device)}")
    if source is None:
        sampler = shared(device)
        sampler.set_interval(interval)
    else:
        sampler = Sampler(source, interval=interval)
        device = getattr(source, "device", device)
    panel = MemoryPanel(device=device if isinstance(device, int) else None, subshell=subshell)
    panel.attach(sampler, owned=source is not None)
    sampler.start()
    return panel


def _job_panel(
    job: str, device: int | str, interval: float, source: Source | None, subshell: bool
) -> MemoryPanel:
    from gpumemviz.distributed import JobView
    from gpumemviz.distributed.jobview import parse_address
    from gpumemviz.widget.job import JobPanel

    if source is not None or device != 0:
        raise ValueError("job= shows every rank's published devices: give no device nor source")
    host, port = parse_address(job)
    return JobPanel(JobView(host, port), interval=interval, subshell=subshell)
