"""The panel of a torch.distributed job: every rank's published strips, one in detail, and a
rank's snapshot on request.

`JobPanel` is a `MemoryPanel` without a sampler. A `JobFeed` reads the job's store on its own
thread and hands the grid (`grid_rows`: a strip per (rank, device), the rank closest to OOM
first, stale ranks marked with their age) to the panel's writer thread, which sends it as the
``strips`` trait the multi-device panel draws. There is no segment state to draw in full: the
selected strip's published figures fill the header and its 64-bin map and rank fields the
``job`` trait. The snapshot button's request (`JobView.request_snapshot`, which waits for the
rank) runs on a thread of its own, never on the kernel's, over a store connection of its own.
"""

from __future__ import annotations

import shlex
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import traitlets

from gpumemviz.distributed import JobFeed, JobView
from gpumemviz.live.sources.base import short_error
from gpumemviz.render.strips import STRIP_BINS, strip_set
from gpumemviz.widget.panel import MemoryPanel

__all__ = ["SNAPSHOT_TIMEOUT_S", "SUMMARY_NOTE", "JobPanel", "header_of"]

SUMMARY_NOTE = (
    f"the rank's published summary ({STRIP_BINS} bins), not the full segment map: "
    "ask for its snapshot to see every block"
)
SNAPSHOT_TIMEOUT_S = 30.0

# the header's figures (widget/panel.py's ``header`` keys) from a summary's keys
_HEADER_KEYS = {
    **{k: k for k in ("reserved", "allocated", "free", "free_releasable", "largest_free")},
    **{k: k for k in ("pending_free", "fragmentation", "segments", "blocks")},
    "num_ooms": "ooms",
    "num_alloc_retries": "alloc_retries",
}


