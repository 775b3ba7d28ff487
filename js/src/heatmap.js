// The segment map on a canvas, virtually scrolled: only the rows in view are drawn or held.
import { KIND_NAMES, stateText } from "./decode.js";
import { logEvent } from "./probe.js";
import {
  blockAt, blockKind, cellColor, cellRange, cellsFor, formatSize, geometry, groupTitle, keepWindow,
  parseColor, rowLabel, zoomWindow,
} from "./rows.js";

export const ROW_H = 12;
export const ROW_GAP = 2;
export const HEAD_H = 18;
export const LABEL_W = 92;
export const MAX_H = 420;
export const ZOOM_H = 36;
/** "To scale": a row's pixels at least (a 2 MiB segment beside a 20 GiB one stays visible). */
export const MIN_ROW_W = 4;

/**
 * A row's width in pixels: the map's `cells` by segment; by bytes, in proportion to the largest
 * segment's size, never under MIN_ROW_W.
 * @param {"segment" | "bytes"} scale
 * @param {number} size the row's segment bytes
 * @param {number} maxSize the largest segment's bytes
 * @param {number} cells
 * @returns {number}
 */
export function rowWidth(scale, size, maxSize, cells) {
  if (scale !== "bytes" || !(maxSize > 0)) return cells;
  return Math.min(cells, Math.max(MIN_ROW_W, Math.round((cells * size) / maxSize)));
}
/** Most blocks Python sends for one zoomed row on request (EXACT_MAX_BLOCKS in render/wire.py). */
export const EXACT_MAX_BLOCKS = 1 << 16;
/** A window of a segment too big to send whole is asked for once the zoom rests this long. */
export const WINDOW_ASK_MS = 120;

/** @typedef {import("./decode.js").Row} Row */
/** @typedef {import("./rows.js").Group} Group */
/** @typedef {{n_rows: number, groups: Group[], version?: number, max_size?: number}} Layout the
 * `map_layout` trait (render/wire.py `layout`) */
/** @typedef {ReturnType<typeof readPalette>} Palette */

/**
 * @param {HTMLElement} host
 * @param {{onView: (v: {first: number, count: number, cells: number}) => void,
 *   onBlocks?: (row: number, lo: number, hi: number) => void,
 *   onStack?: (row: number, block: number) => void}} opts ``onBlocks`` asks Python for
 *   a row's exact blocks (those in bytes [lo, hi) where the row has too many to send whole);
 *   ``onStack`` asks for the stack of an allocated block hovered whose frame carried none (a
 *   live source asks torch for that one block), answered through `setStack`
 */
