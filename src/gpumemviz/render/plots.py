"""plotly figures for notebooks and reports: memory over time, what-if replays, workload variants.

The panel draws its own canvas (a live plotly widget ships megabytes of JS per panel); these are
the figures a user gets back in Python. The data comes from the inputs' own arrays, so a figure
never shows a number its input does not hold. Inputs are read by duck typing (render/ sits above
the allocator in the layer table and does not import it): a Sampler or its History, Samples, a
`gpumemviz.replay` result, or `allocator.workloads.run` outcomes.

What is read of each input is named, for the type checker, by the protocols of
render/figure_inputs.py. The module stays whole (about 580 lines): its three figures share the
data readers and the plotly helpers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

import numpy as np

from gpumemviz.render.palette import palette
from gpumemviz.render.plot_inputs import (
    Floats,
    OutcomeLike,
    Plotly,
    ReplayRun,
    Row,
    Series,
    TimelineInput,
)
from gpumemviz.snapshot.sample import Sample
from gpumemviz.snapshot.units import format_size

__all__ = [
    "MAX_POINTS",
    "outcome_rows",
    "timeline",
    "timeline_series",
    "what_if",
    "workloads",
]

MAX_POINTS = 4000  # per line: longer series keep each bucket's lowest and highest point
GIB = float(1 << 30)


def _colours(theme: str) -> dict[str, str]:
    """The figures' colours in ``theme``: the panel's and the report's (render/palette.json)."""
    p = palette(theme)
    named = ("allocated", "reserved", "nvml_used", "non_pytorch", "oom")
    return {**{k: p[k] for k in named}, "recorded": p["muted"], "capacity": p["text"]}


COLORS = _colours("light")  # what_if and workloads draw in the light theme
LABELS = {
    "allocated": "allocated",
    "reserved": "reserved",
    "nvml_used": "NVML used",
    "non_pytorch": "non-PyTorch",
}


def _plotly() -> tuple[Plotly, Plotly]:
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise ImportError(
            "gpumemviz.render.plots needs plotly: pip install plotly (or 'gpumemviz[plot]')"
        ) from None
    return go, make_subplots


# --------------------------------------------------------------------------- data


