"""What each example notebook must show, for tests/test_notebook.py to check after running it.

The notebooks are tutorials: they print and plot their outcomes and hold no checks. The checks
are here. For each notebook, `probes` maps a cell id to {name: expression}: the test runs the
expressions in the notebook's kernel right after that cell (so a name the notebook rebinds
later, like `fig`, is read as that cell left it) and gets their values back as JSON. `check`
asserts on those values, on the text the notebook printed and on its outputs; it raises
AssertionError when an outcome changes (tests/test_notebook.py plants such changes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbformat import NotebookNode

Values = dict[str, Any]

#: The line a probe prints before its JSON.
MARK = "gpumemviz-notebook-probe: "
GIB = 2**30


def probe_source(expressions: dict[str, str]) -> str:
    """The code of a probe cell: evaluates `expressions` in the notebook's namespace and prints
    {name: value} as JSON after MARK. `traces(fig)` maps a figure's trace names to its traces;
    numpy values go through `.tolist()`, anything else that JSON cannot hold is an error."""
    items = "".join(f"        {name!r}: {expr},\n" for name, expr in expressions.items())
    return (
        "def _gpumemviz_probe():\n"
        "    import json\n\n"
        "    def traces(fig):\n"
        "        return {t.name: t for t in fig.data}\n\n"
        "    def plain(o):\n"
        "        if hasattr(o, 'tolist'):\n"
        "            return o.tolist()\n"
        "        raise TypeError(f'a probe value of type {type(o).__name__}')\n\n"
        f"    return json.dumps({{\n{items}    }}, default=plain)\n\n\n"
        f"print({MARK!r} + _gpumemviz_probe())\n"
        "del _gpumemviz_probe\n"
    )


def _code(nb: NotebookNode) -> list[NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


@dataclass(frozen=True)
class Outcome:
    """A notebook's probes, its check after a run, and an optional check of its source."""

    probes: dict[str, dict[str, str]]
    check: Callable[[Values, str, NotebookNode], None]
    static: Callable[[NotebookNode], None] | None = None


# ------------------------------------------------------------------------------- 01 quickstart

QUICKSTART_PROBES = {
    "79a453e9": {  # after the training loop
        "running": "panel.sampler.running",
        "errors": "list(panel.errors)",
        "n_seen": "len(seen - {None})",
        "n_rows": "panel.map_layout['n_rows']",
        "segments": "panel.header['segments']",
        "gpu": "GPU",
        "demo": "panel.demo",
        "title": "panel.title",
        "reserved": "panel.header['reserved']",
        "max_reserved": "torch.cuda.max_memory_reserved() if GPU else None",
    },
    "b10f16f3": {"n_segments": "snap.n_segments"},  # the exported snapshot
    "d11d3a6f": {"sampler_after_unload": "bool(panel.sampler)"},
}


def _static_quickstart(nb: NotebookNode) -> None:
    sources = [c.source for c in _code(nb)]
    assert "%load_ext gpumemviz" in sources
    assert any(s.startswith("panel = %gpumemviz") for s in sources)