export function createHeatmap(host, opts) {
  const scroller = document.createElement("div");
  scroller.className = "gmv-scroll";
  const canvas = document.createElement("canvas");
  canvas.className = "gmv-canvas";
  const spacer = document.createElement("div");
  spacer.className = "gmv-spacer";
  const tip = document.createElement("div");
  tip.className = "gmv-tip";
  tip.hidden = true;
  scroller.append(canvas, spacer);
  const zoomBox = document.createElement("div");
  zoomBox.className = "gmv-seg-zoom";
  zoomBox.hidden = true;
  const zoomHead = document.createElement("div");
  zoomHead.className = "gmv-seg-zoom-head";
  const zoomText = document.createElement("span");
  /** @param {string} cmd @param {string} label */
  const zbtn = (cmd, label) => {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.zoom = cmd;
    b.textContent = label;
    return b;
  };
  const zIn = zbtn("in", "+");
  const zOut = zbtn("out", "−");
  const zClose = zbtn("close", "×");
  zoomHead.append(zoomText, zOut, zIn, zClose);
  const zoomCanvas = document.createElement("canvas");
  zoomCanvas.className = "gmv-seg-zoom-canvas";
  zoomCanvas.height = ZOOM_H;
  zoomBox.append(zoomHead, zoomCanvas);
  const modeBar = document.createElement("div");
  modeBar.className = "gmv-map-mode";
  const modeText = document.createElement("span");
  modeText.textContent = "rows:";
  /** @param {"segment" | "bytes"} mode @param {string} label @param {string} title */
  const modeButton = (mode, label, title) => {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.scale = mode;
    b.textContent = label;
    b.title = title;
    b.onclick = () => setScale(mode);
    return b;
  };
  const bySegment = modeButton("segment", "by segment", "each row its own segment, the map's full width");
  const byBytes = modeButton("bytes", "to scale",
    `row length by bytes: the largest segment the full width, none under ${MIN_ROW_W} px`);
  modeBar.append(modeText, bySegment, byBytes);
  host.append(modeBar, zoomBox, scroller, tip);
  /** @type {"segment" | "bytes"} */
  let scale = "segment";
  let maxSize = 0;
  /** @param {"segment" | "bytes"} mode */
  function setScale(mode) {
    scale = mode;
    bySegment.setAttribute("aria-pressed", String(mode === "segment"));
    byBytes.setAttribute("aria-pressed", String(mode === "bytes"));
    canvas.dataset.scale = mode;
    schedule();
  }
  /** @param {Row} row */
  const widthOf = (row) => rowWidth(scale, row.meta.total_size, maxSize, cells);
  /** @type {{row: number, lo: number, hi: number} | null} */
  let zoom = null;
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d", { alpha: false }));

  /** @type {Group[]} */
  let groups = [];
  let geo = geometry([], { rowH: ROW_H + ROW_GAP, headH: HEAD_H });
  /** @type {Map<number, Row>} */
  const cache = new Map();
  let cells = 0;
  let view = { first: 0, count: 0, cells: 0 };
  let raf = 0;
  let palette = readPalette(host);
  let lastDrawMs = 0;
  /** blocks marked (a holder clicked in the holders view): row -> [offset, size] pairs
   * @type {Map<number, [number, number][]>} */
  let marks = new Map();

  function size() {
    const width = Math.max(200, scroller.clientWidth);
    const height = Math.max(ROW_H, scroller.clientHeight);
    return { width, height, cells: cellsFor(width - LABEL_W - 8) };
  }

  function schedule() {
    if (!raf) raf = requestAnimationFrame(() => { raf = 0; draw(); });
  }

  function reportView() {
    const s = size();
    const { first, count } = geo.rowsIn(scroller.scrollTop, s.height);
    if (first === view.first && count === view.count && s.cells === view.cells) return;
    if (s.cells !== cells) { cache.clear(); cells = s.cells; }
    view = { first, count, cells: s.cells };
    const [lo, hi] = keepWindow(first, count);
    for (const r of cache.keys()) if (r < lo || r >= hi) cache.delete(r);
    if (count > 0) opts.onView(view);
  }

  function draw() {
    const t0 = performance.now();
    const s = size();
    const w = LABEL_W + cells + 8;
    if (canvas.width !== w || canvas.height !== s.height) {
      canvas.width = w;
      canvas.height = s.height;
      canvas.style.width = `${w}px`;
      canvas.style.height = `${s.height}px`;
    }
    spacer.style.height = `${Math.max(0, geo.total - s.height)}px`;
    const top = scroller.scrollTop;
    ctx.fillStyle = palette.bg;
    ctx.fillRect(0, 0, w, s.height);
    const img = ctx.createImageData(cells || 1, ROW_H);
    const { first, count } = geo.rowsIn(top, s.height);
    ctx.font = "10px var(--jp-code-font-family, monospace)";
    ctx.textBaseline = "middle";
    let drawn = 0;
    for (let g = 0; g < groups.length; g++) {
      const y = geo.headTop(g) - top;
      if (y + HEAD_H < 0 || y > s.height) continue;
      const grp = groups[g];
      ctx.fillStyle = palette.muted;
      const stream = grp.stream === 0 ? "default stream" : `stream 0x${grp.stream.toString(16)}`;
      ctx.fillText(groupTitle(grp, stream), 4, y + HEAD_H / 2 + 1);
    }
    for (let r = first; r < first + count; r++) {
      const y = geo.rowTop(r) - top;
      const row = cache.get(r);
      if (!row || row.cells.length !== cells) {
        ctx.fillStyle = palette.empty;
        ctx.fillRect(LABEL_W, y, cells, ROW_H);
        continue;
      }
      const d = img.data;
      const rw = widthOf(row);  // to scale: each pixel shows the cell under its middle
      for (let c = 0; c < rw; c++) {
        const cell = rw === cells ? c : Math.min(cells - 1, Math.floor(((c + 0.5) * cells) / rw));
        const [cr, cg, cb] = cellColor(row.cells[cell], palette.kinds, palette.emptyRgb);
        for (let yy = 0; yy < ROW_H; yy++) {
          const i = 4 * (yy * cells + c);
          d[i] = cr; d[i + 1] = cg; d[i + 2] = cb; d[i + 3] = 255;
        }
      }
      ctx.putImageData(img, LABEL_W, y, 0, 0, rw, ROW_H);
      if (row.blocks) drawSeparators(ctx, row, rw, LABEL_W, y, palette.bg);
      const marked = marks.get(r);
      if (marked) {  // a band over each marked block, in the text colour (either theme)
        ctx.fillStyle = palette.text;
        const total = row.meta.total_size || 1;
        for (const [off, sz] of marked) {
          const x0 = Math.floor((off / total) * rw);
          const x1 = Math.ceil(((off + sz) / total) * rw);
          ctx.fillRect(LABEL_W + x0, y, Math.max(1, x1 - x0), 3);
          ctx.fillRect(LABEL_W + x0, y + ROW_H - 3, Math.max(1, x1 - x0), 3);
        }
      }
      ctx.fillStyle = palette.text;
      ctx.fillText(rowLabel(row.meta), 4, y + ROW_H / 2 + 1);
      if (row.meta.flags & 2) {
        ctx.fillStyle = palette.muted;
        ctx.fillRect(LABEL_W - 4, y, 2, ROW_H);
      }
      drawn++;
    }
    drawZoom();
    lastDrawMs = performance.now() - t0;
    canvas.dataset.drawnRows = String(drawn);
    canvas.dataset.first = String(first);
    canvas.dataset.count = String(count);
    canvas.dataset.cells = String(cells);
    canvas.dataset.drawMs = lastDrawMs.toFixed(2);
    logEvent({ event: "draw", first, count, drawn, ms: lastDrawMs });
  }

  /** rows (as received) whose exact blocks were asked for already: "all" or the byte window */
  /** @type {WeakMap<Row, string>} */
  const asked = new WeakMap();
  /** the last window of exact blocks received for a row too big to send whole
   * @type {{src: Row, lo: number, hi: number, blocks: import("./decode.js").Blocks} | null} */
  let part = null;
  let askTimer = 0;
  /** The exact blocks the zoom can draw: the row's own, or a received window covering the zoom.
   * @param {Row} row */
  function zoomBlocks(row) {
    if (row.blocks) return row.blocks;
    if (zoom && part && part.src === row && part.lo <= zoom.lo && zoom.hi <= part.hi) {
      return part.blocks;
    }
    return null;
  }
  function drawZoom() {
    if (!zoom) return;
    const row = cache.get(zoom.row);
    const w = Math.max(100, cells || 100);
    if (zoomCanvas.width !== w) { zoomCanvas.width = w; zoomCanvas.style.width = `${w}px`; }
    zoomCanvas.style.marginLeft = `${LABEL_W}px`;
    const zc = /** @type {CanvasRenderingContext2D} */ (zoomCanvas.getContext("2d"));
    zc.fillStyle = palette.empty;
    zc.fillRect(0, 0, w, ZOOM_H);
    zoomCanvas.dataset.row = String(zoom.row);
    zoomCanvas.dataset.lo = String(Math.round(zoom.lo));
    zoomCanvas.dataset.hi = String(Math.round(zoom.hi));
    if (!row) { zoomCanvas.dataset.blocks = "0"; return; }
    const { lo, hi } = zoom;
    const span = hi - lo;
    const exact = zoomBlocks(row);
    // a row whose frame carried cells only: ask once per received row for its exact blocks;
    // a row too big to send whole: for those of the zoom's window, once per window
    if (!exact && opts.onBlocks) {
      const whole = row.meta.n_blocks <= EXACT_MAX_BLOCKS;
      const key = whole ? "all" : `${Math.floor(lo)}-${Math.ceil(hi)}`;
      const ask = () => {
        if (!zoom || cache.get(zoom.row) !== row || asked.get(row) === key) return;
        asked.set(row, key);
        opts.onBlocks?.(zoom.row, Math.floor(lo), Math.ceil(hi));
      };
      clearTimeout(askTimer);
      // a window is asked for once the zoom rests (each answer may be ~2 MB)
      if (whole) ask(); else askTimer = setTimeout(ask, WINDOW_ASK_MS);
    }
    zoomText.textContent = `segment 0x${row.meta.address.toString(16)} · ` +
      `+${formatSize(lo)} .. +${formatSize(hi)} of ${rowLabel(row.meta)}` +
      (exact ? "" : !opts.onBlocks ? " (cells)"
        : part && part.src === row && asked.get(row) === `${Math.floor(lo)}-${Math.ceil(hi)}`
          ? " (cells: more blocks here than one message carries; zoom in)"
          : " (cells: fetching the exact blocks…)");
    let drawn = 0;
    if (exact) {
      const b = exact;
      let last = -10;
      for (let i = 0; i < b.offset.length; i++) {
        const a = b.offset[i], e = a + b.size[i];
        if (e <= lo || a >= hi) continue;
        const x0 = ((Math.max(a, lo) - lo) / span) * w;
        const x1 = ((Math.min(e, hi) - lo) / span) * w;
        const [r, g, bl] = palette.kinds[blockKind(b.state[i], row.meta)];
        zc.fillStyle = `rgb(${r},${g},${bl})`;
        zc.fillRect(Math.floor(x0), 0, Math.max(1, Math.ceil(x1) - Math.floor(x0)), ZOOM_H);
        if (a >= lo && x0 - last >= 3) {
          zc.fillStyle = palette.bg;
          zc.fillRect(Math.floor(x0), 0, 1, ZOOM_H);
          last = x0;
        }
        drawn++;
      }
    } else {
      const total = row.meta.total_size;
      for (let c = 0; c < row.cells.length; c++) {
        const a = (c * total) / row.cells.length, e = ((c + 1) * total) / row.cells.length;
        if (e <= lo || a >= hi) continue;
        const [r, g, bl] = cellColor(row.cells[c], palette.kinds, palette.emptyRgb);
        zc.fillStyle = `rgb(${r},${g},${bl})`;
        const x0 = ((Math.max(a, lo) - lo) / span) * w;
        const x1 = ((Math.min(e, hi) - lo) / span) * w;
        zc.fillRect(Math.floor(x0), 0, Math.max(1, Math.ceil(x1) - Math.floor(x0)), ZOOM_H);
      }
    }
    zoomCanvas.dataset.blocks = String(drawn);
    zoomCanvas.dataset.exact = exact ? "1" : "0";
  }

  /** @param {number} row */
  function openZoom(row) {
    const r = cache.get(row);
    if (!r) return;
    zoom = { row, lo: 0, hi: r.meta.total_size };
    zoomBox.hidden = false;
    drawZoom();
  }
  /** @param {number} factor @param {number} [frac] pointer position in the strip, 0..1 */
  function zoomBy(factor, frac = 0.5) {
    const r = zoom && cache.get(zoom.row);
    if (!zoom || !r) return;
    const at = zoom.lo + frac * (zoom.hi - zoom.lo);
    [zoom.lo, zoom.hi] = zoomWindow(zoom.lo, zoom.hi, at, factor, r.meta.total_size);
    drawZoom();
  }
  /** @param {MouseEvent} ev */
  const onDbl = (ev) => {
    const rect = canvas.getBoundingClientRect();
    const r = geo.hit(ev.clientY - rect.top + scroller.scrollTop);
    if (r >= 0) openZoom(r);
  };
  /** @param {WheelEvent} ev */
  const onWheel = (ev) => {
    ev.preventDefault();
    const rect = zoomCanvas.getBoundingClientRect();
    zoomBy(ev.deltaY < 0 ? 2 : 0.5, (ev.clientX - rect.left) / rect.width);
  };
  /** @param {MouseEvent} ev */
  const onZoomMove = (ev) => {
    const r = zoom && cache.get(zoom.row);
    const exact = r ? zoomBlocks(r) : null;
    if (pinned || !zoom || !r || !exact) return;
    const rect = zoomCanvas.getBoundingClientRect();
    const byte = zoom.lo + ((ev.clientX - rect.left) / rect.width) * (zoom.hi - zoom.lo);
    const i = blockAt(exact, byte);
    if (i < 0) { tip.hidden = true; return; }
    tip.textContent = blockText({ ...r, blocks: exact }, i);
    tip.hidden = false;
    shownBlock = null;
    if (exact === r.blocks) askStack(r, i);
    const hostRect = host.getBoundingClientRect();
    tip.style.left = `${ev.clientX - hostRect.left + 12}px`;
    tip.style.top = `${ev.clientY - hostRect.top + 12}px`;
  };
  zIn.onclick = () => zoomBy(4);
  zOut.onclick = () => zoomBy(0.25);
  zClose.onclick = () => { zoom = null; zoomBox.hidden = true; };
  canvas.addEventListener("dblclick", onDbl);
  zoomCanvas.addEventListener("wheel", onWheel, { passive: false });
  zoomCanvas.addEventListener("mousemove", onZoomMove);
  zoomCanvas.addEventListener("mouseleave", () => { if (!pinned) tip.hidden = true; });

  /** @type {WeakMap<Row, Set<number>>} the blocks whose stack was asked for, per row shown */
  const askedStacks = new WeakMap();
  /** @type {{row: number, i: number} | null} the exact block the tooltip shows */
  let shownBlock = null;
  /** Ask once for the stack of hovered block `i` of `row` when it is allocated and has none.
   * @param {Row} row @param {number} i */
  function askStack(row, i) {
    shownBlock = { row: row.row, i };
    const b = row.blocks;
    if (!opts.onStack || !b || b.state[i] !== 1 || (b.stack && b.stack[i])) return;
    let done = askedStacks.get(row);
    if (!done) { done = new Set(); askedStacks.set(row, done); }
    if (done.has(i)) return;
    done.add(i);
    opts.onStack(row.row, i);
  }
  let pinned = false;
  /** @param {MouseEvent} ev */
  function onMove(ev) {
    if (pinned) return;
    const rect = canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left - LABEL_W;
    const r = geo.hit(ev.clientY - rect.top + scroller.scrollTop);
    const row = r >= 0 ? cache.get(r) : undefined;
    const rw = row ? widthOf(row) : cells;
    if (!row || x < 0 || x >= rw) { tip.hidden = true; return; }
    const c = Math.min(cells - 1, Math.floor((x * cells) / rw));
    tip.textContent = hoverText(row, c, cells);
    tip.hidden = false;
    shownBlock = null;
    if (row.blocks) {
      const [lo, hi] = cellRange(c, cells, row.meta.total_size);
      const i = blockAt(row.blocks, (lo + hi) / 2);
      if (i >= 0) askStack(row, i);
    }
    const hostRect = host.getBoundingClientRect();
    tip.style.left = `${ev.clientX - hostRect.left + 12}px`;
    tip.style.top = `${ev.clientY - hostRect.top + 12}px`;
  }
  const onLeave = () => { if (!pinned) tip.hidden = true; };
  /** @param {MouseEvent} ev a click pins the tooltip where it is; the next click frees it */
  const onClick = (ev) => {
    if (pinned) {
      pinned = false;
      tip.dataset.pinned = "false";
      onMove(ev);
      return;
    }
    onMove(ev);
    if (!tip.hidden) {
      pinned = true;
      tip.dataset.pinned = "true";
    }
  };
  const onScroll = () => { reportView(); schedule(); };
  scroller.addEventListener("scroll", onScroll);
  canvas.addEventListener("mousemove", onMove);
  canvas.addEventListener("mouseleave", onLeave);
  canvas.addEventListener("click", onClick);
  const resize = new ResizeObserver(() => { reportView(); schedule(); });
  resize.observe(scroller);
  setScale(scale);
  const theme = new MutationObserver(() => { palette = readPalette(host); schedule(); });
  theme.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name"] });

  return {
    /** @param {Layout} layout */
    setLayout(layout) {
      groups = layout.groups || [];
      maxSize = layout.max_size || 0;
      geo = geometry(groups, { rowH: ROW_H + ROW_GAP, headH: HEAD_H });
      scroller.style.height = `${Math.min(MAX_H, Math.max(HEAD_H + ROW_H, geo.total + 2))}px`;
      for (const r of cache.keys()) if (r >= geo.nRows) cache.delete(r);
      if (zoom && zoom.row >= geo.nRows) { zoom = null; zoomBox.hidden = true; }
      spacer.style.height = `${Math.max(0, geo.total - size().height)}px`;
      view = { first: -1, count: 0, cells: view.cells };
      reportView();
      schedule();
    },
    /** @param {import("./decode.js").Frame} frame */
    applyFrame(frame) {
      if (frame.cells !== cells) return;
      const [lo, hi] = keepWindow(view.first, view.count);
      for (const row of frame.rows) if (row.row >= lo && row.row < hi) cache.set(row.row, row);
      schedule();
    },
    /** @param {ReturnType<typeof import("./decode.js").decodeBlocks>} msg */
    applyBlocks(msg) {
      const src = cache.get(msg.row);
      if (!zoom || zoom.row !== msg.row || !src) return;
      part = { src, lo: msg.lo, hi: msg.hi, blocks: msg.blocks };
      schedule();
    },
    /**
     * The stack of block `i` of `row`, asked for by `onStack` (null: none known): kept with the
     * row's blocks, and shown at once when the tooltip still shows that block.
     * @param {number} row @param {number} i @param {import("./decode.js").Stack | null} stack
     */
    setStack(row, i, stack) {
      const r = cache.get(row);
      const b = r && r.blocks;
      if (!r || !b || !stack || i < 0 || i >= b.state.length) return;
      if (!b.stack) b.stack = new Array(b.state.length).fill(null);
      b.stack[i] = stack;
      if (shownBlock && shownBlock.row === row && shownBlock.i === i && !tip.hidden) {
        tip.textContent = blockText(r, i);
      }
    },
    drawNow: draw,
    /**
     * Mark blocks (one holder's): rows, offsets and sizes as parallel lists; the map scrolls to
     * the first; empty lists clear the marks.
     * @param {{row: number[], offset: number[], size: number[]}} m
     */
    setMarks(m) {
      marks = new Map();
      let bytes = 0, n = 0;
      for (let i = 0; i < m.row.length; i++) {
        const r = m.row[i];
        if (r < 0 || r >= geo.nRows) continue;
        let list = marks.get(r);
        if (!list) { list = []; marks.set(r, list); }
        list.push([m.offset[i], m.size[i]]);
        bytes += m.size[i]; n++;
      }
      canvas.dataset.markedBlocks = String(n);
      canvas.dataset.markedBytes = String(bytes);
      canvas.dataset.markedRows = String(marks.size);
      if (n) {
        const first = Math.min(...marks.keys());
        if (first < view.first || first >= view.first + view.count) this.scrollToRow(first);
      }
      schedule();
    },
    setScale,
    get scale() { return scale; },
    get maxSize() { return maxSize; },
    openZoom,
    zoomBy,
    get zoom() { return zoom ? { ...zoom } : null; },
    get zoomCanvas() { return zoomCanvas; },
    /** @param {number} row @returns {{x: number, y: number, w: number, h: number} | null} */
    rowRect(row) {
      if (row < 0 || row >= geo.nRows) return null;
      const r = cache.get(row);
      return { x: LABEL_W, y: geo.rowTop(row) - scroller.scrollTop, w: r ? widthOf(r) : cells,
        h: ROW_H };
    },
    /** @param {number} row */
    scrollToRow(row) { scroller.scrollTop = Math.max(0, geo.rowTop(row) - HEAD_H); onScroll(); },
    /** @param {number} row */
    cached(row) { return cache.get(row) || null; },
    get palette() { return palette; },
    get canvas() { return canvas; },
    get nRows() { return geo.nRows; },
    get view() { return view; },
    get drawMs() { return lastDrawMs; },
    destroy() {
      if (raf) cancelAnimationFrame(raf);
      resize.disconnect();
      theme.disconnect();
      scroller.removeEventListener("scroll", onScroll);
      canvas.removeEventListener("mousemove", onMove);
      canvas.removeEventListener("mouseleave", onLeave);
      canvas.removeEventListener("click", onClick);
      canvas.removeEventListener("dblclick", onDbl);
      clearTimeout(askTimer);
      zoomCanvas.removeEventListener("wheel", onWheel);
      zoomCanvas.removeEventListener("mousemove", onZoomMove);
      zoomBox.remove();
      modeBar.remove();
      scroller.remove();
      tip.remove();
    },
  };
}

