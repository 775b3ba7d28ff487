"""``%load_ext gpumemviz`` and the ``%gpumemviz`` line magic.

The magic is a thin shell over `gpumemviz.widget.monitor`'s parts: one sampler per device (the
shared one, or the extension's own for ``--demo`` and ``--replay``), one panel per device for the
magic (re-running the cell replaces the panel and reuses the sampler), and in a terminal IPython,
where no widget can show, a text summary of one read instead. ``--device all`` (and a replayed
file of several devices) shows every device in one panel of strips (`MemoryPanel.attach_devices`);
``--job HOST:PORT`` every rank of a torch.distributed job (`gpumemviz.widget.job.JobPanel`).
It stays whole (about 720 lines): the argument parsing, the feeds, the cell hooks and the
terminal summary all serve the one `%gpumemviz` command and share the extension's state of
which feeds and panels it opened.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from gpumemviz.snapshot.sample import check_interval
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from gpumemviz.analysis.findings import Findings
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.snapshot import Snapshot
    from gpumemviz.snapshot.sample import Sample
    from gpumemviz.widget import MemoryPanel

__all__ = [
    "GpumemvizMagics",
    "load_ipython_extension",
    "summary",
    "summary_all",
    "unload_ipython_extension",
]

USAGE = (
    "%gpumemviz [--device N|all] [--devices N] [--interval S] [--demo WORKLOAD] "
    "[--replay FILE|DIR] [--job HOST:PORT] [stop | status | export [--force] PATH]"
)
DEMO_DEVICES = 4  # --demo WORKLOAD --device all simulates this many devices unless --devices N


def _device_arg(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        from gpumemviz.snapshot.escaping import short_repr  # numpy: only when needed

        raise argparse.ArgumentTypeError(f"not a device index or all: {short_repr(text)}") from None


def _workload_names() -> list[str]:
    from gpumemviz.allocator.workloads import WORKLOADS  # the model: only when a magic runs

    return sorted(WORKLOADS)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit the kernel
        raise UsageError(f"%gpumemviz: {message}; usage: {USAGE}")


def _parser() -> _Parser:
    p = _Parser(
        prog="%gpumemviz",
        add_help=False,
        usage=USAGE.replace("%", "%%"),  # argparse %-formats the usage line
        description="Show the live memory panel of a CUDA device (a text summary in a terminal).",
    )
    p.add_argument("-h", "--help", action="store_true", help="show this help and do nothing else")
    p.add_argument(
        "--device",
        metavar="N|all",
        type=_device_arg,
        default=None,
        help="CUDA device index (default: 0), or all: every device as a strip (header figures, "
        "binned map, OOMs) above one device's full map (click a strip to choose it); a "
        "--replay file of several devices shows all of them",
    )
    p.add_argument(
        "--devices",
        metavar="N",
        type=int,
        default=None,
        help=f"with --demo and --device all: how many simulated devices (default {DEMO_DEVICES})",
    )
    p.add_argument(
        "--interval", metavar="S", type=float, default=None, help="seconds between reads"
    )
    p.add_argument(
        "--demo",
        metavar="WORKLOAD",
        default=None,
        help="show a simulated allocator running WORKLOAD (no GPU needed): one of "
        + ", ".join(_workload_names()),
    )
    p.add_argument(
        "--replay",
        metavar="FILE|DIR",
        default=None,
        help="play back a recorded snapshot file; a folder of per-rank files: a panel per rank, "
        "worst first (an OOM first), after the ranks' summary",
    )
    p.add_argument(
        "--job",
        metavar="HOST:PORT",
        default=None,
        help="every rank of a torch.distributed job whose ranks run gpumemviz.distributed."
        "publish (torchrun's MASTER_ADDR:MASTER_PORT): a strip per (rank, device), the rank "
        "closest to OOM first, stale ranks marked; click one for its published map, ask it "
        "for its snapshot (a terminal: the grid printed once)",
    )
    p.add_argument(
        "command",
        nargs="?",
        choices=("stop", "status", "export"),
        help="stop sampling, print the sampler's status, or export PATH (a torch pickle)",
    )
    p.add_argument("path", nargs="?", help="where export writes")
    p.add_argument(
        "--force", action="store_true", help="export: replace PATH even when it is read-only"
    )
    return p


@dataclass
class _Feed:
    """What the magic shows for one device: its sampler (made by the extension or not), panel."""

    sampler: Sampler
    owned: bool  # made by the extension (demo, replay): closed with it
    key: tuple[str | int, ...]
    panel: MemoryPanel | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class _AllFeed:
    """What ``--device all`` shows: a sampler per device and the panel of their strips."""

    samplers: dict[int, Sampler]
    owned: bool
    key: tuple[str | int, ...]
    panel: MemoryPanel | None = None


@magics_class
class GpumemvizMagics(Magics):
    """The ``%gpumemviz`` magic; `load_ipython_extension` registers one per shell."""

    def __init__(self, shell: InteractiveShell) -> None:
        super().__init__(shell)
        self.feeds: dict[int, _Feed] = {}
        self.multi: _AllFeed | None = None  # --device all
        self.job_panel: MemoryPanel | None = None  # --job HOST:PORT
        self.rank_panels: list[MemoryPanel] = []  # --replay DIR: a panel per rank, worst first
        self.started: set[int] = set()  # devices whose shared sampler this extension started
        self.last_device = 0
        # None: decide from the shell (a kernel has a widget front end, a terminal has not)
        self.widgets: bool | None = None

    # ------------------------------------------------------------------------------------------
    @line_magic
    def gpumemviz(self, line: str) -> MemoryPanel | None:
        """Show the live memory panel; ``stop``, ``status`` or ``export PATH`` act on it.

        ``%gpumemviz [--device N|all] [--devices N] [--interval S] [--demo WORKLOAD]``
        ``[--replay FILE|DIR] [--job HOST:PORT] [stop | status | export [--force] PATH]``
        (``%gpumemviz --help`` says what each does and lists the WORKLOAD names).
        ``--replay DIR`` (a folder of per-rank snapshot files, as ``gpumemviz inspect DIR``
        reads it) prints the ranks worst first and what differs, then shows a panel per rank in
        that order.

        One feed per device: the shared sampler, or the extension's own on
        ``SimulatedSource(WORKLOAD)`` or ``PlaybackSource(FILE)`` (opened paused on the last
        entry: the state the file records; a file without recorded history shows its one
        state, no sampler). Re-running reuses the feed and replaces the magic's panel. Without a
        widget front end (a terminal IPython) it prints `summary` of one read. ``export``
        writes the source's ``export()`` with `gpumemviz.io.save_snapshot` (pickle protocol
        4; ``--force`` replaces a read-only file). Bad arguments raise IPython's
        ``UsageError``, one line.
        """
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%gpumemviz: {exc}; usage: {USAGE}") from None
        args = _parser().parse_intermixed_args(words)  # export --force PATH, too
        if args.help:
            print(_parser().format_help(), end="")
            return None
        if args.devices is not None and not (args.demo and args.device == "all"):
            raise UsageError("%gpumemviz: --devices N is for --demo WORKLOAD --device all")
        if args.devices is not None and not 1 <= args.devices <= 64:
            raise UsageError(f"%gpumemviz: --devices must be in 1..64, got {args.devices}")
        if args.job is not None:
            return self._show_job(args)
        if args.device == "all":
            if args.command == "stop":
                self._stop_all()
                return None
            if args.command is not None:
                raise UsageError(f"%gpumemviz: {args.command} acts on one device: name it")
            return self._show_all(args)
        if args.device is not None and args.device < 0:
            raise UsageError(f"%gpumemviz: --device must be >= 0, got {args.device}")
        if args.interval is not None:
            try:
                check_interval(args.interval, "--interval")
            except ValueError as exc:  # inf and nan parse as floats: one line, no traceback
                raise UsageError(f"%gpumemviz: {exc}") from None
        if args.demo and args.replay:
            raise UsageError("%gpumemviz: --demo and --replay exclude each other")
        if args.path is not None and args.command != "export":
            from gpumemviz.snapshot.escaping import short_repr  # numpy: only when needed

            raise UsageError(f"%gpumemviz: unexpected {short_repr(args.path)}; usage: {USAGE}")
        if args.force and args.command != "export":
            raise UsageError(f"%gpumemviz: --force is for export; usage: {USAGE}")
        device = self.last_device if args.device is None else args.device
        if args.command == "stop":
            self._stop(device)
            return None
        if args.command == "status":
            self._status(device)
            return None
        if args.command == "export":
            if not args.path:
                raise UsageError("%gpumemviz: export needs a PATH (export run.pickle)")
            self._export(device, args.path, force=args.force)
            return None
        return self._show(device, args)

    # ------------------------------------------------------------------------------------------
    def _show_job(self, args: argparse.Namespace) -> MemoryPanel | None:
        """``--job HOST:PORT``: the job's panel (re-running replaces it; ``stop`` closes it),
        or in a terminal the grid printed once (`gpumemviz.distributed.terminal`)."""
        from gpumemviz.distributed import JobView
        from gpumemviz.distributed.jobview import parse_address

        others = (args.device, args.devices, args.demo, args.replay, args.path)
        if any(a is not None for a in others) or args.command not in (None, "stop") or args.force:
            raise UsageError("%gpumemviz: --job takes only --interval S (and stop)")
        if self.job_panel is not None:
            self.job_panel.close()
            self.job_panel = None
        if args.command == "stop":
            print(f"gpumemviz: stopped showing the job at {args.job}")
            return None
        interval = 1.0 if args.interval is None else args.interval
        try:
            check_interval(interval, "--interval")
            host, port = parse_address(args.job)
            view = JobView(host, port)
        except (ValueError, ConnectionError) as exc:  # StoreGone is a ConnectionError
            raise UsageError(f"%gpumemviz --job: {exc}") from None
        if not self._has_widgets():
            from gpumemviz.distributed.terminal import grid_text
            from gpumemviz.snapshot.escaping import one_line

            text = grid_text(view.ranks(), title=f"gpumemviz job {host}:{port}")
            print("\n".join(map(one_line, text.split("\n"))))  # other processes wrote it
            return None
        from gpumemviz.widget.job import JobPanel

        self.job_panel = JobPanel(view, interval=interval)
        return self.job_panel

    def _show(self, device: int, args: argparse.Namespace) -> MemoryPanel | None:
        from gpumemviz.widget import MemoryPanel

        raw = None
        if args.replay:
            path = Path(args.replay).expanduser().resolve()
            if path.is_dir():
                self._show_ranks(path, args)
                return None
            if self._by_key(("replay", str(path), str(args.device))) is None:
                raw = _load_file(path)  # read once: the replay sampler opens this same Snapshot
                if not _has_history(raw):  # nothing to play: show the state the file holds
                    return self._show_file(raw, path)
                if args.device is None and len(_traced(raw)) > 1:
                    return self._show_all(args, raw)
        feed = self._feed(device, args, raw)
        device = feed.sampler.source.device if feed.owned else device
        self.last_device = device
        if args.interval is not None:
            feed.sampler.set_interval(args.interval)
        if not self._has_widgets():
            sample = feed.sampler.sample_once(segments=True)
            print(summary(sample, _file_findings(feed.sampler, device)))
            return None
        if feed.panel is not None:  # re-run: the old cell output is gone; its panel goes too
            feed.panel.close()
        panel = MemoryPanel(device=device)
        panel.attach(feed.sampler)
        feed.panel = panel
        was_running = feed.sampler.running
        if feed.sampler.start() and not was_running and not feed.owned:
            self.started.add(device)
        return panel

    def _show_all(
        self, args: argparse.Namespace, raw: Snapshot | None = None
    ) -> MemoryPanel | None:
        """Every device: each replayed device, ``--devices`` simulated ones, or every CUDA
        device torch sees; a strip each above one device's full map (a terminal: every
        device's summary)."""
        from gpumemviz.widget import MemoryPanel

        samplers, owned = self._all_samplers(args, raw)
        if args.interval is not None:
            for s in samplers.values():
                s.set_interval(args.interval)
        if not self._has_widgets():
            samples = {d: s.sample_once(segments=True) for d, s in samplers.items()}
            found = {d: _file_findings(s, d) for d, s in samplers.items()}
            print(summary_all(samples, {d: f for d, f in found.items() if f is not None}))
            return None
        if self.multi is not None and self.multi.panel is not None:
            self.multi.panel.close()
        panel = MemoryPanel()
        panel.attach_devices(samplers)
        if self.multi is not None:
            self.multi.panel = panel
        for d, s in samplers.items():
            was = s.running
            if s.start() and not was and not owned:
                self.started.add(d)
        return panel

    def _all_samplers(
        self, args: argparse.Namespace, raw: Snapshot | None
    ) -> tuple[dict[int, Sampler], bool]:
        """The samplers of ``--device all`` (the ones running when the arguments match)."""
        if args.replay:
            path = Path(args.replay).expanduser().resolve()
            key: tuple[str | int, ...] = ("replay-all", str(path))
        elif args.demo:
            key = ("demo-all", args.demo, args.devices or DEMO_DEVICES)
        else:
            key = ("live-all",)
        multi = self.multi
        if multi is not None and multi.key == key:
            return multi.samplers, multi.owned
        if multi is not None:
            self._drop_all()
        if args.replay:
            raw = _load_file(path) if raw is None else raw
            if not _has_history(raw):
                raise UsageError(f"%gpumemviz: --replay {path.name}: no recorded history")
            samplers = {d: _replay_sampler(raw, path, args.interval, d) for d in _traced(raw)}
        elif args.demo:
            n = args.devices or DEMO_DEVICES
            samplers = {d: _demo_sampler(args.demo, d, args.interval) for d in range(n)}
        else:
            from gpumemviz.live.shared import local_devices, shared

            samplers = {d: shared(d) for d in local_devices()}
        owned = bool(args.replay or args.demo)
        self.multi = _AllFeed(samplers=samplers, owned=owned, key=key)
        return samplers, owned

    def _stop_all(self) -> None:
        multi = self.multi
        if multi is None:
            print("gpumemviz: nothing shown for --device all yet")
            return
        for d, sampler in multi.samplers.items():
            sampler.stop()
            self.started.discard(d)
        print(f"gpumemviz: stopped sampling devices {', '.join(map(str, multi.samplers))}")

    def _drop_all(self) -> None:
        multi, self.multi = self.multi, None
        if multi is not None:
            if multi.panel is not None:
                multi.panel.close()
            if multi.owned:
                for s in multi.samplers.values():
                    s.close()

    def _show_ranks(self, folder: Path, args: argparse.Namespace) -> None:
        """``--replay DIR``: every rank's file analysed (`analyze_ranks`), the summary printed
        worst first, then (with widgets) a panel per rank's file in that order, each its
        file's final state. Re-running replaces the panels."""
        from IPython.display import display

        from gpumemviz.analysis.ranks import analyze_ranks
        from gpumemviz.io import load_snapshot
        from gpumemviz.snapshot.schema import SnapshotError
        from gpumemviz.widget import MemoryPanel

        if args.device is not None or args.command is not None or args.interval is not None:
            raise UsageError("%gpumemviz --replay DIR takes no other option (a panel per rank)")
        try:
            ranks = analyze_ranks(folder, check=False)
        except (OSError, SnapshotError) as exc:  # no snapshot file; a file that cannot be read
            raise UsageError(f"%gpumemviz --replay: {exc}") from None
        for panel in self.rank_panels:
            panel.close()
        self.rank_panels = []
        print("\n".join(ranks.lines(folder.name)))
        if not self._has_widgets():
            return
        for r in ranks.ranks:
            title = f"rank {r.rank} · {r.file}" + (" · ran out of memory" if r.findings.oom else "")
            panel = MemoryPanel(title=title)
            panel.show_snapshot(load_snapshot(folder / r.file))
            self.rank_panels.append(panel)
            display(panel)  # type: ignore[no-untyped-call]  # IPython's display is untyped

    def _show_file(self, snap: Snapshot, path: Path) -> MemoryPanel | None:
        """A snapshot without recorded history: its one state, no sampler."""
        from gpumemviz.analysis.findings import analyze
        from gpumemviz.snapshot.sample import Sample
        from gpumemviz.widget import MemoryPanel

        if not self._has_widgets():
            devices = sorted({int(d) for d in snap.segments.device}) or [0]
            for d in devices:
                shown = Sample(
                    time=0.0,
                    device=d,
                    stats=None,
                    segments=snap,
                    source_label=f"{path.name} (no recorded history)",
                )
                # the file's findings (a full final state reads as an OOM), as inspect's
                print(summary(shown, analyze(snap, device=d) if d in snap.devices else None))
            return None
        panel = MemoryPanel(title=path.name)
        panel.show_snapshot(snap)
        return panel

    def _feed(self, device: int, args: argparse.Namespace, raw: Snapshot | None = None) -> _Feed:
        """The device's feed for these arguments: the one already running when they match.
        ``raw``: the ``--replay`` file's contents when the caller read them already."""
        if args.replay:
            path = Path(args.replay).expanduser().resolve()
            key: tuple[str | int, ...] = ("replay", str(path), str(args.device))
        elif args.demo:
            key = ("demo", args.demo, device)
        else:
            key = ("live", device)
        old = self._by_key(key)
        if old is not None:
            return old
        if args.replay:
            raw = _load_file(path) if raw is None else raw
            sampler = _replay_sampler(raw, path, args.interval, args.device)
        elif args.demo:
            sampler = _demo_sampler(args.demo, device, args.interval)
        else:
            from gpumemviz.live.shared import shared

            sampler = shared(device)
        feed = _Feed(sampler=sampler, owned=bool(args.replay or args.demo), key=key)
        dev = sampler.source.device if feed.owned else device
        replaced = self.feeds.get(dev)
        if replaced is not None:
            self._drop(replaced)
        self.feeds[dev] = feed
        return feed

    def _by_key(self, key: tuple[str | int, ...]) -> _Feed | None:
        return next((f for f in self.feeds.values() if f.key == key), None)

    def _drop(self, feed: _Feed) -> None:
        if feed.panel is not None:
            feed.panel.close()
            feed.panel = None
        if feed.owned:
            feed.sampler.close()

    def _has_widgets(self) -> bool:
        if self.widgets is not None:
            return self.widgets
        return getattr(self.shell, "kernel", None) is not None

    def _sampler(self, device: int) -> Sampler:
        """The sampler the magic shows for the device: its feed's, else the shared one."""
        feed = self.feeds.get(device)
        if feed is not None:
            return feed.sampler
        from gpumemviz.live.shared import shared

        return shared(device)

    def _stop(self, device: int) -> None:
        sampler = self._sampler(device)
        sampler.stop()
        self.started.discard(device)
        print(f"gpumemviz: stopped sampling device {device} ({_label(sampler)})")

    def _status(self, device: int) -> None:
        feed = self.feeds.get(device)
        if feed is None:
            print(f"gpumemviz: nothing shown for device {device} yet; run %gpumemviz")
            return
        st = feed.sampler.status()
        state = "paused" if st["paused"] else "running" if st["running"] else "stopped"
        lines = [
            f"gpumemviz: device {device}: {_label(feed.sampler)}, {state}",
            f"  every {feed.sampler.interval:g} s; segment map every {st['segment_gap']:.1f} s"
            f" ({st['cpu_share']:.1%} of a core)",
            f"  {st['ticks']} reads, {st['segment_reads']} segment reads, {st['errors']} errors;"
            f" history {st['history_len']} samples, {format_size(st['history_bytes'])}",
        ]
        if st["last_error"]:
            lines.append(f"  last error: {st['last_error']}")
        latest = feed.sampler.history.latest()
        if latest is not None:
            lines.append(summary(latest))
        print("\n".join(lines))

    def _export(self, device: int, path: str, *, force: bool = False) -> None:
        from gpumemviz.io import save_snapshot

        source = self._sampler(device).source
        try:
            raw = source.export()
        except Exception as exc:
            raise UsageError(f"%gpumemviz export: {exc}") from None
        n = len(raw.get("segments") or ()) if isinstance(raw, dict) else len(raw)
        traced = isinstance(raw, dict) and any(raw.get("device_traces") or ())
        if not n and not traced:
            raise UsageError(
                f"%gpumemviz export: nothing to export on device {device}: no segments and no "
                "recorded history (no CUDA memory in use here, and no %gpumemviz --demo or "
                "--replay shown); nothing written"
            )
        try:
            written = save_snapshot(raw, Path(path).expanduser(), force=force)
        except OSError as exc:  # read-only, a device, a missing folder: one line
            raise UsageError(f"%gpumemviz export: {exc}") from None
        print(f"gpumemviz: wrote {written} ({n} segments, {format_size(written.stat().st_size)})")

    # per-cell markers ---------------------------------------------------------------------------
    def pre_run_cell(self, info: object = None) -> None:
        """IPython hook: note each shown feed's allocated, reserved and peak as the cell starts."""
        self._cell_start = {
            d: (time.time(), _newest_stats(f.sampler, f.sampler.sample_once(segments=False)))
            for d, f in self.feeds.items()
            if f.panel is not None
        }

    def post_run_cell(self, result: object = None) -> None:
        """IPython hook: a marker per shown panel with the cell's deltas and its peak.

        The peak is the most allocated seen during the cell: the sampled maximum, or torch's own
        peak counter when the cell raised it past its earlier peak and above that maximum (a
        value torch saw during the cell, even when someone reset the counter meanwhile).
        Nothing is reset, so the user's ``max_memory_allocated()`` stays theirs.
        """
        start = getattr(self, "_cell_start", {})
        self._cell_start = {}
        n = getattr(result, "execution_count", None)
        for d, (t0, before) in start.items():
            feed = self.feeds.get(d)
            if feed is None or feed.panel is None or before is None:
                continue
            sample = feed.sampler.sample_once(segments=False)
            after = _newest_stats(feed.sampler, sample)
            if after is None:
                continue
            t1 = time.time()
            seen = [p[1] for p in feed.panel.timeline.points_between(t0, t1)]
            peak = max([after[0], before[0], *seen])
            if after[2] > before[2]:  # torch's peak rose during the cell: reached in it
                peak = max(peak, after[2])
            label = (
                f"cell [{n if n is not None else '?'}]: allocated {_signed(after[0] - before[0])}"
                f", reserved {_signed(after[1] - before[1])}, peak {format_size(peak)}"
            )
            feed.panel.add_marker(label, "cell", t1)

    def close(self) -> None:
        """Close every panel and feed of this extension; stop the shared samplers it started."""
        from gpumemviz.live.shared import shared

        for feed in list(self.feeds.values()):
            self._drop(feed)
        self.feeds.clear()
        self._drop_all()
        if self.job_panel is not None:
            self.job_panel.close()
            self.job_panel = None
        for panel in self.rank_panels:
            panel.close()
        self.rank_panels = []
        for device in sorted(self.started):
            shared(device).stop()
        self.started.clear()


