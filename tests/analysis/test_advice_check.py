"""check_advice(): setting advice is replayed on the recorded trace; what the replay refutes is
not suggested, what it confirms keeps its numbers, and advice without a trace is untouched."""

from __future__ import annotations

import json

import pytest

from conftest import fragmented_segments, read_real, real_file, recorded_peaks, standin_file
from gpumemviz.allocator import workloads
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay import replay
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.analysis.advice import Advice, advise, oom_device_free
from gpumemviz.analysis.advice_check import (
    CHECKED_KINDS,
    ReplayCheck,
    SharedReplay,
    check_advice,
    setting_of,
)
from gpumemviz.analysis.findings import NOT_CHECKED
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.cli import main
from gpumemviz.reporting.html_report import report_data
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.units import format_size


def _cranberrii():
    """cranberrii's trace (CI-only: the test skips in one line without it): both setting rules
    fire; the replay confirms expandable segments and refutes max_split_size_mb."""
    return real_file("cranberrii__ftcourse__memory_snapshot.pickle")


#: The stand-ins that ship, for the same paths in every clone: on the 10-stream one the replay
#: refutes expandable segments (a little more reserved at the peak); on the training one it
#: finds no gain (the same peak, fewer segments), so the advice stays with "(no gain)".
STREAMS = "streams10"
TRAINING = "training_10k"


def _inspect_advice(snapshot) -> list[Advice]:
    """What `gpumemviz inspect` advises before the check: per device, with a recorded OOM's size."""
    report = fragmentation(snapshot)
    ooms = oom_device_free(snapshot)
    out: list[Advice] = []
    for d, f in report.devices.items():
        total = f.reserved + ooms[d] if d in ooms else None
        out += advise(report, device=d, device_total=total)
    return out


@pytest.fixture(scope="module")
def cranberrii():
    d = read_real(_cranberrii())
    return d, check_advice(d, _inspect_advice(d))


def test_max_split_is_rejected_on_cranberrii_with_the_replays_numbers(cranberrii):
    d, checked = cranberrii
    assert "max_split_size_mb" in [a.kind for a in _inspect_advice(d)]  # today's advice
    assert "max_split_size_mb" not in [a.kind for a in checked.advice]
    (c,) = checked.rejected
    assert c.advice.kind == "max_split_size_mb" and c.check is not None
    assert c.check.setting == "max_split_size_mb:32" and c.check.verdict == "worse"
    # the numbers are whatif's, replayed independently here
    r = replay(d, config="max_split_size_mb:32")
    assert c.check.peak_reserved_before == r.recorded[0].peak_reserved
    assert c.check.peak_reserved_after == r.devices[0].peak_reserved
    assert c.check.peak_reserved_after > c.check.peak_reserved_before
    assert (c.check.peak_segments_before, c.check.peak_segments_after) == (215, 304)
    assert c.check.oom_before is None and c.check.oom_after is None
    before, after = (
        format_size(c.check.peak_reserved_before),
        format_size(c.check.peak_reserved_after),
    )
    assert (before, after) == ("6.03 GiB", "6.07 GiB")
    assert c.advice.message.endswith(
        f"Replay of the recorded trace with max_split_size_mb:32: peak reserved {before} -> "
        f"{after}, peak segments 215 -> 304: worse, so not suggested."
    )
    assert c.advice.evidence["replay_peak_reserved_with_setting"] == c.check.peak_reserved_after
    assert c.advice.evidence["suggested_max_split_size_mb"] == 32  # advise()'s evidence kept