/**
 * Tooltip text for a cell: the exact block when the frame carried the row's blocks, else the cell.
 * @param {Row} row
 * @param {number} c
 * @param {number} cells
 */
export function hoverText(row, c, cells) {
  const total = row.meta.total_size;
  const [lo, hi] = cellRange(c, cells, total);
  const head = `segment 0x${row.meta.address.toString(16)} · ${rowLabel(row.meta)}`;
  if (row.blocks) {
    const i = blockAt(row.blocks, (lo + hi) / 2);
    if (i >= 0) return blockText(row, i);
  }
  const byte = row.cells[c];
  return `${head}\ncell +${formatSize(lo)}..+${formatSize(hi)}: ${Math.round(((byte & 63) / 63) * 100)}% allocated` +
    ((byte >> 6) ? `, rest ${KIND_NAMES[byte >> 6]}` : "");
}

/**
 * Tooltip text for exact block `i` of a row: address, offset, size, state, requested, stack.
 * @param {Row} row
 * @param {number} i
 */
export function blockText(row, i) {
  const b = /** @type {import("./decode.js").Blocks} */ (row.blocks);
  const head = `segment 0x${row.meta.address.toString(16)} · ${rowLabel(row.meta, true)}`;
  const state = stateText(b.state[i], b.state[i] ? formatSize(b.requested[i]) : undefined);
  const addr = `0x${(row.meta.address + b.offset[i]).toString(16)}`;
  const text = `${head}\nblock ${addr} +${formatSize(b.offset[i])}: ` +
    `${formatSize(b.size[i])} ${state}`;
  const stack = b.stack ? b.stack[i] : null;
  return stack ? `${text}\n${stackText(stack)}` : text;
}

