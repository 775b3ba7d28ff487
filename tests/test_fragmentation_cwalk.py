"""The C walk of torch dicts (fragmentation/_cwalk.c) against the Python walk (walk.py).

Both ways through `walk._from_dict` must give the same report: the same `to_dict()`, the same
per-segment numpy columns (dtype and values), the same `can_fit` answers, or the same one-line
SnapshotError. Checked on every real file, on hand-made edge cases and on hypothesis-generated
torch-shaped segment lists with mutations; plus reference counts around the C walk.
Run it once by hand under `PYTHONMALLOC=debug python -X dev -m pytest` as well.
"""

from __future__ import annotations

import copy
import gc
import shlex
import shutil
import sys
import sysconfig
from collections import OrderedDict
from contextlib import contextmanager, suppress
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import blk
from gpumemviz.fragmentation import fragmentation, walk
from gpumemviz.snapshot import SnapshotError

MIB = 1 << 20
BASE = 0x7F0000000000
SMALL_PAGE, LARGE_PAGE = 2 * MIB, 20 * MIB


def _have_cc() -> bool:
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    return bool(cc) and shutil.which(cc[0]) is not None


def test_the_c_walk_is_built_in_this_install():
    if not _have_cc():
        pytest.skip("no C compiler: this install uses the Python walk")
    if walk.os.environ.get("GPUMEMVIZ_NO_C"):
        pytest.skip("GPUMEMVIZ_NO_C is set")
    assert walk._cwalk is not None, "stale or missing _cwalk: run python hatch_build.py"
    assert walk._cwalk.VERSION == walk.C_WALK_VERSION


@pytest.fixture
def cwalk():
    if walk._cwalk is None:
        pytest.skip("no C walk in this install (the differential would compare Python to itself)")
    return walk._cwalk


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
# the oracle

_SIZES = (1, 512, MIB + 1, 2 * MIB, 10 * MIB + 3, 21 * MIB, 1 << 30)


@contextmanager
def python_walk():
    saved = walk._cwalk
    walk._cwalk = None
    try:
        yield
    finally:
        walk._cwalk = saved


