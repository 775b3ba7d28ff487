"""`gpumemviz inspect`: the text summary, the --json structure, and exit status 2 with one line
on bad input; through main(argv), and once through the installed console script."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (
    REAL_FILES,
    fragmented_segments,
    has_private_pools,
    read_real,
    real_file,
    recorded_peaks,
    standin_file,
)
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.cli import SUBCOMMANDS, build_parser, main
from gpumemviz.snapshot.units import format_size

INT_KEYS = ("reserved", "allocated", "free", "pending_free", "largest_free", "segments", "blocks")
FLOAT_KEYS = ("external_fragmentation", "fragmentation_sq")

CHARRAN = "Charran78__DocuBox__dump_snapshot.pickle"  # tiny, one device, no trace
WEDSONLIN = "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"


def test_json_has_the_issue_structure_on_real_files(recorded_path, capsys):
    assert main(["inspect", str(recorded_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    d = read_real(recorded_path)
    report = fragmentation(d)
    assert set(out["devices"]) == {str(k) for k in report.devices}
    for figs in [out["memory"], *(v["memory"] for v in out["devices"].values())]:
        for key in INT_KEYS:
            assert type(figs[key]) is int, key
        for key in FLOAT_KEYS:
            assert type(figs[key]) is float, key
    # the definitions of the issue, from the raw dict
    blocks = [b for s in d["segments"] for b in s["blocks"]]
    free = [b["size"] for b in blocks if b["state"] == "inactive"]
    t = out["memory"]
    assert t["reserved"] == sum(s["total_size"] for s in d["segments"])
    assert t["allocated"] == sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    assert t["free"] == sum(free)
    assert t["largest_free"] == max(free, default=0)
    assert t["segments"] == len(d["segments"]) and t["blocks"] == len(blocks)
    assert t["free_stuck"] == max(t["free"] + t["pending_free"] - t["releasable"], 0)
    assert type(t["free_stuck_expandable"]) is int
    if free:
        assert t["external_fragmentation"] == pytest.approx(1 - max(free) / sum(free))
        sq = sum(x * x for x in free) / sum(free) ** 2
        assert t["fragmentation_sq"] == pytest.approx(1 - sq)
    else:
        assert t["external_fragmentation"] == 0.0


def test_text_summary_on_real_files(recorded_path, capsys):
    assert main(["inspect", str(recorded_path)]) == 0
    text = capsys.readouterr().out
    report = fragmentation(read_real(recorded_path))
    for d, f in report.devices.items():
        assert f"device {d}: reserved {format_size(f.reserved)}" in text
        assert (
            f"left after empty_cache {format_size(f.free_stuck)} "
            f"({format_size(f.free_stuck_expandable)} in partial pages of expandable segments)"
        ) in text
        for s in f.worst_segments:
            assert f"0x{s.address:x}" in text
    assert "advice:" in text


def test_text_of_a_fragmented_file_shows_worst_segments_and_advice(tmp_path, capsys):
    segs = fragmented_segments()
    path = tmp_path / "frag.pickle"
    path.write_bytes(pickle.dumps({"segments": segs, "device_traces": [[]]}, protocol=4))
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "reserved 768.00 MiB, allocated 16.00 MiB" in text
    assert "worst segments" in text and "94.00 MiB stuck of 94.00 MiB free" in text
    assert "[expandable_segments]" in text and "[max_split_size_mb]" in text


def test_device_option(recorded_path, capsys):
    report = fragmentation(read_real(recorded_path))
    d = max(report.devices)
    assert main(["inspect", str(recorded_path), "--device", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == d and out["devices"] == {}
    assert out["memory"]["reserved"] == out["figures"]["reserved"] == report.devices[d].reserved


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.pickle", "no such file"),
        (lambda p: _write(p / "notes.txt", b"hello, not a snapshot"), "not a pickle or JSON"),
        (lambda p: _write(p / "empty.pickle", b""), "empty"),
        (lambda p: _write(p / "list.json", b'{"no": "segments"}'), "segments"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, make, message):
    path = make(tmp_path)
    assert main(["inspect", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert err.startswith("gpumemviz inspect: error:") and "\n" not in err
    assert message in err


def test_unknown_device_exits_2(recorded_path, capsys):
    report = fragmentation(read_real(recorded_path))
    assert main(["inspect", str(recorded_path), "--device", "99"]) == 2
    err = capsys.readouterr().err.strip()
    have = ", ".join(map(str, report.devices))
    assert err.endswith(f"no device 99 in {recorded_path} (devices: {have})")


def test_usage_errors_and_help(capsys):
    assert main([]) == 2
    assert main(["inspect"]) == 2  # argparse: FILE is required
    assert main(["inspect", "x", "--device", "zero"]) == 2
    assert main(["--help"]) == 0
    assert "inspect" in capsys.readouterr().out


def test_subcommands_are_one_function_each():
    assert all(callable(add) for add in SUBCOMMANDS)
    names = [add.__name__ for add in SUBCOMMANDS]
    assert names == [
        "add_inspect",
        "add_whatif",
        "add_diff",
        "add_report",
        "add_export",
        "add_demo",
        "add_job",
    ]
    help_text = build_parser().format_help()
    for name in names:
        assert name.removeprefix("add_") in help_text


@pytest.mark.skipif(not REAL_FILES, reason="no real snapshots")
def test_installed_console_script():
    recorded_path = min(REAL_FILES, key=lambda p: p.stat().st_size)
    script = Path(sys.executable).with_name("gpumemviz")
    assert script.exists(), "the package is not installed in this environment"
    ok = subprocess.run(
        [str(script), "inspect", str(recorded_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["memory"]["reserved"] == fragmentation(recorded_path).reserved
    bad = subprocess.run(
        [str(script), "inspect", str(recorded_path.with_suffix(".nope"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "no such file" in bad.stderr


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------------------------
# whatif


def _recorded_reserved_walk(d: dict, device: int) -> tuple[int, int | None]:
    """Peak reserved of a recording and the index of its oom entry, from the raw dict alone:
    the final reserved minus the later segment entries' changes, walked backwards."""
    trace = d["device_traces"][device]
    oom = next((i for i, e in enumerate(trace) if e["action"] == "oom"), None)
    return recorded_peaks(d, device)[0], oom


