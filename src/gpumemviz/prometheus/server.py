"""`serve`: the HTTP endpoint Prometheus scrapes, on the shared samplers, and its handle.

Each `serve` has a `CollectorRegistry` of its own (never prometheus_client's global one), so two
endpoints in one process, or the user's own metrics, never clash; prometheus_client's WSGI app
serves it (``name[]`` filtering included) from `_BoundedServer` on a daemon thread: at most
`MAX_CONNECTIONS` requests at once (more are closed at once), each socket under a
`REQUEST_TIMEOUT_S` timeout, so idle or half-sent connections cannot pile up threads. Without a
GPU, ``devices="all"`` serves no device unless ``demo=True`` asks for the simulated demo. The
samplers are
`gpumemviz.live.shared.shared`'s,
the ones the panels read: serving starts no second sampler on a device.
"""

from __future__ import annotations

import errno
import os
import socket
import socketserver
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gpumemviz.live.shared import shared, shared_devices
from gpumemviz.live.sources.default import cuda_device_count
from gpumemviz.prometheus.collector import SamplerCollector
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.sample import check_device

if TYPE_CHECKING:
    from types import TracebackType

    from gpumemviz.live.sampler import Sampler

__all__ = [
    "MAX_CONNECTIONS",
    "REQUEST_TIMEOUT_S",
    "Exporter",
    "PortInUseError",
    "rank_port",
    "serve",
    "serve_rank",
]

MAX_CONNECTIONS = 16  # requests served at once; one more is closed unanswered
REQUEST_TIMEOUT_S = 5.0  # a connection that sends or reads nothing for this long is closed


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (a scrape every 15 s is not news)."""

    def log_message(self, format: str, *args: Any) -> None:  # Any: the log's arguments
        pass


class _BoundedServer(socketserver.ThreadingMixIn, WSGIServer):
    """A thread per request, at most `MAX_CONNECTIONS` at once, each socket under a timeout."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Any: WSGIServer's own
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:  # Any: a socket
        if not self.slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            request.settimeout(REQUEST_TIMEOUT_S)
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


INSTALL_HINT = "gpumemviz.prometheus needs prometheus_client: pip install 'gpumemviz[prometheus]'"


class PortInUseError(OSError):
    """The port asked for is taken (another rank, another exporter): one line saying which."""


class Exporter:
    """A running endpoint: where it listens, what it serves, and `stop`.

    Attributes
    ----------
    addr, port : str, int
        Where it listens (``port`` is the bound one: the port asked for, or the one the system
        chose for 0).
    devices : tuple of int
        The devices whose samplers it reads (the shared ones, or a publisher's).
    labels : dict
        rank, local_rank, host and pid, as every series carries them.
    collector : SamplerCollector
        What builds the series at each scrape.
    """

    def __init__(
        self,
        server: WSGIServer,
        thread: threading.Thread,
        collector: SamplerCollector,
    ) -> None:
        self._server = server
        self._thread = thread
        self.collector = collector
        self.started: tuple[int, ...] = ()  # devices whose shared sampler `serve` started
        self.addr = str(server.server_address[0])
        self.port = int(server.server_address[1])
        self.devices = tuple(sorted(collector.samplers))
        self.labels = dict(collector.labels)
        self._stopped = False

    @property
    def url(self) -> str:
        """The ``/metrics`` URL (IPv6 addresses in brackets)."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and free the port; stop the shared samplers `serve` started (those
        already running when it was called keep running). Calling it again does nothing."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)
        self.collector.close()
        for device in self.started:
            shared(device).stop()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "serving"
        return f"<gpumemviz.prometheus.Exporter {state} {self.url} devices={list(self.devices)}>"


def serve(
    port: int,
    addr: str = "127.0.0.1",
    *,
    devices: str | Sequence[int] = "all",
    rank: int | None = None,
    local_rank: int | None = None,
    demo: bool = False,
) -> Exporter:
    """Serve gpumemviz's allocator metrics for Prometheus on ``http://addr:port/metrics``.

    Per device: reserved, allocated, active, free in reserved, largest free block, external
    fragmentation, releasable by ``empty_cache``, alloc retries, OOMs, gpumemviz's own peaks,
    NVML used and non-PyTorch memory, as ``gpumemviz_*`` series labelled rank, local_rank,
    host, device, gpu_uuid and pid (`gpumemviz.prometheus.metrics.METRICS`). Values are read
    at each scrape from the shared samplers (`gpumemviz.live.shared.shared`), which `serve` starts.

    Parameters
    ----------
    port : int
        TCP port, 0 to 65535 (0: one the system picks; the handle's ``port`` says which).
    addr : str
        Address to listen on (default 127.0.0.1: this host only; "0.0.0.0" for every
        interface: anyone who reaches the port reads the figures, docs/prometheus.md).
    devices : "all" or sequence of int
        "all": every CUDA device torch sees (none on a machine without CUDA, unless `demo`).
    rank, local_rank : int, optional
        The labels; by default the ``RANK`` and ``LOCAL_RANK`` environment variables torchrun
        sets, else 0.
    demo : bool
        Serve the simulated demo where there is no GPU (device 0, marked ``demo="true"`` in
        ``gpumemviz_device_info``). Without it a simulated device serves only its
        ``gpumemviz_up`` 0, saying why.

    Returns
    -------
    Exporter
        Its ``stop()`` frees the port.

    Raises
    ------
    PortInUseError
        One line naming the address and port when the port is taken.
    OSError
        One line when the address cannot be served on otherwise.
    ValueError
        For a bad port, address, device list or rank.
    ImportError
        Without prometheus_client (``pip install 'gpumemviz[prometheus]'``).

    Examples
    --------
    >>> import urllib.request
    >>> from gpumemviz.prometheus import serve
    >>> exporter = serve(0, devices=[0], rank=0, local_rank=0, demo=True)
    >>> exporter.labels["rank"], exporter.devices
    ('0', (0,))
    >>> text = urllib.request.urlopen(exporter.url).read().decode()
    >>> "gpumemviz_device_info{" in text
    True
    >>> exporter.stop()
    """
    port = _check_port(port)
    devs = _devices(devices, demo=bool(demo))
    samplers = {d: shared(d) for d in devs}
    exporter = _start(port, addr, samplers, _labels(rank, local_rank), demo=bool(demo))
    exporter.started = tuple(d for d in devs if not shared(d).running and shared(d).start())
    return exporter


def _labels(rank: int | None, local_rank: int | None) -> dict[str, str]:
    return {
        "rank": str(_rank(rank, "rank", "RANK")),
        "local_rank": str(_rank(local_rank, "local_rank", "LOCAL_RANK")),
        "host": socket.gethostname(),
        "pid": str(os.getpid()),
    }


def _start(
    port: int,
    addr: str,
    samplers: Mapping[int, Sampler],
    labels: dict[str, str],
    *,
    demo: bool,
) -> Exporter:
    """Serve these samplers' series on addr:port (raises one line when it cannot)."""
    if not isinstance(addr, str) or not addr:
        raise ValueError(f"addr must be a host address string, got {short_repr(addr)}")
    try:
        from prometheus_client import CollectorRegistry, make_wsgi_app
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    collector = SamplerCollector(samplers, labels, demo=demo)
    collector.listen()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        server_class = type("_Server", (_BoundedServer,), {"address_family": family[0][0]})
        server: WSGIServer = make_server(
            addr, port, make_wsgi_app(registry), server_class, handler_class=_QuietHandler
        )
        thread = threading.Thread(
            target=server.serve_forever, name="gpumemviz-prometheus", daemon=True
        )
        thread.start()
    except OSError as exc:
        where = f"{addr}:{port}"
        collector.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"gpumemviz.prometheus: port {port} on {addr} is in use "
                "(another rank or exporter?): pick another port"
            ) from None
        reason = exc.strerror or str(exc)
        raise OSError(f"gpumemviz.prometheus: cannot serve on {where}: {reason}") from None
    return Exporter(server, thread, collector)


