// Row maths of the segment map: geometry, virtual scrolling, colours, hover, labels. Pure.
import { cellParts, KIND_ALLOCATED, LEVELS } from "./decode.js";

/**
 * @typedef {{device: number, pool: string, stream: number, first: number, count: number,
 *   pool_id?: number[], pool_label?: string}} Group ``pool_label``: a private pool's name from
 *   Python (render/rows.py Group), empty for the default pool
 * @typedef {{rowH: number, headH: number}} Metrics
 * @typedef {[number, number, number]} RGB
 */

/**
 * Rows both sides keep around a view (render/wire.py `window`): one view's height above and below.
 * @param {number} first
 * @param {number} count
 * @returns {[number, number]}
 */
export function keepWindow(first, count) {
  return [first - count, first + 2 * count];
}

/**
 * A group's header text: device, private pool (when one), size class, stream, segment count.
 * @param {Group} g
 * @param {string} stream the stream as shown ("default stream", "stream 0x…")
 */
export function groupTitle(g, stream) {
  const pool = g.pool_label ? `${g.pool_label} · ` : "";
  return `cuda:${g.device} · ${pool}${g.pool} pool · ${stream} · ${g.count} segments`;
}

/**
 * Vertical layout: every group starts with a header band, then its rows.
 * @param {Group[]} groups
 * @param {Metrics} m
 */
export function geometry(groups, m) {
  const tops = groups.map((g, i) => g.first * m.rowH + (i + 1) * m.headH);
  const nRows = groups.length ? groups[groups.length - 1].first + groups[groups.length - 1].count : 0;
  const total = nRows * m.rowH + groups.length * m.headH;
  /** @param {number} row */
  function groupOf(row) {
    let lo = 0, hi = groups.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (groups[mid].first <= row) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  /** @param {number} row @returns {number} y of the row's top edge */
  function rowTop(row) {
    const g = groupOf(row);
    return tops[g] + (row - groups[g].first) * m.rowH;
  }
  /** @param {number} g @returns {number} y of group g's header band */
  function headTop(g) {
    return tops[g] - m.headH;
  }
  /**
   * The rows that intersect [y0, y0 + height).
   * @param {number} y0
   * @param {number} height
   * @returns {{first: number, count: number}}
   */
  function rowsIn(y0, height) {
    if (!nRows) return { first: 0, count: 0 };
    const first = rowAt(y0, true);
    const last = rowAt(y0 + height - 1, false);
    return { first, count: Math.max(0, last - first + 1) };
  }
  /**
   * Row under y; in a header band, the next row (start) or the previous one (end).
   * @param {number} y
   * @param {boolean} start
   */
  function rowAt(y, start) {
    let lo = 0, hi = groups.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (headTop(mid) <= y) lo = mid; else hi = mid - 1;
    }
    const g = groups[lo];
    const inGroup = Math.floor((y - tops[lo]) / m.rowH);
    if (inGroup < 0) return start ? g.first : Math.max(0, g.first - 1);
    return Math.min(g.first + inGroup, g.first + g.count - 1, nRows - 1);
  }
  /**
   * The row whose band contains y, or -1 (header band, beyond the end).
   * @param {number} y
   */
  function hit(y) {
    if (y < 0 || y >= total) return -1;
    const r = rowAt(y, true);
    const top = rowTop(r);
    return y >= top && y < top + m.rowH ? r : -1;
  }
  return { nRows, total, rowTop, headTop, rowsIn, hit, groupOf };
}

/**
 * torch's format_size (units.py): "N bytes", KiB, MiB, GiB with 2 decimals.
 * @param {number} n
 */
export function formatSize(n) {
  const sign = n < 0 ? "-" : "";
  const a = Math.abs(n);
  if (a <= 1024) return `${sign}${Math.trunc(a)} bytes`;
  if (a <= 1048576) return `${sign}${fixed2(a / 1024)} KiB`;
  if (a <= 1073741824) return `${sign}${fixed2(a / 1048576)} MiB`;
  return `${sign}${fixed2(a / 1073741824)} GiB`;
}

/**
 * Two decimals as Python's `f"{x:.2f}"` writes them: an exact tie (1.625) goes to the even
 * neighbour (1.62), where `toFixed` would round up. Byte sizes over powers of two are dyadic, so
 * `x * 100` is exact for them.
 * @param {number} x
 */