def test_whatif_json_recorded_side_matches_the_trace_on_real_files(recorded_path, capsys):
    d = read_real(recorded_path)
    traced = [i for i, t in enumerate(d.get("device_traces") or []) if t]
    rc = main(["whatif", str(recorded_path), "--conf", "expandable_segments:True", "--json"])
    if not traced:
        assert rc == 2
        assert "no trace to replay" in capsys.readouterr().err
        return
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == "expandable_segments:True"
    assert set(out["devices"]) == {str(i) for i in traced}
    for dev in traced:
        r = out["devices"][str(dev)]
        peak, oom = _recorded_reserved_walk(d, dev)
        assert r["recorded"]["peak_reserved"] == peak
        assert r["recorded"]["oom_at"] == oom and r["recorded"]["oom"] == (oom is not None)
        assert r["events"] == len(d["device_traces"][dev])
        # a trace with private pools (MemPool, CUDA graphs) is reported pool by pool
        mine = [seg for seg in d["segments"] if seg.get("device", 0) == dev]
        if has_private_pools(mine):
            pools = {tuple(p["pool"]) for p in r["pools"]}
            assert {tuple(seg["segment_pool_id"]) for seg in mine} <= pools
        else:
            assert r["pools"] == []
        # capacity is known exactly when the device recorded an OOM (nothing was given)
        assert r["capacity_known"] == (oom is not None)
        for side in ("recorded", "predicted"):
            assert type(r[side]["peak_reserved"]) is int and r[side]["peak_segments"] >= 0


def _model_snapshot(tmp_path: Path) -> Path:
    """A recording from the allocator model: five 100 MiB tensors, two freed, one 150 MiB."""
    from gpumemviz.allocator.model import CachingAllocator

    a = CachingAllocator(1 << 30)
    ptrs = [a.malloc(100 << 20) for _ in range(5)]
    a.free(ptrs[1])
    a.free(ptrs[3])
    a.malloc(150 << 20)
    return _write(tmp_path / "model.pickle", pickle.dumps(a.snapshot(), protocol=4))