def rank_port(prometheus_port: int, local_rank: int) -> int:
    """The port a rank serves on: ``prometheus_port + local_rank``, so the ranks of one host
    never collide.

    >>> rank_port(9400, 3)
    9403
    >>> rank_port(65535, 1)
    Traceback (most recent call last):
    ...
    ValueError: prometheus_port + local_rank must be a port 0-65535, got 65535 + 1 = 65536
    """
    base = _check_port(prometheus_port, "prometheus_port")
    local = _rank(local_rank, "local_rank", "LOCAL_RANK")
    if base + local > 65535:
        raise ValueError(
            f"prometheus_port + local_rank must be a port 0-65535, got {base} + {local} = "
            f"{base + local}"
        )
    return base + local


def serve_rank(
    prometheus_port: int,
    *,
    rank: int,
    local_rank: int,
    devices: str | Sequence[int] = "all",
    addr: str = "127.0.0.1",
    samplers: Mapping[int, Sampler] | None = None,
    demo: bool = False,
) -> Exporter:
    """`serve` for one rank of a job: on ``prometheus_port + local_rank`` (`rank_port`), with
    the rank's labels. What a rank's publisher calls, with its own `samplers` (device ->
    sampler; then `devices` is not used and no sampler is started or stopped); `demo` as for
    `serve`; raises as `serve` does.

    Examples
    --------
    >>> exporter = serve_rank(0, rank=1, local_rank=0, devices=[0], demo=True)
    >>> exporter.labels["rank"], exporter.labels["local_rank"]
    ('1', '0')
    >>> exporter.stop()
    """
    port = rank_port(prometheus_port, local_rank)
    if samplers is None:
        return serve(port, addr, devices=devices, rank=rank, local_rank=local_rank, demo=demo)
    return _start(port, addr, samplers, _labels(rank, local_rank), demo=demo)


def _check_port(port: object, name: str = "port") -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"{name} must be an int from 0 to 65535, got {short_repr(port)}")
    return port


def _rank(value: object, name: str, env: str) -> int:
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return 0
        try:
            value = int(text)
        except ValueError:
            raise ValueError(
                f"{name}: the {env} environment variable must be an int, got {short_repr(text)}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {short_repr(value)}")
    return value


def _devices(devices: object, *, demo: bool) -> list[int]:
    if isinstance(devices, str):
        if devices != "all":
            raise ValueError(f'devices must be "all" or a list of ints, got {short_repr(devices)}')
        count = cuda_device_count()
        if count:
            return sorted(set(range(count)) | set(shared_devices()))
        return sorted(set(shared_devices()) | {0}) if demo else []  # no GPU: the demo if asked
    if not isinstance(devices, Sequence) or not devices:
        raise ValueError(f'devices must be "all" or a list of ints, got {short_repr(devices)}')
    return sorted({check_device(d) for d in devices})
