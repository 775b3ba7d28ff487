"""The recorded segment entries read against the model's: scored, and what they prove.

`score` compares a malloc's (or an empty_cache's) segment entries with the recorded run,
`same_entries` / `same_releases` tell which story of a release run the model reproduces,
`pinch` reads the capacity a release run proves, and `hidden_growth` / `without` give the
stories of a ring buffer cut that hid the first malloc's new segment. Pure functions of the
recorded steps and layouts, split from driver.py (whose `Driver` calls them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.replay.layout import INACTIVE, Layout, LayoutError
from gpumemviz.allocator.replay.result import DeviceReplay
from gpumemviz.allocator.replay.steps import SEGMENT_ACTIONS, Rules, Step
from gpumemviz.allocator.rules import page_size
from gpumemviz.allocator.trace import TraceRow

__all__ = [
    "GROWS",
    "RELEASES",
    "hidden_growth",
    "pinch",
    "same_entries",
    "same_releases",
    "score",
    "without",
]

RELEASES = ("segment_free", "segment_unmap")
GROWS = ("segment_alloc", "segment_map")


def without(lay: Layout, entry: tuple[str, int, int]) -> Layout | None:
    """`lay` before a new segment / mapped range `entry` (None when it is not there, free)."""
    out = lay.copy()
    action, addr, size = entry
    try:
        if action == "segment_alloc":
            out.remove_segment(addr, size, "hidden segment_alloc")
        else:
            out.unmap_range(addr, size, "hidden segment_map")
    except LayoutError:
        return None
    return out


def hidden_growth(
    start: Layout, step: Step, rules: Rules, config: AllocatorConfig
) -> list[tuple[str, int, int]]:
    """What the first malloc may have made before the cut: the whole free segment its
    block starts, or the last pages mapped under it (the allocation starts at the free
    tail, and ceil((rounded - tail) / page) pages are mapped above it)."""
    _, addr, size, stream = step
    seg = start.segment_at(addr)
    if seg is None or seg.stream != stream:
        return []
    k = seg.index(addr)
    b = seg.blocks[k]
    if b[0] != addr or b[2] != INACTIVE:
        return []
    rounded = rules.round(size)
    if not seg.expandable:
        # the search failed on every other block, so the model picks this one unless the
        # oversize rules refuse it (only then does the story matter)
        mss = config.max_split_size
        refused = (rounded < mss <= seg.size) or (
            rounded >= mss and seg.size >= rounded + config.max_non_split_rounding_size
        )
        if len(seg.blocks) == 1 and refused:
            return [("segment_alloc", seg.address, seg.size)]
        return []
    page = page_size(seg.small, config.large_segment_size)
    end = b[0] + b[1]
    out = []
    m = seg.address + -(-(addr - seg.address) // page) * page  # first page boundary >= addr
    while m - addr < rounded and m < end:
        n = -(-(rounded - (m - addr)) // page) * page
        if m + n <= end:
            out.append(("segment_map", m, n))
        m += page
    return out


def score(
    out: DeviceReplay,
    steps: Sequence[Step],
    i: int,
    own: Sequence[TraceRow],
    rec: Sequence[int],
    miss: Callable[[int, str, str], None],
) -> bool:
    """Compare the model's segment entries `own` with the recorded run `rec` (indices into
    `steps`), counted in `out`, each difference told to `miss`; True when equal."""
    mine = [(e[0], e[1], e[2]) for e in own if e[0] in SEGMENT_ACTIONS]
    theirs = [(steps[j][0], steps[j][1], steps[j][2]) for j in rec]
    grow_m = [e for e in mine if e[0] in GROWS]
    grow_t = [e for e in theirs if e[0] in GROWS]
    out.segments_recorded += len(grow_t)
    out.segments_matched += sum(1 for a, b in zip(grow_m, grow_t, strict=False) if a == b)
    if grow_m != grow_t:
        miss(i, "segment", f"model grew {grow_m[:3]}, recorded {grow_t[:3]}")
    rel_t = [e for e in theirs if e[0] in RELEASES]
    rel_m = [e for e in mine if e[0] in RELEASES]
    if rel_t:
        out.bursts += 1
        if rel_m == rel_t:
            out.bursts_matched += 1
    if rel_m != rel_t:
        miss(i, "burst", f"model released {len(rel_m)} ranges, recorded {len(rel_t)}")
    return mine == theirs


def same_entries(steps: Sequence[Step], own: Sequence[TraceRow], run: Sequence[int]) -> bool:
    """Are the model's segment entries `own` the recorded `run`?"""
    mine = [(e[0], e[1], e[2]) for e in own if e[0] in SEGMENT_ACTIONS]
    return mine == [(steps[j][0], steps[j][1], steps[j][2]) for j in run]


def same_releases(steps: Sequence[Step], own: Sequence[TraceRow], rels: Sequence[int]) -> bool:
    """Are the model's releases in `own` the recorded ones `rels`?"""
    mine = [(e[0], e[1], e[2]) for e in own if e[0] in RELEASES]
    return mine == [(steps[j][0], steps[j][1], steps[j][2]) for j in rels]


def pinch(
    steps: Sequence[Step],
    run: Sequence[int],
    rels: Sequence[int],
    layout_at: Callable[[int], Layout],
    reserved: int,
) -> int | None:
    """With no capacity known, the capacity under which the malloc after `run` (model
    holding `reserved` bytes) would have released the recorded run `rels` itself, or None
    when an empty_cache explains the run.

    An empty_cache (torch's release_cached_blocks) frees every entirely free segment,
    large pool first, in (stream, size, address) order; a run that is not that, followed by
    a new segment, is the allocator's own release after a failed cudaMalloc (with
    max_split_size, the oversize blocks first). The process then had room for the new
    segment only after the release: capacity = reserved - released + new.
    """
    if any(steps[j][0] == "segment_unmap" for j in rels):
        return None  # only release_cached_blocks unmaps: the same as an empty_cache
    grown = sum(steps[j][2] for j in run if steps[j][0] in GROWS and j > rels[-1])
    if not grown:
        return None  # nothing was allocated after it: nothing ran out
    before = layout_at(run[0] - 1)
    free = sorted(
        (seg.small, seg.stream, seg.size, seg.address)
        for seg in before.segs.values()
        if not seg.expandable and len(seg.blocks) == 1 and seg.blocks[0][2] == INACTIVE
    )
    if [(a, s) for _, _, s, a in free] == [(steps[j][1], steps[j][2]) for j in rels]:
        return None
    released = sum(steps[j][2] for j in rels)
    return reserved - released + grown
