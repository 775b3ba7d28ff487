"""`gpumemviz inspect`: the text summary, the --json structure, and exit status 2 with one line
on bad input; through main(argv), and once through the installed console script."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REAL_FILES, read_real
from gpumemviz.cli import SUBCOMMANDS, main
from gpumemviz.fragmentation import fragmentation
from gpumemviz.units import format_size

INT_KEYS = ("reserved", "allocated", "free", "pending_free", "largest_free", "segments", "blocks")
FLOAT_KEYS = ("external_fragmentation", "fragmentation_sq")


def test_json_has_the_issue_structure_on_real_files(real_path, capsys):
    assert main(["inspect", str(real_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    d = read_real(real_path)
    report = fragmentation(d)
    assert set(out["devices"]) == {str(k) for k in report.devices}
    for figs in [out["total"], *out["devices"].values()]:
        for key in INT_KEYS:
            assert type(figs[key]) is int, key
        for key in FLOAT_KEYS:
            assert type(figs[key]) is float, key
    # the definitions of the issue, from the raw dict
    blocks = [b for s in d["segments"] for b in s["blocks"]]
    free = [b["size"] for b in blocks if b["state"] == "inactive"]
    t = out["total"]
    assert t["reserved"] == sum(s["total_size"] for s in d["segments"])
    assert t["allocated"] == sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    assert t["free"] == sum(free)
    assert t["largest_free"] == max(free, default=0)
    assert t["segments"] == len(d["segments"]) and t["blocks"] == len(blocks)
    if free:
        assert t["external_fragmentation"] == pytest.approx(1 - max(free) / sum(free))
        sq = sum(x * x for x in free) / sum(free) ** 2
        assert t["fragmentation_sq"] == pytest.approx(1 - sq)
    else:
        assert t["external_fragmentation"] == 0.0


def test_text_summary_on_real_files(real_path, capsys):
    assert main(["inspect", str(real_path)]) == 0
    text = capsys.readouterr().out
    report = fragmentation(read_real(real_path))
    for d, f in report.devices.items():
        assert f"device {d}: reserved {format_size(f.reserved)}" in text
        for s in f.worst_segments:
            assert f"0x{s.address:x}" in text
    assert "advice:" in text


def test_text_of_a_fragmented_file_shows_worst_segments_and_advice(tmp_path, capsys):
    segs = []
    for i in range(8):
        segs.append(
            {
                "device": 0,
                "address": 0x7F0000000000 + i * 96 * 2**20,
                "total_size": 96 * 2**20,
                "stream": 0,
                "segment_type": "large",
                "blocks": [
                    {"size": 2 * 2**20, "requested_size": 2**21, "state": "active_allocated"},
                    {"size": 94 * 2**20, "requested_size": 0, "state": "inactive"},
                ],
            }
        )
    path = tmp_path / "frag.pickle"
    path.write_bytes(pickle.dumps({"segments": segs, "device_traces": [[]]}, protocol=4))
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "reserved 768.00 MiB, allocated 16.00 MiB" in text
    assert "worst segments" in text and "94.00 MiB stuck of 94.00 MiB free" in text
    assert "[expandable_segments]" in text and "[max_split_size_mb]" in text


def test_device_option(real_path, capsys):
    report = fragmentation(read_real(real_path))
    d = max(report.devices)
    assert main(["inspect", str(real_path), "--device", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["devices"]) == [str(d)]
    assert out["total"]["reserved"] == report.devices[d].reserved


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


def test_unknown_device_exits_2(real_path, capsys):
    report = fragmentation(read_real(real_path))
    assert main(["inspect", str(real_path), "--device", "99"]) == 2
    err = capsys.readouterr().err.strip()
    have = ", ".join(map(str, report.devices))
    assert err.endswith(f"no device 99 in {real_path} (devices: {have})")


def test_usage_errors_and_help(capsys):
    assert main([]) == 2
    assert main(["inspect"]) == 2  # argparse: FILE is required
    assert main(["inspect", "x", "--device", "zero"]) == 2
    assert main(["--help"]) == 0
    assert "inspect" in capsys.readouterr().out


def test_subcommands_are_one_function_each():
    assert all(callable(add) for add in SUBCOMMANDS)
    assert SUBCOMMANDS[0].__name__ == "add_inspect"


@pytest.mark.skipif(not REAL_FILES, reason="no real snapshots")
def test_installed_console_script():
    real_path = min(REAL_FILES, key=lambda p: p.stat().st_size)
    script = Path(sys.executable).with_name("gpumemviz")
    assert script.exists(), "the package is not installed in this environment"
    ok = subprocess.run(
        [str(script), "inspect", str(real_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["total"]["reserved"] == fragmentation(real_path).reserved
    bad = subprocess.run(
        [str(script), "inspect", str(real_path.with_suffix(".nope"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "no such file" in bad.stderr


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
