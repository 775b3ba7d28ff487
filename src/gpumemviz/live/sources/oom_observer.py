"""The process-wide OOM observer: one trampoline attached to torch, and the handlers it calls.

``torch._C._cuda_attach_out_of_memory_observer`` can never be detached, so it is attached once
per process as a trampoline that does nothing when no handler is installed. It runs in the
user's allocating thread after the allocator flushed its cache: it takes
``torch.cuda.memory._snapshot()`` there, builds one `OomEvent` of the raw facts, catches
everything (an exception would reach the user's code), and drops repeats of one failure. It
judges the event once (`gpumemviz.live.sources.oom.judge`: the analysis layer's verdict) and
hands that one judged event to every handler. Attaching never initialises CUDA: before
``torch.cuda.is_initialized()`` the attach is queued to run as CUDA initialises.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, TypedDict

from gpumemviz.live.sources.base import OomHandler, short_error
from gpumemviz.live.sources.oom import judge, oom_request_size, oom_stream
from gpumemviz.snapshot.sample import OomEvent

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import JsonDict, TorchDict

__all__ = ["add_handler", "ensure_observer", "oom_observer_status", "remove_handler"]

_REPEAT_WINDOW_S = 1.0  # observer calls this close together are one failure (cuDNN retries)


def _torch() -> Any:  # Any: torch is read by duck typing, across versions
    import torch  # lazily: `import gpumemviz` never imports torch

    return torch


class _ObserverState(TypedDict):
    attached: bool
    queued: bool
    handlers: tuple[OomHandler, ...]
    last: dict[int, float]
    dropped: int
    errors: int
    last_error: str | None
    totals: dict[int, int]


_OOM_LOCK = threading.Lock()
_OOM: _ObserverState = {
    "attached": False,  # the observer is attached to torch (there is no detach)
    "queued": False,  # attach is queued to run when CUDA initialises
    "handlers": (),  # tuple of OomHandler: copy-on-write, read unlocked
    "last": {},  # device -> monotonic time of the last captured failure
    "dropped": 0,  # observer calls dropped as repeats
    "errors": 0,  # exceptions caught inside the observer
    "last_error": None,
    "totals": {},  # device -> total memory (read once, after CUDA is initialised)
}


def _trampoline(device: int, alloc_size: int, device_limit: int, device_free: int) -> None:
    """What torch calls on OOM, in the user's thread. Must never raise."""
    try:
        handlers = _OOM["handlers"]
        if not handlers:
            return  # a stopped panel: the observer stays attached but does nothing
        now = time.monotonic()
        last = _OOM["last"].get(device)
        if last is not None and now - last < _REPEAT_WINDOW_S:
            _OOM["dropped"] += 1  # a retry of the failure just captured (window not extended)
            return
        _OOM["last"][device] = now
        event = judge(
            _build_event(int(device), int(alloc_size), int(device_limit), int(device_free))
        )  # once per failure, whoever listens
        for handler in handlers:
            try:
                handler(event)
            except Exception as exc:
                _OOM["errors"] += 1
                _OOM["last_error"] = short_error(exc)
    except Exception as exc:
        _OOM["errors"] += 1
        _OOM["last_error"] = short_error(exc)


def _device_total(torch: Any, device: int, fallback: int) -> int:  # Any: torch, duck typed
    totals = _OOM["totals"]
    if device not in totals:
        try:
            totals[device] = int(torch.cuda.get_device_properties(device).total_memory)
        except Exception:
            return fallback
    return totals[device]


def _build_event(device: int, alloc_size: int, device_limit: int, device_free: int) -> OomEvent:
    """The failure's raw facts: the snapshot, the sizes, the device total, the `oom` entry's
    request and stream (`judge` adds the verdict)."""
    torch = _torch()
    snapshot: TorchDict | None = None
    snap_error = None
    try:
        snapshot = torch.cuda.memory._snapshot()
    except Exception as exc:
        snap_error = short_error(exc)
    return OomEvent(
        time=time.time(),
        device=device,
        alloc_size=alloc_size,
        device_limit=device_limit,
        device_free=device_free,
        request_size=oom_request_size(snapshot, device),
        snapshot=snapshot,
        snapshot_error=snap_error,
        device_total=_device_total(torch, device, device_limit),
        stream=oom_stream(snapshot, device),
    )


def _attach_now() -> None:
    """Attach the trampoline (CUDA is initialised, or being initialised by the user's code)."""
    try:
        torch = _torch()
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            _OOM["last_error"] = "this torch has no OOM observer hook"
            return
        attach(_trampoline)
        _OOM["attached"] = True
    except Exception as exc:  # runs inside torch's lazy init when queued: never raise there
        _OOM["errors"] += 1
        _OOM["last_error"] = short_error(exc)


def ensure_observer(*, defer: bool) -> bool:
    """Attach the trampoline once per process, never initialising CUDA.

    If CUDA is initialised, attach now. Else, with ``defer``, queue the attach with
    ``torch.cuda._lazy_call`` so it runs right after the user's code initialises CUDA.
    Returns whether it is attached now.
    """
    with _OOM_LOCK:
        if _OOM["attached"]:
            return True
        try:
            torch = _torch()
            if not torch.cuda.is_available():
                return False
            if torch.cuda.is_initialized():
                _attach_now()
            elif defer and not _OOM["queued"]:
                lazy_call = getattr(torch.cuda, "_lazy_call", None)
                if lazy_call is not None:
                    lazy_call(_attach_now)
                    _OOM["queued"] = True
        except Exception as exc:
            _OOM["last_error"] = short_error(exc)
        return bool(_OOM["attached"])


def add_handler(handler: OomHandler) -> None:
    """Call ``handler`` with each OOM, judged (`judge`) before any handler sees it."""
    with _OOM_LOCK:
        if all(h != handler for h in _OOM["handlers"]):
            _OOM["handlers"] = (*_OOM["handlers"], handler)


def remove_handler(handler: OomHandler) -> None:
    with _OOM_LOCK:
        _OOM["handlers"] = tuple(h for h in _OOM["handlers"] if h != handler)


def oom_observer_status() -> JsonDict:
    """Process-wide observer facts for the panel and tests (a copy)."""
    with _OOM_LOCK:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in _OOM.items()}


def _reset_observer_for_tests() -> None:
    with _OOM_LOCK:
        _OOM.update(
            {
                "attached": False,
                "queued": False,
                "handlers": (),
                "last": {},
                "dropped": 0,
                "errors": 0,
                "totals": {},
            }
        )
        _OOM["last_error"] = None
