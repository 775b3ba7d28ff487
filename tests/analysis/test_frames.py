"""frames.py: MemoryViz's frame filter, the user's line, formatting, and path redaction."""

from __future__ import annotations

import pickle
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.cuda import _memory_viz as mv

from conftest import REAL_FILES, read_real, real_file
from gpumemviz.analysis.frames import (
    NO_HISTORY,
    Redactor,
    UserFrames,
    elide_repeats,
    filter_frames,
    find_user_names,
    format_frame,
    format_stack,
    is_interpreter_frame,
    is_torch_frame,
    keep_frame,
    redact_paths,
    redact_torch,
    user_frame,
    user_frame_index,
)
from gpumemviz.io import load_snapshot
from test_export import HOME_NAMES, _string_values

#: The torch 2.0 files (blocks carry `history`): both ship. The user's line of every live
#: block of the OOM one is the same allocation; the 1.3b one has the main one and a few more.
LEGACY = {
    "Yiyi-philosophy__LLM-inference__oom_snapshot.pickle": "pytorch_backend.py:190:allocate",
    "Yiyi-philosophy__LLM-inference__1.3b_snapshot.pickle": "pytorch_backend.py:195:allocate",
}


def _all_frames(obj) -> list[dict]:
    """Every frame dict anywhere in a snapshot (segments, blocks, history, traces)."""
    out, stack, seen = [], [obj], set()
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            if {"filename", "line", "name"} <= o.keys():
                out.append(o)
                continue
            stack.extend(o.values())
        elif isinstance(o, list | tuple):
            if id(o) in seen:
                continue
            seen.add(id(o))
            stack.extend(o)
    return out


@pytest.fixture(scope="module")
def real_frames() -> list[dict]:
    frames = []
    for p in REAL_FILES:
        frames += _all_frames(read_real(p))
    return frames


def test_filter_is_memoryviz_filter_on_every_real_frame(real_frames):
    assert len(real_frames) > 1000
    distinct = {(f["name"], f["filename"]) for f in real_frames}
    for name, filename in distinct:
        f = {"name": name, "filename": filename, "line": 0}
        assert keep_frame(f) == mv._frame_filter(name, filename), (name, filename)
    some = real_frames[:5000]
    assert filter_frames(some) == [f for f in some if mv._frame_filter(f["name"], f["filename"])]


def test_format_frame_is_torchs_format(real_frames):
    for f in real_frames[:3000]:
        assert format_frame(f, full_filename=True) == mv._frame_fmt(f, full_filename=True)
        if "\\" not in f["filename"]:
            assert format_frame(f) == mv._frame_fmt(f)
    win = {"filename": "D:\\Dev\\proj\\model.py", "line": 39, "name": "forward"}
    assert format_frame(win) == "model.py:39:forward"  # torch keeps the whole Windows path
    assert format_stack([win, win], limit=1) == ["model.py:39:forward"]


def test_stack_as_memoryviz_shows_it():
    f = {"filename": "/a/m.py", "line": 3, "name": "_call_impl"}
    g = {"filename": "/a/t.py", "line": 9, "name": "step"}
    hidden = {"filename": "??", "line": 0, "name": "PyEval_EvalFrame"}
    frames = [g, f, hidden, f, f, f, g, g]
    assert format_stack(frames, full_filename=True, elide=True) == [
        "/a/t.py:9:step", "/a/m.py:3:_call_impl", "<repeats 3 times>",
        "/a/t.py:9:step", "/a/t.py:9:step",
    ]  # fmt: skip
    assert format_stack([], full_filename=True, elide=True) == [NO_HISTORY]
    assert format_stack([], elide=True) == []
    assert format_stack(frames) == ["t.py:9:step"] + ["m.py:3:_call_impl"] * 4 + ["t.py:9:step"] * 2
    assert elide_repeats(list("aabbbbc")) == ["a", "a", "b", "<repeats 3 times>", "c"]
    assert format_stack(frames, limit=2, elide=True) == ["t.py:9:step", "m.py:3:_call_impl"]


