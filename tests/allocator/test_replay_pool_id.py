"""Per-entry ``pool_id`` (newer torch writes one on every trace entry) in replay: where entries
carry it, it is each alloc's pool, the inference from surviving segments filling in only where
they do not (allocator/replay/pools.py); and an alloc the model places in another pool than
the recorded one is a miss of the fidelity check. Files built as torch writes them
(tests/snapshot/torch_fields.py)."""

from __future__ import annotations

from gpumemviz.allocator.config import AllocatorConfig
from gpumemviz.allocator.replay import replay
from gpumemviz.allocator.replay.driver import drive
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.io import load_snapshot
from torch_fields import MiB, torch_file

SEG3 = 0x7F0002000000  # a third pool's small segment, released before the snapshot


def _with_gone_pool(pool_ids: bool) -> dict:
    """torch_file's trace, then pool (2, 0) allocates 512 B in a segment of its own, frees it,
    and (its MemPool deleted) the segment is released: the snapshot no longer shows it, so
    inference guesses the pool of the alloc before it, (1, 0). The transient at entries 3-5
    is 3 MiB here (torch_file's 1 MiB would be a small-pool request in a large segment)."""
    d = torch_file(entries={i: {"pool_id": (1, 0) if i >= 6 else (0, 0)} for i in range(8)})
    for e in d["device_traces"][0][3:6]:
        e["size"] = 3 * MiB
    trace = d["device_traces"][0]
    moves = [("segment_alloc", 2 * MiB), ("alloc", 512), ("free_requested", 512),
             ("free_completed", 512), ("segment_free", 2 * MiB)]  # fmt: skip
    like = {k: v for k, v in trace[-1].items() if k != "pool_id"}  # its stack, stream, ...
    gone = [
        {**like, "action": a, "addr": SEG3, "size": size, "time_us": like["time_us"] + t}
        for t, (a, size) in enumerate(moves, 1)
    ]
    trace += gone
    for e in trace:
        if pool_ids:
            e.setdefault("pool_id", (2, 0))
        else:
            e.pop("pool_id", None)
    return d


def test_an_entrys_pool_id_is_its_pool_and_inference_the_fallback():
    named = Recording.from_snapshot(_with_gone_pool(True)).pools
    guessed = Recording.from_snapshot(_with_gone_pool(False)).pools
    assert named is not None and guessed is not None
    assert named.alloc[7] == guessed.alloc[7] == (1, 0)
    assert named.alloc[9] == (2, 0) and named.segment(SEG3, 8) == (2, 0)
    assert guessed.alloc[9] == (1, 0)  # the inference's guess: the pool of the alloc before
    assert named.alloc[1] is None  # (0, 0): the default pools


def test_replay_with_pool_ids_places_every_alloc_in_its_recorded_pool():
    for d in (_with_gone_pool(True), load_snapshot(_with_gone_pool(True))):
        r = replay(d)
        assert (r.allocs, r.allocs_matched, r.allocs_matched_per_decision) == (5, 5, 5)
        assert r.devices[0].mismatches == []
    r = replay(_with_gone_pool(False))  # the guess puts the 512 B into pool (1, 0)'s segment
    assert r.allocs_matched == 4


def test_an_alloc_in_another_pool_than_recorded_is_a_miss():
    """The model places alloc 9 in pool (2, 0) at the recorded address; had its entry recorded
    pool (5, 0), that is a miss: the check reads the pool the model placed it in."""
    tl = Recording.from_snapshot(_with_gone_pool(True))
    assert tl.pools is not None and tl.pools.recorded is not None
    rec, _ = drive(tl, AllocatorConfig(), None)
    assert (rec.allocs_matched, rec.mismatches) == (5, [])
    tl.pools.recorded[9] = (5, 0)
    rec, _ = drive(tl, AllocatorConfig(), None)
    assert rec.allocs_matched == 4
    assert rec.mismatches == [(9, "pool", "model placed it in pool (2, 0), recorded pool (5, 0)")]
