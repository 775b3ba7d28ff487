"""The loader's bounds on hostile and unlucky input: memory per input byte, time, one-line
errors, shared references walked once, and standard input.

The hostile pickles are tools/hostile.py's; memory is what tracemalloc counts.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import pickle
import pickletools
import random
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from conftest import REAL_FILES, _ids, real_file
from gpumemviz.io import load_snapshot, loads_restricted, scan_pickle
from gpumemviz.snapshot import Snapshot, SnapshotError
from test_snapshot import minimal

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
#: The loader's budget: 12x the input plus 64 MiB (gpumemviz.io.budget holds the constants).
LOAD_FACTOR, LOAD_SLACK = 12, 64 * MIB


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(
        f"gpumemviz_tools_{name}", REPO / "tools" / f"{name}.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


hostile = _load_tool("hostile")


def _peak(fn):
    """(what fn returned or raised, bytes tracemalloc saw it allocate at most)."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        try:
            out = fn()
        except Exception as e:  # the outcome is judged by the caller
            out = e
        return out, tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def _one_line_outcome(out) -> None:
    if isinstance(out, Exception):
        assert isinstance(out, SnapshotError), repr(out)
        assert str(out) and "\n" not in str(out)
    else:
        assert isinstance(out, Snapshot)


# -- memory ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"), [("empty_sets", "set (EMPTY_SET"), ("frozensets", "frozenset (FROZENSET")]
)
def test_sets_are_refused_before_anything_is_built(name, message):
    data = hostile.PATTERNS[name](8 * MIB)  # the 8 MB, 1.9 GB peak
    out, peak = _peak(lambda: load_snapshot(data))
    assert isinstance(out, SnapshotError)
    assert str(out).startswith(f"a value of type {message} at byte")
    assert peak < MIB


@pytest.mark.parametrize("name", sorted(hostile.PATTERNS))
def test_hostile_pickles_stay_within_12x_their_size(name, monkeypatch):
    # The budget is 12x the input plus 64 MiB; with the slack cut to a few MiB, a 1 MiB input
    # shows the factor at work (a pickle of one-byte opcodes builds 50-200 bytes per byte).
    from gpumemviz.io import budget

    assert (budget.LOAD_FACTOR, budget.LOAD_SLACK) == (LOAD_FACTOR, LOAD_SLACK)
    monkeypatch.setattr(budget, "GUARD_SLACK", 2 * MIB)
    data = hostile.PATTERNS[name](MIB)
    out, peak = _peak(lambda: load_snapshot(data))
    _one_line_outcome(out)
    assert peak <= LOAD_FACTOR * len(data) + 16 * MIB, (name, peak / len(data))


_N = 30_000
JSON_PATTERNS = {
    "lists": b"[" + b"[]," * _N + b"[]]",
    "dicts": b"[" + b"{}," * _N + b"{}]",
    "one-key dicts": b"[" + b'{"a":0},' * _N + b'{"a":0}]',
    "two-key dicts": b"[" + b'{"a":0,"b":1},' * _N + b'{"a":0}]',
    "distinct keys": b"{" + b",".join(b'"k%d":0' % i for i in range(_N)) + b"}",
    "distinct keys apart": b"[" + b",".join(b'{"k%d":0}' % i for i in range(_N)) + b"]",
    "one-item lists": b"[" + b"[0]," * _N + b"[0]]",
    "nested": b"[" + b"[[[]]]," * _N + b"[]]",
    "strings": b"[" + b'"ab",' * _N + b'"a"]',
    "ints": b"[" + b"1000," * _N + b"1]",
    "small ints": b"[" + b"300," * _N + b"1]",
    "floats": b"[" + b"1.5," * _N + b"1]",
    "zeros": b"[" + b"0," * _N + b"1]",
    "wide": ("[" + ",".join(['"\u4e00"'] * _N) + "]").encode(),
    "emoji": ("[" + ",".join(['"\U0001f600"'] * _N) + "]").encode(),
    "escapes": b"[" + b'"\\u4e00",' * _N + b'"a"]',
}


@pytest.mark.parametrize("name", sorted(JSON_PATTERNS))
def test_the_json_estimate_bounds_what_loading_json_takes(name):
    from gpumemviz.io import budget

    data = JSON_PATTERNS[name]
    _, peak = _peak(lambda: json.loads(data.decode("utf-8")))
    # the estimate covers the input too (read from a file, it is part of the load)
    assert budget.json_estimate(data) >= peak + len(data), (name, peak / len(data))


