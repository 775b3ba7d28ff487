// Frames from Python (gpumemviz/render/wire_frame.py) -> typed arrays. Pure: no DOM, tested by node.
// The format is specified in docs/internals.md, section "wire".

export const FRAME_FORMAT = 1;
/** Per-row float64 fields, in order (META_FIELDS in wire_frame.py). */
export const META_FIELDS = [
  "address", "total_size", "stream", "device", "flags", "n_blocks",
  "allocated", "pending_free", "free_releasable", "free_trapped",
];
export const KIND_ALLOCATED = 0;
export const KIND_PENDING = 1;
export const KIND_RELEASABLE = 2;
export const KIND_TRAPPED = 3;
export const KIND_NAMES = ["allocated", "pending_free", "free_releasable", "free_trapped"];
export const STATE_NAMES = ["inactive", "active_allocated", "active_pending_free"];
/** A block state in the legend's words (torch's `STATE_NAMES` after it, for memory_viz users). */
export const STATE_WORDS = ["free", "allocated", "pending free"];

/**
 * How a tooltip names block state `s`: the legend's word, and torch's for memory_viz users.
 * @param {number} s
 * @param {string} [requested] the requested size, formatted, where the block is in use
 */
export function stateText(s, requested) {
  if (!(s in STATE_WORDS)) return "?";
  const why = requested ? `requested ${requested}; ` : "";
  return `${STATE_WORDS[s]} (${why}torch: ${STATE_NAMES[s]})`;
}
export const LEVELS = 63;
export const CELL_NO_DATA = 0;

/**
 * @typedef {{lines: string[], user: number | null}} Stack
 * @typedef {{offset: Float64Array, size: Float64Array, requested: Float64Array, state: Uint8Array,
 *   stack?: (Stack | null)[]}} Blocks
 * @typedef {{address: number, total_size: number, stream: number, device: number, flags: number,
 *   n_blocks: number, allocated: number, pending_free: number, free_releasable: number,
 *   free_trapped: number}} Meta a row's META_FIELDS
 * @typedef {{row: number, cells: Uint8Array, meta: Meta, blocks: Blocks | null}} Row
 * @typedef {{seq: number, view: string, layout: number, cells: number, rows: Row[]}} Frame
 * @typedef {{kind: string, format: number, seq: number, view: string, layout: number,
 *   rows: number, cells: number, blocks: number, stacks?: Stack[]}} FrameContent
 *   a frame message (`pack_frame` in wire_frame.py)
 * @typedef {{kind: string, view: string, layout: number, row: number, first: number, lo: number,
 *   hi: number, stacks?: Stack[]}} BlocksContent a `blocks` message (`pack_blocks`)
 */

/**
 * Copy a DataView / ArrayBuffer / typed array into a fresh, aligned ArrayBuffer (a
 * SharedArrayBuffer where the view is over one).
 * anywidget hands buffers over as DataViews whose byteOffset need not be aligned.
 * @param {DataView | ArrayBuffer | ArrayBufferView} buf
 * @returns {ArrayBufferLike}
 */
export function toArrayBuffer(buf) {
  if (buf instanceof ArrayBuffer) return buf;
  const view = /** @type {ArrayBufferView} */ (buf);
  return view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength);
}

/**
 * Decode one frame message.
 * @param {FrameContent} content
 * @param {Array<DataView | ArrayBuffer | ArrayBufferView>} buffers
 * @returns {Frame}
 */
