"""The offline HTML report (gpumemviz.reporting.html_report): contents, size budget, escaping,
writing.

The page itself is opened in headless Chromium by tests/browser/test_report_browser.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import gpumemviz
from conftest import read_real
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.io import load_snapshot, save_snapshot
from gpumemviz.render.wire_frame import decode_frame
from gpumemviz.reporting.html_report import (
    ANALYSIS_ALLOWANCE,
    SIZE_FACTOR,
    TIMELINE_POINTS,
    render_html,
    renderer_size,
    report,
)
from gpumemviz.snapshot import Snapshot, SnapshotError

MIB = 1 << 20
_DATA = re.compile(r'<script type="application/json" id="gmv-data">(.*?)</script>', re.S)
EVIL = "</script><script>window.__pwned=1</script><!--"


def page_data(text: str) -> dict:
    """The JSON the page embeds, read back as the browser's JSON.parse would."""
    found = _DATA.findall(text)
    assert len(found) == 1
    return json.loads(found[0])


def decoded_map(data: dict) -> dict:
    import base64

    m = data["map"]
    return decode_frame(m["content"], [base64.b64decode(b) for b in m["buffers"]])


def budget(input_size: int) -> int:
    return SIZE_FACTOR * input_size + renderer_size() + ANALYSIS_ALLOWANCE


def evil_snapshot() -> dict:
    """A model snapshot whose allocated blocks carry frames with `</script>` in them."""
    a = CachingAllocator(1 << 30)
    for size in (3 * MIB, 5 * MIB, 700):
        a.malloc(size)
    snap = a.snapshot()
    frame = {"filename": f"/home/someone/train{EVIL}.py", "line": 7, "name": EVIL}
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                b["frames"] = [frame]
    snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = EVIL
    return snap


def big_snapshot(n_blocks: int, per_segment: int, seed: int = 0) -> Snapshot:
    """A synthetic snapshot of n_blocks blocks, `per_segment` to a segment."""
    rng = np.random.default_rng(seed)
    nseg = n_blocks // per_segment
    size = rng.integers(1, 4096, n_blocks) * 512
    state = rng.choice([0, 1, 1, 2], n_blocks).astype(np.uint8)
    req = np.where(state > 0, size - rng.integers(0, 512, n_blocks), 0)
    total = np.add.reduceat(size, np.arange(0, n_blocks, per_segment))
    addr = (1 << 44) + np.concatenate([[0], np.cumsum(total + (2 << 20))[:-1]])
    return Snapshot.from_columns(
        device=np.zeros(nseg, np.int64),
        address=addr,
        total_size=total,
        stream=np.zeros(nseg, np.int64),
        is_small=np.zeros(nseg, bool),
        block_count=np.full(nseg, per_segment),
        size=size,
        requested_size=req,
        state=state,
    )


def test_every_real_file_reports_every_segment_within_budget(recorded_path: Path, tmp_path):
    out = report(recorded_path, tmp_path / "r.html")
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>")
    assert len(text.encode()) <= budget(recorded_path.stat().st_size)
    snap = load_snapshot(recorded_path)
    data = page_data(text)
    assert data["map"]["layout"]["n_rows"] == snap.n_segments
    frame = decoded_map(data)
    assert len(frame["rows"]) == snap.n_segments
    frag = fragmentation(snap)
    assert data["header"]["reserved"] == frag.reserved
    assert data["header"]["allocated"] == frag.allocated
    for d, figs in data["devices"].items():
        assert figs["reserved"] == frag.device(int(d)).reserved
    # settings the file does not record are shown as not recorded, not as PyTorch's defaults
    raw = read_real(recorded_path)
    recorded = isinstance(raw, dict) and raw.get("allocator_settings") is not None
    assert (data["settings"] is not None) == recorded
    # the page loads nothing: no URL to fetch anything from
    # a tag attribute or a property assignment that loads something (`<img src=`, `x.href =`),
    # not a comparison (`a.src === b`) or a variable that happens to be called src
    loads = (
        r"""<[a-zA-Z][^>\n]*\s(src|href)\s*=|\.(src|href)\s*=(?!=)|@import|url\("""
        r"""|https?://[^\s"'<)]*\.(js|css)"""
    )
    assert not re.search(loads, text)


@pytest.mark.parametrize("pending", [False, True])
def test_stuck_free_is_what_empty_cache_leaves_and_trapped_stays_inactive_split(tmp_path, pending):
    """Expandable segments: sub-page slivers stay free after empty_cache but are not torch's
    inactive_split_bytes; the table shows both, each checked against the model itself."""
    from gpumemviz.render.rows import build_rows

    a = CachingAllocator(8 << 30, config="expandable_segments:True")
    ptrs = [a.malloc(30 * MIB + 4096) for _ in range(6)]
    for p in ptrs[::2]:
        if pending:
            a.record_stream(p, 7)  # freed, waiting on an event of stream 7
        a.free(p)
    stats = a.memory_stats()
    snap = Snapshot.from_torch(a.snapshot())
    data = page_data(report(snap, tmp_path / "e.html").read_text(encoding="utf-8"))
    figs = data["devices"]["0"]
    assert figs["free_trapped"] == stats["inactive_split_bytes.all.current"] == 0
    assert (figs["pending_free"] > 0) == pending
    a.empty_cache()
    after = a.memory_stats()
    left = after["reserved_bytes.all.current"] - after["allocated_bytes.all.current"]
    assert figs["free_stuck"] == left > 0
    assert data["total"]["free_stuck"] == left
    if not pending:  # the map paints the same bytes trapped
        assert build_rows(snap, device=0).totals()["free_trapped"] == left


