// Entry of the offline HTML report (gpumemviz/reporting/html_report.py): the panel's header and segment
// map fed from data embedded in the page instead of a kernel, plus a segment zoom, the memory
// timeline and the analysis tables. Every text from the snapshot goes in as a text node.
import { decodeFrame, KIND_NAMES, stateText } from "./decode.js";
import { createHeatmap, ROW_H } from "./heatmap.js";
import { createHeader } from "./controls.js";
import { createGlance } from "./glance.js";
import { createHolders } from "./holders.js";
import { AXIS_L, AXIS_R, createTimeline } from "./timeline.js";
import { coloursOf, installPalette } from "./palette.js";
import { registerView, testHooks } from "./probe.js";
import { growthSection, ranksSection } from "./reportgrowth.js";
import { blockAt, cellColor, formatSize, keepWindow, rowLabel } from "./rows.js";
import {
  b64ToBytes, b64ToFloat64, blockPixels, nearestIndex, resampleCells, zoomAt,
} from "./reportdata.js";

const MAX_ZOOM = 1e6;

/** @typedef {import("./decode.js").Row} Row */
/** @typedef {import("./heatmap.js").Palette} Palette */

/**
 * The page's embedded data (report_html.py `report_data`).
 * @typedef {{kind: string, message: string, device: number | null, setting?: string | null,
 *   checked?: boolean, unchecked?: string | null, reason?: string | null}} AdviceRow
 * @typedef {{kind: string, sentence: string, effect: number}} OomAction
 * @typedef {{device: number, cause: string, explanation: string, sentence: string,
 *   actions: OomAction[]}} Oom
 * @typedef {{device: number, address: number, total_size: number, allocated: number,
 *   free: number, largest_free: number, stuck_free: number, pool: string, stream: number,
 *   is_expandable: boolean, pool_label?: string}} Worst ``pool_label``: a private pool's name
 * @typedef {{entries: number, series: [string, string], x: string, t: string | null,
 *   oom_t: number[] | null, reserved: string, allocated: string, oom: number[]}} DeviceTimeline
 *   base64 float64 columns: entry index `x`, time `t` in seconds (null: no recorded times)
 * @typedef {{title: string, header: Record<string, unknown>,
 *   devices: Record<string, Record<string, unknown>>, total: Record<string, unknown>,
 *   worst: Worst[], advice: AdviceRow[], advice_rejected?: AdviceRow[],
 *   oom: Oom | null, ooms?: Record<string, Oom>, notes?: string[], settings?: Record<string, unknown> | null,
 *   holders?: import("./holders.js").HoldersData, violations: string[],
 *   timeline: Record<string, DeviceTimeline>, map: {layout: import("./heatmap.js").Layout,
 *   content: import("./decode.js").FrameContent, buffers: string[]},
 *   pools?: PoolRow[], pools_note?: string, glance?: import("./glance.js").GlanceSet,
 *   growth?: import("./reportgrowth.js").Suspect[],
 *   forecast?: import("./reportgrowth.js").Forecast | null,
 *   ranks?: import("./reportgrowth.js").Ranks}} ReportData
 * @typedef {{device: number, label: string, kind: string, in_use: boolean, reserved: number,
 *   allocated: number, pending_free: number, free: number, largest_free: number,
 *   releasable: number, releasable_after_release: number, note: string,
 *   external_fragmentation: number}} PoolRow a device's pool (`PoolFigures.to_dict()`)
 */

/**
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag @param {string} [cls] @param {string} [text]
 * @returns {HTMLElementTagNameMap[K]}
 */
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** @param {HTMLElement} host @param {string} title */
function section(host, title) {
  const s = el("section", "gmv-section");
  s.append(el("h2", "", title));
  host.append(s);
  return s;
}

/**
 * A table from rows of cells (strings only: text nodes).
 * @param {string[]} head
 * @param {string[][]} body
 * @param {string} [name]
 */
function table(head, body, name) {
  const t = el("table", "gmv-table");
  if (name) t.dataset.table = name;
  const tr = el("tr");
  for (const h of head) tr.append(el("th", "", h));
  const thead = el("thead");
  thead.append(tr);
  const tbody = el("tbody");
  for (const row of body) {
    const r = el("tr");
    for (const c of row) r.append(el("td", "", c));
    tbody.append(r);
  }
  t.append(thead, tbody);
  return t;
}