def _decimate(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ~max_points points, keeping each bucket's min and max (peaks survive).

    NaN (missing) values are kept where they are the only value of a bucket.
    """
    n = len(y)
    if n <= max_points:
        return x, y
    buckets = max(1, max_points // 2)
    k = -(-n // buckets)
    yf = y.astype(np.float64)
    pad = buckets * k - n
    hi = np.concatenate([np.where(np.isnan(yf), -np.inf, yf), np.full(pad, -np.inf)])
    lo = np.concatenate([np.where(np.isnan(yf), np.inf, yf), np.full(pad, np.inf)])
    base = np.arange(buckets) * k
    keep = np.concatenate(
        [
            base + hi.reshape(buckets, k).argmax(axis=1),
            base + lo.reshape(buckets, k).argmin(axis=1),
            [0, n - 1],
        ]
    )
    keep = np.unique(keep[keep < n])
    return x[keep], y[keep]


def _samples(data: object) -> list[Sample] | None:
    """The Samples behind a Sampler, a History or an iterable of Samples; None otherwise."""
    history = getattr(data, "history", None)
    if history is not None and hasattr(history, "samples"):
        data = history
    if hasattr(data, "samples") and callable(data.samples):
        return list(data.samples())
    if isinstance(data, Sample):
        return [data]
    if isinstance(data, (list, tuple)) and all(isinstance(s, Sample) for s in data):
        return list(data)
    return None


def _pick_device(devices: Iterable[int], device: int | None, what: str) -> int:
    present = sorted(devices)
    if not present:
        raise ValueError(f"{what} has no device to draw")
    if device is None:
        return present[0]
    if device not in present:
        raise ValueError(f"device {device} is not in the {what} (devices: {present})")
    return device


def timeline_series(data: TimelineInput, *, device: int | None = None) -> Series:
    """The arrays `timeline` draws: ``x``, ``x_title`` and float64 columns (NaN = not known).

    Columns: ``allocated``, ``reserved``, ``nvml_used``, ``non_pytorch`` (the last two only
    from Samples with NVML); ``oom`` (x positions of OOMs); ``capacity`` (bytes or None).

    Parameters
    ----------
    data : Sampler, History, list of Sample, replay result or workload outcome
        A Sampler or History (samples of one device: ``device`` picks one when several are
        mixed), a `gpumemviz.replay` result (the recorded figures after every trace entry),
        or an `allocator.workloads.run` outcome (after every allocator step).
    device : int, optional
        Which device (default: the lowest present).

    Returns
    -------
    dict
        ``x`` (seconds, trace entries or allocator steps), ``x_title`` naming it, the columns
        above in bytes, ``oom`` and ``capacity``.

    Raises
    ------
    TypeError
        For any other input.

    Examples
    --------
    >>> from gpumemviz.allocator.workloads import inference_server, run
    >>> s = timeline_series(run(inference_server(paged=True, n_requests=2)))
    >>> s["x_title"], len(s["x"]) == len(s["reserved"]), s["oom"].tolist()
    ('allocator step', True, [])
    """
    samples = _samples(data)
    if samples is not None:
        return _series_from_samples(samples, device)
    if hasattr(data, "timelines") and hasattr(data, "devices"):
        dev = _pick_device(data.timelines, device, "replay result")
        tl = data.timelines[dev]
        rec = data.recorded.get(dev) if hasattr(data, "recorded") else None
        oom = [] if rec is None or rec.recorded_oom is None else [float(rec.recorded_oom)]
        cap = getattr(rec, "capacity", None) if getattr(rec, "capacity_known", False) else None
        return {
            "x": np.arange(len(tl.reserved), dtype=np.float64),
            "x_title": "trace entry",
            "allocated": np.asarray(tl.allocated, np.float64),
            "reserved": np.asarray(tl.reserved, np.float64),
            "oom": np.asarray(oom, np.float64),
            "capacity": cap,
        }
    if hasattr(data, "reserved") and hasattr(data, "oom_step") and hasattr(data, "capacity"):
        n = len(data.reserved)
        # the failing malloc adds no step: the cross sits at oom_step, at the last reserved
        oom = [] if data.oom_step is None else [float(data.oom_step)]
        return {
            "x": np.arange(n, dtype=np.float64),
            "x_title": "allocator step",
            "allocated": np.asarray(cast("OutcomeLike", data).allocated, np.float64),
            "reserved": np.asarray(data.reserved, np.float64),
            "oom": np.asarray(oom, np.float64),
            "capacity": int(data.capacity),
        }
    raise TypeError(
        "timeline needs a Sampler, a History, Samples, a replay result or a workload outcome, "
        f"got {type(data).__name__}"
    )


def _series_from_samples(samples: list[Sample], device: int | None) -> Series:
    devices = {s.device for s in samples}
    if len(devices) > 1 or device is not None:
        dev = _pick_device(devices, device, "history")
        samples = [s for s in samples if s.device == dev]
    t0 = samples[0].time if samples else 0.0
    rows = [s for s in samples if s.stats is not None]
    stats = [s.stats for s in rows if s.stats is not None]
    nan = float("nan")

    def nv(s: Sample, name: str) -> float:
        info = s.nvml
        if info is None or not info.available:
            return nan
        v = getattr(info, name)
        return nan if v is None else float(v)

    totals = [
        s.nvml.total
        for s in samples
        if s.nvml is not None and s.nvml.available and s.nvml.total is not None
    ]
    return {
        "x": np.asarray([s.time - t0 for s in rows], np.float64),
        "x_title": "seconds",
        "allocated": np.asarray([st.allocated for st in stats], np.float64),
        "reserved": np.asarray([st.reserved for st in stats], np.float64),
        "nvml_used": np.asarray([nv(s, "used") for s in rows], np.float64),
        "non_pytorch": np.asarray([nv(s, "non_pytorch") for s in rows], np.float64),
        "oom": np.asarray([s.time - t0 for s in samples if s.oom is not None], np.float64),
        "capacity": totals[-1] if totals else None,
    }


def _items(
    outcomes: Mapping[str, OutcomeLike] | Iterable[OutcomeLike],
) -> list[tuple[str, OutcomeLike]]:
    """(name, outcome) pairs; names default to each workload's name."""
    if isinstance(outcomes, Mapping):
        items = [(str(k), v) for k, v in outcomes.items()]
    else:
        items = [(str(o.workload), o) for o in outcomes]
    if not items:
        raise ValueError("no workload outcomes to compare")
    return items


def outcome_rows(outcomes: Mapping[str, OutcomeLike] | Iterable[OutcomeLike]) -> list[Row]:
    """One row per workload outcome: the table `workloads` draws, as plain values.

    Keys: ``variant``, ``config``, ``outcome`` ("completed" or "OOM at operation N"), ``completed``,
    ``peak_reserved``, ``peak_allocated``, ``capacity``, ``free_in_segments_at_oom`` (None
    without an OOM), ``steps``.

    Parameters
    ----------
    outcomes : {name: OutcomeLike} or iterable of OutcomeLike
        Results of `gpumemviz.allocator.workloads.run`; names default to each workload's name.

    Returns
    -------
    list of dict
        One per outcome, in the given order.

    Examples
    --------
    >>> from gpumemviz.allocator.workloads import inference_server, run
    >>> [row] = outcome_rows({"paged": run(inference_server(paged=True, n_requests=2))})
    >>> row["variant"], row["outcome"], row["free_in_segments_at_oom"]
    ('paged', 'completed', None)
    """
    return _rows(_items(outcomes))


def _rows(items: list[tuple[str, OutcomeLike]]) -> list[Row]:
    rows = []
    for name, o in items:
        completed = bool(o.completed)
        rows.append(
            {
                "variant": name,
                "config": o.config or "default settings",
                "outcome": "completed" if completed else f"OOM at operation {o.oom_step}",
                "completed": completed,
                "peak_reserved": int(o.peak_reserved),
                "peak_allocated": int(o.peak_allocated),
                "capacity": int(o.capacity),
                "free_in_segments_at_oom": o.free_in_segments_at_oom,
                "steps": int(o.steps),
            }
        )
    return rows


# --------------------------------------------------------------------------- figures


def _gib(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.float64) / GIB


def timeline(
    data: TimelineInput,
    *,
    device: int | None = None,
    title: str | None = None,
    max_points: int = MAX_POINTS,
    theme: str = "light",
) -> Plotly:  # a plotly Figure
    """Allocated, reserved, NVML used and non-PyTorch memory over time (GiB), OOMs marked.

    Parameters
    ----------
    data : Sampler, History, list of Sample, replay result or workload outcome
        See `timeline_series`. Lines with no known value (NVML without a driver, replays,
        workload runs) are left out.
    device : int, optional
        Which device (default: the lowest present).
    title : str, optional
    max_points : int
        Longer series keep each bucket's lowest and highest point, so peaks stay visible.
    theme : {"light", "dark"}
        The colours: each series has the panel's and the report's colour in that theme
        (`gpumemviz.render.palette.palette`); "dark" draws on the dark background.

    Returns
    -------
    plotly.graph_objects.Figure
        Lines in GiB (bytes / 2**30), OOMs as red crosses at the reserved figure, the
        capacity as a dashed line where known.

    Raises
    ------
    ImportError
        Without plotly ("pip install plotly"); plotly is imported on first use.
    TypeError
        For an input `timeline_series` does not read.

    Examples
    --------
    >>> from gpumemviz.allocator.workloads import run, training_loop
    >>> fig = timeline(run(training_loop(iterations=1)))
    >>> [t.name for t in fig.data]
    ['allocated', 'reserved']
    """
    go, _ = _plotly()
    colours = _colours(theme)
    s = timeline_series(data, device=device)
    fig = go.Figure()
    for key in ("allocated", "reserved", "nvml_used", "non_pytorch"):
        y = s.get(key)
        if y is None or not np.isfinite(y).any():
            continue
        x, y = _decimate(s["x"], y, max_points)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=_gib(y),
                name=LABELS[key],
                mode="lines",
                line={"color": colours[key], "dash": "dot" if key == "non_pytorch" else None},
            )
        )
    _mark_ooms(go, fig, s["x"], s["reserved"], s["oom"], colours["oom"])
    if s["capacity"] is not None:
        fig.add_hline(
            y=s["capacity"] / GIB,
            line={"color": colours["capacity"], "dash": "dash", "width": 1},
            annotation_text=f"capacity {format_size(int(s['capacity']))}",
        )
    fig.update_layout(
        title=title or "memory over time",
        xaxis_title=s["x_title"],
        yaxis_title="GiB",
        hovermode="x unified",
    )
    if theme == "dark":
        bg = palette("dark")["bg"]
        fig.update_layout(template="plotly_dark", paper_bgcolor=bg, plot_bgcolor=bg)
    return fig