def test_expandable_is_confirmed_on_cranberrii_and_keeps_its_numbers(cranberrii):
    d, checked = cranberrii
    (c,) = checked.shown
    assert c.advice.kind == "expandable_segments" and c.check is not None
    assert c.check.verdict == "better"
    r = replay(d, config="expandable_segments:True")
    assert c.check.peak_reserved_after == r.devices[0].peak_reserved
    assert format_size(c.check.peak_reserved_after) == "5.55 GiB"
    assert c.check.peak_segments_after == 65 and c.check.events == 10307
    assert c.advice.message.endswith(
        "Replay of the recorded trace with expandable_segments:True: peak reserved 6.03 GiB -> "
        "5.55 GiB, peak segments 215 -> 65."
    )
    ev = c.advice.evidence
    assert ev["replay_peak_reserved"] == c.check.peak_reserved_before
    assert ev["replay_peak_segments_with_setting"] == 65
    assert ev["replay_oom_at"] == ev["replay_oom_at_with_setting"] == ev["replay_capacity"] == -1
    assert c.to_dict()["replay"]["verdict"] == "better"


def test_advice_without_a_trace_is_unchanged(recorded_path):
    d = read_real(recorded_path)
    advice = _inspect_advice(d)
    checked = check_advice(d, advice)
    traced = {i for i, t in enumerate(d.get("device_traces") or []) if t}
    for c in checked.shown:
        if c.advice.evidence.get("device") not in traced or c.advice.kind not in CHECKED_KINDS:
            assert c.check is None and c.advice in advice
    if not traced:
        assert checked.advice == advice and checked.rejected == []
        assert all(c.unchecked for c in checked.shown if c.advice.kind in CHECKED_KINDS)


def test_a_fragmented_dict_without_trace_keeps_todays_advice():
    segs = fragmented_segments()
    d = {"segments": segs, "device_traces": [[]]}
    advice = advise(d)
    assert [a.kind for a in advice] == ["expandable_segments", "max_split_size_mb"]
    checked = check_advice(d, advice)
    assert checked.advice == advice and checked.rejected == []
    assert [c.unchecked for c in checked.shown] == ["no recorded trace for device 0"] * 2


def test_the_recorded_oom_avoided_is_said_and_counts_as_better():
    # docs/advice.md's training loop: OOM at operation 10,885 with the defaults
    w = workloads.WORKLOADS["training"]
    a = CachingAllocator(w.capacity, w.config)
    assert not workloads.run(w, a).completed
    snap = a.snapshot()
    checked = check_advice(snap, [Advice("expandable_segments", "Try it.", {"device": 0})])
    (c,) = checked.shown
    assert c.check is not None and c.check.capacity == w.capacity
    assert c.check.oom_before is not None and c.check.oom_after is None
    assert c.check.verdict == "better"
    assert f"the OOM at entry {c.check.oom_before} avoided." in c.advice.message
    assert format_size(c.check.peak_reserved_after) == "16.94 GiB"  # docs/advice.md's table


def _check(**kw) -> ReplayCheck:
    base = {
        "device": 0,
        "setting": "expandable_segments:True",
        "settings": "expandable_segments:True",
        "events": 10,
        "capacity": None,
        "peak_reserved_before": 100,
        "peak_reserved_after": 100,
        "peak_segments_before": 3,
        "peak_segments_after": 3,
        "oom_before": None,
        "oom_after": None,
        "seconds": 0.0,
    }
    return ReplayCheck(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "verdict", "said"),
    [
        ({"peak_reserved_after": 90}, "better", "peak reserved 100 bytes -> 90 bytes"),
        ({"peak_reserved_after": 110}, "worse", "worse, so not suggested"),
        ({}, "same", "(no gain)"),
        ({"oom_after": 7, "peak_reserved_after": 50}, "worse", "an OOM at entry 7 that the"),
        ({"oom_before": 7, "peak_reserved_after": 150}, "better", "the OOM at entry 7 avoided"),
        ({"oom_before": 7, "oom_after": 5}, "worse", "OOM at entry 7 -> 5"),
        ({"oom_before": 7, "oom_after": 9}, "better", "OOM at entry 7 -> 9"),
        ({"oom_before": 7, "oom_after": 7}, "same", "the OOM at entry 7 reproduced"),
    ],
)
def test_verdict_puts_an_oom_before_peak_reserved(kw, verdict, said):
    c = _check(**kw)
    assert c.verdict == verdict
    assert said in c.sentence() and "\n" not in c.sentence()


