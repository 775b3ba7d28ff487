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
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gpumemviz.io import load_snapshot
from gpumemviz.snapshot import SnapshotError

REPO = Path(__file__).resolve().parents[2]


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
    importlib.import_module("gpumemviz.analysis.fragmentation")
    frag_module = sys.modules["gpumemviz.analysis.fragmentation"]  # the module, not the function
    case = fuzz.load_seeds(5, slices=1).dicts[-1]  # the plain segment list of every run
    assert isinstance(case, list) and fuzz.run_fragmentation(copy.deepcopy(case)) == "frag:report"
    real = frag_module.from_torch
    # a segment too many (the pools_in_use assumption passed through)
    monkeypatch.setattr(frag_module, "from_torch", lambda d, *rest: real(d + d, *rest))
    with pytest.raises(fuzz.Finding) as found:
        fuzz.run_fragmentation(copy.deepcopy(case))
    assert found.value.sig == "frag-differs@report"


# --- issue 15, point 9: shaped cases (tools/fuzz_shapes.py) and the CLI's output checks -------

shapes = fuzz.fuzz_shapes


def _leaves(x, seen=None) -> int:
    """Leaves of a value once every shared reference is expanded (counted once per object)."""
    seen = {} if seen is None else seen
    if not isinstance(x, list | dict):
        return 1
    if id(x) not in seen:
        items = x.values() if isinstance(x, dict) else x
        seen[id(x)] = sum(_leaves(v, seen) for v in items) or 1
    return seen[id(x)]


def test_shared_cases_are_small_files_that_expand_enormously():
    seeds = fuzz.load_seeds(5, slices=1)
    rng = random.Random(4)
    sizes, leaves = [], []
    for _ in range(40):
        case = shapes.shared_case(rng.choice(seeds.dicts), rng)
        sizes.append(len(pickle.dumps(case, protocol=4)))
        leaves.append(_leaves(case))
    assert max(sizes) < 1 << 20  # pickle keeps the sharing
    assert max(leaves) >= 1 << 30  # the 30-level doubling, 2^30 leaves once expanded
    assert len(pickle.dumps(shapes.doubling(30), protocol=2)) < 400


def test_odd_field_cases_carry_the_odd_types():
    seeds = fuzz.load_seeds(5, slices=1)
    rng = random.Random(8)
    seen = set()
    for _ in range(60):
        case = shapes.odd_fields_case(rng.choice(seeds.dicts), rng)
        text = repr(case)
        seen |= {w for w in ("nan", "inf", "None", "\\x1b", "\\udcff", "\\u202e") if w in text}
    assert seen == {"nan", "inf", "None", "\\x1b", "\\udcff", "\\u202e"}
    for target in fuzz.TARGETS:  # shaped cases are deterministic too
        a = fuzz.make_case(target, seeds, [], random.Random(2), shapes=1.0)
        b = fuzz.make_case(target, seeds, [], random.Random(2), shapes=1.0)
        assert fuzz._encode_case(a) == fuzz._encode_case(b)


def test_control_chars_names_what_a_terminal_must_not_get():
    assert shapes.control_chars("ok\tfine\n· ≤ ×") == []
    found = shapes.control_chars("\x1b]0;t\x07 a\rb \x9b \u202e \u2066 \x7f \x00")
    assert found == [ascii(c) for c in "\x1b\x07\r\x9b\u202e\u2066\x7f\x00"]


@pytest.mark.parametrize(
    ("printed", "sig"),
    [
        ("name \x1b]0;pwned\x07\n", "cli:control-chars@inspect"),
        ("over\rwritten\n", "cli:control-chars@inspect"),
        ("evil\u202egnp.py\n", "cli:control-chars@inspect"),
        ("\udcff\n", "cli:stdout-not-utf8@inspect"),
    ],
)
def test_the_cli_target_flags_unsafe_output(tmp_path, monkeypatch, printed, sig):
    import gpumemviz.cli

    def main(argv):
        print(printed, end="")
        return 0

    monkeypatch.setattr(gpumemviz.cli, "main", main)
    with pytest.raises(fuzz.Finding) as found:
        fuzz.run_cli(b"whatever", tmp_path)
    assert found.value.sig == sig


def test_the_cli_target_flags_nan_in_json_it_prints_or_writes(tmp_path, monkeypatch):
    import gpumemviz.cli

    def main(argv):
        if "--json" in argv:
            print('{"fragmentation": NaN}')
        return 0

    monkeypatch.setattr(gpumemviz.cli, "main", main)
    with pytest.raises(fuzz.Finding, match="NaN in JSON output") as found:
        fuzz.run_cli(b"whatever", tmp_path)
    assert found.value.sig == "cli:json@inspect-json"

    def main2(argv):
        if "--json" in argv:
            print("{}")
        if "-o" in argv and "json" in argv:
            Path(argv[argv.index("-o") + 1]).write_text('{"line": Infinity}')
        return 0

    monkeypatch.setattr(gpumemviz.cli, "main", main2)
    with pytest.raises(fuzz.Finding, match="Infinity in JSON output") as found:
        fuzz.run_cli(b"whatever", tmp_path)
    assert found.value.sig == "cli:json@export-json"


SHAPED = sorted((REPO / "tests" / "data" / "fuzz").glob("shaped_*"))


@pytest.mark.parametrize("target", ["cli", "pickle", "json"])
def test_shaped_findings_stay_fixed(target):
    """What the shaped generators found (issue 15), saved as tests/data/fuzz/shaped_*: 2^30-leaf
    DAGs in allocator settings, a frame's name and an unknown key; one frame list shared by
    every block and trace entry; odd frame fields and NaN settings; terminal control sequences
    in every string; a 5,000-digit JSON integer. Each through the target's checks in
    `tools/fuzz.py --reproduce` (the CLI's five runs under a hostile file name; the loader), in
    a subprocess with a deadline, so a hang fails the test instead of stalling the suite."""
    files = [p for p in SHAPED if target == "cli" or p.suffix == f".{target}"]
    assert files
    cmd = [sys.executable, str(REPO / "tools" / "fuzz.py"), "--target", target, "--reproduce"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    try:
        done = subprocess.run(
            [*cmd, *map(str, files)], capture_output=True, text=True, timeout=120, env=env
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{target}: still running after 120 s: {e.stdout!r}")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.count("\n") == len(files)
