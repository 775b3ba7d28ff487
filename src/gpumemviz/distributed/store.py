"""The job's torch.distributed store: finding it, connecting to it, and the few calls we make.

The only module of the package that touches torch (lazily, inside functions): the store, and
which rank and device this process is. Under torchrun
the default process group's store is a chain of PrefixStores over one TCPStore; gpumemviz keys
go in that TCPStore, unprefixed, so an outside ``TCPStore(host, port, is_master=False)`` client
reads them. Ranks and the job view each talk to it over a connection of their own (a clone), so
a slow gpumemviz call never holds the process group's connection. No call here waits for a key:
counters are read with ``add(key, 0)`` and values only after ``check``.

Anyone who reaches the store can stop answering (a stopped master, a half-open connection), and
torch's client then blocks in C++ without its own timeout (tried on torch 2.13: ``add``,
``clone`` and the constructor all wait forever). So every gpumemviz store call goes through a
`Connection`: one worker thread that makes the calls, a caller that waits for each at most its
deadline and then gets `StoreHung` (the worker is abandoned: later calls fail at once until the
stuck one returns). A thread of our own that may block (the publisher's) calls inline instead
(`Connection.inline`): no hand-off per call, the worker watching it for the deadline. At exit
(`atexit`, before the interpreter finalises) each connection is closed: a call still stuck has
its socket shut down, so it returns while Python can still take it back; a thread coming back
from C++ into a finalising interpreter aborts the process.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from gpumemviz.distributed.keys import short_text
from gpumemviz.live.job_store import default_group_store
from gpumemviz.snapshot.escaping import short_repr

__all__ = [
    "Connection",
    "InlineCalls",
    "StoreGone",
    "StoreHung",
    "connect",
    "default_store",
    "own_connection",
    "rank_device",
    "ranks_here",
    "read_counter",
    "read_value",
    "read_values",
    "store_address",
]

Store = Any  # Any: a torch.distributed.Store, duck typed (torch is imported lazily)


T = TypeVar("T")


class StoreGone(ConnectionError):
    """The job's store cannot be reached (the job ended, or the address is wrong)."""


class StoreHung(StoreGone):
    """The job's store did not answer a call within its deadline (it may answer later)."""


_CLOSE_WAIT_S = 0.5  # how long `Connection.close` lets a call in flight finish on its own
_open: weakref.WeakSet[Connection] = weakref.WeakSet()
_before_exit: list[Callable[[], object]] = []  # run first at exit: the publishers' stops


def before_exit(fn: Callable[[], object]) -> None:
    """Run `fn` at exit before the connections are closed (a publisher stops its thread)."""
    _before_exit.append(fn)


@atexit.register
def _close_all() -> None:
    """At exit, before finalisation: stop what publishes, then close every connection."""
    for fn in list(_before_exit):
        with contextlib.suppress(Exception):  # exit goes on
            fn()
    for conn in list(_open):
        conn.close()


def _sockets() -> dict[int, str]:
    """This process's open socket descriptors (Linux' /proc; empty elsewhere)."""
    out: dict[int, str] = {}
    try:
        entries = list(Path("/proc/self/fd").iterdir())
    except OSError:
        return out
    for entry in entries:
        try:
            link = str(entry.readlink())
        except OSError:
            continue
        if link.startswith("socket:"):
            out[int(entry.name)] = link
    return out


