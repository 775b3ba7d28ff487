"""`JobView`: a client of a running job's store that reads every rank's summary and asks a rank
for its snapshot.

No server of its own: it connects to the job's TCPStore (torchrun's MASTER_ADDR:MASTER_PORT)
like any worker would, reads the members key and every summary in one round trip, and marks a
rank stale when its summary is older than `STALE_INTERVALS` of its intervals (a rank that exited,
hung, or lost the store). Ages are measured against the summaries' wall-clock times (the hosts'
clocks are taken to agree, NTP, as torch's own elastic agent takes them) and, since anyone can
write a stamp, by the view's own clock too: a summary that has not changed for 3 of its
intervals since this view first saw it is stale whatever its stamp says, and a stamp in the
future is stale at once. Every value read is bounded and checked (`keys.check_summary`): a bad
one becomes a row marked ``suspect`` with the reason and no figures; at most the job's world
size (or `MAX_RANKS`) of (rank, device) pairs are read, and how many were not is said.
Every store call has the view's timeout (`gpumemviz.distributed.store.Connection`).
"""

from __future__ import annotations

import hashlib
import math
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumemviz.distributed.keys import (
    MAX_RANKS,
    MAX_SUMMARY_BYTES,
    MEMBERS,
    STALE_INTERVALS,
    Json,
    answer_key,
    check_summary,
    decode,
    parse_members,
    request_key,
    request_nonce_key,
    short_text,
    snapshot_file,
    summary_key,
)
from gpumemviz.distributed.store import (
    Connection,
    Store,
    connect,
    read_counter,
    read_value,
    read_values,
)
from gpumemviz.snapshot.escaping import short_repr

__all__ = ["Grid", "JobError", "JobView", "parse_address", "read_grid", "read_ranks"]

_POLL_S = 0.05
_MEMBERS_BYTES = 256 << 10  # of the members key: 4096 entries take about 40 KiB
_FUTURE_SLACK_S = 1.0  # a stamp this far (or one interval) ahead of the view's clock is stale


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


@dataclass
class Grid:
    """One read of the job: the rows (`read_ranks`) and how many (rank, device) pairs of the
    members key were not read (over the cap, or junk)."""

    rows: list[Json] = field(default_factory=list)
    dropped: int = 0


def read_grid(
    store: Store | Connection,
    now: float | None = None,
    *,
    cap: int = MAX_RANKS,
    seen: dict[tuple[int, int], tuple[bytes, float]] | None = None,
) -> Grid:
    """Every (rank, device) summary in the store (at most `cap` pairs, ranks under `cap`),
    checked, with ``age_s`` and ``stale`` added, sorted by rank, then device. A value that is
    not a summary becomes a row with ``suspect`` (the reason), ``stale`` and no figures.
    `seen` (kept by the caller between reads) holds each value's digest and when it was first
    seen, so a value that stops changing turns stale by this process's clock."""
    raw_members = read_value(store, MEMBERS) or b""
    text = raw_members[:_MEMBERS_BYTES].decode("ascii", "replace")
    listed = parse_members(text)
    members = [(r, d) for r, d in listed if r < cap][:cap]
    dropped = len(listed) - len(members) + (1 if len(raw_members) > _MEMBERS_BYTES else 0)
    raw = read_values(store, [summary_key(r, d) for r, d in members])
    now = time.time() if now is None else now
    mono = time.monotonic()
    out: list[Json] = []
    for (rank, device), value in zip(members, raw, strict=True):
        if value is None:
            continue  # listed, not yet set
        summary = decode(value, limit=MAX_SUMMARY_BYTES)
        try:
            checked, why = check_summary(summary) if summary is not None else (None, None)
        except Exception as exc:  # a check of ours that failed: the row is suspect, not the read
            checked, why = None, f"unreadable ({type(exc).__name__})"
        if checked is None:
            why = why or f"not a summary ({len(value)} bytes that are not a JSON object)"
            out.append(
                {"rank": rank, "device": device, "suspect": why, "stale": True, "age_s": None}
            )
            continue
        checked["rank"], checked["device"] = rank, device  # the key says who, not the value
        first = None
        if seen is not None:
            digest = hashlib.blake2b(value, digest_size=16).digest()
            before = seen.get((rank, device))
            if before is None or before[0] != digest:
                seen[(rank, device)] = (digest, mono)
            else:
                first = before[1]
        out.append(with_age(checked, now, unchanged_s=None if first is None else mono - first))
    return Grid(out, dropped)


def read_ranks(store: Store | Connection, now: float | None = None) -> list[Json]:
    """Every (rank, device) summary in the store, with ``age_s`` and ``stale`` added; sorted by
    rank, then device (`read_grid`'s rows)."""
    return read_grid(store, now).rows


