"""The plain-data walk: decoded data checked for plain types, nesting depth and cycles, each
container visited once.

Pickles share objects: a real trace holds 984,474 references to 646 frame dicts (torch shares
frames lists between blocks and trace entries, and frame dicts between frames lists), and a
few hundred hostile bytes can reach one list by 2^30 paths. The walk goes level by level, as
Kahn's algorithm: a container is expanded once every reference to it has been met, so each is
visited once, the depth found is the longest path (what a recursive reader would meet), and a
container in a cycle is never reached (refused).

How many references a container has comes from its reference count: freshly decoded data is
referenced only from inside itself. So a container referenced once (nearly all of them) needs
no bookkeeping; a shared one holding no containers (a frame dict, an empty tuple) cannot be in
a cycle or deepen anything, so it is only remembered as met; only shared containers holding
containers (frames lists) are counted down, in a dict. A long list equal to one met before
whose items were all such leaves (torch's 6,000 frames lists hold some 130 different stacks)
is one C-level comparison, made for a batch of lists at a time (`list.__contains__` over the
runs met with the same length and first item); runs are remembered only while lists are found
equal to them (a trace whose every stack differs would otherwise remember, and re-read, one per
list). A long list or tuple of such leaves with 8 references or more (a frames list that the
entries of a tiled trace share) is a stack: it cannot be in a cycle and reaches one level below
itself, so it is read where it is first met (one comparison if it equals a run) and its other
references cost a set lookup, not a count down (tiled real trace, 10^5 entries: the walk -17 %;
with the 3-5 references of a real file's lists, counting down costs less); a level that meets
one must leave two levels of room below it. Each level is read in
slices of at most `_SLICE` values, and whether the last slice held only shared leaves met
before carries over from one batch of lists to the next; every per-reference step is a C-level
pass (map, set, compress, Counter), and Python loops run per level (at most `max_depth`), per
slice, per batch and per new shared long list (once each, `_LONG` items or more). On the real
files the walk takes about what the old level-by-level walk did on the small ones and half on
the large ones; on a 10^5-entry torch-shaped trace whose every stack differs, 0.5 s where it
took 1.2 s (benchmarks/big_traces.py --part load); memory, a few % of the decoded data.
"""

from __future__ import annotations

import operator
import sys
from collections import Counter
from itertools import accumulate, chain, compress, islice, repeat
from typing import Any, Protocol

from gpumemviz.io.limits import DEFAULT_MAX_DEPTH
from gpumemviz.snapshot import SnapshotError

_SCALARS = frozenset({str, int, float, bool, type(None), bytes})
_CONTAINERS = frozenset({dict, list, tuple})
_PLAIN = _SCALARS | _CONTAINERS
_SLICE = 16384  # values read at a time (the largest slice; small inputs use smaller ones)
_MOST = 1 << 16  # ... and while they are all shared leaves met before
_FEW = 64  # the smallest slice
_LONG = 16  # a list or tuple this long is compared with those met before
_RUNS = 16  # how many are remembered per length and first item
_KEEP = 1024  # runs remembered before they must be met (a quarter as often) to go on
_BATCH = 64  # long lists compared at a time (the first batch; it grows to _SLICE)
_PEEK = 4096  # the longest list or tuple read as a stack where it is first met
_MANY = 8  # ... and the fewest references it has: fewer are counted down at less cost


class Guard(Protocol):
    """What the walk calls between slices: raises `SnapshotError` past a memory budget. `n`:
    the input's size in bytes, which sizes the slices."""

    n: int

    def check(self) -> None: ...