def _peer_port(fd: int) -> int | None:
    """The remote port of socket `fd` (None when it is not a connected TCP socket)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as dup:
            peer = dup.getpeername()
    except OSError:
        return None
    return int(peer[1]) if isinstance(peer, tuple) and len(peer) >= 2 else None


class Connection:
    """A store connection whose every call has a deadline.

    Parameters
    ----------
    make : callable
        Returns the store to talk to (a new client, a clone, or a store given as is); run on
        the worker, so a store that hangs while connecting holds only the worker.
    deadline : float
        Seconds a call may take before the caller gets `StoreHung`.
    port : int, optional
        The store's TCP port: lets `close` find and shut down the socket of a stuck call.
    what : str
        How errors name the store ("the job store at 127.0.0.1:29500").
    on_hung : callable, optional
        Told (from the worker) when an inline call has not returned within the deadline.
    """

    def __init__(
        self,
        make: Callable[[], Store],
        *,
        deadline: float = 10.0,
        port: int | None = None,
        what: str = "the job store",
        on_hung: Callable[[str], object] | None = None,
    ) -> None:
        self.deadline = float(deadline)
        self.port = port
        self.what = what
        self.on_hung = on_hung
        self.hung_since: float | None = None  # monotonic time of the call that did not return
        self.closed = False
        self._lock = threading.Lock()
        self._use = threading.Lock()  # one call on the store at a time: the worker's or inline
        self._inline_since: float | None = None  # when the inline call in flight began
        self._watching = False  # the worker looks at inline calls (since the first one)
        self._jobs: list[tuple[Callable[[Store], Any], Future[Any]]] = []
        self._ready = threading.Condition(self._lock)
        self._busy = False
        self._store: Store | None = None
        self._make = make
        self._before = set(_sockets()) if port is not None else set()
        self._mine: set[int] = set()
        self._thread = threading.Thread(target=self._work, name="gpumemviz-store", daemon=True)
        self._thread.start()
        _open.add(self)

    @classmethod
    def around(cls, store: Store, *, deadline: float = 10.0) -> Connection:
        """A connection that makes its calls on `store` itself (already connected)."""
        if isinstance(store, Connection):
            return store
        address = store_address(store)
        return cls(lambda: store, deadline=deadline, port=address[1] if address else None)

    def call(self, fn: Callable[[Store], T], deadline: float | None = None) -> T:
        """``fn(store)`` on the worker; its result, or its error.

        Raises
        ------
        StoreHung
            When it did not return within the deadline, or an earlier call is still stuck.
        StoreGone
            When the connection is closed or could not be made.
        """
        wait = self.deadline if deadline is None else float(deadline)
        fut: Future[Any] = Future()
        with self._lock:
            self._refuse()
            self._jobs.append((fn, fut))
            self._ready.notify()
        try:
            result: T = fut.result(wait)
        except TimeoutError:
            with self._lock:
                if self.hung_since is None and not fut.done():
                    self.hung_since = time.monotonic() - wait
            if fut.done():
                return fut.result()  # type: ignore[no-any-return]
            raise StoreHung(f"{self.what} is not answering (no reply in {wait:g} s)") from None
        return result

    def inline(self) -> InlineCalls:
        """The same store, called in the caller's own thread (see `InlineCalls`)."""
        return InlineCalls(self)

    def call_inline(self, fn: Callable[[Store], T], deadline: float | None = None) -> T:
        """``fn(store)`` in the calling thread, which it may block while the store hangs: for a
        thread of our own. The worker says the call hung (`hung_since`, `on_hung`) once it
        takes longer than the deadline; calls from elsewhere then get `StoreHung` at once.

        Raises
        ------
        StoreHung
            When an earlier call is stuck, or another call holds the store past the deadline.
        StoreGone
            When the connection is closed or could not be made.
        """
        wait = self.deadline if deadline is None else float(deadline)
        if self._store is None:  # connecting may hang for the store's own timeout (a clone
            self.call(lambda s: None, wait)  # retries): made on the worker, under the deadline
        self._check_open()
        if not self._use.acquire(timeout=wait):
            raise StoreHung(f"{self.what} is not answering (no reply in {wait:g} s)")
        try:
            self._inline_since = time.monotonic()  # before closed is read: `close` sees it
            if self.closed:
                raise StoreGone(f"{self.what}: the connection is closed")
            if not self._watching:  # once: from then on the worker looks every so often
                with self._lock:
                    self._watching = True
                    self._ready.notify()
            result = fn(self._made())
        finally:
            self._inline_since = None
            self._use.release()
        if self.hung_since is not None:
            with self._lock:
                self.hung_since = None  # it answered: calls go on
        return result

    def _check_open(self) -> None:
        with self._lock:
            self._refuse()

    def _refuse(self) -> None:
        """Under `_lock`: raise when no call may start (closed, or a call is stuck)."""
        if self.closed:
            raise StoreGone(f"{self.what}: the connection is closed")
        if self.hung_since is not None:
            ago = time.monotonic() - self.hung_since
            raise StoreHung(f"{self.what} is not answering (for {ago:.1f} s)")

    def _made(self) -> Store:
        """The store, made on first use (by whichever thread holds `_use`)."""
        if self._store is None:
            self._store = self._make()
            if self.port is not None:
                with self._lock:
                    self._mine = set(_sockets()) - self._before
        return self._store

    def close(self, wait: float = _CLOSE_WAIT_S) -> None:
        """No further calls; a call still stuck after `wait` seconds has its socket shut down
        (so its thread comes back while the interpreter still runs); the worker is joined."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            pending, self._jobs = self._jobs, []
            self._ready.notify()
        for _, fut in pending:
            fut.set_exception(StoreGone(f"{self.what}: the connection is closed"))
        self._thread.join(wait)
        # an inline call in flight: its thread is its own to join; given the same time to end
        if self._inline_since is not None and self._use.acquire(timeout=wait):
            self._use.release()
        if self._thread.is_alive() or self._inline_since is not None:
            self._shut_sockets()
            self._thread.join(2.0)
        _open.discard(self)

    def _shut_sockets(self) -> None:
        if self.port is None:
            return
        others: set[int] = set()
        for conn in list(_open):
            if conn is not self:
                others |= conn.mine()
        for fd in _sockets():
            if fd in others or (fd in self._before and fd not in self._mine):
                continue
            if _peer_port(fd) != self.port:
                continue
            try:
                with socket.socket(fileno=os.dup(fd)) as dup:
                    dup.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def mine(self) -> set[int]:
        """The socket descriptors this connection's store opened (known once it is made)."""
        with self._lock:
            return set(self._mine)

    def _work(self) -> None:
        """Make the calls handed over; between them, watch an inline call for its deadline."""
        while True:
            with self._lock:
                while not self._jobs and not self.closed:
                    hung = self._watch()
                    if hung is not None:
                        break
                    self._ready.wait(self._watch_every() if self._watching else None)
                else:
                    hung = None
                if self.closed:
                    return
                if hung is None:
                    fn, fut = self._jobs.pop(0)
                    self._busy = True
            if hung is not None:
                if self.on_hung is not None:
                    with contextlib.suppress(Exception):  # the watcher goes on
                        self.on_hung(hung)
                continue
            if not self._use.acquire(timeout=self.deadline):  # an inline call holds the store
                fut.set_exception(StoreHung(f"{self.what} is not answering (a call is stuck)"))
                with self._lock:
                    self._busy = False
                continue
            try:
                value = fn(self._made())
            except BaseException as exc:  # handed to the caller, whatever it is
                if not fut.done():
                    fut.set_exception(exc)
            else:
                if not fut.done():
                    fut.set_result(value)
            finally:
                self._use.release()
            with self._lock:
                self._busy = False
                self.hung_since = None  # it answered (or failed): calls go on

    def _watch(self) -> str | None:
        """Under `_lock`: the inline call in flight, newly past its deadline (then hung)."""
        since = self._inline_since
        if since is None or self.hung_since is not None:
            return None
        if time.monotonic() - since < self.deadline:
            return None
        self.hung_since = since
        return f"{self.what} is not answering (no reply in {self.deadline:g} s)"

    def _watch_every(self) -> float:
        return max(0.01, min(1.0, self.deadline / 4))


