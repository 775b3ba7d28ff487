"""The fields newer torch records, one synthetic file per field written as torch writes it
(`_snapshot()`'s dict, pickled with protocol 4): each is read exactly, shown by `inspect`, used
by `Findings` where it answers a question, and round-tripped by export; unknown keys are
carried and crash nothing."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from gpumemviz.analysis.findings import OVERFLOWED, analyze
from gpumemviz.analysis.holders import HOLDER_KEYS
from gpumemviz.cli import main
from gpumemviz.io import load_snapshot
from gpumemviz.reporting.export import export
from torch_fields import SEG1, USER, MiB, torch_file

FX = {
    **USER,
    "fx_node_op": "call_function",
    "fx_node_name": "linear",
    "fx_node_target": "aten.mm",
    "fx_original_trace": "model.py:10 in forward",
}

#: One file per new field: (the change, the phrase `inspect` shows, a key `recorded` counts).
CASES = {
    "user_metadata str": (
        {"entries": {1: {"user_metadata": "phase=fwd"}}},
        "1 entries with user_metadata",
        "user_metadata",
    ),
    "user_metadata dict": (
        {"entries": {1: {"user_metadata": {"phase": "bwd", "layer": 3}}}},
        "1 entries with user_metadata",
        "user_metadata",
    ),
    "user_metadata JSON text": (
        {"entries": {1: {"user_metadata": '{"phase": "bwd"}'}}},
        "1 entries with user_metadata",
        "user_metadata",
    ),
    "internal_metadata": (
        {"entries": {1: {"internal_metadata": "fsdp.all_gather"}}},
        "1 entries with internal_metadata",
        "internal_metadata",
    ),
    "annotate": (
        {
            "extra_entries": [
                {
                    "action": "annotate",
                    "addr": SEG1,
                    "size": 0,
                    "stream": 0,
                    "time_us": 1_700_000_000_000_009,
                    "user_metadata": "weights",
                }
            ]
        },
        "1 annotate entries",
        "annotate",
    ),
    "pool_id": (
        {"entries": {i: {"pool_id": (1, 0) if i >= 6 else (0, 0)} for i in range(8)}},
        "8 entries with their pool_id",
        "pool_id",
    ),
    "forward_frames": (
        {
            "entries": {
                2: {"forward_frames": [{"filename": "/w/model.py", "line": 40, "name": "forward"}]}
            }
        },
        "1 backward allocations with their forward stack (forward_frames)",
        "forward_frames",
    ),
    "fx fields": ({"frames": [FX]}, "8 entries with FX node fields", "fx"),
    "trace_alloc_overflowed": (
        {"settings": {"trace_alloc_overflowed": True, "trace_alloc_max_entries": 8}},
        "the trace lost its oldest entries",
        None,
    ),
    "unknown keys": (
        {
            "top": {"device_memory": {"0": 80 << 30}},
            "segment": {"registration_counter": 3},
            "block": {"tensor_id": 7},
            "extra_entries": [
                {
                    "action": "prefetch",
                    "addr": SEG1,
                    "size": 0,
                    "stream": 0,
                    "time_us": 1_700_000_000_000_010,
                    "novel": [1, 2],
                }
            ],
        },
        "device 0: reserved 22.00 MiB",
        None,
    ),
}


@pytest.fixture(params=sorted(CASES))
def case(request, tmp_path) -> tuple[str, dict, Path]:
    d = torch_file(**CASES[request.param][0])
    path = tmp_path / "new.pickle"
    path.write_bytes(pickle.dumps(d, protocol=4))
    return request.param, d, path


def test_each_field_is_read_exactly_and_carried(case):
    _, d, path = case
    assert load_snapshot(path).to_torch() == d


def test_each_field_is_shown_by_inspect(case, capsys):
    name, _, path = case
    _, phrase, key = CASES[name]
    assert main(["inspect", str(path)]) == 0
    assert phrase in capsys.readouterr().out
    assert main(["inspect", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    if key is not None:
        assert key in out["recorded"]
    for by in HOLDER_KEYS:  # every grouping still accounts for every allocated byte
        assert sum(r["bytes"] for r in out["holders"][by]) == out["figures"]["allocated"]


def test_each_field_round_trips_through_export(case, tmp_path):
    _, d, path = case
    out = export(path, tmp_path / "out.pickle")
    with out.open("rb") as f:
        assert pickle.load(f) == d
    as_json = export(path, tmp_path / "out.json")
    plain = json.loads(json.dumps(d))  # tuples read back as lists
    assert json.loads(json.dumps(load_snapshot(as_json).to_torch())) == plain


def test_user_metadata_and_annotations_name_their_blocks():
    f = analyze(torch_file(entries={1: {"user_metadata": "phase=fwd"}}))
    rows = {r.key: (r.bytes, r.count) for r in f.holders("user_metadata")}
    assert rows == {"phase=fwd": (4 * MiB, 1), None: (2 * MiB + 512, 2)}
    f = analyze(torch_file(entries={1: {"user_metadata": {"phase": "bwd", "layer": 3}}}))
    assert f.holders("user_metadata")[0].key == '{"layer": 3, "phase": "bwd"}'
    note = {"action": "annotate", "addr": SEG1, "size": 0, "stream": 0, "user_metadata": "w"}
    f = analyze(torch_file(extra_entries=[note]))
    assert [(r.key, r.bytes) for r in f.holders("annotation")] == [
        ("w", 4 * MiB),
        (None, 2 * MiB + 512),
    ]


def test_pool_stream_frame_and_call_path_rows():
    f = analyze(torch_file())
    assert [(r.key, r.bytes) for r in f.holders("pool")] == [((0, 0), 6 * MiB), ((1, 0), 512)]
    assert [(r.key, r.count) for r in f.holders("stream")] == [(0, 3)]
    assert [(r.key, r.bytes) for r in f.holders("frame")] == [("/w/train.py:88", 6 * MiB + 512)]
    (path,) = f.holders("call_path")
    assert path.key == ("/w/train.py:88",) and path.to_dict()["key"] == ["/w/train.py:88"]


def test_holders_at_an_entry_read_the_replayed_state():
    f = analyze(torch_file(entries={1: {"user_metadata": "phase=fwd"}}))
    at3 = f.holders("user_metadata", at=3)  # A, B and the 1 MiB transient alive
    assert {r.key: r.bytes for r in at3} == {"phase=fwd": 4 * MiB, None: 3 * MiB}
    assert sum(r.bytes for r in f.holders("frame", at=1)) == 4 * MiB
    with pytest.raises(ValueError, match="entries 0 to 7"):
        f.holders("frame", at=8)
    with pytest.raises(ValueError, match="by is one of"):
        f.holders("line")


def test_overflow_is_said_plainly():
    f = analyze(torch_file(settings={"trace_alloc_overflowed": True}))
    assert OVERFLOWED in f.notes
    assert OVERFLOWED not in analyze(torch_file()).notes
