"""The replay's address provider: a reservation made by a malloc the trace shows no map next to
takes the first later map of its stream and pool, the pool read from the malloc's own entry when
the driver did not say it (the driver's inline allocs leave it unsaid)."""

from __future__ import annotations

import pytest

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay.placement import INVENTED_TOP, Provider
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.allocator.rules import MIB, is_small

STEPS = [
    ("alloc", 0x1000, 100, 0),  # a small request (rounds to 512 B)
    ("segment_map", 0x80000000, 20 * MIB, 0),  # mapped for the large pool (the alloc after it)
    ("alloc", 0x80000000, 5 * MIB, 0),
    ("segment_map", 0x40000000, 2 * MIB, 0),  # mapped for the small pool
    ("alloc", 0x40000000, 200, 0),
    ("segment_map", 0xC0000000, 20 * MIB, 0),  # the large pool's again
    ("alloc", 0xC0000000, 3 * MIB, 0),
]


def _small_at(j: int) -> bool:
    """The pool of the first malloc after entry j (as the driver's `small_at`)."""
    return next(is_small(s[2]) for s in STEPS[j + 1 :] if s[0] == "alloc")


def _ask(steps: list[tuple[str, int, int, int]], pos: int, small: bool | None) -> Provider:
    p = Provider(steps, invent=False, small_at=_small_at)
    p.full = True  # the device total is known: a reservation's base is looked ahead for
    p.window, p.pos, p.small = (), pos, small
    return p


@pytest.mark.parametrize(("pos", "want"), [(0, 0x40000000), (2, 0xC0000000)])
def test_a_reservation_no_map_shows_takes_the_next_map_of_its_pool(pos, want):
    size = STEPS[pos][2]
    told = _ask(STEPS, pos, is_small(size))("expandable", size, 0)
    unsaid = _ask(STEPS, pos, None)("expandable", size, 0)
    assert told == unsaid == want


def test_with_no_later_map_of_its_pool_the_address_is_invented():
    p = _ask(STEPS[:5], 2, None)  # a large malloc; only the small pool maps after it
    assert p("expandable", 5 * MIB, 0) > INVENTED_TOP - (1 << 40)
    assert p.surprises == 1


def test_a_recording_builds_the_start_segments_once_and_says_whether_it_maps():
    """Every pass loads its model from the recording's start segments (built once, shared) and
    its reservations read `maps` (no look for maps in a trace that has none)."""
    a = CachingAllocator(1 << 30, "expandable_segments:True")
    a.malloc(3 * MIB)
    a.free(a.malloc(100))
    tl = Recording.from_snapshot(a.snapshot())
    first = tl.start_segments()
    assert first == tl.start.to_segments(0)
    assert tl.start_segments() is first
    assert tl.maps
    plain = CachingAllocator(1 << 30)
    plain.free(plain.malloc(100))
    assert not Recording.from_snapshot(plain.snapshot()).maps