def _newest_stats(sampler: Sampler, sample: Sample | None = None) -> tuple[int, int, int] | None:
    """(allocated, reserved, peak allocated) of the sampler's newest stats, or None."""
    if sample is None or sample.stats is None:
        sample = next((s for s in reversed(sampler.history.samples()) if s.stats), None)
    if sample is None or sample.stats is None:
        return None
    st = sample.stats
    return st.allocated, st.reserved, st.peak_allocated


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_size(abs(n))


def _label(sampler: Sampler) -> str:
    return str(getattr(sampler.source, "label", type(sampler.source).__name__))


def _demo_sampler(workload: str, device: int, interval: float | None) -> Sampler:
    """A simulated device; with several, each runs a little faster than the one before, so
    their states differ (the same workload in lockstep would draw one strip N times)."""
    from gpumemviz.allocator.workloads import WORKLOADS
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.simulated import SimulatedSource
    from gpumemviz.snapshot.escaping import short_repr

    if workload not in WORKLOADS:
        raise UsageError(
            f"%gpumemviz: unknown workload {short_repr(workload)}; known: {sorted(WORKLOADS)}"
        )
    speed = 400.0 * (1 + 0.25 * device)  # SimulatedSource's default rate on device 0
    source = SimulatedSource(workload, device=device, steps_per_second=speed)
    return Sampler(source, interval=interval or 0.5)


