"""A CPU model of PyTorch's CUDA caching allocator: rules, configuration, model, replay.

The names below load on first use (PEP 562), so `import gpumemviz.allocator.config` (what the
fragmentation report and the advice need) never pulls in the model, replay or workloads.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module that defines it; a name equal to its module's (replay, workloads) is the module
# (the replay function is `gpumemviz.replay`, or `replay.replay` here)
_LAZY: dict[str, str] = {
    "AllocatorConfig": "gpumemviz.allocator.config",
    "CachingAllocator": "gpumemviz.allocator.model",
    "ConfigError": "gpumemviz.allocator.config",
    "OutOfMemory": "gpumemviz.allocator.oom",
    "replay": "gpumemviz.allocator.replay",  # the module: replay.replay(snapshot, ...)
    "workloads": "gpumemviz.allocator.workloads",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:  # Any: the lazily imported name, whatever it is
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module == f"{__name__}.{name}" else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
