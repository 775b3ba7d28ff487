"""The offline HTML report: one self-contained file that opens anywhere, network off.

`report(snapshot, path)` writes a single HTML page with everything inlined: the panel's own
renderer from js/ (the segment map with hover, plus a segment zoom and the memory timeline,
bundled by esbuild as ``static/report.js``), its CSS, and the snapshot's data as one JSON
document (binary columns in base64). The page loads nothing: no CDN, no font, no image.

Size: the data part stays within `SIZE_FACTOR` (2x) the input pickle's size plus a fixed
`ANALYSIS_ALLOWANCE` for the analysis tables; the renderer comes on top. Every segment gets
an aggregated row (cells at a resolution chosen to fit); exact blocks for the hover ride along
for the rows they fit, as in the panel's frames. Untrusted text (frame names, file paths,
settings) goes into the page only as JSON data read by the script, which puts it into text
nodes; the JSON is written so that ``</script>`` and ``<!--`` cannot occur in it
(`report_page`, which makes and writes the page around the data computed here).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from gpumemviz.analysis.advice_check import SharedReplay
from gpumemviz.analysis.findings import AdviceItem, Findings, OomFinding, analyze
from gpumemviz.analysis.fragmentation import (
    ASSUMED_IN_USE,
    FIGURE_NAMES,
    MemoryFigures,
    PoolFigures,
    SegmentSummary,
    fragmentation,
)
from gpumemviz.analysis.frames import Redactor
from gpumemviz.analysis.holders import N_TOP
from gpumemviz.analysis.ranks import Ranks
from gpumemviz.io import SnapshotLike, as_snapshot, atomic_write
from gpumemviz.render.glance import glance_set
from gpumemviz.render.holders import holders_view
from gpumemviz.render.rows import MAX_CELLS, RowTable, build_rows, encode_cells
from gpumemviz.render.timeline import envelope
from gpumemviz.render.wire import header_numbers
from gpumemviz.render.wire_frame import BLOCK_BYTES, ROW_OVERHEAD, pack_frame, row_meta
from gpumemviz.reporting.export import trace_totals
from gpumemviz.reporting.page import (
    Blob,
    Part,
    blobs_as_text,
    join_parts,
    json_len,
    page_parts,
    renderer_size,
    write_parts,
)
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.escaping import one_line, short_repr
from gpumemviz.snapshot.pools import pool_label
from gpumemviz.snapshot.schema import JsonDict

__all__ = [
    "ANALYSIS_ALLOWANCE",
    "DATA_FORMAT",
    "SIZE_FACTOR",
    "TIMELINE_POINTS",
    "estimate_pickle_size",
    "holders_data",
    "render_html",
    "renderer_size",
    "report",
    "report_data",
]

DATA_FORMAT = 1
SIZE_FACTOR = 2  # data bytes per byte of the input pickle
ANALYSIS_ALLOWANCE = 8 << 10  # figures, advice and holders: bounded, whatever the input's size
TIMELINE_POINTS = 1500  # per device, at most: each a bucket's peaks
MAX_POOLS = 12  # pools the page lists (about 300 bytes each): within ANALYSIS_ALLOWANCE
_CELL_STEPS = (1024, 512, 256, 128, 64, 32, 16)
_B64 = 4 / 3


def report(
    snapshot: SnapshotLike,
    path: str | Path,
    *,
    title: str | None = None,
    input_size: int | None = None,
    redact_paths: bool = False,
    replay_advice: bool = True,
    force: bool = False,
    ranks: Ranks | None = None,
) -> Path:
    """Write the offline HTML report of a snapshot.

    Parameters
    ----------
    snapshot : Snapshot, torch dict or list, path or bytes
        Anything `gpumemviz.io.as_snapshot` accepts (files through the restricted loader).
    path : str or Path
        The HTML file to write (atomically: temp file, fsync, rename); ``"-"`` is standard
        output, a symlink is written through, a directory, device, fifo or socket is refused.
    title : str, optional
        Page title; default: the input file's name, else "memory snapshot".
    input_size : int, optional
        Bytes of the input pickle, which sets the size budget; default: the file's or the
        bytes' size, else an estimate from the snapshot's blocks and trace.
    redact_paths : bool
        Replace home directories and user names in every string (`frames.Redactor`, the same
        placeholders as `gpumemviz.export(..., redact_paths=True)`), the title included.
    replay_advice : bool
        Check setting advice by replaying the recorded trace (`gpumemviz.analysis.advice_check`);
        advice the replay refutes is listed apart as checked and rejected.
    force : bool
        Replace a read-only file (refused otherwise, with a PermissionError).
    ranks : Ranks, optional
        A folder's ranks (`gpumemviz.analysis.ranks.analyze_ranks`), `snapshot` being one of
        them (the worst): the page's data gains ``ranks``, the rank grid worst first, what
        differs and each rank's findings (`Ranks.to_dict`).

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    SnapshotError
        A snapshot that cannot be read: raised before anything is written.
    OSError
        The file cannot be written (the old file is kept).

    Examples
    --------
    >>> from gpumemviz.allocator.model import CachingAllocator
    >>> a = CachingAllocator(1 << 30); _ = a.malloc(3 << 20)
    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     report(a.snapshot(), os.path.join(d, "r.html")).read_text()[:15]
    '<!doctype html>'
    """
    parts = _page(snapshot, title, input_size, redact_paths, replay_advice, ranks)

    def write(f: BinaryIO) -> None:
        write_parts(f, parts)  # never joined: the page's data is in memory once

    target = Path(path)
    atomic_write(target, write, force=force)
    return target


def render_html(
    snapshot: SnapshotLike,
    *,
    title: str | None = None,
    input_size: int | None = None,
    redact_paths: bool = False,
    replay_advice: bool = True,
) -> str:
    """The report page as a string (what `report` writes); see `report` for the parameters."""
    parts = _page(snapshot, title, input_size, redact_paths, replay_advice)
    return join_parts(parts)


def _page(
    snapshot: SnapshotLike,
    title: str | None,
    input_size: int | None,
    redact_paths: bool,
    replay_advice: bool,
    ranks: Ranks | None = None,
) -> list[Part]:
    """The page in parts (`report_page.page_parts`), everything computed: only writing is left."""
    name = _source_name(snapshot)
    if input_size is None:
        input_size = _input_size(snapshot)
    snap = as_snapshot(snapshot)
    if input_size is None:
        input_size = estimate_pickle_size(snap)
    page_title = one_line(title or name or "memory snapshot")
    redactor = Redactor() if redact_paths else None
    if redactor is not None:
        snap = snap.map_objects(redactor.redact)
        page_title = redactor.text(page_title)
    # the data lives only until its JSON is made
    budget = SIZE_FACTOR * input_size
    data = _data(snap, title=page_title, budget=budget, replay_advice=replay_advice)
    if ranks is not None:  # the folder's grid, what differs and each rank's findings
        many = ranks.to_dict()
        data["ranks"] = many if redactor is None else redactor.redact(many)
    return page_parts(page_title, data)


def report_data(
    snap: Snapshot, *, title: str = "", budget: int | None = None, replay_advice: bool = True
) -> JsonDict:
    """Everything the page shows, as JSON-ready data (binary columns base64, little-endian).

    `budget` bounds the bytes of the map and timeline data (the analysis has its own fixed
    allowance); None: full resolution and every row's blocks. `replay_advice` checks setting
    advice on the recorded trace (`advice_check`), as `gpumemviz inspect` does.
    """
    data: JsonDict = blobs_as_text(
        _data(snap, title=title, budget=budget, replay_advice=replay_advice)
    )
    return data


def _data(snap: Snapshot, *, title: str, budget: int | None, replay_advice: bool) -> JsonDict:
    """`report_data` with its binary columns as `report_page.Blob`s (base64 once written)."""
    rows = build_rows(snap)
    report_ = fragmentation(snap)
    header = header_numbers(rows)
    # the advice, its replay check and the OOM verdict are `analyze`'s, as every front end's;
    # its reconstruction, when it makes one, also gives the timeline's figures
    shared = SharedReplay(snap)
    found = analyze(snap, check=replay_advice, shared=shared)
    advice = [_advice_row(a) for a in found.advice]
    rejected = [_advice_row(a) for a in found.rejected]
    devices = {str(d): _device_figures(f) for d, f in report_.devices.items()}
    totals = _device_figures(report_.total)
    out: JsonDict = {
        "format": DATA_FORMAT,
        "title": title,
        "header": header,
        "devices": devices,
        "total": totals,
        "worst": [_worst(w) for w in report_.total.worst_segments],
        "advice": advice,
        "advice_rejected": rejected,
        # the failing device's verdict, and each device's (several devices may have failed)
        "oom": None if found.oom is None else _oom(found.oom),
        "ooms": {str(d): _oom(f.oom) for d, f in found.devices.items() if f.oom is not None},
        "notes": list(found.notes),
        # each device at a glance, its parts the findings' figures (as the panel's)
        "glance": glance_set(
            found.devices or ({} if found.device is None else {found.device: found}), None, {}
        ),
        # None: the file records no settings (older torch): shown as such, not as defaults
        "settings": (
            None if report_.allocator_settings is None else _plain(report_.allocator_settings)
        ),
        # who holds the allocated bytes, along every key: js/src/holders.js draws it
        "holders": holders_data(found),
        "growth": [g.to_dict() for g in found.growth],
        "forecast": None if found.forecast is None else found.forecast.to_dict(),
        "recorded": dict(found.recorded),
        "violations": [v.message for v in report_.violations][:20],
        "pools": [p.to_dict() for p in _listed(list(report_.devices.values()))],
        "pools_note": ASSUMED_IN_USE if report_.pools_in_use is True else "",
    }
    room = None if budget is None else max(0, budget - len(json.dumps(out)) + ANALYSIS_ALLOWANCE)
    timeline_room = None if room is None else room // 4
    out["timeline"] = _timelines(snap, timeline_room, shared)
    del shared  # the reconstruction goes before the map is drawn
    if room is not None:
        room = max(0, room - json_len(out["timeline"]))
    out["map"] = _map(rows, room)
    return out


def holders_data(found: Findings, top: int = N_TOP) -> JsonDict:
    """The holders view's data (`render.holders.holders_view`) of `found`: every holder key's
    top rows and the rest, bounded whatever the file's size, summing exactly to allocated."""
    return holders_view(found.holders, top)


