"""example_notebooks/01_quickstart.ipynb runs headless (nbclient, a real kernel) and passes its
own assertions; it is committed without outputs and declares its dependencies (PEP 723)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).resolve().parents[1] / "example_notebooks" / "01_quickstart.ipynb"


def test_quickstart_is_stripped_and_declares_its_dependencies():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    first = code[0].source
    block = re.search(r"^# /// script\n((?:#.*\n)+?)# ///$", first, re.M)
    assert block, "the first cell opens with a PEP 723 block"
    assert '"gpumemviz"' in block.group(1) and "dependencies = [" in block.group(1)
    sources = [c.source for c in code]
    assert "%load_ext gpumemviz" in sources
    assert any(s.startswith("panel = %gpumemviz") for s in sources)


def test_quickstart_runs_headless(tmp_path):
    from nbclient import NotebookClient

    work = tmp_path / NOTEBOOK.name
    shutil.copyfile(NOTEBOOK, work)
    nb = nbformat.read(work, as_version=4)
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "steps; the header showed" in text
    assert "gpumemviz: device 0:" in text  # %gpumemviz status
    assert "gpumemviz: wrote" in text  # %gpumemviz export
    widgets = [
        o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert len(widgets) == 1  # the panel, displayed once
