"""`capture_oom` (``gpumemviz.capture_oom``): the OOM snapshot for scripts and torchrun jobs.

It sits above the analysis layer so it can wire the two halves together: the source layer's
`OomCapture` takes the snapshot and writes the file, and `classify_event` from
`gpumemviz.analysis.fragmentation.oom` judges each failure, handed down explicitly.
"""

from __future__ import annotations

import os

from gpumemviz.analysis.fragmentation.oom import classify_event
from gpumemviz.live.sources.oom_capture import OomCapture

__all__ = ["capture_oom"]


def capture_oom(path: str | os.PathLike[str] = "oom_snapshot.pickle") -> OomCapture:
    """Write the allocator snapshot at the moment of an out-of-memory error.

    For scripts and torchrun jobs. The snapshot is taken inside PyTorch's OOM observer (in the
    failing thread, after the allocator flushed its cache), so it shows the state the allocation
    failed in, with the ``oom`` trace entry when history is recorded. The first failure inside the
    block is written (protocol 4, atomically); later ones are kept in ``.events``. The error still
    propagates. Nothing initialises CUDA: if CUDA starts inside the block, the observer is attached
    as CUDA initialises. Without CUDA this does nothing.

    Parameters
    ----------
    path : str or path-like
        Where to write. ``{rank}`` and ``{pid}`` are filled in (RANK from torchrun).

    Returns
    -------
    OomCapture
        With ``written`` (the path, once written), ``events`` (each with its ``cause`` and
        ``explanation``) and ``error``.

    Examples
    --------
    >>> import gpumemviz
    >>> with gpumemviz.capture_oom("/tmp/oom_{rank}.pickle") as cap:
    ...     pass  # train here
    >>> cap.written is None
    True
    """
    return OomCapture(path, classify=classify_event)
