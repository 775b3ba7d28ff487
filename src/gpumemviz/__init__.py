"""gpumemviz: see GPU memory, and the fragmentation inside PyTorch's caching allocator.

Importing this package is cheap: torch, pynvml, plotly, anywidget and IPython load only when a
feature that needs them is used.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What the lazy names below are, for type checkers (`__getattr__` hides them).
    from IPython.core.interactiveshell import InteractiveShell

    from gpumemviz.allocator.replay import replay as replay
    from gpumemviz.analysis.advice import Advice as Advice
    from gpumemviz.analysis.advice import advise as advise
    from gpumemviz.analysis.diff import diff as diff
    from gpumemviz.analysis.findings import Findings as Findings
    from gpumemviz.analysis.findings import analyze as analyze
    from gpumemviz.analysis.fragmentation import FragmentationReport as FragmentationReport
    from gpumemviz.analysis.fragmentation import fragmentation as fragmentation
    from gpumemviz.analysis.frames import redact_paths as redact_paths
    from gpumemviz.estimator import estimate as estimate
    from gpumemviz.estimator import max_batch as max_batch
    from gpumemviz.io import load_snapshot as load_snapshot
    from gpumemviz.io import save_snapshot as save_snapshot
    from gpumemviz.live.sources.oom_capture import capture_oom as capture_oom
    from gpumemviz.render import plots as plots
    from gpumemviz.reporting.export import export as export
    from gpumemviz.reporting.html_report import report as report
    from gpumemviz.snapshot import Snapshot as Snapshot
    from gpumemviz.snapshot import SnapshotError as SnapshotError
    from gpumemviz.snapshot.units import format_size as format_size
    from gpumemviz.snapshot.units import parse_size as parse_size
    from gpumemviz.widget import MemoryPanel as MemoryPanel
    from gpumemviz.widget import mark as mark
    from gpumemviz.widget import monitor as monitor

__version__ = "0.1.0"

# name -> module that defines it; resolved on first attribute access (PEP 562). No module of the
# package carries a public name (a package attribute that a submodule import could rebind).
_LAZY: dict[str, str] = {
    "Snapshot": "gpumemviz.snapshot",
    "SnapshotError": "gpumemviz.snapshot",
    "load_snapshot": "gpumemviz.io",
    "save_snapshot": "gpumemviz.io",
    "format_size": "gpumemviz.snapshot.units",
    "parse_size": "gpumemviz.snapshot.units",
    "capture_oom": "gpumemviz.live.sources.oom_capture",
    "replay": "gpumemviz.allocator.replay",
    "fragmentation": "gpumemviz.analysis.fragmentation",
    "FragmentationReport": "gpumemviz.analysis.fragmentation",
    "advise": "gpumemviz.analysis.advice",
    "Advice": "gpumemviz.analysis.advice",
    "analyze": "gpumemviz.analysis.findings",
    "Findings": "gpumemviz.analysis.findings",
    "export": "gpumemviz.reporting.export",
    "report": "gpumemviz.reporting.html_report",
    "diff": "gpumemviz.analysis.diff",
    "estimate": "gpumemviz.estimator",
    "max_batch": "gpumemviz.estimator",
    "redact_paths": "gpumemviz.analysis.frames",
    "monitor": "gpumemviz.widget",
    "MemoryPanel": "gpumemviz.widget",
    "mark": "gpumemviz.widget",
}
#: Modules the package hands out by name: the plotly plots (`gpumemviz.plots.timeline(...)`).
_MODULES: dict[str, str] = {"plots": "gpumemviz.render.plots"}
#: Old public names kept for one release (CHANGELOG.md): name -> (its new name, module).
_RENAMED: dict[str, tuple[str, str]] = {"figures": ("plots", "gpumemviz.render.plots")}

__all__ = sorted([*_LAZY, *_MODULES, "__version__"])


def __getattr__(name: str) -> Any:  # Any: typed by the TYPE_CHECKING imports above
    if name in _RENAMED:
        new, module = _RENAMED[name]
        warnings.warn(
            f"gpumemviz.{name} is now gpumemviz.{new}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(module)
    if name in _MODULES:
        value: Any = importlib.import_module(_MODULES[name])
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'gpumemviz' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext gpumemviz``: registers the ``%gpumemviz`` magic (gpumemviz.widget.magics)."""
    from gpumemviz.widget.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """``%unload_ext gpumemviz``: closes the magic's panels and stops the samplers it started."""
    from gpumemviz.widget.magics import unload_ipython_extension as unload

    unload(ipython)