const FIGURE_ROWS = /** @type {const} */ ([
  ["reserved", "reserved", "bytes"], ["allocated", "allocated", "bytes"],
  ["active", "active (allocated + pending free)", "bytes"], ["requested", "requested", "bytes"],
  ["internal_waste", "rounding waste (allocated - requested)", "bytes"],
  ["pending_free", "pending free", "bytes"], ["free", "free in reserved", "bytes"],
  ["free_trapped", "free, trapped in partly used segments (inactive_split_bytes)", "bytes"],
  ["free_stuck", "free after empty_cache() (pending frees synced; the map's trapped)", "bytes"],
  ["releasable", "empty_cache() releases it (pending frees synced first)", "bytes"],
  ["largest_free", "largest free block", "bytes"],
  ["external_fragmentation", "fragmentation (1 - largest free / free)", "ratio"],
  ["fragmentation_sq", "fragmentation (1 - sum free² / free²)", "ratio"],
  ["segments", "segments", "count"], ["blocks", "blocks", "count"],
]);

/** @param {unknown} v @param {string} kind */
function fmt(v, kind) {
  if (typeof v !== "number") return v === null || v === undefined ? "–" : String(v);
  if (kind === "bytes") return formatSize(v);
  if (kind === "ratio") return v.toFixed(3);
  return v.toLocaleString("en-US");
}

/** @param {ReportData} data @param {HTMLElement} host */
function analysis(data, host) {
  const devs = Object.keys(data.devices).sort((a, b) => Number(a) - Number(b));
  const s = section(host, "Fragmentation");
  const head = ["figure", ...devs.map((d) => `cuda:${d}`)];
  if (devs.length > 1) head.push("all devices");
  const body = FIGURE_ROWS.map(([key, label, kind]) => {
    const row = [label, ...devs.map((d) => fmt(data.devices[d][key], kind))];
    if (devs.length > 1) row.push(fmt(data.total[key], kind));
    return row;
  });
  s.append(table(head, body, "figures"));
  if (data.pools && data.pools.length) {
    s.append(el("h3", "", "Pools"));
    const note = data.pools_note;
    if (note) s.append(el("p", "gmv-muted", `${note[0].toUpperCase()}${note.slice(1)}.`));
    s.append(table(
      ["device", "pool", "reserved", "allocated", "pending free", "free", "largest free",
        "fragmentation", "empty_cache() releases"],
      data.pools.map((p) => [
        `cuda:${p.device}`, p.label, formatSize(p.reserved), formatSize(p.allocated),
        formatSize(p.pending_free), formatSize(p.free), formatSize(p.largest_free),
        p.external_fragmentation.toFixed(3),
        p.releasable_after_release
          ? `${formatSize(p.releasable)} now; ${formatSize(p.releasable_after_release)} ${p.note}`
          : formatSize(p.releasable),
      ]), "pools"));
  }
  if (data.violations.length) {
    const ul = el("ul", "gmv-violations");
    for (const v of data.violations) ul.append(el("li", "", String(v)));
    s.append(el("p", "", "Conservation violations in the file:"), ul);
  }
  if (data.worst.length) {
    s.append(el("h3", "", "Segments holding the most free memory that empty_cache() cannot return"));
    s.append(table(
      ["device", "segment", "pool", "size", "allocated", "free", "stuck free", "largest free"],
      data.worst.map((w) => [
        `cuda:${w.device}`, `0x${w.address.toString(16)}${w.is_expandable ? " exp" : ""}`,
        `${w.pool_label ? `${w.pool_label} · ` : ""}${w.pool} · stream ${w.stream}`,
        formatSize(w.total_size), formatSize(w.allocated),
        formatSize(w.free), formatSize(w.stuck_free), formatSize(w.largest_free),
      ]), "worst"));
  }
  const a = section(host, "Advice");
  if (data.advice.length) {
    const ul = el("ul", "gmv-advice-list");
    for (const x of data.advice) {
      const li = el("li", "", (devs.length > 1 ? `cuda:${x.device}: ` : "") + String(x.message));
      li.dataset.kind = String(x.kind);
      ul.append(li);
    }
    a.append(ul);
  } else if (data.oom) {
    a.append(el("p", "gmv-muted", "No setting to change: the out-of-memory error's actions below are what to do."));
  } else {
    a.append(el("p", "gmv-muted", "Nothing to suggest: no setting would clearly help this snapshot."));
  }
  const rejected = data.advice_rejected || [];
  if (rejected.length) {
    a.append(el("p", "", "Checked and rejected: the replay of the recorded trace is worse with these settings."));
    const ul = el("ul", "gmv-advice-list gmv-advice-rejected");
    for (const x of rejected) {
      const li = el("li", "gmv-muted", (devs.length > 1 ? `cuda:${x.device}: ` : "") + String(x.message));
      li.dataset.kind = String(x.kind);
      ul.append(li);
    }
    a.append(ul);
  }
  for (const o of Object.values(data.ooms || {})) {
    const p = el("p", "gmv-oom-story", String(o.sentence));
    p.dataset.cause = String(o.cause);
    a.append(p);
    const ol = el("ol", "gmv-oom-actions");
    for (const x of o.actions) {
      const li = el("li", "", `${String(x.sentence)} (${formatSize(x.effect)})`);
      li.dataset.kind = String(x.kind);
      ol.append(li);
    }
    a.append(ol);
  }
  for (const n of data.notes || []) a.append(el("p", "gmv-muted gmv-note", String(n)));
  const hs = section(host, "Who holds the memory");
  hs.append(el("p", "gmv-muted",
    "The allocated bytes by holder: the user's frame (the first outside torch and the Python " +
    "interpreter), the whole call path, the recorded user_metadata or annotation, the stream or " +
    "the pool. Every key's rows sum to allocated."));
  createHolders(hs).update(data.holders);
  const settings = data.settings;
  const keys = Object.keys(settings || {});
  const set = section(host, "Allocator settings");
  if (settings === null || settings === undefined) {
    set.append(el("p", "gmv-muted",
      "Not recorded in this file (older torch): the analysis assumes PyTorch's defaults."));
  } else if (keys.length) {
    set.append(table(["setting", "value"],
      keys.sort().map((k) => [k, JSON.stringify(settings[k])]), "settings"));
  } else {
    set.append(el("p", "gmv-muted", "Recorded: PyTorch's defaults."));
  }
}

