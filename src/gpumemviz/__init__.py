"""gpumemviz: see GPU memory, and the fragmentation inside PyTorch's caching allocator.

Importing this package is cheap: torch, pynvml, plotly, anywidget and IPython load only when a
feature that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import Any

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
    "redact_paths": "gpumemviz.frames",
    "monitor": "gpumemviz.widget",
    "MemoryPanel": "gpumemviz.widget",
    "mark": "gpumemviz.widget",
}

__all__ = sorted([*_LAZY, "__version__"])


def __getattr__(name: str) -> Any:
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


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpumemviz``: registers the ``%gpumemviz`` magic (gpumemviz.magics)."""
    from gpumemviz.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext gpumemviz``: closes the magic's panels and stops the samplers it started."""
    from gpumemviz.magics import unload_ipython_extension as unload

    unload(ipython)