export function decodeFrame(content, buffers) {
  if (!content || content.kind !== "frame" || content.format !== FRAME_FORMAT) {
    throw new Error(`not a gpumemviz frame of format ${FRAME_FORMAT}: ${content && content.kind}`);
  }
  if (buffers.length !== 6 && buffers.length !== 7) {
    throw new Error(`frame needs 6 or 7 buffers, got ${buffers.length}`);
  }
  const k = content.rows;
  const n = content.cells;
  const [ids, cells, meta, index, blocks, states, stackBuf] = buffers.map(toArrayBuffer);
  const idArr = new Uint32Array(ids);
  const cellArr = new Uint8Array(cells);
  const metaArr = new Float64Array(meta);
  const indexArr = new Uint32Array(index);
  const blockArr = new Float64Array(blocks);
  const stateArr = new Uint8Array(states);
  // optional: each hover block's index into content.stacks (-1: no stack sent)
  const stackArr = stackBuf ? new Int32Array(stackBuf) : new Int32Array(stateArr.length).fill(-1);
  /** @type {Stack[]} */
  const stacks = Array.isArray(content.stacks) ? content.stacks : [];
  const nf = META_FIELDS.length;
  if (idArr.length !== k || cellArr.length !== k * n || metaArr.length !== k * nf ||
      indexArr.length !== k + 1 || blockArr.length !== 3 * content.blocks ||
      stateArr.length !== content.blocks || stackArr.length !== content.blocks) {
    throw new Error("frame buffers do not match its header");
  }
  /** @type {Row[]} */
  const rows = [];
  for (let j = 0; j < k; j++) {
    /** @type {Record<string, number>} */
    const m = {};
    META_FIELDS.forEach((f, i) => { m[f] = metaArr[j * nf + i]; });
    const lo = indexArr[j];
    const hi = indexArr[j + 1];
    /** @type {Blocks | null} */
    let b = null;
    if (hi > lo || m.n_blocks === 0) {
      const nb = hi - lo;
      b = { offset: new Float64Array(nb), size: new Float64Array(nb),
            requested: new Float64Array(nb), state: stateArr.slice(lo, hi),
            stack: Array.from(stackArr.subarray(lo, hi), (i) => (i >= 0 ? stacks[i] || null : null)) };
      for (let i = 0; i < nb; i++) {
        b.offset[i] = blockArr[3 * (lo + i)];
        b.size[i] = blockArr[3 * (lo + i) + 1];
        b.requested[i] = blockArr[3 * (lo + i) + 2];
      }
    }
    // every META_FIELDS name is set above
    const meta = /** @type {Meta} */ (m);
    rows.push({ row: idArr[j], cells: cellArr.slice(j * n, (j + 1) * n), meta, blocks: b });
  }
  return { seq: content.seq, view: content.view, layout: content.layout, cells: n, rows };
}

/**
 * Split a cell byte into its parts.
 * @param {number} byte
 * @returns {{other: number, level: number, empty: boolean}}
 */
export function cellParts(byte) {
  return { other: byte >> 6, level: byte & 63, empty: byte === CELL_NO_DATA };
}

/**
 * Decode a `blocks` message: one zoomed row's exact blocks in a byte window (a segment too big
 * to send whole; `pack_blocks` in wire_frame.py).
 * @param {BlocksContent} content
 * @param {Array<DataView | ArrayBuffer | ArrayBufferView>} buffers
 * @returns {{view: string, layout: number, row: number, first: number, lo: number, hi: number,
 *   blocks: Blocks}}
 */
export function decodeBlocks(content, buffers) {
  if (!content || content.kind !== "blocks" || buffers.length !== 3) {
    throw new Error("not a gpumemviz blocks message");
  }
  const [raw, states, stackBuf] = buffers.map(toArrayBuffer);
  const arr = new Float64Array(raw);
  const state = new Uint8Array(states);
  const idx = new Int32Array(stackBuf);
  const n = state.length;
  if (arr.length !== 3 * n || idx.length !== n) throw new Error("blocks buffers do not match");
  const stacks = Array.isArray(content.stacks) ? content.stacks : [];
  /** @type {Blocks} */
  const blocks = { offset: new Float64Array(n), size: new Float64Array(n),
    requested: new Float64Array(n), state,
    stack: Array.from(idx, (i) => (i >= 0 ? stacks[i] || null : null)) };
  for (let i = 0; i < n; i++) {
    blocks.offset[i] = arr[3 * i];
    blocks.size[i] = arr[3 * i + 1];
    blocks.requested[i] = arr[3 * i + 2];
  }
  const { view, layout, row, first, lo, hi } = content;
  return { view, layout, row, first, lo, hi, blocks };
}
