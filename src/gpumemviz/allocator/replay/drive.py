"""One pass of one device's recorded trace through the allocator model, scored: `drive`.

The pass itself is driver.py's `Driver`; `replay` (the package's __init__) runs it once or
twice per device and gathers the results.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..config import AllocatorConfig
from .driver import Driver
from .recording import Recording
from .result import DeviceReplay

__all__ = ["drive"]


def drive(
    recording: Recording,
    config: AllocatorConfig,
    capacity: int | None,
    *,
    what_if: bool = False,
    resync: bool = False,
    explicit: Collection[int] = (),
    rename: Callable[[int], int] | None = None,
    device_total: int | None = None,
    max_mismatches: int = 20,
) -> tuple[DeviceReplay, list[int | None]]:
    """Run one device's trace through a fresh model; score it against the recorded addresses.

    Parameters
    ----------
    recording
        The recorded history (start state, entries, recorded layouts for re-synchronising).
    config
        Settings the model runs with.
    capacity
        Bytes the process can get (None: unlimited, so the model never runs out).
    what_if
        Invent segment addresses instead of taking the recorded ones; recorded release runs
        listed in `explicit` are replayed as empty_cache, other recorded segment entries are
        ignored, and the pass stops at the model's first OOM.
    resync
        After any decision that differs from the recording, rebuild the model from the recorded
        layout (the per-decision score). Without it the model runs on its own state.
    explicit
        What-if only: first indices of the release runs that were explicit empty_cache calls.
    rename
        Maps a recorded alloc/free address to the allocation id the driver files the model's
        block under (default: the address itself). The model never sees ids, so any
        one-to-one renaming must give the same choices.
    device_total
        The device's total memory (sizes the expandable address reservations).

    Returns
    -------
    (DeviceReplay, choices)
        ``choices[i]`` is the model's address for alloc entry i (None elsewhere).
    """
    d = Driver(
        recording,
        config,
        capacity,
        what_if=what_if,
        resync=resync,
        explicit=explicit,
        rename=rename,
        device_total=device_total,
        max_mismatches=max_mismatches,
    )
    return d.run(), d.choices