def with_age(summary: Json, now: float, unchanged_s: float | None = None) -> Json:
    """`summary` with ``age_s`` (seconds since it was published, None when its stamp is not a
    usable time) and ``stale``: older than `STALE_INTERVALS` intervals, stamped in the future
    (beyond a second or an interval of slack), or unchanged for as long by the viewer's own
    clock (`unchanged_s`)."""
    t = summary.get("time")
    interval = summary.get("interval")
    every = float(interval) if isinstance(interval, int | float) and interval > 0 else 1.0
    limit = STALE_INTERVALS * every
    if not isinstance(t, int | float) or not math.isfinite(t):
        summary["age_s"], summary["stale"] = None, True
        return summary
    age = now - float(t)
    future = age < -max(_FUTURE_SLACK_S, every)
    summary["age_s"] = None if future else round(max(0.0, age), 3)
    quiet = unchanged_s is not None and unchanged_s > limit
    summary["stale"] = future or not age <= limit or quiet
    if quiet and not future:
        summary["age_s"] = max(summary["age_s"] or 0.0, round(unchanged_s or 0.0, 3))
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
        Seconds to wait for the store to answer a connection or a call (default 10): a store
        that does not answer in time raises `gpumemviz.distributed.store.StoreHung`.
    world_size : int, optional
        The job's ranks: pairs of higher ranks are not read (default: up to `MAX_RANKS`).

    Attributes
    ----------
    dropped : int
        (rank, device) pairs of the members key the last read left out (over the cap, junk).

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

    def __init__(
        self, host: str, port: int, *, timeout: float = 10.0, world_size: int | None = None
    ) -> None:
        if world_size is not None and (
            isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
        ):
            raise ValueError(f"world_size must be an int >= 1, got {short_repr(world_size)}")
        self.host, self.port = host, port
        self.cap = min(world_size, MAX_RANKS) if world_size is not None else MAX_RANKS
        self.dropped = 0
        self._seen: dict[tuple[int, int], tuple[bytes, float]] = {}
        self.store = connect(host, port, timeout)

    def close(self) -> None:
        """Close the view's connection (its worker thread ends)."""
        self.store.close()

    def __repr__(self) -> str:
        return f"JobView({self.host!r}, {self.port})"

    def ranks(self) -> list[dict[str, Any]]:  # Any: JSON values
        """One plain dict per (rank, device), sorted by rank then device.

        Each is what the rank published (`gpumemviz.render.strips.device_summary`'s keys:
        reserved, allocated, free, largest_free, fragmentation (external, 0-1), ooms, bins, ...;
        plus rank, local_rank, host, pid, time, interval, alloc_retries, total, device_free,
        headroom, last_oom, snapshots) and ``age_s`` and ``stale`` (no update for 3 intervals);
        a value that is not a summary is a row with only rank, device, ``suspect`` (why) and
        ``stale``.
        """
        grid = read_grid(self.store, cap=self.cap, seen=self._seen)
        self.dropped = grid.dropped
        return grid.rows

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
        rows = [r for r in self.ranks() if "suspect" not in r]
        mine = [r for r in rows if r["rank"] == rank]
        if not mine:
            known = sorted({r["rank"] for r in rows})
            raise JobError(f"rank {rank} has not published (ranks publishing: {known or 'none'})")
        if all(r["stale"] for r in mine):
            raise JobError(f"rank {rank} is stale: no update for {mine[0]['age_s']} s")
        if not any(r.get("snapshots") for r in mine):
            raise JobError(f"rank {rank} writes no snapshots: it was started without snapshot_dir")
        nonce = secrets.token_hex(8)

        def ask(store: Store) -> int:
            store.set(request_nonce_key(rank), nonce.encode("ascii"))
            return int(store.add(request_key(rank), 1))

        n = self.store.call(ask)
        deadline = time.monotonic() + timeout
        while True:
            answer = decode(read_value(self.store, answer_key(rank)))
            served = answer.get("n") if answer is not None else None
            if (
                answer is not None
                and answer.get("nonce") == nonce
                and isinstance(served, int)
                and served >= n
            ):
                path, error = answer.get("path"), answer.get("error")
                if isinstance(path, str):
                    return _checked_path(rank, path)
                raise JobError(short_text(error) if error else f"rank {rank} wrote no snapshot")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"rank {rank} did not write its snapshot within {timeout:g} s")
            time.sleep(_POLL_S)

    def oom_count(self) -> int:
        """How many OOMs the job's ranks have announced so far."""
        from gpumemviz.distributed.keys import OOM_COUNT

        return read_counter(self.store, OOM_COUNT)


def _checked_path(rank: int, text: str) -> Path:
    """The path a rank answered, once it is one the rank writes: absolute, named
    ``rank{rank}.pickle``, no ``..``; where its folder is visible here, a regular file (not a
    link). Anyone can write an answer: a path that fails is a `JobError`, never returned."""
    path = Path(short_text(text, 4096))
    bad = f"rank {rank} answered with a path it does not write: {short_text(text, 120)!r}"
    if not path.is_absolute() or path.name != snapshot_file(rank) or ".." in path.parts:
        raise JobError(bad)
    if path.parent.is_dir():
        try:
            mode = path.lstat().st_mode
        except OSError:
            raise JobError(f"{bad} (no such file)") from None
        if not stat.S_ISREG(mode):
            raise JobError(f"{bad} (not a regular file)")
    return path
