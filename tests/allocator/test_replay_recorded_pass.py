"""The pass under the recorded settings is driven when first read: a what-if on a trace with
no release entry answers from the recording and its own pass alone; one with releases reads
the recorded pass for the release runs it found to be empty_cache calls; reading `recorded`
drives each device once. `Recording.first_oom` is the recorded pass's `recorded_oom` (what
`whatif` prints) on every recorded file.
"""

from __future__ import annotations

from conftest import traced_devices
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay import Prepared, prepare, replay
from gpumemviz.snapshot import Snapshot

MIB = 1 << 20


def _counting(monkeypatch) -> list[int]:
    driven: list[int] = []
    original = Prepared.recorded_pass

    def recorded_pass(self, dev):
        driven.append(dev)
        return original(self, dev)

    monkeypatch.setattr(Prepared, "recorded_pass", recorded_pass)
    return driven


def _no_releases() -> dict:
    a = CachingAllocator(1 << 34)
    for _ in range(3):
        x, y = a.malloc(30 * MIB), a.malloc(100)
        a.free(x)
        a.free(y)
    return a.snapshot()


def _releases() -> dict:
    a = CachingAllocator(1 << 34)
    a.free(a.malloc(30 * MIB))
    a.empty_cache()
    a.free(a.malloc(30 * MIB))
    return a.snapshot()


def test_a_what_if_without_releases_drives_no_recorded_pass(monkeypatch):
    driven = _counting(monkeypatch)
    p = prepare(Snapshot.from_torch(_no_releases()))
    r = p.replay("expandable_segments:True")
    assert driven == []
    assert r.devices[0].allocs == 6 and r.what_if
    assert r.recorded[0].allocs_matched == 6  # read: driven now, once
    assert r.recorded[0] is p.recorded[0]
    assert driven == [0]


def test_a_what_if_with_releases_reads_the_recorded_pass_once(monkeypatch):
    driven = _counting(monkeypatch)
    p = prepare(Snapshot.from_torch(_releases()))
    p.replay("expandable_segments:True")
    p.replay("max_split_size_mb:20")
    assert driven == [0]
    assert p.recorded[0].explicit_bursts  # the empty_cache, replayed as one in each what-if


def test_the_recorded_settings_are_the_recorded_pass(monkeypatch):
    driven = _counting(monkeypatch)
    r = replay(_no_releases())
    assert driven == [0]
    assert r.devices[0] is r.recorded[0]
    assert r.allocs_matched == r.allocs == 6


def test_first_oom_is_the_recorded_passes_oom(recorded_dict):
    traced_devices(recorded_dict)  # (skips a file without a trace)
    p = prepare(Snapshot.from_torch(recorded_dict))
    for dev, tl in p.timelines.items():
        assert tl.first_oom == p.recorded[dev].recorded_oom, f"device {dev}"
        releases = any(s[0] in ("segment_free", "segment_unmap") for s in tl.steps)
        assert tl.releases == releases
        if not releases:
            assert p.recorded[dev].explicit_bursts == []
