"""`publish`: a rank's daemon thread that keeps its summary in the job's store and answers.

Each tick it reads the newest sample of the rank's sampler (the shared one of its device, or
one of its own for a source the user names), builds the (rank, device) summary
(`gpumemviz.distributed.summary`) and sets it under the rank's key; between ticks it polls the
two counters other processes bump: a job view's snapshot request and another rank's OOM
(`gpumemviz.distributed.answers`). With ``oom_dir`` it also installs the rank's OOM handler
(`gpumemviz.distributed.oom`) beside the sampler's. It never raises into training: a store that
goes away stops the thread with one logged line; one that stops answering is said once and
tried again each tick (every store call has a deadline: `gpumemviz.distributed.store.Connection`);
anything else is counted and logged once. `publish` makes no store call itself (it returns at
once even while the store hangs), and at exit every publisher is stopped and joined before the
interpreter finalises, never entering a store call once stopping.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from gpumemviz.distributed.answers import Answers
from gpumemviz.distributed.jobview import read_ranks
from gpumemviz.distributed.keys import (
    MEMBERS,
    Json,
    fit_summary,
    member_entry,
    summary_key,
)
from gpumemviz.distributed.oom import OomFanOut
from gpumemviz.distributed.store import (
    Connection,
    Store,
    StoreHung,
    before_exit,
    default_store,
    guarded_clone,
    rank_device,
    ranks_here,
)
from gpumemviz.distributed.summary import RankIdentity, map_summary, oom_verdict, rank_summary
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.shared import shared
from gpumemviz.live.sources.base import Source, short_error
from gpumemviz.prometheus.server import Exporter, serve_rank
from gpumemviz.render.strips import STRIP_BINS
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.sample import OomEvent, Sample, check_interval
from gpumemviz.snapshot.schema import TorchDict

__all__ = ["Publisher", "publish"]

_log = logging.getLogger("gpumemviz.distributed")
_POLL_S = 0.25  # requests and other ranks' OOMs are looked at this often (or every interval)
_CALL_S = 5.0  # a store call that takes longer: "not answering", said once, tried again later
_running: weakref.WeakSet[Publisher] = weakref.WeakSet()


def _stop_all() -> None:
    """At exit (before the store connections close): stop and join every running publisher."""
    for pub in list(_running):
        pub.stop(timeout=2.0)


before_exit(_stop_all)


@dataclass
class _Feed:
    """One device of the rank: its sampler, whether we started it, the cached map part."""

    sampler: Sampler
    owned: bool  # a sampler of our own (stopped with the publisher)
    started: bool  # we started it
    map_seq: int = -2
    map_part: Json = field(default_factory=dict)


class Publisher:
    """The handle `publish` returns: a rank's publishing thread. See `publish`.

    ``stop()`` ends it; ``tick()`` publishes once now (tests, benchmarks); ``stopped`` says why
    the thread ended on its own (None while it runs); ``oom`` is the OOM handler (with
    ``written`` and ``answered`` after an OOM), ``answers.written`` the files written for others.
    """

    def __init__(
        self,
        store: Store,
        feeds: Sequence[tuple[Sampler, bool, bool]],
        *,
        who: RankIdentity,
        interval: float = 1.0,
        snapshot_dir: str | os.PathLike[str] | None = None,
        oom_dir: str | os.PathLike[str] | None = None,
        oom_wait: float = 5.0,
        record_history: bool = False,
        bins: int = STRIP_BINS,
    ) -> None:
        snapshot_dir, oom_dir = (None if d is None else Path(d) for d in (snapshot_dir, oom_dir))
        self.store = Connection.around(store, deadline=_CALL_S)
        self.store.on_hung = self._on_hung  # our thread's calls are inline: the worker tells
        store = self.store
        self.who = who
        self.interval = check_interval(interval)
        self.snapshot_dir = snapshot_dir
        self.oom_dir = oom_dir
        self.record_history = record_history
        self.bins = bins
        self.feeds = [_Feed(s, owned, started) for s, owned, started in feeds]
        self.sources: list[Source] = [f.sampler.source for f in self.feeds]
        self.last_oom: Json | None = None
        self.stopped: str | None = None
        self.errors = 0
        self.ticks = 0
        self.registered = False
        self.hung: str | None = None  # why the store is not answering (None while it does)
        self._said: set[str] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._hung_lock = threading.Lock()  # `hung` is said by our thread or the store's worker
        self.answers = Answers(
            store.inline(), who.rank, self._export, snapshot_dir=snapshot_dir, oom_dir=oom_dir
        )
        self.oom: OomFanOut | None = None
        self.exporter: Exporter | None = None  # the rank's Prometheus endpoint (prometheus_port)
        if oom_dir is not None:
            self.oom = OomFanOut(
                store,
                who.rank,
                oom_dir,
                self._export,
                self._peers,
                wait=oom_wait,
                ring=self.answers.ring,
            )
        for src in self.sources:
            add = getattr(src, "add_oom_handler", None)
            if callable(add):
                add(self._on_oom)

    # lifecycle -------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def start(self) -> Publisher:
        if not self.running:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"gpumemviz-publish-{self.who.rank}", daemon=True
            )
            self._thread.start()
            _running.add(self)
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop publishing (and the samplers it made); returns whether the thread ended. No store
        call starts once stopping; one in flight is cut short (`Connection.close`)."""
        self._stop.set()
        self._wake.set()
        self.store.close()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        _running.discard(self)
        for src in self.sources:
            remove = getattr(src, "remove_oom_handler", None)
            if callable(remove):
                remove(self._on_oom)
        if self.exporter is not None:
            self.exporter.stop()
        for feed in self.feeds:
            if feed.owned:
                feed.sampler.stop()
        return not self.running

    def serve_metrics(
        self,
        prometheus_port: int,
        rank: int,
        local_rank: int,
        *,
        addr: str = "127.0.0.1",
        demo: bool = True,
    ) -> Exporter | None:
        """Serve the rank's Prometheus endpoint on ``addr``, port ``prometheus_port +
        local_rank``, reading the rank's own samplers; `publish` calls it. It becomes `exporter`
        (stopped with the publisher); when it cannot be served, one logged line, None, and
        publishing goes on. `demo`: serve a simulated device's series (the user named it)."""
        samplers = {f.sampler.source.device: f.sampler for f in self.feeds}
        try:
            self.exporter = serve_rank(
                prometheus_port,
                rank=rank,
                local_rank=local_rank,
                samplers=samplers,
                addr=addr,
                demo=demo,
            )
        except (OSError, ValueError, ImportError) as exc:
            self._say_once("prometheus", f"Prometheus metrics not served: {short_error(exc)}")
        return self.exporter

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop; an OOM leaving the block that no observer saw (an old torch, a failed attach)
        still gets the rank's files, from a snapshot taken now. The error goes on unchanged."""
        oom = self.oom
        if exc is not None and oom is not None and oom.written is None and _is_oom(exc):
            device = getattr(self.sources[0], "device", 0)
            self._on_oom(
                OomEvent(
                    time=time.time(),
                    device=device if isinstance(device, int) else 0,
                    alloc_size=int(getattr(exc, "alloc_size", 0) or 0),
                    device_limit=0,
                    device_free=0,
                    explanation=f"seen as it left the block: {short_error(exc)}",
                )
            )
        self.stop()

    # the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = time.monotonic()
        poll = min(self.interval, _POLL_S)
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_tick or self._wake.is_set():
                    self._wake.clear()
                    next_tick = time.monotonic() + self.interval
                    self.tick()
                self._poll()
                self._answering()
            except _StoreHung as exc:
                self._on_hung(str(exc))
            except _StoreError as exc:
                if self._stop.is_set():
                    return  # stopping cut the call short: nothing went away
                self.stopped = f"the job store went away ({exc}): gpumemviz stopped publishing"
                _log.warning("gpumemviz: rank %d: %s", self.who.rank, self.stopped)
                return
            except Exception as exc:  # a bug of ours: counted, said once, never raised
                self.errors += 1
                self._say_once("error", f"publishing failed: {short_error(exc)}")
            self._wake.wait(max(0.0, min(poll, next_tick - time.monotonic())))

    def tick(self) -> list[Json]:
        """Publish every device's summary now; returns them (store errors raise `_StoreError`)."""
        self._history()
        now = time.time()
        out = []
        writes: list[tuple[str, bytes]] = []
        for feed in self.feeds:
            summary = self._summary(feed, now)
            key = summary_key(self.who.rank, int(summary["device"]))
            writes.append((key, fit_summary(key, summary)))
            out.append(summary)
        members = [] if self.registered else [member_entry(self.who.rank, s["device"]) for s in out]

        def publish_all(store: Store) -> None:
            for key, raw in writes:
                store.set(key, raw)
            for entry in members:
                store.append(MEMBERS, entry)

        if members:
            self._prime()
        self._store_call(publish_all)
        self.registered = True
        self.ticks += 1
        return out

    def _on_hung(self, why: str) -> None:
        """The store stopped answering (seen by our thread, or by the store's worker while our
        thread waits in a call): said once until it answers again."""
        with self._hung_lock:
            if self.hung is not None:
                return
            self.hung = why
        _log.warning(
            "gpumemviz: rank %d: %s: publishing goes on when it answers", self.who.rank, why
        )

    def _answering(self) -> None:
        with self._hung_lock:
            was, self.hung = self.hung, None
        if was is not None:
            _log.warning("gpumemviz: rank %d: the job store answers again", self.who.rank)

    def _store_call(self, fn: Any) -> None:  # Any: a callable taking the store
        """``fn(store)`` in this thread, under the connection's deadline; never once stopping."""
        if self._stop.is_set():
            raise _StoreError("stopping")
        try:
            self.store.call_inline(fn)
        except StoreHung as exc:
            raise _StoreHung(str(exc)) from None
        except Exception as exc:
            raise _StoreError(short_error(exc)) from None

    def _summary(self, feed: _Feed, now: float) -> Json:
        history = feed.sampler.history
        latest = history.latest()
        if latest is None:
            device = getattr(feed.sampler.source, "device", 0)
            latest = Sample.failed(device if isinstance(device, int) else 0, "no sample yet")
            latest = latest.replace(state="waiting", errors=())
        with_map = history.latest_segments()
        seq = with_map.seq if with_map is not None else -1
        if seq != feed.map_seq:
            feed.map_part = map_summary(with_map if with_map is not None else latest, self.bins)
            feed.map_seq = seq
        return rank_summary(
            self.who,
            latest,
            feed.map_part,
            now=now,
            interval=self.interval,
            last_oom=self.last_oom,
            snapshots=self.snapshot_dir is not None,
            oom_files=self.oom_dir is not None,
        )

    def _history(self) -> None:
        """Turn recording on where asked (once CUDA allows), or say once that it is off."""
        if self.snapshot_dir is None and self.oom_dir is None:
            return
        for src in self.sources:
            enabled = _call(src, "history_enabled")
            if enabled is not False:
                continue
            if self.record_history and callable(getattr(src, "record_history", None)):
                try:
                    src.record_history(True)  # type: ignore[attr-defined]
                    self._say_once("recording", "recording allocator history (record_history)")
                except Exception:
                    pass  # CUDA not initialised yet: the next tick tries again
            else:
                self._say_once(
                    "no-history",
                    "allocator history is not recorded: snapshots will have no timeline "
                    "(publish(..., record_history=True) turns it on)",
                )

    def _say_once(self, what: str, text: str) -> None:
        if what not in self._said:
            self._said.add(what)
            _log.warning("gpumemviz: rank %d: %s", self.who.rank, text)

    # OOM and requests --------------------------------------------------------------------------
    def _on_oom(self, event: OomEvent) -> None:
        """In the failing thread, before the error is raised: keep the verdict, write the files."""
        try:
            self.last_oom = oom_verdict(event)
            self._wake.set()  # the next summary carries it
            if self.oom is not None:
                self.oom(event)
        except Exception as exc:
            self._say_once("oom", f"handling the OOM failed: {short_error(exc)}")

    def _poll(self) -> None:
        """Requests and other ranks' OOMs (`Answers.poll` catches its own write errors: what
        leaves it is the store failing)."""
        self._answers_call(self.answers.poll)

    def _prime(self) -> None:
        """Where the request and OOM counters stand, read before the rank is first listed."""
        self._answers_call(self.answers.prime)

    def _answers_call(self, fn: Any) -> None:  # Any: one of `Answers`' store-reading methods
        if self._stop.is_set():
            raise _StoreError("stopping")
        try:
            fn()
        except StoreHung as exc:
            raise _StoreHung(str(exc)) from None
        except Exception as exc:
            raise _StoreError(short_error(exc)) from None

    def _peers(self) -> int:
        """Other ranks that will answer an OOM: fresh, writing OOM files."""
        rows = read_ranks(self.store)
        return len(
            {
                r["rank"]
                for r in rows
                if r["rank"] != self.who.rank and not r["stale"] and r.get("oom_files")
            }
        )

    def _export(self) -> TorchDict:
        """The rank's full snapshot with its history (the first device's source: torch's
        snapshot holds every device)."""
        data: TorchDict = self.sources[0].export()
        return data