/**
 * The segment map: F's heatmap, its views answered from the embedded frame.
 * @param {ReportData} data @param {HTMLElement} host @param {(row: Row) => void} onPick
 */
function segmentMap(data, host, onPick) {
  const frame = decodeFrame(data.map.content, data.map.buffers.map(b64ToBytes));
  /** @type {Map<string, Row>} */
  const scaled = new Map();
  const rows = frame.rows; // row ids are 0..n-1, in order
  let seq = 0;
  /** @param {Row} row @param {number} cells */
  const atCells = (row, cells) => {
    if (row.cells.length === cells) return row;
    const key = `${row.row}:${cells}`;
    let r = scaled.get(key);
    if (!r) {
      if (scaled.size > 20000) scaled.clear();
      r = { ...row, cells: resampleCells(row.cells, cells) };
      scaled.set(key, r);
    }
    return r;
  };
  const map = createHeatmap(host, {
    onView(v) {
      const [lo, hi] = keepWindow(v.first, v.count);
      const out = [];
      for (let r = Math.max(0, lo); r < Math.min(rows.length, hi); r++) out.push(atCells(rows[r], v.cells));
      map.applyFrame({ seq: ++seq, view: "report", layout: 1, cells: v.cells, rows: out });
    },
  });
  map.setLayout(data.map.layout);
  map.canvas.addEventListener("click", (ev) => {
    const rect = map.canvas.getBoundingClientRect();
    const y = ev.clientY - rect.top;
    const v = map.view;
    for (let r = v.first; r < v.first + v.count; r++) {
      const box = map.rowRect(r);
      if (box && y >= box.y && y < box.y + box.h) { onPick(rows[r]); return; }
    }
  });
  return { map, rows };
}

/**
 * Zoom into one segment: its blocks across the full width; wheel zooms about the cursor,
 * drag pans, hover names the block.
 * @param {HTMLElement} host
 * @param {() => Palette} palette
 */
