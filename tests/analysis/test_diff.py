"""diff.py: two real files, a real file against an edited copy, and the allocator model around
an empty_cache."""

from __future__ import annotations

import copy
import json

import pytest

from conftest import read_real, real_file, standin_file
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.analysis.diff import FIGURES, diff
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.analysis.holders import live_holders
from gpumemviz.io import load_snapshot

MiB = 1 << 20


EXPANDABLE_OOM = "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"
FORWARD_2_7B = "kkaitlyn111__cs336-a2-systems__memory_2.7b_forward.pickle"
WEDSONLIN = "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
SILMONT = "silmont2000__assignment2-systems__memory_forward_fp32_128.pickle"

#: A (3 devices, expandable, device 3 idle) against B (device 0 only): the real pair is
#: CI-only; the stand-in against a shipped file is the same case in every clone.
TWO_FILES = {
    "real": lambda: (real_file(EXPANDABLE_OOM), real_file(FORWARD_2_7B)),
    "standin": lambda: (standin_file("expandable_oom_3dev"), real_file(WEDSONLIN)),
}
#: Files with many live blocks on device 0 (2.7b forward: CI-only; the stand-in's top site
#: has a stack, Wedsonlin's top site is the stackless one).
EDITED = {
    "real": lambda: real_file(FORWARD_2_7B),
    "shipped": lambda: real_file(WEDSONLIN),
    "standin": lambda: standin_file("training_10k"),
}


def _count(raw, device: int) -> int:
    return sum(1 for s in raw["segments"] if s["device"] == device)


@pytest.mark.parametrize("which", sorted(TWO_FILES))
def test_two_real_files(which):
    pa, pb = TWO_FILES[which]()
    ra, rb = read_real(pa), read_real(pb)
    d = diff(pa, pb, top=None)
    fa, fb = fragmentation(load_snapshot(pa)), fragmentation(load_snapshot(pb))
    assert sorted(d.devices) == [0, 1, 2]
    assert [d.devices[n].present for n in (0, 1, 2)] == ["both", "a", "a"]
    for n, dev in d.devices.items():
        for name in FIGURES:
            ch = dev.figure(name)
            before = getattr(fa.devices[n], name)
            after = getattr(fb.devices[n], name) if n in fb.devices else 0
            assert (ch.before, ch.after) == (before, after)
            assert ch.delta == after - before
        s = dev.segments
        assert s.added + s.kept + s.resized == _count(rb, n)
        assert s.removed + s.kept + s.resized == _count(ra, n)
        # every live byte that moved is in some site's change
        moved = sum(c.delta for c in dev.holders_grew) + sum(c.delta for c in dev.holders_shrank)
        assert moved == dev.figure("allocated").delta
    assert d.devices[1].figure("reserved").after == 0
    assert d.devices[1].segments.removed == _count(ra, 1)
    assert [f.name for f in d.total] == list(FIGURES)
    assert d.total[0].before == fa.total.reserved
    out = json.loads(json.dumps(d.to_dict()))
    assert (
        out["devices"]["0"]["figures"]["reserved"]["delta"] == fb.reserved - fa.devices[0].reserved
    )
    text = d.text()
    assert text.startswith("total") and "device 1 (only in A)" in text
    assert "holders that grew most:" in text
    with pytest.raises(ValueError, match="no device 7"):
        d.device(7)


@pytest.mark.parametrize("which", sorted(EDITED))
def test_sites_that_grew_and_shrank_on_an_edited_real_file(which):
    path = EDITED[which]()
    raw = read_real(path)
    top = live_holders(raw, top=1)[0]
    freed = copy.deepcopy(raw)
    snap = load_snapshot(path)
    targets = set(snap.blocks.address[top.indices].tolist())
    for seg in freed["segments"]:
        for b in seg["blocks"]:
            if b["address"] in targets:
                b["state"] = "inactive"
                seg["allocated_size"] -= b["size"]
                seg["active_size"] -= b["size"]
                seg["requested_size"] -= b["requested_size"]
                b["frames"] = []
    load_snapshot(freed)  # still a consistent snapshot
    d = diff(raw, freed).device(0)
    assert d.holders_grew == ()
    assert (d.holders_shrank[0].key, d.holders_shrank[0].delta) == (top.key, -top.bytes)
    assert d.holders_shrank[0].after == 0 and d.holders_shrank[0].count_before == top.count
    assert d.figure("allocated").delta == -top.bytes
    assert d.figure("reserved").delta == 0 and d.segments.kept == _count(raw, 0)
    back = diff(freed, raw).device(0)
    assert (back.holders_grew[0].key, back.holders_grew[0].delta) == (top.key, top.bytes)
    assert top.label in back.text()


def test_model_before_and_after_empty_cache():
    m = CachingAllocator(8 << 30)
    sizes = [3 * MiB, 700, 25 * MiB, 4096, 90 * MiB, 1 * MiB, 12 * MiB, 300_000]
    ptrs = [m.malloc(s) for s in sizes * 4]
    for p in ptrs[::2]:
        m.free(p)
    for p in ptrs[1:12:2]:
        m.free(p)
    before = m.snapshot(record=False)
    allocated = m.allocated
    released = m.empty_cache()
    after = m.snapshot(record=False)
    assert released > 0
    d = diff(before, after)
    dev = d.device(0)
    assert dev.present == "both"
    assert dev.figure("reserved").delta == -released
    assert dev.figure("allocated").delta == 0 and dev.figure("allocated").after == allocated
    assert dev.figure("releasable").before == released and dev.figure("releasable").after == 0
    assert dev.segments.added == 0 and dev.segments.resized == 0
    assert dev.segments.removed_bytes == released
    assert dev.segments.kept == len(after["segments"])
    assert dev.holders_grew == () and dev.holders_shrank == ()
    assert "-" in dev.figure("reserved").text()
    # and the other way round: what a step that allocates again looks like
    grow = diff(after, before).device(0)
    assert grow.segments.added_bytes == released and grow.segments.removed == 0


def test_identical_and_empty():
    path = real_file(SILMONT)
    same = diff(path, read_real(path)).device(0)
    assert all(f.delta == 0 for f in same.figures)
    assert same.holders_grew == () == same.holders_shrank
    assert diff([], []).devices == {}
    assert diff([], []).text() == "no devices in either snapshot"