def test_the_setting_is_added_to_the_recorded_settings():
    a = CachingAllocator(1 << 34, "garbage_collection_threshold:0.5")
    ptrs = [a.malloc(s << 20) for s in (30, 3, 30, 3, 30)]
    for p in ptrs[::2]:
        a.free(p)
    snap = Snapshot.from_torch(a.snapshot())
    advice = [
        Advice("max_split_size_mb", "Cap it.", {"device": 0, "suggested_max_split_size_mb": 32}),
        Advice("no_empty_cache_in_loop", "Not a setting.", {"num_alloc_retries": 5}),
    ]
    checked = check_advice(snap, advice)
    by_kind = {c.advice.kind: c for c in checked.shown + checked.rejected}
    assert by_kind["max_split_size_mb"].check.settings == (
        "garbage_collection_threshold:0.5,max_split_size_mb:32"
    )
    assert by_kind["no_empty_cache_in_loop"].check is None
    assert by_kind["no_empty_cache_in_loop"].advice is advice[1]
    assert setting_of(advice[1]) is None


def test_inspect_json_carries_the_replay_and_the_rejected(capsys):
    assert main(["inspect", str(_cranberrii()), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (shown,) = out["advice"]
    assert {"kind", "message", "evidence", "setting", "checked", "unchecked"} <= set(shown)
    assert shown["kind"] == "expandable_segments" and shown["unchecked"] is None
    assert shown["checked"] and shown["verdict"] == "better" and shown["device"] == 0
    assert shown["setting"] == "expandable_segments:True" and shown["segments_after"] == 65
    (rejected,) = out["rejected"]
    assert rejected["kind"] == "max_split_size_mb" and rejected["verdict"] == "worse"
    assert rejected["peak_reserved_after"] > rejected["peak_reserved_before"]
    assert rejected["reason"].endswith("worse, so not suggested.")


def test_inspect_text_lists_the_rejected_apart(capsys):
    assert main(["inspect", str(_cranberrii())]) == 0
    text = capsys.readouterr().out
    head, _, rejected = text.partition("checked and rejected")
    assert "[expandable_segments]" in head and "5.55 GiB, peak segments 215 -> 65." in head
    assert "[max_split_size_mb]" not in head
    assert "[max_split_size_mb]" in rejected and "worse, so not suggested." in rejected


def test_no_replay_gives_todays_advice(capsys):
    cranberrii = _cranberrii()
    assert main(["inspect", str(cranberrii), "--json", "--no-replay"]) == 0
    out = json.loads(capsys.readouterr().out)
    today = [a.to_dict() for a in _inspect_advice(read_real(cranberrii))]
    assert [{k: a[k] for k in ("kind", "message", "evidence")} for a in out["advice"]] == today
    assert all(not a["checked"] and a["unchecked"] == NOT_CHECKED for a in out["advice"])
    assert out["rejected"] == []
    assert main(["inspect", str(cranberrii), "--no-replay"]) == 0
    text = capsys.readouterr().out
    assert "[max_split_size_mb]" in text and "Replay of" not in text
    assert "checked and rejected" not in text


def test_the_html_report_lists_the_rejected_apart():
    snap = Snapshot.from_torch(read_real(_cranberrii()))
    data = report_data(snap)
    assert [a["kind"] for a in data["advice"]] == ["expandable_segments"]
    assert "Replay of the recorded trace" in data["advice"][0]["message"]
    assert [(a["kind"], a["device"]) for a in data["advice_rejected"]] == [("max_split_size_mb", 0)]
    plain = report_data(snap, replay_advice=False)
    assert [a["kind"] for a in plain["advice"]] == ["expandable_segments", "max_split_size_mb"]
    assert plain["advice_rejected"] == []


# -- the same paths on the stand-ins, which ship ---------------------------------------------


@pytest.fixture(scope="module")
def streams():
    d = read_real(standin_file(STREAMS))
    return d, check_advice(d, _inspect_advice(d))


def test_expandable_is_rejected_on_the_streams_standin_with_the_replays_numbers(streams):
    d, checked = streams
    assert [a.kind for a in _inspect_advice(d)] == ["expandable_segments"]  # today's advice
    assert checked.advice == [] and checked.shown == []
    (c,) = checked.rejected
    assert c.advice.kind == "expandable_segments" and c.check is not None
    assert c.check.setting == "expandable_segments:True" and c.check.verdict == "worse"
    # the recorded side from the raw trace; the setting's side is whatif's, replayed here
    assert (c.check.peak_reserved_before, c.check.peak_segments_before) == recorded_peaks(d)
    r = replay(d, config="expandable_segments:True")
    assert c.check.peak_reserved_before == r.recorded[0].peak_reserved
    assert c.check.peak_reserved_after == r.devices[0].peak_reserved
    assert c.check.peak_reserved_after > c.check.peak_reserved_before  # by 4 MiB
    assert (c.check.peak_segments_before, c.check.peak_segments_after) == (77, 23)
    assert c.check.oom_before is None and c.check.oom_after is None
    assert c.check.events == len(d["device_traces"][0]) == 1802
    before, after = (
        format_size(c.check.peak_reserved_before),
        format_size(c.check.peak_reserved_after),
    )
    assert (before, after) == ("1.56 GiB", "1.56 GiB")
    assert c.advice.message.endswith(
        f"Replay of the recorded trace with expandable_segments:True: peak reserved {before} -> "
        f"{after}, peak segments 77 -> 23: worse, so not suggested."
    )
    assert c.advice.evidence["replay_peak_reserved_with_setting"] == c.check.peak_reserved_after
    assert c.advice.evidence["replay_peak_segments_with_setting"] == 23


def test_expandable_without_gain_is_shown_on_the_training_standin():
    d = read_real(standin_file(TRAINING))
    checked = check_advice(d, _inspect_advice(d))
    (c,) = checked.shown
    assert checked.rejected == []
    assert c.advice.kind == "expandable_segments" and c.check is not None
    assert c.check.verdict == "same"
    assert (c.check.peak_reserved_before, c.check.peak_segments_before) == recorded_peaks(d)
    r = replay(d, config="expandable_segments:True")
    assert c.check.peak_reserved_after == r.devices[0].peak_reserved
    assert c.check.peak_reserved_after == c.check.peak_reserved_before  # 3.20 GiB both
    assert (c.check.peak_segments_before, c.check.peak_segments_after) == (46, 35)
    assert c.check.events == 10000
    assert c.advice.message.endswith(
        "Replay of the recorded trace with expandable_segments:True: peak reserved 3.20 GiB -> "
        "3.20 GiB, peak segments 46 -> 35 (no gain)."
    )
    assert c.to_dict()["replay"]["verdict"] == "same"


def test_inspect_json_and_text_on_the_streams_standin(capsys):
    path = standin_file(STREAMS)
    assert main(["inspect", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["advice"] == []
    (rejected,) = out["rejected"]
    assert rejected["kind"] == "expandable_segments" and rejected["verdict"] == "worse"
    assert rejected["device"] == 0 and rejected["segments_after"] == 23
    assert rejected["peak_reserved_after"] > rejected["peak_reserved_before"]
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    head, _, rest = text.partition("checked and rejected")
    assert "[expandable_segments]" not in head
    assert "[expandable_segments]" in rest and "worse, so not suggested." in rest


def test_no_replay_gives_todays_advice_on_the_streams_standin(capsys):
    path = standin_file(STREAMS)
    assert main(["inspect", str(path), "--json", "--no-replay"]) == 0
    out = json.loads(capsys.readouterr().out)
    today = [a.to_dict() for a in _inspect_advice(read_real(path))]
    assert [a["kind"] for a in today] == ["expandable_segments"]
    assert [{k: a[k] for k in ("kind", "message", "evidence")} for a in out["advice"]] == today
    assert all(not a["checked"] and a["unchecked"] == NOT_CHECKED for a in out["advice"])
    assert out["rejected"] == []
    assert main(["inspect", str(path), "--no-replay"]) == 0
    text = capsys.readouterr().out
    assert "[expandable_segments]" in text and "Replay of" not in text
    assert "checked and rejected" not in text


def test_the_html_report_lists_the_rejected_apart_on_the_streams_standin():
    snap = Snapshot.from_torch(read_real(standin_file(STREAMS)))
    data = report_data(snap)
    assert data["advice"] == []
    assert [(a["kind"], a["device"]) for a in data["advice_rejected"]] == [
        ("expandable_segments", 0)
    ]
    assert "worse, so not suggested." in data["advice_rejected"][0]["message"]
    plain = report_data(snap, replay_advice=False)
    assert [a["kind"] for a in plain["advice"]] == ["expandable_segments"]
    assert plain["advice_rejected"] == []


# -- one reconstruction, shared with the caller (the HTML report's timeline) ------------------


def test_a_shared_replay_is_prepared_once_and_its_recordings_are_the_trace_applied():
    snap = Snapshot.from_torch(read_real(standin_file(STREAMS)))
    shared = SharedReplay(snap)
    assert shared.recordings() == {}  # nothing is prepared before an advice needs it
    checked = check_advice(snap, _inspect_advice(snap), shared=shared)
    assert [c.advice.kind for c in checked.rejected] == ["expandable_segments"]
    first = shared.get()
    assert shared.get() is first  # made once, whatever asks again
    (dev,) = shared.recordings()
    fresh = Recording.from_snapshot(snap.to_torch(), dev)
    assert shared.recordings()[dev].allocated.tolist() == fresh.allocated.tolist()
    assert shared.recordings()[dev].segments.tolist() == fresh.segments.tolist()
    with pytest.raises(ValueError, match="another snapshot"):
        check_advice(Snapshot.from_torch(read_real(standin_file(STREAMS))), [], shared=shared)


def test_the_report_applies_each_trace_once(monkeypatch):
    """The advice check's reconstruction gives the timeline its figures: the recorded history
    of the device is built once (it was built twice, a second torch dict beside it)."""
    built: list[int] = []
    real = Recording.from_snapshot.__func__

    def counted(cls, snapshot, device=0, **kw):
        built.append(device)
        return real(cls, snapshot, device, **kw)

    monkeypatch.setattr(Recording, "from_snapshot", classmethod(counted))
    snap = Snapshot.from_torch(read_real(standin_file(STREAMS)))
    data = report_data(snap)
    assert [a["kind"] for a in data["advice_rejected"]] == ["expandable_segments"]
    assert built == [0]
    assert data["timeline"]["0"]["series"] == ["reserved", "allocated"]
    built.clear()  # without the check, the timeline applies the trace itself, once
    assert report_data(snap, replay_advice=False)["timeline"]["0"]["series"][1] == "allocated"
    assert built == [0]


def test_a_recorded_pass_that_fails_leaves_the_advice_unchecked(monkeypatch):
    """The recorded pass is driven when first read (`Prepared.recorded`); where it fails after
    the what-if pass ran, the advice says why it was not checked, as a failed what-if does,
    and nothing raises into `inspect`."""
    from gpumemviz.allocator.replay import Prepared, ReplayError

    def broken(self, dev):
        raise ReplayError(f"device {dev}: trace event 7: planted")

    monkeypatch.setattr(Prepared, "recorded_pass", broken)
    # as on a trace without release entries: the what-if passes do not read the recorded one
    monkeypatch.setattr(Recording, "releases", property(lambda self: False))
    d = read_real(standin_file(STREAMS))
    checked = check_advice(d, _inspect_advice(d))
    reasons = [c.unchecked for c in checked.shown if c.advice.kind in CHECKED_KINDS]
    assert reasons and all("planted" in (r or "") for r in reasons), reasons
    assert checked.rejected == []
