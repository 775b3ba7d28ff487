"""Trace columns read as strided slices when every entry shares one layout (issue 20), and the
careful key-by-key read wherever one entry differs: both give the same columns, the exact
round trip, and the same one-line errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpumemviz.snapshot import SnapshotError
from gpumemviz.snapshot.schema import TRACE_KEYS
from gpumemviz.snapshot.shapes import RowShape
from gpumemviz.snapshot.tables import Trace

N = 9000  # more than two chunks of rows


def _entries(n: int = N) -> list[dict[str, object]]:
    frames = [{"name": f"f{i}", "filename": "m.py", "line": i} for i in range(5)]
    actions = ("alloc", "free_requested", "free_completed", "segment_alloc")
    return [
        {
            "action": actions[i % 4],
            "addr": (1 << 40) + 512 * i,
            "size": 512 + i,
            "stream": i % 3,
            "time_us": 1_700_000_000_000_000 + i,
            "compile_context": "N/A",
            "user_metadata": "",
            "frames": frames[: i % 5],
        }
        for i in range(n)
    ]


def _check(entries: list[dict[str, object]], trace: Trace) -> None:
    """Columns as the entries hold them, and the entries rebuilt exactly (key order too)."""
    for k in ("addr", "size", "stream", "time_us", "device_free"):
        want = [int(e.get(k, -1)) for e in entries]  # type: ignore[call-overload]
        assert getattr(trace, k).tolist() == want, k
        assert not getattr(trace, k).flags.writeable
    assert [trace.action_names[a] for a in trace.action] == [e["action"] for e in entries]
    rebuilt = trace.entries()
    assert rebuilt == entries
    assert [list(e) for e in rebuilt] == [list(e) for e in entries]
    i = max(i for i, e in enumerate(entries) if "frames" in e)
    first = next(e["frames"] for e in entries if e.get("frames") == entries[i]["frames"])
    assert trace.frames()[i] is first  # not copied: the first equal stack, shared
    careful = RowShape.of(entries, TRACE_KEYS)  # the layouts, in the order first met
    assert trace._shape.layouts == careful.layouts
    if careful.code is None:
        assert trace._shape.code is None
    else:
        assert trace._shape.code.tolist() == careful.code.tolist()


def test_uniform_trace_reads_every_column():
    entries = _entries()
    _check(entries, Trace.from_entries(entries))


@pytest.mark.parametrize(
    "change",
    ["key order", "oom entry", "unknown key", "missing key", "bool value", "a new known key"],
)
def test_one_differing_entry_reads_as_the_file_has_it(change):
    entries = _entries()
    e = entries[6000]
    if change == "key order":
        entries[6000] = dict(reversed(list(e.items())))
    elif change == "oom entry":
        entries[6000] = {"action": "oom", "device_free": 1 << 20, "size": 1 << 30, "stream": 0}
    elif change == "unknown key":
        del e["user_metadata"]
        e["extra"] = ("kept", 1)
    elif change == "missing key":
        del e["time_us"]
    elif change == "a new known key":
        e["device_free"] = 5
    else:
        e["stream"] = True  # array("q") reads a bool as an integer, in both reads
    trace = Trace.from_entries(entries)
    _check(entries, trace)
    if change == "oom entry":
        assert trace.addr[6000] == -1 and trace.device_free[6000] == 1 << 20


@pytest.mark.parametrize("row", [0, 5000, N - 1])
@pytest.mark.parametrize("value", [1.5, "x", 1 << 64, None])
def test_a_bad_integer_is_named_by_its_entry(row, value):
    entries = _entries()
    entries[row]["size"] = value
    with pytest.raises(SnapshotError, match=rf"^device_traces\[0\], entry {row}: size is "):
        Trace.from_entries(entries, "device_traces[0]")


def test_no_action_and_non_string_action():
    entries = [{k: v for k, v in e.items() if k != "action"} for e in _entries(10)]
    with pytest.raises(SnapshotError, match=r"^trace, entry 0 has no action$"):
        Trace.from_entries(entries)
    entries = _entries()
    entries[4321]["action"] = 7
    with pytest.raises(SnapshotError, match=r"^trace, entry 4321: action 7 is not a string$"):
        Trace.from_entries(entries)


def test_tuple_of_entries_and_one_entry():
    entries = _entries(3)
    trace = Trace.from_entries(tuple(entries))
    _check(entries, trace)
    one = Trace.from_entries(entries[:1])
    assert one.entry(0) == entries[0]
    assert np.array_equal(one.addr, [entries[0]["addr"]])


def test_oom_entries_first_last_and_in_several_chunks():
    entries = _entries()
    for i in (0, 1, 4095, 4096, 8000, N - 1):
        entries[i] = {"action": "oom", "device_free": i, "size": 1 << 30, "stream": 0}
    trace = Trace.from_entries(entries)
    _check(entries, trace)
    assert trace.device_free[[0, 8000, N - 1]].tolist() == [0, 8000, N - 1]
    assert trace.addr[[0, 1, 2]].tolist() == [-1, -1, entries[2]["addr"]]


def test_many_layouts_and_an_odd_entry_without_action():
    entries = _entries()
    orders = itertools.islice(itertools.permutations(list(entries[0])[1:]), 300)
    for i, order in enumerate(orders):  # more layouts than a byte of codes holds
        entries[i + 100] = {"action": entries[i + 100]["action"]} | {
            k: entries[i + 100][k] for k in order
        }
    _check(entries, Trace.from_entries(entries))
    entries = _entries()
    del entries[7000]["action"]
    with pytest.raises(SnapshotError, match=r"^trace, entry 7000 has no action$"):
        Trace.from_entries(entries)
