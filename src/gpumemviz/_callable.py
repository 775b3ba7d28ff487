"""Modules that are their function: `gpumemviz.diff(a, b)` after `import gpumemviz.diff`.

Several public names (`gpumemviz.diff`, `gpumemviz.export`, `gpumemviz.fragmentation`,
`gpumemviz.allocator.replay`) name both a module and the function it defines. Once the
submodule is imported, Python binds the package attribute to the module, so the module itself
must be callable for `gpumemviz.diff(a, b)` to keep working. Stdlib only: the lowest layer.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["make_module_callable"]


def make_module_callable(module_name: str, function: Callable[..., Any]) -> None:  # any function
    """Make the imported module `module_name` call `function` when it is called.

    Parameters
    ----------
    module_name
        The module's ``__name__`` (it must be in ``sys.modules``: call this at the end of the
        module itself, ``make_module_callable(__name__, fn)``).
    function
        What calling the module does; its arguments and result pass through unchanged.

    Raises
    ------
    KeyError
        When `module_name` has not been imported.
    """
    module = sys.modules[module_name]

    # Any: the function's own arguments and result, passed through
    def __call__(self: types.ModuleType, *args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    def __signature__(self: types.ModuleType) -> Any:  # inspect.signature(module): the function's
        import inspect

        return inspect.signature(function)

    __call__.__doc__ = function.__doc__
    name = module_name.rsplit(".", 1)[-1]
    attrs = {"__call__": __call__, "__signature__": property(__signature__)}
    cls = type(f"_Callable_{name}", (types.ModuleType,), attrs)
    cls.__doc__ = f"`{module_name}` is callable: calling it calls `{function.__qualname__}`."
    module.__class__ = cls
