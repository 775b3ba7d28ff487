"""A rank's own OOM: write its snapshot, ask the other ranks for theirs, then let the error go.

Runs in the thread that ran out of memory, inside the OOM observer (torch's, or the simulated
device's), before the error is raised: so the files exist when the job fails. The rank's file
is the observer's snapshot (the state the allocation failed in, with the recorded history); the
other ranks are asked through the store (`gpumemviz.distributed.answers`) and waited for at most
``wait`` seconds, on a helper thread, so a store that hangs cannot hold the failing rank longer.
Nothing here raises: the original error propagates exactly as it would without gpumemviz.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpumemviz.distributed.answers import Export, OomRing, write_exclusive
from gpumemviz.distributed.keys import OOM_COUNT, encode, oom_done_key, oom_file, oom_key
from gpumemviz.distributed.store import Connection, Store, read_counter, run
from gpumemviz.live.sources.base import short_error
from gpumemviz.snapshot.sample import OomEvent

__all__ = ["OomFanOut"]

_log = logging.getLogger("gpumemviz.distributed")
_POLL_S = 0.05


class OomFanOut:
    """The OOM handler of one rank (`__call__` is what the source's observer calls).

    Parameters
    ----------
    store : Connection or Store
        The rank's own connection to the job's store (each call under its deadline).
    rank : int
        This rank.
    oom_dir : Path
        Where ``rank{r}_oom.pickle`` goes (and the others write theirs).
    export : callable
        The rank's full snapshot, for an event that carries none.
    peers : callable
        How many other ranks will answer (fresh, with an ``oom_dir``): read at the failure.
    wait : float
        Seconds to wait for them at most.
    ring : OomRing, optional
        The rank's OOM files (shared with its answers to other ranks' OOMs): at most
        `gpumemviz.distributed.answers.OOM_RING` kept.
    """

    def __init__(
        self,
        store: Connection | Store,
        rank: int,
        oom_dir: Path,
        export: Export,
        peers: Callable[[], int],
        *,
        wait: float,
        ring: OomRing | None = None,
    ) -> None:
        self.store = store
        self.rank = rank
        self.oom_dir = oom_dir
        self.export = export
        self.peers = peers
        self.wait = float(wait)
        self.ring = ring if ring is not None else OomRing()
        self.written: Path | None = None
        self.answered: tuple[int, int] | None = None  # (ranks that answered, ranks asked)
        self.error: str | None = None

    def __call__(self, event: OomEvent) -> None:
        try:
            snapshot = event.snapshot
            path = write_exclusive(
                (lambda: snapshot) if snapshot is not None else self.export,
                self.oom_dir / oom_file(self.rank),
            )
            self.written = path
            self.ring.add(path)
        except Exception as exc:
            self.error = f"could not write the OOM snapshot: {short_error(exc)}"
            _log.warning("gpumemviz: rank %d %s", self.rank, self.error)
        helper = threading.Thread(target=self._ask, name="gpumemviz-oom-fanout", daemon=True)
        try:
            helper.start()
            helper.join(self.wait + 1.0)
        except Exception as exc:
            self.error = f"asking the other ranks failed: {short_error(exc)}"
        done, asked = self.answered or (0, -1)
        _log.warning(
            "gpumemviz: rank %d ran out of memory: wrote %s; %s",
            self.rank,
            self.written,
            f"{done} of {asked} other ranks wrote theirs" if asked >= 0 else self.error,
        )

    def _ask(self) -> None:
        try:
            asked = self.peers()  # the store's clients are thread-safe: no lock of ours
            n = int(run(self.store, lambda s: s.add(OOM_COUNT, 1)))
            entry = encode({"rank": self.rank, "time": time.time()})
            run(self.store, lambda s: s.set(oom_key(n), entry))
            deadline = time.monotonic() + self.wait
            done = 0
            while True:
                done = read_counter(self.store, oom_done_key(n))
                if done >= asked or time.monotonic() >= deadline:
                    break
                time.sleep(_POLL_S)
            self.answered = (done, asked)
        except Exception as exc:
            self.error = f"the job store did not answer: {short_error(exc)}"
