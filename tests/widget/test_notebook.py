"""Every notebook in example_notebooks/ runs headless (nbclient, a real kernel) and shows what it
says it shows; each is committed without outputs, holds no `assert`, and declares its
dependencies (PEP 723). The .ipynb files are their own source (no generator writes them): edit
one in Jupyter, then `jupyter nbconvert --clear-output --inplace` it before committing, which
`test_notebook_is_stripped_and_declares_its_dependencies` holds.

The notebooks are tutorials: their checks live in tests/notebook_outcomes.py. A run here adds
that module's probe cells to a copy of the notebook in tmp_path (so nothing it writes lands in
the tree), executes it, reads the probes' values back and asserts on them and on the printed
text, so a silently changed outcome fails like an error. A planted change to a recorded run's
values shows the checks notice one.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat import NotebookNode

from notebook_outcomes import MARK, OUTCOMES, probe_source

FOLDER = Path(__file__).resolve().parents[2] / "example_notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
CELL_TIMEOUT_S = 180
PROBE = "gpumemviz_probe"  # the metadata key that marks a probe cell


def _code(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


@dataclass(frozen=True)
class Run:
    """An executed notebook (its own cells only), its probes' values, and what it printed."""

    nb: NotebookNode
    values: dict[str, Any]
    text: str


