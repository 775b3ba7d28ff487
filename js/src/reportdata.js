// The offline report's data maths: base64 columns, cell resampling, zoom and timeline scales.
// Pure: no DOM, tested by node (js/test/reportdata.test.js).
import { LEVELS } from "./decode.js";

/**
 * Decode base64 into bytes (atob exists in browsers and in node >= 16).
 * @param {string} text
 * @returns {Uint8Array}
 */
export function b64ToBytes(text) {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/**
 * A little-endian float64 column from base64.
 * @param {string} text
 * @returns {Float64Array}
 */
export function b64ToFloat64(text) {
  const bytes = b64ToBytes(text);
  return new Float64Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 8);
}

/**
 * Cell bytes of one row at another resolution. Going down, a target cell takes the mean
 * allocated level of the cells it covers and the non-allocated kind of the least allocated of
 * them; going up, each target cell repeats the cell under its centre.
 * @param {Uint8Array} cells the row at its embedded resolution
 * @param {number} n cells wanted
 * @returns {Uint8Array}
 */
export function resampleCells(cells, n) {
  const m = cells.length;
  if (m === n) return cells;
  const out = new Uint8Array(n);
  if (!m) return out;
  if (n > m) {
    for (let c = 0; c < n; c++) out[c] = cells[Math.floor(((c + 0.5) * m) / n)];
    return out;
  }
  for (let c = 0; c < n; c++) {
    const lo = Math.floor((c * m) / n);
    const hi = Math.max(lo + 1, Math.floor(((c + 1) * m) / n));
    let sum = 0, seen = 0, other = 0, least = LEVELS + 1;
    for (let i = lo; i < hi; i++) {
      const b = cells[i];
      if (b === 0) continue; // no data
      sum += b & 63;
      seen++;
      if ((b >> 6) && (b & 63) < least) { least = b & 63; other = b >> 6; }
    }
    if (!seen) { out[c] = 0; continue; }
    const level = Math.round(sum / seen);
    // a cell that is not wholly allocated keeps its kind, so it never reads as 0 (no data)
    out[c] = other ? (other << 6) | level : LEVELS;
  }
  return out;
}

/**
 * The visible byte range of a zoomed segment: `zoom` >= 1 times magnified around `centre`.
 * @param {number} total segment bytes
 * @param {number} zoom
 * @param {number} centre byte offset kept in the middle
 * @returns {[number, number]}
 */
export function zoomRange(total, zoom, centre) {
  const z = Math.max(1, zoom);
  const span = total / z;
  let lo = centre - span / 2;
  lo = Math.min(Math.max(0, lo), total - span);
  return [lo, lo + span];
}

/**
 * Zoom about a fixed point: the byte under the cursor stays under the cursor.
 * @param {number} total
 * @param {[number, number]} range current [lo, hi)
 * @param {number} at fraction 0..1 of the width where the cursor is
 * @param {number} factor > 1 zooms in, < 1 out
 * @param {number} maxZoom
 * @returns {{zoom: number, range: [number, number]}}
 */
export function zoomAt(total, range, at, factor, maxZoom) {
  const [lo, hi] = range;
  const pivot = lo + at * (hi - lo);
  const zoom = Math.min(maxZoom, Math.max(1, (total / (hi - lo)) * factor));
  const span = total / zoom;
  let nlo = pivot - at * span;
  nlo = Math.min(Math.max(0, nlo), total - span);
  return { zoom, range: [nlo, nlo + span] };
}

/**
 * Pieces of a segment's blocks inside [lo, hi), in pixels of a `width`-wide strip.
 * @param {{offset: ArrayLike<number>, size: ArrayLike<number>, state: ArrayLike<number>}} blocks
 * @param {[number, number]} range
 * @param {number} width
 * @returns {{i: number, x0: number, x1: number}[]}
 */
export function blockPixels(blocks, range, width) {
  const [lo, hi] = range;
  const scale = width / (hi - lo);
  /** @type {{i: number, x0: number, x1: number}[]} */
  const out = [];
  for (let i = 0; i < blocks.offset.length; i++) {
    const a = blocks.offset[i], b = a + blocks.size[i];
    if (b <= lo || a >= hi) continue;
    out.push({ i, x0: (Math.max(a, lo) - lo) * scale, x1: (Math.min(b, hi) - lo) * scale });
  }
  return out;
}

/**
 * Index of the point nearest to x in a sorted column.
 * @param {ArrayLike<number>} xs
 * @param {number} x
 */
export function nearestIndex(xs, x) {
  let lo = 0, hi = xs.length - 1;
  if (hi < 0) return -1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < x) lo = mid + 1; else hi = mid;
  }
  if (lo > 0 && Math.abs(xs[lo - 1] - x) <= Math.abs(xs[lo] - x)) return lo - 1;
  return lo;
}
