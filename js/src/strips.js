// Small multiples: one strip per device (its header figures, a binned segment map, an OOM
// marker), drawn from the summary dicts of render/strips.py. Needs nothing else from the panel,
// so any page that holds such summaries (the panel's `strips` trait, a job's rank grid) can
// draw them: give it the list, a label per strip and the selected index.
import { cellColor, formatSize, parseColor } from "./rows.js";

/**
 * One strip's figures (render/strips.py `device_summary` keys, bytes) and its label.
 * @typedef {{label?: string, device?: number, reserved?: number, allocated?: number,
 *   free?: number, largest_free?: number, fragmentation?: number, ooms?: number,
 *   bins?: number[], rank?: number, title?: string, note?: string, stale?: boolean}} Strip
 *   a job's strips (distributed/grid.py `grid_rows`) add the rank fields, title and note
 * @typedef {{strips?: Strip[], selected?: number | null, totals?: Record<string, number>,
 *   note?: string}} StripSet the `strips` trait (render/strips.py `strip_set`)
 */

export const STRIP_H = 14;

/** @param {unknown} v */
const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : 0);

/**
 * The figures a strip shows, as its text.
 * @param {Strip} s
 * @returns {string}
 */
export function stripText(s) {
  const ooms = num(s.ooms);
  return `reserved ${formatSize(num(s.reserved))} · allocated ${formatSize(num(s.allocated))}` +
    ` · free ${formatSize(num(s.free))} · largest free ${formatSize(num(s.largest_free))}` +
    ` · fragmentation ${num(s.fragmentation).toFixed(2)} · OOMs ${ooms}`;
}

/**
 * The totals line: sums across strips and where the OOMs are.
 * @param {StripSet} set
 * @returns {string}
 */
export function totalsText(set) {
  const strips = set.strips || [];
  const t = set.totals || {};
  const where = strips.filter((s) => num(s.ooms) > 0)
    .map((s) => `${s.label || `cuda:${num(s.device)}`} (${num(s.ooms)})`);
  const ranks = new Set(strips.filter((s) => typeof s.rank === "number").map((s) => s.rank));
  const what = ranks.size ? `${ranks.size} ranks · ${strips.length} devices` :
    `${strips.length} devices`;
  return `${what} · reserved ${formatSize(num(t.reserved))}` +
    ` · allocated ${formatSize(num(t.allocated))} · free ${formatSize(num(t.free))}` +
    ` · OOMs: ${where.length ? where.join(", ") : "none"}`;
}

/**
 * Paint cell bytes (render/strips.py `device_bins`) across a canvas, in the panel's colours.
 * @param {HTMLCanvasElement} canvas
 * @param {number[]} bins
 * @param {number} height  canvas pixels
 * @param {Element} styled  where the --gmv-* colours are read
 */
export function paintBins(canvas, bins, height, styled) {
  const css = getComputedStyle(styled);
  /** @param {string} n @param {string} f */
  const v = (n, f) => css.getPropertyValue(n).trim() || f;
  const kinds = /** @type {import("./rows.js").RGB[]} */ ([
    parseColor(v("--gmv-allocated", "#0072b2")), parseColor(v("--gmv-pending", "#e69f00")),
    parseColor(v("--gmv-releasable", "#009e73")), parseColor(v("--gmv-trapped", "#d55e00")),
  ]);
  const empty = parseColor(v("--gmv-empty", "#dddddd"));
  const width = Math.max(64, canvas.clientWidth || 256);
  canvas.width = width;
  canvas.height = height;
  const ctx = canvas.getContext("2d");
  if (!ctx) return;
  ctx.fillStyle = `rgb(${empty.join(",")})`;
  ctx.fillRect(0, 0, width, height);
  const n = bins.length;
  for (let i = 0; i < n; i++) {
    const x0 = Math.floor((i * width) / n), x1 = Math.floor(((i + 1) * width) / n);
    const [r, g, b] = cellColor(bins[i], kinds, empty);
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(x0, 0, Math.max(1, x1 - x0), height);
  }
}