def test_timeline_follows_the_trace(tmp_path):
    a = CachingAllocator(1 << 30)
    ptrs = [a.malloc(s * MIB) for s in (1, 30, 50)]
    for p in ptrs:
        a.free(p)
    a.empty_cache()
    data = page_data(render_html(a.snapshot()))
    (tl,) = data["timeline"].values()
    n = len(a.snapshot()["device_traces"][0]) - 1  # the second snapshot() added an entry
    assert tl["entries"] == n
    import base64

    reserved = np.frombuffer(base64.b64decode(tl["reserved"]), "<f8")
    assert reserved.max() == (2 + 30 + 50) * MIB  # a 2 MiB small segment, 30 and 50 MiB large
    assert reserved[-1] == 0


def test_script_end_in_frame_names_and_settings_stays_data(tmp_path):
    snap = evil_snapshot()
    text = render_html(snap)
    # only the page's own elements close: one data block, one script
    assert text.count("</script") == 2
    assert "window.__pwned" in text  # present, but only inside JSON strings
    assert "<!--" not in text.split('id="gmv-data">', 1)[1]
    data = page_data(text)
    labels = [r["label"] for r in data["holders"]["by"]["call_path"]["rows"]]
    assert any(EVIL in label for label in labels)
    assert data["settings"]["PYTORCH_CUDA_ALLOC_CONF"] == EVIL
    titled = render_html(snap, title=EVIL)
    assert page_data(titled)["title"] == EVIL
    assert "<title>&lt;/script&gt;&lt;script&gt;" in titled and titled.count("</script") == 2


def test_large_snapshot_fits_its_budget_with_aggregated_rows(tmp_path):
    snap = big_snapshot(200_000, per_segment=2000)  # rows with more blocks than cells
    src = save_snapshot(snap, tmp_path / "big.pickle")
    out = report(src, tmp_path / "big.html")
    size = out.stat().st_size
    assert size <= budget(src.stat().st_size)
    frame = decoded_map(page_data(out.read_text()))
    assert len(frame["rows"]) == snap.n_segments == 100
    assert all(b is None for b in frame["blocks"])  # the hover shows cells there

    snap = big_snapshot(200_000, per_segment=20)  # small segments: exact blocks where they fit
    src = save_snapshot(snap, tmp_path / "big2.pickle")
    out = report(src, tmp_path / "big2.html")
    assert out.stat().st_size <= budget(src.stat().st_size)
    frame = decoded_map(page_data(out.read_text()))
    assert len(frame["rows"]) == 10_000
    assert sum(b is not None for b in frame["blocks"]) > 5_000


def test_written_atomically_and_bad_input_leaves_the_old_file(tmp_path):
    target = tmp_path / "r.html"
    target.write_text("old")
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle at all")
    with pytest.raises(SnapshotError) as e:
        report(bad, target)
    assert "\n" not in str(e.value)
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == sorted([bad, target]) or set(tmp_path.iterdir()) == {
        bad,
        target,
    }
    assert gpumemviz.report is report
    report(CachingAllocator(1 << 30).snapshot(), target)
    assert "gmv-data" in target.read_text()


def test_redact_paths_hides_user_names():
    snap = evil_snapshot()
    frame = {"filename": "/home/alice/proj/model.py", "line": 3, "name": "alice"}
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                b["frames"] = [frame]
    assert "alice" in render_html(snap)
    text = render_html(snap, redact_paths=True, title="/home/alice/run.pickle")
    assert "alice" not in text
    data = page_data(text)
    assert data["title"] == "~user1/run.pickle"
    assert [r["key"] for r in data["holders"]["by"]["frame"]["rows"]] == ["~user1/proj/model.py:3"]
    assert "sites" not in data  # the holders replace the table of top lines


def test_a_long_trace_keeps_its_size_budget_and_its_true_peaks(tmp_path):
    """10^5 trace entries: the timeline is a level-of-detail summary (at most TIMELINE_POINTS
    points per device), the page stays within the budget, and the points drawn hold the true
    highest and lowest reserved and allocated of the whole trace (the envelope keeps them)."""
    import base64
    import random

    rng = random.Random(3)
    a = CachingAllocator(1 << 40)
    live: list[int] = []
    peak_alloc = peak_res = 0
    low_alloc = low_res = None
    while a.trace_len() < 100_000:
        if live and (len(live) > 400 or rng.random() < 0.5):
            a.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(a.malloc(rng.randrange(1, 8 << 20)))
        if rng.random() < 0.0005:
            a.empty_cache()
        alloc, res = a.allocated, a.reserved
        peak_alloc, peak_res = max(peak_alloc, alloc), max(peak_res, res)
        if a.trace_len() > 1:  # after the first entry: the lows the trace shows
            low_alloc = alloc if low_alloc is None else min(low_alloc, alloc)
            low_res = res if low_res is None else min(low_res, res)
    src = save_snapshot(a.snapshot(record=False), tmp_path / "long.pickle")
    out = report(src, tmp_path / "long.html")
    assert out.stat().st_size <= budget(src.stat().st_size)
    (tl,) = page_data(out.read_text())["timeline"].values()
    assert tl["entries"] == a.trace_len()

    def column(name):
        return np.frombuffer(base64.b64decode(tl[name]), "<f8")

    x, reserved, allocated = column("x"), column("reserved"), column("allocated")
    assert 1000 <= len(x) <= TIMELINE_POINTS and np.all(np.diff(x) > 0)
    assert reserved.max() == peak_res and allocated.max() == peak_alloc
    assert reserved.min() <= low_res and allocated.min() <= low_alloc