def test_pathological_json_is_refused_before_it_is_parsed():
    data = b"[" + b"[]," * (4 * MIB) + b"[]]"  # 12 MB: 270 MB once parsed
    out, peak = _peak(lambda: load_snapshot(data))
    assert isinstance(out, SnapshotError) and str(out).startswith("refused: this 12.00 MiB")
    assert peak < MIB


def test_gpumemviz_json_is_within_the_estimates_factor(tmp_path):
    # everything gpumemviz writes must load: its JSON's estimate stays under the guard's
    # factor per byte, so no size of it is refused
    from gpumemviz.io import budget, save_snapshot

    name = "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
    data = save_snapshot(real_file(name), tmp_path / "w.json").read_bytes()
    assert budget.json_estimate(data) < budget.GUARD_FACTOR * len(data)
    assert load_snapshot(data).n_blocks > 0


@pytest.mark.parametrize("path", REAL_FILES, ids=_ids(REAL_FILES))
def test_real_files_load_within_1_5x_of_a_plain_unpickle(path):
    data = path.read_bytes()
    empty = pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4)
    load_snapshot(data)  # imports and one-time caches first: what counts is the load itself
    load_snapshot(empty)

    def peak(fn):
        # a full collection empties the free lists of dicts, lists and tuples first, so both
        # sides pay for every object they build (else either may reuse what the other freed:
        # a 5 KB file read 33 or 49 KB for the same pickle.loads)
        gc.collect()
        return _peak(fn)

    _, plain = peak(lambda: pickle.loads(data))
    out, ours = peak(lambda: load_snapshot(data))
    assert isinstance(out, Snapshot)
    # What any load costs, the emptiest file's (a Snapshot's ~60 numpy arrays and validate's:
    # ~16 KiB), is allowed on top only where it is over half of what pickle.loads takes:
    # albi2's 1.2 KB file (11 KB unpickled). Every other real file is held to 1.5x alone.
    _, fixed = peak(lambda: load_snapshot(empty))
    slack = fixed if 2 * fixed > plain else 0
    if ours > 1.5 * plain + slack:  # once more: a thread an earlier test left running may
        ours = min(ours, peak(lambda: load_snapshot(data))[1])  # have allocated meanwhile
    assert ours <= 1.5 * plain + slack, (ours / plain, ours, plain, fixed)


# -- time and the walk ----------------------------------------------------------------------


def _count_walked(monkeypatch) -> list[int]:
    from gpumemviz.io import walk

    walked: list[int] = []
    real_next = walk._Walk.next_level

    def counting(self, level):
        walked.append(len(level))
        return real_next(self, level)

    monkeypatch.setattr(walk._Walk, "next_level", counting)
    return walked


def _containers(obj) -> int:
    seen, todo = set(), [obj]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        todo += [v for v in (x.values() if type(x) is dict else x) if type(v) in (dict, list)]
    return len(seen)


@pytest.mark.parametrize("name", ["many_depths", "shared_2e30"])
def test_the_walk_visits_each_container_once(name, monkeypatch):
    data = hostile.PATTERNS[name](64 * 1024)
    walked = _count_walked(monkeypatch)
    obj = loads_restricted(data)
    # the one-int lists of many_depths are referenced once each; shared_2e30's 31 lists once
    assert sum(walked) == _containers(obj)


def test_a_list_reachable_at_60_depths_loads_in_linear_time():
    data = hostile.many_depths(MIB)  # before: 5 s, walked once per depth
    t0 = time.process_time()
    snap = load_snapshot(data)
    assert time.process_time() - t0 < 1.5
    assert snap.n_segments == 0


def test_one_frames_list_shared_by_every_block_and_entry_loads():
    # the realistic file: every block and trace entry shares one frames list
    frames = [{"filename": f"/src/m{i}.py", "line": i, "name": "f"} for i in range(40)]
    d = minimal()
    for s in d["segments"]:
        for b in s["blocks"]:
            b["frames"] = frames
    d["device_traces"] = [
        [{"action": "alloc", "addr": 0, "size": 512, "stream": 0, "frames": frames}] * 20_000
    ]
    data = pickle.dumps(d, protocol=4)
    out, peak = _peak(lambda: load_snapshot(data))
    assert isinstance(out, Snapshot)
    assert peak <= LOAD_FACTOR * len(data) + LOAD_SLACK


