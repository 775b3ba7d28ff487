"""`JobView`: a client of a running job's store that reads every rank's summary and asks a rank
for its snapshot.

No server of its own: it connects to the job's TCPStore (torchrun's MASTER_ADDR:MASTER_PORT)
like any worker would, reads the members key and every summary in one round trip, and marks a
rank stale when its summary is older than `STALE_INTERVALS` of its intervals (a rank that exited,
hung, or lost the store). Ages are measured against the summaries' wall-clock times: the hosts'
clocks are taken to agree (NTP), as torch's own elastic agent takes them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpumemviz.distributed.keys import (
    MEMBERS,
    STALE_INTERVALS,
    Json,
    answer_key,
    decode,
    parse_members,
    request_key,
    summary_key,
)
from gpumemviz.distributed.store import Store, connect, read_counter, read_value, read_values
from gpumemviz.snapshot.escaping import short_repr

__all__ = ["JobError", "JobView", "parse_address", "read_ranks"]

_POLL_S = 0.05


class JobError(RuntimeError):
    """A rank cannot do what was asked (unknown, stale, no snapshot_dir, its write failed)."""


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as (host, port); a one-line ValueError otherwise.

    >>> parse_address("127.0.0.1:29500"), parse_address("[::1]:80")
    (('127.0.0.1', 29500), ('::1', 80))
    """
    host, sep, port = str(text).rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"expected HOST:PORT (the job's MASTER_ADDR:MASTER_PORT), got {short_repr(text)}"
        )
    return host, int(port)


def read_ranks(store: Store, now: float | None = None) -> list[Json]:
    """Every (rank, device) summary in the store, with ``age_s`` and ``stale`` added; sorted by
    rank, then device. Values that are not a summary are skipped."""
    members = parse_members((read_value(store, MEMBERS) or b"").decode("ascii", "replace"))
    raw = read_values(store, [summary_key(r, d) for r, d in members])
    now = time.time() if now is None else now
    out: list[Json] = []
    for (rank, device), value in zip(members, raw, strict=True):
        summary = decode(value)
        if summary is None:
            continue
        summary["rank"], summary["device"] = rank, device  # the key says who, not the value
        out.append(with_age(summary, now))
    return out


def with_age(summary: Json, now: float) -> Json:
    """`summary` with ``age_s`` (seconds since it was published, never negative) and ``stale``."""
    t = summary.get("time")
    interval = summary.get("interval")
    age = max(0.0, now - float(t)) if isinstance(t, int | float) else float("inf")
    every = float(interval) if isinstance(interval, int | float) and interval > 0 else 1.0
    summary["age_s"] = round(age, 3) if age != float("inf") else None
    summary["stale"] = not age <= STALE_INTERVALS * every
    return summary


class JobView:
    """A live view of a torch.distributed job whose ranks run `gpumemviz.distributed.publish`.

    Parameters
    ----------
    host : str
        The job store's host (torchrun's ``MASTER_ADDR``).
    port : int
        Its port (``MASTER_PORT``).
    timeout : float
        Seconds to wait for the store to answer a connection or a call (default 10).

    Raises
    ------
    gpumemviz.distributed.store.StoreGone
        A ConnectionError, when nothing answers at `host`:`port`.

    Examples
    --------
    >>> import torch.distributed as dist
    >>> master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    >>> view = JobView("127.0.0.1", master.port)
    >>> view.ranks()
    []
    """

    def __init__(self, host: str, port: int, *, timeout: float = 10.0) -> None:
        self.host, self.port = host, port
        self.store = connect(host, port, timeout)

    def __repr__(self) -> str:
        return f"JobView({self.host!r}, {self.port})"

    def ranks(self) -> list[dict[str, Any]]:  # Any: JSON values
        """One plain dict per (rank, device), sorted by rank then device.

        Each is what the rank published (`gpumemviz.render.strips.device_summary`'s keys:
        reserved, allocated, free, largest_free, fragmentation (external, 0-1), ooms, bins, ...;
        plus rank, local_rank, host, pid, time, interval, alloc_retries, total, device_free,
        headroom, last_oom, snapshots) and ``age_s`` and ``stale`` (no update for 3 intervals).
        """
        return read_ranks(self.store)

    def request_snapshot(self, rank: int, timeout: float = 30.0) -> Path:
        """Ask `rank` to write its full snapshot (with history) as ``rank{rank}.pickle`` in its
        own ``snapshot_dir``; returns the path it wrote, once written.

        Raises
        ------
        ValueError
            For a rank that is not an int >= 0, or a timeout that is not positive.
        JobError
            When the rank has not published, is stale, has no snapshot_dir, or could not write.
        TimeoutError
            When it did not answer within `timeout` seconds.
        """
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an int >= 0, got {short_repr(rank)}")
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(
                f"timeout must be a positive number of seconds, got {short_repr(timeout)}"
            )
        rows = self.ranks()
        mine = [r for r in rows if r["rank"] == rank]
        if not mine:
            known = sorted({r["rank"] for r in rows})
            raise JobError(f"rank {rank} has not published (ranks publishing: {known or 'none'})")
        if all(r["stale"] for r in mine):
            raise JobError(f"rank {rank} is stale: no update for {mine[0]['age_s']} s")
        if not any(r.get("snapshots") for r in mine):
            raise JobError(f"rank {rank} writes no snapshots: it was started without snapshot_dir")
        n = int(self.store.add(request_key(rank), 1))
        deadline = time.monotonic() + timeout
        while True:
            answer = decode(read_value(self.store, answer_key(rank)))
            served = answer.get("n") if answer is not None else None
            if answer is not None and isinstance(served, int) and served >= n:
                path, error = answer.get("path"), answer.get("error")
                if isinstance(path, str):
                    return Path(path)
                raise JobError(str(error) if error else f"rank {rank} wrote no snapshot")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"rank {rank} did not write its snapshot within {timeout:g} s")
            time.sleep(_POLL_S)

    def oom_count(self) -> int:
        """How many OOMs the job's ranks have announced so far."""
        from gpumemviz.distributed.keys import OOM_COUNT

        return read_counter(self.store, OOM_COUNT)
