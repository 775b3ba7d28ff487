"""A short, seeded slice of `make fuzz` (tools/fuzz.py), so the fuzzers cannot rot.

The same mutators, targets and guard as the long run, on a fixed seed and a fixed number of cases
per target. Findings already reported to their owners (`KNOWN` in tools/fuzz.py) are tolerated
and listed; anything else fails the test with its reproducer's path.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import pickle
import random
import sys
from pathlib import Path

import pytest

from gpumemviz.io import load_snapshot
from gpumemviz.snapshot import SnapshotError

REPO = Path(__file__).resolve().parents[1]


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(
        f"gpumemviz_tools_{name}", REPO / "tools" / f"{name}.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


fuzz = _load_tool("fuzz")


def test_seeded_slice_finds_nothing_new(tmp_path, capsys):
    out = tmp_path / "findings"
    rc = fuzz.main(
        ["--seconds", "40", "--cases", "25", "--seed", "3", "--out", str(out), "--slices", "2"]
    )
    text = capsys.readouterr().out
    counts = {
        line.split()[0]: int(line.split()[1])
        for line in text.splitlines()
        if line.split()[:1] and line.split()[0] in fuzz.TARGETS
    }
    assert counts == dict.fromkeys(fuzz.TARGETS, 25), text
    new = [ln for ln in text.splitlines() if "[NEW]" in ln]
    assert rc == 0 and not new, f"new findings (reproducers in {out}):\n{text}"


def test_guard_kills_a_hung_case_and_saves_its_input(tmp_path, capsys):
    rc = fuzz.main(
        ["--targets", "_hang", "--cases", "1", "--seconds", "30", "--case-timeout", "1",
         "--out", str(tmp_path), "--slices", "1"]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 1 and "hang@_hang" in text, text
    saved = list(tmp_path.glob("hang__hang-*.bin"))
    assert len(saved) == 1 and saved[0].stat().st_size > 0


@pytest.mark.parametrize("payload", fuzz._canary_payloads())
def test_injected_globals_never_run(payload):
    canary = fuzz.install_canary()
    data = b"\x80\x02" + payload + b"."
    names_canary = not payload.startswith((b"P", b"U"))  # persistent ids name no global
    if names_canary:
        # the canary works: an unrestricted unpickler does run these (never done on a real file)
        with contextlib.suppress(Exception):  # only whether the canary ran matters
            pickle.loads(data)  # our own canary, to prove the check would see it
    ran_plain = bool(canary.tripped)
    canary.tripped.clear()
    # the plain load above left what the EXT codes name in copyreg's extension cache, which the
    # C unpickler reads without asking find_class: the restricted loader must refuse them anyway
    with pytest.raises(SnapshotError):
        load_snapshot(data)
    assert not canary.tripped
    if names_canary:
        assert ran_plain, "the canary did not trip under plain pickle: it proves nothing"


def test_mutations_are_deterministic():
    seeds = fuzz.load_seeds(5, slices=1)
    for target in fuzz.TARGETS:
        a = [fuzz.make_case(target, seeds, [], random.Random(9)) for _ in range(1)]
        b = [fuzz.make_case(target, seeds, [], random.Random(9)) for _ in range(1)]
        assert fuzz._encode_case(a[0]) == fuzz._encode_case(b[0])


def test_shrink_keeps_the_finding():
    data = b"junk" * 50 + b"KEY" + b"more" * 50
    small = fuzz.shrink(data, lambda c: b"KEY" in c, budget_s=5)
    assert small == b"KEY"


def test_the_dict_target_finds_the_two_ways_apart(monkeypatch):
    """`fragmentation(d)` against `fragmentation(Snapshot.from_torch(d))`: equal on a plain
    segment list, and a finding as soon as the dict way reads something else."""
    importlib.import_module("gpumemviz.fragmentation")
    frag_module = sys.modules["gpumemviz.fragmentation"]  # the module, not the function
    case = fuzz.load_seeds(5, slices=1).dicts[-1]  # the plain segment list of every run
    assert isinstance(case, list) and fuzz.run_fragmentation(copy.deepcopy(case)) == "frag:report"
    real = frag_module.from_torch
    monkeypatch.setattr(frag_module, "from_torch", lambda d: real(d + d))  # a segment too many
    with pytest.raises(fuzz.Finding) as found:
        fuzz.run_fragmentation(copy.deepcopy(case))
    assert found.value.sig == "frag-differs@report"
