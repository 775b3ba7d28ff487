"""Safe file I/O: restricted unpickling, limits, bad input, JSON and pickle round trips, atomic
saves."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

import gpumemviz
from conftest import read_real, real_file
from gpumemviz import io as gio
from gpumemviz.io import as_snapshot, load_snapshot, loads_restricted, save_snapshot, snapshot_files
from gpumemviz.snapshot import Snapshot, SnapshotError
from test_snapshot import minimal, synthetic

#: Whole torch 2.11 files (trace entries carry compile_context and user_metadata): MAGMA27's
#: is CI-only, Wedsonlin's ships.
TORCH_2_11 = [
    "MAGMA27__assignment2-systems__memory_snapshot.pickle",
    "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle",
]


class _Mkdir:
    """A pickle payload: unpickling it with plain `pickle.loads` creates the folder `path`."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


# -- real files ---------------------------------------------------------------------------------


def test_real_file_loads_by_path_and_bytes(recorded_path, recorded_dict, tmp_path):
    bare = tmp_path / "snapshot"  # no suffix: content decides
    shutil.copyfile(recorded_path, bare)
    by_path = load_snapshot(bare)
    by_bytes = load_snapshot(recorded_path.read_bytes())
    for snap in (by_path, by_bytes):
        assert snap.to_torch() == recorded_dict
    assert load_snapshot(by_path) is by_path


def test_real_file_round_trips_through_pickle(recorded_path, recorded_dict, tmp_path):
    snap = load_snapshot(recorded_path)
    pkl = save_snapshot(snap, tmp_path / "out.pickle")
    assert pkl.read_bytes()[:2] == b"\x80\x04"  # protocol 4: MemoryViz.js rejects 5
    assert pickle.loads(pkl.read_bytes()) == recorded_dict  # our own file, read by the oracle
    assert load_snapshot(pkl).to_torch() == recorded_dict


def _lighter(d: dict) -> dict:
    """`d` with each trace cut to 200 entries plus every rarer action (segment_*, oom, ...).

    JSON cannot share the frames that pickles share, so a full trace is 20-50x larger as JSON
    (cranberrii: 2.6 MB pickle, 138 MB JSON); the cut keeps every layout and action.
    """
    common = {"alloc", "free_requested", "free_completed"}
    traces = [
        [e for i, e in enumerate(t) if i < 200 or e["action"] not in common]
        for t in d["device_traces"]
    ]
    return {**d, "device_traces": traces}


def test_real_file_round_trips_through_json(recorded_dict, tmp_path):
    d = _lighter(recorded_dict)
    js = save_snapshot(d, tmp_path / "out.json")
    assert (
        json.loads(js.read_text())["segments"][0]["total_size"] == (d["segments"][0]["total_size"])
    )
    back = load_snapshot(js).to_torch()
    assert back == d  # tuples (segment_pool_id) come back as tuples
    assert back == load_snapshot(save_snapshot(d, tmp_path / "out.pkl")).to_torch()


@pytest.mark.parametrize("name", TORCH_2_11, ids=lambda n: n.split("__")[0])
def test_full_torch_2_11_file_round_trips_through_json(tmp_path, name):
    d = read_real(real_file(name))
    back = load_snapshot(save_snapshot(d, tmp_path / "whole.json")).to_torch()
    assert back == d
    assert back["device_traces"][0][0]["compile_context"] == "N/A"


@pytest.mark.parametrize("name", ["snap.pkl", "snap.pickle", "snap.json", "snap", "snap.bin"])
def test_any_suffix_loads_the_same(tmp_path, name):
    d = minimal()
    path = tmp_path / name
    path.write_bytes(pickle.dumps(d, protocol=4))
    assert load_snapshot(path).to_torch() == d
    path.write_text(json.dumps(d))
    assert load_snapshot(path).to_torch() == d