class InlineCalls:
    """A `Connection` whose calls run in the caller's thread (`Connection.call_inline`): what
    the publisher's thread hands its `Answers`, so polling costs no hand-off."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def call(self, fn: Callable[[Store], T], deadline: float | None = None) -> T:
        return self.connection.call_inline(fn, deadline)


def _dist() -> Any:  # Any: torch.distributed, duck typed
    import torch.distributed as dist  # lazily: `import gpumemviz` never imports torch

    return dist


def default_store() -> Store:
    """The TCPStore under the default process group's PrefixStores.

    Raises
    ------
    ValueError
        When no default process group is initialised.
    """
    dist = _dist()
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "no default process group: call torch.distributed.init_process_group first, "
            "or pass store="
        )
    return bottom(default_group_store())


def bottom(store: Store) -> Store:
    """The store under any PrefixStores (their ``underlying_store``)."""
    while True:
        under = getattr(store, "underlying_store", None)
        if under is None:
            return store
        store = under


def store_address(store: Store) -> tuple[str, int] | None:
    """(host, port) of a TCPStore, None for any other store."""
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if isinstance(host, str) and isinstance(port, int):
        return host, port
    return None


def own_connection(store: Store, timeout: float = 10.0) -> Store:
    """A connection of our own to the same store (``clone``), with a short timeout; the store
    itself where it cannot be cloned (a HashStore in one process)."""
    store = bottom(store)
    clone = getattr(store, "clone", None)
    if callable(clone) and store_address(store) is not None:
        try:
            mine = clone()
            mine.set_timeout(datetime.timedelta(seconds=timeout))
            return mine
        except Exception:
            pass  # the shared connection still works
    return store


def guarded_clone(store: Store, deadline: float = 10.0) -> Connection:
    """A `Connection` over a connection of our own to `store` (`own_connection`), made on the
    worker: a store that hangs while cloning holds only the worker, never the caller."""
    if isinstance(store, Connection):
        return store
    under = bottom(store)
    address = store_address(under)
    return Connection(
        lambda: own_connection(under, deadline),
        deadline=deadline,
        port=address[1] if address is not None else None,
    )


def connect(host: str, port: int, timeout: float = 10.0) -> Connection:
    """A client of the job's TCPStore at `host`:`port`, each call bounded by `timeout` seconds.

    Raises
    ------
    ValueError
        For a bad host or port.
    StoreGone
        When nothing answers there within `timeout` seconds (`StoreHung` when something
        accepts the connection but does not answer).
    """
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty string, got {short_repr(host)}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {short_repr(port)}")
    if not isinstance(timeout, int | float) or not 0 < timeout <= 86400:
        raise ValueError(f"timeout must be 0 to 86400 seconds, got {short_repr(timeout)}")
    dist = _dist()

    def make() -> Store:
        return dist.TCPStore(
            host,
            port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
        )

    where = f"{host}:{port}"
    conn = Connection(make, deadline=timeout, port=port, what=f"the job store at {where}")
    try:
        # the constructor retries a refused connection for `timeout` itself: a little more here
        conn.call(lambda s: None, deadline=timeout + 1.0)
    except StoreHung:
        conn.close()
        raise StoreHung(
            f"no job store answers at {where} (it accepts the connection but is not answering "
            f"within {timeout:g} s)"
        ) from None
    except Exception as exc:
        conn.close()
        raise StoreGone(f"no job store answers at {where} ({_first_line(exc)})") from None
    return conn


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return short_text(text[0], 160) if text else type(exc).__name__


def run(store: Store | Connection | InlineCalls, fn: Callable[[Store], T]) -> T:
    """``fn(store)``: through a `Connection` (or its `InlineCalls`) under its deadline; a plain
    store directly."""
    if isinstance(store, Connection | InlineCalls):
        return store.call(fn)
    return fn(store)


def read_counter(store: Store | Connection | InlineCalls, key: str) -> int:
    """The counter at `key` (0 when missing; never waits)."""
    return int(run(store, lambda s: s.add(key, 0)))


def read_value(store: Store | Connection | InlineCalls, key: str) -> bytes | None:
    """The value at `key`, None when missing (never waits)."""

    def get(s: Store) -> bytes | None:
        return bytes(s.get(key)) if s.check([key]) else None

    return run(store, get)


def read_values(store: Store | Connection | InlineCalls, keys: list[str]) -> list[bytes | None]:
    """The values at `keys` in one round trip where the store can (missing ones None)."""
    if not keys:
        return []
    return run(store, lambda s: _values(s, keys))


def _values(store: Store, keys: list[str]) -> list[bytes | None]:
    present = [k for k in keys if store.check([k])] if len(keys) < 2 else _present(store, keys)
    if not present:
        return [None] * len(keys)
    multi = getattr(store, "multi_get", None)
    got = multi(present) if callable(multi) else [store.get(k) for k in present]
    by_key = dict(zip(present, (bytes(v) for v in got), strict=True))
    return [by_key.get(k) for k in keys]


def _present(store: Store, keys: list[str]) -> list[str]:
    """The keys that exist: `check` says whether all do, so one call in the common case."""
    if store.check(keys):
        return keys
    return [k for k in keys if store.check([k])]


def ranks_here() -> tuple[int, int]:
    """(rank, local rank) of this process: the default process group's rank when there is
    one, else torchrun's RANK / LOCAL_RANK, else 0."""
    rank: int | None = None
    try:
        dist = _dist()
        if dist.is_available() and dist.is_initialized():
            rank = int(dist.get_rank())
    except Exception:
        rank = None
    if rank is None:
        rank = _env_int("RANK", 0)
    return rank, _env_int("LOCAL_RANK", rank)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() else default


def rank_device(local_rank: int) -> int:
    """The CUDA device a rank uses by torchrun's convention: its local rank when this machine
    has that many devices, else 0. Never initialises CUDA."""
    try:
        import torch

        if torch.cuda.is_available() and 0 <= local_rank < torch.cuda.device_count():
            return int(local_rank)
    except Exception:
        pass
    return 0
