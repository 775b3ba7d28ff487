"""The public API documents itself: every public function and class has a numpy-style docstring.

docs/internals.md keeps how the parts work together and the wire format; signatures, argument
meanings, defaults, return shapes and errors live in the docstrings (issue 14). This test holds
that line for `gpumemviz.__all__`: each function (the module `gpumemviz.plots` stands for the
plots it exports) and each class, and the public methods and
properties of those classes, which is what users call on what the functions return. The
examples themselves run as doctests (pytest's ``--doctest-modules`` over src/gpumemviz).
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

import gpumemviz

# Public methods that other parts of gpumemviz call (the sampler, the panel's commands, the
# magic) rather than users: a docstring that says who calls them is enough, no example.
INTERNAL_METHODS = {
    "MemoryPanel.push_sample": "the sampler's listener (`attach` registers it)",
    "MemoryPanel.follow_device": "the panel's device command",
    "MemoryPanel.devices": "fills the `controls` trait's device switcher",
    "MemoryPanel.fit_inputs": "what the panel's fit command reads",
    "MemoryPanel.replay_times": "what the seek command and the replay controls read",
    "MemoryPanel.follow_devices": "the seek and play commands of a panel of several devices",
}

_HEADER = re.compile(r"^(\w[\w ]*)\n-{3,}[ \t]*$", re.M)
_GOOGLE = re.compile(r"^(Args|Arguments|Returns|Raises|Example|Examples):[ \t]*$", re.M)


def sections(doc: str | None) -> dict[str, str]:
    """The numpy-style sections of a docstring: {header: body}."""
    text = inspect.cleandoc(doc or "")
    found = list(_HEADER.finditer(text))
    return {
        m.group(1): text[m.end() : found[i + 1].start() if i + 1 < len(found) else len(text)]
        for i, m in enumerate(found)
    }


def takes_parameters(obj: Any) -> bool:  # Any: a function, method or class
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin's signature (an exception class): nothing asked
        return False
    return any(p not in ("self", "cls") for p in sig.parameters)


def problems(obj: Any, *, example: bool = True) -> list[str]:  # Any: what is documented
    """What the docstring of `obj` lacks: [] when it is complete."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    if not doc or not doc.strip():
        return ["no docstring"]
    out = []
    if _GOOGLE.search(inspect.cleandoc(doc)):
        out.append("Google-style section (write numpy style: a header underlined with dashes)")
    found = sections(doc)
    if takes_parameters(obj):
        wanted = ("Parameters", "Attributes") if isinstance(obj, type) else ("Parameters",)
        if not any(w in found for w in wanted):
            out.append(f"no {' or '.join(wanted)} section")
    if example:
        if "Examples" not in found:
            out.append("no Examples section")
        elif ">>> " not in found["Examples"]:
            out.append("an Examples section without a runnable example (>>>)")
    return out


def public_api() -> Iterator[tuple[str, Any, str]]:  # Any: the documented object
    """(name, object, kind) for every public function, class, method and property."""
    for name in gpumemviz.__all__:
        if name == "__version__":
            continue
        value = getattr(gpumemviz, name)
        if isinstance(value, types.ModuleType):  # gpumemviz.plots: the plots it exports
            for sub in value.__all__:
                obj = getattr(value, sub)
                if callable(obj):
                    yield f"{name}.{sub}", obj, "function"
        elif isinstance(value, type):
            yield name, value, "class"
            yield from _members(name, value)
        else:
            yield name, value, "function"


def _members(cls_name: str, cls: type) -> Iterator[tuple[str, Any, str]]:
    for attr, raw in vars(cls).items():
        if attr.startswith("_"):
            continue
        qual = f"{cls_name}.{attr}"
        if isinstance(raw, property):
            yield qual, raw.fget, "property"
        elif isinstance(raw, classmethod | staticmethod):
            yield qual, raw.__func__, "method"
        elif inspect.isfunction(raw):
            yield qual, raw, "internal" if qual in INTERNAL_METHODS else "method"


