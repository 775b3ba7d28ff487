"""replay's arguments and what its result says about them: capacity sizes, unrecorded settings."""

from __future__ import annotations

import pytest

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay import replay
from gpumemviz.snapshot.units import parse_size


def _recorded(config: str = "") -> dict:
    """A small trace the model records (with allocator_settings, as torch 2.11 writes)."""
    a = CachingAllocator(1 << 30, config=config)
    live = [a.malloc(n << 20) for n in (1, 3, 30, 5, 70)]
    for x in live[::2]:
        a.free(x)
    a.malloc(40 << 20)
    return a.snapshot()


def test_capacity_accepts_the_size_strings_can_fit_accepts():
    snap = _recorded()
    for text in ("96MiB", "0.5GiB", "100663296"):
        by_text = replay(snap, capacity=text)
        by_int = replay(snap, capacity=parse_size(text))
        assert by_text.devices[0].capacity == parse_size(text)
        assert (by_text.peak_reserved, by_text.oom) == (by_int.peak_reserved, by_int.oom)
    tight = replay(snap, capacity={0: "64MiB"})
    assert tight.devices[0].capacity == 64 << 20 and tight.oom is not None


@pytest.mark.parametrize("bad", [0, -1, "0", "0GiB", "-1GiB", " -5"])
def test_capacity_zero_or_negative_is_refused(bad):
    with pytest.raises(ValueError, match=r"^capacity must be positive, got "):
        replay(_recorded(), capacity=bad)
    with pytest.raises(ValueError, match=r"^capacity of device 0 must be positive"):
        replay(_recorded(), capacity={0: bad})


def test_capacity_that_is_not_a_size_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^capacity: not a size: 'lots'"):
        replay(_recorded(), capacity="lots")
    with pytest.raises(TypeError, match="capacity must be bytes or a size string"):
        replay(_recorded(), capacity=[1])


def test_the_result_says_whether_the_settings_were_recorded():
    snap = _recorded("max_split_size_mb:64")
    r = replay(snap)
    assert r.settings_recorded and "max_split_size_mb:64" in r.recorded_config
    plain = _recorded()
    assert replay(plain).settings_recorded and replay(plain).recorded_config == ""
    del plain["allocator_settings"]
    r = replay(plain)
    assert not r.settings_recorded and r.recorded_config == ""
    assert "settings not recorded: PyTorch's defaults assumed" in r.summary()
    assert "not recorded" not in replay(_recorded()).summary()