def _advice_row(a: AdviceItem) -> JsonDict:
    """What the page shows of an advice: `Findings`' item without its evidence."""
    keys = ("kind", "message", "device", "setting", "checked", "verdict", "unchecked", "reason")
    return {k: getattr(a, k) for k in keys}


def _oom(o: OomFinding) -> JsonDict:
    """What the page shows of an OOM: its sentence, cause and ranked actions."""
    keys = ("device", "entry", "request", "rounded", "cause", "explanation", "basis", "frame")
    out: JsonDict = {k: getattr(o, k) for k in keys}
    out["sentence"] = o.sentence
    out["actions"] = [a.to_dict() for a in o.actions]
    return out


def estimate_pickle_size(snap: Snapshot) -> int:
    """A frameless protocol-4 pickle's size, roughly: the budget when no file size is known."""
    n_trace = sum(len(t) for t in snap.traces.values())
    return 300 * snap.n_segments + 48 * snap.n_blocks + 80 * n_trace + 1024


# ---------------------------------------------------------------------------- parts


def _map(rows: RowTable, room: int | None) -> JsonDict:
    """The segment map as one frame of every row (the panel's wire format), sized to `room`."""
    n = rows.n_rows
    cells = MAX_CELLS
    if room is not None and n:
        for cells in _CELL_STEPS:
            if n * (cells + ROW_OVERHEAD) * _B64 <= 0.75 * room:
                break
    ids = np.arange(n, dtype=np.int64)
    cell_bytes = encode_cells(rows, ids, cells) if n else np.zeros((0, cells), np.uint8)
    used = n * (cells + ROW_OVERHEAD) * _B64
    hover = 1 << 62 if room is None else max(0, int((room - used) / _B64) - BLOCK_BYTES)
    frame = pack_frame(
        rows,
        ids,
        cell_bytes,
        row_meta(rows, ids),
        seq=1,
        view="report",
        layout=1,
        hover_budget=hover,
    )
    return {
        "layout": {
            "version": 1,
            "n_rows": n,
            "groups": [g.to_dict() for g in rows.groups],
        },
        "content": frame.content,
        "buffers": [Blob(b) for b in frame.buffers],
    }


