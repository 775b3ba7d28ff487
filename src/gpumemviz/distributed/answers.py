"""What a rank does when others ask: write its full snapshot for a job view, or its snapshot at
another rank's OOM.

Both requests arrive as counters in the job's store, polled by the rank's publisher thread, and
both name only the rank: where the file goes is the rank's own ``snapshot_dir`` / ``oom_dir``
(the store has no authentication, so no requester chooses a path). Anyone who reaches the store
can bump those counters, so what one request costs is bounded here: at most one export per
`EXPORT_EVERY_S` seconds, OOM files only for ranks in the job's membership and kept in a ring of
`OOM_RING` files per rank, a counter that jumps skipped to its value (never replayed), and every
file created exclusively beside its target and renamed over it (`write_exclusive`): a planted
symlink is refused, its target never written. Every failure becomes the answer's one-line error.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import pickle
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path

from gpumemviz.distributed.keys import (
    MEMBERS,
    OOM_COUNT,
    Json,
    answer_key,
    decode,
    encode,
    oom_done_key,
    oom_key,
    parse_members,
    peer_oom_file,
    request_key,
    request_nonce_key,
    snapshot_file,
)
from gpumemviz.distributed.store import (
    Connection,
    InlineCalls,
    Store,
    read_counter,
    read_value,
    run,
)
from gpumemviz.live.sources.base import short_error
from gpumemviz.snapshot.schema import TorchDict

__all__ = ["EXPORT_EVERY_S", "MAX_JUMP", "OOM_RING", "Answers", "OomRing", "write_exclusive"]

_log = logging.getLogger("gpumemviz.distributed")
_MISSING_TRIES = 40  # polls an OOM entry may be missing (its rank died between add and set)
EXPORT_EVERY_S = 10.0  # one full export per rank per this many seconds, whoever asks
OOM_RING = 4  # OOM files one rank keeps in its oom_dir (its own and at others'), oldest removed
MAX_JUMP = 16  # an OOM counter that moves further in one poll is skipped to its value
_WRITTEN_KEPT = 64  # `Answers.written` keeps this many paths

Export = Callable[[], TorchDict]
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def write_exclusive(export: Export, path: Path) -> Path:
    """`export()` pickled (protocol 4) to `path` for a request from the store.

    The data goes to a new file beside `path`, created with ``O_CREAT | O_EXCL | O_NOFOLLOW``
    (never an existing file, never through a link), then renamed over `path` (a rename never
    follows a link either). A `path` that is a symlink or not a regular file is refused: the
    store chose when, not where, and a link planted in a shared folder stays as it is.

    Raises
    ------
    OSError
        One line naming the path, when it is refused or cannot be written.
    """
    data = export()
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise OSError(f"cannot write {path}: it is {what} (left as it is)")
    tmp = folder / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(data, f, protocol=4)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)  # a rename: never follows a link at `path`
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


class OomRing:
    """The OOM files one rank wrote, oldest first: adding one past `size` removes the oldest
    (a regular file only; a link put in its place is left alone)."""

    def __init__(self, size: int = OOM_RING) -> None:
        self.size = size
        self.paths: collections.deque[Path] = collections.deque()

    def add(self, path: Path) -> None:
        if path in self.paths:
            self.paths.remove(path)
        self.paths.append(path)
        while len(self.paths) > self.size:
            old = self.paths.popleft()
            with contextlib.suppress(OSError):
                if stat.S_ISREG(old.lstat().st_mode):
                    old.unlink()


class Answers:
    """The requests one rank serves; `poll` runs on its publisher thread.

    Parameters
    ----------
    store : Connection, InlineCalls or Store
        The rank's own connection to the job's store.
    rank : int
        This rank.
    export : callable
        Returns the rank's full torch snapshot dict (with its recorded history).
    snapshot_dir, oom_dir : Path or None
        Where requested snapshots and the snapshots at other ranks' OOMs go; None: not served.
    world_size : int, optional
        Ranks of the job (OOMs announced for any other rank number are ignored).
    export_every : float
        Seconds between two exports at least (default `EXPORT_EVERY_S`).
    """

    def __init__(
        self,
        store: Connection | InlineCalls | Store,
        rank: int,
        export: Export,
        *,
        snapshot_dir: Path | None,
        oom_dir: Path | None,
        world_size: int | None = None,
        export_every: float = EXPORT_EVERY_S,
    ) -> None:
        self.store = store
        self.rank = rank
        self.export = export
        self.snapshot_dir = snapshot_dir
        self.oom_dir = oom_dir
        self.world_size = world_size
        self.export_every = float(export_every)
        # requests and OOMs from before this rank registered are not its to answer: read by
        # `prime` before the rank's first summary goes out (never on the caller of `publish`)
        self.served: int | None = None
        self.oom_seen: int | None = None
        self.skipped = 0  # OOM announcements not answered: jumps, non-members, rate limit
        self._missing = 0
        self.last_export: float | None = None  # monotonic time of the last export
        self.ring = OomRing()
        self.written: collections.deque[Path] = collections.deque(maxlen=_WRITTEN_KEPT)

    def poll(self) -> None:
        """Answer what is new: a snapshot request, then other ranks' OOMs (store errors raise)."""
        self.prime()
        assert self.served is not None
        asked = read_counter(self.store, request_key(self.rank))
        if asked > self.served:
            self.served = asked
            raw = read_value(self.store, request_nonce_key(self.rank))
            nonce = raw.decode("ascii", "replace") if raw is not None else ""
            answer = self._snapshot(asked)
            if _is_nonce(nonce):
                answer["nonce"] = nonce
            out = encode(answer)
            run(self.store, lambda s: s.set(answer_key(self.rank), out))
        elif asked < self.served:
            self.served = asked  # the counter was reset (a new store): follow it
        self._peer_ooms()

    def prime(self) -> None:
        """Read where the counters stand, once: called before the rank is first listed, so a
        request made as soon as a viewer sees the rank is counted as new (store errors raise)."""
        if self.served is None or self.oom_seen is None:
            self.served = read_counter(self.store, request_key(self.rank))
            self.oom_seen = read_counter(self.store, OOM_COUNT)

    def _may_export(self) -> float:
        """Seconds until the next export is allowed (0: now)."""
        if self.last_export is None:
            return 0.0
        return max(0.0, self.last_export + self.export_every - time.monotonic())

    def _snapshot(self, n: int) -> Json:
        if self.snapshot_dir is None:
            error = f"rank {self.rank} writes no snapshots: it was started without snapshot_dir"
            return {"n": n, "path": None, "error": error}
        wait = self._may_export()
        if wait > 0:
            error = (
                f"rank {self.rank} writes at most one snapshot every {self.export_every:g} s: "
                f"ask again in {wait:.0f} s"
            )
            return {"n": n, "path": None, "error": error}
        self.last_export = time.monotonic()
        try:
            path = write_exclusive(
                self.export, self.snapshot_dir.absolute() / snapshot_file(self.rank)
            )
        except Exception as exc:
            return {"n": n, "path": None, "error": f"rank {self.rank}: {short_error(exc)}"}
        self.written.append(path)
        return {"n": n, "path": str(path), "error": None}

    def _peer_ooms(self) -> None:
        assert self.oom_seen is not None
        count = read_counter(self.store, OOM_COUNT)
        if count < self.oom_seen or count - self.oom_seen > MAX_JUMP:
            # reset, or bumped by more than ranks can run out at once: not replayed
            self.skipped += max(0, count - self.oom_seen)
            _log.warning(
                "gpumemviz: rank %d: the job's OOM counter moved from %d to %d at once: "
                "skipped to its value, not replayed",
                self.rank,
                self.oom_seen,
                count,
            )
            self.oom_seen = count
            return
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
            if not isinstance(at, int) or isinstance(at, bool) or at == self.rank:
                continue
            if self.oom_dir is None:
                continue
            if not self._member(at) or self._may_export() > 0:
                self.skipped += 1
                self._done(k)  # not written: the failing rank stops waiting all the same
                continue
            self._write_peer(k, at)

    def _member(self, at: int) -> bool:
        """Whether rank `at` is one of the job's: under the world size, in the members key."""
        if at < 0 or (self.world_size is not None and at >= self.world_size):
            return False
        raw = read_value(self.store, MEMBERS) or b""
        return any(r == at for r, _ in parse_members(raw[: 1 << 20].decode("ascii", "replace")))

    def _write_peer(self, k: int, at: int) -> None:
        t0 = time.monotonic()
        assert self.oom_dir is not None
        self.last_export = t0
        try:
            path = write_exclusive(self.export, self.oom_dir / peer_oom_file(self.rank, at))
            self.written.append(path)
            self.ring.add(path)
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
        finally:  # written or not: the failing rank stops waiting
            self._done(k)

    def _done(self, k: int) -> None:
        """Count this rank as done with OOM `k`."""
        key = oom_done_key(k)
        run(self.store, lambda s: s.add(key, 1))


def _is_nonce(text: str) -> bool:
    """A request's nonce: 8 to 64 hex digits."""
    return 8 <= len(text) <= 64 and all(c in "0123456789abcdef" for c in text)
