"""The offline HTML report in headless Chromium with the network off (issue 8, item 2).

Each page is opened from a file:// URL in an offline browser context whose every request is
recorded and, unless it is the report itself, aborted: a report that fetched anything would fail.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from gpumemviz.io import load_snapshot
from gpumemviz.reporting.html_report import report
from gpumemviz.snapshot.pools import pool_label
from test_report_html import EVIL, big_snapshot, evil_snapshot  # tests/ is on sys.path

# scroll the map from top to bottom; a row counts once it was drawn from data (not as empty)
_DRAW_ALL = """() => {
  const map = window.__gpumemviz.views.report.map;
  const seen = new Set();
  for (let r = 0; r < map.nRows; ) {
    map.scrollToRow(r);
    map.drawNow();
    const c = map.canvas.dataset;
    const first = Number(c.first), count = Number(c.count);
    if (Number(c.drawnRows) === count) for (let i = first; i < first + count; i++) seen.add(i);
    r = Math.max(r + 1, first + count);
  }
  map.scrollToRow(0);
  map.drawNow();
  return { drawn: seen.size, rows: map.nRows };
}"""


def open_offline(page, path: Path) -> dict:
    """Open a report with the network off; returns what the page tried to load and raised."""
    seen: dict = {"requests": [], "blocked": [], "errors": []}
    url = path.resolve().as_uri()

    def route(r):
        if r.request.url == url:
            r.continue_()
        else:
            seen["blocked"].append(r.request.url)
            r.abort()

    page.context.set_offline(True)
    page.route("**/*", route)
    page.on("request", lambda req: seen["requests"].append(req.url))
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.on("console", lambda m: m.type == "error" and seen["errors"].append(m.text))
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(url)
    page.wait_for_selector(".gmv-root[data-ready='1']", timeout=15_000)
    return seen


def test_real_file_report_draws_every_segment_offline(page, recorded_path, tmp_path, artifacts):
    out = report(recorded_path, tmp_path / "report.html")
    seen = open_offline(page, out)
    n_segments = load_snapshot(recorded_path).n_segments
    result = page.evaluate(_DRAW_ALL)
    assert result == {"drawn": n_segments, "rows": n_segments}
    assert page.locator(".gmv-root").get_attribute("data-rows") == str(n_segments)
    # hover over the first row names its segment; the zoom magnifies it
    box = page.evaluate("() => window.__gpumemviz.views.report.map.rowRect(0)")
    canvas = page.locator(".gmv-canvas")
    canvas.hover(position={"x": box["x"] + 3, "y": box["y"] + box["h"] / 2})
    assert page.locator(".gmv-scroll + .gmv-tip").inner_text().startswith("segment 0x")
    canvas.click(position={"x": box["x"] + 3, "y": box["y"] + box["h"] / 2})
    zoom = page.locator(".gmv-zoom-canvas")
    assert zoom.get_attribute("data-zoom") == "1.000"
    page.locator(".gmv-zoom-bar button", has_text="+").click()
    assert zoom.get_attribute("data-zoom") == "2.000"
    zoom.hover(position={"x": 20, "y": 10})
    assert page.locator(".gmv-zoom .gmv-tip").inner_text().startswith("segment 0x")
    assert page.locator("table[data-table=figures] tbody tr").count() >= 10
    # private pools (slime, verl): one row per pool, named as inspect names it
    pools = {tuple(p) for p in load_snapshot(recorded_path).segments.pool_id.tolist()}
    shown = page.locator("table[data-table=pools] tbody td:nth-child(2)").all_inner_texts()
    assert sorted(shown) == (sorted(map(pool_label, pools)) if pools != {(0, 0)} else [])
    # one panel timeline per traced device, every embedded point drawn, one mark per OOM
    traced = [d for d, t in load_snapshot(recorded_path).traces.items() if len(t)]
    assert page.locator(".gmv-report-timeline").count() == len(traced)
    page.wait_for_function(
        """() => [...document.querySelectorAll('.gmv-report-timeline canvas')]
            .every((c) => c.dataset.points !== undefined)"""
    )
    drawn = page.evaluate(
        """() => [...document.querySelectorAll('.gmv-report-timeline')].map((b) => {
            const t = window.__gpumemviz.report.data.timeline[b.dataset.device];
            const c = b.querySelector('canvas').dataset;
            return [Number(c.points), atob(t.x).length / 8, Number(c.marks), t.oom.length];
        })"""
    )
    for points, embedded, marks, ooms in drawn:
        assert points == embedded > 0 and marks == ooms
    page.screenshot(path=str(artifacts / f"report-{recorded_path.stem[:40]}.png"), full_page=True)
    assert seen["errors"] == []
    assert seen["blocked"] == []
    assert seen["requests"] == [out.resolve().as_uri()]


def test_script_end_in_a_frame_name_stays_text(page, tmp_path):
    out = report(evil_snapshot(), tmp_path / "evil.html")
    seen = open_offline(page, out)
    assert page.evaluate("() => window.__pwned") is None
    cell = page.locator("table[data-table=holders] tbody td").first
    assert EVIL in cell.inner_text()
    assert seen["errors"] == [] and seen["blocked"] == []


@pytest.mark.parametrize("n_blocks", [200_000])
def test_large_report_opens_and_draws(page, tmp_path, n_blocks):
    from gpumemviz.io import save_snapshot

    src = save_snapshot(big_snapshot(n_blocks, per_segment=20), tmp_path / "big.pickle")
    out = report(src, tmp_path / "big.html")
    seen = open_offline(page, out)
    last = page.evaluate(
        """() => { const m = window.__gpumemviz.views.report.map;
        m.scrollToRow(m.nRows - 1); m.drawNow(); return m.canvas.dataset.drawnRows; }"""
    )
    assert int(last) > 0
    assert seen["errors"] == [] and seen["blocked"] == []


def test_without_the_test_hooks_a_page_keeps_no_registry_or_log(browser, recorded_path, tmp_path):
    """The conftest's pages turn the hooks on; a plain page, as a user opens it, has neither."""
    out = report(recorded_path, tmp_path / "report.html")
    plain = browser.new_context()
    try:
        page = plain.new_page()
        seen = open_offline(page, out)
        assert seen["errors"] == [] and seen["blocked"] == []
        assert page.evaluate("() => typeof window.__gpumemviz") == "undefined"
    finally:
        plain.close()


