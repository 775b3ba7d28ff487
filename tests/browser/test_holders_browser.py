"""Who holds the memory, in the browser (issue 32): the report's and the panel's holders view
show `gpumemviz.analyze(FILE).holders(by)`'s own numbers, the filter narrows the rows, and a
click in the panel marks exactly that holder's blocks in the segment map."""

from __future__ import annotations

import pytest

import gpumemviz
from conftest import real_file  # tests/ is on sys.path
from gpumemviz.analysis.holders import N_TOP, NO_STACK
from gpumemviz.reporting.html_report import report

from .test_panel_browser import VIEW, _wait_drawn
from .test_report_browser import open_offline

pytestmark = pytest.mark.browser

# shipped: verl's vLLM + Megatron worker, 534 allocated blocks in three pools, 21 frames and 31
# call paths holding them (more than the view's top rows: the rest keeps the sum exact)
FILE = real_file("volcengine__verl__mem_mempools.pickle")
KEYS = ("frame", "call_path", "pool")

# the table's rows as the page shows them, for the key chosen now
_TABLE = """(box) => {
  const rows = [...box.querySelectorAll("table[data-table=holders] tbody tr")];
  return {
    by: box.querySelector("table[data-table=holders]").dataset.by,
    rows: rows.filter((r) => !r.dataset.rest).map((r) => ({
      key: r.dataset.key, bytes: Number(r.dataset.bytes), count: Number(r.dataset.count) })),
    rest: rows.filter((r) => r.dataset.rest).map((r) => Number(r.dataset.bytes)),
  };
}"""
# the icicle: its top level and every node where a call path ends
_ICICLE = """(box) => {
  const top = [...box.querySelectorAll(".gmv-icicle-top > .gmv-icicle-node")];
  const ends = [...box.querySelectorAll(".gmv-icicle-node[data-index]")];
  return { top: top.map((n) => Number(n.dataset.bytes)),
           ends: ends.map((n) => [Number(n.dataset.index), Number(n.dataset.own)]) };
}"""


def expected(by: str) -> dict:
    rows = gpumemviz.analyze(FILE).holders(by)
    return {
        "rows": [(r.bytes, r.count) for r in rows[:N_TOP]],
        # a row without a key reads as holders_text's and inspect's: no stack, or not recorded
        "keys": [
            NO_STACK if r.key is None and by in ("frame", "call_path") else r.label
            for r in rows[:N_TOP]
        ],
        "rest": sum(r.bytes for r in rows[N_TOP:]),
        "allocated": sum(r.bytes for r in rows),
    }


def check_view(page, box_selector: str) -> None:
    """The view's table for each of `KEYS`, and its icicle, against the findings."""
    box = page.locator(box_selector)
    paths = gpumemviz.analyze(FILE).holders("call_path")
    for by in KEYS:
        box.locator("select.gmv-holders-key").select_option(by)
        got = box.evaluate(_TABLE)
        want = expected(by)
        assert got["by"] == by
        assert [(r["bytes"], r["count"]) for r in got["rows"]] == want["rows"]
        assert [r["key"] for r in got["rows"]] == want["keys"]
        assert sum(got["rest"]) == want["rest"]
        assert sum(r["bytes"] for r in got["rows"]) + sum(got["rest"]) == want["allocated"]
    icicle = box.evaluate(_ICICLE)
    assert sum(icicle["top"]) == expected("call_path")["allocated"]
    ends = dict(icicle["ends"])
    assert ends == {i: paths[i].bytes for i in range(min(N_TOP, len(paths)))}
    # the filter: only the rows whose key holds the text, and fewer of them
    box.locator("select.gmv-holders-key").select_option("frame")
    before = box.evaluate(_TABLE)["rows"]
    box.locator("input.gmv-holders-filter").fill("cache_engine")
    after = box.evaluate(_TABLE)["rows"]
    assert 0 < len(after) < len(before)
    assert all("cache_engine" in r["key"] for r in after)
    assert box.evaluate(_TABLE)["rest"] == []  # the rest is not one of the matches
    box.locator("input.gmv-holders-filter").fill("")
    assert box.evaluate(_TABLE)["rows"] == before


def test_report_holders_view_shows_the_findings_numbers(page, tmp_path):
    out = report(FILE, tmp_path / "verl.html")
    seen = open_offline(page, out)
    check_view(page, ".gmv-holders")
    row = page.locator(".gmv-holders table[data-table=holders] tbody tr").first
    row.hover()
    tip = page.locator(".gmv-holders-tip").inner_text()
    first = gpumemviz.analyze(FILE).holders("frame")[0]
    assert (
        first.label in tip and f"{first.bytes:,} bytes" in tip and f"{first.count:,} blocks" in tip
    )
    assert seen["errors"] == [] and seen["blocked"] == []


def test_panel_holders_view_and_a_click_marks_the_blocks(page, notebook):
    nb = notebook("holders.ipynb", ["%load_ext gpumemviz", f"%gpumemviz --replay {FILE}"])
    nb.run(0)
    nb.run(1)
    _wait_drawn(page)
    page.wait_for_selector(".gmv-holders table[data-table=holders] tbody tr", timeout=60_000)
    check_view(page, ".gmv-holders")
    found = gpumemviz.analyze(FILE)
    for by, index in (("frame", 0), ("pool", 1)):
        page.locator("select.gmv-holders-key").select_option(by)
        page.locator(f".gmv-holders tr[data-index='{index}']").click()
        page.wait_for_function(
            "([view, mark]) => eval(view)().holders.element.dataset.marked === mark",
            arg=[VIEW, f"{by}:{index}"],
            timeout=30_000,
        )
        canvas = page.evaluate(f"() => ({{...({VIEW})().map.canvas.dataset}})")
        holder = found.holders(by)[index]
        assert int(canvas["markedBytes"]) == holder.bytes
        assert int(canvas["markedBlocks"]) == holder.count
    # a click whose press and release straddle a redraw of the view (a live panel redraws it at
    # every segment state read) still picks the row
    page.locator("select.gmv-holders-key").select_option("frame")
    box = page.locator(".gmv-holders tr[data-index='1']").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.evaluate(
        f"() => {{ const v = ({VIEW})(); v.holders.update({{...v.model.get('holders')}}); }}"
    )
    page.mouse.up()
    page.wait_for_function(
        "([view, mark]) => eval(view)().holders.element.dataset.marked === mark",
        arg=[VIEW, "frame:1"],
        timeout=30_000,
    )