def check(api: Callable[[], Iterator[tuple[str, Any, str]]]) -> list[str]:
    """'name: what is missing' for every incomplete docstring of `api`."""
    out = []
    for name, obj, kind in api():
        missing = problems(obj, example=kind in ("function", "class", "method"))
        if kind in ("property", "internal"):  # a sentence is enough
            missing = [m for m in missing if m == "no docstring"]
        out += [f"{name} ({kind}): {m}" for m in missing]
    return out


def test_the_public_api_has_numpy_docstrings_with_examples() -> None:
    documented = list(public_api())
    assert len(documented) > 50  # the walk found the API (functions, classes, their members)
    kinds = {kind for _, _, kind in documented}
    assert kinds == {"function", "class", "method", "property", "internal"}
    assert check(public_api) == []


def test_internal_methods_are_still_public_methods() -> None:
    """The exemption list names methods that exist: a renamed one must leave it."""
    for qual in INTERNAL_METHODS:
        cls_name, attr = qual.split(".")
        assert inspect.isfunction(vars(getattr(gpumemviz, cls_name)).get(attr)), qual


# -- planted cases: the check catches what it is for ----------------------------------------


def _complete(size: int, *, unit: str = "B") -> str:
    """Format a size.

    Parameters
    ----------
    size : int
    unit : str

    Returns
    -------
    str

    Examples
    --------
    >>> _complete(3)
    '3 B'
    """
    return f"{size} {unit}"


def _no_example(size: int) -> str:
    """Format a size.

    Parameters
    ----------
    size : int
    """
    return str(size)


def _no_parameters(size: int) -> str:
    """Format a size.

    Examples
    --------
    >>> _no_parameters(3)
    '3'
    """
    return str(size)


def _google(size: int) -> str:
    """Format a size.

    Args:
        size: the size.

    Examples
    --------
    >>> _google(3)
    '3'
    """
    return str(size)


def _example_in_prose(size: int) -> str:
    """Format a size.

    Parameters
    ----------
    size : int

    Examples
    --------
    Call it with a size.
    """
    return str(size)


def _undocumented(size: int) -> str:
    return str(size)


class _Documented:
    """A value.

    Attributes
    ----------
    size : int

    Examples
    --------
    >>> _Documented(3).size
    3
    """

    def __init__(self, size: int) -> None:
        self.size = size

    @property
    def double(self) -> int:
        return 2 * self.size

    def grow(self, by: int) -> None:
        """Grow by `by`."""
        self.size += by


def test_planted_incomplete_docstrings_are_caught() -> None:
    assert problems(_complete) == []
    assert problems(_no_example) == ["no Examples section"]
    assert problems(_no_parameters) == ["no Parameters section"]
    assert problems(_google)[0].startswith("Google-style section")
    assert problems(_google)[1:] == ["no Parameters section"]
    assert problems(_example_in_prose) == ["an Examples section without a runnable example (>>>)"]
    assert problems(_undocumented) == ["no docstring"]
    assert problems(_Documented) == []


def test_planted_members_are_walked_and_caught() -> None:
    """A class's undocumented property and a method without sections are both reported."""

    def api() -> Iterator[tuple[str, Any, str]]:
        yield "_Documented", _Documented, "class"
        yield from _members("_Documented", _Documented)
        yield "_no_example", _no_example, "function"

    assert check(api) == [
        "_Documented.double (property): no docstring",
        "_Documented.grow (method): no Parameters section",
        "_Documented.grow (method): no Examples section",
        "_no_example (function): no Examples section",
    ]


def test_planted_missing_example_on_a_real_public_name_is_caught(monkeypatch: Any) -> None:
    """Strip one real docstring's example: the whole-API check names exactly that function."""
    fn = gpumemviz.parse_size
    doc = fn.__doc__ or ""
    monkeypatch.setattr(fn, "__doc__", doc[: doc.index("Examples")])
    assert check(public_api) == ["parse_size (function): no Examples section"]
