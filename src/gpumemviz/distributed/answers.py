"""What a rank does when others ask: write its full snapshot for a job view, or its snapshot at
another rank's OOM.

Both requests arrive as counters in the job's store, polled by the rank's publisher thread, and
both name only the rank: where the file goes is the rank's own ``snapshot_dir`` / ``oom_dir``
(the store has no authentication, so no requester chooses a path). Files are written atomically
(`gpumemviz.io.write_torch`, protocol 4); every failure becomes the answer's one-line error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from gpumemviz.distributed.keys import (
    OOM_COUNT,
    Json,
    answer_key,
    decode,
    encode,
    oom_done_key,
    oom_key,
    peer_oom_file,
    request_key,
    snapshot_file,
)
from gpumemviz.distributed.store import Store, read_counter, read_value
from gpumemviz.io import write_torch
from gpumemviz.live.sources.base import short_error
from gpumemviz.snapshot.schema import TorchDict

__all__ = ["Answers"]

_log = logging.getLogger("gpumemviz.distributed")
_MISSING_TRIES = 40  # polls an OOM entry may be missing (its rank died between add and set)

Export = Callable[[], TorchDict]


def write_snapshot(export: Export, path: Path) -> Path:
    """`export()` written atomically to `path` (its folder made if missing)."""
    data = export()
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_torch(data, path)


class Answers:
    """The requests one rank serves; `poll` runs on its publisher thread.

    Parameters
    ----------
    store : Store
        The rank's own connection to the job's store.
    rank : int
        This rank.
    export : callable
        Returns the rank's full torch snapshot dict (with its recorded history).
    snapshot_dir, oom_dir : Path or None
        Where requested snapshots and the snapshots at other ranks' OOMs go; None: not served.
    """

    def __init__(
        self,
        store: Store,
        rank: int,
        export: Export,
        *,
        snapshot_dir: Path | None,
        oom_dir: Path | None,
    ) -> None:
        self.store = store
        self.rank = rank
        self.export = export
        self.snapshot_dir = snapshot_dir
        self.oom_dir = oom_dir
        # requests and OOMs from before this rank started are not its to answer
        self.served = read_counter(store, request_key(rank))
        self.oom_seen = read_counter(store, OOM_COUNT)
        self._missing = 0
        self.written: list[Path] = []  # every file written for others, oldest first

    def poll(self) -> None:
        """Answer what is new: a snapshot request, then other ranks' OOMs (store errors raise)."""
        asked = read_counter(self.store, request_key(self.rank))
        if asked > self.served:
            self.served = asked
            self.store.set(answer_key(self.rank), encode(self._snapshot(asked)))
        self._peer_ooms()

    def _snapshot(self, n: int) -> Json:
        if self.snapshot_dir is None:
            error = f"rank {self.rank} writes no snapshots: it was started without snapshot_dir"
            return {"n": n, "path": None, "error": error}
        try:
            path = write_snapshot(self.export, self.snapshot_dir / snapshot_file(self.rank))
        except Exception as exc:
            return {"n": n, "path": None, "error": f"rank {self.rank}: {short_error(exc)}"}
        self.written.append(path)
        return {"n": n, "path": str(path), "error": None}

    def _peer_ooms(self) -> None:
        count = read_counter(self.store, OOM_COUNT)
        while self.oom_seen < count:
            k = self.oom_seen + 1
            info = decode(read_value(self.store, oom_key(k)))
            if info is None:
                self._missing += 1
                if self._missing < _MISSING_TRIES:
                    return  # set just after the count: read it on the next poll
            self._missing = 0
            self.oom_seen = k
            at = info.get("rank") if info is not None else None
            if not isinstance(at, int) or at == self.rank or self.oom_dir is None:
                continue
            self._write_peer(k, at)

    def _write_peer(self, k: int, at: int) -> None:
        t0 = time.monotonic()
        assert self.oom_dir is not None
        try:
            path = write_snapshot(self.export, self.oom_dir / peer_oom_file(self.rank, at))
            self.written.append(path)
            _log.warning(
                "gpumemviz: rank %d ran out of memory; rank %d wrote %s (%.2f s)",
                at,
                self.rank,
                path,
                time.monotonic() - t0,
            )
        except Exception as exc:
            _log.warning(
                "gpumemviz: rank %d could not write its snapshot at rank %d's OOM: %s",
                self.rank,
                at,
                short_error(exc),
            )
        finally:
            self.store.add(oom_done_key(k), 1)  # written or not: the failing rank stops waiting
