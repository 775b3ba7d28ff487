"""The one reader of torch dicts (`snapshot.read_torch`), which `Snapshot.from_torch` and
`fragmentation(dict)` share.

`fragmentation(d)` must give what `fragmentation(Snapshot.from_torch(d))` gives: the same
`to_dict()`, per-segment numpy columns (dtype and values) and `can_fit` answers, or the same
one-line SnapshotError. The one allowed difference: `from_torch` also reads what the analysis
does not (block addresses, the segments' own sums, trace entries), so it alone may refuse a
value there. And the fast reader must read every case as the careful one does. Checked on every
recorded file, on hand-made edge cases (the ones that once split the old C and Python walks)
and on hypothesis-generated torch-shaped segment lists with mutations.
"""

from __future__ import annotations

import copy
import re
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import blk
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.io import as_snapshot
from gpumemviz.snapshot import Snapshot, SnapshotError, read_torch, torch_reader
from gpumemviz.snapshot.schema import BLOCK_KEYS, SEG_KEYS
from gpumemviz.snapshot.shapes import RowShape

MIB = 1 << 20
BASE = 0x7F0000000000
SMALL_PAGE, LARGE_PAGE = 2 * MIB, 20 * MIB

#: What only `from_torch` reads, so only it may refuse: the segments' own sums, block
#: addresses, trace entries (messages as `torch_reader._read_careful` and `Trace` word them).
FULL_ONLY = re.compile(
    r"^(device_traces\[\d+\]"
    r"|.*(\): | has no )(allocated|active|requested)_size( is |$)"
    r"|.*: block \d+: address is )"
)


# --------------------------------------------------------------------------------------------
# building torch dicts