def check_plain(
    obj: Any, *, max_depth: int = DEFAULT_MAX_DEPTH, guard: Guard | None = None
) -> None:
    """Raise `SnapshotError` if `obj` holds anything but plain types, nests deeper than
    `max_depth` containers, or holds itself.

    `obj` must be freshly decoded (pickle or JSON): references to its inner containers from
    outside it read as cycles. Plain types: dict (keys str, int, float, bool, None or bytes),
    list, tuple, str, int, float, bool, None, bytes.

    Examples
    --------
    >>> check_plain({"segments": [[1, 2.0, "x", None, b"", (True,)]]}, max_depth=4)
    >>> try:
    ...     check_plain([[[]]], max_depth=2)
    ... except SnapshotError as e:
    ...     print(e)
    data nested deeper than 2 levels (max_depth=2); a snapshot is about 9 levels deep
    """
    if type(obj) not in _PLAIN:
        raise SnapshotError(f"a value of type {type(obj).__name__} (only plain data allowed)")
    walk = _Walk(guard)
    level: list[Any] = [obj] if type(obj) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            raise SnapshotError(_too_deep(max_depth))
        level, below = walk.next_level(level)
        if depth + below > max_depth:  # shared leaves or stacks met before reach this deep
            raise SnapshotError(_too_deep(max_depth))
    if walk.pending:
        raise SnapshotError(
            f"{_too_deep(max_depth)}: {len(walk.pending)} container(s) hold themselves (a cycle)"
        )


def _too_deep(max_depth: int) -> str:
    return (
        f"data nested deeper than {max_depth} levels (max_depth={max_depth}); "
        "a snapshot is about 9 levels deep"
    )


def _refcounts(objs: list[Any]) -> list[int]:
    """Each object's reference count, read while `objs` holds each once."""
    return list(map(sys.getrefcount, objs))


def _calibrate() -> int:
    """What `_refcounts` reads beyond the references from the data: measured, as
    interpreters differ."""
    parent: list[Any] = [[]]  # the data's one reference
    return _refcounts([parent[0]])[0] - 1


_EXTRA = _calibrate()


