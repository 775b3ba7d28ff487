"""gpumemviz: see GPU memory, and the fragmentation inside PyTorch's caching allocator.

Importing this package is cheap: torch, pynvml, plotly, anywidget and IPython load only when a
feature that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What the lazy names below are, for type checkers (`__getattr__` hides them). A module that
    # stands for its function (`gpumemviz.fragmentation`) is typed as the function.
    from IPython.core.interactiveshell import InteractiveShell

    from gpumemviz import figures as figures
    from gpumemviz.advice import Advice as Advice
    from gpumemviz.advice import advise as advise
    from gpumemviz.allocator.replay import replay as replay
    from gpumemviz.capture import capture_oom as capture_oom
    from gpumemviz.diff import diff as diff
    from gpumemviz.estimate import estimate as estimate
    from gpumemviz.estimate import max_batch as max_batch
    from gpumemviz.export import export as export
    from gpumemviz.fragmentation import FragmentationReport as FragmentationReport
    from gpumemviz.fragmentation import fragmentation as fragmentation
    from gpumemviz.frames import redact_paths as redact_paths
    from gpumemviz.io import load_snapshot as load_snapshot
    from gpumemviz.io import save_snapshot as save_snapshot
    from gpumemviz.report_html import report as report
    from gpumemviz.snapshot import Snapshot as Snapshot
    from gpumemviz.snapshot import SnapshotError as SnapshotError
    from gpumemviz.units import format_size as format_size
    from gpumemviz.units import parse_size as parse_size
    from gpumemviz.widget import MemoryPanel as MemoryPanel
    from gpumemviz.widget import mark as mark
    from gpumemviz.widget import monitor as monitor

__version__ = "0.1.0"

# name -> module that defines it; resolved on first attribute access (PEP 562).
_LAZY: dict[str, str] = {
    "Snapshot": "gpumemviz.snapshot",
    "SnapshotError": "gpumemviz.snapshot",
    "load_snapshot": "gpumemviz.io",
    "save_snapshot": "gpumemviz.io",
    "format_size": "gpumemviz.units",
    "parse_size": "gpumemviz.units",
    "capture_oom": "gpumemviz.capture",
    "replay": "gpumemviz.allocator.replay",
    "fragmentation": "gpumemviz.fragmentation",
    "FragmentationReport": "gpumemviz.fragmentation",
    "advise": "gpumemviz.advice",
    "Advice": "gpumemviz.advice",
    "figures": "gpumemviz.figures",
    "export": "gpumemviz.export",
    "report": "gpumemviz.report_html",
    "diff": "gpumemviz.diff",
    "estimate": "gpumemviz.estimate",  # the callable module: estimate(step, ...)
    "max_batch": "gpumemviz.estimate",
    "redact_paths": "gpumemviz.frames",
    "monitor": "gpumemviz.widget",
    "MemoryPanel": "gpumemviz.widget",
    "mark": "gpumemviz.widget",
}

__all__ = sorted([*_LAZY, "__version__"])


def __getattr__(name: str) -> Any:  # Any: typed by the TYPE_CHECKING imports above
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpumemviz' has no attribute {name!r}")
    mod = importlib.import_module(module)
    # A module named like its function (gpumemviz.fragmentation) is callable and stands for it:
    # binding the function here would break `import gpumemviz.fragmentation as m`.
    value = mod if module == f"{__name__}.{name}" else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext gpumemviz``: registers the ``%gpumemviz`` magic (gpumemviz.magics)."""
    from gpumemviz.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """``%unload_ext gpumemviz``: closes the magic's panels and stops the samplers it started."""
    from gpumemviz.magics import unload_ipython_extension as unload

    unload(ipython)
