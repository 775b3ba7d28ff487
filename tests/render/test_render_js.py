"""The wire across languages: frames packed by Python, decoded by js/src/decode.js under node."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpumemviz.render.rows import build_rows
from gpumemviz.render.wire import Wire
from gpumemviz.render.wire_frame import META_FIELDS, decode_frame
from gpumemviz.snapshot import Snapshot

JS = Path(__file__).resolve().parents[2] / "js" / "src"

NODE_DECODE = """
import { readFileSync } from "node:fs";
import { decodeFrame } from "%s";
import { rowLabel } from "%s";
const frames = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = frames.map(({ content, buffers }) => {
  const views = buffers.map((b) => {
    const bytes = Buffer.from(b, "base64");
    return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  });
  const f = decodeFrame(content, views);
  return f.rows.map((r) => ({
    row: r.row, cells: Array.from(r.cells), meta: r.meta, label: rowLabel(r.meta),
    blocks: r.blocks && {
      offset: Array.from(r.blocks.offset), size: Array.from(r.blocks.size),
      requested: Array.from(r.blocks.requested), state: Array.from(r.blocks.state) },
  }));
});
process.stdout.write(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_decodes_what_python_packs(recorded_dict, tmp_path):
    rows = build_rows(Snapshot.from_torch(recorded_dict))
    wire = Wire()
    wire.set_rows(rows)
    frames = wire.set_view("n", first=0, count=40, cells=333)
    payload = [
        {"content": f.content, "buffers": [base64.b64encode(b).decode() for b in f.buffers]}
        for f in frames
    ]
    (tmp_path / "frames.json").write_text(json.dumps(payload))
    script = tmp_path / "decode.mjs"
    script.write_text(NODE_DECODE % ((JS / "decode.js").as_uri(), (JS / "rows.js").as_uri()))
    run = subprocess.run(
        ["node", str(script), str(tmp_path / "frames.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    decoded = json.loads(run.stdout)
    assert len(decoded) == len(frames)
    for f, js_rows in zip(frames, decoded, strict=True):
        py = decode_frame(f.content, f.buffers)
        assert [r["row"] for r in js_rows] == py["rows"].tolist()
        for j, r in enumerate(js_rows):
            assert r["cells"] == py["cells"][j].tolist()
            assert [r["meta"][k] for k in META_FIELDS] == py["meta"][j].tolist()
            assert r["label"] == rows.label(r["row"])  # JS formats sizes as units.format_size
            want = py["blocks"][j]
            if want is None:
                assert r["blocks"] is None
            else:
                assert r["blocks"]["size"] == want["size"].tolist()
                assert r["blocks"]["offset"] == want["offset"].tolist()
                assert r["blocks"]["requested"] == want["requested"].tolist()
                assert r["blocks"]["state"] == want["state"].tolist()