class _Walk:
    """The walk's memory between levels: shared containers seen and still to count down."""

    def __init__(self, guard: Guard | None) -> None:
        self.guard = guard
        n = 1 << 30 if guard is None else guard.n
        # slices grow with the input, so that on a small file the walk's dicts and sets of ids
        # (~100 bytes a value) stay a few % of what it decodes to, as on a large one
        self.slice = max(_FEW, min(_SLICE, n // 256))
        # ... and so does a slice of shared leaves met before (the walk's frames lists)
        self.most = self.slice if n < _MOST else min(_MOST, n // 16)
        self.leaves: set[int] = set()  # shared containers holding no container: seen
        self.pending: dict[int, int] = {}  # shared containers holding some: references left
        self.by_count = True  # whether `_count` reads reference counts first
        # long lists and tuples of shared leaves, by length and first item's id
        self.runs: dict[tuple[int, int], list[list[Any] | tuple[Any, ...]]] = {}
        self.kept, self.hits = 0, 0  # runs remembered, and lists found equal to one
        # the slice of list items read next, and whether the last held only shared leaves met
        # before (kept from one `_runs` to the next: a level's lists are read in many calls)
        self.size, self.known = self.slice, False
        self.flush = _FEW  # items of unmatched long lists read at once: doubles up to `slice`
        # shared long lists and tuples of shared leaves (`_stacks`): met, never counted down
        self.stacks: set[int] = set()
        self.stacked = False  # whether the level being read met one

    def next_level(self, level: list[Any]) -> tuple[list[Any], int]:
        """Check one level; return the containers whose every reference is now met, and how
        many levels its containers reach below it: 0 (none), 1, or 2 (a stack)."""
        self.stacked = False
        is_dict = list(map(operator.is_, map(type, level), repeat(dict)))
        dicts = list(compress(level, is_dict))
        seqs = list(compress(level, map(operator.not_, is_dict))) if len(dicts) < len(level) else []
        del level, is_dict
        # Keys: the types of the distinct keys of a slice (a level's dicts share a few keys;
        # a key equal to a scalar is a scalar, so nothing else hides behind an equal one)
        keys = chain.from_iterable(dicts)
        while distinct := set(islice(keys, self.slice)):
            bad = set(map(type, distinct)) - _SCALARS
            if bad:
                raise SnapshotError(f"a dict key of type {_names(bad)} (only plain data allowed)")
        del distinct
        out: list[Any] = []
        deeper = False
        # Values are read in slices, copied to a list (`kids`: the reference counts read
        # count it). A dict's values are mostly scalars: their types first.
        values = chain.from_iterable(map(dict.values, dicts))
        while part := list(islice(values, self.slice)):
            kids = _containers(part)
            del part
            if kids:
                deeper = True
                self._count(kids, out)
            del kids
            self._check()
        # A list's or tuple's items are mostly containers met before (frames). A long one
        # equal to one met before whose items were all shared leaves (torch's frames lists:
        # 6,000 lists, 130 different stacks) needs only a comparison; the others are read by
        # identity first, in slices.
        # The long ones are compared in batches, each a C-level pass (`_met_runs`), so that
        # runs remembered from one batch are met by the next.
        is_long = list(map(_LONG.__le__, map(len, seqs)))
        runs: list[Any] = list(compress(seqs, map(operator.not_, is_long)))  # short: all read
        held = sum(map(len, runs))
        longs = iter(list(compress(seqs, is_long)))
        del seqs, is_long
        size = _BATCH
        while batch := list(islice(longs, size)):
            met = self._met_runs(batch)
            if 1 in met:
                deeper = True
                self.hits += met.count(1)
            for seq in compress(batch, map(operator.not_, met)):
                runs.append(seq)
                held += len(seq)
                if held >= self.flush:
                    deeper = self._runs(runs, out) or deeper
                    runs, held = [], 0
                    self.flush = min(2 * self.flush, self.slice)
            size = min(2 * size, _SLICE) if 0 not in met else _BATCH  # grows while all met
        deeper = self._runs(runs, out) or deeper
        return out, 2 if self.stacked else int(deeper)

    def _met_runs(self, seqs: list[Any]) -> bytes:
        """Whether each of `seqs` (long lists and tuples) equals a long list or tuple met before,
        all of whose items were shared leaves, as 0/1 bytes: C-level passes. `seq in same`
        compares a list item by item, by identity first (in C): an item equal to a
        leaf is a leaf too (values equal to scalars are scalars; what is not plain data the
        opcode scan already refused)."""
        keys = zip(map(len, seqs), map(id, map(operator.itemgetter(0), seqs)), strict=True)
        return bytes(map(operator.contains, map(self.runs.get, keys, repeat(())), seqs))

    def _runs(self, seqs: list[Any], out: list[Any]) -> bool:
        """Lists and tuples read whole: whether they hold containers. Long ones holding only
        shared leaves are remembered (up to `_RUNS` per length and first item)."""
        deeper = False
        values = chain.from_iterable(seqs)
        while part := list(islice(values, self.size)):
            new = self._items(part, out, self.known)
            deeper = deeper or new is not None
            self.known = new == 0
            self.size = (
                min(2 * self.size, self.most)
                if new is not None and new * 8 < len(part)
                else self.slice
            )
            del part
            self._check()
        if self.kept > _KEEP and self.kept > 4 * self.hits:  # runs seldom met: none kept
            return deeper
        longs = list(compress(seqs, map(_LONG.__le__, map(len, seqs))))
        keys = list(zip(map(len, longs), map(id, map(operator.itemgetter(0), longs)), strict=True))
        # only those whose length and first item have room left are looked at one by one
        room = map(_RUNS.__gt__, map(len, map(self.runs.get, keys, repeat(()))))
        for key, seq in compress(zip(keys, longs, strict=True), room):
            same = self.runs.setdefault(key, [])
            if (
                len(same) < _RUNS
                and seq not in same  # equal item by item, by identity first (in C)
                and all(map(self.leaves.__contains__, map(id, seq)))
            ):
                same.append(seq)
                self.kept += 1
        return deeper

    def _check(self) -> None:
        if self.guard is not None:
            self.guard.check()

    def _items(self, part: list[Any], out: list[Any], known: bool) -> int | None:
        """A slice of list and tuple items (`known`: the last one held only shared leaves met
        before): None if it holds no container, else how many it holds not met before."""
        # only shared leaves (frames)? `all` stops at the first that is not (`issuperset` would
        # build a set of them all first)
        if known and all(map(self.leaves.__contains__, map(id, part))):
            return 0
        kids = _containers(part)
        if kids is not part:
            part.clear()  # `kids` alone holds the references now
        return self._count(kids, out) if kids else None

    def _count(self, kids: list[Any], out: list[Any]) -> int:
        """Count one slice of container references (`kids`, the only list holding them): how
        many of them were not met before. Where most are referenced once (blocks, trace
        entries), their reference counts come first; where most are shared (frames lists),
        their identities."""
        if not self.by_count:
            return self._by_id(kids, out)
        rcs = _refcounts(kids)
        once = bytes(map((1 + _EXTRA).__eq__, rcs))  # referenced once: ready now
        out.extend(compress(kids, once))
        single = once.count(1)
        self.by_count = 2 * single >= len(kids)
        if single == len(kids):
            return single
        del rcs
        shared = list(compress(kids, map(operator.not_, once)))
        kids.clear()  # `shared` alone holds those references now
        return single + self._by_id(shared, out)

    def _by_id(self, kids: list[Any], out: list[Any]) -> int:
        """`_count` by identity: the distinct references first."""
        found = dict(zip(map(id, kids), kids, strict=True))
        new = found.keys() - self.leaves - self.pending.keys()
        if self.stacks:
            if not self.stacked and not self.stacks.isdisjoint(found):
                self.stacked = True
            new -= self.stacks
        here = found.keys() & self.pending.keys() if self.pending else set()
        counted: dict[int, int] = {}  # new shared containers holding containers: references
        # a reference count reads the data's references, `kids`', `found`'s and `objs`'
        extra = _EXTRA + 1
        if new:
            objs = list(map(found.__getitem__, new))
            rcs = _refcounts(objs)
            once = bytes(map((2 + extra).__eq__, rcs))  # referenced once: ready now
            out.extend(compress(objs, once))
            self.by_count = 2 * once.count(1) >= len(kids)
            if 0 in once:
                shared = list(compress(objs, map(operator.not_, once)))
                rcs = list(compress(rcs, map(operator.not_, once)))
                del objs
                deep = _holds_containers(shared)
                # a shared container holding none cannot be in a cycle nor deepen anything:
                # remembered as met, its values checked once
                flat = list(compress(shared, map(operator.not_, deep)))
                self.leaves.update(map(id, flat))
                out.extend(flat)
                deep_objs = list(compress(shared, deep))
                del shared, flat
                # the data's references plus this slice's
                deep_refs = list(map((-extra).__add__, compress(rcs, deep)))
                rest = self._stacks(deep_objs, deep_refs, out)  # those that are not stacks
                read = compress(deep_refs, rest)
                counted = dict(zip(map(id, compress(deep_objs, rest)), read, strict=True))
        if counted or here:
            counts = Counter(filter((counted.keys() | here).__contains__, map(id, kids)))
            # references left: the data's, less this slice's (C-level: there may be many)
            sub, twice = operator.sub, (2).__mul__
            met_new = map(sub, counted.values(), map(twice, map(counts.__getitem__, counted)))
            left = dict(zip(counted, met_new, strict=True))
            met_old = map(sub, map(self.pending.__getitem__, here), map(counts.__getitem__, here))
            left.update(zip(here, met_old, strict=True))
            ready = list(compress(left, map((1).__gt__, left.values())))  # none left
            self.pending.update(compress(left.items(), map((0).__lt__, left.values())))
            for i in ready:
                self.pending.pop(i, None)
            out.extend(map(found.__getitem__, ready))
        return len(new)

    def _stacks(self, objs: list[Any], refs: list[int], out: list[Any]) -> bytes:
        """Find the stacks among `objs` (new shared containers holding containers): lists and
        tuples of `_LONG` to `_PEEK` items, every one a container holding none (a frames list:
        frame dicts). A stack cannot be in a cycle and reaches one level below itself, so it
        is met once, here, and never counted down: its other references (a frames list is
        shared by the entries of a tiled trace, or by a block and its alloc) cost a lookup.
        Its items not met before are leaves from now on (and checked at the next level), and
        it is remembered as a run, so that the next equal list is one comparison. Returns 0/1
        per object: 1 where it is not a stack."""
        rest = bytearray(b"\x01") * len(objs)
        many = map(_MANY.__le__, refs)
        cands = [
            i
            for i, x in compress(enumerate(objs), many)
            if type(x) is not dict and _LONG <= len(x) <= _PEEK
        ]
        seqs = list(map(objs.__getitem__, cands))
        met = bytearray(self._met_runs(seqs))  # equal to a run: a stack (one C-level pass)
        self.hits += met.count(1)
        # the others, a group of about `slice` items at a time
        todo = list(compress(range(len(seqs)), map(operator.not_, met)))
        group: list[int] = []
        held = 0
        for j in todo:
            group.append(j)
            held += len(seqs[j])
            if held >= self.slice or j == todo[-1]:
                found = self._stack_group(list(map(seqs.__getitem__, group)), out)
                for j2 in compress(group, found):
                    met[j2] = 1
                    seq = seqs[j2]
                    same = self.runs.setdefault((len(seq), id(seq[0])), [])
                    if len(same) < _RUNS:
                        same.append(seq)
                        self.kept += 1
                group, held = [], 0
                self._check()
        if 1 in met:
            self.stacks.update(map(id, compress(seqs, met)))
            self.stacked = True
            for i in compress(cands, met):
                rest[i] = 0
        return bytes(rest)

    def _stack_group(self, seqs: list[Any], out: list[Any]) -> list[bool]:
        """Which of `seqs` hold only leaves (C-level passes over all their items at once). Their
        items not met before that are containers holding none become leaves (met once: they
        go to `out`), whether or not their list is a stack."""
        items = list(chain.from_iterable(seqs))
        ids = list(map(id, items))
        leaves = self.leaves
        known = bytes(map(leaves.__contains__, ids))
        if 0 in known:
            fresh = bytes(map(operator.not_, known))
            unknown = dict(zip(compress(ids, fresh), compress(items, fresh), strict=True))
            kids = _containers(list(unknown.values()))  # type-checks them; scalars left out
            flat = list(compress(kids, map(operator.not_, _holds_containers(kids))))
            leaves.update(map(id, flat))
            out.extend(flat)
            if not leaves.issuperset(unknown):  # scalars, or containers holding some
                known = bytes(map(leaves.__contains__, ids))
            else:
                known = b"\x01" * len(ids)
            del unknown, kids, flat
        del items, ids
        ends = list(accumulate(map(len, seqs)))
        return [0 not in known[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def _holds_containers(objs: list[Any]) -> list[bool]:
    """For each container, whether it holds a container (its first value nearly always says:
    a frames list starts with a frame)."""
    vals = [x.values() if type(x) is dict else x for x in objs]
    first = map(_CONTAINERS.__contains__, map(type, map(next, map(iter, vals), repeat(None))))
    return [
        f or any(map(_CONTAINERS.__contains__, map(type, v)))
        for f, v in zip(first, vals, strict=True)
    ]


def _containers(part: list[Any]) -> list[Any]:
    """The containers among `part`; `SnapshotError` on a value that is not plain data."""
    each = list(map(type, part))  # the one pass that reads the values themselves
    types = set(each)
    if not types <= _PLAIN:
        raise SnapshotError(f"a value of type {_names(types - _PLAIN)} (only plain data allowed)")
    if types <= _SCALARS:
        return []
    if types <= _CONTAINERS:
        return part
    return list(compress(part, map(_CONTAINERS.__contains__, each)))


def _names(types: set[type]) -> str:
    return ", ".join(sorted(t.__name__ for t in types))
