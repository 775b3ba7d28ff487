"""The panel's advice lines, throttled: `gpumemviz.analysis.advice.advise` re-reads the whole
snapshot, so
a panel advises at most once per interval, and a state the throttle skipped is advised once the
interval has passed (the lines never stay on an older state when the samples stop)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from gpumemviz.analysis.fragmentation import FragmentationReport
    from gpumemviz.snapshot.sample import MemoryStats

__all__ = ["AdviceThrottle"]


class _Args(TypedDict):
    """`AdviceThrottle.advise`'s arguments, kept for the throttle's trailing edge."""

    settings: str | None
    stats: MemoryStats | None
    total: int | None
    device: int | None


class AdviceThrottle:
    """Advice for one panel: `advise` publishes ``[{kind, message, device}]`` (device: the one
    advised on, None for all), at most once per ``every()`` seconds.

    Parameters
    ----------
    every : callable
        The interval in seconds (read at each call: the panel's ``ADVICE_EVERY_S``).
    submit : callable
        Runs a function on the panel's writer thread (the trailing edge goes there).
    publish : callable
        Takes the advice lines (sets the panel's ``advice`` trait).

    Examples
    --------
    >>> from gpumemviz.analysis.fragmentation import fragmentation
    >>> out = []
    >>> t = AdviceThrottle(lambda: 1.0, lambda fn: fn(), out.append)
    >>> t.advise(fragmentation([]), settings=None, stats=None, total=None, device=0)
    >>> out
    [[]]
    """

    def __init__(
        self,
        every: Callable[[], float],
        submit: Callable[[Callable[[], None]], object],
        publish: Callable[[list[dict[str, str | int | None]]], None],
    ) -> None:
        self._every, self._submit, self._publish = every, submit, publish
        self._at = -float("inf")
        self._due: tuple[FragmentationReport, _Args] | None = None
        self._timer: threading.Timer | None = None

    def advise(
        self,
        report: FragmentationReport,
        *,
        settings: str | None,
        stats: MemoryStats | None,
        total: int | None,
        device: int | None,
        force: bool = False,
    ) -> None:
        """Refresh the advice lines now, or once the interval has passed (``force``: now)."""
        now = time.monotonic()
        wait = self._at + self._every() - now
        if not force and wait > 0:
            args: _Args = {"settings": settings, "stats": stats, "total": total, "device": device}
            self._due = (report, args)
            if self._timer is None:
                self._timer = threading.Timer(wait, self._submit, (self._trailing,))
                self._timer.daemon = True
                self._timer.start()
            return
        self._at = now
        self._due = None
        from gpumemviz.analysis.advice import advise

        if device is not None and device not in report.devices:
            self._publish([])
            return
        found = advise(report, settings, stats, device_total=total, device=device)
        self._publish([{"kind": a.kind, "message": a.message, "device": device} for a in found])

    def _trailing(self) -> None:
        """The throttle's trailing edge: advise the newest state it skipped, if any."""
        self._timer = None
        due, self._due = self._due, None
        if due is not None:
            self.advise(due[0], **due[1], force=True)

    def cancel(self) -> None:
        """Drop a pending trailing edge (the panel closes)."""
        timer = self._timer
        if timer is not None:
            timer.cancel()
