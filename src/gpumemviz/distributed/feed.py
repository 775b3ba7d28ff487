"""`JobFeed`: the job view read on a schedule, for a front end that redraws the rank grid.

The panel's job view (and anything else that shows the grid live) needs what the terminal loop
of `gpumemviz job` does, off the user's thread: read `JobView.ranks()` every interval, order it
with `grid_rows`, and hand the strips to listeners. Like the sampler, it never raises into its
owner: a listener's error is counted; a store that stops answering is said to the listeners
(the last grid with the reason, ``hung`` set) and read again next interval; a store that goes
away stops the thread and says why in ``stopped`` (the listeners get one last empty grid with
that reason). Hostile values never stop it: the view turns them into ``suspect`` rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpumemviz.distributed.grid import grid_rows
from gpumemviz.distributed.jobview import JobView
from gpumemviz.distributed.store import StoreHung
from gpumemviz.live.sources.base import short_error
from gpumemviz.snapshot.sample import check_interval

__all__ = ["GridListener", "JobFeed"]

GridListener = Callable[[list[dict[str, Any]], str | None], object]
"""Called with the grid's strips (`grid_rows`) and None; the last strips and why the store is not
answering; or [] and why the feed stopped."""


class JobFeed:
    """Reads a `JobView` every `interval` seconds on a daemon thread; feeds listeners.

    Parameters
    ----------
    view : JobView
        The job to read.
    interval : float
        Seconds between reads (default 1).

    Examples
    --------
    >>> import torch.distributed as dist
    >>> master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    >>> feed = JobFeed(JobView("127.0.0.1", master.port), interval=0.1)
    >>> feed.poll_once()
    []
    """

    def __init__(self, view: JobView, interval: float = 1.0) -> None:
        self.view = view
        self.interval = check_interval(interval)
        self.latest: list[dict[str, Any]] = []
        self.stopped: str | None = None
        self.hung: str | None = None  # why the last read got no answer (None: it did)
        self.listener_errors = 0
        self._listeners: tuple[GridListener, ...] = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def add_listener(self, fn: GridListener) -> None:
        """Call ``fn(strips, None)`` after every read, on the feed's thread (keep it quick)."""
        if fn not in self._listeners:
            self._listeners = (*self._listeners, fn)

    def remove_listener(self, fn: GridListener) -> None:
        self._listeners = tuple(f for f in self._listeners if f != fn)

    def poll_once(self) -> list[dict[str, Any]]:
        """Read and order the grid now, tell the listeners, return it (store errors raise)."""
        self.latest = grid_rows(self.view.ranks())
        self.hung = None
        self._tell(self.latest, None)
        return self.latest

    def start(self) -> JobFeed:
        if not self.running:
            self._stop.clear()
            self.stopped = None
            self._thread = threading.Thread(target=self._run, name="gpumemviz-job", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        return not self.running

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except StoreHung as exc:  # it may answer later: say so, keep the last grid
                self.hung = f"the store is not answering ({short_error(exc)})"
                self._tell(self.latest, self.hung)
            except Exception as exc:  # the store went away: stop
                self.stopped = f"the job store went away: {short_error(exc)}"
                self._tell([], self.stopped)
                return
            self._stop.wait(self.interval)

    def _tell(self, strips: list[dict[str, Any]], why: str | None) -> None:
        for fn in self._listeners:
            try:
                fn(strips, why)
            except Exception:
                self.listener_errors += 1
