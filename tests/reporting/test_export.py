"""export.py: pickles PyTorch's tools accept (run as `python -m torch.cuda._memory_viz`),
exact reloads, redaction of the real files, CSV timelines against independent sums."""

from __future__ import annotations

import csv
import json
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from torch.cuda import _memory_viz as mv

import gpumemviz
from conftest import REAL_FILES, STANDIN_FILES, read_real, real_file, standin_file
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.io import load_snapshot, snapshot_files
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.reporting.export import SAMPLE_COLUMNS, TRACE_COLUMNS, export
from gpumemviz.snapshot import SnapshotError

# Runs `python -m torch.cuda._memory_viz CMD FILE` for many files in one interpreter (torch
# imports once): runpy.run_module with alter_sys is what `-m` does.
DRIVER = textwrap.dedent(
    """
    import runpy, sys, traceback, warnings
    warnings.simplefilter("ignore")
    for arg in sys.argv[1:]:
        cmd, path = arg.split("=", 1)
        print(f"=== {cmd} {path}", flush=True)
        sys.argv = ["_memory_viz", cmd, path]
        try:
            runpy.run_module("torch.cuda._memory_viz", run_name="__main__", alter_sys=True)
        except BaseException as e:
            print(f"!!! {type(e).__name__}: {e}")
        sys.stdout.flush()
    """
)


def _bare(raw: dict) -> list:
    return raw["segments"]


#: A small shipped file with a trace (what the atomic-write tests export).
TRACED = "silmont2000__assignment2-systems__memory_forward_fp32_128.pickle"
#: The user names in the home directories of each recorded file (read off the files by hand:
#: `/home/NAME/...`), so the redaction test knows what it must hide wherever it runs.
HOME_NAMES = {
    "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle": {b"haoyangsun"},
    "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle": {b"lin"},
    "Yiyi-philosophy__LLM-inference__1.3b_snapshot.pickle": {b"dingyiran"},
    "Yiyi-philosophy__LLM-inference__oom_snapshot.pickle": {b"dingyiran"},
    "ZijianDu__Attention__memory.7e5ba324.pickle": {b"leo", b"conda"},
    "kkaitlyn111__cs336-a2-systems__memory_2.7b_forward.pickle": {b"c-kaitwang"},
    "kkaitlyn111__cs336-a2-systems__memory_snapshot.pickle": {b"c-kaitwang"},
    "standin__expandable_oom_3dev.pickle": {b"user"},
    "standin__streams10.pickle": {b"user"},
    "standin__training_10k.pickle": {b"user"},
}


