"""Private-pool recordings made on a real GPU (tests/data/gpu/, by tests/gpu/record_fixtures.py).

`mempool.pickle` (torch.cuda.MemPool with use_mem_pool, offload and reload, a deleted pool, a
no_split pool) and `cuda_graph.pickle` (a capture into a graph pool, a second graph sharing it)
are replayed: every alloc at its recorded address, each segment in the pool the file names; the
facts recorded beside them (`*.json`) are checked against the model's rules. Each test skips
with a one-line reason until a GPU machine has recorded the files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.replay import replay
from gpumemviz.io import load_snapshot

GPU_DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"
MIB = 1 << 20


def _recorded(name: str) -> tuple[dict, dict]:
    snap, facts = GPU_DATA / f"{name}.pickle", GPU_DATA / f"{name}.json"
    if not snap.exists() or not facts.exists():
        pytest.skip(
            f"not recorded yet: tests/data/gpu/{name}.pickle (run tests/gpu/record_fixtures.py)"
        )
    return load_snapshot(snap).to_torch(), json.loads(facts.read_text())


@pytest.mark.parametrize("name", ["mempool", "cuda_graph"])
def test_the_recording_replays_exactly_in_its_pools(name):
    snap, _ = _recorded(name)
    r = replay(snap)
    for dev, d in r.devices.items():
        assert d.allocs == d.allocs_matched == d.allocs_matched_per_decision, d.mismatches
        assert d.segments_matched == d.segments_recorded and d.final_matched, d.mismatches
        want = {s["address"]: tuple(s["segment_pool_id"]) for s in snap["segments"]
                if s["device"] == dev}  # fmt: skip
        assert {s["address"]: tuple(s["segment_pool_id"]) for s in d.final_segments} == want


def test_mempool_facts_follow_the_model_rules():
    _, facts = _recorded("mempool")
    assert facts["use_count_created"] == 1 and facts["use_count_inside"] == 2
    assert facts["reload_same_addresses"] is True  # the pool's cached blocks came back
    weights = ",".join(str(x) for x in facts["weights_pool"])
    kv = ",".join(str(x) for x in facts["kv_pool"])
    assert facts["pools_after_offload"][weights] > 0  # kept while the MemPool lives
    assert kv not in facts["pools_after_kv_deleted"]  # deleted, then emptied: gone
    assert facts["no_split_blocks"] == [2 * MIB]  # the whole small segment, not split
    # the model does the same with the same calls
    a = CachingAllocator(1 << 34)
    p = a.create_pool(no_split=True)
    with a.use_mem_pool(p):
        a.malloc(1000)
    (seg,) = a.pool_snapshot(p)
    assert [b["size"] for b in seg["blocks"]] == facts["no_split_blocks"]


def test_cuda_graph_pool_outlives_the_first_graph():
    _, facts = _recorded("cuda_graph")
    pool = ",".join(str(x) for x in facts["pool"])
    assert facts["pools_captured"][pool] > 0
    assert facts["pools_after_reset"][pool] == facts["pools_captured"][pool]