STACK = [
    {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
    {"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "c10::cuda::malloc"},
    {"filename": "", "line": 0, "name": "at::empty_cuda"},
    {"filename": "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py",
     "line": 125, "name": "forward"},
    {"filename": "/opt/conda/lib/python3.11/contextlib.py", "line": 81, "name": "inner"},
    {"filename": "<frozen runpy>", "line": 88, "name": "_run_code"},
    {"filename": "/home/alice/proj/train.py", "line": 42, "name": "step"},
    {"filename": "/home/alice/proj/train.py", "line": 90, "name": "<module>"},
]  # fmt: skip


def test_user_frame_skips_native_torch_and_stdlib():
    assert [is_interpreter_frame(f) for f in STACK] == [True] * 3 + [False, True, True] + [
        False
    ] * 2
    assert [is_torch_frame(f) for f in STACK] == [False] * 3 + [True] + [False] * 4
    assert user_frame_index(STACK) == 6
    assert user_frame(STACK) is STACK[6]
    assert user_frame(STACK[:6]) is None
    assert user_frame([]) is None
    inductor = {"filename": "/tmp/torchinductor_bob/ab/cabc.py", "line": 3, "name": "call"}
    source_tree = {"filename": "/src/pytorch/torch/autograd/graph.py", "line": 1, "name": "f"}
    windows = {
        "filename": "C:\\env\\Lib\\site-packages\\torch\\functional.py",
        "line": 1,
        "name": "f",
    }
    assert all(is_torch_frame(f) for f in (inductor, source_tree, windows))
    assert user_frame([inductor, source_tree, windows, STACK[7]]) is STACK[7]


def test_user_frames_on_real_files_are_the_first_python_frame_outside_torch():
    seen = 0
    for p in REAL_FILES:
        snap = load_snapshot(p)
        for frames in snap.block_frames():
            i = user_frame_index(frames)
            if i is None:
                assert all(is_interpreter_frame(f) or is_torch_frame(f) for f in frames)
                continue
            seen += 1
            f = frames[i]
            assert f["filename"].endswith(".py") and f["line"] > 0
            assert "site-packages/torch/" not in f["filename"].replace("\\", "/")
            assert all(is_interpreter_frame(g) or is_torch_frame(g) for g in frames[:i])
    assert seen > 500


@pytest.mark.parametrize("name", sorted(LEGACY), ids=lambda n: n.split("__")[-1])
def test_legacy_user_frame_comes_from_history(name):
    path = real_file(name)
    snap = load_snapshot(path)
    raw = read_real(path)
    blocks = [b for s in raw["segments"] for b in s["blocks"]]
    frames = snap.block_frames()
    for b, fr in zip(blocks, frames, strict=True):
        assert fr == mv._block_extra(b)[0]
    labels = [format_frame(user_frame(fr)) for fr in frames if fr]
    # by hand: the first frame of history[0] in a .py file outside torch (these files hold
    # no stdlib or interpreter frame before the user's)
    naive = []
    for b in blocks:
        if b.get("history"):
            u = next(
                f
                for f in b["history"][0]["frames"]
                if f["filename"].endswith(".py") and "/torch/" not in f["filename"]
            )
            naive.append(f"{u['filename'].rsplit('/', 1)[-1]}:{u['line']}:{u['name']}")
    assert labels == naive
    top = max(set(labels), key=labels.count)
    assert top == LEGACY[name]
    if name.endswith("oom_snapshot.pickle"):
        assert set(labels) == {"pytorch_backend.py:190:allocate"}


# ---------------------------------------------------------------------------------------------
# redaction

# the homes of frames.py's contract: /home/NAME, /Users/NAME (macOS), C:\\Users\\NAME in any
# case; not a lower-case `users` folder elsewhere (THUDM's /volume/pt-train/users/NAME/...)
_USER = re.compile(
    r"/home/([^/\\\s]+)|/Users/([^/\\\s]+)"
    r"|[A-Za-z]:[\\/]+(?i:Users)[\\/]+([^/\\\s]+)"
)


def _names_in(obj) -> set[str]:
    """User names of home directories, found independently of frames.py: every string."""
    names = set()
    data = pickle.dumps(obj, protocol=4).decode("latin-1")
    for m in _USER.finditer(data):
        names.add(next(g for g in m.groups() if g))
    return names


def _norm_before(s: str, names: set[str]) -> str:
    s = re.sub(r"/root(?=/|$)", "<H>", _USER.sub("<H>", s))
    if names:  # a name as a word, not inside one (conda in miniconda3)
        alt = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        s = re.sub(rf"(?<![A-Za-z0-9])(?:{alt})(?![A-Za-z0-9])", "<N>", s)
    return s


def _norm_after(s: str) -> str:
    return re.sub(r"user\d+", "<N>", re.sub(r"~(user\d+|root)", "<H>", s))


def _walk_pairs(a, b, changed: list, seen: set | None = None):
    """Same structure, keys and non-string values; collect the strings that differ."""
    assert type(a) is type(b)
    if isinstance(a, dict | list | tuple):
        seen = set() if seen is None else seen
        if a is b or (id(a), id(b)) in seen:  # shared containers: compare once
            return
        seen.add((id(a), id(b)))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _walk_pairs(a[k], b[k], changed, seen)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _walk_pairs(x, y, changed, seen)
    elif isinstance(a, str):
        if a != b:
            changed.append((a, b))
    else:
        assert a == b


def test_redaction_removes_every_home_and_name_and_changes_nothing_else(tmp_path):
    found_any = set()
    for p in REAL_FILES:
        raw = read_real(p)
        names = _names_in(raw)
        found_any |= names
        assert set(find_user_names(raw)) == names
        red = redact_torch(raw)
        data = pickle.dumps(red, protocol=4)
        values = _string_values(red, [], set())
        for n in names:
            # short names (lin, leo) are parts of other words (linear): the name as a word is
            # gone from every string; a long one from every byte
            word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(n)}(?![A-Za-z0-9])")
            assert not any(word.search(v) for v in values), (p.name, n)
            if len(n) >= 6:
                assert n.encode() not in data, (p.name, n)
        assert b"/home/" not in data and b"/root/" not in data and b"/Users/" not in data
        changed: list = []
        _walk_pairs(raw, red, changed)
        assert bool(changed) == bool(names or "/root/" in pickle.dumps(raw).decode("latin-1"))
        for before, after in changed:  # only the home prefix and the names differ
            assert _norm_before(before, names) == _norm_after(after), (before, after)
        if p.stat().st_size < 1 << 20:
            assert redact_torch(raw) == red  # deterministic
        # the Snapshot path (no dicts built) redacts exactly as the dict path
        assert redact_paths(load_snapshot(p)).to_torch() == redact_torch(
            load_snapshot(p).to_torch()
        )
        assert read_real(p) == raw  # the input is left alone
    every = [set(HOME_NAMES.get(p.name, ())) for p in REAL_FILES]
    assert found_any == {n.decode() for n in set().union(*every)}
    assert {"lin", "dingyiran", "leo", "conda"} <= found_any  # the shipped files' ones


def test_a_user_name_outside_a_home_is_hidden_when_named():
    # THUDM's frames live in /volume/pt-train/users/mingjie/...: not a home directory, so the
    # name is not found on its own; `names=` hides it (and only it)
    raw = read_real(real_file("THUDM__slime__init_model_mempool.pickle"))
    assert find_user_names(raw) == []
    plain = redact_torch(raw)  # its /root/ paths become ~root/
    assert b"/users/mingjie/" in pickle.dumps(plain, protocol=4)
    red = redact_torch(raw, names=["mingjie"])
    data = pickle.dumps(red, protocol=4)
    assert b"mingjie" not in data and b"/users/user1/" in data
    changed: list = []
    _walk_pairs(plain, red, changed)
    assert changed and all(a.replace("mingjie", "user1") == b for a, b in changed)


def test_redaction_format_and_every_place_a_path_appears():
    frame = {"filename": "/home/alice/p/x.py", "line": 1, "name": "f"}
    shared = [frame]
    snap = {
        "segments": [{
            "device": 0, "address": 1 << 21, "total_size": 1024, "allocated_size": 512,
            "active_size": 512, "requested_size": 500, "stream": 0, "segment_type": "small",
            "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": [{"filename": "C:\\Users\\Bob\\p\\y.py", "line": 2, "name": "g"}],
            "blocks": [
                {"address": 1 << 21, "size": 512, "requested_size": 500,
                 "state": "active_allocated", "frames": shared},
                {"address": (1 << 21) + 512, "size": 512, "requested_size": 0,
                 "state": "inactive", "frames": []},
            ],
        }],
        "device_traces": [[
            {"action": "alloc", "addr": 1 << 21, "size": 500, "stream": 0, "frames": shared,
             "user_metadata": "run by alice", "compile_context": "/root/cache/k.py"},
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
        "external_annotations": [
            {"stage": "START", "name": "/Users/carol/x /tmp/torchinductor_alice/k", "device": 0,
             "time_us": 5},
        ],
    }  # fmt: skip
    red = redact_torch(snap)
    seg = red["segments"][0]
    assert seg["frames"][0]["filename"] == "~user1\\p\\y.py"  # first met: segment frames
    assert seg["blocks"][0]["frames"][0]["filename"] == "~user2/p/x.py"
    entry = red["device_traces"][0][0]
    assert entry["frames"] is seg["blocks"][0]["frames"]  # a shared list stays shared
    assert entry["user_metadata"] == "run by user2"
    assert entry["compile_context"] == "~root/cache/k.py"
    assert red["external_annotations"][0]["name"] == "~user3/x /tmp/torchinductor_user2/k"
    assert seg["blocks"][1] is snap["segments"][0]["blocks"][1]  # untouched rows are reused
    assert red["allocator_settings"] is snap["allocator_settings"]
    assert snap["segments"][0]["blocks"][0]["frames"][0]["filename"] == "/home/alice/p/x.py"
    # the Snapshot-level function and a shared Redactor across two snapshots
    assert redact_paths(snap).to_torch() == red
    r = Redactor(names=["zed"])
    assert r.text("/data/zed/x") == "/data/user1/x"
    assert r.redact({"a": "/home/alice/q"}) == {"a": "~user2/q"}
    assert r.text("/home/alice/z") == "~user2/z"


@pytest.mark.parametrize("name", sorted(LEGACY), ids=lambda n: n.split("__")[-1])
def test_legacy_history_frames_are_redacted(name):
    path = real_file(name)
    snap = redact_paths(load_snapshot(path))
    frames = [f for fr in snap.block_frames() for f in fr]
    assert frames and all(f["filename"].startswith("~user1/") for f in frames)
    assert all("dingyiran" not in f["filename"] for f in frames)


#: Frames of every kind the search meets: torch's, the interpreter's, the user's, a library's,
#: and malformed ones (fields of other types, missing fields, not a dict at all).
_POOL = [
    {"filename": "/x/site-packages/torch/nn/modules/module.py", "line": 1, "name": "forward"},
    {"filename": "??", "line": 0, "name": "PyEval_EvalFrame"},
    {"filename": "/usr/lib/python3.11/threading.py", "line": 9, "name": "run"},
    {"filename": "train.py", "line": 39, "name": "step"},
    {"filename": "/x/site-packages/einops/einops.py", "line": 5, "name": "rearrange"},
    {"filename": ["train.py"], "line": None, "name": 3},
    {"line": 7},
    "not a frame",
    None,
]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.sampled_from(range(len(_POOL))), max_size=8), max_size=12))
def test_user_frames_finds_what_user_frame_finds(stacks):
    """Over stacks sharing their frames (a fresh list each, as torch writes traces), the finder
    that judges each frame once answers as `user_frame` does, the same dict included."""
    find = UserFrames()
    for idx in stacks:
        frames = [_POOL[i] for i in idx]
        assert find(frames) is user_frame(frames)
