"""Copy-on-write rewriting of plain data (dicts, lists and tuples of scalars).

Snapshot files share containers heavily (one frames list referenced by every block allocated
at the same place), so a rewrite that followed every reference would cost what the expanded
data costs. Here each container is visited once, a container in which nothing changed is
returned as it is (not copied), and a shared container stays shared in the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["rewrite_leaves"]


def rewrite_leaves(obj: Any, leaf: Callable[[Any], Any]) -> Any:  # Any: plain data in and out
    """`obj` with each scalar `v` replaced by ``leaf(v)`` where that is not `v` itself.

    Parameters
    ----------
    obj : dict, list, tuple or scalar
        Plain data; a cycle meets itself unchanged (JSON writers then refuse it).
    leaf : callable
        Called on every scalar inside (dict keys excluded); returning its argument keeps it.

    Returns
    -------
    object
        `obj` itself when nothing changed; otherwise copies of the containers on the way to a
        change, each shared container rewritten once.

    Examples
    --------
    >>> frames = [{"filename": "/home/ann/m.py", "line": 3}]
    >>> data = {"a": frames, "b": frames, "n": [1, 2]}
    >>> out = rewrite_leaves(data, lambda v: "<path>" if v == "/home/ann/m.py" else v)
    >>> out["a"] is out["b"], out["n"] is data["n"], out["a"][0]["filename"]
    (True, True, '<path>')
    """
    if type(obj) not in _CONTAINERS:
        return leaf(obj)
    return _rewrite(obj, leaf, {})


_CONTAINERS = (dict, list, tuple)


def _rewrite(obj: Any, leaf: Callable[[Any], Any], memo: dict[int, Any]) -> Any:
    done = memo.get(id(obj))
    if done is not None:
        return done
    memo[id(obj)] = obj  # a cycle meets itself unchanged
    is_dict = type(obj) is dict
    new: Any = None  # a dict or list copy of `obj`, made at the first change
    for k, v in obj.items() if is_dict else enumerate(obj):
        t = type(v)
        r = _rewrite(v, leaf, memo) if t is dict or t is list or t is tuple else leaf(v)
        if r is v:
            continue
        if new is None:
            new = dict(obj) if is_dict else list(obj)
        new[k] = r
    if new is not None and type(obj) is tuple:
        new = tuple(new)
    out = obj if new is None else new
    memo[id(obj)] = out
    return out