def test_old_pickle_protocols_load(tmp_path):
    d = minimal()
    for protocol in (0, 2, 5):
        assert loads_restricted(pickle.dumps(d, protocol=protocol)) == d
        assert load_snapshot(pickle.dumps(d, protocol=protocol)).to_torch() == d


def test_synthetic_blocks_through_files(tmp_path):
    d = synthetic(20_000)  # the 10^5-block round trip is in test_snapshot
    path = save_snapshot(d, tmp_path / "big.pkl")
    assert load_snapshot(path).to_torch() == d


# -- the restricted unpickler -------------------------------------------------------------------


def test_malicious_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"segments": [], "x": _Mkdir(marker)}, protocol=4)
    with pytest.raises(SnapshotError, match=r"^refused global posix\.mkdir"):
        load_snapshot(payload)
    path = tmp_path / "evil.pickle"
    path.write_bytes(payload)
    with pytest.raises(SnapshotError, match=r"^refused global posix\.mkdir"):
        load_snapshot(path)
    with pytest.raises(SnapshotError, match=r"^refused global posix\.mkdir"):
        loads_restricted(pickle.dumps(_Mkdir(marker), protocol=0))
    assert not marker.exists()
    # the payload is real: plain pickle runs it
    live = tmp_path / "live"
    pickle.loads(pickle.dumps(_Mkdir(live)))
    assert live.is_dir()


def test_every_global_is_refused():
    for obj, name in [(Path("/x"), "pathlib.PosixPath"), (set, "builtins.set"),
                      (ValueError("x"), "builtins.ValueError")]:  # fmt: skip
        with pytest.raises(SnapshotError, match=f"^refused global {name}"):
            loads_restricted(pickle.dumps(obj, protocol=4))


def test_non_plain_types_built_without_globals_are_refused():
    with pytest.raises(SnapshotError, match=r"^a value of type set"):
        loads_restricted(pickle.dumps({"segments": [], "s": {1, 2}}, protocol=4))
    with pytest.raises(SnapshotError, match=r"^a value of type bytearray"):
        loads_restricted(pickle.dumps([bytearray(b"ab")], protocol=5))
    # sets and frozensets are refused by the opcode scan, before anything is built
    with pytest.raises(SnapshotError, match=r"^a value of type frozenset \(FROZENSET at byte"):
        loads_restricted(pickle.dumps({frozenset({1}): 1}, protocol=4))
    with pytest.raises(SnapshotError, match=r"^a dict key of type tuple"):
        loads_restricted(pickle.dumps({(1, 2): 1}, protocol=4))


def test_size_limit(tmp_path):
    data = pickle.dumps(minimal(), protocol=4)
    with pytest.raises(
        SnapshotError, match=r"^pickle is .* over the 100 bytes limit \(max_bytes=100"
    ):
        load_snapshot(data, max_bytes=100)
    path = tmp_path / "s.pkl"
    path.write_bytes(data)
    with pytest.raises(SnapshotError, match=r"s\.pkl is .* over the 100 bytes limit"):
        load_snapshot(path, max_bytes=100)
    assert load_snapshot(path, max_bytes=len(data)).n_blocks == 5


def test_nesting_limit():
    deep: list = []
    for _ in range(200):
        deep = [deep]
    message = r"^data nested deeper than 64 levels \(max_depth=64\)"
    with pytest.raises(SnapshotError, match=message):
        load_snapshot(pickle.dumps({"segments": [], "x": deep}, protocol=4))
    with pytest.raises(SnapshotError, match=message):
        load_snapshot(json.dumps({"segments": [], "x": deep}).encode())
    with pytest.raises(SnapshotError, match=message):
        load_snapshot(b"[" * 100_000 + b"]" * 100_000)  # deeper than the JSON parser's stack
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(SnapshotError, match=message):
        load_snapshot(pickle.dumps(cyclic, protocol=4))
    d = minimal()  # top dict, segments, segment, blocks, block, frames, frame: 7 levels
    assert load_snapshot(pickle.dumps(d), max_depth=7).to_torch() == d
    with pytest.raises(SnapshotError, match=r"max_depth=6\)"):
        load_snapshot(pickle.dumps(d), max_depth=6)


