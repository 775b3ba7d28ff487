"""The walk's stacks (issue 20): a shared long list of shared leaves, read where it is first
met, still bounds the depth by its deepest reference and never hides a cycle."""

from __future__ import annotations

import pickle

import pytest

from gpumemviz.io import check_plain
from gpumemviz.snapshot import SnapshotError

LEAF = {"name": "f", "filename": "m.py", "line": 1}
STACK = [LEAF, dict(LEAF)] * 8  # 16 items: long enough to be compared and read as a stack


def _depth_ok(obj: object, limit: int) -> bool:
    fresh = pickle.loads(pickle.dumps(obj, protocol=4))  # nothing else holds its parts
    try:
        check_plain(fresh, max_depth=limit)
    except SnapshotError as e:
        assert str(e).startswith(f"data nested deeper than {limit} levels"), e
        return False
    return True


MANY = [STACK] * 8  # a stack is read where first met once it has 8 references or more


@pytest.mark.parametrize(
    ("shape", "longest"),
    [
        ([MANY, [[[[STACK]]]]], 7),  # met first near the top, deepest later
        ([[[[[STACK]]]], MANY], 7),  # met first at its deepest
        ({"x": MANY, "y": [[STACK]], "z": [STACK] * 20}, 5),  # lists of stacks
        ([STACK] * 9, 3),
        ([[STACK, {"frames": STACK}], [{"frames": STACK}]] * 4, 5),  # blocks and entries
    ],
)
def test_a_stack_is_as_deep_as_its_deepest_reference(shape, longest):
    for limit in range(1, longest + 3):
        assert _depth_ok(shape, limit) == (limit >= longest), limit


def test_a_shared_long_list_holding_a_cycle_is_no_stack():
    inner: list[object] = []
    outer = [inner] * 16
    inner.append(outer)
    with pytest.raises(SnapshotError, match=r"hold themselves \(a cycle\)$"):
        check_plain(pickle.loads(pickle.dumps([outer] * 9, protocol=4)))


def test_the_items_of_a_stack_are_checked():
    bad = [{"name": "f", ("tuple", "key"): 1}] * 16
    with pytest.raises(SnapshotError, match=r"^a dict key of type tuple"):
        check_plain(pickle.loads(pickle.dumps([bad] * 9, protocol=4)))
    deep = [{"name": [[1]]}] * 16  # items holding containers: no stack, counted as before
    assert _depth_ok([deep] * 9, 5) and not _depth_ok([deep] * 9, 4)
