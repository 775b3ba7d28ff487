import { test } from "node:test";
import assert from "node:assert/strict";
import {
  blockAt, cellColor, cellRange, cellsFor, formatSize, geometry, groupTitle, keepWindow, parseColor,
  EXP_KEY, rowLabel,
} from "../src/rows.js";

const groups = [
  { device: 0, pool: "large", stream: 0, first: 0, count: 3 },
  { device: 0, pool: "small", stream: 0, first: 3, count: 2 },
];
const m = { rowH: 14, headH: 18 };

test("rows sit under their group's header band", () => {
  const g = geometry(groups, m);
  assert.equal(g.nRows, 5);
  assert.equal(g.total, 5 * 14 + 2 * 18);
  assert.equal(g.rowTop(0), 18);
  assert.equal(g.rowTop(2), 18 + 28);
  assert.equal(g.headTop(1), 18 + 3 * 14);
  assert.equal(g.rowTop(3), 2 * 18 + 3 * 14);
  assert.equal(g.hit(18), 0);
  assert.equal(g.hit(17), -1); // header band
  assert.equal(g.hit(g.rowTop(4) + 13), 4);
  assert.equal(g.hit(g.total), -1);
});

test("rows in a viewport, across a header band", () => {
  const g = geometry(groups, m);
  assert.deepEqual(g.rowsIn(0, 18 + 14), { first: 0, count: 1 });
  assert.deepEqual(g.rowsIn(0, 1000), { first: 0, count: 5 });
  assert.deepEqual(g.rowsIn(g.headTop(1), 18 + 14), { first: 3, count: 1 });
  assert.deepEqual(g.rowsIn(g.rowTop(1) + 5, 14), { first: 1, count: 2 });
  assert.deepEqual(geometry([], m).rowsIn(0, 100), { first: 0, count: 0 });
});

test("thousands of rows: every row top is found back by hit()", () => {
  const many = [];
  for (let i = 0; i < 40; i++) many.push({ device: 0, pool: "large", stream: i, first: i * 100, count: 100 });
  const g = geometry(many, m);
  for (let r = 0; r < 4000; r += 37) assert.equal(g.hit(g.rowTop(r) + 1), r);
});

test("a private pool's group header names the pool Python labelled", () => {
  const g = { device: 0, pool: "large", stream: 0, first: 0, count: 24, pool_id: [0, 2],
    pool_label: "MemPool (0, 2)" };
  assert.equal(groupTitle(g, "default stream"),
    "cuda:0 · MemPool (0, 2) · large pool · default stream · 24 segments");
  assert.equal(groupTitle({ ...g, pool_id: [0, 0], pool_label: "" }, "stream 0x5"),
    "cuda:0 · large pool · stream 0x5 · 24 segments");
  assert.equal(groupTitle(groups[1], "default stream"),
    "cuda:0 · small pool · default stream · 2 segments");
});

test("keep window matches render/wire.py", () => {
  assert.deepEqual(keepWindow(10, 20), [-10, 50]);
});

test("formatSize matches units.format_size", () => {
  // values from python: format_size(n) for these n
  assert.equal(formatSize(1024), "1024 bytes");
  assert.equal(formatSize(1536), "1.50 KiB");
  assert.equal(formatSize(20 * 2 ** 20), "20.00 MiB");
  assert.equal(formatSize(3 * 2 ** 30), "3.00 GiB");
  assert.equal(formatSize(2 ** 20), "1024.00 KiB");
  assert.equal(rowLabel({ total_size: 60 * 2 ** 20, flags: 2 }), "60.00 MiB exp");
  assert.equal(rowLabel({ total_size: 60 * 2 ** 20, flags: 2 }, true), "60.00 MiB expandable segment");
  assert.equal(rowLabel({ total_size: 2 * 2 ** 20, flags: 1 }, true), "2.00 MiB");
  assert.match(EXP_KEY, /^exp: an expandable segment/);
  assert.equal(rowLabel({ total_size: 2 * 2 ** 20, flags: 1 }), "2.00 MiB");
});

test("cell colours: pure kinds, mixes, no data", () => {
  const kinds = [[0, 114, 178], [230, 159, 0], [0, 158, 115], [213, 94, 0]];
  const empty = [228, 228, 228];
  assert.deepEqual(cellColor(63, kinds, empty), kinds[0]);
  assert.deepEqual(cellColor(3 << 6, kinds, empty), kinds[3]);
  assert.deepEqual(cellColor(2 << 6, kinds, empty), kinds[2]);
  assert.deepEqual(cellColor(0, kinds, empty), empty);
  const half = cellColor((3 << 6) | 32, kinds, empty);
  assert.ok(half[0] < 213 && half[2] > 0 && half[2] < 178);
});