function segmentZoom(host, palette) {
  const box = el("div", "gmv-zoom");
  const title = el("div", "gmv-zoom-title", "Click a segment in the map to zoom into it.");
  const bar = el("div", "gmv-zoom-bar");
  const minus = el("button", "", "−"), plus = el("button", "", "+"), reset = el("button", "", "fit");
  for (const b of [minus, plus, reset]) b.type = "button";
  const range = el("span", "gmv-muted");
  bar.append(minus, plus, reset, range);
  const canvas = el("canvas", "gmv-zoom-canvas");
  const tip = el("div", "gmv-tip");
  tip.hidden = true;
  box.append(title, bar, canvas, tip);
  host.append(box);
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d"));
  /** @type {Row | null} */
  let row = null;
  /** @type {[number, number]} */
  let view = [0, 1];
  const H = 28;

  const width = () => Math.max(200, box.clientWidth - 2);
  function draw() {
    const w = width();
    canvas.width = w; canvas.height = H;
    canvas.style.width = `${w}px`; canvas.style.height = `${H}px`;
    const p = palette();
    ctx.fillStyle = p.bg; ctx.fillRect(0, 0, w, H);
    if (!row) return;
    const total = row.meta.total_size;
    range.textContent = ` +${formatSize(view[0])} .. +${formatSize(view[1])} of ${formatSize(total)} · ${(total / (view[1] - view[0])).toFixed(1)}x`;
    if (row.blocks) {
      for (const { i, x0, x1 } of blockPixels(row.blocks, view, w)) {
        const st = row.blocks.state[i];
        const kind = st === 1 ? 0 : st === 2 ? 1 : (row.meta.allocated > 0 ? 3 : 2);
        const [r, g, b] = p.kinds[kind];
        ctx.fillStyle = `rgb(${r},${g},${b})`;
        ctx.fillRect(x0, 0, Math.max(1, x1 - x0), H);
        if (x1 - x0 >= 3) { ctx.fillStyle = p.bg; ctx.fillRect(x0, 0, 1, H); }
      }
    } else {
      const n = row.cells.length;
      for (let x = 0; x < w; x++) {
        const off = view[0] + ((x + 0.5) / w) * (view[1] - view[0]);
        const [r, g, b] = cellColor(row.cells[Math.min(n - 1, Math.floor((off / total) * n))], p.kinds, p.emptyRgb);
        ctx.fillStyle = `rgb(${r},${g},${b})`;
        ctx.fillRect(x, 0, 1, H);
      }
    }
    canvas.dataset.zoom = (total / (view[1] - view[0])).toFixed(3);
  }
  /** @param {number} factor @param {number} at */
  function zoom(factor, at) {
    if (!row) return;
    view = zoomAt(row.meta.total_size, view, at, factor, MAX_ZOOM).range;
    draw();
  }
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const rect = canvas.getBoundingClientRect();
    zoom(ev.deltaY < 0 ? 1.5 : 1 / 1.5, (ev.clientX - rect.left) / rect.width);
  }, { passive: false });
  let drag = /** @type {{x: number, v: [number, number]} | null} */ (null);
  canvas.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, v: view }; });
  window.addEventListener("mouseup", () => { drag = null; });
  canvas.addEventListener("mousemove", (ev) => {
    if (!row) return;
    const rect = canvas.getBoundingClientRect();
    const total = row.meta.total_size;
    if (drag) {
      const span = drag.v[1] - drag.v[0];
      let lo = drag.v[0] - ((ev.clientX - drag.x) / rect.width) * span;
      lo = Math.min(Math.max(0, lo), total - span);
      view = [lo, lo + span];
      draw();
    }
    const off = view[0] + ((ev.clientX - rect.left) / rect.width) * (view[1] - view[0]);
    let text = `segment 0x${row.meta.address.toString(16)} · ${rowLabel(row.meta)}\n+${formatSize(off)}`;
    if (row.blocks) {
      const i = blockAt(row.blocks, off);
      if (i >= 0) {
        const st = row.blocks.state[i];
        text = `segment 0x${row.meta.address.toString(16)} · ${rowLabel(row.meta, true)}\nblock +${formatSize(row.blocks.offset[i])}: ${formatSize(row.blocks.size[i])} ` +
          stateText(st, st ? formatSize(row.blocks.requested[i]) : undefined);
      }
    } else {
      text += " (blocks not embedded: too many for the report's size budget)";
    }
    tip.textContent = text;
    tip.hidden = false;
    const hostRect = box.getBoundingClientRect();
    tip.style.left = `${ev.clientX - hostRect.left + 12}px`;
    tip.style.top = `${ev.clientY - hostRect.top + 12}px`;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  minus.addEventListener("click", () => zoom(1 / 2, 0.5));
  plus.addEventListener("click", () => zoom(2, 0.5));
  reset.addEventListener("click", () => { if (row) { view = [0, row.meta.total_size]; draw(); } });
  return {
    /** @param {Row} r */
    show(r) {
      row = r;
      view = [0, r.meta.total_size];
      title.textContent = `cuda:${r.meta.device} · segment 0x${r.meta.address.toString(16)} · ${rowLabel(r.meta)} · ${
        r.blocks ? `${r.blocks.offset.length} blocks` : `${r.meta.n_blocks} blocks (aggregated)`}`;
      box.dataset.row = String(r.row);
      draw();
    },
    zoom,
    get range() { return view; },
    canvas,
  };
}

/**
 * Reserved and allocated over the recorded history of one device: the panel's timeline
 * (timeline.js) fed once with every point, plus a hover naming the point under the cursor.
 * @param {HTMLElement} host @param {string} dev @param {DeviceTimeline} t
 */
function timeline(host, dev, t) {
  const box = el("div", "gmv-report-timeline");
  box.dataset.device = dev;
  const head = el("div", "gmv-zoom-title",
    `cuda:${dev}, over ${t.entries.toLocaleString("en-US")} trace entries` +
    (t.oom.length ? ` · ${t.oom.length} out of memory (OOM), marked` : ""));
  const tip = el("div", "gmv-tip");
  tip.hidden = true;
  box.append(head);
  host.append(box);
  const chart = createTimeline(box, {
    onSync() { /* every point is here from the start */ },
    colours() { return coloursOf(box); },
  });
  box.append(tip);
  const xs = b64ToFloat64(t.x), res = b64ToFloat64(t.reserved), alc = b64ToFloat64(t.allocated);
  // time in seconds where the trace has times, else the entry index
  const ts = t.t ? b64ToFloat64(t.t) : xs;
  const oomT = t.oom_t || t.oom;
  /** @type {(number | null)[][]} */
  const points = [];
  for (let i = 0; i < xs.length; i++) points.push([ts[i], alc[i], res[i], null, null, null]);
  chart.apply({ first: 0, reset: true, points,
    marks: oomT.map((x) => ({ t: x, label: "OOM", kind: "oom" })) });
  const canvas = /** @type {HTMLCanvasElement} */ (box.querySelector("canvas"));
  canvas.addEventListener("mousemove", (ev) => {
    const rect = canvas.getBoundingClientRect();
    // the plot lies between the axes (timeline.js AXIS_L, AXIS_R), in CSS pixels
    const frac = Math.min(1, Math.max(0,
      (ev.clientX - rect.left - AXIS_L) / Math.max(1, rect.width - AXIS_L - AXIS_R)));
    const i = nearestIndex(ts, ts[0] + frac * (ts[ts.length - 1] - ts[0]));
    if (i < 0) return;
    tip.textContent = `entry ${xs[i].toLocaleString("en-US")}` +
      (t.t ? ` · t = ${(ts[i] - ts[0]).toFixed(3)} s` : "") +
      `\n${t.series[0]} ${formatSize(res[i])}\n${t.series[1]} ${formatSize(alc[i])}`;
    tip.hidden = false;
    const hostRect = box.getBoundingClientRect();
    tip.style.left = `${ev.clientX - hostRect.left + 12}px`;
    tip.style.top = `${ev.clientY - hostRect.top + 12}px`;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  return { draw() { chart.apply({ first: 0, reset: true, points,
    marks: oomT.map((x) => ({ t: x, label: "OOM", kind: "oom" })) }); } };
}

function main() {
  const node = document.getElementById("gmv-data");
  const host = document.getElementById("gmv-report");
  if (!node || !host) return;
  /** @type {ReportData} the page's own data, written by report_html.py */
  const data = JSON.parse(node.textContent || "{}");
  installPalette(document);
  host.replaceChildren();
  const root = el("div", "gmv-root");
  root.dataset.view = "report";
  host.append(root);
  const header = createHeader(root);
  header.update({
    title: data.title, status: "offline report", demo: false, header: data.header,
    advice: data.advice, oom: data.oom || {},
  });
  const glance = createGlance(root);
  header.top.after(glance.element);  // each device at a glance, as in the panel
  glance.update(data.glance || {});
  if (data.ranks) ranksSection(data.ranks, root);  // a folder's ranks first, worst first
  const mapBox = el("div", "gmv-mapbox");
  root.append(mapBox);
  /** @type {ReturnType<typeof segmentZoom> | null} */
  let zoomer = null;
  const { map, rows } = segmentMap(data, mapBox, (r) => zoomer && zoomer.show(r));
  root.dataset.rows = String(rows.length);
  root.dataset.layout = "1";
  const palette = () => map.palette;
  zoomer = segmentZoom(root, palette);
  if (rows.length) zoomer.show(rows[0]);
  const tlDevs = Object.keys(data.timeline);
  const charts = [];
  if (tlDevs.length) {
    const s = section(root, "Timeline");
    for (const d of tlDevs) charts.push(timeline(s, d, data.timeline[d]));
  }
  analysis(data, root);
  growthSection(data, root);
  for (const c of charts) c.draw();
  registerView("report", { map, root, model: null });
  const hooks = testHooks();
  if (hooks) hooks.report = { rows: rows.length, zoom: zoomer, data, ready: true };
  root.dataset.ready = "1";
}

main();