export function fixed2(x) {
  const s = x * 100;
  const f = Math.floor(s);
  const d = s - f;
  const n = d > 0.5 ? f + 1 : d < 0.5 ? f : f % 2 === 0 ? f : f + 1;
  return (n / 100).toFixed(2);
}

/**
 * The label beside a row: its size, "exp" for an expandable segment's mapped run (the legend's
 * key says so); `long` spells it out, for tooltips.
 * @param {Record<string, number>} meta
 * @param {boolean} [long]
 */
export function rowLabel(meta, long = false) {
  const text = formatSize(meta.total_size);
  if (!(meta.flags & 2)) return text;
  return long ? `${text} expandable segment` : `${text} exp`;
}

/** The legend's key for the short row label. */
export const EXP_KEY = "exp: an expandable segment's mapped run";

/**
 * Colour of one cell: the allocated colour mixed into the cell's other kind by its allocated
 * fraction; `empty` when the cell has no data.
 * @param {number} byte
 * @param {RGB[]} kinds colours indexed by KIND_*
 * @param {RGB} empty
 * @returns {RGB}
 */
export function cellColor(byte, kinds, empty) {
  const { other, level, empty: none } = cellParts(byte);
  if (none) return empty;
  const a = kinds[KIND_ALLOCATED];
  if (other === 0) return a;
  const o = kinds[other];
  const f = level / LEVELS;
  return [
    Math.round(o[0] + (a[0] - o[0]) * f),
    Math.round(o[1] + (a[1] - o[1]) * f),
    Math.round(o[2] + (a[2] - o[2]) * f),
  ];
}

/**
 * Parse "#rrggbb" or "rgb(r, g, b)" (what getComputedStyle returns for custom properties).
 * @param {string} text
 * @returns {RGB}
 */
export function parseColor(text) {
  const s = text.trim();
  let m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(s);
  if (m) return [parseInt(m[1], 16), parseInt(m[2], 16), parseInt(m[3], 16)];
  m = /^#([0-9a-f])([0-9a-f])([0-9a-f])$/i.exec(s);
  if (m) return [parseInt(m[1] + m[1], 16), parseInt(m[2] + m[2], 16), parseInt(m[3] + m[3], 16)];
  m = /^rgba?\(\s*(\d+)[,\s]+(\d+)[,\s]+(\d+)/i.exec(s);
  if (m) return [Number(m[1]), Number(m[2]), Number(m[3])];
  throw new Error(`not a colour: ${JSON.stringify(text)}`);
}

/**
 * Byte range [lo, hi) of a segment that cell `c` of `cells` covers.
 * @param {number} c
 * @param {number} cells
 * @param {number} total
 * @returns {[number, number]}
 */
export function cellRange(c, cells, total) {
  return [(c * total) / cells, ((c + 1) * total) / cells];
}

/**
 * Index of the block covering byte `offset`, or -1.
 * @param {{offset: ArrayLike<number>, size: ArrayLike<number>}} blocks
 * @param {number} offset
 */
export function blockAt(blocks, offset) {
  let lo = 0, hi = blocks.offset.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (offset < blocks.offset[mid]) hi = mid - 1;
    else if (offset >= blocks.offset[mid] + blocks.size[mid]) lo = mid + 1;
    else return mid;
  }
  return -1;
}

/**
 * Cells a view asks for: one cell per CSS pixel of the map area, at most 1,024.
 * @param {number} areaWidth
 */
export function cellsFor(areaWidth) {
  return Math.max(16, Math.min(1024, Math.floor(areaWidth)));
}

/**
 * The colour class of an exact block (as render/rows.py): allocated, pending, and a free block is
 * releasable when its segment holds nothing allocated (or is expandable: free pages go back),
 * else trapped.
 * @param {number} state snapshot state code
 * @param {{allocated: number, flags: number}} meta
 */
export function blockKind(state, meta) {
  if (state === 1) return KIND_ALLOCATED;
  if (state === 2) return 1;
  return meta.allocated > 0 && !(meta.flags & 2) ? 3 : 2;
}

/**
 * The byte window after zooming by `factor` around byte `at` (kept inside [0, total]).
 * @param {number} lo
 * @param {number} hi
 * @param {number} at
 * @param {number} factor > 1 zooms in, < 1 out
 * @param {number} total
 * @returns {[number, number]}
 */
export function zoomWindow(lo, hi, at, factor, total) {
  const span = Math.min(total, Math.max(1, (hi - lo) / factor));
  let a = at - ((at - lo) / (hi - lo)) * span;
  a = Math.max(0, Math.min(total - span, a));
  return [a, a + span];
}
