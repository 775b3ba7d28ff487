"""A snapshot's recorded allocator settings are parsed once: `Snapshot.config` holds them, and
`gpumemviz inspect` (fragmentation, advice, the advice's replay check) and `gpumemviz whatif`
read that one value instead of parsing the dict again at each step."""

from __future__ import annotations

import json

import pytest

from conftest import read_real, real_file
from gpumemviz.allocator.replay import replay
from gpumemviz.analysis import findings
from gpumemviz.analysis.advice import Advice
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.cli import main
from gpumemviz.io import load_snapshot
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.settings import AllocatorConfig, ConfigError

#: A shipped recording with a settings dict and a 3,840-entry trace on device 0.
WEDSONLIN = "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
#: CI-only: inspect advises two settings on it and replays both (no settings recorded).
CRANBERRII = "cranberrii__ftcourse__memory_snapshot.pickle"


def _parses(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The settings each parse of recorded settings was given, in order, from now on."""
    seen: list[object] = []
    parse = AllocatorConfig.from_settings.__func__  # type: ignore[attr-defined]

    def counting(cls: type[AllocatorConfig], d: object) -> AllocatorConfig:
        seen.append(d)
        return parse(cls, d)  # type: ignore[no-any-return]

    monkeypatch.setattr(AllocatorConfig, "from_settings", classmethod(counting))
    return seen


def _replayed(out: dict[str, list[dict[str, object]]]) -> list[dict[str, object]]:
    """The advice of an `inspect --json` whose replay ran."""
    return [a for a in out["advice"] + out["rejected"] if a["checked"]]


def test_inspect_parses_the_recorded_settings_once_through_its_replay(monkeypatch, capsys):
    path = real_file(WEDSONLIN)
    recorded = read_real(path)["allocator_settings"]
    assert recorded  # a real settings dict, not None
    # the shipped files draw no setting advice: inspect is handed one, so its check replays
    monkeypatch.setattr(
        findings,
        "advise_each_device",
        lambda *_: [Advice("expandable_segments", "Try it.", {"device": 0})],
    )
    seen = _parses(monkeypatch)
    assert main(["inspect", str(path), "--json"]) == 0
    assert len(_replayed(json.loads(capsys.readouterr().out))) == 1  # the replay ran
    assert seen == [recorded]


def test_inspect_parses_once_with_its_own_advice_and_two_replays(monkeypatch, capsys):
    path = real_file(CRANBERRII)
    seen = _parses(monkeypatch)
    assert main(["inspect", str(path), "--json"]) == 0
    assert len(_replayed(json.loads(capsys.readouterr().out))) == 2
    assert seen == [None]  # not recorded: parsed as torch's defaults, once


def test_whatif_parses_the_recorded_settings_once(monkeypatch, capsys):
    path = real_file(WEDSONLIN)
    seen = _parses(monkeypatch)
    assert main(["whatif", str(path), "--conf", "expandable_segments:True", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["what_if"] is True
    assert seen == [read_real(path)["allocator_settings"]]


def test_a_replay_of_a_torch_dict_parses_its_settings_once(monkeypatch):
    d = read_real(real_file(WEDSONLIN))
    seen = _parses(monkeypatch)
    result = replay(d, "expandable_segments:True")
    assert result.what_if and seen == [d["allocator_settings"]]


def test_the_snapshot_parses_on_first_use_and_keeps_the_value(monkeypatch):
    snap = load_snapshot(real_file(WEDSONLIN))
    seen = _parses(monkeypatch)
    assert seen == []  # loading does not parse
    config = snap.config
    assert snap.config is config and len(seen) == 1
    assert config == AllocatorConfig.from_settings(snap.allocator_settings)


def test_settings_that_do_not_parse_raise_the_same_error_at_each_use(monkeypatch):
    snap = Snapshot.from_torch(
        {"segments": [], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:1"}}
    )
    seen = _parses(monkeypatch)
    with pytest.raises(ConfigError) as first:
        _ = snap.config
    with pytest.raises(ConfigError) as again:
        _ = snap.config
    message = "CachingAllocator option max_split_size_mb too small, must be >= 20"
    assert str(first.value) == str(again.value) == message
    assert len(seen) == 1
    # the analysis still reads them leniently: the dict without its string, torch's defaults
    assert fragmentation(snap).config == AllocatorConfig()
