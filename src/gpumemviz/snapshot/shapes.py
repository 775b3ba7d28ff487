"""Row shapes: which keys each row of a table had, in which order, and the values of keys the
columns do not model, so that `Snapshot.to_torch()` rebuilds every row as the file had it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpumemviz.snapshot.columns import readonly
from gpumemviz.snapshot.gc_pause import no_gc
from gpumemviz.snapshot.schema import BLOCK_KEYS, SEG_KEYS, TRACE_KEYS, TorchDict, TorchMapping


@dataclass(frozen=True)
class RowShape:
    """Key layouts of a table's rows: `code[i]` indexes `layouts`; `extra[i]` holds unknown keys.

    `override[i]` holds values a row gives to keys whose column says otherwise: a torch 2.0
    block whose `requested_size` differs from its history's real_size, which the column holds.
    """

    layouts: tuple[tuple[str, ...], ...]
    code: np.ndarray | None  # None: every row has layouts[0]
    extra: Mapping[int, TorchMapping]
    override: Mapping[int, TorchMapping] = field(default_factory=dict)

    @staticmethod
    def uniform(keys: tuple[str, ...]) -> RowShape:
        return RowShape((keys,), None, {})

    @staticmethod
    def of(rows: Sequence[TorchDict], known: tuple[str, ...]) -> RowShape:
        """Record each row's key tuple; keep the values of keys outside `known`."""
        # C-level passes, no tuple kept per row: a file has a handful of layouts
        layouts = tuple(dict.fromkeys(map(tuple, rows)))  # in the order first met
        index = {k: c for c, k in enumerate(layouts)}
        codes = list(map(index.__getitem__, map(tuple, rows))) if len(layouts) > 1 else None
        known_set = frozenset(known)
        odd = {c for c, keys in enumerate(layouts) if not known_set.issuperset(keys)}
        extra: dict[int, TorchDict] = {}
        if odd:
            for i, c in enumerate([0] * len(rows) if codes is None else codes):
                if c in odd:
                    extra[i] = {k: v for k, v in rows[i].items() if k not in known_set}
        if len(layouts) <= 1:
            return RowShape(layouts or (known,), None, extra)
        dtype = np.uint8 if len(layouts) < 256 else np.uint32
        return RowShape(layouts, readonly(np.array(codes, dtype=dtype)), extra)

    def has(self, key: str, n: int) -> np.ndarray:
        """Boolean mask of the rows whose layout includes `key`."""
        with_key = [c for c, keys in enumerate(self.layouts) if key in keys]
        if self.code is None:
            return np.full(n, bool(with_key))
        return np.isin(self.code, with_key)

    # Any: each key's column, a list or a callable of the row indices (`Trace._values`)
    def build(self, n: int, values: Mapping[str, Any]) -> list[TorchDict]:
        """Rebuild the row dicts; `values[key]` is a list (or a callable of the row indices)."""
        out: list[Any] = [None] * n
        groups: list[tuple[int, np.ndarray | None]] = [(0, None)] if self.code is None else []
        if self.code is not None:
            for c in range(len(self.layouts)):
                members = np.flatnonzero(self.code == c)
                if members.size:
                    groups.append((c, members))
        with no_gc():
            for c, idx in groups:
                keys = self.layouts[c]
                cols = []
                rows = range(n) if idx is None else idx.tolist()
                for k in keys:
                    if k in values:
                        v = values[k]
                        if callable(v):
                            cols.append(v(idx))
                        else:
                            cols.append(v if idx is None else [v[i] for i in rows])
                    else:
                        cols.append([self.extra[i][k] for i in rows])
                built = _row_builder(keys)(cols) if cols else [{} for _ in rows]
                if idx is None:
                    out = built
                else:
                    for i, row in zip(rows, built, strict=True):
                        out[i] = row
            for i, given in self.override.items():
                out[i].update(given)  # keys the row has already: their order is kept
            return out


_KNOWN_KEYS = frozenset(SEG_KEYS + BLOCK_KEYS + TRACE_KEYS)


@functools.lru_cache(maxsize=64)
# Any: the columns' values, whatever the rows hold
def _row_builder(keys: tuple[str, ...]) -> Callable[[list[list[Any]]], list[TorchDict]]:
    """A function turning columns into row dicts for one key layout.

    A dict display is ~2x faster than dict(zip(...)) on 10^6 rows, so layouts made only of our
    own key names get a compiled comprehension (the names are our constants, never file text);
    layouts with unknown keys use dict(zip(...)).
    """
    if not _KNOWN_KEYS.issuperset(keys) or len(set(keys)) != len(keys):
        return lambda cols: [dict(zip(keys, vals, strict=True)) for vals in zip(*cols, strict=True)]
    names = [f"v{i}" for i in range(len(keys))]
    display = ", ".join(f"{k!r}: {v}" for k, v in zip(keys, names, strict=True))
    src = f"lambda cols: [{{{display}}} for ({', '.join(names)},) in zip(*cols)]"
    build: Callable[[list[list[Any]]], list[TorchDict]]
    build = eval(src, {"__builtins__": {"zip": zip}})  # keys checked above: our constants only
    return build
