"""The notebook panel: `MemoryPanel` (panel.py); `monitor` and `mark` (monitor.py) for live ones.

The panel's own pieces: writer.py (the one thread that writes its traits and sends its frames)
and subshell.py (kernel subshells, so clicks act while a cell runs); job.py is the panel of a
torch.distributed job's ranks (``monitor(job=...)``). The built front end it shows is located by
gpumemviz.reporting.bundles.
"""

import importlib

#: What the panel needs beyond the package's own dependencies: the `widget` extra.
INSTALL_HINT = "pip install 'gpumemviz[widget]'"


def _require_the_widget_extra() -> None:
    """A missing anywidget (the user installed plain ``gpumemviz``) is one line with the command
    that fixes it, not a ModuleNotFoundError from deep inside the panel's module."""
    for name in ("anywidget", "ipywidgets", "traitlets"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                f"gpumemviz's panel needs {name}, which is not installed: {INSTALL_HINT}",
                name=name,
            ) from None


_require_the_widget_extra()

from gpumemviz.widget.monitor import mark, monitor  # noqa: E402  (after the check above)
from gpumemviz.widget.panel import MemoryPanel  # noqa: E402

__all__ = ["INSTALL_HINT", "MemoryPanel", "mark", "monitor"]
