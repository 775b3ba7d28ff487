"""`replay` of a `Snapshot`, or of a torch dict, reads the traces' columns, not entry dicts:
the same answers, layouts and stacks as reading the entry dicts gives (`Prepared` without
columns), and the dicts' own reading where the columns cannot stand for them (an entry without
a field, an entry that is not a dict).
"""

from __future__ import annotations

import pytest

from conftest import RECORDED_FILES, read_real
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay import Prepared, ReplayError, prepare, replay
from gpumemviz.allocator.replay.columns import by_address
from gpumemviz.snapshot import Snapshot, Trace


def _same(got, want) -> None:
    assert got.devices.keys() == want.devices.keys()
    for dev, w in want.devices.items():
        g = got.devices[dev]
        assert (g.allocs, g.allocs_matched, g.allocs_matched_per_decision, g.final_matched) == (
            w.allocs, w.allocs_matched, w.allocs_matched_per_decision, w.final_matched
        )  # fmt: skip
        assert g.reserved.tolist() == w.reserved.tolist()
        tg, tw = got.timelines[dev], want.timelines[dev]
        n = len(tw)
        for i in sorted({-1, 0, n // 2, n - 1}):
            assert tg.snapshot_at(i) == tw.snapshot_at(i), f"device {dev}, entry {i}"


@pytest.mark.parametrize("path", RECORDED_FILES, ids=lambda p: p.name.split("__")[-1][:40])
def test_a_snapshot_replays_as_its_dict(path):
    d = read_real(path)
    if not any(d.get("device_traces") or []):
        pytest.skip("no trace in this file")
    want = Prepared(d).replay()  # the entry dicts read one by one
    _same(replay(Snapshot.from_torch(d)), want)
    _same(replay(d), want)


def test_a_trace_that_is_not_columns_is_read_entry_by_entry():
    """An entry that is not a dict: the columns refuse it, and replay reads the entry dicts,
    with their own error."""
    a = CachingAllocator(1 << 30)
    a.free(a.malloc(100))
    d = a.snapshot()
    d["device_traces"][0].append(["alloc", 0, 512])
    with pytest.raises(ReplayError, match=r"^device 0: trace entry 4: malformed"):
        replay(d)


def test_entries_without_a_stream_are_read_as_the_dicts_read_them():
    """`steps_of` reads a missing stream as 0; the columns hold -1 there, so the entry dicts
    are read instead."""
    a = CachingAllocator(1 << 30)
    x = a.malloc(100)
    a.malloc(3 << 20)
    a.free(x)
    d = a.snapshot()
    for e in d["device_traces"][0]:
        e.pop("stream")
    got = replay(Snapshot.from_torch(d))
    _same(got, Prepared(d).replay())
    _same(replay(d), Prepared(d).replay())
    assert got.allocs_matched == got.allocs == 2


def test_a_dicts_replay_hands_out_its_own_entries():
    """`snapshot_at` of a torch dict's replay gives the dict's entry objects (no copy of the
    trace is built); a Snapshot's builds equal ones."""
    a = CachingAllocator(1 << 30)
    a.free(a.malloc(100))
    a.malloc(3 << 20)
    d = a.snapshot()
    n = len(d["device_traces"][0])
    got = replay(d).snapshot_at(n - 1)["device_traces"][0]
    assert all(x is y for x, y in zip(got, d["device_traces"][0], strict=True))
    assert replay(Snapshot.from_torch(d)).snapshot_at(n - 1)["device_traces"][0] == got


def test_the_walks_sorted_addresses_hold_one_int_per_address():
    """`by_address` (what the walk keeps for the whole trace) is one Python int per distinct
    address, not one per entry: a million entries at a few thousand addresses cost a few
    thousand ints; and it says which alloc made the block each free releases (the boundary
    hint's question, answered for every entry at once)."""
    base = 0x7F0000000000
    entries = [
        {"action": action, "addr": base + 512 * (k % 3), "size": 512, "stream": 0}
        for k in range(30)
        for action in ("free_requested", "free_completed", "alloc")
    ]
    entries.insert(40, {"action": "segment_alloc", "addr": base, "size": 2 << 20, "stream": 0})
    addrs, index, is_alloc, since = by_address(Trace.from_entries(entries))
    made = [
        max((j for j in range(i + 1) if entries[j]["action"] == "alloc" and
             entries[j]["addr"] == e["addr"]), default=-1)
        for i, e in enumerate(entries)
    ]  # fmt: skip
    assert since.tolist() == [m if e["action"] != "segment_alloc" else -1
                              for m, e in zip(made, entries, strict=True)]  # fmt: skip
    assert since[1] == -1 and since[10] == 2  # freed before any alloc there; the alloc at 2
    assert addrs == sorted(e["addr"] for e in entries if e["action"] != "segment_alloc")
    assert len({id(a) for a in addrs}) == 3
    assert [entries[i]["addr"] for i in index] == addrs
    assert index == sorted(index, key=lambda i: (entries[i]["addr"], i))
    assert is_alloc == [entries[i]["action"] == "alloc" for i in index]


def test_the_frees_done_at_once_read_from_the_columns_as_from_the_steps():
    """A free whose free_completed comes next is freed at once, unless a release follows
    (through more free_completed entries): the columns say it as the steps do."""
    a = CachingAllocator(1 << 30)
    x, y = a.malloc(100), a.malloc(3 << 20)
    w = a.malloc(200)
    a.record_stream(w, 1)
    a.free(w)  # waits on stream 1: its free_completed comes later
    a.free(x)  # freed at once
    a.free(y)  # freed at once, but the release after it
    a.empty_cache()
    a.complete_events(1, process=True)
    z = a.malloc(5 << 20)
    a.free(z)  # the last entries: freed at once
    d = a.snapshot()
    actions = [e["action"] for e in d["device_traces"][0]]
    from_steps = Prepared(d).timelines[0].freed_at_once()  # the entry dicts read
    from_columns = prepare(Snapshot.from_torch(d)).timelines[0].freed_at_once()
    assert from_columns == from_steps
    at_once = [i for i, yes in enumerate(from_steps) if yes]
    frees = [i for i, action in enumerate(actions) if action == "free_requested"]
    assert len(frees) == 4 and at_once == [frees[1], frees[3]], actions