class _StoreError(Exception):
    """A store call failed: the thread stops."""


class _StoreHung(_StoreError):
    """A store call did not return in time: said once, tried again."""


def _is_oom(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, the allocator model's OutOfMemory, or an error saying so."""
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"OutOfMemoryError", "OutOfMemory"}) or "out of memory" in str(exc).lower()


def _call(obj: object, name: str) -> Any:  # Any: whatever the optional method returns
    fn = getattr(obj, name, None)
    if not callable(fn):
        return None
    try:
        return fn()
    except Exception:
        return None


def publish(
    interval: float = 1.0,
    *,
    store: Store | None = None,
    source: Source | Sequence[Source] | None = None,
    snapshot_dir: str | os.PathLike[str] | None = None,
    oom_dir: str | os.PathLike[str] | None = None,
    prometheus_port: int | None = None,
    prometheus_addr: str = "127.0.0.1",
    record_history: bool = False,
    oom_wait: float = 5.0,
) -> Publisher:
    """Publish this rank's allocator summary to the job's store from a daemon thread.

    Every `interval` seconds the rank sets a compact summary of each of its devices (rank, local
    rank, host, pid, device, time, reserved, allocated, free in reserved, largest free block,
    external fragmentation, alloc retries, OOMs, the last OOM's verdict, a 64-cell binned
    segment map; at most 4 KiB with its key) under ``gpumemviz/`` keys of the job's
    torch.distributed store, where `gpumemviz.distributed.JobView` (and ``gpumemviz job
    HOST:PORT``) reads them. It never blocks training and never raises into it: this call makes
    no store call (it returns at once even while the store hangs), every later store call has a
    deadline, a store that stops answering is said in one logged line and tried again, one that
    goes away stops it with one logged line. It is stopped and joined at exit.

    Parameters
    ----------
    interval : float
        Seconds between summaries (default 1; 0.01 to 86400).
    store : torch.distributed.Store, optional
        Default: the default process group's (its TCPStore under the PrefixStores).
    source : Source or sequence of Source, optional
        What to read; default: the shared live source of the rank's device (LOCAL_RANK's when
        the machine has it; the simulated demo where there is no GPU, labelled so).
    snapshot_dir : str or path-like, optional
        Where this rank writes ``rank{rank}.pickle`` when a job view asks; None: it does not.
    oom_dir : str or path-like, optional
        Where this rank writes ``rank{r}_oom.pickle`` when it runs out of memory (then asks the
        other ranks to write ``rank{s}_at_rank{r}_oom.pickle`` and waits at most `oom_wait`
        seconds before the error goes on), and its own file when another rank runs out.
    prometheus_port : int, optional
        Serve this rank's devices for Prometheus (`gpumemviz.prometheus`) on
        ``prometheus_port + local_rank``, so the ranks of one host never collide; a port in use
        is said in one logged line and publishing goes on.
    prometheus_addr : str
        The address it listens on (default 127.0.0.1: this host only). "0.0.0.0" lets a fleet's
        Prometheus scrape the ranks, and anyone who reaches the port read the figures
        (docs/prometheus.md).
    record_history : bool
        Turn on the allocator's history recording (once CUDA is initialised) so snapshots carry a
        timeline; without it the rank says once when history is off.
    oom_wait : float
        Seconds a failing rank waits for the others' files (default 5).

    Returns
    -------
    Publisher
        Running; ``stop()`` ends it.

    Raises
    ------
    ValueError
        For a bad argument, or no store (no default process group and no `store`).

    Examples
    --------
    >>> import torch.distributed as dist
    >>> from gpumemviz.distributed import JobView
    >>> from gpumemviz.live.sources.simulated import SimulatedSource
    >>> master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    >>> src = SimulatedSource("training", autostart=False)
    >>> handle = publish(0.1, store=master, source=src)
    >>> _ = handle.tick()
    >>> [(r["rank"], r["device"], r["stale"]) for r in JobView("127.0.0.1", master.port).ranks()]
    [(0, 0, False)]
    >>> handle.stop()
    True
    """
    interval = check_interval(interval)
    if not isinstance(oom_wait, int | float) or not 0 <= oom_wait <= 600:
        raise ValueError(f"oom_wait must be 0 to 600 seconds, got {short_repr(oom_wait)}")
    if prometheus_port is not None and (
        isinstance(prometheus_port, bool)
        or not isinstance(prometheus_port, int)
        or not 0 <= prometheus_port < 65536
    ):
        raise ValueError(f"prometheus_port must be in 0..65535, got {short_repr(prometheus_port)}")
    dirs = [None if d is None else Path(os.fspath(d)) for d in (snapshot_dir, oom_dir)]
    if not isinstance(prometheus_addr, str) or not prometheus_addr:
        raise ValueError(f"prometheus_addr must be an address, got {short_repr(prometheus_addr)}")
    rank, local_rank = ranks_here()
    # the clone is made on the connection's worker: a hung store holds only that thread
    conn = guarded_clone(default_store() if store is None else store, deadline=_CALL_S)
    feeds: list[tuple[Sampler, bool, bool]] = []
    if source is None:
        sampler = shared(rank_device(local_rank))
        feeds.append((sampler, False, not sampler.running and sampler.start()))
    else:
        sources = [source] if not isinstance(source, Sequence) else list(source)
        if not sources or not all(callable(getattr(s, "sample", None)) for s in sources):
            raise ValueError(
                f"source must be a Source or a sequence of them, got {short_repr(source)}"
            )
        for src in sources:
            sampler = Sampler(src, interval=min(interval, 0.5))
            feeds.append((sampler, True, sampler.start()))
    handle = Publisher(
        conn,
        feeds,
        who=RankIdentity.here(rank, local_rank),
        interval=interval,
        snapshot_dir=dirs[0],
        oom_dir=dirs[1],
        oom_wait=float(oom_wait),
        record_history=bool(record_history),
    )
    if prometheus_port is not None:
        handle.serve_metrics(
            prometheus_port, rank, local_rank, addr=prometheus_addr, demo=source is not None
        )
    return handle.start()
