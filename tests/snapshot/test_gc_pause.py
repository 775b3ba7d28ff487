"""`no_gc`: the GC paused while big structures are built, and what a big stretch built made
old at once (no young collection scans it), never releasing objects the program froze."""

from __future__ import annotations

import gc

import pytest

from gpumemviz.snapshot.gc_pause import PROMOTE_OVER, no_gc


@pytest.fixture
def gc_on():
    was = gc.isenabled()
    gc.enable()
    gc.collect()
    yield
    gc.unfreeze()
    if not was:
        gc.disable()


def _gen(obj: object) -> int | None:
    return next((g for g in range(3) if any(o is obj for o in gc.get_objects(g))), None)


def test_a_big_stretch_leaves_its_containers_in_the_oldest_generation(gc_on):
    with no_gc(promote_built=True):
        assert not gc.isenabled()
        built = [[i] for i in range(2 * PROMOTE_OVER)]
    assert gc.isenabled()
    assert gc.get_count()[0] < 100  # no young collection has them to scan
    assert _gen(built) == 2 and _gen(built[-1]) == 2
    assert gc.get_freeze_count() == 0


def test_a_small_stretch_leaves_them_young(gc_on):
    with no_gc(promote_built=True):
        built = [[i] for i in range(100)]
    assert _gen(built) in (0, 1)  # young (a collection may have moved it to gen 1)


def test_without_asking_nothing_is_promoted(gc_on):
    """Repeated work (a sample, a seek) never promotes: the user's young garbage stays young."""
    with no_gc():
        built = [[i] for i in range(2 * PROMOTE_OVER)]
    assert _gen(built) in (0, 1)


def test_only_what_the_stretch_built_counts(gc_on):
    """Containers made before the pause (and not yet collected) do not make a small stretch
    promote."""
    gc.disable()
    before = [[i] for i in range(2 * PROMOTE_OVER)]
    gc.enable()
    with no_gc(promote_built=True):
        built = [[i] for i in range(100)]
    assert _gen(built) in (0, 1)  # young (a collection may have moved it to gen 1)
    del before


def test_objects_the_program_froze_stay_frozen(gc_on):
    mine = [[1], [2]]
    gc.freeze()
    frozen = gc.get_freeze_count()
    with no_gc(promote_built=True):
        built = [[i] for i in range(2 * PROMOTE_OVER)]
    assert gc.get_freeze_count() > frozen // 2  # not released (a few may have been freed)
    assert _gen(mine) is None  # still frozen
    assert _gen(built) in (0, 1)  # young: as Python leaves them


def test_nested_stretches_promote_once_at_the_outermost(gc_on):
    with no_gc(promote_built=True):
        with no_gc(promote_built=True):
            inner = [[i] for i in range(2 * PROMOTE_OVER)]
        assert not gc.isenabled()
        assert _gen(inner) == 0  # still paused: nothing moved yet
    assert _gen(inner) == 2


def test_paused_gc_stays_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        with no_gc(promote_built=True):
            built = [[i] for i in range(2 * PROMOTE_OVER)]
        assert not gc.isenabled()
        assert _gen(built) in (0, 1)  # the caller's pause: nothing touched
    finally:
        if was:
            gc.enable()