def _stacks_trace(stacks: list[list[dict]]) -> bytes:
    entries = [{"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0, "frames": f}
               for i, f in enumerate(stacks)]  # fmt: skip
    return pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4)


@pytest.mark.parametrize("tail", ["cycle", "deep", "fine"])
def test_past_1500_different_stacks_the_walk_still_reads_every_list(tail, monkeypatch):
    # every stack differs: runs stop being remembered (benchmarks/big_traces.py --part load,
    # kind "mixed"), and what the last lists hide is found all the same
    from gpumemviz.io import walk

    rng = random.Random(20)
    pool = [{"filename": f"/src/m{i}.py", "line": i, "name": "f"} for i in range(300)]
    stacks = [rng.choices(pool, k=rng.randint(20, 100)) for _ in range(1500)]
    stacks += [list(stacks[5]), list(stacks[1490])]  # equal to one met before
    hidden: list = []
    if tail == "cycle":
        hidden.append(hidden)
    elif tail == "deep":
        for _ in range(70):
            hidden = [hidden]
    stacks[-1] = [*stacks[-1][:-1], hidden]  # a long list whose last item is not a frame
    data = _stacks_trace(stacks)
    walked = _count_walked(monkeypatch)
    if tail == "fine":
        obj = pickle.loads(data)
        walk.check_plain(obj)
        assert sum(walked) == _containers(obj)  # each container once
    else:
        with pytest.raises(SnapshotError, match="nested deeper than 64"):
            loads_restricted(data)


def test_a_cycle_is_refused_and_a_caller_held_reference_reads_as_one():
    from gpumemviz.io import walk

    cyclic: list = [[]]
    cyclic[0].append(cyclic[0])
    with pytest.raises(
        SnapshotError, match=r"\(max_depth=64\).*: 1 container\(s\) hold themselves"
    ):
        loads_restricted(pickle.dumps(cyclic, protocol=4))
    inner: list = [[1]]  # holds a container: its references are counted
    with pytest.raises(SnapshotError, match="hold themselves"):  # documented: fresh data only
        walk.check_plain([[inner], [inner]])  # two references from the data, one from here


# -- errors ---------------------------------------------------------------------------------


def _mutants(data: bytes, rng: random.Random, n: int):
    for _ in range(n):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] = rng.randrange(256)
        if rng.random() < 0.3:
            b = b[: rng.randrange(1, len(b))]
        yield bytes(b)


def test_every_failure_of_load_snapshot_is_a_one_line_snapshot_error():
    rng = random.Random(15)
    seeds = [pickle.dumps(minimal(), protocol=p) for p in (2, 4, 5)]
    seeds.append(json.dumps(minimal()).encode())
    for seed in seeds:
        for data in _mutants(seed, rng, 150):
            try:
                load_snapshot(data)
            except SnapshotError as e:
                assert str(e) and "\n" not in str(e)
    # a JSON integer of 5,000 digits: int() refuses it (a plain ValueError before)
    with pytest.raises(SnapshotError, match=r"^invalid JSON \(Exceeds the limit"):
        load_snapshot(b'{"segments": [], "x": ' + b"9" * 5000 + b"}")


def test_an_unexpected_exception_while_loading_is_one_line_too(monkeypatch):
    def broken(obj):
        raise TypeError("boom\nsecond line")

    monkeypatch.setattr(Snapshot, "from_torch", staticmethod(broken))
    with pytest.raises(SnapshotError) as e:
        load_snapshot(pickle.dumps(minimal(), protocol=4))
    assert str(e.value).startswith("cannot read this snapshot: internal error TypeError: boom")
    assert "\n" not in str(e.value)


def test_the_scan_finds_the_frames_pickletools_finds(tmp_path):
    for path in REAL_FILES[:4]:
        data = path.read_bytes()
        frames = [pos for op, _, pos in pickletools.genops(data) if op.name == "FRAME"]
        assert [start for start, _ in scan_pickle(data)] == frames


def test_a_memo_index_past_half_the_file_is_refused():
    data = b"\x80\x02]r" + (9).to_bytes(4, "little") + b"." + b"N" * 8  # 17 bytes, index 9
    with pytest.raises(SnapshotError, match=r"memo index 9 at byte 3 is beyond"):
        loads_restricted(data)


