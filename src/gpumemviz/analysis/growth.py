"""Is it growing: the holders whose live bytes rise step over step (leak suspects), and how
long each holder's allocations live.

A training or inference loop repeats itself: every step asks for the same tensors at the same
lines in the same order. The steps are the profiler's or the optimizer's markers where the file
has them (``external_annotations``: each ``ProfilerStep#N`` start, else each end of an
``Optimizer.step`` scope), else they are found from that repetition in the trace's ``alloc``
entries (`find_steps`: the period of the sequence of (user frame, size) tokens, anchored on a
token that comes back once per period). At each step boundary the live bytes of every holder
(the innermost user frame, as `holders.frame_key` names it) are read off the trace; a holder
whose bytes rise in most steps from some step on is a suspect, its rate the least-squares slope
of its bytes over those steps. Bytes here are the trace's requested bytes (what the program
kept), not the allocator's rounded ones.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from gpumemviz.analysis.frames import UserFrames, format_frame
from gpumemviz.analysis.holders import frame_key
from gpumemviz.snapshot.schema import JsonDict
from gpumemviz.snapshot.tables import Trace
from gpumemviz.snapshot.units import format_size

__all__ = [
    "FREED_SHARE",
    "MIN_GROWTH_SHARE",
    "MIN_STEPS",
    "RISING_SHARE",
    "STEP_MARKERS",
    "Lifetime",
    "Steps",
    "Suspect",
    "find_steps",
    "growth",
    "marker_steps",
]

#: Fewest step boundaries a verdict is made on (three steps of growth to see a trend).
MIN_STEPS = 4
#: A suspect's bytes rise in at least this share of the steps since it started growing.
RISING_SHARE = 0.75
#: The period found must repeat this share of the alloc sequence (the rest: data-dependent
#: shapes, a first step that builds the optimizer state, the trace's cut ends).
MATCH_SHARE = 0.6
#: Most step boundaries growth is measured at (the newest ones): bounds the per-holder table.
MAX_STEPS = 512
#: A suspect's growth over the steps measured is at least this share of the most bytes live at
#: a step boundary: a few KiB a layer keeps in a forward pass is not what runs a device out.
MIN_GROWTH_SHARE = 0.01
#: A repeated pattern is a loop's steps only when each step's net growth is at most this share
#: of its swing (`_returns`).
NET_SHARE = 0.5
PERIODIC = "the periodic pattern of the alloc sequence"
#: A repeated pattern is a loop's steps only when at least this share of its allocations is
#: freed again: a step frees most of what it asks for (a loop that builds a model, or a
#: forward pass that keeps every activation, repeats too, but keeps everything).
FREED_SHARE = 0.5


@dataclass(frozen=True)
class Steps:
    """The repeated steps of a trace: `starts` are the trace entry indices where each step
    begins (its first alloc), `period` the number of allocs per step, `basis` how they were
    found."""

    starts: tuple[int, ...]
    period: int
    basis: str

    def to_dict(self) -> JsonDict:
        return {"starts": list(self.starts), "period": self.period, "basis": self.basis}


@dataclass(frozen=True)
class Suspect:
    """A holder that grows step over step: `frame` ("file:line" of the innermost user frame;
    None: no user frame recorded), its rate in bytes per step, the step (1-based) it started
    growing in, and the bytes it keeps at the last step boundary."""

    frame: str | None
    label: str
    bytes_per_step: int
    since_step: int
    kept: int
    steps: int

    @property
    def sentence(self) -> str:
        """ "+64.00 MiB per step at train.py:88:step, kept since step 3"."""
        return (
            f"+{format_size(self.bytes_per_step)} per step at {self.label}, kept since step "
            f"{self.since_step} ({format_size(self.kept)} held after {self.steps} steps)"
        )

    def to_dict(self) -> JsonDict:
        return {
            "frame": self.frame,
            "label": self.label,
            "bytes_per_step": self.bytes_per_step,
            "since_step": self.since_step,
            "kept": self.kept,
            "steps": self.steps,
            "sentence": self.sentence,
        }


@dataclass(frozen=True)
class Lifetime:
    """How long the allocations of one holder live: freed within the step they were made in,
    freed in a later step, or never freed (alive at the trace's end)."""

    frame: str | None
    label: str
    within_step: int
    across_steps: int
    forever: int
    forever_bytes: int

    def to_dict(self) -> JsonDict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _tokens(trace: Trace) -> tuple[np.ndarray, np.ndarray, list[str | None], list[str]]:
    """The alloc entries' indices, their (frame, size) token codes, and each entry's frame key
    and label (by alloc order)."""
    alloc = trace.action_names.index("alloc")
    at = np.flatnonzero(trace.action == alloc)
    frames = trace.frames()
    stacks = [frames[i] for i in at.tolist()]
    ids = list(map(id, stacks))
    # each distinct stack judged once (torch's lists are shared), then read per entry at C speed
    finder = UserFrames()
    seen: dict[int, tuple[str | None, str]] = {}
    for list_id, fr in dict(zip(ids, stacks, strict=True)).items():
        f = finder(fr) if fr else None
        seen[list_id] = (
            (None, "(no frame outside torch)" if fr else "(no stack recorded)")
            if f is None
            else (frame_key(f), format_frame(f))
        )
    got = list(map(seen.__getitem__, ids))
    keys: list[str | None] = list(map(itemgetter(0), got))
    labels: list[str] = list(map(itemgetter(1), got))
    if not got:
        return at, np.empty(0, np.int64), keys, labels
    # token codes: each (frame key, size) pair numbered in the order it first comes
    key_code: dict[str | None, int] = {}
    code_by_id = {i: key_code.setdefault(k, len(key_code)) for i, (k, _) in seen.items()}
    kc = np.array(list(map(code_by_id.__getitem__, ids)), np.int64)
    sizes = trace.size[at]
    low, span = int(sizes.min()), int(sizes.max()) - int(sizes.min()) + 1
    if len(key_code) * span < 1 << 62:  # one int64 per pair: a flat sort
        _, first, inverse = np.unique(kc * span + (sizes - low), True, True)
    else:
        pairs = np.stack([kc, sizes])
        _, first, inverse = np.unique(pairs, axis=1, return_index=True, return_inverse=True)
    code_of = np.empty(len(first), np.int64)
    code_of[np.argsort(first)] = np.arange(len(first))
    tok = code_of[inverse.reshape(-1)]
    return at, tok, keys, labels


#: Markers that start (or end) one step each, tried in order: (pattern, stage, basis).
STEP_MARKERS = (
    (re.compile(r"ProfilerStep#\d+"), "START", "the ProfilerStep markers"),
    (re.compile(r"Optimizer\.step\b.*"), "END", "the ends of Optimizer.step"),
)


def marker_steps(trace: Trace, annotations: Sequence[object] | None, device: int) -> Steps | None:
    """The steps the file's ``external_annotations`` mark on this device's trace (see
    `STEP_MARKERS`), or None: fewer than `MIN_STEPS` markers, or a trace without times.

    Examples
    --------
    >>> t = Trace.from_entries([{"action": "alloc", "addr": i * 512, "size": 512, "stream": 0,
    ...                          "time_us": 10 * i + 1} for i in range(10)])
    >>> marks = [{"name": f"ProfilerStep#{k}", "stage": "START", "device": 0, "time_us": 20 * k}
    ...          for k in range(5)]
    >>> marker_steps(t, marks, 0)
    Steps(starts=(0, 2, 4, 6, 8), period=2, basis='the ProfilerStep markers')
    """
    if not isinstance(annotations, list | tuple) or not len(trace) or (trace.time_us <= 0).any():
        return None
    for pattern, stage, basis in STEP_MARKERS:
        times = sorted(
            a["time_us"]
            for a in annotations
            if isinstance(a, dict)
            and a.get("device", device) == device
            and a.get("stage") == stage
            and isinstance(a.get("name"), str)
            and pattern.fullmatch(a["name"])
            and type(a.get("time_us")) is int
        )
        if len(times) < MIN_STEPS:
            continue
        at = np.searchsorted(trace.time_us, np.asarray(times, np.int64), side="left")
        starts = sorted({int(i) for i in at.tolist() if i < len(trace)})
        if len(starts) < MIN_STEPS:
            continue
        allocs = trace.action == trace.action_names.index("alloc")
        before = np.concatenate([[0], np.cumsum(allocs)])  # allocs before each entry
        period = int(np.median(np.diff(before[starts])))  # allocs per step
        return Steps(starts=tuple(starts), period=period, basis=basis)
    return None


def find_steps(trace: Trace) -> Steps | None:
    """The repeated steps of a trace, from the period of its alloc sequence; None when it does
    not repeat (fewer than `MIN_STEPS` periods, or no period matching `MATCH_SHARE` of it).

    Examples
    --------
    >>> step = [("alloc", 0, 1024), ("alloc", 2048, 4096), ("free_requested", 2048, 4096)]
    >>> t = Trace.from_entries([{"action": a, "addr": x, "size": s, "stream": 0}
    ...                         for _ in range(5) for a, x, s in step])
    >>> find_steps(t)
    Steps(starts=(0, 3, 6, 9, 12), period=2, basis='the periodic pattern of the alloc sequence')
    """
    at, tok, _, _ = _tokens(trace)
    return _steps(at, tok, _freed_share(trace))


def _freed_share(trace: Trace) -> float:
    """The share of the trace's alloc entries whose block is freed again within the trace."""
    names = trace.action_names
    alloc = names.index("alloc")
    codes = [alloc, names.index("free_requested"), names.index("free_completed")]
    at = np.flatnonzero(np.isin(trace.action, codes))
    order = np.argsort(trace.addr[at], kind="stable")  # by address, then by position
    addr, action = trace.addr[at][order], trace.action[at][order]
    is_alloc = action == alloc
    made = int(is_alloc.sum())
    # an alloc is freed again when the next entry at its address is a free
    freed = int((is_alloc[:-1] & (addr[1:] == addr[:-1]) & ~is_alloc[1:]).sum())
    return freed / made if made else 0.0


def _steps(at: np.ndarray, tok: np.ndarray, freed: float) -> Steps | None:
    m = len(tok)
    if m < MIN_STEPS or freed < FREED_SHARE:
        return None
    order = np.argsort(tok, kind="stable")
    counts = np.bincount(tok)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    # each token that comes back at a steady gap proposes that gap as the period
    proposals: dict[int, tuple[int, int]] = {}  # period -> (first occurrence, token)
    for t in np.flatnonzero(counts >= MIN_STEPS).tolist():
        where = order[bounds[t] : bounds[t + 1]]
        gaps = np.diff(where)
        values, counts_of = np.unique(gaps, return_counts=True)
        p = int(values[counts_of.argmax()])  # the commonest gap (the smallest of a tie)
        if p < 2 or counts_of.max() < RISING_SHARE * len(gaps):
            continue  # one allocation repeated is a loop over layers or tensors, not a step
        first = int(where[0])
        if p not in proposals or first < proposals[p][0]:
            proposals[p] = (first, t)
    best: tuple[int, int, int] | None = None  # period, first, token
    for p in sorted(proposals):
        if m // p < MIN_STEPS:
            continue
        if float((tok[:-p] == tok[p:]).mean()) >= MATCH_SHARE:
            best = (p, *proposals[p])
            break  # the shortest period that repeats: its multiples repeat too
    if best is None:
        return None
    p, _, t = best
    anchors = order[bounds[t] : bounds[t + 1]]
    # one anchor per period: a token can come back inside a step too
    kept = [int(anchors[0])]
    for a in anchors[1:].tolist():
        if a - kept[-1] >= p:
            kept.append(a)
    if len(kept) < MIN_STEPS:
        return None
    return Steps(starts=tuple(int(at[a]) for a in kept), period=p, basis=PERIODIC)


def growth(
    trace: Trace,
    annotations: Sequence[object] | None = None,
    device: int = 0,
    live_total: int = 0,
) -> tuple[tuple[Suspect, ...], tuple[Lifetime, ...], Steps | None]:
    """The leak suspects of a device's trace, each holder's lifetimes, and the steps found.

    Parameters
    ----------
    trace : Trace
        One device's recorded history.
    annotations : list, optional
        The file's ``external_annotations``: step markers, where it has them.
    device : int
        The trace's device (the markers of that device count).
    live_total : int
        The device's allocated bytes (the trace may not show every live block): a suspect
        grows by at least `MIN_GROWTH_SHARE` of the larger of this and the trace's peak.

    Returns
    -------
    (suspects, lifetimes, steps)
        `suspects` fastest first, empty when nothing grows (or no steps were found);
        `lifetimes` per holder, the most allocations first; `steps` None without repetition.
    """
    if not len(trace):
        return (), (), None
    at, tok, keys, labels = _tokens(trace)
    steps = marker_steps(trace, annotations, device) or _steps(at, tok, _freed_share(trace))
    if steps is None:
        return (), (), None
    starts = np.asarray(steps.starts, np.int64)
    skipped = max(len(starts) - MAX_STEPS, 0)  # steps before the measured ones
    measured = starts[skipped:].tolist()
    names = trace.action_names
    code = {n: c for c, n in enumerate(names)}
    alloc, frees = code["alloc"], {code["free_requested"], code["free_completed"]}
    act = trace.action.tolist()
    addr = trace.addr.tolist()
    size = trace.size.tolist()
    # the step each entry is in (0: before the first step; k: step k, 1-based)
    step_of = np.searchsorted(starts, np.arange(len(act)), side="right").tolist()
    groups: dict[str | None, int] = {}
    label_of: dict[int, str] = {}
    group_of_alloc = [0] * len(act)
    for j, i in enumerate(at.tolist()):
        g = groups.setdefault(keys[j], len(groups))
        label_of.setdefault(g, labels[j])
        group_of_alloc[i] = g
    n_groups = len(groups)
    # plain lists in the loop below (one step per entry): a numpy scalar update costs several
    # times a list's
    live_bytes = [0] * n_groups
    rows: list[list[int]] = []  # live bytes before each measured step's start
    within = [0] * n_groups
    across = [0] * n_groups
    live: dict[int, tuple[int, int, int]] = {}  # addr -> (group, bytes, step)
    total = 0  # live bytes of the trace's allocations now
    level = [0] * len(measured)  # ... at each measured step's start
    peak = [0] * len(measured)  # ... at most during the step
    b = 0
    next_start = measured[0] if measured else -1
    for i, a in enumerate(act):
        if i == next_start:
            rows.append(live_bytes.copy())
            level[b] = peak[b] = total
            b += 1
            next_start = measured[b] if b < len(measured) else -1
        if a == alloc:
            g = group_of_alloc[i]
            nbytes = size[i]
            live[addr[i]] = (g, nbytes, step_of[i])
            live_bytes[g] += nbytes
            total += nbytes
            if b and total > peak[b - 1]:
                peak[b - 1] = total
        elif a in frees:
            got = live.pop(addr[i], None)
            if got is not None:
                g, nbytes, made = got
                live_bytes[g] -= nbytes
                total -= nbytes
                if made == step_of[i]:
                    within[g] += 1
                else:
                    across[g] += 1
    rows += [[0] * n_groups for _ in range(len(measured) - len(rows))]  # starts not reached
    series = np.asarray(rows, np.int64).reshape(len(measured), n_groups)
    forever = np.zeros(n_groups, np.int64)
    forever_bytes = np.zeros(n_groups, np.int64)
    for g, nbytes, _ in live.values():
        forever[g] += 1
        forever_bytes[g] += nbytes
    if steps.basis == PERIODIC and not _returns(level, peak):
        return (), (), None  # a loop over layers that keeps what it makes, not a step
    key_of = {g: k for k, g in groups.items()}
    suspects = []
    least = MIN_GROWTH_SHARE * max(int(series.sum(axis=1).max(initial=0)), live_total)
    for g in range(n_groups):
        s = _suspect(series[:, g], least)
        if s is not None:
            rate, since = s
            suspects.append(
                Suspect(
                    frame=key_of[g],
                    label=label_of[g],
                    bytes_per_step=rate,
                    since_step=since + skipped,
                    kept=int(series[-1, g]),
                    steps=len(starts) - 1,
                )
            )
    suspects.sort(key=lambda s: (-s.bytes_per_step, s.label))
    lifetimes = sorted(
        (
            Lifetime(
                frame=key_of[g],
                label=label_of[g],
                within_step=int(within[g]),
                across_steps=int(across[g]),
                forever=int(forever[g]),
                forever_bytes=int(forever_bytes[g]),
            )
            for g in range(n_groups)
        ),
        key=lambda x: (-(x.within_step + x.across_steps + x.forever), x.label),
    )
    return tuple(suspects), tuple(lifetimes), steps


def _returns(level: list[int], peak: list[int]) -> bool:
    """Whether the steps give back most of what they ask for: a step's net growth (level to
    next level) is at most `NET_SHARE` of its swing (peak above its starting level), taken as
    the medians over the steps. A training step does; a forward pass over layers, each keeping
    its activations for the backward, repeats too but does not."""
    swing = np.median(np.subtract(peak[:-1], level[:-1]))
    net = np.median(np.diff(level))
    return bool(swing > 0 and net <= NET_SHARE * swing)


def _suspect(v: np.ndarray, least: float) -> tuple[int, int] | None:
    """(bytes per step, the step it started growing in) of a holder whose live bytes `v` at
    the step boundaries rise in `RISING_SHARE` of the steps from some step on (at least
    `MIN_STEPS` - 1 of them) by `least` bytes in all, None otherwise. ``v[k]`` is the bytes
    before step k + 1 starts, so ``v[k] - v[k - 1]`` is what step k kept."""
    rising = np.diff(v) > 0
    n = len(rising)
    if rising.sum() < MIN_STEPS - 1:  # most holders: nothing to look at
        return None
    after = np.cumsum(rising[::-1])[::-1]  # after[s]: rising steps from s on
    for s in np.flatnonzero(rising).tolist():
        if after[s] < MIN_STEPS - 1 or after[s] < RISING_SHARE * (n - s):
            continue
        if v[-1] <= v[s] or v[-1] - v[s] < least:
            continue
        ys = v[s:].astype(np.float64)
        xs = np.arange(len(ys), dtype=np.float64)
        rate = float(np.polyfit(xs, ys, 1)[0])
        if rate <= 0:
            return None
        return round(rate), s + 1
    return None
