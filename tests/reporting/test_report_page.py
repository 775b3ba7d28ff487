"""report_page: the HTML around the report's data, its binary columns written as base64 only
while the page is written, never as one joined copy of the page."""

from __future__ import annotations

import base64
import json
import tracemalloc

from gpumemviz.reporting.html_report import render_html, report, report_data
from gpumemviz.reporting.page import (
    Blob,
    blobs_as_text,
    join_parts,
    json_len,
    page_parts,
    script_json,
    write_parts,
)
from test_report_html import EVIL, big_snapshot, evil_snapshot, page_data

MIB = 1 << 20


def test_blobs_are_base64_inside_the_jsons_quotes_and_escapes_still_hold():
    raw = bytes(range(256)) * 3
    data = {"b": [Blob(raw), Blob(b"")], "evil": EVIL, "mark": "gmv-blob-", "n": float("nan")}
    parts = script_json(data)
    assert [type(p) for p in parts] == [bytes, Blob, bytes, Blob, bytes]
    text = join_parts(parts)
    assert "</script" not in text and "<!--" not in text  # escaped as \u003c
    back = json.loads(text)
    assert base64.b64decode(back["b"][0]) == raw and back["b"][1] == ""
    assert back["evil"] == EVIL and back["mark"] == "gmv-blob-" and back["n"] is None
    assert json.loads(text) == blobs_as_text({**data, "n": None})
    assert json_len(data["b"]) == len(json.dumps(blobs_as_text(data["b"])))


def test_the_written_page_is_the_rendered_one(tmp_path):
    """`report` writes the parts one by one; `render_html` joins them: the same bytes."""
    snap = evil_snapshot()
    out = report(snap, tmp_path / "r.html", title=EVIL)
    assert out.read_bytes() == render_html(snap, title=EVIL).encode("utf-8")
    assert page_data(out.read_text(encoding="utf-8"))["title"] == EVIL


def test_writing_holds_one_base64_copy_at_a_time(tmp_path):
    """The biggest part of a page is its binary columns: writing one page of 16 MB of them
    takes a few MB beyond the columns themselves, not the three more copies (base64 text,
    JSON text, the encoded page) a joined page needs."""
    cols = [Blob(bytes(4 * MIB)) for _ in range(4)]
    parts = page_parts("t", {"map": {"buffers": cols}})
    tracemalloc.start()
    try:
        with (tmp_path / "p.html").open("wb") as f:
            write_parts(f, parts)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # one column's base64 at a time (b64encode works in twice the column's size); the page
    # joined would hold all four columns' base64 twice, over 40 MB
    assert peak < 3 * 4 * MIB
    text = (tmp_path / "p.html").read_text(encoding="utf-8")
    assert [base64.b64decode(b) for b in page_data(text)["map"]["buffers"]] == [bytes(4 * MIB)] * 4


def test_a_big_map_page_parses_and_matches_report_data(tmp_path):
    snap = big_snapshot(20_000, 10)
    out = report(snap, tmp_path / "r.html", input_size=4 * MIB)
    data = page_data(out.read_text(encoding="utf-8"))
    want = report_data(snap, title="memory snapshot", budget=8 * MIB)
    assert data["map"] == want["map"] and data["timeline"] == want["timeline"]
