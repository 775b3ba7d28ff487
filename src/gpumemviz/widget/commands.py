"""What the panel's buttons do: each command acts on the panel's sampler and source, or on the
snapshot it shows, and answers with one line of text (and figures for tests).

Commands run on whichever thread the kernel hands the browser's message to: a subshell thread
while a cell runs (see gpumemviz.widget.subshell) or the main shell when the cell has finished.
They touch no traits; the panel's writer thread sends their replies.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from gpumemviz.io import claim_new_file
from gpumemviz.render.timeline import entry_at_time
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.units import echo_size, format_size, parse_size

if TYPE_CHECKING:
    from concurrent.futures import Future

    import numpy as np

    from gpumemviz.analysis.fragmentation import FragmentationReport
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.base import HistorySource, Source, TimeTravelSource
    from gpumemviz.snapshot import Snapshot
    from gpumemviz.snapshot.schema import JsonDict

__all__ = [
    "RESET_PEAKS_TEXT",
    "CommandError",
    "JobPanelLike",
    "Panel",
    "file_url",
    "run_command",
]

RESET_PEAKS_TEXT = (
    "torch's peak counters reset for everyone in this process "
    "(torch.cuda.reset_peak_memory_stats); gpumemviz's own peaks start again"
)
"""The reply of the "reset peaks" button: what it did, and to whom."""


class CommandError(RuntimeError):
    """A command that cannot be done now; the message says why (shown in the panel)."""


class Panel(Protocol):
    """What the commands use of the panel (`gpumemviz.widget.MemoryPanel`, a layer above)."""

    @property
    def sampler(self) -> Sampler | None: ...
    @property
    def shown(self) -> Snapshot | None: ...
    @property
    def owns_sampler(self) -> bool: ...
    def export(
        self, path: str | os.PathLike[str], *, redact_paths: bool = False, force: bool = False
    ) -> Path: ...
    def fit_inputs(self) -> tuple[FragmentationReport | None, int | None, int]: ...
    def replay_times(self) -> np.ndarray | None: ...
    def devices(self) -> list[int]: ...
    def follow_device(self, device: int, sampler: Sampler) -> None: ...
    def select_device(self, device: int) -> None: ...
    def follow_devices(self) -> None: ...


class JobPanelLike(Protocol):
    """What the job commands use of a job's panel (`gpumemviz.widget.job.JobPanel`)."""

    def select_rank(self, rank: int, device: int = 0) -> None: ...
    def ask_snapshot(self, rank: int) -> Future[Path]: ...


def run_command(panel: Panel, name: str, args: JsonDict) -> JsonDict:
    """Carry out one command for ``panel``; returns ``{"text": ..., **figures}``.

    Raises
    ------
    CommandError
        With a one-line reason when the command does not apply (no sampler, a source that
        cannot do it, bad input).
    """
    handler = _COMMANDS.get(name)
    if handler is None:
        raise CommandError(f"unknown command {short_repr(name)}")
    return handler(panel, args)


def _sampler(panel: Panel) -> Sampler:
    if panel.sampler is None:
        raise CommandError("this panel shows a fixed snapshot: there is no live source")
    return panel.sampler


def _needs(source: Source, capability: str, what: str) -> None:
    if capability not in getattr(source, "capabilities", frozenset()):
        label = getattr(source, "label", type(source).__name__)
        raise CommandError(f"{label} cannot {what}")


def _empty_cache(panel: Panel, args: JsonDict) -> JsonDict:
    sampler = _sampler(panel)
    _needs(sampler.source, "empty_cache", "empty the cache")
    released = {int(d): int(n) for d, n in sampler.source.empty_cache().items()}
    sampler.sample_once(segments=True)  # the map and header show the result at once
    parts = [f"cuda:{d} {format_size(n)}" for d, n in sorted(released.items())]
    return {"text": "empty_cache released " + ", ".join(parts), "released": released}


def _export(panel: Panel, args: JsonDict) -> JsonDict:
    if panel.sampler is not None:
        _needs(panel.sampler.source, "export", "export a snapshot")
    elif panel.shown is None:
        raise CommandError("nothing shown yet: nothing to export")
    # a name nobody has (to the millisecond, then a counter; created exclusively), so two
    # panels exporting at once never write one file, nor over a file already there
    path = claim_new_file(Path.cwd(), "gpumemviz-snapshot", ".pickle", when=time.time())
    try:
        path = panel.export(path, force=True)  # the same file as MemoryPanel.export; ours
    except BaseException:
        path.unlink(missing_ok=True)  # the empty file claimed for it
        raise
    url = file_url(path)
    size = format_size(path.stat().st_size)
    return {"text": f"wrote {path.name} ({size})", "path": str(path), "url": url}


def _pause(panel: Panel, args: JsonDict) -> JsonDict:
    _sampler(panel).pause()
    return {"text": "paused"}


def _resume(panel: Panel, args: JsonDict) -> JsonDict:
    _sampler(panel).resume()
    return {"text": "sampling again"}


def _interval(panel: Panel, args: JsonDict) -> JsonDict:
    try:
        value = float(args.get("value"))  # type: ignore[arg-type]  # None: TypeError, caught
    except (TypeError, ValueError):
        raise CommandError(
            f"interval must be seconds, got {short_repr(args.get('value'))}"
        ) from None
    try:
        _sampler(panel).set_interval(value)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    return {"text": f"reading every {value:g} s"}


def _fit(panel: Panel, args: JsonDict) -> JsonDict:
    text = str(args.get("value", "")).strip()
    try:
        nbytes = parse_size(text)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    report, free, device = panel.fit_inputs()
    if report is None:
        raise CommandError("no segment state yet: wait for the map")
    answer = report.can_fit(nbytes, device=device, device_free=free)
    return {"text": f"{echo_size(text)}: {answer}", "verdict": answer.verdict, "bytes": nbytes}