class _Recorder:
    """The real C module, passed through, noting whether each walk returned columns (so a test
    can tell that the C walk, not only its fallback, produced what was compared)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.took: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def walk(self, *args: Any) -> Any:
        out = self._real.walk(*args)
        self.took.append(out is not None)
        return out


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


def outcome(case: Any, sizes: tuple[int, ...] = _SIZES) -> tuple:
    try:
        r = fragmentation(case)
    except SnapshotError as e:
        return ("SnapshotError", str(e))
    cols = []
    for f in fields(r.per_segment):
        a = np.asarray(getattr(r.per_segment, f.name))
        cols.append((f.name, a.dtype.str, a.shape, a.tobytes()))
    return ("report", repr(r.to_dict()), tuple(cols), _fits(r, sizes))


def _explain(c: tuple, p: tuple) -> str:
    if c[0] != p[0] or c[0] == "SnapshotError":
        return f"C: {c[:2]!r}\nPython: {p[:2]!r}"
    lines = []
    if c[1] != p[1]:
        lines.append(f"to_dict differs:\nC:      {c[1][:1500]}\nPython: {p[1][:1500]}")
    for a, b in zip(c[2], p[2], strict=True):
        if a != b:
            va = np.frombuffer(a[3], a[1]) if a[3] else a[3]
            vb = np.frombuffer(b[3], b[1]) if b[3] else b[3]
            lines.append(f"column {a[0]}: C {a[1]} {a[2]} {va} / Python {b[1]} {b[2]} {vb}")
    if c[3] != p[3]:
        diff = [(x, y) for x, y in zip(c[3], p[3], strict=False) if x != y][:2]
        lines.append(f"can_fit differs: {diff}")
    return "\n".join(lines)


def assert_same(case: Any, sizes: tuple[int, ...] = _SIZES, *, copy_first: bool = True) -> bool:
    """C walk vs Python walk on `case`; True when the C walk produced the compared columns."""
    other = copy.deepcopy(case) if copy_first else case
    rec = _Recorder(walk._cwalk)
    walk._cwalk = rec
    try:
        c = outcome(case, sizes)
    finally:
        walk._cwalk = rec._real
    with python_walk():
        p = outcome(other, sizes)
    assert c == p, _explain(c, p)
    return bool(rec.took) and rec.took[-1]


# --------------------------------------------------------------------------------------------
# real files


def test_real_files_same_report_both_ways(recorded_dict, cwalk):
    assert assert_same(recorded_dict, copy_first=False), "the C walk refused a real file"
    assert assert_same(recorded_dict["segments"], (512, 3 * MIB), copy_first=False)


# --------------------------------------------------------------------------------------------
# hand-made cases: (case, whether the C walk takes it)


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


def _expandable_case(page: int, blocks: list[dict], small: bool = False, **kw: Any) -> dict:
    return seg(blocks, segment_type="small" if small else "large", is_expandable=True, **kw)


CASES: dict[str, tuple[Any, bool]] = {
    "empty dict": (snap(), True),
    "empty list": ([], True),
    "segment without blocks": (snap(seg([]), *_plain()), True),
    "only segments without blocks": (snap(seg([]), seg([], BASE + 4096)), True),
    "plain": (snap(*_plain()), True),
    "bare list": (_plain(), True),
    "devices streams pools": (
        snap(
            _with(_plain()[0], device=1, stream=7),
            _with(_plain()[1], device=3, segment_pool_id=(1, 2)),
            _with(_plain()[0], address=BASE + (1 << 30), stream=2**63 - 1),
            _with(_plain()[1], segment_pool_id=[0, 0]),
        ),
        True,
    ),
    "pool id of three": (snap(_with(_plain()[0], segment_pool_id=(1, 2, 3))), False),
    "pool id None": (snap(_with(_plain()[0], segment_pool_id=None)), False),
    "pool id of strings": (snap(_with(_plain()[0], segment_pool_id=("a", "b"))), False),
    "pool id int64 overflow": (snap(_with(_plain()[0], segment_pool_id=(2**63, 0))), False),
    "device negative": (snap(_with(_plain()[0], device=-1)), True),
    # torch 2.0 and other older shapes
    "legacy history": (
        snap(seg([legacy(blk(512, "active_allocated", 7)), legacy(blk(2 * MIB - 512))])),
        True,
    ),
    "legacy empty history": (
        snap(seg([legacy(blk(512, "active_allocated", 7), []), legacy(blk(MIB))])),
        True,
    ),
    "legacy no history no requested": (
        snap(seg([legacy(blk(512, "active_allocated", 7), None), legacy(blk(MIB))])),
        True,
    ),
    "legacy history a tuple": (
        snap(seg([legacy(blk(512, "active_allocated"), ({"real_size": 3},)), legacy(blk(MIB))])),
        False,
    ),
    "legacy history None": (
        snap(seg([legacy(blk(512, "active_allocated"), None) | {"history": None}])),
        False,
    ),
    "legacy history of a string": (
        snap(seg([legacy(blk(512, "active_allocated"), "abc"), legacy(blk(MIB))])),
        False,
    ),
    "legacy history without real_size": (
        snap(seg([legacy(blk(512, "active_allocated"), [{"addr": 1}])])),
        False,
    ),
    "legacy history real_size a string": (
        snap(seg([legacy(blk(512, "active_allocated"), [{"real_size": "12"}])])),
        False,
    ),
    "legacy segment keys missing": (
        snap(
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
        True,
    ),
    "legacy segment_type None small by size": (
        snap(seg([legacy(blk(2 * MIB))], segment_type=None)),
        True,
    ),
    "second block legacy": (
        snap(seg([blk(512, "active_allocated", 3), legacy(blk(512, "active_allocated", 5))])),
        True,
    ),
    # optional keys missing from a torch >= 2.1 file
    **{
        f"missing {key}": (snap(*_plain(), _without(_plain()[0], key)), True)
        for key in ("device", "stream", "is_expandable", "segment_pool_id", "segment_type")
    },
    "missing frames of segment": (snap(_without(_plain()[0], "frames")), True),
    "missing block frames and requested": (
        snap(seg([_without(blk(512, "active_allocated", 5), "frames", "requested_size")])),
        True,
    ),
    "missing address": (snap(_without(_plain()[0], "address")), False),
    "missing total_size": (snap(*_plain(), _without(_plain()[0], "total_size")), False),
    "missing blocks": (snap(_without(_plain()[0], "blocks")), False),
    "missing size": (snap(seg([_without(blk(512), "size")])), False),
    "missing state": (snap(seg([_without(blk(512), "state")])), False),
    "missing requested_size": (
        snap(seg([_without(blk(512, "active_allocated"), "requested_size")])),
        False,
    ),
    # values of other types
    **{
        f"size {v!r}": (snap(*_plain(), seg([blk(512, "active_allocated"), blk(v)])), False)
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
    "size 2**48": (snap(seg([blk(1 << 48), blk(1 << 48, "active_allocated", 5)])), True),
    **{
        f"requested {v!r}": (
            snap(seg([blk(512, "active_allocated") | {"requested_size": v}])),
            False,
        )
        for v in (None, True, 1.5, "100", 2**63, 2**64, -(2**63) - 1)
    },
    **{
        f"address {v!r}": (snap(_with(_plain()[0], address=v)), False)
        for v in (None, True, 1.5, "1", -(2**63) - 1, 2**63, 2**64)
    },
    **{
        f"total_size {v!r}": (snap(_with(_plain()[0], total_size=v)), False)
        for v in (None, False, 2.0, 2**63, 2**64)
    },
    "total_size negative": (snap(_with(_plain()[0], total_size=-5)), False),
    "total_size not the block sum": (snap(_with(_plain()[0], total_size=3 * MIB)), True),
    **{
        f"device {v!r}": (snap(_with(_plain()[0], device=v)), False)
        for v in (None, True, 1.5, "1", 2**63)
    },
    **{
        f"stream {v!r}": (snap(_with(_plain()[0], stream=v)), False)
        for v in (None, False, 2.5, 2**64)
    },
    **{
        f"is_expandable {v!r}": (snap(_with(_plain()[0], is_expandable=v)), False)
        for v in (None, 0, 1, "yes")
    },
    **{
        f"segment_type {v!r}": (snap(_with(_plain()[0], segment_type=v)), None)
        for v in ("SMALL", "", 5, Str("small"), Str("large"))
    },
    **{
        f"state {v!r}": (snap(*_plain(), seg([blk(512, v)])), False)
        for v in (
            "active_awaiting_free",
            "ACTIVE_ALLOCATED",
            "",
            None,
            3,
            b"inactive",
            Str("inactive"),
            "inactivé",
        )
    },
    # containers of other types
    "segments a tuple": ({"segments": tuple(_plain())}, False),
    "bare tuple": (tuple(_plain()), False),
    "blocks a tuple": (snap(seg((blk(512), blk(MIB)))), False),  # type: ignore[arg-type]
    "segment a dict subclass": (snap(_plain()[0], Sub(_plain()[1])), False),
    "segment an OrderedDict": (snap(OrderedDict(_plain()[0])), False),
    "block a dict subclass": (snap(seg([blk(512), Sub(blk(MIB))])), False),
    **{f"segment {v!r}": (snap(*_plain(), v), False) for v in (None, [], 3, "segment", (1, 2))},
    **{
        f"block {v!r}": (snap(seg([blk(512, "active_allocated"), v])), False)
        for v in (None, [], 3, "block", (512, "inactive"))
    },
    "segments None": ({"segments": None}, False),
    "settings not a dict": (snap(*_plain(), settings="expandable_segments:True"), True),
    # where the C walk and the Python walk once parted (regressions, fixed in _cwalk.c: a
    # segment_type None or of a str subclass; a key _walk_fast never reads after a true
    # device/stream; a requested_size the fast C walk refused while the careful one read
    # history; a zero-size allocated block in a free run; sums past int64)
    "segment_type None, 2 MiB, torch 2.1 shape": (
        snap(seg([blk(2 * MIB)], segment_type=None)),
        None,
    ),
    "stream missing after a device, segment_type None": (
        snap(_without(seg([blk(2 * MIB)], device=1, segment_type=None), "stream")),
        None,
    ),
    "stream missing after a device, a block with history": (
        snap(
            _without(
                seg(
                    [
                        blk(512, "active_allocated", 100),
                        {
                            "size": 512,
                            "state": "active_allocated",
                            "requested_size": 100,
                            "history": [{"real_size": 7}],
                        },
                    ],
                    device=1,
                ),
                "stream",
            )
        ),
        None,
    ),
    "requested beyond 2**48 in a block with history": (
        snap(
            seg(
                [
                    blk(512, "active_allocated", 100),
                    {
                        "size": 512,
                        "state": "active_allocated",
                        "requested_size": 2**50,
                        "history": [{"real_size": 7}],
                    },
                ]
            )
        ),
        None,
    ),
    "requested True in a block with history": (
        snap(
            seg(
                [
                    blk(512, "active_allocated", 100),
                    {
                        "size": 512,
                        "state": "active_allocated",
                        "requested_size": True,
                        "history": [{"real_size": 7}],
                    },
                ]
            )
        ),
        None,
    ),
    "zero-size allocated block inside a free run": (
        snap(
            seg(
                [blk(MIB), blk(0, "active_allocated", 0), blk(MIB), blk(512, "active_allocated")],
                segment_type="small",
                is_expandable=True,
            )
        ),
        None,
    ),
    "zero-size free block at a segment's end": (
        snap(
            seg([blk(512, "active_allocated"), blk(0)]),
            seg([blk(MIB)], BASE + (1 << 30), device=1),
        ),
        None,
    ),
    "zero-size pending block in an all-zero segment": (
        snap(seg([blk(0, "active_pending_free")]), seg([blk(MIB)], BASE + (1 << 30), device=1)),
        None,
    ),
    "block sizes adding up past 2**63": (
        snap(
            *(
                seg([blk(1 << 48, "active_allocated", 1)] * (1 << 14), BASE + (i << 50))
                for i in range(2)
            )
        ),
        None,
    ),
    "requested sizes adding up past 2**63": (
        snap(seg([blk(0, "active_allocated", 1 << 48)] * (1 << 15))),
        None,
    ),
}


#: Cases where the two walks still part, and why; strict: each flips to a failure once fixed
KNOWN_DIFFERENCES: dict[str, str] = {}  # case name -> why the paths differ, if ever


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_DIFFERENCES[n]))
        if n in KNOWN_DIFFERENCES
        else n
        for n in CASES
    ],
)
def test_hand_made_cases_same_both_ways(name, cwalk):
    case, c_takes = CASES[name]
    took = assert_same(case)
    if c_takes is not None:
        assert took == c_takes, f"expected the C walk {'to take' if c_takes else 'to refuse'} it"


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
        [blk(page, "active_pending_free")],
        [blk(page // 2, "active_allocated"), blk(page), blk(page // 2, "active_allocated"),
         blk(page), blk(page // 2, "active_pending_free"), blk(page * 3 // 2)],
    ]  # fmt: skip


@pytest.mark.parametrize("large_mb", [None, 64])
def test_expandable_runs_across_pages_same_both_ways(cwalk, large_mb):
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
        assert assert_same(case, (512, 3 * MIB, 25 * MIB, 70 * MIB))
        for s in segs:  # each segment alone: its releasable bytes cannot hide in a sum
            assert assert_same(snap(s, settings=settings_), (512, 70 * MIB))


# --------------------------------------------------------------------------------------------
# hypothesis: torch-shaped segment lists, mutated

_STATES = ("active_allocated", "inactive", "active_pending_free")
_SIZE = st.one_of(
    st.integers(1, 64).map(lambda k: k * 512),
    st.integers(1, 80).map(lambda k: k * MIB // 2),
    st.sampled_from([SMALL_PAGE, LARGE_PAGE, SMALL_PAGE - 512, LARGE_PAGE + 512, 1 << 48]),
    st.integers(1, 1 << 48),
)
_WEIRD = [None, True, False, 1.5, "12", "", 2**48, 2**48 + 1, 2**63, 2**64, -1, -(2**63) - 1,
          [], {}, (0, 0), [0, 0], Int(3), Str("small"), "active_awaiting_free"]  # fmt: skip
_SEG_KEYS = ("device", "stream", "is_expandable", "segment_pool_id", "segment_type", "frames",
             "address", "total_size", "blocks")  # fmt: skip
_BLOCK_KEYS = ("size", "state", "requested_size", "frames")
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
    if op == "drop":
        if j is not None and draw(st.booleans()):
            blocks[j].pop(draw(st.sampled_from(_BLOCK_KEYS)), None)
        else:
            s.pop(draw(st.sampled_from(_SEG_KEYS)), None)
    elif op == "weird":
        value = copy.deepcopy(draw(st.sampled_from(_WEIRD)))
        if j is not None and draw(st.booleans()):
            blocks[j][draw(st.sampled_from(_BLOCK_KEYS))] = value
        else:
            s[draw(st.sampled_from(_SEG_KEYS))] = value
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


def test_generated_segment_lists_same_both_ways(cwalk):
    took: list[bool] = []

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
        took.append(assert_same(case, (512, 3 * MIB, 25 * MIB)))

    check()
    # both ways in were exercised: the C walk took many cases and handed many to Python
    assert sum(took) > 60 and len(took) - sum(took) > 30, (sum(took), len(took))


# --------------------------------------------------------------------------------------------
# reference counts


def _refcounts(*objs: Any) -> list[int]:
    gc.collect()
    return [sys.getrefcount(o) for o in objs]


def _fresh(text: str) -> str:
    """An equal string that is not the interned constant (its count is ours alone)."""
    return "".join(list(text))


def _refcount_cases() -> dict[str, tuple[dict, dict, str]]:
    """name -> (snapshot, a block of it, that block's state string), each object fresh."""
    out = {}
    for name, tail in (
        ("taken", lambda: blk(MIB)),
        ("refused midway, Python takes it", lambda: blk(True)),
        ("refused midway, Python says where", lambda: blk(MIB, "no such state")),
        ("refused midway, legacy careful mode", lambda: legacy(blk(MIB), [{"real_size": 1.5}])),
    ):
        state = _fresh("active_allocated")
        b = blk(512, state, 100)
        d = snap(seg([b, blk(2 * MIB - 512)]), seg([blk(MIB), tail()], BASE + (1 << 30)))
        out[name] = (d, b, state)
    state = _fresh("inactive")
    b = legacy(blk(512, state))
    out["legacy, taken"] = (snap(seg([legacy(blk(512, "active_allocated", 3)), b])), b, state)
    return out


@pytest.mark.parametrize("name", list(_refcount_cases()))
def test_reference_counts_unchanged(name, cwalk):
    d, b, state = _refcount_cases()[name]
    segs = d["segments"]
    objs = (d, segs, segs[0], segs[0]["blocks"], b, state, segs[-1]["blocks"][-1])
    fragmentation_or_error(d)  # first call: caches (settings, imports) fill here
    before = _refcounts(*objs)
    for _ in range(300):
        fragmentation_or_error(d)
    assert _refcounts(*objs) == before


def fragmentation_or_error(d: Any) -> None:
    with suppress(SnapshotError):
        fragmentation(d)


# --------------------------------------------------------------------------------------------
# a dict key that runs Python code during the C walk's lookups must not crash it

MEDDLE = """
import sys
from gpumemviz.fragmentation import fragmentation, walk
from gpumemviz.snapshot import SnapshotError
assert walk._cwalk is not None


class Meddler:
    # hashes like a real key, so a lookup of that key compares with it first; the comparison
    # empties `victim`, freeing what only it held, before it says no
    def __init__(self, like, victim):
        self.like, self.victim = like, victim

    def __hash__(self):
        return hash(self.like)

    def __eq__(self, other):
        if self.victim is not None:
            self.victim.clear()
        return False


def fresh(text):
    return "".join(list(text))


def legacy_segment():
    # a torch 2.0 segment (the C walk's careful mode reads it first), keys in this order
    s = {"address": 0, "total_size": 2 << 20,
         "blocks": [{"size": 2 << 20, "state": "inactive", "history": []}]}
    s["segment_type"] = fresh("small")  # held by the segment alone
    return s


def frees_the_segment_type():
    s = legacy_segment()
    s[Meddler("device", s)] = 0  # the lookup of "device" empties the segment
    return {"segments": [s]}


def frees_the_history_entry():
    hist = []
    entry = {}
    entry[Meddler("real_size", hist)] = 0  # before real_size: met first by its lookup
    entry["real_size"] = 5
    hist.append(entry)
    del entry  # the history list holds it alone
    b = {"size": 512, "state": "active_allocated", "history": hist}
    return {"segments": [{"address": 0, "total_size": 512, "blocks": [b]}]}


for make in (frees_the_segment_type, frees_the_history_entry):
    for _ in range(200):
        try:
            fragmentation(make())
        except SnapshotError:
            pass
print("OK")
"""


def test_keys_that_run_code_do_not_crash_it(cwalk, tmp_path):
    """Only exact dicts are read, but their keys may be anything: a key whose __eq__ frees what
    the walk holds borrowed must not make it read freed memory (debug allocator: a crash)."""
    import os
    import subprocess

    env = dict(os.environ, PYTHONMALLOC="debug")
    run = subprocess.run(
        [sys.executable, "-X", "dev", "-c", MEDDLE],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0 and run.stdout.strip() == "OK", (run.returncode, run.stderr[-2000:])