def _check_quickstart(v: Values, text: str, nb: NotebookNode) -> None:
    # the sampler ran through the loop without errors, and the header followed the allocator
    assert v["running"] and v["errors"] == [], v
    assert v["n_seen"] >= 3, v
    assert v["n_rows"] > 0 and v["segments"] > 0, v
    if v["gpu"]:
        assert not v["demo"]
        assert 0 < v["reserved"] <= v["max_reserved"], v
    else:
        assert v["demo"] and v["title"] == "simulated caching allocator (demo)", v
    assert v["n_segments"] > 0  # `%gpumemviz export` wrote a snapshot with segments
    assert not v["sampler_after_unload"]  # %unload_ext stopped the sampler
    # what the reader sees says the same
    assert f"the panel is sampling, 0 errors; source: {v['title']}" in text
    assert f"its map: {v['segments']} segments in {v['n_rows']} rows" in text
    assert "steps; the header showed" in text
    assert "gpumemviz: device 0:" in text  # %gpumemviz status
    assert "gpumemviz: wrote" in text  # %gpumemviz export
    assert f"quickstart.pickle: {v['n_segments']} segments" in text
    outputs = [o for c in _code(nb) for o in c.outputs]
    widgets = [
        o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert len(widgets) == 1  # the panel, displayed once


# ------------------------------------------------------------------- 02 fragmentation and fixes

_REPORT_FIELDS = ("allocated", "free", "pending_free", "reserved", "free_trapped", "releasable")
_REPORT = f"{{k: getattr(report, k) for k in {(*_REPORT_FIELDS, 'largest_free')!r}}}"

FRAGMENTATION_PROBES = {
    "nb02-05": {  # the OOM
        "cause": "oom.cause",
        "free_in_segments": "oom.free_in_segments",
        "request": "oom.request_size",
        "largest_free_block": "oom.largest_free_block",
        "panel_oom_cause": "panel.oom.get('cause')",
    },
    "nb02-07": {"report": _REPORT, "fit_verdict": "fit.verdict"},
    "nb02-08": {
        "advice_kinds": "[a.kind for a in advice]",
        "panel_advice_kinds": "[a['kind'] for a in panel.advice]",
    },
    "nb02-09": {  # the timeline figure
        "timeline_reserved_gib": "list(traces(fig)['reserved'].y)",
        "history_reserved_max": "sampler.history.series('reserved')[1].max()",
        "oom_marks": "len(traces(fig)['OOM'].x)",
    },
    "nb02-12": {"by": "by", "capacity": "training.capacity"},
    "nb02-13": {  # the bar chart of the five variants
        "bars_x": "list(traces(fig)['peak reserved'].x)",
        "bars_y": "list(traces(fig)['peak reserved'].y)",
        "variants": "list(outcomes)",
        "variant_peaks": "[o.peak_reserved for o in outcomes.values()]",
    },
    "nb02-15": {"has_cuda": "has_cuda", "real": "real if has_cuda else None"},
}


def _check_fragmentation(v: Values, text: str, nb: NotebookNode) -> None:
    # it is fragmentation, not capacity: more than the request is free inside reserved
    # segments, but no single free block is large enough; the panel got the OOM
    assert v["cause"] == "fragmentation", v["cause"]
    assert v["free_in_segments"] >= v["request"] > v["largest_free_block"], v
    assert v["panel_oom_cause"] == "fragmentation", v["panel_oom_cause"]
    # the report at the OOM: every free byte trapped in segments with live tensors
    r = v["report"]
    assert r["allocated"] + r["free"] + r["pending_free"] == r["reserved"], r
    assert r["free_trapped"] == r["free"] > v["request"], r
    assert r["releasable"] == 0, r
    assert r["largest_free"] < v["request"], r
    assert v["fit_verdict"] == "out_of_memory"
    # the advice, in the notebook and in the panel, starts with expandable segments
    assert v["advice_kinds"][0] == "expandable_segments", v["advice_kinds"]
    assert v["panel_advice_kinds"][:1] == ["expandable_segments"], v["panel_advice_kinds"]
    # the timeline carries the history's own numbers (GiB), and marks the one OOM
    assert max(v["timeline_reserved_gib"]) * GIB == v["history_reserved_max"]
    assert v["oom_marks"] == 1
    # the fixes: the run as is dies with memory free in its segments; every fix completes
    by = v["by"]
    base = by["as is (batch 8)"]
    assert not base["completed"] and base["free_in_segments_at_oom"] > v["request"], base
    for name in list(by)[1:]:
        assert by[name]["completed"], name
        assert by[name]["peak_reserved"] <= v["capacity"], name
    # expandable segments: the same tensors, but reserved stays close to allocated
    cached = {k: r["peak_reserved"] - r["peak_allocated"] for k, r in by.items()}
    assert cached["expandable_segments:True"] < cached["as is (batch 8)"], cached
    # checkpointing and a smaller batch need far less memory in the first place
    assert by["activation checkpointing"]["peak_allocated"] < 0.5 * base["peak_allocated"]
    assert by["batch 4"]["peak_allocated"] < base["peak_allocated"]
    # the bar chart shows each variant's own peak
    assert v["bars_x"] == v["variants"]
    assert [round(y * GIB) for y in v["bars_y"]] == v["variant_peaks"]
    # on a GPU, the model predicts what the GPU does
    if v["has_cuda"]:
        for name, got in v["real"].items():
            assert "skipped" in got or got["completed"] == by[name]["completed"], name
    # what the reader sees says the same
    assert "cause: fragmentation" in text
    assert "the panel's verdict: fragmentation" in text
    assert "the panel's advice starts with: expandable_segments" in text
    assert f"{len(by) - 1} of {len(by) - 1} fixes complete within" in text


# ----------------------------------------------------------------------- 03 replay a snapshot

REPLAY_PROBES = {
    "nb03-02": {"path_name": "path.name"},
    "nb03-04": {  # the final state
        "report": _REPORT,
        "segments_total": "int(snap.segments.total_size.sum())",
    },
    "nb03-06": {  # the replay
        "allocs": "result.allocs",
        "allocs_matched": "result.allocs_matched",
        "peak_reserved": "peak_report.reserved",
        "peak_allocated": "peak_report.allocated",
        "tl_reserved_at_peak": "tl.reserved[peak]",
        "tl_reserved_max": "tl.reserved.max()",
        "tl_allocated_at_peak": "tl.allocated[peak]",
        "last_entry_reserved": (
            "gpumemviz.fragmentation(result.snapshot_at(len(tl) - 1, device)).reserved"
        ),
        "recorded_final_reserved": (
            "sum(int(s) for d, s in zip(snap.segments.device, snap.segments.total_size)"
            " if d == device)"
        ),
    },
    "nb03-08": {"panel_reserved": "panel.header['reserved']"},
    "nb03-09": {"timeline_reserved_gib": "list(traces(fig)['reserved'].y)"},
    "nb03-11": {  # the exports
        "copy_reads_back_equal": "gpumemviz.load_snapshot(whole).to_torch() == snap.to_torch()",
        "json_allocated": "gpumemviz.fragmentation(as_json).allocated",
        "peak_file_reserved": "gpumemviz.fragmentation(peak_file).reserved",
    },
    "nb03-12": {
        "has_export": "export is not None",
        "shared_blocks": "gpumemviz.load_snapshot(shared).n_blocks if export else None",
        "blocks": "snap.n_blocks",
        "csv_rows": "n_rows if export else None",
        "trace_entries": "sum(len(t) for t in snap.traces.values())",
    },
    "nb03-13": {
        "has_report": "report_fn is not None",
        "html_size": "html.stat().st_size if report_fn else None",
    },
    "nb03-15": {  # what if: expandable segments, unlimited
        "predicted_peak": "predicted_peak",
        "recorded_peak": "recorded_peak",
        "what_if_names": "sorted(t.name for t in fig.data)",
    },
    "nb03-17": {"need": "need", "n_budgets": "len(budgets)"},
    "nb03-19": {  # just under the recorded settings' smallest budget
        "as_recorded_oom": "as_recorded.devices[device].oom",
        "expandable_oom": "expandable.devices[device].oom",
        "marked": "'predicted OOM' in {t.name for t in fig.data}",
    },
    "nb03-21": {"pool_figures": "pool_figures"},  # the two private-pool workloads
    "nb03-23": {  # the RL recording replayed, pool by pool
        "rl_allocs": "rl_device.allocs",
        "rl_matched": "rl_device.allocs_matched",
        "rl_pools": "sorted(str(p) for p in rl_device.pool_peak_reserved)",
        "rl_expandable_pools": (
            "sorted(str(p) for p in rl_expandable.devices[0].pool_peak_reserved)"
        ),
    },
}


def _check_replay(v: Values, text: str, nb: NotebookNode) -> None:
    assert v["path_name"] == "standin__training_10k.pickle"  # the shipped stand-in was found
    r = v["report"]
    assert r["allocated"] + r["free"] + r["pending_free"] == r["reserved"], r
    assert r["reserved"] == v["segments_total"], r
    # with the recorded settings, the model makes every decision the real allocator made
    assert v["allocs_matched"] == v["allocs"] > 0, v
    # the snapshot at the peak entry is the timeline's peak
    assert v["peak_reserved"] == v["tl_reserved_at_peak"] == v["tl_reserved_max"], v
    assert v["peak_allocated"] == v["tl_allocated_at_peak"], v
    # the last entry is the recorded final state
    assert v["last_entry_reserved"] == v["recorded_final_reserved"], v
    # the panel paused on the peak shows it; so does the timeline figure (GiB)
    assert v["panel_reserved"] == v["tl_reserved_at_peak"], v
    assert round(max(v["timeline_reserved_gib"]) * GIB) == v["tl_reserved_max"]
    # each export reads back
    assert v["copy_reads_back_equal"]
    assert v["json_allocated"] == v["tl_allocated_at_peak"]
    assert v["peak_file_reserved"] == v["tl_reserved_at_peak"]
    assert v["has_export"], "gpumemviz.export is missing: the notebook skipped its exports"
    assert v["shared_blocks"] == v["blocks"]
    assert v["csv_rows"] == v["trace_entries"]
    assert v["has_report"], "gpumemviz.report is missing: the notebook skipped the HTML report"
    assert v["html_size"] > 0
    # what if: unlimited, expandable segments reach the recorded peak
    assert v["predicted_peak"] == v["recorded_peak"], v
    assert {"recorded reserved", "predicted reserved"} <= set(v["what_if_names"])
    # under budgets, expandable segments get through on a smaller GPU
    need = v["need"]
    assert need["expandable"] < need["recorded settings"] < v["n_budgets"], need
    assert v["as_recorded_oom"] is not None
    assert v["expandable_oom"] is None
    assert v["marked"] == (v["as_recorded_oom"] is not None)
    # what the reader sees says the same
    assert f"{v['allocs']}/{v['allocs']} allocs end to end" in text
    assert f"recorded settings: OOM at entry {v['as_recorded_oom']}" in text
    assert "  expandable:        completes" in text
    assert "OOM at entry None" not in text  # a run that completes says so
    # private pools: graph 2 still holds the graph pool; the weights' MemPool keeps its blocks
    figs = v["pool_figures"]
    assert figs["cuda_graph"] == {"(0, 0)": 0, "(1, 0)": figs["cuda_graph"]["(1, 0)"]}, figs
    assert figs["cuda_graph"]["(1, 0)"] > 0  # empty_cache gave back the eager memory only
    assert figs["rl_mempools"]["(0, 1)"] > 0 and set(figs["rl_mempools"]) == {"(0, 0)", "(0, 1)"}
    # the RL trace replays at the recorded addresses, each alloc in its pool (the KV cache's
    # deleted pools inferred as unnamed ones), under the new settings too
    assert v["rl_matched"] == v["rl_allocs"] > 1000, v
    assert {"(0, 0)", "(0, 1)"} <= set(v["rl_pools"]) and "(-1, 1)" in v["rl_pools"], v
    assert v["rl_expandable_pools"] == v["rl_pools"]
    assert "peak reserved per pool:" in text


# ------------------------------------------------------------------------- 04 paged KV cache

PAGED_PROBES = {
    "nb04-02": {
        "requests_contiguous": "contiguous.params['requests']",
        "requests_paged": "params['requests']",
    },
    "nb04-04": {"waste": "waste"},
    "nb04-06": {  # both servers in 22 GiB
        "contiguous_completed": "outcomes['contiguous'].completed",
        "paged_completed": "outcomes['paged'].completed",
        "paged_peak": "outcomes['paged'].peak_reserved",
        "paged_capacity": "paged.capacity",
        "bar_text": "list(traces(fig)['peak reserved'].text)",
        "contiguous_oom_step": "outcomes['contiguous'].oom_step",
    },
    "nb04-08": {"ooms": "ooms", "summary": "summary"},  # both in 80 GiB
    "nb04-09": {"n_traces": "len(fig.data)", "first_trace_max_gib": "max(fig.data[0].y)"},
    "nb04-11": {
        "final": "{k: getattr(final, k) for k in ('allocated', 'free', 'pending_free', "
        "'reserved')}",
    },
}


def _check_paged(v: Values, text: str, nb: NotebookNode) -> None:
    assert v["requests_contiguous"] == v["requests_paged"]  # the same requests for both
    waste = v["waste"]
    assert waste["paged"] < 0.05 < 0.2 < waste["contiguous"], waste
    # in 22 GiB the contiguous cache runs out of memory; the paged one completes within it
    assert not v["contiguous_completed"]
    assert v["paged_completed"]
    assert v["paged_peak"] <= v["paged_capacity"]
    assert v["bar_text"] == [f"OOM at operation {v['contiguous_oom_step']}", "completed"]
    # in 80 GiB both complete
    assert v["ooms"] == {"contiguous": 0, "paged": 0}, v["ooms"]
    s = v["summary"]
    # the same requests served with less memory, and less of it idle in the cache
    assert s["paged"]["peak"] < s["contiguous"]["peak"], s
    assert s["paged"]["idle"] < s["contiguous"]["idle"], s
    # ... although the paged cache's free memory is cut into more pieces
    assert s["paged"]["index"] > 0.5, s
    # the figure: four lines per server, in GiB
    assert v["n_traces"] == 8
    assert v["first_trace_max_gib"] * GIB == s["contiguous"]["peak"]
    f = v["final"]
    assert f["allocated"] + f["free"] + f["pending_free"] == f["reserved"], f
    # what the reader sees says the same
    assert f"{len(v['requests_paged'])} requests, the same for both caches" in text
    assert "contiguous: 0 OOMs" in text and "paged: 0 OOMs" in text


# ------------------------------------------------------------------------------- 05 will it fit

FIT_PROBES = {
    "nb05-06": {  # one estimate: batch 8 on an H100
        "fits": "est.fits",
        "peak": "est.peak_allocated",
        "start": "est.start_allocated",
        "workspaces": "est.workspaces",
        "capacity": "est.capacity",
    },
    "nb05-08": {  # the largest batch, both settings
        "batches": "dict(fit)",
        "meta_runs": "fit.meta_runs",
        "segments": "{c: e.segments for c, e in fit.estimates.items()}",
        "reserved": "{c: e.peak_reserved for c, e in fit.estimates.items()}",
        "allocated": "{c: e.peak_allocated for c, e in fit.estimates.items()}",
    },
    "nb05-10": {  # the panel on the predicted peak
        # the writer thread draws the panel: wait for it before reading what it shows
        "panel_segments": "(panel.flush(), panel.header['segments'])[1]",
        "panel_reserved": "panel.header['reserved']",
        "panel_title": "panel.title",
        "fit_verdict": "panel.command('fit', value='1GiB')['verdict']",
        # the hover's stack of each block: its lines and which one is the user's
        "user_lines": "[(lambda ls, u: ls[u] if u is not None else None)(*__import__("
        "'gpumemviz.render.stacks', fromlist=['x']).stack_lines(list(f))) "
        "for f in best.snapshot.block_frames() if f]",
        "errors": "list(panel.errors)",
    },
}


def _check_fit(v: Values, text: str, nb: NotebookNode) -> None:
    default, expandable = "", "expandable_segments:True"
    # batch 8 fits, with the forward's and the backward's cuBLAS workspaces
    assert v["fits"] and v["workspaces"] == 2
    assert v["start"] < v["peak"] <= v["capacity"] == 79 * GIB
    b = v["batches"]
    assert set(b) == {default, expandable}, b
    assert all(8 < n < 64 for n in b.values()), b
    # two meta runs and one per answer (the sizes are affine in the batch)
    assert v["meta_runs"] <= 2 + len(b)
    for config in b:
        assert v["allocated"][config] > v["peak"]  # a bigger batch than 8
        assert v["reserved"][config] <= 79 * GIB
    # expandable segments hold the peak in far fewer segments, with less reserve
    assert v["segments"][expandable] < v["segments"][default] // 10, v["segments"]
    assert v["reserved"][expandable] < v["reserved"][default]
    # the panel shows the state at the default's allocated peak (reserved peaks later or then)
    assert v["panel_segments"] == v["segments"][default]
    assert v["allocated"][default] <= v["panel_reserved"] <= v["reserved"][default]
    # ... and its title says so, with the peak reserved the table shows beside it
    gib = v["reserved"][default] / GIB
    assert v["panel_title"].startswith("predicted state at peak allocated ("), v["panel_title"]
    assert v["panel_title"].endswith(f"peak reserved {gib:.2f} GiB"), v["panel_title"]
    assert v["errors"] == []
    assert v["fit_verdict"] != "room_unknown"  # the panel knows the estimate's capacity
    # the user's lines are the notebook's cells, not ipykernel's temporary files
    users = [line for line in v["user_lines"] if line is not None]
    assert users and all(re.fullmatch(r"cell \[\d+\], line \d+: \S+", u) for u in users), users
    assert "largest batch that fits in 79.00 GiB" in text
    assert "estimate on 79.00 GiB (default settings, arch 9.0): fits" in text


#: notebook file name -> what it must show
OUTCOMES: dict[str, Outcome] = {
    "01_quickstart.ipynb": Outcome(QUICKSTART_PROBES, _check_quickstart, _static_quickstart),
    "02_fragmentation_and_fixes.ipynb": Outcome(FRAGMENTATION_PROBES, _check_fragmentation),
    "03_replay_a_snapshot.ipynb": Outcome(REPLAY_PROBES, _check_replay),
    "04_paged_kv_cache.ipynb": Outcome(PAGED_PROBES, _check_paged),
    "05_will_it_fit.ipynb": Outcome(FIT_PROBES, _check_fit),
}
