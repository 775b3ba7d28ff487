"""Exports for sharing and for other tools: torch pickle, JSON, and CSV timelines.

An export is how a user hands an OOM to a colleague or a bug tracker, so the pickle must open
in PyTorch's own tools (`python -m torch.cuda._memory_viz`, MemoryViz): protocol 4, the full
trace kept, and a bare segment list given `device_traces`. `redact_paths=True` hides home
directories and user names first. Every file is written atomically through `gpumemviz.io`.
The HTML report comes with the renderer (`gpumemviz report`).
"""

from __future__ import annotations

import csv
import io as _io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

import numpy as np

from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.analysis.frames import redact_paths as _redact_paths
from gpumemviz.io import as_snapshot, atomic_write, write_torch
from gpumemviz.snapshot import ACTIONS, INACTIVE, Snapshot
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.gc_pause import no_gc
from gpumemviz.snapshot.sample import STAT_FIGURES, HasHistory, HasSamples, Sample

if TYPE_CHECKING:
    from gpumemviz.io import SnapshotLike
    from gpumemviz.snapshot.schema import TorchDict

Cell = int | float | str  # a CSV cell ("" where a figure is missing)

__all__ = [
    "FORMATS",
    "SAMPLE_COLUMNS",
    "TRACE_COLUMNS",
    "export",
    "sample_rows",
    "trace_rows",
    "trace_totals",
]

FORMATS = ("pickle", "json", "csv")
_SUFFIXES = {".json": "json", ".csv": "csv", ".pkl": "pickle", ".pickle": "pickle"}

# One row per trace entry. reserved/requested are exact running totals (see `trace_rows`);
# allocated and segments come from the replayed timeline and are empty when it cannot be built.
TRACE_COLUMNS = (
    "device",
    "index",
    "time_us",
    "action",
    "addr",
    "size",
    "stream",
    "device_free",
    "reserved",
    "allocated",
    "requested",
    "segments",
)
# One row per sample of a Sampler history; empty cells where a figure was not read.
SAMPLE_COLUMNS = (
    *("time", "monotonic", "seq", "device", "state"),
    *STAT_FIGURES,  # the MemoryStats figures, in their order
    *("nvml_used", "nvml_total", "non_pytorch"),
)
_DELTA_RESERVED = {"segment_alloc": 1, "segment_free": -1, "segment_map": 1, "segment_unmap": -1}
_DELTA_REQUESTED = {"alloc": 1, "free_completed": -1}


def _format_of(path: Path, format: str | None) -> str:
    if format is None:
        suffix = path.suffix.lower()
        if suffix == ".html":
            raise ValueError("HTML export needs the report renderer: use `gpumemviz report`")
        return _SUFFIXES.get(suffix, "pickle")
    if format not in FORMATS:
        raise ValueError(
            f"unknown export format {short_repr(format)}: expected one of {', '.join(FORMATS)}"
        )
    return format


def _samples_of(x: object) -> list[Sample] | None:
    """The samples of a Sampler, a History, or a sequence of Sample; None for anything else."""
    history = getattr(x, "history", None)
    if history is not None and callable(getattr(history, "samples", None)):
        return list(history.samples())
    samples = getattr(x, "samples", None)
    if callable(samples):
        return list(samples())
    if (
        isinstance(x, Sequence)
        and not isinstance(x, str | bytes)
        and x
        and all(isinstance(s, Sample) for s in x)
    ):
        return list(x)
    return None


