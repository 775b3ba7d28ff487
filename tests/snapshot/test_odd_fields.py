"""Odd fields degrade, never crash: a frame field of another type reads as unknown ("?") in
analysis, rendering, reports, exports and diff, and no JSON gpumemviz writes holds NaN or
infinity (JSON.parse and strict readers refuse them)."""

from __future__ import annotations

import json
import math
import pickle

import pytest

from gpumemviz.analysis.diff import diff
from gpumemviz.analysis.frames import format_frame, format_stack, redact_paths
from gpumemviz.analysis.holders import live_holders, trace_holders
from gpumemviz.cli import main
from gpumemviz.io import load_snapshot
from gpumemviz.render.stacks import Stacks
from gpumemviz.render.timeline import annotation_marks, recorded_points, trace_times
from gpumemviz.reporting.export import export
from gpumemviz.reporting.html_report import render_html
from gpumemviz.snapshot import Snapshot
from hostile import frame, snapshot_dict

NAN, INF = float("nan"), float("inf")

#: The frames a file may hold instead of torch's {filename: str, line: int, name: str}.
ODD_FRAMES = {
    "line None": [frame(line=None)],
    "line float": [frame(line=3.5)],
    "line inf": [frame(line=INF)],
    "line nan": [frame(line=NAN)],
    "line str": [frame(line="12")],
    "line bool": [frame(line=True)],
    "line huge": [frame(line=10**40)],
    "name list": [frame(name=[1, 2])],
    "filename int": [frame(filename=7)],
    "frame not a dict": [5, frame()],
    "frames an int": 7,
    "frames a dict": {"line": 1},
    "surrogates": [frame(filename="/home/ann/\udcff\udcfe.py", name="f\udc80")],
}


def _strict(text: str) -> object:
    """JSON as a strict reader (JSON.parse) reads it: NaN and Infinity refused."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(params=sorted(ODD_FRAMES))
def odd_file(request, tmp_path):
    path = tmp_path / "odd.pickle"
    path.write_bytes(pickle.dumps(snapshot_dict(frames=ODD_FRAMES[request.param]), protocol=4))
    return path


def test_odd_frames_degrade_everywhere(odd_file, tmp_path, capsys):
    snap = load_snapshot(odd_file)
    clean = load_snapshot(pickle.dumps(snapshot_dict(frames=[]), protocol=4))
    for sites in (live_holders(snap), trace_holders(snap)):
        for s in sites:
            assert type(s.label) is str
            _strict(json.dumps(s.to_dict()))
    assert Stacks(snap).for_block(0, 0) is None or Stacks(snap).for_block(0, 0)["lines"]
    d = diff(clean, snap)
    assert d.text().startswith("device 0")
    _strict(json.dumps(d.to_dict()))
    html = render_html(snap, replay_advice=False)
    data = html.split('id="gmv-data">', 1)[1].split("</script>", 1)[0]
    _strict(data)
    html.encode("utf-8")  # surrogates included: the page is valid UTF-8
    for name in ("x.json", "x.csv", "x.pickle"):
        export(snap, tmp_path / name)
    _strict((tmp_path / "x.json").read_text())
    assert load_snapshot(tmp_path / "x.json").n_blocks == 2
    export(redact_paths(snap), tmp_path / "r.pickle")
    capsys.readouterr()
    for argv in (
        ["inspect", str(odd_file)],
        ["diff", str(odd_file), str(odd_file)],
        ["report", "--no-replay", str(odd_file), "-o", str(tmp_path / "r.html")],
    ):
        assert main(argv) == 0, capsys.readouterr().err
    for argv in (["inspect", "--json", str(odd_file)], ["diff", "--json", str(odd_file), "x"]):
        argv[-1] = str(odd_file)
        capsys.readouterr()
        assert main(argv) == 0
        _strict(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("f", "fields", "text"),
    [
        (frame(line=NAN), ("/home/ann/model.py", None, "forward"), "model.py:?:forward"),
        (frame(line="3", name=None), ("/home/ann/model.py", None, "?"), "model.py:?:?"),
        (frame(filename=[1]), ("?", 3, "forward"), "?:3:forward"),
        ({"line": 4}, ("", 4, ""), ":4:"),
        (None, ("", 0, ""), ":0:"),
    ],
)
def test_an_odd_field_reads_as_unknown(f, fields, text):
    from gpumemviz.analysis.frames import frame_fields

    assert frame_fields(f) == fields
    assert format_frame(f) == text


def test_an_odd_site_line_is_null_in_json():
    snap = Snapshot.from_torch(snapshot_dict(frames=[frame(line=INF)]))
    (site,) = live_holders(snap)
    assert site.label == "model.py:?:forward" and site.to_dict()["line"] is None
    assert format_stack(snap.block(0).frames) == ["model.py:?:forward"]


@pytest.mark.parametrize(
    "settings",
    [
        {"PYTORCH_CUDA_ALLOC_CONF": "", "garbage_collection_threshold": NAN},
        {"PYTORCH_CUDA_ALLOC_CONF": "", "garbage_collection_threshold": INF, "x": -INF},
        {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": 10**40, "y": 10**5000},
        {"PYTORCH_CUDA_ALLOC_CONF": 12, "pinned_num_register_threads": 10**30},
    ],
)
def test_odd_settings_write_json_without_nan(settings, tmp_path, capsys):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot_dict(allocator_settings=settings), protocol=4))
    snap = load_snapshot(path)
    out = export(snap, tmp_path / "s.json")
    got = _strict(out.read_text())
    assert set(got["allocator_settings"]) == set(settings)
    html = render_html(snap, replay_advice=False)
    _strict(html.split('id="gmv-data">', 1)[1].split("</script>", 1)[0])
    for argv in (["inspect", "--json", str(path)], ["diff", "--json", str(path), str(path)]):
        capsys.readouterr()
        assert main(argv) == 0
        _strict(capsys.readouterr().out)
    assert main(["inspect", str(path)]) == 0


def test_odd_annotations_and_times_make_no_nan_markers():
    odd = [
        {"stage": "START", "name": "ok", "device": 0, "time_us": 2_000_000},
        {"stage": None, "name": ["x"], "device": 0, "time_us": 3},
        {"stage": "END", "name": "n", "device": 0, "time_us": NAN},
        {"stage": "END", "name": "n", "device": 0, "time_us": 10**30},
        {"stage": "END", "name": "n", "device": 0, "time_us": True},
        "not a dict",
    ]
    marks = annotation_marks(odd, 0)
    assert [m["label"] for m in marks] == ["ok", "?"]
    assert all(math.isfinite(m["t"]) for m in marks)
    assert annotation_marks(7, 0) == []  # type: ignore[arg-type]
    trace = [{"time_us": 1}, {"time_us": NAN}, {"time_us": 3}]
    points = recorded_points(trace, [1, 2, 3], [4, 5, 6])
    assert [p[0] for p in points] == [0.0, 1.0, 2.0]  # no usable times: entry index
    assert trace_times(trace).tolist() == [1, 1, 3]