def _execute(path: Path, folder: Path) -> Run:
    work = folder / path.name
    shutil.copyfile(path, work)
    nb = nbformat.read(work, as_version=4)
    probes = OUTCOMES[path.name].probes
    missing = set(probes) - {c.get("id") for c in nb.cells}
    assert not missing, f"probes after cells that {path.name} lacks: {sorted(missing)}"
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if cell.get("id") in probes:
            probe = nbformat.v4.new_code_cell(probe_source(probes[cell.id]))
            probe.metadata[PROBE] = cell.id
            cells.append(probe)
    nb.cells = cells

    from nbclient import NotebookClient

    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(folder)}},
    )
    start = time.monotonic()
    client.execute()  # raises CellExecutionError naming the failing cell
    print(f"{path.name}: {time.monotonic() - start:.1f} s")

    values: dict[str, Any] = {}
    for cell in [c for c in nb.cells if PROBE in c.metadata]:
        lines = [
            line
            for o in cell.outputs
            if o.output_type == "stream"
            for line in o.text.splitlines()
            if line.startswith(MARK)
        ]
        assert len(lines) == 1, (cell.metadata[PROBE], cell.outputs)
        got = json.loads(lines[0][len(MARK) :])
        assert got.keys() == probes[cell.metadata[PROBE]].keys()
        values.update(got)
    nb.cells = [c for c in nb.cells if PROBE not in c.metadata]
    outputs = [o for c in _code(nb) for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    return Run(nb, values, text)


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> Callable[[Path], Run]:
    """`executed(path)`: the notebook's run, once per module (the planted changes reuse it)."""
    runs: dict[str, Run] = {}

    def get(path: Path) -> Run:
        if path.name not in runs:
            runs[path.name] = _execute(path, tmp_path_factory.mktemp(path.stem))
        return runs[path.name]

    return get


def test_the_examples_are_there():
    names = [p.name for p in NOTEBOOKS]
    assert "01_quickstart.ipynb" in names and len(names) >= 4, names
    assert sorted(OUTCOMES) == names  # each has its checks


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stripped_and_declares_its_dependencies(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = _code(nb)
    assert all(c.outputs == [] and c.execution_count is None for c in code), "outputs not stripped"
    first = code[0].source
    block = re.search(r"^# /// script\n((?:#.*\n)+?)# ///$", first, re.M)
    assert block and nb.cells[0] is code[0], "the first cell opens with a PEP 723 block"
    assert "dependencies = [" in block.group(1)
    assert re.search(r'"gpumemviz(\[[a-z,]+\])?"', block.group(1)), block.group(1)
    static = OUTCOMES[path.name].static
    if static is not None:
        static(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_a_tutorial_without_asserts(path: Path):
    nb = nbformat.read(path, as_version=4)
    found = [
        (c.get("id"), line.strip())
        for c in nb.cells
        for line in c.source.splitlines()
        if re.search(r"\bassert\b", line)
    ]
    assert not found, f"checks belong in tests/notebook_outcomes.py: {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless_and_shows_its_outcomes(path: Path, executed):
    run = executed(path)
    OUTCOMES[path.name].check(run.values, run.text, run.nb)


def _set(*keys_and_value: Any) -> Callable[[dict[str, Any]], None]:
    """A planted change: sets values[k1][k2]... to the last argument."""
    *keys, value = keys_and_value

    def plant(values: dict[str, Any]) -> None:
        target = values
        for k in keys[:-1]:
            target = target[k]
        assert keys[-1] in target, keys
        target[keys[-1]] = value

    return plant


def _as_recorded(values: dict[str, Any]) -> None:
    """A planted change: expandable segments need the recorded settings' smallest budget."""
    values["need"]["expandable"] = values["need"]["recorded settings"]


PLANTED = {
    # notebook, what changed -> the change to its recorded values
    ("01_quickstart", "the header stopped following the allocator"): _set("n_seen", 1),
    ("02_fragmentation_and_fixes", "the training run no longer runs out of memory"): _set(
        "by", "as is (batch 8)", "completed", True
    ),
    ("02_fragmentation_and_fixes", "the OOM is one of capacity"): _set("cause", "capacity"),
    ("02_fragmentation_and_fixes", "expandable segments no longer complete"): _set(
        "by", "expandable_segments:True", "completed", False
    ),
    ("03_replay_a_snapshot", "expandable segments need as large a budget"): _as_recorded,
    ("04_paged_kv_cache", "the paged cache runs out of 22 GiB"): _set("paged_completed", False),
    ("05_will_it_fit", "batch 8 no longer fits"): _set("fits", False),
    ("05_will_it_fit", "expandable segments no longer save segments"): _set(
        "segments", "expandable_segments:True", 10_000
    ),
}


@pytest.mark.parametrize("case", PLANTED, ids=[f"{nb}: {what}" for nb, what in PLANTED])
def test_a_changed_outcome_fails_the_notebook_check(case: tuple[str, str], executed):
    name = f"{case[0]}.ipynb"
    run = executed(FOLDER / name)
    check = OUTCOMES[name].check
    values = copy.deepcopy(run.values)
    check(values, run.text, run.nb)  # as recorded: passes
    PLANTED[case](values)
    with pytest.raises(AssertionError):
        check(values, run.text, run.nb)


def test_make_demo_runs_the_cli_demo_command():
    """`make demo` is `gpumemviz demo` (one command, no copy of its jupyter line in the
    Makefile), and that command opens JupyterLab on the quickstart notebook."""
    import subprocess
    import sys

    root = FOLDER.parent
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(
        [make, "-n", "-s", "demo"], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert dry.returncode == 0, dry.stderr
    lines = [ln for ln in dry.stdout.splitlines() if ln.strip()]
    assert lines[-1].endswith("/bin/gpumemviz demo")
    assert "jupyter" not in "\n".join(lines)
    cli = Path(sys.executable).parent / "gpumemviz"
    shown = subprocess.run(
        [str(cli), "demo", "--print-command", "--no-browser"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"cd {FOLDER} && " in shown.stdout
    assert "jupyter lab --ServerApp.ip=127.0.0.1" in shown.stdout
    assert "--LabApp.default_url=/lab/tree/01_quickstart.ipynb" in shown.stdout


def test_what_the_demo_leaves_beside_the_notebooks_is_ignored_by_git():
    """The panel's export button writes gpumemviz-snapshot-*.pickle into the notebook's folder
    (its working directory) and JupyterLab keeps .ipynb_checkpoints/ there: after a demo,
    `git status` in a clone shows neither."""
    import subprocess

    root = FOLDER.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    left = [
        "example_notebooks/gpumemviz-snapshot-20261206-120000.pickle",
        "example_notebooks/.ipynb_checkpoints/01_quickstart-checkpoint.ipynb",
    ]
    out = subprocess.run(
        ["git", "check-ignore", "--no-index", *left], cwd=root, capture_output=True, text=True
    )
    assert out.stdout.split() == left, out.stderr
    kept = subprocess.run(
        ["git", "check-ignore", "--no-index", "example_notebooks/01_quickstart.ipynb"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert kept.returncode == 1  # the notebooks themselves stay tracked