def test_shared_references_cannot_blow_up_the_walk():
    layer: list = [0]
    for _ in range(60):  # 2^60 paths through 60 shared lists: a walk by path would never end
        layer = [layer, layer]
    data = pickle.dumps({"segments": [], "x": layer}, protocol=4)
    assert len(data) < 2000
    assert loads_restricted(data)["segments"] == []


# -- bad input ----------------------------------------------------------------------------------


def _segment3(d: dict) -> str:
    s = d["segments"][3]
    return f"segment 3 (device {s['device']}, {s['address']:#x})"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "^empty input: no snapshot to read$"),
        (b"  \n", "^empty input"),
        (pickle.dumps(minimal(), protocol=4)[:-40], r"^truncated or corrupt pickle \("),
        (b"\x80\x04\x95", r"^truncated or corrupt pickle \("),
        (b"hello, world", r"^not a pickle or JSON snapshot \(starts with b'hello, world'\)$"),
        (b"\x00\x01\x02", r"^not a pickle or JSON snapshot"),
        (b'{"segments": [', r"^invalid JSON at line 1, column 15: Expecting value$"),
        (b'{"segs": []}', r"^not a snapshot: a dict without 'segments' \(keys: 'segs'\)$"),
        (pickle.dumps("text"), r"^not a snapshot: a str"),
        (b"[1]", r"^segment 0 is an int, not a dict$"),
    ],
)
def test_bad_bytes_get_one_line_errors(data, message):
    with pytest.raises(SnapshotError, match=message) as err:
        load_snapshot(data)
    assert "\n" not in str(err.value)


def _drop(d: dict, *path):
    target = d
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: _drop(d, "segments"), "not a snapshot: a dict without 'segments'"),
        (lambda d: _drop(d, "segments", 3, "blocks", 7, "size"), "{seg3}: block 7 has no size"),
        (lambda d: d["segments"].__setitem__(3, "seg"), "segment 3 is a str, not a dict"),
        (
            lambda d: d["segments"][3].update(total_size=d["segments"][3]["total_size"] + 512),
            "{seg3}: blocks sum to",
        ),
        (
            lambda d: d["segments"][3]["blocks"][7].update(address=0),
            "{seg3}: block 7 is at 0x0, expected",
        ),
        (
            lambda d: d["segments"][3]["blocks"][7].update(state="freed"),
            "{seg3}: block 7 has unknown state 'freed'",
        ),
    ],
)
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_bad_files_name_what_and_where(tmp_path, mutate, message, fmt):
    d = synthetic(80, per_segment=10)
    where = _segment3(d)
    mutate(d)
    path = tmp_path / f"bad.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(d))
    else:
        path.write_bytes(pickle.dumps(d, protocol=4))
    with pytest.raises(SnapshotError) as err:
        load_snapshot(path)
    assert str(err.value).startswith(message.format(seg3=where))


def test_missing_path_folder_and_wrong_type(tmp_path):
    with pytest.raises(SnapshotError, match=r"^no such file: .*nope.pickle$"):
        load_snapshot(tmp_path / "nope.pickle")
    with pytest.raises(SnapshotError, match="is a folder, not a snapshot file"):
        load_snapshot(tmp_path)
    with pytest.raises(SnapshotError, match=r"^cannot load a snapshot from an int"):
        load_snapshot(3)  # type: ignore[arg-type]
    with pytest.raises(SnapshotError, match=r"^cannot load a snapshot from a float"):
        as_snapshot(1.5)
    path = save_snapshot([], tmp_path / "ok.pkl")
    assert load_snapshot(str(path)).n_segments == 0  # a str path works too


# -- coercion and saving ------------------------------------------------------------------------