def _timelines(snap: Snapshot, room: int | None, shared: SharedReplay) -> JsonDict:
    """Per device with a trace: reserved and allocated after each entry, a level-of-detail
    summary for long traces (`envelope`: each bucket's highest and lowest entries, so the line
    drawn through them keeps every peak and trough at any trace length).

    `x` is the entry index of each point, `t` its time in seconds (the entry's time_us; None
    when the trace has no times), `oom` the entry indices of oom entries and `oom_t` their times.
    The allocated figures are the recorded history's: `shared`'s recordings where the advice
    check made them, else each device's trace applied here.
    """
    out: JsonDict = {}
    traced = [d for d, t in sorted(snap.traces.items()) if len(t)]
    if not traced:
        return out
    points = TIMELINE_POINTS
    if room is not None:  # 4 float64 columns per point, base64
        points = max(16, min(points, int(room / (len(traced) * 4 * 8 * _B64))))
    recordings = shared.recordings()
    for d in traced:  # a device without the advice check's recording is applied from columns
        reserved, requested, replayed = trace_totals(snap, d, recording=recordings.pop(d, None))
        allocated, label = (
            (requested, "requested") if replayed is None else (replayed[0], "allocated")
        )
        n = len(reserved)
        keep = envelope(points, reserved, allocated)
        x, res, alc = (keep.astype(np.float64), reserved[keep] * 1.0, allocated[keep] * 1.0)
        trace = snap.traces[d]
        oom_code = trace.action_names.index("oom") if "oom" in trace.action_names else -1
        ooms = np.flatnonzero(trace.action == oom_code)[:100] if oom_code >= 0 else np.zeros(0)
        timed = bool(n) and bool((trace.time_us >= 0).all())
        t = trace.time_us[x.astype(np.int64)] / 1e6 if timed else None
        out[str(d)] = {
            "entries": n,
            "series": ["reserved", label],
            "x": Blob(x.astype("<f8").tobytes()),
            "t": None if t is None else Blob(t.astype("<f8").tobytes()),
            "oom_t": (trace.time_us[ooms.astype(np.int64)] / 1e6).tolist() if timed else None,
            "reserved": Blob(res.astype("<f8").tobytes()),
            "allocated": Blob(alc.astype("<f8").tobytes()),
            "oom": ooms.astype(np.int64).tolist(),
        }
    return out


