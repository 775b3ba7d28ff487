"""Every notebook in example_notebooks/ runs headless (nbclient, a real kernel) and passes its
own assertions; each is committed without outputs and declares its dependencies (PEP 723).

A notebook asserts its outcomes in cells, so a silently wrong result fails here like an error.
Each runs from a copy in tmp_path, so nothing it writes lands in the tree.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest

FOLDER = Path(__file__).resolve().parents[1] / "example_notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
CELL_TIMEOUT_S = 180


def _code(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def _check_quickstart(nb) -> None:
    sources = [c.source for c in _code(nb)]
    assert "%load_ext gpumemviz" in sources
    assert any(s.startswith("panel = %gpumemviz") for s in sources)


def _check_quickstart_outputs(nb) -> None:
    outputs = [o for c in _code(nb) for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "steps; the header showed" in text
    assert "gpumemviz: device 0:" in text  # %gpumemviz status
    assert "gpumemviz: wrote" in text  # %gpumemviz export
    widgets = [
        o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert len(widgets) == 1  # the panel, displayed once


# notebook file name -> (static check, check of the executed notebook's outputs)
EXTRA: dict[str, tuple[Callable, Callable]] = {
    "01_quickstart.ipynb": (_check_quickstart, _check_quickstart_outputs),
}


def test_the_examples_are_there():
    names = [p.name for p in NOTEBOOKS]
    assert "01_quickstart.ipynb" in names and len(names) >= 4, names


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
    static, _ = EXTRA.get(path.name, (None, None))
    if static is not None:
        static(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless(path: Path, tmp_path: Path):
    from nbclient import NotebookClient

    work = tmp_path / path.name
    shutil.copyfile(path, work)
    nb = nbformat.read(work, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    start = time.monotonic()
    client.execute()  # raises CellExecutionError naming the failing cell and its assertion
    print(f"{path.name}: {time.monotonic() - start:.1f} s")
    _, outputs = EXTRA.get(path.name, (None, None))
    if outputs is not None:
        outputs(nb)


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
    assert shown.stdout.rstrip().endswith("01_quickstart.ipynb")