def export(
    snapshot: SnapshotLike | HasHistory | HasSamples | Sequence[Sample],
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    redact_paths: bool = False,
    device: int | None = None,
    force: bool = False,
) -> Path:
    """Write a snapshot (or a sampled timeline) for sharing, atomically.

    Parameters
    ----------
    snapshot : Snapshot, torch dict or list, path or bytes; or a Sampler, History, or a
        sequence of `Sample`
        What to export. Samples only make sense as CSV.
    path : str or PathLike
        Where to write; ``"-"`` is standard output, a symlink is written through (its target
        replaced, the link kept); a directory, device, fifo or socket is refused.
    format : {"pickle", "json", "csv"}, optional
        Default: from the suffix (.json, .csv; anything else is pickle).
    redact_paths : bool
        Replace home directories and user names (frames, annotations, every string) with
        placeholders first (`gpumemviz.analysis.frames.redact_paths`).
    device : int, optional
        CSV of a trace: only this device (default: every device with a trace).
    force : bool
        Replace a read-only file (refused otherwise, with a PermissionError).

    Returns
    -------
    Path
        The path written.

    Raises
    ------
    ValueError
        An unknown `format`; a ``.html`` path (use `gpumemviz.report`); samples to anything
        but CSV.
    SnapshotError
        A snapshot that cannot be read.
    OSError
        The file cannot be written (``cannot write PATH: reason``; the old file is kept).

    Notes
    -----
    pickle is protocol 4 (MemoryViz rejects 5), with the full trace, and a bare segment list
    gains ``device_traces`` so ``python -m torch.cuda._memory_viz stats/trace`` accept it.
    The CSV of a snapshot has one row per trace entry (`TRACE_COLUMNS`, see `trace_rows`);
    of samples one row per sample (`SAMPLE_COLUMNS`).

    Examples
    --------
    >>> import pathlib, shutil, tempfile
    >>> import gpumemviz
    >>> seg = {"device": 0, "address": 0x7F0000000000, "total_size": 2 << 20, "stream": 0,
    ...        "segment_type": "small", "allocated_size": 512, "active_size": 512,
    ...        "requested_size": 100, "blocks": [
    ...     {"size": 512, "requested_size": 100, "state": "active_allocated"},
    ...     {"size": (2 << 20) - 512, "requested_size": 0, "state": "inactive"}]}
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> path = gpumemviz.export([seg], folder / "run.pickle")  # a bare list gains device_traces
    >>> sorted(gpumemviz.load_snapshot(path).to_torch())
    ['device_traces', 'segments']
    >>> alloc = {"action": "alloc", "addr": seg["address"], "size": 512, "stream": 0,
    ...          "time_us": 1, "frames": []}
    >>> csv = gpumemviz.export({"segments": [seg], "device_traces": [[alloc]]}, folder / "t.csv")
    >>> print(csv.read_text(), end="")
    device,index,time_us,action,addr,size,stream,device_free,reserved,allocated,requested,segments
    0,0,1,alloc,139637976727552,512,0,,2097152,512,100,1
    >>> shutil.rmtree(folder)
    """
    path = Path(path)
    fmt = _format_of(path, format)
    samples = _samples_of(snapshot)
    if samples is not None:
        if fmt != "csv":
            raise ValueError(f"samples export only as CSV, not {fmt}")
        _write_csv(path, SAMPLE_COLUMNS, sample_rows(samples), force)
        return path
    snap = as_snapshot(cast("SnapshotLike", snapshot))  # not samples: a snapshot
    if fmt == "csv":
        _write_csv(path, TRACE_COLUMNS, trace_rows(snap, device=device), force)
        return path
    if redact_paths:
        snap = _redact_paths(snap)
    return write_torch(snap.to_torch(), path, format=fmt, force=force)


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(cell: Cell) -> Cell:
    """A text cell a spreadsheet would run as a formula (starting with = + - @ TAB or CR, and
    not a number) with a leading quote; anything else as it is. Frame names, file names and
    labels come from the profiled program: a CSV opened in a spreadsheet must not run them.

    >>> csv_safe("=HYPERLINK(1)"), csv_safe("-12.5"), csv_safe("@x"), csv_safe(3), csv_safe("a")
    ("'=HYPERLINK(1)", '-12.5', "'@x", 3, 'a')
    """
    if not isinstance(cell, str) or not cell.startswith(_FORMULA_STARTS):
        return cell
    try:
        float(cell)
    except ValueError:
        return "'" + cell
    return cell


def _write_csv(
    path: Path, header: Sequence[str], columns: dict[str, list[Cell]], force: bool = False
) -> None:
    def write(f: BinaryIO) -> None:
        text = _io.TextIOWrapper(f, encoding="utf-8", newline="")
        w = csv.writer(text, lineterminator="\n")
        w.writerow([csv_safe(h) for h in header])
        rows = zip(*(columns[c] for c in header), strict=True)
        w.writerows([csv_safe(c) for c in row] for row in rows)
        text.flush()
        text.detach()

    atomic_write(path, write, force=force)


def _cells(a: np.ndarray, missing: np.ndarray | None = None) -> list[Cell]:
    """Column values as Python ints, "" where `missing` (or where the value is -1)."""
    vals: list[Cell] = a.tolist()
    mask = (a == -1) if missing is None else missing
    if mask.any():
        for i in np.flatnonzero(mask).tolist():
            vals[i] = ""
    return vals


def trace_rows(snapshot: SnapshotLike, *, device: int | None = None) -> dict[str, list[Cell]]:
    """The trace as CSV columns (`TRACE_COLUMNS`), one row per entry, devices in order.

    `reserved` (mapped segment bytes) and `requested` (requested bytes of active blocks, what
    torch's own `trace` report counts) after each entry are exact: the final totals of the
    snapshot minus the changes the later entries made (segment_alloc/map +size,
    segment_free/unmap -size; alloc +size, free_completed -size), so they hold even when the
    ring buffer lost the start of the history. `allocated` (block bytes, rounding included)
    and `segments` come from `gpumemviz.allocator.replay.recording.Recording`, which replays
    the trace at the recorded addresses; they are empty when the trace cannot be replayed.

    Parameters
    ----------
    snapshot : Snapshot, torch dict or list, path or bytes
    device : int, optional
        Only this device's trace.

    Returns
    -------
    dict of str to list
        Column name to values ("" for missing cells).
    """
    snap: Snapshot = as_snapshot(snapshot)
    cols: dict[str, list[Cell]] = {c: [] for c in TRACE_COLUMNS}
    devices = sorted(snap.traces) if device is None else [device]
    seg_dict: TorchDict | None = None  # the snapshot's dict without its traces, made once
    for d in devices:
        trace = snap.traces.get(d)
        if trace is None or not len(trace):
            continue
        n = len(trace)
        names = trace.action_names
        action = trace.action
        if seg_dict is None:
            seg_dict = snap.to_torch_segments()
        reserved, requested, replayed = trace_totals(snap, d, seg_dict)
        allocated: Sequence[Cell]
        segments: Sequence[Cell]
        if replayed is None:
            allocated = segments = [""] * n
        else:
            allocated, segments = replayed[0].tolist(), replayed[1].tolist()
        cols["device"] += [d] * n
        cols["index"] += list(range(n))
        cols["time_us"] += _cells(trace.time_us)
        cols["action"] += [names[c] for c in action.tolist()]
        is_oom = action == ACTIONS.index("oom")
        cols["addr"] += _cells(trace.addr, is_oom | (trace.addr == -1))
        cols["size"] += trace.size.tolist()
        cols["stream"] += trace.stream.tolist()
        cols["device_free"] += _cells(trace.device_free, ~is_oom)
        cols["reserved"] += reserved.tolist()
        cols["allocated"] += allocated
        cols["requested"] += requested.tolist()
        cols["segments"] += segments
    return cols


