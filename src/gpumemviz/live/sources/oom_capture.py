"""`capture_oom` (``gpumemviz.capture_oom``) and its `OomCapture`: the allocator snapshot written
at an OOM, for scripts and torchrun jobs.

The snapshot is the one the OOM observer took in the failing thread
(`gpumemviz.live.sources.oom_observer`, which judges each failure there once: the events kept
carry the verdict); where no observer ran (old torch, or attach failed), the one taken as the
error leaves the ``with`` block.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gpumemviz.io import write_torch
from gpumemviz.live.sources.base import short_error
from gpumemviz.live.sources.oom_observer import add_handler, ensure_observer, remove_handler
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.sample import OomEvent

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchDict

__all__ = ["OomCapture", "capture_oom"]


def _torch() -> Any:  # Any: torch is read by duck typing, across versions
    import torch  # lazily: `import gpumemviz` never imports torch

    return torch


def _write_pickle(obj: TorchDict, path: Path) -> None:
    """Protocol 4 (memory_viz rejects 5), atomically and fsynced (`io.write_torch`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_torch(obj, path)


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
        With ``written`` (the path, once written), ``events`` (each judged where it failed,
        with its ``cause`` and ``explanation``) and ``error``.

    Examples
    --------
    >>> import gpumemviz
    >>> with gpumemviz.capture_oom("/tmp/oom_{rank}.pickle") as cap:
    ...     pass  # train here
    >>> cap.written is None
    True
    """
    return OomCapture(path)


class OomCapture:
    """Context manager behind `gpumemviz.capture_oom`; see there.

    Parameters
    ----------
    path : str or path-like
        Where to write; ``{rank}`` and ``{pid}`` are filled in.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        text = os.fspath(path)
        if not text:
            raise ValueError("capture_oom needs a file path, got an empty string")
        rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
        try:
            text = text.format(rank=rank, pid=os.getpid())
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"capture_oom path {short_repr(text)}: only {{rank}} and {{pid}} may be used"
            ) from exc
        self.path = Path(text)
        self.events: list[OomEvent] = []
        self.written: Path | None = None
        self.error: str | None = None
        self.attached = False

    def _on_oom(self, event: OomEvent) -> None:
        self.events.append(event)
        if self.written is not None or event.snapshot is None:
            if event.snapshot is None:
                self.error = event.snapshot_error
            return
        try:
            _write_pickle(event.snapshot, self.path)
            self.written = self.path
        except Exception as exc:
            self.error = f"could not write {self.path}: {short_error(exc)}"

    def __enter__(self) -> OomCapture:
        add_handler(self._on_oom)
        self.attached = ensure_observer(defer=True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        remove_handler(self._on_oom)
        if self.written is None and exc is not None and _is_oom_error(exc):
            # The observer did not run (old torch, or attach failed): the state is still the
            # post-flush one, and the failing frame's tensors are alive in the traceback.
            try:
                snapshot = _torch().cuda.memory._snapshot()
                _write_pickle(snapshot, self.path)
                self.written = self.path
            except Exception as err:
                self.error = f"no snapshot written at the OOM: {short_error(err)}"
        return None


def _is_oom_error(exc: BaseException) -> bool:
    try:
        return isinstance(exc, _torch().OutOfMemoryError)
    except Exception:
        return "out of memory" in str(exc).lower()