def _load_file(path: Path) -> Snapshot:
    """The file as a `Snapshot`: its traces stay columns (the replay reads them as such)."""
    from gpumemviz.io import load_snapshot

    if not path.is_file():
        raise UsageError(f"%gpumemviz: --replay {path}: no such file")
    try:
        return load_snapshot(path)
    except (ValueError, OSError) as exc:
        raise UsageError(f"%gpumemviz: --replay {path.name}: {exc}") from None


def _has_history(snap: Snapshot) -> bool:
    return any(len(t) for t in snap.traces.values())


def _traced(snap: Snapshot) -> list[int]:
    """The devices whose recorded trace has entries."""
    return sorted(d for d, t in snap.traces.items() if len(t))


def _replay_sampler(
    raw: Snapshot, path: Path, interval: float | None, device: int | None = None
) -> Sampler:
    """A sampler over a recorded trace, opened on its last entry (the state the file records);
    ``device``: that device's trace (default: the longest)."""
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.playback import PlaybackSource

    try:
        source = PlaybackSource(raw, device=device, loop=False)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"%gpumemviz: --replay {path.name}: {exc}") from None
    where = f"cuda:{device}, " if device is not None else ""
    source.label = f"replay of {path.name} ({where}{source.n} trace entries)"
    source.seek(source.n - 1)
    return Sampler(source, interval=interval or 0.5)


