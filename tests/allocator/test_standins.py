"""The model-made stand-ins (tests/data/standin/) are what tools/make_standins.py makes, and
each holds the class of recording it stands in for in a clone without ../shared."""

from __future__ import annotations

import importlib.util
import pickle
import sys
from collections import Counter

import pytest

from conftest import REPO, STANDIN_FILES, read_real, standin_file

TOOL = REPO / "tools" / "make_standins.py"


@pytest.fixture(scope="module")
def make_standins():
    spec = importlib.util.spec_from_file_location("make_standins", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_standins"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("make_standins", None)


def test_the_committed_stand_ins_are_what_the_tool_makes(make_standins):
    assert {p.name for p in STANDIN_FILES} == set(make_standins.STANDINS)
    for name, make in make_standins.STANDINS.items():
        assert read_real(standin_file(name[len("standin__") : -len(".pickle")])) == make(), name


def test_check_mode_names_a_stale_file(make_standins, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(make_standins, "OUT", tmp_path)
    assert make_standins.main(["--check"]) == 1
    assert "stale stand-ins" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # --check writes nothing
    assert make_standins.main([]) == 0
    assert make_standins.main(["--check"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(make_standins.STANDINS)  # no temporary file left behind
    for name in names:
        assert (tmp_path / name).read_bytes() == pickle.dumps(
            make_standins.STANDINS[name](), protocol=4
        )


def _actions(trace: list[dict]) -> Counter:
    return Counter(e["action"] for e in trace)


def test_expandable_oom_stand_in_is_three_devices_with_an_oom_on_device_1():
    d = read_real(standin_file("expandable_oom_3dev"))
    assert d["allocator_settings"]["expandable_segments"] is True
    assert {s["device"] for s in d["segments"]} == {0, 1, 2}
    assert all(s["is_expandable"] for s in d["segments"])
    traces = d["device_traces"]
    assert len(traces) == 4 and traces[3] == []  # an idle fourth device, as torch lists it
    assert [_actions(t)["oom"] for t in traces[:3]] == [0, 1, 0]
    assert _actions(traces[1])["segment_unmap"] >= 1  # release-and-retry before the oom
    assert all(_actions(t)["segment_map"] > 0 for t in traces[:3])
    assert all(e["frames"] for t in traces for e in t)
    oom = next(e for e in traces[1] if e["action"] == "oom")
    assert oom["device_free"] < oom["size"]


def test_streams10_stand_in_has_ten_streams_and_frees_that_wait():
    d = read_real(standin_file("streams10"))
    assert list(d) == ["segments", "device_traces"]  # an older torch's keys: no settings
    (trace,) = d["device_traces"]
    assert len({e["stream"] for e in trace}) == 10
    assert "time_us" not in trace[0]
    acts = _actions(trace)
    assert acts["segment_free"] > 0 and acts["segment_alloc"] > acts["segment_free"]
    waited = sum(
        1
        for i, e in enumerate(trace)
        if e["action"] == "free_requested"
        and not (trace[i + 1]["action"] == "free_completed" and trace[i + 1]["addr"] == e["addr"])
    )
    assert waited > 50  # record_stream: the free completes after another stream's event


def test_training_stand_in_is_a_ring_of_ten_thousand_entries():
    d = read_real(standin_file("training_10k"))
    (trace,) = d["device_traces"]
    assert len(trace) == 10_000
    acts = _actions(trace)
    # the ring dropped the run's start: some frees have no alloc in the window
    assert acts["free_requested"] > 0 and acts["segment_free"] > 0 and acts["segment_alloc"] > 0
    allocated = {e["addr"] for e in trace if e["action"] == "alloc"}
    assert any(e["addr"] not in allocated for e in trace if e["action"] == "free_requested")
    times = [e["time_us"] for e in trace]
    assert times == sorted(times) and times[0] > 10**15  # Unix microseconds


def test_stand_ins_are_small():
    assert sum(p.stat().st_size for p in STANDIN_FILES) < 2_000_000