def trace_totals(
    snap: Snapshot,
    device: int,
    torch_dict: TorchDict | None = None,
    recording: Recording | None = None,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """``(reserved, requested, (allocated, segments))`` after each of `device`'s trace
    entries, as int64 columns without a Python object per entry (`trace_rows`' columns); the
    last is None when the trace cannot be replayed. `torch_dict`: ``snap.to_torch()`` when the
    caller has it (only its segments and settings are read: the trace is read from `snap`'s
    columns, without a dict per entry); `recording`: the device's `Recording` when the caller
    has one (a replay's), so the trace is not applied again.

    >>> from gpumemviz.allocator.model import CachingAllocator
    >>> a = CachingAllocator(1 << 30); a.free(a.malloc(3 << 20))
    >>> res, req, (alc, segs) = trace_totals(Snapshot.from_torch(a.snapshot(record=False)), 0)
    >>> [int(v) >> 20 for v in res], [int(v) >> 20 for v in alc]
    ([20, 20, 20, 20], [0, 3, 0, 0])
    """
    trace = snap.traces[device]
    names, action = trace.action_names, trace.action
    seg = snap.segments.device == device
    blk = (snap.segments.device[snap.blocks.segment] == device) & (snap.blocks.state != INACTIVE)
    reserved = _running(
        int(snap.segments.total_size[seg].sum()), action, trace.size, names, _DELTA_RESERVED
    )
    requested = _running(
        int(snap.blocks.requested_size[blk].sum()), action, trace.size, names, _DELTA_REQUESTED
    )
    if recording is not None:
        return reserved, requested, (recording.allocated, recording.segments)
    try:
        with no_gc():  # a tuple and a dict per entry: the cyclic GC would rescan them often
            tl = Recording.from_snapshot(
                snap.to_torch_segments() if torch_dict is None else torch_dict,
                device,
                columns=trace,
                config=snap.config,  # the snapshot's one parse of its settings
                seekable=False,  # only its figures are read
            )
    except (ValueError, KeyError, IndexError):
        return reserved, requested, None
    return reserved, requested, (tl.allocated, tl.segments)


def _running(
    final: int,
    action: np.ndarray,
    size: np.ndarray,
    names: Sequence[str],
    sign_of: dict[str, int],
) -> np.ndarray:
    """Totals after each entry, counted back from the snapshot's final total."""
    sign = np.zeros(len(names), np.int64)
    for name, s in sign_of.items():
        if name in names:
            sign[names.index(name)] = s
    delta = sign[action] * size
    after = np.cumsum(delta[::-1])[::-1]  # sum of deltas from entry i to the end
    totals: np.ndarray = final - after + delta  # minus the deltas of the entries after i
    return totals


def sample_rows(samples: Sequence[Sample]) -> dict[str, list[Cell]]:
    """Sampler history as CSV columns (`SAMPLE_COLUMNS`), one row per sample, in order.

    Memory figures come from each sample's `stats` (torch's memory_stats), NVML figures from
    its `nvml`; a figure the sample lacks is "".
    """
    cols: dict[str, list[Cell]] = {c: [] for c in SAMPLE_COLUMNS}
    for s in samples:
        cols["time"].append(repr(float(s.time)))
        cols["monotonic"].append(repr(float(s.monotonic)))
        cols["seq"].append(s.seq)
        cols["device"].append(s.device)
        cols["state"].append(s.state)
        for k in STAT_FIGURES:
            cols[k].append(getattr(s.stats, k) if s.stats is not None else "")
        nv = s.nvml if s.nvml is not None and s.nvml.available else None
        for col, attr in (("nvml_used", "used"), ("nvml_total", "total")):
            v = getattr(nv, attr) if nv is not None else None
            cols[col].append("" if v is None else v)
        v = s.non_pytorch_bytes
        cols["non_pytorch"].append("" if v is None else v)
    return cols