test("colours parse from CSS", () => {
  assert.deepEqual(parseColor(" #0072b2"), [0, 114, 178]);
  assert.deepEqual(parseColor("#fff"), [255, 255, 255]);
  assert.deepEqual(parseColor("rgb(1, 2, 3)"), [1, 2, 3]);
  assert.throws(() => parseColor("blue"), /not a colour/);
});

test("cells map to byte ranges and blocks", () => {
  assert.deepEqual(cellRange(1, 4, 2 << 20), [512 << 10, 1 << 20]);
  const blocks = { offset: [0, 100, 300], size: [100, 200, 50] };
  assert.equal(blockAt(blocks, 0), 0);
  assert.equal(blockAt(blocks, 150), 1);
  assert.equal(blockAt(blocks, 349), 2);
  assert.equal(blockAt(blocks, 350), -1);
  assert.equal(cellsFor(5000), 1024);
  assert.equal(cellsFor(300.7), 300);
});

test("hover names the block's address, size, state and its stack, the user's line marked", async () => {
  const { hoverText } = await import("../src/heatmap.js");
  const row = {
    row: 0, cells: new Uint8Array(4),
    meta: { address: 0x7f0000000000, total_size: 4 << 20, n_blocks: 2 },
    blocks: { offset: new Float64Array([0, 2 << 20]), size: new Float64Array([2 << 20, 2 << 20]),
      requested: new Float64Array([2000000, 0]), state: new Uint8Array([1, 0]),
      stack: [{ lines: ["linear.py:1:forward", "train.py:9:step"], user: 1 }, null] },
  };
  const text = hoverText(row, 0, 4);
  assert.match(text, /block 0x7f0000000000 \+0 bytes: 2\.00 MiB allocated \(requested 1\.91 MiB; torch: active_allocated\)/);
  assert.match(hoverText(row, 3, 4), /2\.00 MiB free \(torch: inactive\)$/);
  assert.match(text, /\n {2}linear\.py:1:forward\n▶ train\.py:9:step$/);
  assert.doesNotMatch(hoverText(row, 3, 4), /▶/);  // the free block has no stack
});

test("zoom keeps the byte under the pointer in place and stays inside the segment", async () => {
  const { zoomWindow, blockKind } = await import("../src/rows.js");
  assert.deepEqual(zoomWindow(0, 100, 50, 4, 100), [37.5, 62.5]);
  assert.deepEqual(zoomWindow(0, 100, 0, 2, 100), [0, 50]);
  assert.deepEqual(zoomWindow(37.5, 62.5, 50, 0.1, 100), [0, 100]);
  assert.equal(blockKind(1, { allocated: 5, flags: 0 }), 0);
  assert.equal(blockKind(0, { allocated: 5, flags: 0 }), 3);
  assert.equal(blockKind(0, { allocated: 0, flags: 0 }), 2);
  assert.equal(blockKind(0, { allocated: 5, flags: 2 }), 2);
});

test("sizes round like Python's format_size, ties to even", async () => {
  const { formatSize: fs } = await import("../src/rows.js");
  assert.equal(fs(1.625 * 2 ** 20), "1.62 MiB");  // Python: f"{1.625:.2f}" == "1.62"
  assert.equal(fs(1.375 * 2 ** 20), "1.38 MiB");
  assert.equal(fs(2.5 * 2 ** 10), "2.50 KiB");
  assert.equal(fs(0.75 * 2 ** 30 + 2 ** 30), "1.75 GiB");
});

test("to scale, a row's width follows its bytes, never under the minimum", async () => {
  const { rowWidth, MIN_ROW_W } = await import("../src/heatmap.js");
  const gib = 2 ** 30;
  assert.equal(rowWidth("segment", 2 << 20, 20 * gib, 800), 800);
  assert.equal(rowWidth("bytes", 20 * gib, 20 * gib, 800), 800);
  assert.equal(rowWidth("bytes", 5 * gib, 20 * gib, 800), 200);
  assert.equal(rowWidth("bytes", 2 << 20, 20 * gib, 800), MIN_ROW_W);
  assert.equal(rowWidth("bytes", 5 * gib, 0, 800), 800);  // no layout yet: by segment
});