def _device_figures(f: MemoryFigures) -> JsonDict:
    """The headline figures, plus `free_stuck`: free bytes empty_cache cannot return (it syncs
    pending frees first, so they count), what the map paints trapped; on expandable segments it
    includes sub-page slivers, which torch's inactive_split_bytes (free_trapped) excludes."""
    return {k: getattr(f, k) for k in (*FIGURE_NAMES, "free_stuck")}


def _listed(devices: list[MemoryFigures]) -> list[PoolFigures]:
    """The pools the page lists, when a device has a private one: at most `MAX_POOLS` rows
    (the data's size stays bounded): the default pool of each device holding a private one,
    then the private pools holding the most, in the report's order (inspect --json lists
    every pool)."""
    private = [p for f in devices for p in f.pools if p.pool_id != (0, 0)]
    homes = {p.device for p in private}
    default = [p for f in devices for p in f.pools if p.pool_id == (0, 0) and p.device in homes]
    room = max(MAX_POOLS - len(default), 0)
    kept = {id(p) for p in sorted(private, key=lambda p: -p.reserved)[:room]}
    shown = {id(p) for p in default} | kept
    return [p for f in devices for p in f.pools if id(p) in shown]


def _worst(w: SegmentSummary) -> JsonDict:
    keys = ("device", "address", "total_size", "allocated", "free", "largest_free")
    out: JsonDict = {k: getattr(w, k) for k in keys}
    out |= {"stuck_free": w.stuck_free, "pool": w.pool, "stream": w.stream}
    out["pool_label"] = "" if w.pool_id == (0, 0) else pool_label(w.pool_id)
    out["is_expandable"] = bool(w.is_expandable)
    return out


def _plain(x: object, depth: int = 2) -> Any:  # Any: JSON data of whatever shape the settings have
    """Settings as JSON data, bounded: what torch records (a dict of scalars and one dict of
    numbers) as it is, up to `_SETTINGS_ITEMS` items per dict or list; anything deeper, odder or
    longer as a short repr (`messages.short_repr`: a file may share one list with itself
    30 levels deep); a float JSON cannot hold (NaN) as its repr too."""
    if type(x) is dict and depth > 0:
        out = {
            k if type(k) is str else short_repr(k): _plain(v, depth - 1)
            for k, v in itertools.islice(x.items(), _SETTINGS_ITEMS)
        }
        if len(x) > _SETTINGS_ITEMS:
            out["…"] = f"{len(x) - _SETTINGS_ITEMS} more"
        return out
    if isinstance(x, list | tuple) and depth > 0:
        return [_plain(v, depth - 1) for v in itertools.islice(x, _SETTINGS_ITEMS)]
    if x is None or type(x) in (bool, str) or (type(x) is int and x.bit_length() <= 64):
        return x if type(x) is not str or len(x) <= _SETTINGS_TEXT else short_repr(x)
    if type(x) is float and math.isfinite(x):
        return x
    return short_repr(x)


_SETTINGS_ITEMS = 64
_SETTINGS_TEXT = 2000


def _source_name(snapshot: object) -> str | None:
    if isinstance(snapshot, (str, Path)):
        return Path(snapshot).name
    return None


def _input_size(snapshot: object) -> int | None:
    if isinstance(snapshot, (str, Path)):
        try:
            return Path(snapshot).stat().st_size
        except OSError:
            return None  # as_snapshot reports the missing file
    if isinstance(snapshot, (bytes, bytearray, memoryview)):
        return len(snapshot)
    return None
