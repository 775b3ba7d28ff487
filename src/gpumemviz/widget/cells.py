"""Which notebook cell a frame's code is: ipykernel runs each cell from a temporary file named
by a hash of the cell's source (``/tmp/ipykernel_<pid>/463998876.py``), so a stack recorded in a
notebook names files the user never saw. The kernel knows its cells' sources (IPython's input
history, indexed by execution count) and the hash (`ipykernel.compiler.get_file_name`), so the
panel tells `gpumemviz.analysis.frames` the mapping before it shows stacks, and a frame reads
"cell [5], line 14: step" as IPython's own tracebacks say it.
"""

from __future__ import annotations

from gpumemviz.analysis.frames import name_cells

__all__ = ["name_notebook_cells"]

_SEEN = [0]  # how many history entries have been named (cells are only ever appended)


def name_notebook_cells() -> int:
    """Name the cells this kernel has run so far; returns how many were added (0 outside an
    ipykernel kernel, or when nothing ran since the last call). Never raises."""
    try:
        from ipykernel.compiler import get_file_name
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            return 0
        history = list(shell.history_manager.input_hist_raw)
    except Exception:  # not in a kernel, or a kernel without these: frames keep their files
        return 0
    start = _SEEN[0]
    named: dict[str, int] = {
        str(get_file_name(src)): n  # type: ignore[no-untyped-call]  # ipykernel has no types
        for n, src in enumerate(history)
        if n >= max(start, 1) and src
    }
    _SEEN[0] = len(history)
    name_cells(named)
    return len(named)