RANKS = Path(__file__).resolve().parents[1] / "data" / "ranks_oom"


def test_a_folder_report_shows_the_ranks_worst_first_and_one_ranks_findings(page, tmp_path):
    """`gpumemviz report DIR -o x.html` on 4 per-rank files, one with an OOM: the grid lists
    the OOM rank first, says what differs, and a click on a rank opens its findings."""
    from gpumemviz.analysis.ranks import analyze_ranks
    from gpumemviz.cli import main

    out = tmp_path / "x.html"
    assert main(["report", str(RANKS), "-o", str(out)]) == 0
    seen = open_offline(page, out)
    assert seen["errors"] == [] and seen["blocked"] == []
    want = [r.rank for r in analyze_ranks(RANKS).ranks]
    rows = page.locator("table[data-table=ranks] tbody tr")
    assert rows.count() == 4
    got = [int(rows.nth(i).get_attribute("data-rank")) for i in range(4)]
    assert got == want and got[0] == 1  # rank 1 ran out: it comes first
    assert rows.nth(0).get_attribute("data-oom") == "1"
    assert all(rows.nth(i).get_attribute("data-oom") is None for i in range(1, 4))
    diffs = page.locator(".gmv-rank-differences li").all_inner_texts()
    assert "only rank 1 ran out of memory" in diffs
    # each rank's findings one click away: closed until its line is clicked
    details = page.locator("details.gmv-rank[data-rank='1']")
    assert details.get_attribute("open") is None
    assert not page.locator("details.gmv-rank[data-rank='1'] .gmv-oom-story").is_visible()
    rows.nth(0).click()
    assert details.get_attribute("open") is not None
    story = page.locator("details.gmv-rank[data-rank='1'] .gmv-oom-story")
    assert story.is_visible() and "OOM on cuda:0" in story.inner_text()
    figures = page.locator("table[data-table=rank-1-figures]").inner_text()
    assert "reserved" in figures and "18.39 GiB" in figures
    assert page.locator("details.gmv-rank[data-rank='0'] .gmv-oom-story").count() == 0
    # the page's own growth section: the worst rank's (nothing grows there)
    growth = page.locator("section[data-section=growth]")
    assert growth.locator(".gmv-growth-none").is_visible()


def _planted_leak() -> dict:
    """A training loop on the allocator model whose line 88 keeps each step's 64 MiB output
    from step 3 on (tests/analysis/test_growth.py plants the same leak), with its frames."""
    from gpumemviz.allocator.model import CachingAllocator
    from gpumemviz.allocator.oom import OutOfMemory

    mib = 1 << 20
    clock = [1_700_000_000_000_000]
    model = CachingAllocator(8 << 30, clock=lambda: clock[0])
    stacks: list[list[dict]] = []

    def malloc(size: int, line: int) -> int:
        clock[0] += 100
        addr = model.malloc(size)
        stacks.append([{"filename": "/w/train.py", "line": line, "name": "train_step"}])
        return addr

    def free(addr: int) -> None:
        clock[0] += 100
        model.free(addr)

    grads: list[int] = []
    with contextlib.suppress(OutOfMemory):  # a request too big: the trace's OOM entry says
        malloc(64 << 30, 7)  # how much memory the device has, what the forecast runs toward
    for step in range(1, 13):
        for g in grads:
            free(g)
        acts = [malloc(48 * mib, 20 + i) for i in range(3)]
        out = malloc(64 * mib, 88)
        grads = [malloc(32 * mib, 95) for _ in range(4)]
        if step < 3:
            free(out)
        for a in acts:
            free(a)
        clock[0] += 500_000
    d = model.snapshot(record=False)
    frames = iter(stacks)
    for e in d["device_traces"][0]:
        if e["action"] == "alloc":
            e["frames"] = next(frames)
    return d


def test_the_report_draws_the_growth_suspects_and_the_forecast(page, tmp_path):
    from gpumemviz.analysis.findings import analyze

    snap = _planted_leak()
    found = analyze(snap)
    (suspect,) = found.growth
    assert found.forecast is not None  # toward the device's memory the OOM entry gave
    out = report(snap, tmp_path / "leak.html")
    seen = open_offline(page, out)
    assert seen["errors"] == []
    lines = page.locator("section[data-section=growth] .gmv-growth li")
    assert lines.all_inner_texts() == [suspect.sentence]
    assert "per step at train.py:88:train_step, kept since step 3" in suspect.sentence
    assert lines.first.get_attribute("data-frame") == "/w/train.py:88"
    forecast = page.locator("section[data-section=growth] .gmv-forecast")
    assert forecast.inner_text() == f"Forecast: {found.forecast.sentence}."
    assert forecast.inner_text().startswith("Forecast: at this rate, OOM in about ")