def test_whatif_smaller_capacity_predicts_an_oom(tmp_path, capsys):
    path = _model_snapshot(tmp_path)
    assert main(["whatif", str(path), "--capacity", "300MiB", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["devices"]["0"]
    assert r["capacity"] == 300 << 20 and r["capacity_known"]
    assert r["recorded"] == {
        "peak_reserved": 650 << 20,  # 5 x 100 MiB + a 150 MiB segment (the holes are 100 MiB)
        "peak_segments": 6,
        "final_segments": 6,
        "oom": False,
        "oom_at": None,
    }
    assert r["predicted"]["oom"] and r["predicted"]["peak_reserved"] <= 300 << 20
    assert main(["whatif", str(path), "--capacity", "300MiB"]) == 0
    text = capsys.readouterr().out
    assert "capacity 300.00 MiB" in text and "650.00 MiB" in text
    assert f"yes (entry {r['predicted']['oom_at']})" in text


def test_whatif_expandable_text_side_by_side(tmp_path, capsys):
    path = _model_snapshot(tmp_path)
    assert main(["whatif", str(path), "--conf", "expandable_segments:True"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "what if PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'" in lines[0]
    assert "(recorded: the default settings)" in lines[0]
    assert "capacity unknown" in lines[1]
    assert lines[2].split() == ["recorded", "predicted"]
    segs = next(x for x in lines if x.strip().startswith("final segments")).split()
    assert segs[-2:] == ["6", "1"]  # one expandable segment grows instead of six
    assert next(x for x in lines if x.strip().startswith("OOM")).split()[-2:] == ["no", "no"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--conf", "bogus_key:1"], "--conf 'bogus_key:1': Unrecognized key 'bogus_key'"),
        (["--conf", "expandable_segments:true"], "(use True: PyTorch rejects true)"),
        (["--conf", "expandable_segments:false"], "(use False: PyTorch rejects false)"),
        (["--capacity", "10XB"], "not a size: '10XB'"),
        (["--capacity", "0"], "--capacity must be positive"),
        (["--capacity", "-5GiB"], "--capacity must be positive, got '-5GiB'"),
        (["--capacity=-5"], "--capacity must be positive, got '-5'"),
    ],
)
def test_whatif_bad_options_exit_2(tmp_path, capsys, extra, message):
    path = _model_snapshot(tmp_path)
    assert main(["whatif", str(path), *extra]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and "\n" not in err
    assert err.startswith("gpumemviz whatif: error:") and message in err


def test_whatif_without_a_trace_exits_2(tmp_path, capsys):
    seg = {
        "device": 0,
        "address": 0,
        "total_size": 2 << 20,
        "stream": 0,
        "segment_type": "small",
        "blocks": [{"size": 2 << 20, "state": "inactive"}],
    }
    path = _write(tmp_path / "bare.pickle", pickle.dumps([seg], protocol=4))
    assert main(["whatif", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "gpumemviz whatif: error: snapshot has no trace to replay (recorded with history off?)"
    )
    assert main(["whatif", str(tmp_path / "missing.pickle")]) == 2
    assert "no such file" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# diff


#: Two files with different devices: the real pair is CI-only, the stand-in pair ships.
TWO_FILES = {
    "real": lambda: (
        real_file("Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"),
        real_file("kkaitlyn111__cs336-a2-systems__memory_snapshot.pickle"),
    ),
    "standin": lambda: (standin_file("expandable_oom_3dev"), real_file(CHARRAN)),
}


@pytest.mark.parametrize("which", sorted(TWO_FILES))
def test_diff_of_two_real_files(capsys, which):
    a, b = TWO_FILES[which]()
    assert main(["diff", str(a), str(b), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ra, rb = fragmentation(read_real(a)), fragmentation(read_real(b))
    for name in ("reserved", "allocated", "free", "segments", "blocks"):
        t = out["total"][name]
        assert (t["before"], t["after"]) == (getattr(ra, name), getattr(rb, name))
        assert t["delta"] == t["after"] - t["before"]
    assert set(out["devices"]) == {str(d) for d in set(ra.devices) | set(rb.devices)}
    assert set(out["devices"]) == {"0", "1", "2"}  # A's three devices, B's one among them
    assert main(["diff", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "reserved" in text and "device 0" in text


def test_diff_with_itself_changes_nothing(recorded_path, capsys):
    assert main(["diff", str(recorded_path), str(recorded_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(f["delta"] == 0 for f in out["total"].values())
    for dev in out["devices"].values():
        assert dev["present"] == "both" and dev["holders_grew"] == dev["holders_shrank"] == []


def test_diff_bad_input_exits_2(tmp_path, capsys):
    good = real_file(CHARRAN)
    assert main(["diff", str(good), str(tmp_path / "gone.pickle")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpumemviz diff: error:") and "no such file" in err
    assert "\n" not in err
    bad = _write(tmp_path / "x.json", b"[1, 2")
    assert main(["diff", str(bad), str(good)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: A ({bad}): " in err  # which of the two it is
    notes = _write(tmp_path / "notes.txt", b"hello, these are my notes")
    assert main(["diff", str(good), str(notes)]) == 2
    err = capsys.readouterr().err
    assert f"error: B ({notes}): not a pickle or JSON snapshot" in err
    assert main(["diff", str(good)]) == 2  # argparse: B is required


# --------------------------------------------------------------------------------------------
# export


def test_export_pickle_reloads_equal(recorded_path, tmp_path, capsys):
    from gpumemviz.io import load_snapshot

    out = tmp_path / "out.pickle"
    assert main(["export", str(recorded_path), "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (")
    assert out.read_bytes()[:2] == b"\x80\x04"  # protocol 4
    assert load_snapshot(out).to_torch() == load_snapshot(recorded_path).to_torch()


def test_export_json_csv_and_redaction(tmp_path, capsys):
    from gpumemviz.io import load_snapshot
    from gpumemviz.reporting.export import TRACE_COLUMNS

    src = real_file(WEDSONLIN)
    d = read_real(src)
    assert "/home/" in repr(d), "a real file with home directories in its frames"
    js = tmp_path / "snap.data"
    assert main(["export", str(src), "-o", str(js), "--format", "json", "--redact-paths"]) == 0
    text = js.read_text()
    assert text.lstrip().startswith("{") and "/home/" not in text and "~user1" in text
    again = load_snapshot(js)
    assert again.n_blocks == load_snapshot(src).n_blocks
    csv_path = tmp_path / "trace.csv"
    traced = [i for i, t in enumerate(d["device_traces"]) if t]
    assert main(["export", str(src), "-o", str(csv_path), "--device", str(traced[0])]) == 0
    rows = csv_path.read_text().splitlines()
    assert rows[0].split(",") == list(TRACE_COLUMNS)
    assert len(rows) - 1 == len(d["device_traces"][traced[0]])
    capsys.readouterr()


@pytest.mark.parametrize(
    ("output", "extra", "message"),
    [
        ("nodir/out.pickle", [], "output folder"),
        (".", [], "is a directory"),
        ("out.html", [], "gpumemviz report"),
        ("out.csv", ["--device", "7"], "no trace of device 7"),
    ],
)
def test_export_bad_output_exits_2(tmp_path, capsys, output, extra, message):
    src = _model_snapshot(tmp_path)
    assert main(["export", str(src), "-o", str(tmp_path / output), *extra]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and "\n" not in err
    assert err.startswith("gpumemviz export: error:") and message in err
    assert main(["export", str(src), "-o", "x.pickle", "--format", "html"]) == 2  # argparse


# --------------------------------------------------------------------------------------------
# demo


def test_demo_command_opens_the_quickstart(capsys):
    assert main(["demo", "--print-command", "--port", "9123", "--no-browser"]) == 0
    line = capsys.readouterr().out.strip()
    root = Path(__file__).resolve().parents[2]
    assert line.startswith(f"cd {root / 'example_notebooks'} && {sys.executable} -m jupyter lab ")
    assert "--ServerApp.port=9123" in line and "--no-browser" in line
    assert "--LabApp.default_url=/lab/tree/01_quickstart.ipynb" in line  # not the Launcher
    assert (root / "example_notebooks" / "01_quickstart.ipynb").is_file()


def test_demo_without_jupyterlab_gives_the_install_hint():
    # sys.modules[name] = None is Python's own way to make `import name` fail
    code = (
        "import sys; sys.modules['jupyterlab'] = None\n"
        "from gpumemviz.cli import main; sys.exit(main(['demo']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (
        "gpumemviz demo: error: jupyterlab is not installed: "
        "pip install jupyterlab 'gpumemviz[widget]'\n"
    )


def test_demo_serves_the_quickstart_notebook(tmp_path):
    import re
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(sys.executable).with_name("gpumemviz")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    proc = subprocess.Popen(
        [str(script), "demo", "--no-browser", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        token, seen, deadline = None, [], time.monotonic() + 120
        while token is None and time.monotonic() < deadline:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break
            seen.append(line)
            # the printed URL opens the quickstart itself, not the Launcher (/lab?token=)
            m = re.search(
                rf"http://127\.0\.0\.1:{port}/lab/tree/01_quickstart\.ipynb\?token=([0-9a-f]+)",
                line,
            )
            token = m.group(1) if m else None
        assert token, "".join(seen)
        url = f"http://127.0.0.1:{port}/api/contents/01_quickstart.ipynb?content=0&token={token}"
        while True:  # the URL is printed a moment before the server accepts connections
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    info = json.loads(r.read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert info["name"] == "01_quickstart.ipynb" and info["type"] == "notebook"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


# --------------------------------------------------------------------------------------------
# report


def test_report_writes_one_offline_page(tmp_path, capsys):
    src = min(REAL_FILES, key=lambda p: p.stat().st_size)
    out = tmp_path / "r.html"
    assert main(["report", str(src), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip().startswith(f"wrote {out} (")
    page = out.read_text()
    assert page.startswith("<!doctype html>") and src.name in page
    assert "<script src=" not in page and "<link " not in page  # nothing fetched


#: Files with home directories in their frames: a long user name (Constructor-Sun's,
#: CI-only; Yiyi's, a torch 2.0 file) and a short one that is part of other words (Wedsonlin's
#: `lin`: the file's own name, `inline`).
# files whose report shows a home directory (in its live blocks' stacks; WEDSONLIN has one in
# its trace's frames only, which the page no longer lists since the holders replaced the sites)
HOME_FILES = [
    "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle",
    "Yiyi-philosophy__LLM-inference__1.3b_snapshot.pickle",
]


@pytest.mark.parametrize("name", HOME_FILES, ids=lambda n: n.split("__")[0])
def test_report_redact_paths(tmp_path, capsys, name):
    src = real_file(name)
    home = re.search(r"/home/(\w+)", repr(read_real(src)))
    assert home
    plain, redacted = tmp_path / "plain.html", tmp_path / "redacted.html"
    assert main(["report", str(src), "-o", str(plain)]) == 0
    assert main(["report", str(src), "-o", str(redacted), "--redact-paths"]) == 0
    capsys.readouterr()
    assert home.group(0) in plain.read_text()
    text = redacted.read_text()
    assert "/home/" not in text and "~user1/" in text
    user = home.group(1)
    assert re.search(rf"(?<![A-Za-z0-9]){re.escape(user)}(?![A-Za-z0-9])", text) is None
    if len(user) >= 6:  # a long name is not part of any other word: gone altogether
        assert user not in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.pickle", "-o", "r.html"], "no such file"),
        (["SRC", "-o", "nodir/r.html"], "output folder"),
        (["SRC", "-o", "."], "is a directory"),
    ],
)
def test_report_bad_input_exits_2(tmp_path, capsys, args, message):
    src = _model_snapshot(tmp_path)
    argv = ["report"] + [
        str(src) if a == "SRC" else a if a.startswith("-") else str(tmp_path / a) for a in args
    ]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and "\n" not in err
    assert err.startswith("gpumemviz report: error:") and message in err
    assert main(["report", str(src)]) == 2  # no output given
    assert "say where to write: gpumemviz report FILE OUTPUT" in capsys.readouterr().err
    two = ["report", str(src), str(tmp_path / "a.html"), "-o", str(tmp_path / "b.html")]
    assert main(two) == 2
    assert "two outputs given" in capsys.readouterr().err


def test_report_and_export_take_the_output_as_their_second_argument(tmp_path, capsys):
    src = _model_snapshot(tmp_path)
    page, table = tmp_path / "out.html", tmp_path / "out.csv"
    assert main(["report", str(src), str(page)]) == 0
    assert main(["export", str(src), str(table)]) == 0
    assert page.read_text().startswith("<!doctype html>")
    assert table.read_text().splitlines()[0].count(",") > 2  # a CSV header
    out = capsys.readouterr().out
    assert f"wrote {page} (" in out


def test_settings_not_recorded_are_said_the_same_in_inspect_and_whatif(tmp_path, capsys):
    d = pickle.loads(_model_snapshot(tmp_path).read_bytes())
    assert d["allocator_settings"]  # the model records them: the defaults
    del d["allocator_settings"]
    path = _write(tmp_path / "bare.pickle", pickle.dumps(d, protocol=4))
    said = "not recorded (assumed PyTorch's defaults)"
    assert main(["inspect", str(path)]) == 0
    assert f"allocator settings: {said}" in capsys.readouterr().out
    assert main(["whatif", str(path)]) == 0
    assert f"(recorded: {said})" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize(("uid", "allow_root"), [(0, True), (1000, False)])
def test_demo_passes_allow_root_only_as_root(monkeypatch, capsys, uid, allow_root):
    monkeypatch.setattr(os, "getuid", lambda: uid)
    assert main(["demo", "--print-command", "--no-browser"]) == 0
    assert ("--allow-root" in capsys.readouterr().out.split()) is allow_root


def test_worst_segments_name_the_pending_bytes_they_count_as_stuck(capsys):
    """A segment's stuck bytes include its pending frees (empty_cache syncs them first), so the
    line says them beside the free bytes instead of reading 'X stuck of less than X free'."""
    from conftest import real_file

    path = real_file("volcengine__verl__mem_mempools.pickle")
    assert main(["inspect", str(path)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " stuck of " in ln]
    report = fragmentation(path)
    worst = report.worst_segments
    assert len(lines) == len(worst) and any(s.pending_free for s in worst)
    for line, s in zip(lines, worst, strict=True):
        assert s.stuck_free == s.free + s.pending_free - s.releasable
        said = f"{format_size(s.free)} free and {format_size(s.pending_free)} pending in"
        assert (said in line) == bool(s.pending_free), line
        assert f"{format_size(s.free)} free in" in line or s.pending_free


def test_inspect_holders_key_lists_every_holder(tmp_path, capsys):
    from torch_fields import MiB, torch_file

    path = tmp_path / "meta.pickle"
    d = torch_file(entries={1: {"user_metadata": "phase=fwd"}})
    path.write_bytes(pickle.dumps(d, protocol=4))
    assert main(["inspect", str(path), "--holders", "user_metadata"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"holders of the {format_size(6 * MiB + 512)} allocated, by user metadata:",
        f"  {format_size(4 * MiB)} in 1 block: phase=fwd",
        f"  {format_size(2 * MiB + 512)} in 2 blocks: (not recorded)",
    ]
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert (
        "holders of the 6.00 MiB allocated, by frame (the innermost frame of the user's code):"
        in text
    )
    assert main(["inspect", str(path), "--holders", "line"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_inspect_json_carries_holders_growth_and_forecast(recorded_path, capsys):
    assert main(["inspect", str(recorded_path), "--json", "--no-replay"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"holders", "growth", "forecast", "lifetimes", "steps", "recorded"} <= set(out)
    assert isinstance(out["growth"], list)
    for by, rows in out["holders"].items():
        assert sum(r["bytes"] for r in rows) == out["figures"]["allocated"], by
