"""The background sampler: a source, read on a schedule, into a bounded history and listeners.

Why it is shaped like this:

- It never runs in the way of training: reads happen on a short-lived reader thread whose CPU
  time (``time.thread_time``) is measured; segment state, the expensive part, is read at its own
  rate and that rate stretches to keep the sampler inside a CPU budget (2 % of one core by
  default). Cheap stats are read every tick.
- It never hangs its owner: ``stop()`` returns within one interval even while a source call is
  stuck (Python cannot kill a thread, so the reader is abandoned, counted and reported).
- It never raises into user code: a failed read, garbage from a source and a raising listener
  (any BaseException: SystemExit too) all become counted errors and notes inside the samples.
  Intervals are checked up front (`check_interval`: 0.01 s to one day), so no wait overflows;
  if the thread stops on its own all the same, its last sample says why (``stopped``).
- Its history is a ring bounded in bytes (`gpumemviz.live.history.History`): every sample keeps its
  stats, but only the newest segment state and periodic keyframes keep their blocks.
- It hears of OOMs from its source (``set_oom_handler``, installed while it runs), judged where
  they happened: the handler only queues the event; the thread makes it a keyframe.

The module stays whole (about 560 lines): the thread's loop, the reads, the schedule and the
publishing share one set of locks, counters and history; the values it moves
(`gpumemviz.snapshot.sample`) and the history ring (`gpumemviz.live.history`) live apart.
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from gpumemviz.live.history import History
from gpumemviz.live.sources.base import Source, short_error
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.peaks import PeakTracker
from gpumemviz.snapshot.sample import MAX_INTERVAL_S, OomEvent, Sample, check_interval

__all__ = ["Sampler"]

MiB = 1 << 20
Listener = Callable[[Sample], object]
_MAX_SEGMENT_GAP_S = 300.0
_EMA = 0.3  # weight of the newest read in the CPU cost averages
_MAX_WAIT_S = 3600.0  # one wait of the thread at most (it recomputes the delay and waits again)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class _Read:
    """One read of the source on its own short-lived thread (so a hang can be abandoned)."""

    __slots__ = ("cancelled", "cpu", "done", "error", "result", "started", "thread")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.cancelled = False
        self.result: object = None  # what the source returned: checked to be a Sample
        self.error: BaseException | None = None
        self.cpu = 0.0
        self.started = time.monotonic()
        self.thread: threading.Thread | None = None


class Sampler:
    """Reads a source in the background into a bounded history; feeds listeners.

    Nothing starts by itself: call `start`. Tests use `sample_once`.

    Parameters
    ----------
    source : Source
        Where samples come from (see `gpumemviz.live.sources`).
    interval : float
        Seconds between ticks; stats are read every tick (default 0.5).
    segment_interval : float
        Shortest gap between segment-state reads (default 2 s); the CPU budget and the source's
        ``segment_interval_hint`` can stretch it, never shrink it.
    cpu_budget : float
        Share of one core the reading thread may use (default 0.02 = 2 %).
    history_bytes : int
        Bound of the history ring in bytes (default 64 MiB).
    keyframe_interval : float
        Seconds between segment states the history keeps in full (default 60).
    read_timeout : float, optional
        A read taking longer is abandoned as hung (default ``max(2 s, 4 intervals)``).

    Examples
    --------
    >>> from gpumemviz.live.sources import UnavailableSource
    >>> s = Sampler(UnavailableSource(0, "no GPU here"), interval=0.1)
    >>> s.sample_once().state
    'unavailable'
    >>> s.start()
    True
    >>> s.stop()
    True
    """

    def __init__(
        self,
        source: Source,
        interval: float = 0.5,
        *,
        segment_interval: float = 2.0,
        cpu_budget: float = 0.02,
        history_bytes: int = 64 * MiB,
        keyframe_interval: float = 60.0,
        read_timeout: float | None = None,
    ) -> None:
        if not callable(getattr(source, "sample", None)):
            raise TypeError(f"source must have a sample() method, got {type(source).__name__}")
        check_interval(interval)
        check_interval(segment_interval, "segment_interval")
        if read_timeout is not None and read_timeout != 0:
            check_interval(read_timeout, "read_timeout")
        if not isinstance(cpu_budget, (int, float)) or not 0 < cpu_budget <= 1:
            raise ValueError(
                f"cpu_budget must be a share of one core in (0, 1], got {short_repr(cpu_budget)}"
            )
        self.source = source
        self.interval = float(interval)
        self.segment_interval = float(segment_interval)
        self.cpu_budget = float(cpu_budget)
        self.read_timeout = float(read_timeout) if read_timeout else max(2.0, 4 * self.interval)
        self._auto_timeout = not read_timeout  # follows the interval (set_interval)
        self._regrid = False  # set_interval asks the thread for a new tick grid
        self.history = History(history_bytes, keyframe_interval)
        self.peaks = PeakTracker()  # gpumemviz's own peaks, stamped on every sample
        self.segments_wanted = True  # a panel sets this False while it is hidden
        self._listeners: tuple[Listener, ...] = ()
        self._lock = threading.Lock()  # start/stop/listeners
        self._read_lock = threading.RLock()  # one read at a time; a listener may sample_once
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._paused = False
        self._current: _Read | None = None
        self._hung: _Read | None = None  # an abandoned read whose thread may still be alive
        self._ooms: collections.deque[OomEvent] = collections.deque(maxlen=16)
        self._notes: list[str] = []
        self._seq = itertools.count()
        self._next_segment = 0.0
        self._stats_cpu = 0.0  # EMA of CPU seconds of a stats-only read
        self._segment_cpu = 0.0  # EMA of the extra CPU seconds a segment read costs
        self.segment_gap = self.segment_interval  # the gap in force now
        self.budget_limited = False
        self.counters = collections.Counter(
            ticks=0, segment_reads=0, errors=0, listener_errors=0, hung_reads=0, abandoned=0
        )
        self.last_error: str | None = None
        self.stopped: str | None = None  # why the thread stopped on its own; None while it runs

    # lifecycle ---------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    @property
    def paused(self) -> bool:
        return self._paused

    def start(self) -> bool:
        """Start the background thread (idempotent). Returns whether it is running."""
        with self._lock:
            if self.running:
                return True
            self._stop.clear()
            self._wake.clear()
            self.stopped = None
            set_handler = getattr(self.source, "set_oom_handler", None)
            if callable(set_handler):
                try:
                    set_handler(self._on_oom)
                except Exception as exc:
                    self._note(f"OOM capture not available: {short_error(exc)}")
            name = f"gpumemviz-sampler-{getattr(self.source, 'device', '?')}"
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            try:
                self._thread.start()
            except RuntimeError as exc:  # "can't start new thread": say so, do not raise
                self._thread = None
                self._died(f"sampler thread not started: {short_error(exc)}")
                return False
            return True

    def stop(self) -> bool:
        """Stop within one interval, even if a source call hangs. Returns True when stopped.

        A hung read's thread cannot be killed: it is abandoned (a daemon thread that exits when the
        call returns), counted in ``counters["abandoned"]`` and named in ``last_error``.
        """
        deadline = time.monotonic() + self.interval
        with self._lock:
            self._stop.set()
            self._wake.set()
            current = self._current
            if current is not None:
                current.cancelled = True
                current.done.set()
            set_handler = getattr(self.source, "set_oom_handler", None)
            if callable(set_handler):
                try:
                    set_handler(None)
                except Exception as exc:
                    self._count_error(f"removing the OOM handler: {short_error(exc)}")
            thread = self._thread
        if thread is threading.current_thread():  # stop() from a listener: just signal
            return True
        # joined without the lock: a listener may still call add_listener while we wait
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        if current is not None and current.thread is not None and current.thread.ident:
            current.thread.join(max(0.0, deadline - time.monotonic()))
            if current.thread.is_alive():
                self.counters["abandoned"] += 1
                self.last_error = "a source read was still running at stop: thread abandoned"
                self._hung = current
        stopped = thread is None or not thread.is_alive()
        with self._lock:
            if stopped and self._thread is thread:
                self._thread = None
        return stopped

    def set_interval(self, interval: float) -> None:
        """Change the tick interval of a running or stopped sampler, without a restart.

        The thread starts a new tick grid at once (a long wait is cut short), so listeners and
        the history carry on; a default ``read_timeout`` follows the interval.

        Parameters
        ----------
        interval : float
            Seconds between reads, from 0.01 to 86400 (`check_interval`; a ValueError
            otherwise). The interval the sampler has already does nothing.
        """
        interval = check_interval(interval)
        if interval == self.interval:
            return
        self.interval = interval
        if self._auto_timeout:
            self.read_timeout = max(2.0, 4 * self.interval)
        self._regrid = True
        self._wake.set()

    def pause(self) -> None:
        """Stop reading until `resume` (the thread keeps its schedule)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._wake.set()

    def reset_peaks(self) -> None:
        """The panel's "reset peaks" button, and nothing else: torch's peak counters start
        again from the current figures for everyone in the process (the source's
        ``reset_peaks``: ``torch.cuda.reset_peak_memory_stats``), and so do this sampler's own
        peaks. No read runs meanwhile, so the drop is not taken for someone else's reset.

        Raises
        ------
        TypeError
            When the source cannot reset peaks; what the source raises (it is not running yet).
        """
        reset = getattr(self.source, "reset_peaks", None)
        if not callable(reset):
            raise TypeError(f"{self._label()} cannot reset peaks")
        with self._read_lock:
            reset()
            self.peaks.reset()

    def close(self) -> None:
        """Stop, then close the source."""
        self.stop()
        try:
            self.source.close()
        except Exception as exc:
            self._count_error(f"closing the source: {short_error(exc)}")

    # listeners ---------------------------------------------------------------------------------
    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(sample)`` with every new sample, on the sampler thread (keep it quick)."""
        if not callable(fn):
            raise TypeError(f"a listener must be callable, got {type(fn).__name__}")
        with self._lock:
            if fn not in self._listeners:
                self._listeners = (*self._listeners, fn)

    def remove_listener(self, fn: Listener) -> None:
        with self._lock:
            self._listeners = tuple(f for f in self._listeners if f != fn)

    # reading -----------------------------------------------------------------------------------
    def sample_once(self, *, segments: bool | None = None) -> Sample:
        """Read once now, store and publish the sample; never raises.

        ``segments`` forces (True) or skips (False) segment state; by default it follows the
        schedule like a tick does.
        """
        try:
            return self._tick(force_segments=segments)
        except BaseException as exc:  # a bug here must still not reach the user
            if isinstance(exc, KeyboardInterrupt) and _main_thread():
                raise  # the user's Ctrl-C stops their cell, as it would without us
            self._count_error(f"sampler: {short_error(exc)}")
            return Sample.failed(self._device(), self.last_error or "sampler error")

    def status(self) -> dict[str, Any]:  # Any: counters, flags, shares and the last error
        """Counters and the schedule in force, for the panel's footer and tests."""
        return {
            "running": self.running,
            "paused": self._paused,
            **self.counters,
            "segment_gap": self.segment_gap,
            "budget_limited": self.budget_limited,
            "cpu_share": self.cpu_share,
            "history_bytes": self.history.nbytes,
            "history_len": len(self.history),
            "last_error": self.last_error,
            "stopped": self.stopped,
        }

    @property
    def cpu_share(self) -> float:
        """Estimated share of one core the reads use at the current schedule."""
        return self._stats_cpu / self.interval + self._segment_cpu / max(self.segment_gap, 1e-9)

    # internals ---------------------------------------------------------------------------------
    def _device(self) -> int:
        d = getattr(self.source, "device", 0)
        return d if isinstance(d, int) else 0

    def _label(self) -> str:
        return str(getattr(self.source, "label", type(self.source).__name__))

    def _note(self, text: str) -> None:
        self._notes.append(text)
        del self._notes[:-8]

    def _count_error(self, text: str) -> None:
        self.counters["errors"] += 1
        self.last_error = text

    def _on_oom(self, event: OomEvent) -> None:
        """Called by the source in the user's allocating thread: queue and wake, nothing more."""
        self._ooms.append(event)
        self._wake.set()

    def _died(self, reason: str) -> None:
        """The thread stopped (or never started) on its own: count it, keep why in
        ``stopped``, and publish a last sample saying so (the panel shows it)."""
        self._count_error(reason)
        self.stopped = reason
        try:
            self._publish(Sample.failed(self._device(), reason, source_label=self._label()))
        except BaseException as exc:  # nothing more to tell: the reason stays in `stopped`
            self.last_error = f"{reason}; telling the listeners failed: {short_error(exc)}"

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug in the loop: stop, but say why
            self._died(f"sampler thread stopped: {short_error(exc)}")

    def _loop(self) -> None:
        start = time.monotonic()
        k = 0
        while not self._stop.is_set():
            try:
                self._drain_ooms()
                if not self._paused:
                    self._tick(force_segments=None)
            except BaseException as exc:  # never let the thread die (SystemExit neither)
                self._count_error(f"sampler: {short_error(exc)}")
            # Drift-free: ticks sit on the grid start + k * interval; missed ticks are skipped.
            now = time.monotonic()
            if self._regrid:  # set_interval: a new grid from now
                self._regrid, start, k = False, now, 0
            k = max(k + 1, math.floor((now - start) / self.interval) + 1)
            while not self._stop.is_set():
                delay = start + k * self.interval - time.monotonic()
                if delay <= 0:
                    break
                self._wake.wait(min(delay, _MAX_WAIT_S))
                self._wake.clear()
                if self._ooms:
                    self._drain_ooms()
                if self._regrid:
                    self._regrid, start, k = False, time.monotonic(), 1

    def _drain_ooms(self) -> None:
        while self._ooms:
            event = self._ooms.popleft()
            make = getattr(self.source, "oom_sample", None)
            try:
                sample = make(event) if callable(make) else None
            except Exception as exc:
                self._count_error(f"OOM sample: {short_error(exc)}")
                sample = None
            if not isinstance(sample, Sample):
                sample = Sample(
                    time=event.time,
                    monotonic=time.monotonic(),
                    device=event.device,
                    stats=None,
                    source_label=self._label(),
                    oom=event,
                )
            self._publish(sample)

    def _segments_due(self, now: float) -> bool:
        caps: frozenset[str] = getattr(self.source, "capabilities", frozenset())
        return self.segments_wanted and "segments" in caps and now >= self._next_segment

    def _tick(self, *, force_segments: bool | None) -> Sample:
        with self._read_lock:
            now = time.monotonic()
            want = self._segments_due(now) if force_segments is None else force_segments
            sample = self._read(want)
            if sample is None:  # cancelled by stop()
                return Sample.failed(self._device(), "stopped", source_label=self._label())
            self.counters["ticks"] += 1
            got_segments = sample.segments is not None
            if want:
                self.counters["segment_reads"] += 1
                if got_segments:
                    extra = max(0.0, sample.cpu_time - self._stats_cpu)
                    self._segment_cpu = _ema(
                        self._segment_cpu, extra, self.counters["segment_reads"]
                    )
            elif sample.state != "error":
                self._stats_cpu = _ema(self._stats_cpu, sample.cpu_time, self.counters["ticks"])
            if want:
                self._reschedule_segments(now)
            return self._publish(sample)

    def _reschedule_segments(self, now: float) -> None:
        floor = max(
            self.segment_interval, float(getattr(self.source, "segment_interval_hint", 0) or 0)
        )
        room = self.cpu_budget - self._stats_cpu / self.interval
        if self._segment_cpu <= 0:
            gap = floor
        elif room <= 0:
            gap = _MAX_SEGMENT_GAP_S
        else:
            gap = self._segment_cpu / room
        self.budget_limited = gap > floor
        self.segment_gap = min(max(gap, floor), _MAX_SEGMENT_GAP_S)
        self._next_segment = now + self.segment_gap

    def _read(self, segments: bool) -> Sample | None:
        """Run ``source.sample`` on a fresh thread; wait at most ``read_timeout``."""
        device, label = self._device(), self._label()
        hung = self._hung
        if hung is not None:
            if hung.thread is not None and hung.thread.is_alive():
                waited = time.monotonic() - hung.started
                msg = f"source call still hung after {waited:.0f} s: not reading until it returns"
                self._count_error(msg)
                return Sample.failed(device, msg, source_label=label)
            self._hung = None
        job = _Read()
        source = self.source

        def run() -> None:
            t0 = time.thread_time()
            try:
                job.result = source.sample(segments=segments)
            except BaseException as exc:  # a source must not take the thread down
                job.error = exc
            finally:
                job.cpu = time.thread_time() - t0
                job.done.set()

        job.thread = threading.Thread(target=run, name="gpumemviz-read", daemon=True)
        self._current = job
        if self._stop.is_set() and threading.current_thread() is self._thread:
            self._current = None
            return None  # stop() came between the tick's start and here
        job.thread.start()
        finished = job.done.wait(min(self.read_timeout, MAX_INTERVAL_S))
        self._current = None
        if job.cancelled:
            return None
        if not finished:
            self._hung = job
            self.counters["hung_reads"] += 1
            self.counters["abandoned"] += 1
            msg = (
                f"source read did not return within {self.read_timeout:g} s: its thread was "
                "abandoned (Python cannot kill a thread)"
            )
            self._count_error(msg)
            return Sample.failed(device, msg, source_label=label)
        if job.error is not None:
            self._count_error(f"source raised {short_error(job.error)}")
            return Sample.failed(device, self.last_error or "", source_label=label).replace(
                cpu_time=job.cpu
            )
        result = job.result
        if not isinstance(result, Sample):
            msg = f"source returned {type(result).__name__}, not a Sample"
            self._count_error(msg)
            return Sample.failed(device, msg, source_label=label).replace(cpu_time=job.cpu)
        if result.errors:
            self.counters["errors"] += len(result.errors)
            self.last_error = result.errors[-1]
        return result.replace(cpu_time=job.cpu)

    def _publish(self, sample: Sample) -> Sample:
        notes = list(sample.notes)
        if self.budget_limited:
            notes.append(
                f"segment map every {self.segment_gap:.1f} s to stay within the "
                f"{self.cpu_budget:.0%} CPU budget (a read costs {self._segment_cpu * 1e3:.1f} ms)"
            )
        if self._notes:
            notes.extend(self._notes)
            self._notes.clear()
        peaks = self.peaks.update(sample)
        sample = sample.replace(seq=next(self._seq), notes=tuple(notes), peaks=peaks)
        stored = self.history.append(sample)
        for fn in self._listeners:
            try:
                fn(stored)
            except BaseException as exc:  # SystemExit too: a listener never stops the sampler
                if isinstance(exc, KeyboardInterrupt) and _main_thread():
                    raise  # the user's Ctrl-C while sample_once ran on their thread
                self.counters["listener_errors"] += 1
                name = getattr(fn, "__qualname__", type(fn).__name__)
                self._note(
                    f"listener {name} raised {short_error(exc)} "
                    f"({self.counters['listener_errors']} so far)"
                )
        return stored


def _ema(old: float, new: float, n: int) -> float:
    return new if n <= 1 or old == 0 else (1 - _EMA) * old + _EMA * new