/**
 * The allocation stack, innermost first; "▶" marks the first frame outside torch (the user's line).
 * @param {import("./decode.js").Stack} stack
 */
export function stackText(stack) {
  return stack.lines.map((l, i) => (i === stack.user ? `▶ ${l}` : `  ${l}`)).join("\n");
}

/**
 * A faint line where a block starts, so adjacent blocks of one kind stay distinguishable; only
 * where blocks are at least 3 pixels apart (narrower ones show as intensity instead).
 * @param {CanvasRenderingContext2D} ctx
 * @param {Row} row
 * @param {number} cells
 * @param {number} x0
 * @param {number} y
 * @param {string} colour
 */
function drawSeparators(ctx, row, cells, x0, y, colour) {
  const b = /** @type {import("./decode.js").Blocks} */ (row.blocks);
  const total = row.meta.total_size;
  ctx.fillStyle = colour;
  ctx.globalAlpha = 0.6;
  let last = -10;
  for (let i = 1; i < b.offset.length; i++) {
    const x = Math.floor((b.offset[i] * cells) / total);
    if (x - last >= 3 && cells - x >= 2) {
      ctx.fillRect(x0 + x, y, 1, ROW_H);
      last = x;
    }
  }
  ctx.globalAlpha = 1;
}

/** @param {HTMLElement} host */
function readPalette(host) {
  const css = getComputedStyle(host);
  /** @param {string} name @param {string} fallback */
  const v = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
  const kinds = /** @type {import("./rows.js").RGB[]} */ ([
    parseColor(v("--gmv-allocated", "#0072b2")),
    parseColor(v("--gmv-pending", "#e69f00")),
    parseColor(v("--gmv-releasable", "#009e73")),
    parseColor(v("--gmv-trapped", "#d55e00")),
  ]);
  const empty = v("--gmv-empty", "#dddddd");
  return {
    kinds,
    empty,
    emptyRgb: parseColor(empty),
    bg: v("--gmv-bg", "#ffffff"),
    text: v("--gmv-text", "#222222"),
    muted: v("--gmv-muted", "#777777"),
  };
}