def _file_findings(sampler: Sampler, device: int) -> Findings | None:
    """A replayed file's findings for the device (advice checked on its trace), None live."""
    snap = getattr(sampler.source, "snapshot", None)
    if "time_travel" not in getattr(sampler.source, "capabilities", ()) or snap is None:
        return None
    from gpumemviz.analysis.findings import analyze

    return analyze(snap, device=device) if device in snap.devices else None


def summary(sample: Sample, findings: Findings | None = None) -> str:
    """A few lines of text for one `Sample`: what the panel's header shows.

    Parameters
    ----------
    sample : Sample
    findings : Findings, optional
        What to say of it (a replayed file's, checked on its trace); default:
        `gpumemviz.analyze` of the sample.

    Returns
    -------
    str
    """
    info = sample.device_info
    name = info.name if info is not None and info.name else sample.source_label or "GPU"
    head = f"gpumemviz · cuda:{sample.device} · {name}" + (" · demo data" if sample.demo else "")
    if sample.state == "waiting":
        return f"{head}\nwaiting for CUDA: nothing has initialised it on this device yet"
    if sample.state != "ok":
        return f"{head}\n{sample.state}: {'; '.join(sample.errors) or 'no data'}"
    lines = [head]
    stats = sample.stats
    if sample.segments is not None and findings is None:
        from gpumemviz.analysis.findings import analyze

        findings = analyze(sample, check=False)
    if sample.segments is not None and findings is not None:
        f = findings.figures
        lines.append(
            f"reserved {format_size(f.reserved)} · allocated {format_size(f.allocated)}"
            f" · free in reserved {format_size(f.free_in_reserved)} · largest free block "
            f"{format_size(f.largest_free)} · fragmentation {f.fragmentation:.3f}"
            f" · {findings.memory.segments} segments"
        )
    elif stats is not None:
        lines.append(
            f"reserved {format_size(stats.reserved)} · allocated {format_size(stats.allocated)}"
        )
    extra = []
    nvml = sample.nvml
    if nvml is not None and nvml.available and nvml.total:
        extra.append(f"NVML used {format_size(nvml.used or 0)} of {format_size(nvml.total)}")
    if stats is not None:
        extra.append(f"alloc retries {stats.num_alloc_retries} · OOMs {stats.num_ooms}")
    if extra:
        lines.append(" · ".join(extra))
    if findings is None:
        if sample.oom is not None:  # no segment state to judge it on: the source's verdict
            lines.append(f"OOM ({sample.oom.cause}): {sample.oom.explanation}")
        return "\n".join(lines)
    from gpumemviz.snapshot.escaping import one_line

    if findings.oom is not None:
        lines.append(one_line(findings.oom.sentence))
        lines += [
            f"  {i}. {one_line(a.sentence)} ({format_size(a.effect)})"
            for i, a in enumerate(findings.oom.actions, 1)
        ]
    lines += [f"advice: {a.message}" for a in findings.advice]
    lines += [f"rejected: {a.message}" for a in findings.rejected]
    lines += [f"note: {one_line(n)}" for n in findings.notes]
    return "\n".join(lines)


