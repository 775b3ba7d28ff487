"""Write example_notebooks/02..05 (outputs stripped) from the cell sources below.

Run from the repository root: ``.venv/bin/python tools/make_notebooks.py``. The notebooks are
the committed artifact; this script keeps their cells reviewable as Python. Cell ids are fixed so
that regenerating an unchanged notebook gives the same file, and tests/notebook_outcomes.py reads
each notebook's outcomes after the cells with those ids: the notebooks print and plot them, the
checks live there.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import nbformat

OUT = Path(__file__).resolve().parents[1] / "example_notebooks"

PEP723 = """\
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "gpumemviz[widget,plot]",
#     "torch",
# ]
# ///
# The dependency block above lets `uv run`/`juv` set up this notebook's environment.
"""


def md(text: str) -> tuple[str, str]:
    return ("markdown", textwrap.dedent(text).strip("\n"))


def code(text: str) -> tuple[str, str]:
    return ("code", textwrap.dedent(text).strip("\n"))


# --------------------------------------------------------------------------- 02

NB02 = [
    code(PEP723),
    md("""
    # 02 · Fragmentation, and how to fix it

    A training loop runs out of memory **while its reserved memory still has gigabytes free**.
    This notebook shows why, on gpumemviz's CPU model of PyTorch's caching allocator (no GPU
    needed), and then tries the usual fixes side by side: `expandable_segments:True`,
    activation checkpointing, a smaller batch (and `max_split_size_mb`, which the advice
    suggests). Each cell prints the numbers behind what it shows.
    """),
    code("""
    import time

    import gpumemviz
    from gpumemviz.allocator.workloads import WORKLOADS, run
    from gpumemviz.live.sources.simulated import SimulatedSource
    from gpumemviz import format_size

    training = WORKLOADS["training"]
    print(training.description)
    print("capacity:", format_size(training.capacity), "| settings:", training.config or "default")
    """),
    md("""
    ## The run that dies

    The simulated source runs the workload on the allocator model. We drive it step by step and
    read a sample after every chunk, so the run is the same every time. The live panel follows
    the same sampler and redraws as the cell runs.
    """),
    code("""
    from IPython.display import display

    source = SimulatedSource(training, autostart=False, loop=False)
    panel = gpumemviz.monitor(source=source, interval=0.5)
    display(panel)  # shown now, so it redraws while the loop below runs
    sampler = panel.sampler
    while source.step(400) == 400:  # the last chunk stops early: the workload ran out of memory
        sampler.sample_once(segments=False)
    # the sampler's thread turns the OOM (caught in the allocating thread) into a sample
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(s.oom for s in sampler.history.samples()):
        time.sleep(0.05)
    panel.flush()
    sampler.sample_once(segments=True)
    sampler.stop()
    panel.flush()
    print(f"{sampler.counters['ticks']} reads; the panel shows the state at the OOM")
    """),
    code("""
    oom = source.ooms[-1]
    print("cause:", oom.cause)
    print(oom.explanation)

    # It is fragmentation, not capacity: more than the request is free inside reserved
    # segments, but no single free block is large enough (the explanation gives the numbers).
    # The panel got the OOM too (its header shows the verdict):
    print("the panel's verdict:", panel.oom.get("cause"))
    """),
    md("""
    ## The fragmentation report

    The snapshot taken at the moment of the OOM says where the free memory is: all of it is
    *trapped* in segments that still hold live tensors (the allocator already released every
    empty segment before it gave up), and `can_fit` replays the allocator's decision.
    """),
    code("""
    report = gpumemviz.fragmentation(oom.snapshot)
    for name in ("reserved", "allocated", "free", "free_trapped", "releasable", "largest_free"):
        print(f"{name:>13}: {format_size(getattr(report, name))}")
    print(f"external fragmentation: {report.external_fragmentation:.0%}")
    fit = report.can_fit(oom.request_size, device_free=oom.device_free)
    print(fit.verdict, "-", fit.explanation)
    """),
    code("""
    advice = gpumemviz.advise(report)
    for a in advice:
        print(f"[{a.kind}] {a.message}")
    print("the panel's advice starts with:", panel.advice[0]["kind"] if panel.advice else None)
    """),
    code("""
    fig = gpumemviz.plots.timeline(sampler, title="training until the OOM (demo data)")
    fig
    """),
    md("""
    ## Four fixes, side by side

    The same workload under other settings or with a changed program. `run` drives a fresh
    allocator model through each one until it completes or runs out of memory.
    """),
    code("""
    variants = {
        "as is (batch 8)": training,
        "expandable_segments:True": WORKLOADS["training_expandable"],
        "max_split_size_mb:64": training.with_config("max_split_size_mb:64"),
        "activation checkpointing": WORKLOADS["training_checkpointed"],
        "batch 4": WORKLOADS["training_small_batch"],
    }
    outcomes = {name: run(w) for name, w in variants.items()}
    rows = gpumemviz.plots.outcome_rows(outcomes)

    from IPython.display import Markdown

    table = [
        "| variant | settings | peak reserved | peak allocated | outcome |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['variant']} | {r['config']} | {format_size(r['peak_reserved'])} "
            f"| {format_size(r['peak_allocated'])} | {r['outcome']} |"
        )
    Markdown("\\n".join(table))
    """),
    code("""
    by = {r["variant"]: r for r in rows}
    base = by["as is (batch 8)"]
    print(f"as is: {base['outcome']}, with {format_size(base['free_in_segments_at_oom'])} "
          "free inside its segments")
    fixed = [name for name in list(by)[1:] if by[name]["completed"]]
    print(f"{len(fixed)} of {len(by) - 1} fixes complete within {format_size(training.capacity)}")
    # expandable segments: the same tensors, but reserved stays close to allocated
    cached = {k: r["peak_reserved"] - r["peak_allocated"] for k, r in by.items()}
    for name in ("as is (batch 8)", "expandable_segments:True"):
        print(f"{name}: reserved beyond allocated at the peak {format_size(cached[name])}")
    # checkpointing and a smaller batch need far less memory in the first place
    for name in ("activation checkpointing", "batch 4"):
        share = by[name]["peak_allocated"] / base["peak_allocated"]
        print(f"{name}: peak allocated {share:.0%} of the original's")
    """),
    code("""
    fig = gpumemviz.plots.workloads(outcomes, title="the same training loop, five ways")
    fig
    """),
    md("""
    ## Optional: the same programs on a real GPU

    When a CUDA device exists, each variant's exact allocation sequence is replayed with
    `torch.empty` in a fresh process (`PYTORCH_CUDA_ALLOC_CONF` is read when CUDA starts), capped
    at the model's capacity with `torch.cuda.set_per_process_memory_fraction`. Without a GPU the
    cell says so and does nothing.
    """),
    code("""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False

    PROGRAM = '''
    import json, sys, torch
    from gpumemviz.allocator.workloads import WORKLOADS
    name, config = sys.argv[1], sys.argv[2]
    w = WORKLOADS[name].with_config(config)
    free, total = torch.cuda.mem_get_info()
    if free < w.capacity:  # a smaller or busy GPU cannot give the model's capacity
        print(json.dumps({"skipped": f"{free} bytes free, the workload assumes {w.capacity}"}))
        sys.exit(0)
    torch.cuda.set_per_process_memory_fraction(w.capacity / total)
    streams, live, completed = {0: torch.cuda.current_stream()}, {}, True
    try:
        for op in w.ops():
            if op[0] == "malloc":
                if op[3] not in streams:
                    streams[op[3]] = torch.cuda.Stream()
                with torch.cuda.stream(streams[op[3]]):
                    live[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
            elif op[0] == "free":
                del live[op[1]]
            elif op[0] == "empty_cache":
                torch.cuda.empty_cache()
    except torch.OutOfMemoryError:
        completed = False
    torch.cuda.synchronize()
    print(json.dumps({"completed": completed,
                      "peak_reserved": torch.cuda.max_memory_reserved()}))
    '''

    CATALOGUE = {  # variant -> (catalogue workload whose program it runs); config is w.config
        "as is (batch 8)": "training",
        "expandable_segments:True": "training_expandable",
        "max_split_size_mb:64": "training",
        "activation checkpointing": "training_checkpointed",
        "batch 4": "training_small_batch",
    }

    if not has_cuda:
        print("no CUDA device here: the real-GPU comparison is skipped")
    else:
        pkg_root = str(Path(gpumemviz.__file__).resolve().parents[1])
        real = {}
        for name, w in variants.items():
            key = CATALOGUE[name]
            env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
            env["PYTHONPATH"] = os.pathsep.join([pkg_root, os.environ.get("PYTHONPATH", "")])
            if w.config:
                env["PYTORCH_CUDA_ALLOC_CONF"] = w.config
            out = subprocess.run([sys.executable, "-c", PROGRAM, key, w.config], env=env,
                                 capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-2000:])
            real[name] = json.loads(out.stdout.strip().splitlines()[-1])
            if "skipped" in real[name]:
                print(f"{name:>26}: skipped ({real[name]['skipped']})")
                continue
            model = by[name]
            print(f"{name:>26}: GPU {'completed' if real[name]['completed'] else 'OOM':9} "
                  f"peak reserved {format_size(real[name]['peak_reserved']):>10} | model "
                  f"{model['outcome']:>18}, {format_size(model['peak_reserved'])}")
        ran = [name for name, got in real.items() if "skipped" not in got]
        agree = [name for name in ran if real[name]["completed"] == by[name]["completed"]]
        print(f"the model predicted what the GPU did for {len(agree)} of {len(ran)} variants")
    """),
]

# --------------------------------------------------------------------------- 03

NB03 = [
    code(PEP723),
    md("""
    # 03 · Replay a recorded snapshot

    A snapshot recorded on a GPU with `torch.cuda.memory._record_memory_history()` holds the
    allocator's segments *and* the trace of every allocation that led there. gpumemviz replays
    that trace on its allocator model, so on a laptop you can scrub back to any moment, inspect
    it, export it, and ask what other allocator settings would have done.

    The file here ships with gpumemviz's source (`tests/data/standin/`): a GPT-2-shaped
    training loop in torch's snapshot format, its trace a 10,000-entry ring (as
    `max_entries=10000` records it, so it starts mid-run) with an `empty_cache()` half-way and
    the segments that grow back after it. It is made by the allocator model
    (`tools/make_standins.py`), as no real training trace with a licence to ship it was found.
    Set `path` to a recording of your own to replay that instead.
    """),
    code("""
    from pathlib import Path

    import gpumemviz

    NAME = "standin__training_10k.pickle"  # a training loop's ring trace, default settings


    def find(*parts):
        \"\"\"The first existing path under the notebook's folder or one of its parents (then
        under the gpumemviz source checkout's, for a copy of this notebook run elsewhere).\"\"\"
        here = [Path.cwd(), *Path.cwd().parents]
        package = Path(gpumemviz.__file__).resolve()
        for base in [*here, *package.parents]:
            if (base / Path(*parts)).exists():
                return base / Path(*parts)
        return None


    path = find("tests", "data", "standin", NAME)  # in the gpumemviz source checkout
    if path is None:
        raise FileNotFoundError(f"{NAME} not found: run this in a gpumemviz checkout or set `path`")
    print("snapshot:", path.name)
    """),
    md("## Inspect the final state"),
    code("""
    from gpumemviz import format_size

    snap = gpumemviz.load_snapshot(path)
    report = gpumemviz.fragmentation(snap)
    print(f"{snap.n_segments} segments, {snap.n_blocks} blocks, trace entries:",
          {d: len(t) for d, t in snap.traces.items()})
    for name in ("reserved", "allocated", "free", "free_trapped", "releasable", "largest_free"):
        print(f"{name:>13}: {format_size(getattr(report, name))}")
    for a in gpumemviz.advise(report):
        print(f"[{a.kind}] {a.message}")
    """),
    md("""
    ## Time travel

    `gpumemviz.replay` rebuilds the segments before the first trace entry and replays every
    entry with the recorded settings; it checks each of the model's decisions against the
    recording. `snapshot_at(i)` is the state after entry `i`.
    """),
    code("""
    import numpy as np

    result = gpumemviz.replay(path)
    # with the recorded settings, the model makes every decision the real allocator made
    print(result.summary())
    device = min(result.timelines)
    tl = result.timelines[device]
    peak = int(np.argmax(tl.reserved))
    at_peak = result.snapshot_at(peak, device)
    peak_report = gpumemviz.fragmentation(at_peak)
    print(f"entry {peak} of {len(tl)}: reserved {format_size(peak_report.reserved)}, "
          f"allocated {format_size(peak_report.allocated)}")
    """),
    md("""
    The same scrubbing drives the live panel: a `PlaybackSource` plays the trace back (here it is
    paused on the peak; `source.play()` would run it at its own pace).
    """),
    code("""
    from gpumemviz.live.sources.playback import PlaybackSource

    source = PlaybackSource(path, device=device)
    source.seek(peak)  # paused on the peak; the panel's sampler reads it from its first tick
    panel = gpumemviz.monitor(source=source, interval=0.5)
    panel.sampler.sample_once(segments=True)
    panel.sampler.stop()
    panel.flush()
    panel
    """),
    code("""
    fig = gpumemviz.plots.timeline(result, device=device, title="recorded memory, entry by entry")
    fig
    """),
    md("## Export"),
    code("""
    import tempfile

    from gpumemviz.snapshot import Snapshot

    out = Path(tempfile.mkdtemp(prefix="gpumemviz-nb03-"))
    whole = gpumemviz.save_snapshot(snap, out / "copy.pickle")  # protocol 4, memory_viz reads it
    # JSON of the segments alone (the frames of a whole trace make JSON large)
    as_json = gpumemviz.save_snapshot(Snapshot.from_torch(at_peak["segments"]), out / "peak.json")
    peak_file = gpumemviz.save_snapshot(Snapshot.from_torch(at_peak), out / "at_peak.pickle")
    for p in (whole, as_json, peak_file):
        print(f"{p.name}: {format_size(p.stat().st_size)}")
    # each reads back with load_snapshot, or straight into fragmentation()
    print("peak.json, read back:", format_size(gpumemviz.fragmentation(as_json).allocated),
          "allocated")
    """),
    code("""
    # gpumemviz.export: a pickle with home directories and user names redacted (for sharing),
    # and the trace as a CSV table, one row per entry. Skipped where this version lacks it.
    try:
        from gpumemviz.reporting.export import export
    except ImportError:
        export = None
    if export is None:
        print("gpumemviz.export is not in this version: redacted and CSV exports skipped")
    else:
        shared = export(snap, out / "shared.pickle", redact_paths=True)
        table = export(snap, out / "trace.csv")
        with open(table) as f:
            n_rows = sum(1 for _ in f) - 1  # the first line is the header
        print(f"{shared.name}: {format_size(shared.stat().st_size)}, "
              f"{table.name}: {format_size(table.stat().st_size)} ({n_rows} trace entries)")
    """),
    code("""
    # gpumemviz.report: one self-contained HTML file that opens offline. Skipped where this
    # version lacks it.
    report_fn = getattr(gpumemviz, "report", None)
    if report_fn is None:
        print("gpumemviz.report is not in this version: HTML export skipped")
    else:
        html = Path(report_fn(path, out / "report.html"))
        print("HTML report:", html, format_size(html.stat().st_size))
    """),
    md("""
    ## What if?

    Replay the same program under `expandable_segments:True`. Segment addresses are then
    invented, so only address-free figures are compared: reserved and segments over time, the
    peak, and whether it runs out of memory under a capacity.
    """),
    code("""
    what_if = gpumemviz.replay(path, config="expandable_segments:True")
    print(what_if.summary())
    recorded_peak = result.recorded_peak_reserved(device)
    predicted_peak = what_if.devices[device].peak_reserved
    print(f"peak reserved: recorded {format_size(recorded_peak)}, "
          f"with expandable segments {format_size(predicted_peak)}")
    # nothing limits either run, so neither has to give cached memory back: the same peak
    fig = gpumemviz.plots.what_if(what_if, device=device)
    fig
    """),
    md("""
    The capacity of the recording's GPU is unknown here (it never ran out), so nothing can run
    out of memory, and the peaks alone do not tell the two settings apart. Give both runs the
    same budgets, from the most memory the run ever had allocated up to the recorded peak: how
    small a GPU would each setting get through the run on?
    """),
    code("""
    def oom_at(config, budget):
        return gpumemviz.replay(path, config=config, capacity=budget).devices[device].oom


    budgets = np.linspace(int(tl.allocated.max()), recorded_peak, 11).astype(np.int64)
    settings = {
        "recorded settings": result.recorded_config,
        "expandable": "expandable_segments:True",
    }
    ooms = {name: [oom_at(config, int(b)) for b in budgets] for name, config in settings.items()}
    print(f"{'budget':>11}" + "".join(f"{name:>20}" for name in settings))
    for i, b in enumerate(budgets):
        cells = ("completes" if o[i] is None else f"OOM at entry {o[i]}" for o in ooms.values())
        print(f"{format_size(int(b)):>11}" + "".join(f"{c:>20}" for c in cells))


    def completes_from(got):
        \"\"\"The index of the smallest budget from which every larger one completes.\"\"\"
        i = len(got)
        while i > 0 and got[i - 1] is None:
            i -= 1
        return i


    need = {name: completes_from(got) for name, got in ooms.items()}
    print("smallest budget that completes:",
          {name: format_size(int(budgets[i])) for name, i in need.items()})
    """),
    md("""
    Just under the smallest budget that the recorded settings complete in, they run out of
    memory; expandable segments still fit.
    """),
    code("""
    budget = int(budgets[need["recorded settings"] - 1])
    as_recorded = gpumemviz.replay(path, config=result.recorded_config, capacity=budget)
    expandable = gpumemviz.replay(path, config="expandable_segments:True", capacity=budget)
    print("budget", format_size(budget))
    print("  recorded settings: OOM at entry", as_recorded.devices[device].oom)
    print("  expandable:        OOM at entry", expandable.devices[device].oom)
    fig = gpumemviz.plots.what_if(as_recorded, device=device)  # marks the predicted OOM
    fig
    """),
    md("""
    ## Private pools: CUDA graphs and MemPools

    CUDA graphs capture into a private pool, and RL frameworks keep weights and the KV cache in
    `torch.cuda.MemPool`s. A block freed in a pool is reused only inside it, and the pool's
    memory goes back to the GPU only once the pool is released (graphs reset, MemPool deleted)
    **and** `empty_cache` runs. Two workloads of the catalogue show it: a CUDA graph captured,
    replayed and shared by a second graph, and an RL loop that offloads and reloads its weights
    and KV cache between rollout and training.
    """),
    code("""
    from gpumemviz.allocator.model import CachingAllocator
    from gpumemviz.allocator.workloads import WORKLOADS, run

    pooled, pool_figures = {}, {}
    for name in ("cuda_graph", "rl_mempools"):
        w = WORKLOADS[name]
        model = CachingAllocator(w.capacity, w.config)
        print(run(w, model).summary())
        pooled[name] = model.snapshot()
        pool_figures[name] = {str(pid): size for pid, size in model.pool_reserved().items()}
        for pid, size in pool_figures[name].items():
            print(f"    pool {pid}: {format_size(size)} reserved at the end")
    """),
    md("""
    The graph's pool still holds its memory after the first graph was reset: the second graph
    shares it. The weights' MemPool keeps its blocks cached while the weights are offloaded, so
    reloading puts them back at the same addresses; the KV cache's pools were deleted before
    each training step, so their memory went back. A trace does not say which pool an
    allocation went to: replay infers it from the segments' pool ids, and a what-if replays
    every pool under the new settings.
    """),
    code("""
    rl = gpumemviz.replay(pooled["rl_mempools"])
    rl_device = rl.devices[0]
    print(rl.summary())
    print("peak reserved per pool:",
          {str(p): format_size(v) for p, v in rl_device.pool_peak_reserved.items()})
    rl_expandable = gpumemviz.replay(pooled["rl_mempools"], config="expandable_segments:True")
    print("with expandable_segments:True:",
          {str(p): format_size(v) for p, v in rl_expandable.devices[0].pool_peak_reserved.items()})
    """),
]

# --------------------------------------------------------------------------- 04

NB04 = [
    code(PEP723),
    md("""
    # 04 · Paged KV cache vs contiguous buffers

    An LLM server keeps every request's attention keys and values (the KV cache) on the GPU.
    A *contiguous* cache gives each request one buffer sized for its prompt plus the generation
    limit, up front. A *paged* cache (vLLM's PagedAttention) grows in fixed-size pages as
    tokens are made. Same requests, same model shape, same 22 GiB: what changes in waste and
    fragmentation? All on the allocator model, no GPU needed.
    """),
    code("""
    import math

    import gpumemviz
    from gpumemviz.allocator.workloads import WORKLOADS, run
    from gpumemviz import format_size

    contiguous, paged = WORKLOADS["inference_contiguous"], WORKLOADS["inference_paged"]
    print(paged.description)
    params = paged.params
    per_token = params["shape"].kv_bytes_per_token()
    page_tokens = params["page_tokens"]
    print(f"KV cache per token: {format_size(per_token)}; page: {page_tokens} tokens "
          f"= {format_size(page_tokens * per_token)}")
    print(len(params["requests"]), "requests, the same for both caches")
    """),
    md("""
    ## Waste by construction

    Each request has a prompt and an output length. The contiguous cache holds prompt + the
    generation limit for its whole life; the paged one holds the tokens it made, rounded up to
    a page. The share of KV memory that never holds a token:
    """),
    code("""
    requests = params["requests"]
    tokens = sum(p + o for p, o in requests)
    held_contiguous = sum(p + contiguous.params["max_new_tokens"] for p, o in requests)
    held_paged = sum(math.ceil((p + o) / page_tokens) * page_tokens for p, o in requests)
    waste = {"contiguous": 1 - tokens / held_contiguous, "paged": 1 - tokens / held_paged}
    for k, v in waste.items():
        print(f"{k:>10}: {v:.1%} of KV memory reserved for tokens never made")
    """),
    md("## Serving all requests in 22 GiB"),
    code("""
    outcomes = {"contiguous": run(contiguous), "paged": run(paged)}
    for name, o in outcomes.items():
        print(f"{name:>10}: {o.summary()}")

    fig = gpumemviz.plots.workloads(outcomes, title="KV cache: contiguous vs paged (22 GiB)")
    fig
    """),
    md("""
    ## Fragmentation over the run

    Give the contiguous server room (80 GiB) so both finish, and read the allocator every 60
    steps: reserved, allocated, the bytes cached free inside segments (reserved but idle), the
    largest free block, and the fragmentation index (1 - largest free block / free).
    """),
    code("""
    from gpumemviz.allocator.workloads import GIB, inference_server
    from gpumemviz.live.sources.simulated import SimulatedSource

    roomy = {
        "contiguous": inference_server(paged=False, capacity=80 * GIB, name="contiguous"),
        "paged": inference_server(paged=True, capacity=80 * GIB, name="paged"),
    }
    series, ooms = {}, {}
    for name, w in roomy.items():
        source = SimulatedSource(w, autostart=False, loop=False)
        rows = []
        while True:
            ran = source.step(60)
            rep = gpumemviz.fragmentation(source.sample().segments)
            rows.append((rep.reserved, rep.allocated, rep.free, rep.largest_free,
                         rep.external_fragmentation))
            if ran < 60:
                break
        series[name] = rows
        ooms[name] = len(source.ooms)

    summary = {}
    for name, rows in series.items():
        peak = max(r[0] for r in rows)
        idle = sum(r[2] for r in rows) / len(rows)
        index = sum(r[4] for r in rows) / len(rows)
        summary[name] = {"peak": peak, "idle": idle, "index": index}
        print(f"{name:>10}: {ooms[name]} OOMs, peak reserved {format_size(peak)}, mean cached "
              f"free {format_size(int(idle))}, mean fragmentation index {index:.2f}")
    """),
    code("""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=list(series))
    for col, (name, rows) in enumerate(series.items(), start=1):
        x = [60 * i for i in range(len(rows))]
        for k, label in ((0, "reserved"), (1, "allocated"), (2, "cached free"),
                         (3, "largest free block")):
            fig.add_scatter(x=x, y=[r[k] / GIB for r in rows], name=f"{name}: {label}",
                            mode="lines", row=1, col=col)
    fig.update_layout(title="80 GiB: memory every 60 allocator steps (GiB)")
    fig.update_xaxes(title_text="allocator step")
    fig
    """),
    md("""
    The paged cache's free memory is cut into many pieces (a high fragmentation index), yet it
    costs little: the holes are mostly whole pages, the size the server asks for next, so they
    are reused and the cache stays small. The contiguous cache frees buffers of every size; a
    new request's buffer often fits none of the holes, so the allocator reserves more while
    gigabytes sit idle. The index counts pieces; what costs memory is whether the next request
    fits them.
    """),
    code("""
    final = gpumemviz.fragmentation(run(roomy["contiguous"]).allocator.snapshot())
    print("contiguous, after serving everything:", format_size(final.reserved), "reserved,",
          format_size(final.free), "cached free")
    """),
]

# --------------------------------------------------------------------------- 05

NB05 = [
    code(PEP723),
    md("""
    # 05 · Will it fit?

    Before renting a GPU: does a GPT-2-medium training step fit on an **H100 80 GB**, with which
    batch, and does `expandable_segments:True` buy a bigger one? `gpumemviz.estimate` runs the
    step on PyTorch's **meta device** (shapes, no data, no GPU), records every tensor allocation
    and free in order, adds what CUDA adds (cuBLAS workspaces, the foreach optimizer path) and
    drives gpumemviz's model of the caching allocator with it: rounding, segments, splits,
    fragmentation. This notebook runs on a laptop in a few seconds.
    """),
    md("""
    The model: GPT-2 medium's shape (d_model 1024, 24 layers, 16 heads, d_ff 4096, a 10,000
    token vocabulary), pre-norm RMSNorm, rotary positions, SwiGLU, attention written by hand,
    fp32, trained with AdamW. Nothing here knows about gpumemviz.
    """),
    code("""
    import math

    import torch
    from torch import nn


    class Linear(nn.Module):
        def __init__(self, d_in, d_out):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(d_out, d_in) / math.sqrt(d_in))

        def forward(self, x):
            return x @ self.weight.T


    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


    def rope(x, cache):
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        cos, sin = cache[:, : x.size(-2)].unbind(0)
        return torch.cat((cos * x1 - sin * x2, sin * x1 + cos * x2), dim=-1)


    class Block(nn.Module):
        def __init__(self, d, heads, d_ff, cache):
            super().__init__()
            self.heads, self.cache = heads, cache
            self.ln1, self.ln2 = RMSNorm(d), RMSNorm(d)
            self.qkv, self.out = Linear(d, 3 * d), Linear(d, d)
            self.w1, self.w2, self.w3 = Linear(d, d_ff), Linear(d_ff, d), Linear(d, d_ff)

        def attention(self, x):
            t = x.size(-2)
            q, k, v = (y.unflatten(-1, (self.heads, -1)).transpose(1, 2)
                       for y in self.qkv(x).chunk(3, dim=-1))
            q, k = rope(q, self.cache), rope(k, self.cache)
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            return self.out((weights @ v).transpose(1, 2).flatten(2))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            h = self.ln2(x)
            return x + self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))


    class GPT(nn.Module):
        def __init__(self, vocab=10_000, d=1024, layers=24, heads=16, d_ff=4096, context=1024):
            super().__init__()
            half = d // heads // 2
            angles = torch.outer(torch.arange(context), 10_000.0 ** -(torch.arange(half) / half))
            self.register_buffer("cache", torch.stack((angles.cos(), angles.sin())))
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d, heads, d_ff, self.cache) for _ in range(layers))
            self.ln, self.head = RMSNorm(d), Linear(d, vocab)

        def forward(self, ids):
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))
    """),
    md("""
    `setup(device)` builds what lives before the step (model, optimizer, a batch);
    `step(state)` is one training step. gpumemviz calls them with `torch.device("meta")`.
    """),
    code("""
    CONTEXT = 1024


    def make(batch):
        def setup(device):
            with torch.device(device):
                model = GPT(context=CONTEXT)
                ids = torch.randint(0, 10_000, (batch, CONTEXT))
            return model, torch.optim.AdamW(model.parameters()), ids

        def step(state):
            model, optimizer, ids = state
            logits = model(ids)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step, setup
    """),
    code("""
    import gpumemviz

    step, setup = make(8)
    est = gpumemviz.estimate(step, setup=setup, capacity="79GiB", arch="9.0")
    print(est)
    print(f"meta run {est.meta_seconds:.1f} s, allocator model {est.drive_seconds:.2f} s")
    """),
    md("""
    `capacity` is what the process can get: an H100 80 GB has 79.6 GiB, and the CUDA context
    takes some of it. `arch="9.0"` (Hopper) gives torch's 32 MiB cuBLAS workspaces, one for the
    forward and one for the autograd thread's backward.

    Now the largest batch, with the default allocator settings and with expandable segments.
    `max_batch` bisects; each batch runs on meta once for both settings (and most are computed
    from two runs: the sizes of a transformer step's tensors are affine in the batch).
    """),
    code("""
    fit = gpumemviz.max_batch(make, capacity="79GiB", arch="9.0", start=8,
                              configs=("", "expandable_segments:True"))
    print(fit)
    print(f"{fit.meta_runs} meta runs")
    for config, best in fit.items():
        e = fit.estimates[config]
        print(f"{config or 'default'}: batch {best}, {e.segments} segments at the peak, "
              f"{gpumemviz.format_size(e.peak_reserved - e.peak_allocated)} reserved "
              "but not allocated")
    """),
    md("""
    Here both settings fit the same batch: at the peak (the optimizer step, activations
    already freed) the default settings' cached-but-unused memory is a couple of GiB, less than
    one more sample needs. Expandable segments hold the same tensors in far fewer segments
    and less reserve. The predicted state at the peak, in the panel:
    """),
    code("""
    best = fit.estimates[""]
    panel = gpumemviz.MemoryPanel.from_snapshot(best.snapshot, title="predicted peak, default")
    panel
    """),
    md("""
    Each block in the map carries the operator and the line of your code that allocated it
    (hover it). What the estimate cannot see: NCCL buffers, other processes on the GPU, custom
    CUDA extensions without a meta kernel, cuDNN autotuning workspaces, CUDA graphs. See
    docs/estimate.md for those, and for how close it came to real recordings.
    """),
]


def build(cells: list[tuple[str, str]], prefix: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, (kind, src) in enumerate(cells):
        make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        cell = make(src)
        cell.id = f"{prefix}-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


NOTEBOOKS = {
    "02_fragmentation_and_fixes.ipynb": (NB02, "nb02"),
    "03_replay_a_snapshot.ipynb": (NB03, "nb03"),
    "04_paged_kv_cache.ipynb": (NB04, "nb04"),
    "05_will_it_fit.ipynb": (NB05, "nb05"),
}


def main(argv: list[str]) -> int:
    OUT.mkdir(exist_ok=True)
    for name, (cells, prefix) in NOTEBOOKS.items():
        if argv and not any(a in name for a in argv):
            continue
        nbformat.write(build(cells, prefix), OUT / name)
        print("wrote", OUT / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
