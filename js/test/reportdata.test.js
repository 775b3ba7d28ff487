import { test } from "node:test";
import assert from "node:assert/strict";
import {
  b64ToBytes, b64ToFloat64, blockPixels, nearestIndex, resampleCells, zoomAt, zoomRange,
} from "../src/reportdata.js";

test("base64 columns decode as Python's base64 + numpy '<f8' wrote them", () => {
  assert.deepEqual([...b64ToBytes("AAH/")], [0, 1, 255]);
  // struct.pack("<2d", 1.5, 2**40) in base64
  const f = b64ToFloat64(Buffer.from(new Float64Array([1.5, 2 ** 40]).buffer).toString("base64"));
  assert.deepEqual([...f], [1.5, 2 ** 40]);
});

test("resampling keeps the cell bytes' meaning", () => {
  const row = new Uint8Array([63, 63, 192, 192]); // allocated, allocated, trapped, trapped
  assert.deepEqual([...resampleCells(row, 4)], [63, 63, 192, 192]);
  assert.deepEqual([...resampleCells(row, 8)], [63, 63, 63, 63, 192, 192, 192, 192]);
  assert.deepEqual([...resampleCells(row, 2)], [63, 192]);
  // half allocated, half trapped: mean level 32 (of 63), kind trapped
  assert.deepEqual([...resampleCells(row, 1)], [(3 << 6) | 32]);
  // no-data cells stay no data and do not dilute their neighbours
  assert.deepEqual([...resampleCells(new Uint8Array([0, 0, 63, 0]), 2)], [0, 63]);
  // a mostly-allocated mixed cell keeps its kind (never reads as wholly allocated)
  assert.equal(resampleCells(new Uint8Array([63, 62 | (2 << 6)]), 1)[0] >> 6, 2);
});

test("zoom keeps the byte under the cursor and stays inside the segment", () => {
  const total = 1000;
  let z = zoomAt(total, [0, 1000], 0.25, 4, 1e6);
  assert.equal(z.zoom, 4);
  assert.deepEqual(z.range, [187.5, 437.5]); // byte 250 stays at a quarter of the width
  z = zoomAt(total, z.range, 0.25, 1 / 100, 1e6);
  assert.deepEqual(z.range, [0, 1000]);
  z = zoomAt(total, [0, 1000], 1, 2, 1e6);
  assert.deepEqual(z.range, [500, 1000]);
  assert.equal(zoomAt(total, [0, 1000], 0.5, 1e9, 1e3).zoom, 1e3);
  assert.deepEqual(zoomRange(total, 2, 0), [0, 500]);
  assert.deepEqual(zoomRange(total, 2, 900), [500, 1000]);
});

test("blocks become pixel spans of the visible range only", () => {
  const blocks = { offset: [0, 100, 600], size: [100, 500, 400], state: [1, 0, 1] };
  assert.deepEqual(blockPixels(blocks, [0, 1000], 100),
    [{ i: 0, x0: 0, x1: 10 }, { i: 1, x0: 10, x1: 60 }, { i: 2, x0: 60, x1: 100 }]);
  assert.deepEqual(blockPixels(blocks, [150, 250], 100), [{ i: 1, x0: 0, x1: 100 }]);
});

test("nearest points", () => {
  const xs = [0, 10, 20, 30];
  assert.equal(nearestIndex(xs, 14), 1);
  assert.equal(nearestIndex(xs, 16), 2);
  assert.equal(nearestIndex(xs, 99), 3);
  assert.equal(nearestIndex([], 1), -1);
});