def test_as_snapshot_accepts_every_form(tmp_path):
    d = minimal()
    snap = Snapshot.from_torch(d)
    path = save_snapshot(d, tmp_path / "m.pickle")
    assert as_snapshot(snap) is snap
    for form in (d, d["segments"], path, str(path), path.read_bytes()):
        assert as_snapshot(form).to_torch()["segments"] == d["segments"]


def test_public_names():
    assert gpumemviz.load_snapshot is load_snapshot
    assert gpumemviz.save_snapshot is save_snapshot
    assert gpumemviz.Snapshot is Snapshot and gpumemviz.SnapshotError is SnapshotError
    assert issubclass(SnapshotError, ValueError)


def test_save_replaces_atomically_and_keeps_mode(tmp_path):
    path = tmp_path / "s.pickle"
    path.write_bytes(b"old")
    path.chmod(0o640)
    save_snapshot(minimal(), path)
    assert load_snapshot(path).to_torch() == minimal()
    assert path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pickle"]


@pytest.mark.parametrize("suffix", [".pickle", ".json"])
def test_failed_save_leaves_old_file_and_no_temp(tmp_path, monkeypatch, suffix):
    path = tmp_path / f"run{suffix}"
    save_snapshot(minimal(), path)
    before = path.read_bytes()
    writer = "_write_json" if suffix == ".json" else "_write_pickle"

    def half_then_fail(data, f):
        f.write(b"\x80\x04partial")
        raise OSError("disk full")

    monkeypatch.setattr(snapshot_files, writer, half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        save_snapshot(synthetic(100), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_failed_fsync_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "run.pickle"
    save_snapshot(minimal(), path)
    before = path.read_bytes()

    def fail(fd):
        raise OSError("I/O error")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="I/O error"):
        save_snapshot(synthetic(100), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_os_errors_name_the_target_and_the_reason_not_the_temp_file(tmp_path, monkeypatch):
    def write(f):
        f.write(b"x")

    missing = tmp_path / "missing" / "x.html"
    with pytest.raises(FileNotFoundError) as e:
        gio.atomic_write(missing, write)
    assert str(e.value) == (
        f"cannot write {missing}: folder {missing.parent}: No such file or directory"
    )
    assert e.value.errno == 2

    with pytest.raises(FileNotFoundError, match=r"^cannot write /proc/x\.csv: folder /proc: "):
        gio.atomic_write("/proc/x.csv", write)

    folder = tmp_path / "a_dir"
    folder.mkdir()
    with pytest.raises(IsADirectoryError) as e:
        gio.atomic_write(folder, write)
    assert str(e.value) == f"cannot write {folder}: Is a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir"]  # no temp left

    path = tmp_path / "run.pickle"

    def full(f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")  # a real OS error from inside the writer

    with pytest.raises(OSError) as e:
        gio.atomic_write(path, full)
    assert str(e.value) == f"cannot write {path}: No space left on device"
    assert e.value.errno == 28 and ".tmp" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir"]

    def mine(f):
        raise OSError("disk full")  # the caller's own error (no errno) passes unchanged

    with pytest.raises(OSError) as e:
        gio.atomic_write(path, mine)
    assert str(e.value) == "disk full"


def test_json_refuses_bytes_values_cleanly(tmp_path):
    d = minimal()
    d["blob"] = b"\x00"
    with pytest.raises(SnapshotError, match=r"^cannot write JSON: .*bytes.*save as \.pickle"):
        save_snapshot(d, tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []
    save_snapshot(d, tmp_path / "x.pickle")
    assert load_snapshot(tmp_path / "x.pickle").to_torch() == d


# --- fuzz-found regressions (tests/data/fuzz/, tools/fuzz.py) --------------------------------

FUZZ = Path(__file__).parents[1] / "data" / "fuzz"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("memo_index_256mib.pickle", "memo index 16777216 at byte 3 is beyond"),
        ("binbytes8_huge_length.pickle", "BINBYTES8 at byte 2 declares 1099511627776 bytes"),
        ("scalar_none.pickle", "not a snapshot: a NoneType"),
        ("float_newline_message.pickle", "could not convert string to float"),
        ("global_name_newline.pickle", "refused global gpumem\\niz_fuzz_canary.trip"),
        ("segment_type_list.pickle", "unknown segment_type []"),
        ("trace_action_list.json", "action ['alloc'] is not a string"),
        ("pool_id_overflow.pickle", "is not a pair of 64-bit ints"),
        ("roundup_divisions_dict.json", "roundup_power2_divisions['1'] is {}, not 0 or a power"),
        ("roundup_divisions_inf.pickle", "roundup_power2_divisions['512'] is -inf, not 0"),
    ],
)
def test_fuzz_reproducers_get_one_line_errors(name, message):
    with pytest.raises(SnapshotError) as e:
        load_snapshot(FUZZ / name)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_ext_opcodes_never_reach_copyregs_cache(tmp_path):
    import copyreg

    marker = tmp_path / "ran"
    code = 0xBEEF
    copyreg.add_extension("os", "mkdir", code)
    try:
        # EXT2 0xBEEF (os.mkdir), the marker's path, TUPLE1, REDUCE, STOP
        data = b"\x80\x02\x83\xef\xbe" + pickle.dumps(str(marker), 2)[2:-1] + b"\x85R."
        pickle.loads(data)  # fills copyreg's extension cache, as any code in the process may
        assert code in copyreg._extension_cache and marker.is_dir()
        marker.rmdir()
        with pytest.raises(SnapshotError, match=r"^refused global by extension code"):
            loads_restricted(data)  # the C unpickler would take os.mkdir from the cache
        assert not marker.exists()
    finally:
        copyreg.remove_extension("os", "mkdir", code)


def test_odd_values_in_a_dict_get_one_line_errors():
    deep: list = []
    for _ in range(100_000):  # a caller's dict is not depth-checked: messages must not recurse
        deep = [deep]
    block = {"size": 512, "state": "inactive"}
    seg = {"address": 0, "total_size": 1024, "blocks": [block, block]}
    cases = [
        (dict(seg, segment_type=deep), "unknown segment_type [[[[...]]]]"),
        (dict(seg, address=deep), "address is [[[[...]]]], not a 64-bit integer"),
        (dict(seg, device=deep), "(device [[[[...]]]], 0x0): device is [[[[...]]]], not"),
        (dict(seg, segment_pool_id=deep), "segment_pool_id [[[[...]]]] is not a pair"),
        (dict(seg, blocks=[dict(block, state=deep)] * 2), "has unknown state [[[[...]]]]"),
        # equal-length lists as sizes made a 2-D column: numpy's "out is the wrong size"
        (dict(seg, blocks=[dict(block, size=[512, 1])] * 2), "size is [512, 1], not a 64-bit"),
    ]
    for bad, message in cases:
        with pytest.raises(SnapshotError) as e:
            Snapshot.from_torch([bad])
        assert message in str(e.value) and "\n" not in str(e.value)


def test_read_asks_only_for_the_file_size(tmp_path, monkeypatch):
    p = tmp_path / "s.pkl"
    p.write_bytes(pickle.dumps({"segments": []}, protocol=4))
    asked = []
    real_open = Path.open

    def spy_open(self, *a, **k):
        f = real_open(self, *a, **k)
        real_read = f.read
        monkeypatch.setattr(f, "read", lambda n=-1: (asked.append(n), real_read(n))[1])
        return f

    monkeypatch.setattr(Path, "open", spy_open)
    load_snapshot(p)
    assert asked == [p.stat().st_size + 1]


#: State-only files of thousands of blocks: kkaitlyn111's is CI-only, ZijianDu's ships.
STATE_ONLY = [
    "kkaitlyn111__cs336-a2-systems__memory_snapshot.pickle",
    "ZijianDu__Attention__memory.7e5ba324.pickle",
]


@pytest.mark.parametrize("name", STATE_ONLY, ids=lambda n: n.split("__")[0])
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_the_opcode_scan_passes_real_pickles_of_every_protocol(protocol, name):
    # protocols 0-3 memoize with PUT/BINPUT/LONG_BINPUT (indices in the thousands here), 4-5
    # with MEMOIZE and frames; bytes and long strings take the counted-length opcodes
    # (protocols 0-2 pickle bytes through a global, refused like any other)
    d = read_real(real_file(name))
    d["extra"] = ["x" * 70_000, -(2**70)] + ([b"\x00" * 300] if protocol >= 3 else [])
    data = pickle.dumps(d, protocol=protocol)
    gio.scan_pickle(data)
    assert load_snapshot(data).to_torch() == d


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x80\x02]r\xff\xff\xff\xff.", "memo index 4294967295 at byte 3 is beyond"),  # 64 GiB
        (b"(lp16_777_216\n.", "memo index 16777216 at byte 2"),  # PUT, as int() reads it
        (b"(lp+16777216\n.", "memo index 16777216 at byte 2"),
        (b"\x80\x03B\xff\xff\xff\x7fab.", "BINBYTES at byte 2 declares 2147483647 bytes"),
        (b"\x80\x04\x8d\x00\x00\x00\x00\x01\x00\x00\x00ab.", "BINUNICODE8 at byte 2 declares"),
        (b"\x80\x05\x96\x00\x00\x00\x00\x00\x01\x00\x00ab.", "BYTEARRAY8 at byte 2 declares"),
        (b"\x80\x02\x82\x01)R.", "refused global by extension code (EXT1 at byte 2)"),
        (b"\x80\x02\x84\x01\x00\x00\x00)R.", "refused global by extension code (EXT4 at byte 2)"),
    ],
)
def test_the_opcode_scan_refuses_bombs_before_unpickling(data, message):
    with pytest.raises(SnapshotError) as e:
        loads_restricted(data)
    assert message in str(e.value)
    with pytest.raises(SnapshotError) as e:
        load_snapshot(data)
    # without the PROTO opcode up front, load_snapshot takes it for text: "not a pickle"
    assert (message if data[:1] == b"\x80" else "not a pickle or JSON") in str(e.value)


