"""The panel's findings, throttled and checked off the kernel's thread.

`gpumemviz.analyze` re-reads the whole state, so a live panel analyses at most once per
interval (`FindingsThrottle`), and a state the throttle skipped is analysed once the interval
has passed (the lines never stay on an older state when the samples stop). Checking advice
replays a recorded trace, which takes seconds on a long one: `BackgroundCheck` runs it on a
thread of its own, and the panel shows "checking..." until it is done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumemviz.analysis.findings import Findings

__all__ = ["CHECKING", "BackgroundCheck", "FindingsThrottle", "advice_rows"]

#: The advice line while the recorded trace's replay checks the advice.
CHECKING = "checking advice against the recorded trace..."


def advice_rows(found: Findings | None, *, checking: bool = False) -> list[dict[str, object]]:
    """The panel's ``advice`` trait: a row per advice, one per rejected advice (kind
    "rejected", with the replay's reason), then each note (kind "note").

    Examples
    --------
    >>> from gpumemviz.analysis.findings import analyze
    >>> advice_rows(analyze([])), advice_rows(None, checking=True)[0]["message"]
    ([], 'checking advice against the recorded trace...')
    """
    if found is None:
        rows: list[dict[str, object]] = []
        notes: tuple[str, ...] = ()
    else:
        rows = [
            {
                "kind": a.kind,
                "message": a.message,
                "device": a.device,
                "setting": a.setting,
                "checked": a.checked,
            }
            for a in found.advice
        ]
        notes = found.notes
    if found is not None:  # what the replay refused, and why: the panel says it as inspect does
        rows += [
            {
                "kind": "rejected",
                "message": f"checked and rejected: {a.message}"
                + (f" ({a.reason})" if a.reason else ""),
                "device": a.device,
                "setting": a.setting,
                "checked": True,
            }
            for a in found.rejected
        ]
    device = None if found is None else found.device
    if checking:
        rows.append({"kind": "note", "message": CHECKING, "device": device})
    rows += [{"kind": "note", "message": n, "device": device} for n in notes]
    return rows


class FindingsThrottle:
    """Runs a panel's analysis at most once per ``every()`` seconds; `analyze` takes the
    function that computes the findings of the newest state and publishes its result.

    Parameters
    ----------
    every : callable
        The interval in seconds (read at each call: the panel's ``ADVICE_EVERY_S``).
    submit : callable
        Runs a function on the panel's writer thread (the trailing edge goes there).
    publish : callable
        Takes the findings (the panel sets its traits from them).

    Examples
    --------
    >>> from gpumemviz.analysis.findings import analyze
    >>> out = []
    >>> t = FindingsThrottle(lambda: 1.0, lambda fn: fn(), out.append)
    >>> t.analyze(lambda: analyze([]))
    >>> out[0].advice
    ()
    """

    def __init__(
        self,
        every: Callable[[], float],
        submit: Callable[[Callable[[], None]], object],
        publish: Callable[[Findings], None],
    ) -> None:
        self._every, self._submit, self._publish = every, submit, publish
        self._at = -float("inf")
        self._due: Callable[[], Findings] | None = None
        self._timer: threading.Timer | None = None

    def analyze(self, compute: Callable[[], Findings], *, force: bool = False) -> None:
        """Publish ``compute()`` now, or once the interval has passed (``force``: now)."""
        now = time.monotonic()
        wait = self._at + self._every() - now
        if not force and wait > 0:
            self._due = compute
            if self._timer is None:
                self._timer = threading.Timer(wait, self._submit, (self._trailing,))
                self._timer.daemon = True
                self._timer.start()
            return
        self._at = now
        self._due = None
        self._publish(compute())

    def _trailing(self) -> None:
        """The throttle's trailing edge: analyse the newest state it skipped, if any."""
        self._timer = None
        due, self._due = self._due, None
        if due is not None:
            self.analyze(due, force=True)

    def cancel(self) -> None:
        """Drop a pending trailing edge (the panel closes)."""
        timer = self._timer
        if timer is not None:
            timer.cancel()


class BackgroundCheck:
    """One advice check at a time, on a thread of its own: `start` runs ``compute`` there and
    hands its result to ``done`` through ``submit`` (the panel's writer thread), unless a newer
    `start` or `cancel` came first.

    Examples
    --------
    >>> from gpumemviz.analysis.findings import analyze
    >>> got = []
    >>> bg = BackgroundCheck(lambda fn: fn())
    >>> bg.start(lambda: analyze([]), got.append); bg.wait(5.0)
    True
    >>> len(got), bg.running
    (1, False)
    """

    def __init__(self, submit: Callable[[Callable[[], None]], object]) -> None:
        self._submit = submit
        self._generation = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    @property
    def running(self) -> bool:
        """Whether a check is under way."""
        t = self._thread
        return t is not None and t.is_alive()

    def start(self, compute: Callable[[], Findings], done: Callable[[Findings], None]) -> None:
        """Check in the background; a check already running is left to finish unheard."""
        with self._lock:
            self._generation += 1
            mine = self._generation

        def run() -> None:
            try:
                found = compute()
            except Exception as exc:  # a failed check must not kill the panel
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return
            with self._lock:
                if mine != self._generation:
                    return
            self._submit(lambda: done(found))

        t = threading.Thread(target=run, name="gpumemviz-advice-check", daemon=True)
        self._thread = t
        t.start()

    def wait(self, timeout: float) -> bool:
        """Wait for the running check (tests); False when it is still running."""
        t = self._thread
        if t is not None:
            t.join(timeout)
        return not self.running

    def cancel(self) -> None:
        """Forget the running check: its result is dropped."""
        with self._lock:
            self._generation += 1