def seg(blocks: list, address: int = BASE, **kw: Any) -> dict:
    """A torch-2.11-shaped segment whose total is the sum of its (integer) block sizes."""
    sizes = [b["size"] for b in blocks if isinstance(b, dict) and type(b.get("size")) is int]
    total = sum(sizes)
    d = {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": 0,
        "active_size": 0,
        "requested_size": 0,
        "stream": 0,
        "segment_type": "small" if total == SMALL_PAGE else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    d.update(kw)
    return d


def snap(*segments: Any, settings: Any = None) -> dict:
    d: dict[str, Any] = {"segments": list(segments), "device_traces": [[]]}
    if settings is not None:
        d["allocator_settings"] = settings
    return d


def legacy(b: dict, history: Any = "real") -> dict:
    """A torch 2.0 block: no frames; requested size in its first history entry."""
    out = {"size": b["size"], "state": b["state"]}
    if history == "real":
        out["history"] = [{"addr": 0, "real_size": b["requested_size"], "frames": []}]
    elif history is not None:
        out["history"] = history
    return out


def _expandable_settings(large_mb: int | None = None) -> dict:
    conf = "expandable_segments:True"
    if large_mb is not None:
        conf += f",large_segment_size_mb:{large_mb}"
    return {"PYTORCH_CUDA_ALLOC_CONF": conf, "expandable_segments": True}


class Sub(dict):
    pass


class Str(str):
    pass


class Int(int):
    pass


# --------------------------------------------------------------------------------------------
# the oracles

_SIZES = (1, 512, MIB + 1, 2 * MIB, 10 * MIB + 3, 21 * MIB, 1 << 30)


def _fits(r: Any, sizes: tuple[int, ...]) -> tuple[str, ...]:
    out = []
    streams = sorted({0, *r.per_segment.stream.tolist()})[:3]
    for d in sorted(r.devices)[:3]:
        for s in streams:
            for n in sizes:
                for free in (None, 0, 1 << 36):
                    try:
                        out.append(repr(r.can_fit(n, stream=s, device=d, device_free=free)))
                    except (ValueError, TypeError) as e:
                        out.append(f"{type(e).__name__}: {e}")
    return tuple(out)


def _report(r: Any, sizes: tuple[int, ...]) -> tuple:
    cols = []
    for f in fields(r.per_segment):
        a = np.asarray(getattr(r.per_segment, f.name))
        cols.append((f.name, a.dtype.str, a.shape, a.tobytes()))
    return ("report", repr(r.to_dict()), tuple(cols), _fits(r, sizes))


def outcome(make: Any, sizes: tuple[int, ...] = _SIZES) -> tuple:
    try:
        r = make()
    except SnapshotError as e:
        assert "\n" not in str(e) and len(str(e)) < 400, str(e)
        return ("SnapshotError", str(e))
    return _report(r, sizes)


def _explain(a: tuple, b: tuple) -> str:
    if a[0] != b[0] or a[0] == "SnapshotError":
        return f"dict: {a[:2]!r}\nSnapshot: {b[:2]!r}"
    lines = []
    if a[1] != b[1]:
        lines.append(f"to_dict differs:\ndict:     {a[1][:1500]}\nSnapshot: {b[1][:1500]}")
    for x, y in zip(a[2], b[2], strict=True):
        if x != y:
            lines.append(f"column {x[0]}: dict {x[1]} {x[2]} / Snapshot {y[1]} {y[2]}")
    if a[3] != b[3]:
        diff = [(p, q) for p, q in zip(a[3], b[3], strict=False) if p != q]
        lines.append(f"can_fit differs: {diff[:2]}")
    return "\n".join(lines)


def assert_same_both_ways(case: Any, sizes: tuple[int, ...] = _SIZES) -> str:
    """fragmentation(dict) against fragmentation(Snapshot.from_torch(dict)); returns which
    happened: 'report', 'error' (the same one both ways) or 'full-only' (only from_torch refused,
    on something the analysis does not read)."""
    other = copy.deepcopy(case)
    # not a dict or list (a tuple): both go through `as_snapshot`, which reads it as a file
    to_snapshot = Snapshot.from_torch if isinstance(case, dict | list) else as_snapshot
    by_dict = outcome(lambda: fragmentation(case), sizes)
    by_snap = outcome(lambda: fragmentation(to_snapshot(other)), sizes)
    if by_dict[0] == "report" and by_snap[0] == "SnapshotError":
        assert FULL_ONLY.match(by_snap[1]), f"only from_torch refused it: {by_snap[1]}"
        return "full-only"
    assert by_dict == by_snap, _explain(by_dict, by_snap)
    return "report" if by_dict[0] == "report" else "error"


@contextmanager
def careful_only():
    """`read_torch` with its fast reader switched off: every case takes the careful one."""
    saved = torch_reader._read_plain
    torch_reader._read_plain = lambda segs, full: None
    try:
        yield
    finally:
        torch_reader._read_plain = saved


def _comparable(x: Any) -> Any:
    """TorchColumns' values in a form == compares: arrays as dtype, shape, bytes; a row shape
    as the key set of each row (the fast reader takes the first row's key order for all)."""
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, RowShape):
        return ("shape", x.extra, x.override)
    if isinstance(x, dict):
        return {k: _comparable(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(map(_comparable, x))
    return x


def _row_keys(cols: Any, n_seg: int, n_blk: int) -> tuple:
    known = (*SEG_KEYS, *BLOCK_KEYS, "history")
    return tuple(
        (k, shape.has(k, n).tolist())
        for shape, n in ((cols.seg_shape, n_seg), (cols.blk_shape, n_blk))
        for k in known
    )


def read_outcome(case: Any, full: bool) -> Any:
    try:
        cols = read_torch(copy.deepcopy(case), full=full)
    except SnapshotError as e:
        return ("SnapshotError", str(e))
    out = {f.name: _comparable(getattr(cols, f.name)) for f in fields(cols)}
    out["top_keys"] = set(out["top_keys"])
    for name in ("seg_frames", "blk_frames", "device_traces", "top_extra"):
        out[name] = repr(out[name])
    if full:
        out["row_keys"] = _row_keys(cols, len(cols.seg["address"]), len(cols.blk["size"]))
    return out


def assert_fast_reads_as_careful(case: Any) -> list[bool]:
    """The fast reader against the careful one, both modes; returns where it read the case."""
    took = []
    for full in (True, False):
        fast = read_outcome(case, full)
        with careful_only():
            careful = read_outcome(case, full)
        assert fast == careful, (full, fast, careful)
        try:
            segs = case["segments"] if isinstance(case, dict) else case
            took.append(torch_reader._read_plain(copy.deepcopy(segs), full) is not None)
        except (KeyError, TypeError, ValueError, OverflowError, IndexError):
            took.append(False)
    return took


# --------------------------------------------------------------------------------------------
# recorded files


def test_recorded_files_same_report_both_ways(recorded_dict):
    assert assert_same_both_ways(recorded_dict) == "report"
    assert assert_same_both_ways(recorded_dict["segments"], (512, 3 * MIB)) == "report"


def test_recorded_files_fast_reader_reads_as_the_careful_one(recorded_dict):
    took = assert_fast_reads_as_careful(recorded_dict)
    modern = all("frames" in b for s in recorded_dict["segments"] for b in s["blocks"])
    assert took == [modern, modern]  # torch >= 2.1 files: both modes read them fast


# --------------------------------------------------------------------------------------------
# hand-made cases


def _plain() -> list[dict]:
    return [
        seg([blk(512, "active_allocated", 100), blk(2 * MIB - 512)]),
        seg(
            [blk(4 * MIB, "active_allocated", 4_000_000), blk(6 * MIB, "active_pending_free"),
             blk(10 * MIB)],
            BASE + 0x1000000,
        ),
    ]  # fmt: skip


def _with(d: dict, **kw: Any) -> dict:
    d = dict(d)
    d.update(kw)
    return d


def _without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def _history_block(requested: Any) -> dict:
    return {"size": 512, "state": "active_allocated", "requested_size": requested,
            "history": [{"real_size": 7}]}  # fmt: skip


CASES: dict[str, Any] = {
    "empty dict": snap(),
    "empty list": [],
    "segment without blocks": snap(seg([]), *_plain()),
    "only segments without blocks": snap(seg([]), seg([], BASE + 4096)),
    "plain": snap(*_plain()),
    "bare list": _plain(),
    "devices streams pools": snap(
        _with(_plain()[0], device=1, stream=7),
        _with(_plain()[1], device=3, segment_pool_id=(1, 2)),
        _with(_plain()[0], address=BASE + (1 << 30), stream=2**63 - 1),
        _with(_plain()[1], segment_pool_id=[0, 0]),
    ),
    "pool id of three": snap(_with(_plain()[0], segment_pool_id=(1, 2, 3))),
    "pool id None": snap(_with(_plain()[0], segment_pool_id=None)),
    "pool id of strings": snap(_with(_plain()[0], segment_pool_id=("a", "b"))),
    "pool id a string of two": snap(_with(_plain()[0], segment_pool_id="ab")),
    "pool id of floats": snap(_with(_plain()[0], segment_pool_id=(0.0, 0))),
    "pool id of bools": snap(_with(_plain()[0], segment_pool_id=(False, True))),
    "pool id int64 overflow": snap(_with(_plain()[0], segment_pool_id=(2**63, 0))),
    "device negative": snap(_with(_plain()[0], device=-1)),
    # torch 2.0 and other older shapes
    "legacy history": snap(
        seg([legacy(blk(512, "active_allocated", 7)), legacy(blk(2 * MIB - 512))])
    ),
    "legacy history and a requested_size that differs": snap(
        seg([legacy(blk(512, "active_allocated", 7)) | {"requested_size": 9}])
    ),
    "legacy empty history": snap(
        seg([legacy(blk(512, "active_allocated", 7), []), legacy(blk(MIB))])
    ),
    "legacy no history no requested": snap(
        seg([legacy(blk(512, "active_allocated", 7), None), legacy(blk(MIB))])
    ),
    "legacy history a tuple": snap(
        seg([legacy(blk(512, "active_allocated"), ({"real_size": 3},)), legacy(blk(MIB))])
    ),
    "legacy history None": snap(
        seg([legacy(blk(512, "active_allocated"), None) | {"history": None}])
    ),
    "legacy history of a string": snap(
        seg([legacy(blk(512, "active_allocated"), "abc"), legacy(blk(MIB))])
    ),
    "legacy history without real_size": snap(
        seg([legacy(blk(512, "active_allocated"), [{"addr": 1}])])
    ),
    "legacy history real_size a string": snap(
        seg([legacy(blk(512, "active_allocated"), [{"real_size": "12"}])])
    ),
    "legacy segment keys missing": snap(
        _without(
            seg([legacy(blk(512, "active_allocated", 9)), legacy(blk(2 * MIB - 512))]),
            "segment_type",
            "device",
            "stream",
            "is_expandable",
            "segment_pool_id",
            "frames",
        )
    ),
    "legacy segment_type None small by size": snap(seg([legacy(blk(2 * MIB))], segment_type=None)),
    "second block legacy": snap(
        seg([blk(512, "active_allocated", 3), legacy(blk(512, "active_allocated", 5))])
    ),
    # optional keys missing from a torch >= 2.1 file
    **{
        f"missing {key}": snap(*_plain(), _without(_plain()[0], key))
        for key in ("device", "stream", "is_expandable", "segment_pool_id", "segment_type")
    },
    "missing frames of segment": snap(_without(_plain()[0], "frames")),
    "missing block frames and requested": snap(
        seg([_without(blk(512, "active_allocated", 5), "frames", "requested_size")])
    ),
    "missing block address in one block": snap(
        seg([blk(512, "active_allocated") | {"address": BASE}, blk(MIB)])
    ),
    "missing address": snap(_without(_plain()[0], "address")),
    "missing total_size": snap(*_plain(), _without(_plain()[0], "total_size")),
    "missing blocks": snap(_without(_plain()[0], "blocks")),
    "missing size": snap(seg([_without(blk(512), "size")])),
    "missing state": snap(seg([_without(blk(512), "state")])),
    "missing requested_size": snap(seg([_without(blk(512, "active_allocated"), "requested_size")])),
    "missing allocated_size in one segment": snap(
        *_plain(), _without(_plain()[0], "allocated_size")
    ),
    "an unknown segment key": snap(_with(_plain()[0], graph_id=3), _plain()[1]),
    "an unknown block key": snap(seg([blk(512, "active_allocated") | {"stream_uses": [1]}])),
    "keys in another order": snap(
        _plain()[0], dict(reversed(list(seg([dict(reversed(list(blk(MIB).items())))]).items())))
    ),
    # values of other types
    **{
        f"size {v!r}": snap(*_plain(), seg([blk(512, "active_allocated"), blk(v)]))
        for v in (
            None,
            True,
            False,
            1.5,
            512.0,
            "512",
            -1,
            -(2**63) - 1,
            2**48 + 1,
            2**63,
            2**64,
            Int(512),
        )
    },
    "size 2**48": snap(seg([blk(1 << 48), blk(1 << 48, "active_allocated", 5)])),
    **{
        f"requested {v!r}": snap(seg([blk(512, "active_allocated") | {"requested_size": v}]))
        for v in (None, True, 1.5, "100", 2**63, 2**64, -(2**63) - 1)
    },
    **{
        f"address {v!r}": snap(_with(_plain()[0], address=v))
        for v in (None, True, 1.5, "1", -(2**63) - 1, 2**63, 2**64)
    },
    "block address a string": snap(seg([blk(512, "active_allocated") | {"address": "0x0"}])),
    "allocated_size a float": snap(_with(_plain()[0], allocated_size=1.5)),
    **{
        f"total_size {v!r}": snap(_with(_plain()[0], total_size=v))
        for v in (None, False, 2.0, 2**63, 2**64)
    },
    "total_size negative": snap(_with(_plain()[0], total_size=-5)),
    "total_size not the block sum": snap(_with(_plain()[0], total_size=3 * MIB)),
    **{f"device {v!r}": snap(_with(_plain()[0], device=v)) for v in (None, True, 1.5, "1", 2**63)},
    **{f"stream {v!r}": snap(_with(_plain()[0], stream=v)) for v in (None, False, 2.5, 2**64)},
    **{
        f"is_expandable {v!r}": snap(_with(_plain()[0], is_expandable=v))
        for v in (None, 0, 1, "yes")
    },
    **{
        f"segment_type {v!r}": snap(_with(_plain()[0], segment_type=v))
        for v in ("SMALL", "", 5, Str("small"), Str("large"))
    },
    **{
        f"state {v!r}": snap(*_plain(), seg([blk(512, v)]))
        for v in (
            "active_awaiting_free",
            "ACTIVE_ALLOCATED",
            "",
            None,
            3,
            b"inactive",
            Str("inactive"),
            "inactivé",
            ["inactive"],
        )
    },
    # containers of other types
    "segments a tuple": {"segments": tuple(_plain())},
    "bare tuple": tuple(_plain()),
    "blocks a tuple": snap(seg((blk(512), blk(MIB)))),  # type: ignore[arg-type]
    "segment a dict subclass": snap(_plain()[0], Sub(_plain()[1])),
    "segment an OrderedDict": snap(OrderedDict(_plain()[0])),
    "block a dict subclass": snap(seg([blk(512), Sub(blk(MIB))])),
    **{f"segment {v!r}": snap(*_plain(), v) for v in (None, [], 3, "segment", (1, 2))},
    **{
        f"block {v!r}": snap(seg([blk(512, "active_allocated"), v]))
        for v in (None, [], 3, "block", (512, "inactive"))
    },
    "segments None": {"segments": None},
    "settings not a dict": snap(*_plain(), settings="expandable_segments:True"),
    "device_traces a dict": {"segments": _plain(), "device_traces": {}},
    "a trace entry without action": {"segments": _plain(), "device_traces": [[{"addr": 0}]]},
    # where the old C and Python walks once parted
    "segment_type None, 2 MiB, torch 2.1 shape": snap(seg([blk(2 * MIB)], segment_type=None)),
    "stream missing after a device, segment_type None": snap(
        _without(seg([blk(2 * MIB)], device=1, segment_type=None), "stream")
    ),
    "stream missing after a device, a block with history": snap(
        _without(seg([blk(512, "active_allocated", 100), _history_block(100)], device=1), "stream")
    ),
    "requested beyond 2**48 in a block with history": snap(
        seg([blk(512, "active_allocated", 100), _history_block(2**50)])
    ),
    "requested True in a block with history": snap(
        seg([blk(512, "active_allocated", 100), _history_block(True)])
    ),
    "zero-size allocated block inside a free run": snap(
        seg(
            [blk(MIB), blk(0, "active_allocated", 0), blk(MIB), blk(512, "active_allocated")],
            segment_type="small",
            is_expandable=True,
        )
    ),
    "zero-size free block at a segment's end": snap(
        seg([blk(512, "active_allocated"), blk(0)]),
        seg([blk(MIB)], BASE + (1 << 30), device=1),
    ),
    "zero-size pending block in an all-zero segment": snap(
        seg([blk(0, "active_pending_free")]), seg([blk(MIB)], BASE + (1 << 30), device=1)
    ),
    "block sizes adding up past 2**63": snap(
        *(
            seg([blk(1 << 48, "active_allocated", 1)] * (1 << 14), BASE + (i << 50))
            for i in range(2)
        )
    ),
    "requested sizes adding up past 2**63": snap(
        seg([blk(0, "active_allocated", 1 << 48)] * (1 << 15))
    ),
    "total sizes adding up past 2**63": snap(
        _with(_plain()[0], total_size=2**62), _with(_plain()[1], total_size=2**62)
    ),
}

#: What some cases must give, beyond agreeing both ways (the messages of the one reader).
EXPECTED: dict[str, str] = {
    "plain": "report",
    "legacy history": "report",
    "legacy history a tuple": "report",
    "legacy history of a string": "report",  # a malformed history is read as none
    "segment a dict subclass": "segment 1 is a Sub, not a dict",
    "block a dict subclass": "segment 0 (device 0, 0x7f0000000000): block 1 is a Sub, not a dict",
    "segments a tuple": "'segments' is a tuple, not a list",
    "bare tuple": (
        "cannot load a snapshot from a tuple (expected a path, bytes, a torch snapshot dict or "
        "list, or a Snapshot)"
    ),
    "settings not a dict": "'allocator_settings' is a str, not a dict",
    "device_traces a dict": "'device_traces' is a dict, not a list",
    "a trace entry without action": "full-only",
    "block address a string": "full-only",
    "allocated_size a float": "full-only",
    "missing allocated_size in one segment": "full-only",
    "size True": "report",  # array("q") reads a bool as an int, in both readers
    "size 1.5": "segment 2 (device 0, 0x7f0000000000): block 1: size is 1.5, not a 64-bit integer",
    "segment_type 'SMALL'": "segment 0 (device 0, 0x7f0000000000): unknown segment_type 'SMALL'",
    "pool id of floats": (
        "segment 0 (device 0, 0x7f0000000000): segment_pool_id (0.0, 0) is not a pair of 64-bit "
        "ints"
    ),
    "block sizes adding up past 2**63": "segments: the blocks add up past 2^63 bytes",
    "requested sizes adding up past 2**63": "segments: the requested sizes add up past 2^63 bytes",
    "total sizes adding up past 2**63": "segments: total_size adds up past 2^63 bytes",
}


@pytest.mark.parametrize("name", list(CASES))
def test_hand_made_cases_same_both_ways(name):
    case = CASES[name]
    got = assert_same_both_ways(case)
    want = EXPECTED.get(name)
    if want in ("report", "full-only"):
        assert got == want
    elif want is not None:
        assert got == "error"
        with pytest.raises(SnapshotError) as e:
            fragmentation(copy.deepcopy(case))
        assert str(e.value) == want


@pytest.mark.parametrize("name", [n for n in CASES if isinstance(CASES[n], dict | list)])
def test_hand_made_cases_fast_reader_reads_as_the_careful_one(name):
    assert_fast_reads_as_careful(CASES[name])


def _pools_as_tuples(segs: list) -> list:
    return [
        s | {"segment_pool_id": tuple(s["segment_pool_id"])} if "segment_pool_id" in s else s
        for s in segs
    ]


#: Values `from_torch` reads as what they mean and gives back so (`to_torch`), not as written.
NORMALISED = {
    "legacy segment_type None small by size": "segment_type None: 'small' or 'large' by size",
    "segment_type None, 2 MiB, torch 2.1 shape": "segment_type None: 'small' or 'large' by size",
    "stream missing after a device, segment_type None": "the same",
    "is_expandable None": "is_expandable: a bool",
    "is_expandable 'yes'": "is_expandable: a bool",
}


@pytest.mark.parametrize(
    "name", [n for n in CASES if isinstance(CASES[n], dict | list) and n not in NORMALISED]
)
def test_hand_made_cases_round_trip(name):
    case = CASES[name]
    try:
        back = Snapshot.from_torch(case).to_torch()
    except SnapshotError:
        return  # refused: nothing to give back
    segs = case if isinstance(case, list) else case["segments"]
    assert back["segments"] == _pools_as_tuples(segs)  # JSON-style lists come back as tuples
    if isinstance(case, dict):
        assert list(back) == [*case, *(["device_traces"] if "device_traces" not in case else [])]


def test_fast_reader_takes_plain_files_and_hands_the_rest_on():
    assert assert_fast_reads_as_careful(CASES["plain"]) == [True, True]
    assert assert_fast_reads_as_careful(CASES["bare list"]) == [True, True]
    # the analysis reads no addresses nor the segments' own sums: missing ones do not matter
    assert assert_fast_reads_as_careful(CASES["missing block address in one block"]) == [
        False,
        True,
    ]
    assert assert_fast_reads_as_careful(CASES["legacy history"]) == [False, False]
    assert assert_fast_reads_as_careful(CASES["an unknown block key"]) == [False, True]


def test_legacy_requested_size_comes_back_as_the_file_had_it():
    d = CASES["legacy history and a requested_size that differs"]
    s = Snapshot.from_torch(copy.deepcopy(d))
    assert s.blocks.requested_size.tolist() == [7]  # what torch's segsum accounts: history
    assert s.to_torch() == d
    assert fragmentation(d).requested == 7


# --------------------------------------------------------------------------------------------
# expandable segments: free and pending runs crossing page boundaries


def _runs(page: int) -> list[list[dict]]:
    """Block layouts whose free runs begin and end inside and on page boundaries."""
    k = 512
    return [
        [blk(page), blk(page, "active_allocated", 5), blk(page)],
        [blk(page - k, "active_allocated"), blk(2 * page + 2 * k), blk(page - k, "active_allocated")],  # noqa: E501
        [blk(k, "active_allocated"), blk(page - k), blk(page, "active_pending_free"), blk(3 * k)],
        [blk(page // 2, "active_pending_free"), blk(page // 2), blk(page + k), blk(page - k,
         "active_allocated")],
        [blk(3 * page + 7 * k)],
        [blk(page // 2, "active_allocated"), blk(page), blk(page // 2, "active_allocated"),
         blk(page), blk(page // 2, "active_pending_free"), blk(page * 3 // 2)],
    ]  # fmt: skip


@pytest.mark.parametrize("large_mb", [None, 64])
def test_expandable_runs_across_pages_same_both_ways(large_mb):
    large = LARGE_PAGE if large_mb is None else large_mb * MIB
    segs = []
    addr = BASE
    for small, page in ((True, SMALL_PAGE), (False, large), (False, LARGE_PAGE)):
        for layout in _runs(page):
            s = seg(copy.deepcopy(layout), addr, is_expandable=True)
            s["segment_type"] = "small" if small else "large"
            segs.append(s)
            addr += 1 << 36
    for settings_ in (_expandable_settings(large_mb), None):
        case = snap(*segs, settings=settings_)
        assert assert_same_both_ways(case, (512, 3 * MIB, 25 * MIB, 70 * MIB)) == "report"


# --------------------------------------------------------------------------------------------
# hypothesis: torch-shaped segment lists, mutated

_STATES = ("active_allocated", "inactive", "active_pending_free")
_SIZE = st.one_of(
    st.integers(1, 64).map(lambda k: k * 512),
    st.integers(1, 80).map(lambda k: k * MIB // 2),
    st.sampled_from([SMALL_PAGE, LARGE_PAGE, SMALL_PAGE - 512, LARGE_PAGE + 512, 1 << 48]),
    st.integers(1, 1 << 48),
)
_WEIRD = [None, True, False, 1.5, 0.0, "12", "", 2**48, 2**48 + 1, 2**63, 2**64, -1,
          -(2**63) - 1, [], {}, (0, 0), [0, 0], (0.0, 0), Int(3), Str("small"),
          "active_awaiting_free"]  # fmt: skip
_MUTATE_SEG_KEYS = ("device", "stream", "is_expandable", "segment_pool_id", "segment_type",
                    "frames", "address", "total_size", "blocks", "allocated_size",
                    "graph_id")  # fmt: skip
_MUTATE_BLOCK_KEYS = ("size", "state", "requested_size", "frames", "address", "history")
_MUTATIONS = ("drop", "weird", "legacy", "not_a_dict", "subclass", "tuple", "state")


@st.composite
def torch_segments(draw: Any) -> Any:
    segs: list[Any] = []
    addr = BASE
    for _ in range(draw(st.integers(0, 4))):
        blocks = [
            blk(size, draw(st.sampled_from(_STATES)), draw(st.integers(0, size)))
            for size in draw(st.lists(_SIZE, max_size=6))
        ]
        s = seg(
            blocks,
            addr,
            device=draw(st.sampled_from([0, 0, 0, 1, 3])),
            stream=draw(st.sampled_from([0, 0, 7, 2**63 - 1])),
            segment_pool_id=draw(st.sampled_from([(0, 0), (0, 0), (1, 2), (0, 5), [0, 0]])),
            is_expandable=draw(st.booleans()),
        )
        if draw(st.booleans()):
            s["segment_type"] = draw(st.sampled_from(["small", "large"]))
        segs.append(s)
        addr += draw(st.sampled_from([1 << 30, 0, 4096]))
    for _ in range(draw(st.integers(0, 3))):
        _mutate(draw, segs)
    shape = draw(st.sampled_from(["list", "dict", "expandable", "large64"]))
    if shape == "list":
        return segs
    settings_ = {"expandable": _expandable_settings(), "large64": _expandable_settings(64)}
    return snap(*segs, settings=settings_.get(shape))


def _mutate(draw: Any, segs: list) -> None:
    op = draw(st.sampled_from(_MUTATIONS))
    if not segs:
        return
    i = draw(st.integers(0, len(segs) - 1))
    s = segs[i]
    if not isinstance(s, dict):
        return
    blocks = s.get("blocks")
    j = draw(st.integers(0, len(blocks) - 1)) if isinstance(blocks, list) and blocks else None
    if j is not None and not isinstance(blocks[j], dict) and op != "tuple":
        return  # an earlier mutation made it something else
    if op == "drop":
        if j is not None and draw(st.booleans()):
            blocks[j].pop(draw(st.sampled_from(_MUTATE_BLOCK_KEYS)), None)
        else:
            s.pop(draw(st.sampled_from(_MUTATE_SEG_KEYS)), None)
    elif op == "weird":
        value = copy.deepcopy(draw(st.sampled_from(_WEIRD)))
        if j is not None and draw(st.booleans()):
            blocks[j][draw(st.sampled_from(_MUTATE_BLOCK_KEYS))] = value
        else:
            s[draw(st.sampled_from(_MUTATE_SEG_KEYS))] = value
    elif op == "legacy":  # torch 2.0: from block j on (or all), history instead of frames
        if blocks is None or j is None:
            return
        history = draw(st.sampled_from(["real", "real", None, [], (), "x", [{"addr": 1}]]))
        start = 0 if draw(st.booleans()) else j
        for k in range(start, len(blocks)):
            if isinstance(blocks[k], dict) and "size" in blocks[k] and "state" in blocks[k]:
                old = blocks[k]
                blocks[k] = legacy({"requested_size": 1, **old}, history)
                if draw(st.booleans()) and "requested_size" in old:
                    blocks[k]["requested_size"] = old["requested_size"]
        if draw(st.booleans()):
            for key in ("segment_type", "device", "stream", "is_expandable", "segment_pool_id"):
                s.pop(key, None)
    elif op == "not_a_dict":
        value = copy.deepcopy(draw(st.sampled_from([None, [], 3, "x", (1, 2)])))
        if j is not None and draw(st.booleans()):
            blocks[j] = value
        else:
            segs[i] = value
    elif op == "subclass":
        if j is not None and draw(st.booleans()):
            blocks[j] = Sub(blocks[j])
        else:
            segs[i] = draw(st.sampled_from([Sub, OrderedDict]))(s)
    elif op == "tuple":
        if j is not None:
            s["blocks"] = tuple(blocks)
    elif op == "state" and j is not None:
        blocks[j]["state"] = draw(st.sampled_from(["active_awaiting_free", "Inactive", None, 2]))


def test_generated_segment_lists_same_both_ways_and_fast_as_careful():
    seen: dict[str, int] = {}
    fast = [0, 0]

    @settings(
        max_examples=300,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=torch_segments(), as_tuple=st.integers(0, 19))
    def check(case: Any, as_tuple: int) -> None:
        if as_tuple == 0 and isinstance(case, dict):
            case["segments"] = tuple(case["segments"])
        got = assert_same_both_ways(case, (512, 3 * MIB, 25 * MIB))
        seen[got] = seen.get(got, 0) + 1
        for k, took in enumerate(assert_fast_reads_as_careful(case)):
            fast[k] += took

    check()
    # both ways out were exercised (the hand-made cases cover "full-only"), and the fast
    # reader took many cases in both modes
    assert seen.get("report", 0) > 60 and seen.get("error", 0) > 30, seen
    assert min(fast) > 40, (seen, fast)