def test_text_is_not_a_pickle_even_when_it_scans_like_a_memo_bomb():
    with pytest.raises(
        SnapshotError, match=r"^not a pickle or JSON snapshot \(starts with b'error"
    ):
        load_snapshot(b"error: the run failed\n")


def test_an_opcode_straddling_a_frame_end_is_read_as_the_scan_reads_it():
    # fuzz-found: LONG_BINPUT's index runs past its FRAME's end; through a BytesIO the C
    # unpickler read the index from the bytes after the frame (0x58280000: 22 GiB of memo),
    # a parse the opcode scan did not see. Fed the whole buffer, it parses front to back like
    # the scan (and pickletools) and stops at the same unknown opcode. Run under an
    # address-space cap, so a regression fails instead of exhausting the machine.
    import subprocess
    import sys

    path = str(FUZZ.parent / "io_frame_straddle_memo.pickle")
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from gpumemviz.io import loads_restricted\n"
        "try:\n"
        f"    loads_restricted(open({path!r}, 'rb').read())\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    # the memo index (8190, in an 8190-byte file) is now refused by the scan itself: a real
    # pickle spends at least two bytes per memo entry
    assert out.stdout.strip().startswith(
        "SnapshotError corrupt pickle (memo index 8190 at byte 47 is beyond what a 8190-byte"
    )


def test_a_string_straddling_a_frame_end_reads_as_pickle_loads_reads_it():
    # FRAME of 4 bytes holding SHORT_BINUNICODE's opcode, length and "he"; "llo" follows the
    # frame. pickle.loads reads "hello"; a BytesIO-fed unpickler drops the frame's rest.
    data = b"\x80\x04\x95" + (4).to_bytes(8, "little") + b"\x8c\x05he" + b"llo."
    assert gio.scan_pickle(data) == [(2, 11)]
    assert loads_restricted(data) == pickle.loads(data) == "hello"