def _crosses(go: Plotly, x: Floats, y: Floats, name: str, color: str, size: int = 12) -> Plotly:
    """The OOM marker every figure uses: crosses at (x, y)."""
    return go.Scatter(
        x=x, y=y, name=name, mode="markers", marker={"symbol": "x", "size": size, "color": color}
    )


def _mark_ooms(
    go: Plotly, fig: Plotly, x: np.ndarray, reserved: np.ndarray, at: Floats, colour: str
) -> None:
    """Crosses in the OOM colour at each OOM, at the reserved figure there (the last one
    before it)."""
    if not len(at):
        return
    ys = []
    for a in at:
        i = int(np.searchsorted(x, a, side="right")) - 1
        ys.append(float(reserved[i]) / GIB if 0 <= i < len(reserved) else 0.0)
    fig.add_trace(_crosses(go, np.asarray(at, np.float64), ys, "OOM", colour))


def what_if(
    result: ReplayRun,
    *,
    device: int | None = None,
    title: str | None = None,
    max_points: int = MAX_POINTS,
) -> Plotly:  # a plotly Figure
    """Recorded vs predicted reserved bytes and segments over trace entries, OOMs marked.

    Parameters
    ----------
    result : ReplayResult
        From ``gpumemviz.replay(snapshot, config=...)``. With the recorded settings the
        predicted line is the model's replay of the recording.
    device : int, optional
        Which device (default: the lowest traced).
    title : str, optional
    max_points : int
        As in `timeline`.

    Returns
    -------
    plotly.graph_objects.Figure
        Two rows sharing the x axis: reserved (GiB) and segments. Traces are named
        "recorded reserved", "predicted reserved", "recorded segments", "predicted segments",
        and "recorded OOM" / "predicted OOM" where there is one; a capacity line where it is
        known, else the title says "capacity unknown".

    Raises
    ------
    TypeError
        When `result` is not a replay result.

    Examples
    --------
    >>> from gpumemviz.allocator.model import CachingAllocator
    >>> from gpumemviz import replay
    >>> a = CachingAllocator(1 << 30)
    >>> a.free(a.malloc(3 << 20))
    >>> fig = what_if(replay(a.snapshot(), config="expandable_segments:True"))
    >>> [t.name for t in fig.data]
    ['recorded reserved', 'predicted reserved', 'recorded segments', 'predicted segments']
    """
    go, make_subplots = _plotly()
    if not (hasattr(result, "figures") and hasattr(result, "devices")):
        raise TypeError(f"what_if needs a gpumemviz.replay result, got {type(result).__name__}")
    dev = _pick_device(result.devices, device, "replay result")
    f = result.figures(dev)
    run, rec = result.devices[dev], result.recorded[dev]
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.06
    )
    lines = (
        ("recorded reserved", f["recorded_reserved"], 1, COLORS["recorded"], "GiB"),
        ("predicted reserved", f["reserved"], 1, COLORS["reserved"], "GiB"),
        ("recorded segments", f["recorded_segments"], 2, COLORS["recorded"], None),
        ("predicted segments", f["segments"], 2, COLORS["reserved"], None),
    )
    for name, y, row, color, unit in lines:
        y = np.asarray(y)
        x, y = _decimate(np.arange(len(y), dtype=np.float64), y, max_points)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=_gib(y) if unit else y,
                name=name,
                mode="lines",
                line={"color": color, "dash": "dash" if name.startswith("recorded") else None},
            ),
            row=row,
            col=1,
        )
    for name, at, y, color in (
        ("recorded OOM", rec.recorded_oom, f["recorded_reserved"], COLORS["recorded"]),
        ("predicted OOM", run.oom, f["reserved"], COLORS["oom"]),
    ):
        if at is None:
            continue
        y = np.asarray(y)
        i = min(int(at), len(y) - 1)
        cross = _crosses(go, [float(at)], [float(y[i]) / GIB if i >= 0 else 0.0], name, color, 13)
        fig.add_trace(cross, row=1, col=1)
    if run.capacity_known and run.capacity is not None:
        fig.add_hline(
            y=run.capacity / GIB,
            row=1,
            col=1,
            line={"color": COLORS["capacity"], "dash": "dot", "width": 1},
            annotation_text=f"capacity {format_size(int(run.capacity))}",
        )
    conf = run.config or "default settings"
    recorded_conf = getattr(result, "recorded_config", "") or "default settings"
    cap = "" if run.capacity_known else " (capacity unknown: no OOM possible)"
    fig.update_layout(
        title=title or f"device {dev}: recorded [{recorded_conf}] vs predicted [{conf}]{cap}",
        hovermode="x unified",
    )
    fig.update_yaxes(title_text="reserved (GiB)", row=1, col=1)
    fig.update_yaxes(title_text="segments", row=2, col=1)
    fig.update_xaxes(title_text="trace entry", row=2, col=1)
    return fig


