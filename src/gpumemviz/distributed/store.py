"""The job's torch.distributed store: finding it, connecting to it, and the few calls we make.

The only module of the package that touches torch (lazily, inside functions): the store, and
which rank and device this process is. Under torchrun
the default process group's store is a chain of PrefixStores over one TCPStore; gpumemviz keys
go in that TCPStore, unprefixed, so an outside ``TCPStore(host, port, is_master=False)`` client
reads them. Ranks and the job view each talk to it over a connection of their own (a clone), so
a slow gpumemviz call never holds the process group's connection. No call here waits for a key:
counters are read with ``add(key, 0)`` and values only after ``check``.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from gpumemviz.distributed.keys import short_text
from gpumemviz.live.job_store import default_group_store
from gpumemviz.snapshot.escaping import short_repr

__all__ = [
    "StoreGone",
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


class StoreGone(ConnectionError):
    """The job's store cannot be reached (the job ended, or the address is wrong)."""


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


def connect(host: str, port: int, timeout: float = 10.0) -> Store:
    """A client of the job's TCPStore at `host`:`port`.

    Raises
    ------
    ValueError
        For a bad host or port.
    StoreGone
        When nothing answers there within `timeout` seconds.
    """
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty string, got {short_repr(host)}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {short_repr(port)}")
    dist = _dist()
    try:
        return dist.TCPStore(
            host,
            port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
        )
    except Exception as exc:
        raise StoreGone(f"no job store answers at {host}:{port} ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return short_text(text[0], 160) if text else type(exc).__name__


def read_counter(store: Store, key: str) -> int:
    """The counter at `key` (0 when missing; never waits)."""
    return int(store.add(key, 0))


def read_value(store: Store, key: str) -> bytes | None:
    """The value at `key`, None when missing (never waits)."""
    if not store.check([key]):
        return None
    return bytes(store.get(key))


def read_values(store: Store, keys: list[str]) -> list[bytes | None]:
    """The values at `keys` in one round trip where the store can (missing ones None)."""
    if not keys:
        return []
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