def _seek(panel: Panel, args: JsonDict) -> JsonDict:
    sampler = _sampler(panel)
    source = cast("TimeTravelSource", sampler.source)
    _needs(source, "time_travel", "travel in time")
    try:
        if "time_us" in args:  # the time scale: the entry at or before that recorded time
            times = panel.replay_times()
            if times is None:
                raise CommandError("this trace has no recorded times (torch < 2.2): events only")
            index = entry_at_time(times, float(args["time_us"]))
        else:
            index = int(args.get("index"))  # type: ignore[arg-type]  # None: TypeError, caught
        source.seek(index)
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    sampler.sample_once(segments=True)
    panel.follow_devices()  # a panel of several replayed devices moves them all
    return {"text": f"entry {index + 1} of {source.n}", "index": index}


def _play(panel: Panel, args: JsonDict) -> JsonDict:
    source = cast("TimeTravelSource", _sampler(panel).source)
    _needs(source, "time_travel", "play a recording")
    source.play()
    panel.follow_devices()
    return {"text": "playing"}


def _record_history(panel: Panel, args: JsonDict) -> JsonDict:
    source = cast("HistorySource", _sampler(panel).source)
    _needs(source, "record_history", "record allocation history")
    on = bool(args.get("on"))
    source.record_history(on, stacks="python")
    return {"text": "recording history (python stacks)" if on else "history recording off"}


def _reset_peaks(panel: Panel, args: JsonDict) -> JsonDict:
    """The one place gpumemviz resets torch's peak counters: the button, when clicked."""
    sampler = _sampler(panel)
    source = sampler.source
    if not callable(getattr(source, "reset_peaks", None)):
        raise CommandError(f"{getattr(source, 'label', 'this source')} cannot reset peaks")
    sampler.reset_peaks()
    sampler.sample_once(segments=False)  # the header shows the new peaks at once
    return {"text": RESET_PEAKS_TEXT}


def _device(panel: Panel, args: JsonDict) -> JsonDict:
    from gpumemviz.live.shared import shared

    try:
        device = int(args.get("value"))  # type: ignore[arg-type]  # None: TypeError, caught
    except (TypeError, ValueError):
        raise CommandError(
            f"device must be an index, got {short_repr(args.get('value'))}"
        ) from None
    if device not in panel.devices():
        raise CommandError(f"no device {device} here (devices: {panel.devices()})")
    if panel.sampler is None or panel.owns_sampler:
        raise CommandError("this panel follows its own source: it cannot switch devices")
    interval = panel.sampler.interval
    sampler = shared(device)
    panel.follow_device(device, sampler)
    sampler.set_interval(interval)
    sampler.start()
    return {"text": f"showing cuda:{device}", "device": device}


def _select(panel: Panel, args: JsonDict) -> JsonDict:
    """A click on a device's strip: draw that device in full below the strips."""
    try:
        device = int(args.get("value"))  # type: ignore[arg-type]  # None: TypeError, caught
        panel.select_device(device)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"select: {exc}") from None
    return {"text": f"showing cuda:{device} in full", "device": device}


def _job(panel: Panel) -> JobPanelLike:
    if not callable(getattr(panel, "ask_snapshot", None)):
        raise CommandError("this panel shows no job: it has no ranks")
    return cast("JobPanelLike", panel)


def _rank(panel: Panel, args: JsonDict) -> JsonDict:
    """A click on a rank's strip: show that (rank, device)'s published map and figures."""
    job = _job(panel)
    try:
        rank = int(args.get("rank"))  # type: ignore[arg-type]  # None: TypeError, caught
        device = int(args.get("device", 0))
        job.select_rank(rank, device)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"rank: {exc}") from None
    return {"text": f"showing rank {rank} cuda:{device}", "rank": rank, "device": device}


def _rank_snapshot(panel: Panel, args: JsonDict) -> JsonDict:
    """The snapshot button: ask the rank on a thread of the panel's; the outcome (the path it
    wrote, or why not) arrives in the panel's ``job`` trait."""
    job = _job(panel)
    try:
        rank = int(args.get("rank"))  # type: ignore[arg-type]  # None: TypeError, caught
        job.ask_snapshot(rank)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"snapshot: {exc}") from None
    return {"text": f"asking rank {rank} for its snapshot", "rank": rank}


_COMMANDS: dict[str, Callable[[Panel, JsonDict], JsonDict]] = {
    "device": _device,
    "empty_cache": _empty_cache,
    "export": _export,
    "pause": _pause,
    "resume": _resume,
    "interval": _interval,
    "fit": _fit,
    "seek": _seek,
    "select": _select,
    "play": _play,
    "rank": _rank,
    "rank_snapshot": _rank_snapshot,
    "record_history": _record_history,
    "reset_peaks": _reset_peaks,
}


def file_url(path: Path) -> str | None:
    """The Jupyter server's ``files/`` URL of ``path`` (relative to the page's origin), found
    through the running servers' info files; None outside a Jupyter server or its root."""
    try:
        from jupyter_server.serverapp import list_running_servers
    except ImportError:
        return None
    target = Path(path).resolve()
    try:
        servers = list(list_running_servers())
    except OSError:
        return None
    # the server that started this kernel first (same runtime dir, its root above our cwd)
    servers.sort(key=lambda s: s.get("pid") != os.getppid())
    for info in servers:
        root = info.get("root_dir") or info.get("notebook_dir")
        if not root:
            continue
        try:
            rel = target.relative_to(Path(root).resolve())
        except ValueError:
            continue
        base = str(info.get("base_url") or "/").rstrip("/")
        return f"{base}/files/{urllib.parse.quote(rel.as_posix())}"
    return None