# -- standard input -------------------------------------------------------------------------


def _cli(args: list[str], data: bytes) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run(
        [sys.executable, "-m", "gpumemviz.cli", *args],
        input=data,
        capture_output=True,
        env=env,
        timeout=120,
    )


def test_inspect_reads_standard_input_whole():
    path = real_file("volcengine__verl__mem_mempools.pickle")  # 344 KB: many pipe buffers
    out = _cli(["inspect", "-", "--no-replay"], path.read_bytes())
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().startswith("<stdin>: 1 device(s), 127 segments")
    out = _cli(["inspect", "/dev/stdin", "--no-replay"], path.read_bytes())  # a pipe
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().startswith("/dev/stdin: 1 device(s), 127 segments")
    out = _cli(["diff", "-", "-"], path.read_bytes())
    assert out.returncode == 2
    assert (
        out.stderr.decode()
        == "gpumemviz diff: error: only one of A and B can be - (standard input)\n"
    )


def test_a_stream_past_the_size_limit_is_refused():
    import io

    from gpumemviz.io.snapshot_files import read_stream

    assert read_stream(io.BytesIO(b"x" * 100), max_bytes=100) == b"x" * 100
    with pytest.raises(SnapshotError, match=r"^standard input is over the 100 bytes limit"):
        read_stream(io.BytesIO(b"x" * 101), max_bytes=100, what="standard input")


def _random_graph(rng: random.Random):
    """Plain data with shared parts: leaves (frames), lists of them (some long, some equal),
    dicts and tuples holding those, now and then a cycle."""
    leaves = [{"filename": f"f{i}", "line": i, "name": "g"} for i in range(rng.randint(1, 6))]
    nodes: list = list(leaves)
    for _ in range(rng.randint(1, 40)):
        kind = rng.choice(("list", "long", "dict", "tuple", "same"))
        kids = [rng.choice(nodes) for _ in range(rng.randint(0, 4))]
        if kind == "long":
            node = [rng.choice(leaves) for _ in range(rng.randint(16, 40))]
        elif kind == "same":  # an equal copy of a list met before (the walk compares them)
            like = rng.choice(nodes)
            node = list(like) if isinstance(like, list) else [1]
        elif kind == "dict":
            node = {f"k{i}": k for i, k in enumerate(kids)} | {"n": rng.randint(0, 9)}
        elif kind == "tuple":
            node = (*kids, "x")
        else:
            node = [*kids, 2.5]
        nodes.append(node)
    root = [rng.choice(nodes) for _ in range(rng.randint(1, 6))]
    if rng.random() < 0.4:
        lists = [n for n in nodes if isinstance(n, list)]
        if lists:
            rng.choice(lists).append(rng.choice(lists))  # maybe a cycle
    return root


def _longest(obj) -> float:
    """Levels of containers on the longest path (inf if there is a cycle), recursively."""
    memo: dict[int, float] = {}
    on_path: set[int] = set()

    def depth(x) -> float:
        if type(x) not in (dict, list, tuple):
            return 0
        if id(x) in on_path:
            return float("inf")
        if id(x) not in memo:
            on_path.add(id(x))
            vals = x.values() if type(x) is dict else x
            memo[id(x)] = 1 + max((depth(v) for v in vals), default=0)
            on_path.discard(id(x))
        return memo[id(x)]

    return depth(obj)


def test_the_walk_finds_the_longest_path_and_cycles_as_a_recursive_reader_would():
    from gpumemviz.io import walk

    rng = random.Random(1515)
    cycles = 0
    for _ in range(300):
        data = pickle.dumps(_random_graph(rng), protocol=4)
        longest = _longest(pickle.loads(data))
        cycles += longest == float("inf")
        for limit in (3, 5, 8, 64):
            fresh = pickle.loads(data)  # the walk reads reference counts: data nothing holds
            try:
                walk.check_plain(fresh, max_depth=limit)
                ok = True
            except SnapshotError:
                ok = False
            assert ok == (longest <= limit), (longest, limit)
    assert cycles >= 5, cycles  # reachable ones


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_an_endless_stream_no_snapshot_starts_like_is_read_no_further():
    t0 = time.process_time()
    with pytest.raises(
        SnapshotError, match=r"^not a pickle or JSON snapshot \(starts with b'\\x00"
    ):
        load_snapshot("/dev/zero")
    assert time.process_time() - t0 < 1
