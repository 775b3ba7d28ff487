"""The `gpumemviz` command: one argparse subcommand per job.

Adding a subcommand is one function that registers its parser and sets `run`, plus one line in
`SUBCOMMANDS`: `run(args)` returns the exit status and raises `UsageError` (or any ValueError,
`SnapshotError` included) for bad input, which `main` turns into exit status 2 and one line on
stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .advice import advise_each_device, oom_device_free
from .fragmentation import FragmentationReport, MemoryFigures, SegmentSummary, fragmentation
from .units import format_size, parse_size

if TYPE_CHECKING:
    from .advice_check import CheckedAdvice

__all__ = ["DEMO_NOTEBOOK", "NOT_RECORDED", "SUBCOMMANDS", "UsageError", "demo_command", "main"]


#: What `inspect` and `whatif` say of a file that does not record its allocator settings.
NOT_RECORDED = "not recorded (assumed PyTorch's defaults)"

#: Why `inspect --no-replay` advice carries no replay (its `replay_skipped` in --json).
NO_REPLAY = "--no-replay"

#: Options taking a size, whose value may start with "-" (to be refused as not positive).
_SIZE_OPTIONS = ("--capacity",)


class UsageError(ValueError):
    """Bad input from the command line: printed as one line, exit status 2."""


# --------------------------------------------------------------------------------------------
# inspect


def add_inspect(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a snapshot: memory, fragmentation, worst segments, advice",
        description="Summarise a memory snapshot (torch.cuda.memory._dump_snapshot output, "
        "pickle or JSON): reserved/allocated/free per device, fragmentation, the worst "
        "segments and advice.",
    )
    p.add_argument("file", type=Path, help="snapshot file (.pickle, .pkl, .json or any name)")
    p.add_argument("--device", type=int, default=None, help="only this device index")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument(
        "--no-replay",
        action="store_true",
        help="do not check setting advice by replaying the recorded trace (faster; the "
        "advice is then only what the snapshot's fragmentation suggests)",
    )
    p.set_defaults(run=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    from .advice_check import Checked, CheckedAdvice, check_advice  # loads the replay
    from .io import load_snapshot  # the loader is only needed once a file is named

    snap = load_snapshot(args.file)
    report = fragmentation(snap)
    devices = list(report.devices)
    if args.device is not None:
        if args.device not in report.devices:
            have = ", ".join(map(str, devices)) or "none"
            raise UsageError(f"no device {args.device} in {args.file} (devices: {have})")
        devices = [args.device]
    oom_free = oom_device_free(snap)
    advice = advise_each_device(report, oom_free, devices)
    if args.no_replay:
        checked = CheckedAdvice([Checked(a, unchecked=NO_REPLAY) for a in advice], [])
    else:
        checked = check_advice(snap, advice)
    if args.json:
        print(json.dumps(_json(report, devices, checked, oom_free, args.device), indent=2))
    else:
        print("\n".join(_text(report, devices, checked, oom_free, str(args.file))))
    return 0


def _json(
    report: FragmentationReport,
    devices: list[int],
    checked: CheckedAdvice,
    oom_free: dict[int, int],
    only: int | None,
) -> dict[str, Any]:
    """`{"total": {...}, "devices": {"0": {...}}}` (with --device: total = that device).

    Each advice is `{kind, message, evidence, replay, replay_skipped}`; `rejected_advice` holds
    the setting advice the replay refuted, in the same shape."""
    full = report.to_dict()
    out: dict[str, Any] = {
        "total": full["devices"][str(only)] if only is not None else full["total"],
        "devices": {str(d): full["devices"][str(d)] for d in devices},
        "settings": full["settings"],
        "advice": [c.to_dict() for c in checked.shown],
        "rejected_advice": [c.to_dict() for c in checked.rejected],
    }
    out["oom_device_free"] = {str(d): v for d, v in oom_free.items() if d in devices}
    return out


def _text(
    report: FragmentationReport,
    devices: list[int],
    checked: CheckedAdvice,
    oom_free: dict[int, int],
    name: str,
) -> list[str]:
    t = report.total
    conf = (report.allocator_settings or {}).get("PYTORCH_CUDA_ALLOC_CONF")
    settings = (
        NOT_RECORDED if report.allocator_settings is None else (repr(conf) if conf else "defaults")
    )
    lines = [
        f"{name}: {len(report.devices)} device(s), {t.segments} segments, {t.blocks} blocks; "
        f"allocator settings: {settings}"
    ]
    for d in devices:
        lines += _device_lines(f"device {d}", report.devices[d], oom_free.get(d))
    if len(devices) > 1:
        lines += _device_lines("all devices", t, None, worst=False)
    if t.violations:
        lines.append(f"! {len(t.violations)} segment(s) break allocated + free + pending == size:")
        lines += [f"    {v.message}" for v in t.violations[:5]]
    advice = checked.advice
    lines.append("advice:" if advice else "advice: none (nothing worth changing)")
    lines += [f"  - [{a.kind}] {a.message}" for a in advice]
    if checked.rejected:
        lines.append("checked and rejected (the replay of the recorded trace is worse with it):")
        lines += [f"  - [{c.advice.kind}] {c.advice.message}" for c in checked.rejected]
    return lines


def _device_lines(
    title: str, f: MemoryFigures, oom_free: int | None, worst: bool = True
) -> list[str]:
    fs = format_size
    lines = [
        f"{title}: reserved {fs(f.reserved)}, allocated {fs(f.allocated)} (requested "
        f"{fs(f.requested)}, internal waste {fs(f.internal_waste)}), pending free "
        f"{fs(f.pending_free)}",
        f"  free {fs(f.free)} in {f.blocks_free} blocks: largest {fs(f.largest_free)}, "
        f"external fragmentation {f.external_fragmentation:.1%}, "
        f"fragmentation_sq {f.fragmentation_sq:.1%}",
        f"  trapped in partly used segments {fs(f.free_trapped)}; empty_cache would release "
        f"{fs(f.releasable)}"
        + (f" (+{fs(f.releasable_private)} of private pools)" if f.releasable_private else ""),
        f"  left after empty_cache {fs(f.free_stuck)} ({fs(f.free_stuck_expandable)} in "
        "partial pages of expandable segments)",
    ]
    if oom_free is not None:
        lines.append(f"  last OOM: the driver had {fs(oom_free)} free")
    if worst and f.worst_segments:
        lines.append("  worst segments (free that empty_cache cannot return):")
        lines += [f"    {_segment_line(s)}" for s in f.worst_segments]
    return lines


def _segment_line(s: SegmentSummary) -> str:
    kind = f"{s.pool}{' expandable' if s.is_expandable else ''}"
    stream = f", stream {s.stream}" if s.stream else ""
    # pending frees become free when empty_cache syncs, so they count in what stays stuck
    pending = f" and {format_size(s.pending_free)} pending" if s.pending_free else ""
    return (
        f"0x{s.address:x} {kind} {format_size(s.total_size)}{stream}: "
        f"{format_size(s.stuck_free)} stuck of {format_size(s.free)} free{pending} in "
        f"{s.n_blocks} blocks, largest {format_size(s.largest_free)}"
    )


# --------------------------------------------------------------------------------------------
# whatif


def add_whatif(sub: Any) -> None:
    p = sub.add_parser(
        "whatif",
        help="replay a recorded trace under other allocator settings or another capacity",
        description="Replay a snapshot's recorded history through the allocator model with "
        "other PYTORCH_CUDA_ALLOC_CONF settings (and/or another capacity) and show the "
        "recorded and predicted segments, peak reserved and OOM side by side.",
    )
    p.add_argument("file", type=Path, help="snapshot file recorded with history (trace)")
    p.add_argument(
        "--conf",
        default=None,
        help="PYTORCH_CUDA_ALLOC_CONF to try, e.g. expandable_segments:True "
        "(default: the recorded settings)",
    )
    p.add_argument(
        "--capacity",
        default=None,
        help="bytes the process can get per device, e.g. 80GiB (default: inferred from a "
        "recorded OOM, else unknown)",
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(run=run_whatif)


def run_whatif(args: argparse.Namespace) -> int:
    from .allocator.config import AllocatorConfig
    from .allocator.replay import replay
    from .io import load_snapshot

    if args.capacity is not None and args.capacity.strip().startswith("-"):
        raise UsageError(f"--capacity must be positive, got {args.capacity!r}")
    capacity = parse_size(args.capacity) if args.capacity is not None else None
    if capacity is not None and capacity <= 0:
        raise UsageError(f"--capacity must be positive, got {args.capacity!r}")
    conf = None
    if args.conf is not None:
        try:
            conf = AllocatorConfig.parse(args.conf)
        except ValueError as e:
            raise UsageError(f"--conf {args.conf!r}: {e}") from None
    snap = load_snapshot(args.file)
    result = replay(snap, config=conf, capacity=capacity)
    rows = {dev: _whatif_device(result, dev) for dev in sorted(result.devices)}
    if args.json:
        out = {
            "config": result.config,
            "recorded_config": result.recorded_config,
            "what_if": result.what_if,
            "capacity_known": result.capacity_known,
            "devices": {str(d): r for d, r in rows.items()},
        }
        print(json.dumps(out, indent=2))
    else:
        recorded = snap.allocator_settings is not None
        print("\n".join(_whatif_text(result, rows, str(args.file), recorded)))
    return 0


def _whatif_device(result: Any, dev: int) -> dict[str, Any]:
    """Recorded vs predicted figures of one traced device (JSON-ready)."""
    run, tl = result.devices[dev], result.timelines[dev]
    start = tl.start.totals()[2]
    recorded_oom = result.recorded[dev].recorded_oom
    return {
        "events": len(tl),
        "capacity": run.capacity,
        "capacity_known": bool(run.capacity_known),
        "what_if": bool(run.what_if),
        "recorded": _run_figures(
            result.recorded_peak_reserved(dev),
            result.peak_segments(dev, "recording"),
            tl.segments,
            start,
            recorded_oom,
        ),
        "predicted": _run_figures(
            int(run.peak_reserved), result.peak_segments(dev), run.segments, start, run.oom
        ),
    }


def _run_figures(
    peak_reserved: int, peak_segments: int, segments: Any, start: int, oom_at: int | None
) -> dict:
    """One side of the comparison; `segments` is the count after each entry, `start` before."""
    return {
        "peak_reserved": peak_reserved,
        "peak_segments": peak_segments,
        "final_segments": int(segments[-1]) if len(segments) else start,
        "oom": oom_at is not None,
        "oom_at": oom_at,
    }


def _whatif_text(
    result: Any, rows: dict[int, dict[str, Any]], name: str, recorded: bool
) -> list[str]:
    def conf(s: str) -> str:
        return f"PYTORCH_CUDA_ALLOC_CONF={s!r}" if s else "the default settings"

    was = conf(result.recorded_config) if recorded else NOT_RECORDED
    lines = [f"{name}: what if {conf(result.config)} (recorded: {was})"]
    if not result.what_if:
        lines.append("  same settings and capacity as recorded: predicted = the model's replay")
    for dev, r in rows.items():
        cap = (
            format_size(r["capacity"])
            if r["capacity_known"] and r["capacity"] is not None
            else "capacity unknown (the model never runs out of memory)"
        )
        if r["capacity_known"]:
            cap = f"capacity {cap}"
        lines.append(f"device {dev}, {r['events']} trace entries, {cap}:")
        lines.append(f"  {'':<16}{'recorded':>18}{'predicted':>18}")
        rec, pre = r["recorded"], r["predicted"]
        for label, key, fmt in (
            ("peak reserved", "peak_reserved", format_size),
            ("peak segments", "peak_segments", str),
            ("final segments", "final_segments", str),
        ):
            lines.append(f"  {label:<16}{fmt(rec[key]):>18}{fmt(pre[key]):>18}")
        lines.append(f"  {'OOM':<16}{_oom_cell(rec['oom_at']):>18}{_oom_cell(pre['oom_at']):>18}")
    return lines


def _oom_cell(at: int | None) -> str:
    return "no" if at is None else f"yes (entry {at})"


# --------------------------------------------------------------------------------------------
# diff


def add_diff(sub: Any) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two snapshots: figures, segments, allocation sites",
        description="Compare snapshot A (before) with B (after), per device: reserved, "
        "allocated, fragmentation, segments added/removed, the allocation sites that grew.",
    )
    p.add_argument("a", type=Path, help="the snapshot before")
    p.add_argument("b", type=Path, help="the snapshot after")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    p.set_defaults(run=run_diff)


def run_diff(args: argparse.Namespace) -> int:
    from .diff import diff
    from .io import load_snapshot

    result = diff(load_snapshot(args.a), load_snapshot(args.b))
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.text())
    return 0


# --------------------------------------------------------------------------------------------
# report


def add_report(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report that opens offline",
        description="Write one HTML file with everything inlined (segment map, timeline, "
        "fragmentation, advice, top allocation sites); it opens with the network off.",
    )
    _add_sharing_args(p, "the HTML file to write")
    p.add_argument(
        "--no-replay",
        action="store_true",
        help="do not check setting advice by replaying the recorded trace",
    )
    p.set_defaults(run=run_report)


def _add_sharing_args(p: argparse.ArgumentParser, output_help: str) -> None:
    """FILE, -o OUTPUT and --redact-paths: what every command that writes a file to share takes."""
    p.add_argument("file", type=Path, help="snapshot file")
    p.add_argument("-o", "--output", type=Path, required=True, help=output_help)
    p.add_argument(
        "--redact-paths",
        action="store_true",
        help="replace home directories and user names in every string first",
    )


def run_report(args: argparse.Namespace) -> int:
    from .report_html import report

    _check_output(args.output)
    # the file itself: its name is the title and its size sets the page's budget
    path = report(
        args.file, args.output, redact_paths=args.redact_paths, replay_advice=not args.no_replay
    )
    print(f"wrote {path} ({format_size(path.stat().st_size)})")
    return 0


# --------------------------------------------------------------------------------------------
# export


def add_export(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a snapshot as pickle (protocol 4), JSON or a CSV timeline",
        description="Export a snapshot for sharing: a protocol-4 pickle with the full trace "
        "(PyTorch's tools accept it), JSON, or a CSV with one row per trace entry.",
    )
    _add_sharing_args(p, "the file to write")
    p.add_argument(
        "--format",
        choices=("pickle", "json", "csv"),
        default=None,
        help="default: from the output's suffix (.json, .csv; anything else pickle)",
    )
    p.add_argument("--device", type=int, default=None, help="CSV: only this device's trace")
    p.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> int:
    from .export import export
    from .io import load_snapshot

    _check_output(args.output)
    snap = load_snapshot(args.file)
    if args.device is not None and args.device not in snap.traces:
        have = ", ".join(map(str, sorted(snap.traces))) or "none"
        raise UsageError(f"no trace of device {args.device} in {args.file} (traced: {have})")
    path = export(
        snap, args.output, format=args.format, redact_paths=args.redact_paths, device=args.device
    )
    print(f"wrote {path} ({format_size(path.stat().st_size)})")
    return 0


def _check_output(path: Path) -> None:
    """An output path whose folder is missing, or that is a folder, is a usage error."""
    if path.is_dir():
        raise UsageError(f"output {path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"output folder {parent} does not exist")


# --------------------------------------------------------------------------------------------
# demo

#: The notebook `gpumemviz demo` opens, relative to the source checkout's root.
DEMO_NOTEBOOK = Path("example_notebooks") / "01_quickstart.ipynb"
_INSTALL_HINT = "pip install jupyterlab 'gpumemviz[widget]'"


def add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="open the quickstart notebook in JupyterLab (what `make demo` runs)",
        description="Start JupyterLab on example_notebooks/01_quickstart.ipynb: the live "
        "panel on a simulated GPU when there is no real one.",
    )
    p.add_argument("--port", type=int, default=8888, help="server port (default 8888)")
    p.add_argument(
        "--no-browser", action="store_true", help="print the URL instead of opening a browser"
    )
    p.add_argument(
        "--print-command",
        action="store_true",
        help="print the command (one shell-quoted line) instead of running it",
    )
    p.set_defaults(run=run_demo)


def demo_command(port: int = 8888, *, no_browser: bool = False) -> tuple[list[str], Path]:
    """The `jupyter lab` command line of `gpumemviz demo` and the folder it runs in.

    Raises `UsageError` (one line) when jupyterlab is missing or the notebook is not found.
    """
    try:
        import jupyterlab  # noqa: F401  (only asked whether it is there)
    except ImportError:
        raise UsageError(f"jupyterlab is not installed: {_INSTALL_HINT}") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0-65535, got {port}")
    root = Path(__file__).resolve().parents[2]  # src/gpumemviz/cli.py -> the checkout
    notebook = root / DEMO_NOTEBOOK
    if not notebook.is_file():
        raise UsageError(
            f"{DEMO_NOTEBOOK} not found beside this gpumemviz ({root}): "
            "`gpumemviz demo` runs from a source checkout (git clone, then make demo)"
        )
    headless = sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
    ]
    if no_browser or headless:
        cmd.append("--no-browser")
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")  # containers run as root; jupyter refuses it otherwise
    cmd.append(notebook.name)
    return cmd, notebook.parent


def run_demo(args: argparse.Namespace) -> int:
    import shlex
    import subprocess

    cmd, cwd = demo_command(args.port, no_browser=args.no_browser)
    if args.print_command:
        print(f"cd {shlex.quote(str(cwd))} && {shlex.join(cmd)}")
        return 0
    print(
        f"gpumemviz demo: JupyterLab on {DEMO_NOTEBOOK}; open the "
        f"http://127.0.0.1:{args.port}/lab?token=... URL it prints (Ctrl-C stops it)",
        flush=True,
    )
    if os.name == "posix":  # become the server: Ctrl-C and kill reach jupyter, no orphan
        os.chdir(cwd)
        os.execv(cmd[0], cmd)
    try:  # pragma: no cover - Windows has no real exec
        return subprocess.call(cmd, cwd=cwd)
    except KeyboardInterrupt:  # pragma: no cover - the user stopped the server
        return 0


# --------------------------------------------------------------------------------------------
# the command

#: One function per subcommand: `add(subparsers)` registers it and sets `run`.
SUBCOMMANDS: list[Callable[[Any], None]] = [
    add_inspect,
    add_whatif,
    add_diff,
    add_report,
    add_export,
    add_demo,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumemviz",
        description="See PyTorch CUDA caching-allocator memory and its fragmentation.",
    )
    parser.add_argument("--version", action="version", version=f"gpumemviz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `gpumemviz ARGS`; returns the exit status (0 ok, 2 bad input).

    Examples
    --------
    >>> main(["inspect", "/no/such/file.pickle"])
    2
    """
    parser = build_parser()
    try:
        args = parser.parse_args(_glue_negative(sys.argv[1:] if argv is None else list(argv)))
    except SystemExit as e:  # --help, --version, or a usage error argparse already printed
        return e.code if isinstance(e.code, int) else 2
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(run(args))
    except BrokenPipeError:  # `gpumemviz inspect x | head`: the reader left, that is fine
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (ValueError, OSError) as e:  # UsageError, SnapshotError, bad sizes, unwritable
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__  # output: one line, 2
        print(f"gpumemviz {args.command}: error: {msg}", file=sys.stderr)
        return 2


def _glue_negative(argv: list[str]) -> list[str]:
    """`--capacity -5GiB` as `--capacity=-5GiB`: argparse reads a value starting with "-" and
    a digit as a missing value, so the run could not say the size must be positive."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i] in _SIZE_OPTIONS and nxt.startswith("-") and nxt[1:2].isdigit():
            out.append(f"{argv[i]}={nxt}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


if __name__ == "__main__":
    sys.exit(main())