/**
 * @param {HTMLElement} host
 * @param {{onSelect: (index: number, strip: Strip) => void}} opts
 */
export function createStrips(host, opts) {
  const wrap = document.createElement("div");
  wrap.className = "gmv-strips";
  wrap.hidden = true;
  const totals = document.createElement("div");
  totals.className = "gmv-strips-totals";
  const list = document.createElement("div");
  list.className = "gmv-strips-list";
  const note = document.createElement("div");
  note.className = "gmv-strips-note";
  wrap.append(totals, list, note);
  host.append(wrap);
  /** @type {StripSet} */
  let shown = {};
  /**
   * The rows drawn, kept across updates and refilled in place: the grid is redrawn at every
   * read (every 0.2 s at the fastest), and a click whose press and release land on two
   * different elements (one replaced between them) is no click on either.
   * @type {{row: HTMLDivElement, label: HTMLSpanElement, canvas: HTMLCanvasElement,
   *   oom: HTMLSpanElement, mark: HTMLSpanElement, figs: HTMLSpanElement}[]}
   */
  const rows = [];

  /** @param {number} i */
  function rowAt(i) {
    if (rows[i]) return rows[i];
    const row = document.createElement("div");
    row.className = "gmv-strip";
    row.dataset.index = String(i);
    const label = document.createElement("span");
    label.className = "gmv-strip-label";
    const canvas = document.createElement("canvas");
    canvas.className = "gmv-strip-map";
    const oom = document.createElement("span");
    oom.className = "gmv-strip-oom";
    const mark = document.createElement("span");
    mark.className = "gmv-strip-note";  // a job's: stale with its age, or the last OOM's cause
    const figs = document.createElement("span");
    figs.className = "gmv-strip-figs";
    row.append(label, canvas, oom, mark, figs);
    // the strip shown at index i when the click lands, not when the row was made
    row.addEventListener("click", () => {
      const s = (shown.strips || [])[i];
      if (s) opts.onSelect(i, s);
    });
    rows[i] = { row, label, canvas, oom, mark, figs };
    return rows[i];
  }

  /** @param {StripSet} set */
  function update(set) {
    shown = set || {};
    const strips = shown.strips || [];
    wrap.hidden = strips.length === 0;
    wrap.dataset.strips = String(strips.length);
    wrap.dataset.ranks = String(strips.some((s) => typeof s.rank === "number"));
    for (const gone of rows.splice(strips.length)) gone.row.remove();
    if (!strips.length) return;
    totals.textContent = totalsText(shown);
    note.textContent = shown.note || "";
    note.hidden = !shown.note;
    strips.forEach((s, i) => {
      const { row, label, canvas, oom, mark, figs } = rowAt(i);
      row.dataset.device = String(num(s.device));
      row.dataset.ooms = String(num(s.ooms));
      row.dataset.selected = String(shown.selected === i);
      if (typeof s.rank === "number") row.dataset.rank = String(s.rank);
      else delete row.dataset.rank;
      row.dataset.stale = String(Boolean(s.stale));
      row.title = `${s.label || ""}: ${stripText(s)} (click to show its ${typeof s.rank === "number" ? "published" : "full"} map)`;
      label.textContent = s.label || `cuda:${num(s.device)}`;
      const bins = Array.isArray(s.bins) ? s.bins : [];
      canvas.dataset.bins = String(bins.length);
      figs.textContent = stripText(s);
      oom.hidden = num(s.ooms) === 0;
      oom.textContent = `OOM ×${num(s.ooms)}`;
      mark.hidden = !s.note;
      mark.textContent = s.note || "";
      if (row.parentElement !== list) list.append(row);
      paintBins(canvas, bins, STRIP_H, wrap);
    });
  }

  return {
    update,
    get element() { return wrap; },
    get shown() { return shown; },
    destroy() { wrap.remove(); },
  };
}
