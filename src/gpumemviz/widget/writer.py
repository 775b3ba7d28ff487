"""The one thread that writes a panel's traits and sends its frames, in the order they were queued.

Concurrent trait writers are not safe; IOPub publishing from one background thread is. So a
panel's callers (a cell, the sampler's listener, the browser's messages) only enqueue jobs here.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from gpumemviz.live.sources.base import short_error

__all__ = ["Writer"]


class Writer:
    """The one thread that writes the panel's traits and sends its frames, in queue order."""

    def __init__(self, name: str) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._name = name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self.errors: list[str] = []

    def submit(self, job: Callable[[], None]) -> None:
        """Queue a job; after `stop` (the panel closed) jobs are dropped."""
        with self._lock:
            if self._stopped:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._queue.put(job)

    def wait(self, timeout: float) -> bool:
        """Block until every job submitted so far ran; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                job()
            except Exception as exc:  # the panel must never raise into user code
                self.errors.append(short_error(exc))  # bounded: exc may hold a file's value
                del self.errors[:-20]
            finally:
                self._queue.task_done()
