import { test } from "node:test";
import assert from "node:assert/strict";
import { cellParts, decodeFrame, META_FIELDS, stateText, toArrayBuffer } from "../src/decode.js";

/** Build a frame the way render/wire_frame.py packs it. */
function frame(rows, cells, blocks) {
  const k = rows.length;
  const ids = new Uint32Array(rows.map((r) => r.row));
  const cellArr = new Uint8Array(k * cells);
  const meta = new Float64Array(k * META_FIELDS.length);
  const index = new Uint32Array(k + 1);
  const flat = [];
  const states = [];
  rows.forEach((r, j) => {
    cellArr.set(r.cells, j * cells);
    META_FIELDS.forEach((f, i) => { meta[j * META_FIELDS.length + i] = r.meta[f] ?? 0; });
    for (const b of blocks[j] || []) { flat.push(b.offset, b.size, b.requested); states.push(b.state); }
    index[j + 1] = index[j] + (blocks[j] || []).length;
  });
  const content = { kind: "frame", format: 1, seq: 7, view: "v", layout: 3, rows: k, cells,
    blocks: states.length };
  return [content, [ids, cellArr, meta, index, new Float64Array(flat), new Uint8Array(states)]];
}

test("decodes rows, cells, meta and blocks", () => {
  const [content, bufs] = frame(
    [{ row: 5, cells: [63, 192, 96, 0], meta: { address: 2 ** 40, total_size: 2097152, n_blocks: 2 } },
     { row: 6, cells: [63, 63, 63, 63], meta: { total_size: 1 << 20, n_blocks: 3000 } }],
    4,
    [[{ offset: 0, size: 1 << 20, requested: 1000000, state: 1 },
      { offset: 1 << 20, size: 1 << 20, requested: 0, state: 0 }], []],
  );
  // DataViews with odd offsets, as anywidget may hand them over
  const views = bufs.map((b) => {
    const u8 = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    const big = new Uint8Array(u8.length + 3);
    big.set(u8, 3);
    return new DataView(big.buffer, 3, u8.length);
  });
  const f = decodeFrame(content, views);
  assert.equal(f.seq, 7);
  assert.equal(f.rows.length, 2);
  assert.deepEqual([...f.rows[0].cells], [63, 192, 96, 0]);
  assert.equal(f.rows[0].meta.address, 2 ** 40);
  assert.deepEqual([...f.rows[0].blocks.size], [1 << 20, 1 << 20]);
  assert.deepEqual([...f.rows[0].blocks.state], [1, 0]);
  assert.equal(f.rows[0].blocks.requested[0], 1000000);
  assert.equal(f.rows[1].blocks, null); // too many blocks: no hover blocks travelled
});

test("refuses frames whose buffers disagree with the header", () => {
  const [content, bufs] = frame([{ row: 0, cells: [1, 2], meta: {} }], 2, [[]]);
  assert.throws(() => decodeFrame({ ...content, cells: 3 }, bufs), /do not match/);
  assert.throws(() => decodeFrame({ kind: "ack" }, bufs), /not a gpumemviz frame/);
  assert.throws(() => decodeFrame(content, bufs.slice(1)), /6 or 7 buffers/);
});

test("cell bytes split into kind and level", () => {
  assert.deepEqual(cellParts(0), { other: 0, level: 0, empty: true });
  assert.deepEqual(cellParts(63), { other: 0, level: 63, empty: false });
  assert.deepEqual(cellParts((3 << 6) | 32), { other: 3, level: 32, empty: false });
});

test("toArrayBuffer copies only the viewed bytes", () => {
  const buf = new Uint8Array([9, 1, 2, 3]).buffer;
  assert.deepEqual([...new Uint8Array(toArrayBuffer(new DataView(buf, 1, 2)))], [1, 2]);
});

test("the optional seventh buffer points hover blocks at their stacks", () => {
  const [content, bufs] = frame(
    [{ row: 0, cells: [63, 0], meta: { total_size: 4 << 20, n_blocks: 2 } }],
    2,
    [[{ offset: 0, size: 2 << 20, requested: 5, state: 1 },
      { offset: 2 << 20, size: 2 << 20, requested: 0, state: 0 }]],
  );
  const stack = { lines: ["linear.py:1:forward", "train.py:9:step"], user: 1 };
  const f = decodeFrame({ ...content, stacks: [stack] }, [...bufs, new Int32Array([0, -1])]);
  assert.deepEqual(f.rows[0].blocks.stack, [stack, null]);
  assert.throws(() => decodeFrame(content, [...bufs, new Int32Array([0])]), /do not match/);
});

test("decodeBlocks reads a window of one row's exact blocks", async () => {
  const { decodeBlocks } = await import("../src/decode.js");
  const raw = new Float64Array([100, 50, 40, 150, 30, 0]);
  const msg = decodeBlocks(
    { kind: "blocks", view: "v", layout: 2, row: 7, first: 9, lo: 100, hi: 180,
      stacks: [{ lines: ["a.py:1"], user: 0 }] },
    [new DataView(raw.buffer), new Uint8Array([1, 0]), new Int32Array([0, -1])],
  );
  assert.equal(msg.row, 7);
  assert.deepEqual([msg.lo, msg.hi, msg.first], [100, 180, 9]);
  assert.deepEqual(Array.from(msg.blocks.offset), [100, 150]);
  assert.deepEqual(Array.from(msg.blocks.size), [50, 30]);
  assert.deepEqual(Array.from(msg.blocks.requested), [40, 0]);
  assert.deepEqual(Array.from(msg.blocks.state), [1, 0]);
  assert.deepEqual(msg.blocks.stack, [{ lines: ["a.py:1"], user: 0 }, null]);
  assert.throws(() => decodeBlocks({ kind: "frame" }, []), /not a gpumemviz blocks message/);
});

test("a block's state is named in the legend's words, torch's after them", () => {
  assert.equal(stateText(0), "free (torch: inactive)");
  assert.equal(stateText(1, "1.00 MiB"), "allocated (requested 1.00 MiB; torch: active_allocated)");
  assert.equal(stateText(2), "pending free (torch: active_pending_free)");
  assert.equal(stateText(7), "?");
});