def _with_traces(segments: list) -> dict:
    """What a bare list must become for PyTorch's tools (built here, not by gpumemviz)."""
    n = max((s["device"] for s in segments), default=-1) + 1
    return {"segments": segments, "device_traces": [[] for _ in range(n)]}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every real file and stand-in exported as is, as a bare segment list, and redacted."""
    out = tmp_path_factory.mktemp("export")
    made = []  # (kind, source path, exported path, expected torch dict)
    for i, p in enumerate([*REAL_FILES, *STANDIN_FILES]):
        raw = read_real(p)
        a = export(p, out / f"{i}.pickle")
        made.append(("dict", p, a, raw))
        b = export(_bare(raw), out / f"{i}_bare.pkl")
        made.append(("bare", p, b, _with_traces(_bare(raw))))
        c = export(raw, out / f"{i}_red", redact_paths=True)  # no suffix: pickle
        made.append(("redacted", p, c, None))
    # what the panel's export button writes for the simulated source: the allocator model's
    model = CachingAllocator(1 << 30)
    ptrs = [model.malloc(n) for n in (700, 3 << 20, 25 << 20, 4096, 1 << 20)]
    model.free(ptrs[1])
    model.empty_cache()
    snap = model.snapshot()
    made.append(("model", REAL_FILES[0], export(snap, out / "model.pickle"), snap))
    return out, made


@pytest.fixture(scope="module")
def memory_viz_runs(exported):
    """Output of `python -m torch.cuda._memory_viz stats|trace` for each exported file."""
    out, made = exported
    raw_bare = out / "raw_bare.pickle"  # a bare list as memory_snapshot() gives it, unexported
    raw_bare.write_bytes(pickle.dumps(_bare(read_real(REAL_FILES[0])), protocol=4))
    args = [f"{cmd}={m[2]}" for m in made for cmd in ("stats", "trace")]
    args.append(f"trace={raw_bare}")
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    sections = {}
    for chunk in re.split(r"^=== ", proc.stdout, flags=re.M)[1:]:
        head, _, body = chunk.partition("\n")
        sections[tuple(head.split(" ", 1))] = body
    return sections, str(raw_bare)


def test_exported_pickles_pass_memory_viz_stats_and_trace(exported, memory_viz_runs):
    _, made = exported
    sections, raw_bare = memory_viz_runs
    for kind, src, path, _expected in made:
        data = read_real(path)  # what PyTorch's tools read: plain pickle
        for cmd, fn in (("stats", mv.segsum), ("trace", mv.trace)):
            body = sections[(cmd, str(path))]
            assert not body.startswith("!!!"), (kind, src.name, cmd, body[:300])
            assert body == fn(data) + "\n", (kind, src.name, cmd)
        assert "total_reserved" in sections[("stats", str(path))]
    # the reason bare lists gain device_traces: torch's own reader cannot trace them
    assert sections[("trace", raw_bare)].startswith("!!! KeyError")


def test_exported_pickles_reload_equal(exported):
    _, made = exported
    for kind, src, path, expected in made:
        data = path.read_bytes()
        assert data[:2] == b"\x80\x04", (kind, src.name)  # protocol 4: MemoryViz rejects 5
        if expected is not None:
            assert load_snapshot(path).to_torch() == expected, (kind, src.name)
            assert read_real(path) == expected
        if kind == "dict":
            assert load_snapshot(path).to_torch() == load_snapshot(src).to_torch()


_HOME = re.compile(rb"/home/([^/\\\s]+)|/Users/([^/\\\s]+)|[A-Za-z]:[\\/]+Users[\\/]+([^/\\\s]+)")


def _string_values(obj, out: list[str], seen: set[int]) -> list[str]:
    """Every string value in plain data (dict keys are kept by redaction: they are torch's)."""
    if type(obj) is str:
        out.append(obj)
    elif type(obj) in (dict, list, tuple) and id(obj) not in seen:
        seen.add(id(obj))
        for v in obj.values() if type(obj) is dict else obj:
            _string_values(v, out, seen)
    return out


def test_redacted_exports_hold_no_home_or_user_name(exported):
    _, made = exported
    names_seen = set()
    for kind, src, path, _ in made:
        if kind != "redacted":
            continue
        original = src.read_bytes()
        names = {next(g for g in m.groups() if g) for m in _HOME.finditer(original)}
        assert names == HOME_NAMES.get(src.name, set()), src.name
        names_seen |= names
        data = path.read_bytes()
        values = [v.encode() for v in _string_values(read_real(path), [], set())]
        for n in names:
            # short names (lin, leo, user) are parts of other words (linear, user_metadata):
            # the name as a word is gone from every string; a long one from every byte
            word = re.compile(rb"(?<![A-Za-z0-9])" + re.escape(n) + rb"(?![A-Za-z0-9])")
            assert not any(word.search(v) for v in values), (src.name, n)
            if len(n) >= 6:
                assert n not in data, (src.name, n)
        assert _HOME.search(data) is None and b"/root/" not in data
        red, raw = load_snapshot(path), load_snapshot(src)
        assert red.n_blocks == raw.n_blocks
        for col in ("address", "size", "requested_size", "state"):
            assert np.array_equal(getattr(red.blocks, col), getattr(raw.blocks, col))
        for d, t in raw.traces.items():
            assert np.array_equal(red.traces[d].size, t.size)
            assert red.traces[d].action_names == t.action_names
    every = [p.name for p in [*REAL_FILES, *STANDIN_FILES]]
    assert names_seen == set().union(*(HOME_NAMES.get(n, set()) for n in every))
    assert {b"lin", b"dingyiran", b"leo", b"conda", b"user"} <= names_seen  # shipped ones


def test_json_export_reloads_equal(tmp_path):
    # JSON of the big ones is slow
    small = [p for p in [*REAL_FILES, *STANDIN_FILES] if p.stat().st_size < 600_000]
    assert len(small) >= 4  # torch 2.0 legacy, 2.6, 2.11, expandable
    raws = {p: read_real(p) for p in small}
    blocks = [[b for s in r["segments"] for b in s["blocks"]] for r in raws.values()]
    assert any("history" in b for bs in blocks for b in bs)  # torch 2.0 legacy
    assert any(s.get("is_expandable") for r in raws.values() for s in r["segments"])
    assert any(  # torch 2.11: trace entries carry compile_context
        "compile_context" in e for r in raws.values() for t in r["device_traces"] for e in t
    )
    for p in small:
        raw = raws[p]
        out = export(p, tmp_path / "s.json")
        assert (
            json.loads(out.read_bytes())["segments"][0]["address"] == raw["segments"][0]["address"]
        )
        assert load_snapshot(out).to_torch() == raw
        forced = export(raw, tmp_path / "s.dat", format="json")
        assert forced.read_bytes() == out.read_bytes()


# ---------------------------------------------------------------------------------------------
# CSV


def _read_csv(path):
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


_RES = {"segment_alloc": 1, "segment_free": -1, "segment_map": 1, "segment_unmap": -1}
_REQ = {"alloc": 1, "free_completed": -1}


def test_csv_of_real_traces_against_independent_sums(recorded_path, recorded_dict, tmp_path):
    if not isinstance(recorded_dict, dict) or not any(recorded_dict["device_traces"]):
        pytest.skip("no recorded history")
    out = export(recorded_path, tmp_path / "t.csv")
    header, rows = _read_csv(out)
    assert tuple(header) == TRACE_COLUMNS
    col = {c: i for i, c in enumerate(header)}
    traces = recorded_dict["device_traces"]
    assert len(rows) == sum(len(t) for t in traces)
    k = 0
    for dev, entries in enumerate(traces):
        if not entries:
            continue
        segs = [s for s in recorded_dict["segments"] if s["device"] == dev]
        blocks = [b for s in segs for b in s["blocks"]]
        final_reserved = sum(s["total_size"] for s in segs)
        final_requested = sum(mv._block_extra(b)[1] for b in blocks if b["state"] != "inactive")
        final_allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        # forwards from the start implied by the final totals
        reserved = final_reserved - sum(_RES.get(e["action"], 0) * e["size"] for e in entries)
        requested = final_requested - sum(_REQ.get(e["action"], 0) * e["size"] for e in entries)
        tl = Recording.from_snapshot(recorded_dict, dev)
        for i, e in enumerate(entries):
            row = rows[k]
            k += 1
            reserved += _RES.get(e["action"], 0) * e["size"]
            requested += _REQ.get(e["action"], 0) * e["size"]
            assert int(row[col["device"]]) == dev and int(row[col["index"]]) == i
            assert row[col["action"]] == e["action"]
            assert row[col["size"]] == str(e["size"]) and row[col["stream"]] == str(e["stream"])
            assert row[col["addr"]] == str(e.get("addr", ""))
            assert row[col["device_free"]] == str(e.get("device_free", ""))
            assert row[col["time_us"]] == str(e.get("time_us", ""))
            assert int(row[col["reserved"]]) == reserved
            assert int(row[col["requested"]]) == requested
            assert int(row[col["reserved"]]) == tl.reserved[i]  # E's replay agrees
            assert int(row[col["allocated"]]) == tl.allocated[i]
        last = rows[k - 1]
        assert int(last[col["reserved"]]) == final_reserved
        assert int(last[col["allocated"]]) == final_allocated
        assert int(last[col["segments"]]) == len(segs)
    assert k == len(rows)


#: Files with traces on 3 devices: the real one is CI-only, the stand-in ships.
THREE_DEVICES = {
    "real": lambda: real_file(
        "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"
    ),
    "standin": lambda: standin_file("expandable_oom_3dev"),
}


@pytest.mark.parametrize("which", sorted(THREE_DEVICES))
def test_csv_of_one_device_and_of_a_snapshot_without_history(tmp_path, which):
    raw = read_real(THREE_DEVICES[which]())
    assert all(raw["device_traces"][d] for d in (0, 1, 2))
    _, rows = _read_csv(export(raw, tmp_path / "d1.csv", device=1))
    assert len(rows) == len(raw["device_traces"][1]) and {r[0] for r in rows} == {"1"}
    header, rows = _read_csv(export([], tmp_path / "none.csv"))
    assert tuple(header) == TRACE_COLUMNS and rows == []


def test_csv_of_a_trace_that_cannot_be_replayed(tmp_path):
    seg = {
        "device": 0,
        "address": 1 << 30,
        "total_size": 2 << 20,
        "stream": 0,
        "segment_type": "small",
        "blocks": [{"address": 1 << 30, "size": 2 << 20, "requested_size": 0, "state": "inactive"}],
    }
    trace = [
        {"action": "segment_alloc", "addr": 1 << 30, "size": 2 << 20, "stream": 0},
        {"action": "free_completed", "addr": 1 << 40, "size": 100, "stream": 0},
    ]
    out = export({"segments": [seg], "device_traces": [trace]}, tmp_path / "t.csv")
    header, rows = _read_csv(out)
    col = {c: i for i, c in enumerate(header)}
    assert [r[col["reserved"]] for r in rows] == [str(2 << 20)] * 2  # exact without replay
    assert [r[col["requested"]] for r in rows] == ["100", "0"]
    assert [r[col["allocated"]] for r in rows] == ["", ""]  # the timeline could not be built
    assert [r[col["segments"]] for r in rows] == ["", ""]


def test_csv_of_a_sampler_history(tmp_path):
    source = SimulatedSource("training", autostart=False)
    sampler = Sampler(source, interval=0.1)
    try:
        for _ in range(6):
            source.step(150)
            sampler.sample_once(segments=False)
        samples = sampler.history.samples()
        assert len(samples) == 6
        out = export(sampler, tmp_path / "h.csv")
        header, rows = _read_csv(out)
        assert tuple(header) == SAMPLE_COLUMNS and len(rows) == 6
        col = {c: i for i, c in enumerate(header)}
        for s, row in zip(samples, rows, strict=True):
            assert float(row[col["time"]]) == s.time and int(row[col["seq"]]) == s.seq
            assert row[col["state"]] == s.state
            for k in ("allocated", "reserved", "active", "peak_reserved", "num_ooms"):
                assert int(row[col[k]]) == s.stats[f"{k_stat(k)}"]
            assert int(row[col["nvml_used"]]) == s.nvml.used
            assert int(row[col["non_pytorch"]]) == s.nvml.non_pytorch
        assert len({r[col["allocated"]] for r in rows}) > 1  # the workload moved
        assert export(samples, tmp_path / "l.csv").read_bytes() == out.read_bytes()
        assert export(sampler.history, tmp_path / "y.csv").read_bytes() == out.read_bytes()
        with pytest.raises(ValueError, match="only as CSV"):
            export(samples, tmp_path / "h.pickle")
    finally:
        sampler.close()


def k_stat(k: str) -> str:
    """torch's memory_stats key for a CSV column."""
    return {
        "allocated": "allocated_bytes.all.current",
        "reserved": "reserved_bytes.all.current",
        "active": "active_bytes.all.current",
        "peak_reserved": "reserved_bytes.all.peak",
        "num_ooms": "num_ooms",
    }[k]


# ---------------------------------------------------------------------------------------------
# atomic writes and bad input


def test_failed_export_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "s.pickle"
    export([], path)
    before = path.read_bytes()

    def half_then_fail(data, f):
        f.write(b"\x80\x04partial")
        raise OSError("disk full")

    monkeypatch.setattr(snapshot_files, "_write_pickle", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        export(real_file(TRACED), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.pickle"]


def test_failed_csv_leaves_no_file(tmp_path, monkeypatch):
    import gpumemviz.reporting.export as ex

    real_writer = csv.writer

    class Failing:
        def __init__(self, f, **kw):
            self.w = real_writer(f, **kw)

        def writerow(self, row):
            self.w.writerow(row)

        def writerows(self, rows):
            self.w.writerow(next(iter(rows)))
            raise OSError("disk full")

    monkeypatch.setattr(ex.csv, "writer", Failing)
    assert read_real(real_file(TRACED))["device_traces"][0]  # rows to write: writerows runs
    with pytest.raises(OSError, match="disk full"):
        export(real_file(TRACED), tmp_path / "t.csv")
    assert list(tmp_path.iterdir()) == []


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown export format 'xml'"):
        export([], tmp_path / "a", format="xml")
    with pytest.raises(ValueError, match="HTML export needs the report renderer"):
        export([], tmp_path / "a.html")
    with pytest.raises(SnapshotError):
        export(tmp_path / "missing.pickle", tmp_path / "b.pickle")
    assert list(tmp_path.iterdir()) == []


def test_public_api():
    assert gpumemviz.export is not None and callable(gpumemviz.export)
    assert callable(gpumemviz.diff) and callable(gpumemviz.redact_paths)


def test_csv_cells_that_a_spreadsheet_would_run_get_a_leading_quote(tmp_path):
    from gpumemviz.reporting.export import csv_safe
    from gpumemviz.snapshot.sample import Sample

    assert csv_safe("\rx") == "'\rx"  # csv's own writer leaves a CR unquoted: checked here
    hostile = ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\tx"]
    samples = [Sample(time=float(i), device=0, stats=None, state=s) for i, s in enumerate(hostile)]
    samples.append(Sample(time=9.0, device=0, stats=None, state="-12.5"))  # a number stays
    out = export(samples, tmp_path / "s.csv")
    header, rows = _read_csv(out)
    states = [r[header.index("state")] for r in rows]
    assert states == ["'" + s for s in hostile] + ["-12.5"]
