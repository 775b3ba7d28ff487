"""A `Snapshot`'s trace read as replay's steps straight from its numpy columns.

`replay` is mostly handed a `Snapshot` (what `load_snapshot`, the CLI and the panel hold).
Turning its trace back into torch's entry dicts (`to_torch`) only for `steps_of` to turn them
into tuples costs a dict per entry in time and peak memory; these read the columns instead,
and give the same values `steps_of` and the entry dicts would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gpumemviz.allocator.replay.reconstruct import ByAddress
    from gpumemviz.allocator.replay.steps import Step
    from gpumemviz.snapshot import Trace
    from gpumemviz.snapshot.schema import TorchList

__all__ = ["alloc_entries", "by_address", "freed_at_once", "steps_from_columns"]


def steps_from_columns(trace: Trace) -> list[Step] | None:
    """`steps_of(trace.entries())`, or None when an entry lacks a field `steps_of` reads (the
    columns hold -1 there; the caller then reads the entry dicts, whose defaults differ).

    Examples
    --------
    >>> from gpumemviz.snapshot import Trace
    >>> steps_from_columns(Trace.from_entries([
    ...     {"action": "alloc", "addr": 4096, "size": 512, "stream": 0},
    ...     {"action": "oom", "device_free": 5, "size": 1024, "stream": 0}]))
    [('alloc', 4096, 512, 0), ('oom', 5, 1024, 0)]
    >>> steps_from_columns(Trace.from_entries([{"action": "alloc", "size": 512}])) is None
    True
    """
    oom = trace.action == trace.action_names.index("oom")
    addr = np.where(oom, trace.device_free, trace.addr)
    if (addr == -1).any() or (trace.size == -1).any() or (trace.stream == -1).any():
        return None
    names = np.array(trace.action_names, dtype=object)[trace.action].tolist()
    columns = (_shared(addr), _shared(trace.size), _shared(trace.stream))
    return list(zip(names, *columns, strict=True))


def _shared(column: np.ndarray) -> list[int]:
    """The column as Python ints, one object per distinct value (addresses and sizes repeat
    all through a trace: a step then costs its tuple, not three more ints)."""
    if len(column) and column.min() == column.max():  # one value (a trace's stream, mostly)
        return [int(column[0])] * len(column)
    values, where = np.unique(column, return_inverse=True)
    return np.array(values.tolist(), dtype=object)[where].tolist()  # type: ignore[no-any-return]


def alloc_entries(trace: Trace) -> list[tuple[int, int, TorchList]]:
    """(index, address, frames) of each ``alloc`` entry, frames ``[]`` where it has none (a
    malformed stack, not a list, reads as none, as `Trace.frames` has it).

    Examples
    --------
    >>> from gpumemviz.snapshot import Trace
    >>> alloc_entries(Trace.from_entries([
    ...     {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "frames": [{"line": 1}]},
    ...     {"action": "free_requested", "addr": 4096, "size": 512, "stream": 0}]))
    [(0, 4096, [{'line': 1}])]
    """
    at = np.flatnonzero(trace.action == trace.action_names.index("alloc"))
    frames = trace.frames()
    idx = at.tolist()
    return list(zip(idx, trace.addr[at].tolist(), [frames[i] or [] for i in idx], strict=True))


def by_address(trace: Trace) -> ByAddress:
    """The alloc, free_requested and free_completed entries sorted by address, then index:
    (addresses, indices, is it an alloc, per entry the last alloc at its address up to it or
    -1: for a free, the alloc that made its block), as `reconstruct_layout` takes them.

    Examples
    --------
    >>> from gpumemviz.snapshot import Trace
    >>> by_address(Trace.from_entries([
    ...     {"action": "alloc", "addr": 8192, "size": 512, "stream": 0},
    ...     {"action": "alloc", "addr": 4096, "size": 512, "stream": 0},
    ...     {"action": "free_requested", "addr": 8192, "size": 512, "stream": 0}]))
    ([4096, 8192, 8192], [1, 0, 2], [True, True, False], array([0, 1, 0]))
    """
    names = trace.action_names
    alloc = names.index("alloc")
    codes = [alloc, names.index("free_requested"), names.index("free_completed")]
    at = np.flatnonzero(np.isin(trace.action, codes))
    order = np.argsort(trace.addr[at], kind="stable")
    at = at[order]
    addrs = trace.addr[at]
    # one Python int per distinct address, as `_shared` (sorted: each a run of equal ones)
    starts = np.flatnonzero(np.diff(addrs, prepend=addrs[:1] - 1))
    runs = np.diff(starts, append=len(addrs))
    shared = np.array(addrs[starts].tolist(), dtype=object).repeat(runs).tolist()
    is_alloc = trace.action[at] == alloc
    # the last alloc up to each entry in the same address run, else the run's first entry
    marks = np.where(is_alloc, np.arange(len(at)), -1)
    marks[starts] = starts
    last = np.maximum.accumulate(marks)
    made = np.where(is_alloc[last], at[last], -1)
    since = np.full(len(trace.action), -1, np.int64)
    since[at] = made
    return shared, at.tolist(), is_alloc.tolist(), since


def freed_at_once(trace: Trace) -> list[bool]:
    """Per entry: is it a free_requested whose free_completed (same address) comes next, with
    no release or oom after the free_completed entries that follow? Such a block is freed at
    once (`Recording.freed_at_once`, which reads the steps when it has no columns).

    Examples
    --------
    >>> from gpumemviz.snapshot import Trace
    >>> e = lambda action, addr: {"action": action, "addr": addr, "size": 512, "stream": 0}
    >>> freed_at_once(Trace.from_entries([e("free_requested", 4096), e("free_completed", 4096),
    ...     e("free_requested", 8192), e("free_completed", 8192),
    ...     e("free_completed", 0), e("segment_free", 8192)]))
    [True, False, False, False, False, False]
    """
    act, addr = trace.action, trace.addr
    n = len(act)
    out = np.zeros(n, bool)
    names = list(trace.action_names)
    code = {name: names.index(name) if name in names else -1 for name in _AT_ONCE_NAMES}
    if n < 2 or code["free_requested"] < 0 or code["free_completed"] < 0:
        return out.tolist()  # type: ignore[no-any-return]
    fc = code["free_completed"]
    pair = np.flatnonzero((act[:-1] == code["free_requested"]) & (act[1:] == fc))
    pair = pair[addr[pair] == addr[pair + 1]]
    # the first entry at or after the one past the pair that is not a free_completed: a
    # release or an oom there means the free may have waited on events until it
    others = np.flatnonzero(act != fc)
    k = np.searchsorted(others, pair + 2)
    nxt = others[np.minimum(k, len(others) - 1)] if len(others) else pair
    ends = [code[x] for x in ("segment_free", "segment_unmap", "oom") if code[x] >= 0]
    waits = (k < len(others)) & np.isin(act[nxt], ends)
    out[pair[~waits]] = True
    return out.tolist()  # type: ignore[no-any-return]


_AT_ONCE_NAMES = ("free_requested", "free_completed", "segment_free", "segment_unmap", "oom")