def header_of(strip: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values
    """The header figures of one published strip (the keys it has).

    >>> header_of({"reserved": 8, "ooms": 1, "host": "a"})
    {'reserved': 8, 'num_ooms': 1}
    """
    return {k: strip[v] for k, v in _HEADER_KEYS.items() if isinstance(strip.get(v), int | float)}


class JobPanel(MemoryPanel):
    """Every rank of a job that runs `gpumemviz.distributed.publish`, live, in one panel.

    Parameters
    ----------
    view : JobView
        The job's store, read every `interval` seconds.
    interval : float
        Seconds between reads (default 1).
    subshell : bool
        Handle clicks on a kernel subshell (as `MemoryPanel`).

    Examples
    --------
    >>> import torch.distributed as dist
    >>> master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    >>> panel = JobPanel(JobView("127.0.0.1", master.port), interval=0.1)
    >>> _ = panel.feed.poll_once(); _ = panel.flush()
    >>> panel.status
    'no rank has published yet'
    >>> panel.close()
    """

    job = traitlets.Dict().tag(sync=True)
    """{address, interval, ranks, devices, stale, stopped, selected: {rank, device}, detail: the
    selected strip (figures, bins, rank fields), what: `SUMMARY_NOTE`, snapshot: {rank, state
    (asking, done, error), text, path, hint}}."""

    def __init__(self, view: JobView, *, interval: float = 1.0, subshell: bool = True) -> None:
        self.view = view
        self.feed = JobFeed(view, interval)
        self.address = f"{view.host}:{view.port}"
        super().__init__(title=f"job {self.address}", subshell=subshell)
        self.selected: tuple[int, int] | None = None  # (rank, device); the first strip till set
        self.asking: Future[Path] | None = None  # the snapshot request in flight (or the last)
        self._grid: list[dict[str, Any]] = []
        self._stopped: str | None = None
        self._snapshot: dict[str, Any] = {}
        self._pending: tuple[list[dict[str, Any]], str | None] | None = None
        self._lock = threading.Lock()
        self.status = "no rank has published yet"
        self.job = self._job_state(None)
        self.feed.add_listener(self._on_grid)
        self.feed.start()

    def __repr__(self) -> str:
        return f"JobPanel({self.address!r})"

    @property
    def grid(self) -> list[dict[str, Any]]:
        """The strips drawn last, in grid order (`grid_rows`)."""
        return list(self._grid)

    def select_rank(self, rank: int, device: int = 0) -> None:
        """Show this (rank, device)'s published map and figures (what a click on its strip does).

        Raises
        ------
        ValueError
            When no strip of that rank and device is shown.
        """
        shown = [(s.get("rank"), s.get("device")) for s in self._grid]
        if (rank, device) not in shown:
            raise ValueError(f"no strip of rank {rank} cuda:{device} here")
        self.selected = (rank, device)
        self._writer.submit(self._redraw)

    def ask_snapshot(self, rank: int) -> Future[Path]:
        """Ask `rank` for its full snapshot (the button); the future holds the path it wrote, or
        the one-line error, and the ``job`` trait shows it.

        Raises
        ------
        ValueError
            While an earlier request still waits.
        """
        with self._lock:
            if self.asking is not None and not self.asking.done():
                raise ValueError(f"still asking rank {self._snapshot.get('rank')}: wait for it")
            fut: Future[Path] = Future()
            self.asking = fut
        text = f"asking rank {rank} for its snapshot (up to {SNAPSHOT_TIMEOUT_S:g} s)"
        self._set_snapshot({"rank": rank, "state": "asking", "text": text})
        threading.Thread(
            target=self._ask, args=(rank, fut), name="gpumemviz-job-snapshot", daemon=True
        ).start()
        return fut

    def close(self) -> None:
        """Stop reading the job's store, then close the panel (as `MemoryPanel.close`)."""
        feed = getattr(self, "feed", None)
        if feed is not None:
            feed.remove_listener(self._on_grid)
            feed.stop()
        super().close()

    # -- the feed's thread and the request's thread only hand work to the writer thread

    def _on_grid(self, strips: list[dict[str, Any]], why: str | None) -> None:
        with self._lock:
            queued = self._pending is not None
            self._pending = (strips, why)
        if not queued:
            self._writer.submit(self._take_grid)

    def _ask(self, rank: int, fut: Future[Path]) -> None:
        try:
            # a connection of its own (closed after): the feed's thread keeps reading over the
            # panel's
            view = JobView(self.view.host, self.view.port)
            try:
                path = view.request_snapshot(rank, timeout=SNAPSHOT_TIMEOUT_S)
            finally:
                view.close()
        except Exception as exc:  # JobError, TimeoutError, a store gone: one line
            text = str(exc) if str(exc) and "\n" not in str(exc) else short_error(exc)
            self._set_snapshot({"rank": rank, "state": "error", "text": text})
            fut.set_exception(exc)
            return
        quoted = shlex.quote(str(path))  # a path from another process: quoted for a shell
        hint = f"gpumemviz inspect {quoted}  or  %gpumemviz --replay {quoted}"
        done = {"rank": rank, "state": "done", "text": f"rank {rank} wrote {path}"}
        self._set_snapshot({**done, "path": str(path), "hint": hint})
        fut.set_result(path)

    def _set_snapshot(self, state: dict[str, Any]) -> None:
        def apply() -> None:
            self._snapshot = state
            self.job = self._job_state(self._detail())

        self._writer.submit(apply)

    # -- the writer thread

    def _take_grid(self) -> None:
        with self._lock:
            item, self._pending = self._pending, None
        if item is None:
            return
        strips, why = item
        self._stopped = why
        if why is None:  # a stopped feed sends []: the last grid read stays shown
            self._grid = strips
        self._redraw()

    def _detail(self) -> dict[str, Any] | None:
        for s in self._grid:
            if (s.get("rank"), s.get("device")) == self.selected:
                return s
        return None

    def _redraw(self) -> None:
        grid = self._grid
        if self.selected is None and grid:
            self.selected = (grid[0].get("rank"), grid[0].get("device"))  # type: ignore[assignment]
        detail = self._detail()
        index = grid.index(detail) if detail is not None else None
        if grid:
            labels = [str(s.get("title", "")) for s in grid]
            self.strips = strip_set(grid, labels=labels, selected=index, note=self._note())
        else:
            self.strips = {}
        self.header = header_of(detail) if detail is not None else {}
        oom = detail.get("last_oom") if detail is not None else None
        if detail is not None and isinstance(oom, dict):
            self.oom = {**oom, "device": detail.get("device")}
        else:
            self.oom = {}
        self.demo = bool(detail.get("demo")) if detail is not None else False
        where = f" \u00b7 {detail.get('title')}" if detail is not None else ""
        self.title = f"job {self.address}{where}"
        if self._stopped:
            self.status = f"{self._stopped} (the strips show the last read)"
        elif not grid:
            self.status = "no rank has published yet"
        elif detail is None:
            self.status = "click a strip for its published map"
        else:
            stale = (
                f"; rank {detail.get('rank')} is {detail['note']}" if detail.get("stale") else ""
            )
            self.status = f"reading the job's store every {self.feed.interval:g} s{stale}"
        self.job = self._job_state(detail)

    def _note(self) -> str:
        grid = self._grid
        ranks = len({s.get("rank") for s in grid})
        stale = len({s.get("rank") for s in grid if s.get("stale")})
        return (
            f"{ranks} ranks \u00b7 {len(grid)} devices \u00b7 {stale} stale \u00b7 the rank "
            f"closest to OOM first \u00b7 read every {self.feed.interval:g} s"
        )

    def _job_state(self, detail: dict[str, Any] | None) -> dict[str, Any]:
        grid = self._grid
        sel = self.selected
        return {
            "address": self.address,
            "interval": self.feed.interval,
            "ranks": len({s.get("rank") for s in grid}),
            "devices": len(grid),
            "stale": sorted({s.get("rank") for s in grid if s.get("stale")}),
            "stopped": self._stopped,
            "selected": {"rank": sel[0], "device": sel[1]} if sel is not None else None,
            "detail": detail,
            "what": SUMMARY_NOTE,
            "snapshot": self._snapshot,
        }
