"""Issue 29, one voice: every front end (panel, magic, inspect, report, diff) shows what
`gpumemviz.analyze` found and composes nothing of its own; on every real recording they carry
the same advice, rejected list and OOM cause; the live header shows one moment."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import REAL_FILES, real_file
from gpumemviz.analysis import findings as findings_module
from gpumemviz.analysis.findings import Action, AdviceItem, Findings, OomFinding, analyze
from gpumemviz.cli import main
from gpumemviz.io import load_snapshot
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.render.rows import build_rows
from gpumemviz.render.wire import header_numbers
from gpumemviz.reporting import html_report
from gpumemviz.reporting.html_report import report_data
from gpumemviz.widget import MemoryPanel, devices
from gpumemviz.widget.magics import summary

YIYI_OOM = "Yiyi-philosophy__LLM-inference__oom_snapshot.pickle"
SUN_OOM = "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"
ADVICE = "SENTINEL ADVICE: set nothing, this is a test"
OOM = "SENTINEL OOM explanation"


def _sentinel(real: Findings) -> Findings:
    """Findings no front end could compose: one advice, one OOM, on device 0."""
    advice = AdviceItem(
        kind="expandable_segments",
        message=ADVICE,
        device=0,
        setting="expandable_segments:True",
        checked=False,
    )
    oom = OomFinding(
        device=0,
        entry=None,
        request=3 << 30,
        rounded=3 << 30,
        cause="capacity",
        explanation=OOM,
        basis="event",
        reserved=1,
        allocated=1,
        free_in_reserved=0,
        largest_free=0,
        device_free=0,
        outside=0,
        frame=None,
        actions=(Action("smaller_batch_or_checkpointing", "SENTINEL ACTION", 7 << 20),),
    )
    one = dataclasses.replace(real, device=0, advice=(advice,), oom=oom, devices={})
    return dataclasses.replace(real, device=None, advice=(advice,), oom=oom, devices={0: one})


@pytest.fixture
def sentinel(monkeypatch):
    """`analyze` patched everywhere it is imported, returning the sentinel."""
    path = real_file(YIYI_OOM)
    total = _sentinel(analyze(path))

    def fake(source, *, device=None, **_):
        return total if device is None else total.devices[0]

    for where in (findings_module, html_report, devices):
        monkeypatch.setattr(where, "analyze", fake)
    return path, total


def test_every_front_end_shows_the_sentinel(sentinel, capsys):
    path, total = sentinel
    sentence = total.oom.sentence
    # inspect: text and --json
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert ADVICE in text and sentence in text and "SENTINEL ACTION" in text
    assert main(["inspect", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["advice"][0]["message"] == ADVICE and out["oom"]["sentence"] == sentence
    # the report's embedded data
    data = report_data(load_snapshot(path))
    assert [a["message"] for a in data["advice"]] == [ADVICE]
    assert data["oom"]["sentence"] == sentence
    assert data["ooms"]["0"]["actions"][0]["sentence"] == "SENTINEL ACTION"
    # diff: both sides
    assert main(["diff", str(path), str(path)]) == 0
    text = capsys.readouterr().out
    assert text.count(ADVICE) == 2 and text.count(sentence) == 2
    # the magic's terminal text
    snap = load_snapshot(path)
    from gpumemviz.snapshot.sample import Sample

    text = summary(Sample(time=0.0, device=0, stats=None, segments=snap))
    assert ADVICE in text and sentence in text
    # the panel: a snapshot shown, and a live sample
    panel = MemoryPanel.from_snapshot(snap)
    try:
        assert panel.wait_checked(30)
        assert [a["message"] for a in panel.advice if a["kind"] != "note"] == [ADVICE]
        assert panel.oom["sentence"] == sentence and panel.findings.advice[0].message == ADVICE
    finally:
        panel.close()
    sampler = Sampler(SimulatedSource(autostart=False))
    panel = MemoryPanel()
    try:
        panel.attach(sampler)
        sampler.sample_once(segments=True)
        assert panel.flush()
        assert [a["message"] for a in panel.advice if a["kind"] != "note"] == [ADVICE]
        assert panel.oom["sentence"] == sentence
    finally:
        panel.close()
        sampler.close()


def _voice(advice: list[dict], rejected: list[dict], oom: dict | None) -> tuple:
    def rows(items: list[dict]) -> list[tuple]:
        return [(a["kind"], a["message"], a["device"]) for a in items]

    return rows(advice), rows(rejected), None if oom is None else oom["cause"]


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
def test_inspect_report_and_analyze_say_the_same_per_device(path, capsys):
    snap = load_snapshot(path)
    found = analyze(snap)
    data = report_data(snap)
    assert _voice(data["advice"], data["advice_rejected"], data["oom"]) == _voice(
        [a.to_dict() for a in found.advice],
        [a.to_dict() for a in found.rejected],
        None if found.oom is None else found.oom.to_dict(),
    )
    for d, mine in found.devices.items():
        assert main(["inspect", str(path), "--device", str(d), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        want = mine.to_dict()
        assert _voice(out["advice"], out["rejected"], out["oom"]) == _voice(
            want["advice"], want["rejected"], want["oom"]
        )
        in_report = (
            [a for a in data["advice"] if a["device"] == d],
            [a for a in data["advice_rejected"] if a["device"] == d],
            data["ooms"].get(str(d)),
        )
        assert _voice(*in_report) == _voice(want["advice"], want["rejected"], want["oom"])
        if mine.oom is not None:  # the same ranked actions everywhere, each with bytes
            actions = want["oom"]["actions"]
            assert actions and all(a["effect"] > 0 for a in actions)
            assert out["oom"]["actions"] == actions == data["ooms"][str(d)]["actions"]


@pytest.mark.parametrize("name", [YIYI_OOM, SUN_OOM])
def test_an_oom_file_never_reads_as_nothing_to_change(name, capsys):
    path = real_file(name)
    found = analyze(path)
    assert found.oom is not None and found.oom.actions
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "nothing worth changing" not in text and found.oom.sentence in text
    first = found.oom.actions[0]
    assert first.sentence in text
    panel = MemoryPanel.from_snapshot(path)
    try:
        assert panel.wait_checked(60)
        want = found.for_device(found.oom.device).to_dict()
        assert panel.device_findings[found.oom.device].to_dict() == want
        assert panel.oom["cause"] == found.oom.cause
        assert panel.oom["actions"][0]["effect"] == first.effect
    finally:
        panel.close()


FIGURES = ("reserved", "allocated", "pending_free", "free")


def _law(fig: dict) -> None:
    assert fig["allocated"] + fig["pending_free"] + fig["free"] == fig["reserved"]


def test_the_live_header_shows_one_moment_for_200_refreshes():
    sampler = Sampler(SimulatedSource("training", autostart=False))
    panel = MemoryPanel()
    try:
        panel.attach(sampler)
        for i in range(200):
            # segment reads and stats-only ticks interleaved, as the sampler's gaps make them
            sampler.sample_once(segments=i % 3 == 0)
            assert panel.flush()
            shown = header_numbers(build_rows(panel.shown, device=0))
            head = panel.header
            _law(shown)
            assert {k: head[k] for k in FIGURES} == {k: shown[k] for k in FIGURES}, i
    finally:
        panel.close()
        sampler.close()


def test_every_device_strip_and_the_totals_show_one_moment_for_200_refreshes():
    samplers = {
        d: Sampler(SimulatedSource("training", device=d, autostart=False)) for d in range(4)
    }
    panel = MemoryPanel()
    try:
        panel.attach_devices(samplers, owned=True)
        for i in range(200):
            for d, s in samplers.items():
                s.sample_once(segments=(i + d) % 3 == 0)
            assert panel.flush()
            strips = {int(s["device"]): s for s in panel.strips["strips"]}
            per = panel.device_findings
            total = dict.fromkeys(FIGURES, 0)
            for d, strip in strips.items():
                if d not in per:  # not read with its segments yet: an empty strip
                    assert strip["reserved"] == 0
                    continue
                g = per[d].figures
                figures = {
                    "reserved": g.reserved,
                    "allocated": g.allocated,
                    "pending_free": g.pending_free,
                    "free": g.free_in_reserved,
                }
                _law(figures)
                assert {k: strip[k] for k in FIGURES} == figures, (i, d)
                for k in FIGURES:
                    total[k] += figures[k]
            _law(total)
            assert {k: panel.strips["totals"][k] for k in FIGURES} == total, i
            selected = panel.strips["selected"]
            head = panel.header
            if selected is not None and per:
                assert {k: head[k] for k in FIGURES} == {
                    k: strips[list(strips)[selected]][k] for k in FIGURES
                }
    finally:
        panel.close()
