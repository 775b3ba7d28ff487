"""Modules named like their function stay callable: `gpumemviz.diff(a, b)` after `import`."""

from __future__ import annotations

import inspect
import pickle
import sys
import types

import pytest

import gpumemviz
from gpumemviz._callable import make_module_callable


@pytest.fixture(scope="module")
def recorded() -> dict:
    """A snapshot with a trace the allocator model recorded (no shared files needed)."""
    from gpumemviz.allocator.model import CachingAllocator
    from gpumemviz.allocator.workloads import run, training_loop

    w = training_loop(iterations=3, capacity=14 << 30)
    a = CachingAllocator(w.capacity)
    run(w, a)
    return a.snapshot(record=False)


def test_helper_passes_arguments_and_result_through(monkeypatch):
    mod = types.ModuleType("gpumemviz_test_mod")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    calls = []

    def join(a: str, b: str = "", *, sep: str = "+") -> str:
        """Join two strings."""
        calls.append((a, b, sep))
        return a + sep + b

    make_module_callable(mod.__name__, join)
    assert mod("x", "y", sep="-") == "x-y"
    assert mod("x") == "x+"
    assert calls == [("x", "y", "-"), ("x", "", "+")]
    assert str(inspect.signature(mod)) == str(inspect.signature(join))
    assert type(mod).__call__.__doc__ == "Join two strings."
    with pytest.raises(TypeError):
        mod()


def test_helper_refuses_a_module_not_imported():
    with pytest.raises(KeyError, match="gpumemviz_never_imported"):
        make_module_callable("gpumemviz_never_imported", print)


def test_allocator_replay_is_callable_in_both_forms(recorded):
    import gpumemviz.allocator.replay as m
    from gpumemviz.allocator.replay import ReplayResult, replay

    assert m is sys.modules["gpumemviz.allocator.replay"]
    assert gpumemviz.allocator.replay is m  # the package attribute is the module
    want = replay(recorded)
    for got in (
        m(recorded),
        gpumemviz.allocator.replay(recorded),
        gpumemviz.allocator.replay(recorded, config=None, capacity=None),
        gpumemviz.replay(recorded),
    ):
        assert isinstance(got, ReplayResult)
        assert got.summary() == want.summary()
        assert got.allocs == want.allocs > 0 and got.allocs_matched == got.allocs
    what_if = m(recorded, "expandable_segments:True", 14 << 30)
    assert what_if.what_if and "expandable_segments:True" in what_if.config
    assert list(inspect.signature(m).parameters) == ["snapshot", "config", "capacity"]


def test_diff_and_export_modules_call_their_functions(recorded, tmp_path):
    import gpumemviz.diff as dmod
    import gpumemviz.export as emod
    from gpumemviz.diff import diff
    from gpumemviz.export import export

    later = pickle.loads(pickle.dumps(recorded))
    later["segments"] = later["segments"][:1]
    assert gpumemviz.diff is dmod and gpumemviz.export is emod
    got, want = gpumemviz.diff(recorded, later, top=3), diff(recorded, later, top=3)
    assert got.to_dict() == want.to_dict()
    assert got.to_dict()["total"]["reserved"]["delta"] < 0  # the later side dropped segments
    out = tmp_path / "s.pickle"
    gpumemviz.export(recorded, out)
    export(recorded, tmp_path / "t.pickle")
    assert out.read_bytes() == (tmp_path / "t.pickle").read_bytes()