def summary_all(samples: dict[int, Sample], findings: dict[int, Findings] | None = None) -> str:
    """`summary` of every device, after one line naming the devices and where the OOMs are.

    Parameters
    ----------
    samples : dict of int to Sample
        One per device.
    findings : dict of int to Findings, optional
        Each device's findings where known (a replayed file's); the others are analysed.

    Returns
    -------
    str
    """
    ooms = {
        d: s.stats.num_ooms for d, s in samples.items() if s.stats is not None and s.stats.num_ooms
    }
    where = ", ".join(f"cuda:{d} ({n})" for d, n in ooms.items()) or "none"
    head = f"gpumemviz: {len(samples)} devices ({', '.join(map(str, samples))}) · OOMs: {where}"
    known = findings or {}
    return "\n\n".join([head, *(summary(s, known.get(d)) for d, s in samples.items())])


_MAGICS: dict[int, GpumemvizMagics] = {}


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext gpumemviz``: register ``%gpumemviz`` (loading twice keeps one instance)."""
    if id(ipython) in _MAGICS:
        return
    magics = GpumemvizMagics(ipython)
    _MAGICS[id(ipython)] = magics
    ipython.register_magics(magics)
    ipython.events.register("pre_run_cell", magics.pre_run_cell)
    ipython.events.register("post_run_cell", magics.post_run_cell)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """``%unload_ext gpumemviz``: close the panels and stop the samplers the magic started."""
    magics = _MAGICS.pop(id(ipython), None)
    if magics is not None:
        for name in ("pre_run_cell", "post_run_cell"):
            with contextlib.suppress(ValueError):
                ipython.events.unregister(name, getattr(magics, name))
        magics.close()
        ipython.magics_manager.registry.pop(type(magics).__name__, None)
        ipython.magics_manager.magics["line"].pop("gpumemviz", None)