def workloads(
    outcomes: Mapping[str, OutcomeLike] | Iterable[OutcomeLike],
    *,
    title: str | None = None,
    max_points: int = MAX_POINTS,
) -> Plotly:  # a plotly Figure
    """Workload variants side by side: peak reserved / allocated and outcome; reserved over steps.

    Parameters
    ----------
    outcomes : {name: OutcomeLike} or iterable of OutcomeLike
        Results of `gpumemviz.allocator.workloads.run` (see `outcome_rows`).
    title : str, optional
    max_points : int
        As in `timeline`, for the reserved lines.

    Returns
    -------
    plotly.graph_objects.Figure
        Left: bars "peak reserved" and "peak allocated" per variant (GiB), the outcome as bar
        text, OOM variants' reserved bars in the OOM colour, the capacity as a dashed line.
        Right: reserved over allocator steps, one line per variant, OOMs as crosses.

    Examples
    --------
    >>> from gpumemviz.allocator.workloads import inference_server, run
    >>> fig = workloads({"paged": run(inference_server(paged=True, n_requests=2))})
    >>> [t.name for t in fig.data]
    ['peak reserved', 'peak allocated', 'paged reserved']
    """
    go, make_subplots = _plotly()
    items = _items(outcomes)
    rows = _rows(items)
    names = [r["variant"] for r in rows]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.42, 0.58],
        subplot_titles=("peak memory and outcome", "reserved over allocator steps"),
        horizontal_spacing=0.1,
    )
    fig.add_trace(
        go.Bar(
            x=names,
            y=[r["peak_reserved"] / GIB for r in rows],
            name="peak reserved",
            marker_color=[COLORS["reserved"] if r["completed"] else COLORS["oom"] for r in rows],
            text=[r["outcome"] for r in rows],
            textposition="outside",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            x=names,
            y=[r["peak_allocated"] / GIB for r in rows],
            name="peak allocated",
            marker_color=COLORS["allocated"],
        ),
        row=1,
        col=1,
    )
    caps = {r["capacity"] for r in rows}
    if len(caps) == 1:
        fig.add_hline(
            y=caps.pop() / GIB,
            row=1,
            col=1,
            line={"color": COLORS["capacity"], "dash": "dash", "width": 1},
        )
    palette = ["#E69F00", "#56B4E9", "#009E73", "#0072B2", "#CC79A7", "#F0E442", "#999999"]
    for k, ((_, o), name) in enumerate(zip(items, names, strict=True)):
        y = np.asarray(o.reserved)
        x, y = _decimate(np.arange(len(y), dtype=np.float64), y, max_points)
        color = palette[k % len(palette)]
        fig.add_trace(
            go.Scatter(
                x=x, y=_gib(y), name=f"{name} reserved", mode="lines", line={"color": color}
            ),
            row=1,
            col=2,
        )
        if o.oom_step is not None and len(o.reserved):
            i = min(int(o.oom_step), len(o.reserved) - 1)
            ox, oy = [float(o.oom_step)], [float(o.reserved[i]) / GIB]
            fig.add_trace(_crosses(go, ox, oy, f"{name} OOM", COLORS["oom"]), row=1, col=2)
    fig.update_layout(title=title or "workload variants", barmode="group")
    fig.update_yaxes(title_text="GiB", row=1, col=1)
    fig.update_yaxes(title_text="GiB", row=1, col=2)
    fig.update_xaxes(title_text="allocator step", row=1, col=2)
    return fig
