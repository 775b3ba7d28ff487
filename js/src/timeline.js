// The timeline: allocated, reserved, NVML used, non-PyTorch memory and fragmentation over time,
// with step and per-cell markers. Points arrive incrementally; a gap asks for a resync. It reads
// alone: a byte axis with units on the left, fragmentation's own axis on the right, a legend
// naming each drawn series in its colour (the palette, js/src/palette.js), marker labels thinned
// so none overprints another (each one's text stays on hover) and OOMs always drawn. The drawn
// labels' boxes are the canvas' `data-label-boxes` (the browser tests read them).

import { formatSize } from "./rows.js";

/** Point fields, as render/timeline.py FIELDS. */
export const FIELDS = ["t", "allocated", "reserved", "nvml_used", "non_pytorch", "fragmentation"];

/**
 * @typedef {{seconds: number, low: number, high: number | null, rate: number, rate_low: number,
 *   rate_high: number, level: number, capacity: number, t_last: number, sentence: string,
 *   what: string}} Forecast the live time to OOM (live/forecast.py `LiveForecast.to_dict`)
 * @typedef {{t: number, label: string, kind: string}} Mark a step or cell marker
 *   (render/timeline.py)
 * @typedef {{first: number, points: (number | null)[][], reset?: boolean, marks?: Mark[],
 *   device?: number | null}} TimelineUpdate points from index `first` on (`reset`: instead of
 *   those held); `device`: the device whose history they are (widget/panel.py)
 */

/** The canvas' height and the plot's margins (CSS pixels): a byte axis on the left, the
 * fragmentation axis on the right, the marker labels' lanes above the curves. */
export const AXIS_L = 62;
export const AXIS_R = 38;
export const LABEL_LANES = 2;
export const LANE_H = 12;
export const PLOT_TOP = LABEL_LANES * LANE_H + 6;
export const PLOT_BOTTOM = 6;
export const TL_H = 160;

/**
 * The drawn series, in drawing order: point field, colour (a palette key), label, dash.
 * Fragmentation has the right axis (0..1); the others share the byte axis.
 * @type {{field: number, key: "allocated" | "reserved" | "nvml_used" | "non_pytorch" |
 *   "fragmentation", label: string, dash: number[], right: boolean}[]}
 */
export const SERIES = [
  { field: 3, key: "nvml_used", label: "NVML used", dash: [5, 3], right: false },
  { field: 4, key: "non_pytorch", label: "non-PyTorch (NVML used − reserved)", dash: [], right: false },
  { field: 2, key: "reserved", label: "reserved", dash: [], right: false },
  { field: 1, key: "allocated", label: "allocated", dash: [], right: false },
  { field: 5, key: "fragmentation", label: "fragmentation (right axis, 0–1)", dash: [2, 2], right: true },
];

/** @type {[string, number][]} */
const UNITS = [["bytes", 1], ["KiB", 1024], ["MiB", 1048576], ["GiB", 1073741824],
  ["TiB", 1099511627776]];

/**
 * A byte figure as an axis tick: the largest unit it reaches, up to two decimals, no zeros
 * after the point ("0", "512 MiB", "1.5 GiB").
 * @param {number} v
 * @returns {string}
 */
export function tickText(v) {
  if (v === 0) return "0";
  let unit = UNITS[0];
  for (const u of UNITS) if (Math.abs(v) >= u[1]) unit = u;
  return `${Number((v / unit[1]).toFixed(2))} ${unit[0]}`;
}

/**
 * Byte axis ticks from 0: a power-of-two step giving at most `most` intervals up to `top`,
 * and the axis' top (the last tick, at or above `top`).
 * @param {number} top the largest byte figure
 * @param {number} [most]
 * @returns {{step: number, top: number, ticks: number[]}}
 */
export function byteTicks(top, most = 4) {
  let step = 1;
  while (Math.ceil(top / step) > most) step *= 2;
  const n = Math.max(1, Math.ceil(top / step));
  return { step, top: n * step, ticks: Array.from({ length: n + 1 }, (_, i) => i * step) };
}

/**
 * Where each point goes in the plot rectangle: x by time over the whole span (or the span
 * `zoomed` in on), y by bytes (0 at the bottom, the byte axis' top, over the points in view, at the
 * top) and, for fragmentation, 0..1 over the same height.
 * @param {(number | null)[][]} points
 * @param {{left: number, top: number, width: number, height: number}} plot
 * @param {[number, number] | null} [zoomed] the time span shown (null: all of it)
 * @param {{t1: number, top: number} | null} [ahead] a forecast's reach: the time axis runs on to
 *   `t1` and the byte axis up to `top` (unless zoomed)
 * @returns {{x: (t: number) => number, y: (bytes: number) => number, yf: (f: number) => number,
 *   t0: number, t1: number, top: number, ticks: number[]}}
 */
export function timelineScale(points, plot, zoomed = null, ahead = null) {
  const t0 = zoomed ? zoomed[0] : points.length ? Number(points[0][0]) : 0;
  let t1 = zoomed ? zoomed[1] : points.length ? Number(points[points.length - 1][0]) : 1;
  let most = 1;
  if (ahead && !zoomed) { t1 = Math.max(t1, ahead.t1); most = ahead.top; }
  for (const p of points) {
    if (zoomed && (Number(p[0]) < t0 || Number(p[0]) > t1)) continue;
    for (let i = 1; i <= 4; i++) if (p[i] !== null && Number(p[i]) > most) most = Number(p[i]);
  }
  const axis = byteTicks(most);
  const span = t1 > t0 ? t1 - t0 : 1;
  const bottom = plot.top + plot.height;
  return {
    t0, t1, top: axis.top, ticks: axis.ticks,
    x: (t) => plot.left + ((t - t0) / span) * plot.width,
    y: (b) => bottom - (b / axis.top) * plot.height,
    yf: (f) => bottom - f * plot.height,
  };
}

/** A label's widest (an ellipsis cuts it): with the gap, where markers are dense a label
 * starts at most ~100 px after the previous one in its lane. */
export const LABEL_MAX_W = 90;
export const LABEL_GAP = 6;

/**
 * Where each marker label goes so that none overprints another: OOM labels (`first`) are placed
 * before the rest; then labels in x order take the first of `lanes` rows where they end `gap`
 * pixels clear of every label there; a label no row has room for is left out (thinned: its full
 * text stays on hover).
 * @param {{x: number, width: number, first?: boolean}[]} items
 * @param {number} lanes
 * @param {number} gap
 * @returns {number[]} the lane of each item, -1 when left out
 */
export function labelLanes(items, lanes = LABEL_LANES, gap = LABEL_GAP) {
  const byX = (/** @type {number} */ a, /** @type {number} */ b) => items[a].x - items[b].x;
  const idx = items.map((_, i) => i);
  const order = [...idx.filter((i) => items[i].first).sort(byX),
    ...idx.filter((i) => !items[i].first).sort(byX)];
  const ends = new Array(lanes).fill(-Infinity);
  /** @type {[number, number][][]} the OOM labels' spans, per lane */
  const fixed = Array.from({ length: lanes }, () => []);
  const out = new Array(items.length).fill(-1);
  for (const i of order) {
    const lo = items[i].x, hi = lo + items[i].width;
    const clear = (/** @type {number} */ lane) => fixed[lane]
      .every(([a, b]) => hi + gap <= a || b + gap <= lo);
    const lane = items[i].first
      ? fixed.findIndex((_, l) => clear(l))
      : ends.findIndex((end, l) => end + gap <= lo && clear(l));
    if (lane < 0) continue;
    out[i] = lane;
    if (items[i].first) fixed[lane].push([lo, hi]);
    else ends[lane] = hi;
  }
  return out;
}

/**
 * A label cut to `maxWidth` pixels with an ellipsis (`measure`: the text's width).
 * @param {string} text
 * @param {number} maxWidth
 * @param {(t: string) => number} measure
 * @returns {string}
 */
export function fitLabel(text, maxWidth, measure) {
  if (measure(text) <= maxWidth) return text;
  let lo = 0, hi = text.length;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (measure(text.slice(0, mid) + "…") <= maxWidth) lo = mid; else hi = mid - 1;
  }
  return text.slice(0, lo) + "…";
}

const EPOCH_LO = 946684800; // 2000-01-01: earlier "times" are a counter, not a wall clock
const EPOCH_HI = 4102444800; // 2100-01-01

/**
 * The legend's time span: clock times when the points carry Unix times, otherwise the raw
 * values (the allocator model's tick clock, or trace entry indices), which as dates would read
 * as 1970.
 * @param {number} t0
 * @param {number} t1
 * @returns {string}
 */
export function spanText(t0, t1) {
  /** @param {number} t */
  const num = (t) => Number(t.toPrecision(6)).toLocaleString("en-US", { maximumFractionDigits: 6 });
  if (t0 >= EPOCH_LO && t1 <= EPOCH_HI) {
    const clock = (/** @type {number} */ t) => new Date(t * 1000).toLocaleTimeString();
    return `${clock(t0)} – ${clock(t1)} (${num(Math.round((t1 - t0) * 1000) / 1000)} s)`;
  }
  return `t ${num(t0)} – ${num(t1)} (recorded clock, not wall time)`;
}

/**
 * A point's figures as the hover names them (the series present).
 * @param {(number | null)[]} p
 * @returns {string}
 */
export function pointText(p) {
  return SERIES.slice().reverse().filter((s) => p[s.field] !== null && p[s.field] !== undefined)
    .map((s) => `${s.label.split(" (")[0]} ${s.right ? Number(p[s.field]).toFixed(3)
      : formatSize(Number(p[s.field]))}`).join(" · ");
}

/**
 * Where a forecast's projection goes, in time and bytes: from the fitted level at the last
 * reading, straight to the limit at the forecast time (`end`), and its band, the same at the
 * slope's lower and upper bounds (`low`, `high`: when the lower bound reaches the limit beyond
 * `until`, its edge stops at `until`, short of the limit). `until`: the time axis' end, the
 * projection and the span it needs shown (the time to OOM and a tenth more, at most four times
 * the span of `points` beyond it: the rest runs off the plot). Null without a forecast.
 * @param {Forecast | null | undefined} f
 * @param {number} tFirst the first point's time
 * @returns {{start: [number, number], end: [number, number], low: [number, number],
 *   high: [number, number], until: number} | null}
 */
export function projection(f, tFirst) {
  if (!f || !(f.seconds > 0) || !(f.capacity > 0)) return null;
  const t = Number(f.t_last);
  const span = Math.max(1, t - tFirst);
  const until = t + Math.min(f.seconds * 1.1, 4 * span);
  const high = f.high === null || f.high === undefined ? Infinity : Number(f.high);
  const at = (/** @type {number} */ s) => (s <= until - t ? [t + s, f.capacity]
    : [until, f.level + Number(f.rate_low) * (until - t)]);
  return {
    start: [t, f.level], end: [t + f.seconds, f.capacity],
    low: [t + f.low, f.capacity], high: /** @type {[number, number]} */ (at(high)), until,
  };
}

/**
 * The time span after a zoom by `factor` (< 1: in) around time `at`, kept inside the whole span
 * [lo, hi]; null when it would show all of it.
 * @param {[number, number] | null} zoomed the span shown (null: all)
 * @param {number} lo @param {number} hi the whole span
 * @param {number} at @param {number} factor
 * @returns {[number, number] | null}
 */
export function zoomSpan(zoomed, lo, hi, at, factor) {
  const [a, b] = zoomed || [lo, hi];
  const span = Math.max((b - a) * factor, (hi - lo) / 10000);
  if (span >= hi - lo) return null;
  const frac = b > a ? (at - a) / (b - a) : 0.5;
  let n0 = at - frac * span;
  n0 = Math.min(Math.max(n0, lo), hi - span);
  return [n0, n0 + span];
}

/**
 * @param {HTMLElement} host
 * @param {{onSync: (since: number) => void, colours: () => import("./palette.js").Colours}} opts
 */
export function createTimeline(host, opts) {
  const wrap = document.createElement("div");
  wrap.className = "gmv-timeline";
  const canvas = document.createElement("canvas");
  canvas.height = TL_H;
  const legend = document.createElement("div");
  legend.className = "gmv-tl-legend";
  const keys = document.createElement("div");
  keys.className = "gmv-tl-keys";
  const span = document.createElement("span");
  span.className = "gmv-tl-span";
  legend.append(keys, span);
  const said = document.createElement("div");  // the forecast's sentence, when there is one
  said.className = "gmv-tl-forecast";
  said.hidden = true;
  // the sentence is the projection's legend: its key, a dash in the line's colour, before it
  const saidKey = document.createElement("i");
  saidKey.className = "gmv-tl-swatch";
  saidKey.style.borderTopStyle = "dashed";
  const saidText = document.createTextNode("");
  said.append(saidKey, saidText);
  wrap.append(canvas, legend, said);
  wrap.hidden = true;  // a fixed snapshot has no timeline: no empty band
  host.append(wrap);
  /** @type {(number | null)[][]} */
  let points = [];
  /** @type {Mark[]} */
  let marks = [];
  let next = 0;
  let raf = 0;
  let waiting = false;  // cleared for another device: points count again from its reset on
  /** @type {Set<number>} the devices whose history the points held are (the canvas says) */
  let devices = new Set();
  /** @param {TimelineUpdate} msg */
  const deviceOf = (msg) => (typeof msg.device === "number" ? [msg.device] : []);
  /** @type {{x: number, label: string}[]} markers drawn, for the hover */
  let placed = [];
  /** @type {ReturnType<typeof timelineScale> | null} */
  let scale = null;
  /** @type {number[]} x of each marker that has a label (drawn or thinned) */
  let labelXs = [];
  /** @type {[number, number] | null} the zoomed time span (null: everything) */
  let zoomed = null;
  /** @type {Forecast | null} the live forecast (null: none, the trend is not clear) */
  let forecast = null;
  // the wheel zooms the time axis around the pointer (labels are thinned anew at each zoom);
  // a double click shows everything again
  canvas.addEventListener("wheel", (ev) => {
    if (!scale || points.length < 2) return;
    ev.preventDefault();
    const r = canvas.getBoundingClientRect();
    const x = ((ev.clientX - r.left) * canvas.width) / Math.max(1, r.width);
    const s = scale;
    const at = s.t0 + ((x - AXIS_L) / Math.max(1, canvas.width - AXIS_L - AXIS_R)) * (s.t1 - s.t0);
    zoomed = zoomSpan(zoomed, Number(points[0][0]), Number(points[points.length - 1][0]), at,
      ev.deltaY < 0 ? 0.5 : 2);
    schedule();
  }, { passive: false });
  canvas.addEventListener("dblclick", () => { zoomed = null; schedule(); });
  canvas.addEventListener("mousemove", (ev) => {
    const r = canvas.getBoundingClientRect();
    const x = ((ev.clientX - r.left) * canvas.width) / Math.max(1, r.width);
    const near = placed.filter((p) => Math.abs(p.x - x) <= 4 && p.label).map((p) => p.label);
    let at = "";
    if (scale && points.length) {
      const s = scale;
      let best = 0;
      for (let i = 0; i < points.length; i++) {
        if (Math.abs(s.x(Number(points[i][0])) - x) < Math.abs(s.x(Number(points[best][0])) - x)) best = i;
      }
      at = pointText(points[best]);
    }
    canvas.title = [at, ...near].filter(Boolean).join("\n");
  });

  /** @param {string[]} drawn the series keys drawn @param {import("./palette.js").Colours} c */
  function drawLegend(drawn, c) {
    keys.replaceChildren(...SERIES.filter((s) => drawn.includes(s.key)).reverse().map((s) => {
      const item = document.createElement("span");
      item.className = "gmv-tl-key";
      item.dataset.series = s.key;
      item.dataset.colour = c[s.key];
      const sw = document.createElement("i");
      sw.className = "gmv-tl-swatch";
      sw.style.borderTopColor = c[s.key];
      sw.style.borderTopStyle = s.dash.length ? "dashed" : "solid";
      item.append(sw, document.createTextNode(s.label));
      return item;
    }));
  }

  function draw() {
    raf = 0;
    const width = Math.max(240, wrap.clientWidth || 600);
    if (canvas.width !== width) canvas.width = width;
    const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d"));
    const c = opts.colours();
    ctx.fillStyle = c.bg;
    ctx.fillRect(0, 0, width, TL_H);
    canvas.dataset.points = String(points.length);
    canvas.dataset.devices = [...devices].sort((a, b) => a - b).join(",");
    canvas.dataset.marks = String(marks.length);
    wrap.hidden = !points.length;
    if (!points.length) { scale = null; labelXs = []; return; }
    const plot = { left: AXIS_L, top: PLOT_TOP, width: width - AXIS_L - AXIS_R,
      height: TL_H - PLOT_TOP - PLOT_BOTTOM };
    const ahead = projection(forecast, Number(points[0][0]));
    const s = timelineScale(points, plot, zoomed,
      ahead && forecast ? { t1: ahead.until, top: forecast.capacity } : null);
    canvas.dataset.window = zoomed ? JSON.stringify(zoomed) : "";
    scale = s;
    const bottom = plot.top + plot.height;
    // the axes: byte ticks on the left (grid lines across), fragmentation 0..1 on the right
    ctx.font = "10px sans-serif";
    ctx.textBaseline = "middle";
    ctx.lineWidth = 1;
    /** @type {string[]} */
    const yTicks = [];
    for (const v of s.ticks) {
      const y = Math.round(s.y(v)) + 0.5;
      ctx.strokeStyle = c.empty;
      ctx.beginPath(); ctx.moveTo(plot.left, y); ctx.lineTo(plot.left + plot.width, y); ctx.stroke();
      const text = tickText(v);
      ctx.fillStyle = c.muted;
      ctx.textAlign = "right";
      ctx.fillText(text, plot.left - 4, y);
      yTicks.push(text);
    }
    /** @type {string[]} */
    const fTicks = [];
    const drawnKeys = SERIES.filter((sr) => points.some((p) => p[sr.field] !== null && p[sr.field] !== undefined))
      .map((sr) => sr.key);
    if (drawnKeys.includes("fragmentation")) {
      ctx.textAlign = "left";
      ctx.fillStyle = c.fragmentation;
      for (const f of [0, 0.5, 1]) {
        ctx.fillText(String(f), plot.left + plot.width + 4, s.yf(f));
        fTicks.push(String(f));
      }
    }
    ctx.textAlign = "left";
    ctx.strokeStyle = c.muted;
    ctx.beginPath();
    ctx.moveTo(plot.left + 0.5, plot.top); ctx.lineTo(plot.left + 0.5, bottom);
    ctx.lineTo(plot.left + plot.width, bottom);
    ctx.stroke();
    canvas.dataset.yTicks = JSON.stringify(yTicks);
    canvas.dataset.fragTicks = JSON.stringify(fTicks);
    ctx.lineWidth = 1.5;
    ctx.save();
    ctx.beginPath();
    ctx.rect(plot.left, 0, plot.width, TL_H);
    ctx.clip();
    for (const sr of SERIES) {
      if (!drawnKeys.includes(sr.key)) continue;
      ctx.strokeStyle = c[sr.key];
      ctx.setLineDash(sr.dash);
      ctx.beginPath();
      let open = false;
      for (const p of points) {
        const v = p[sr.field];
        if (v === null || v === undefined) { open = false; continue; }
        const x = s.x(Number(p[0]));
        const y = sr.right ? s.yf(Number(v)) : s.y(Number(v));
        if (open) ctx.lineTo(x, y); else ctx.moveTo(x, y);
        open = true;
      }
      ctx.stroke();
    }
    // the forecast: its band, the dashed line on to the limit, the limit itself
    canvas.dataset.forecast = "";
    if (ahead && forecast) {
      /** @param {[number, number]} p @returns {[number, number]} */
      const px = (p) => [s.x(p[0]), s.y(p[1])];
      const [x0, y0] = px(ahead.start), [x1, y1] = px(ahead.end);
      ctx.fillStyle = c.oom;
      ctx.globalAlpha = 0.15;
      ctx.beginPath();
      ctx.moveTo(x0, y0);
      ctx.lineTo(...px(ahead.low));
      ctx.lineTo(...px(ahead.high));
      ctx.closePath();
      ctx.fill();
      ctx.globalAlpha = 1;
      ctx.strokeStyle = c.oom;
      ctx.setLineDash([6, 4]);
      ctx.beginPath(); ctx.moveTo(x0, y0); ctx.lineTo(x1, y1); ctx.stroke();
      ctx.lineWidth = 1;
      ctx.setLineDash([2, 3]);
      const yc = Math.round(s.y(forecast.capacity)) + 0.5;
      ctx.beginPath(); ctx.moveTo(plot.left, yc); ctx.lineTo(plot.left + plot.width, yc); ctx.stroke();
      canvas.dataset.forecast = JSON.stringify([x0, y0, x1, y1].map(Math.round));
    }
    ctx.restore();
    ctx.setLineDash([]);
    ctx.lineWidth = 1;
    said.hidden = !forecast;
    saidKey.style.borderTopColor = c.oom;
    saidText.data = forecast ? forecast.sentence : "";
    canvas.dataset.series = drawnKeys.join(",");
    drawLegend(drawnKeys, c);
    // markers: a tick each under the label lanes; OOMs a full-height line, always
    placed = [];
    /** @type {{x: number, width: number, text: string, first: boolean, kind: string}[]} */
    const labels = [];
    let lo = Infinity, hi = -Infinity;
    /** @type {number[]} */
    const marked = [];  // the x of each marker with a label
    for (const m of marks) {
      if (m.t < s.t0 || m.t > (zoomed ? s.t1 : s.t1 + 1)) continue;
      const x = Math.min(plot.left + plot.width - 1, Math.round(s.x(m.t)));
      const oom = m.kind === "oom";
      ctx.fillStyle = oom ? c.oom : m.kind === "cell" ? c.muted : c.text;
      if (oom) ctx.fillRect(x, PLOT_TOP - 4, 2, bottom - PLOT_TOP + 4);
      else ctx.fillRect(x, PLOT_TOP - 4, 1, 4);
      placed.push({ x, label: m.label });
      if ((m.kind === "cell" || !m.label) && !oom) continue;
      lo = Math.min(lo, x); hi = Math.max(hi, x);
      marked.push(x);
      const text = fitLabel(oom ? m.label || "OOM" : m.label, LABEL_MAX_W,
        (t) => ctx.measureText(t).width);
      const w = Math.ceil(ctx.measureText(text).width);
      // a label that would run past the canvas ends at its edge instead (left of its marker)
      labels.push({ x: Math.max(0, Math.min(x, width - 1 - w)), width: w, text, first: oom,
        kind: m.kind });
    }
    const lanes = labelLanes(labels);
    labelXs = marked;
    /** @type {[number, number, number, number, string, string][]} */
    const boxes = [];
    ctx.textBaseline = "alphabetic";
    labels.forEach((l, i) => {
      if (lanes[i] < 0) return;
      const y = lanes[i] * LANE_H;
      ctx.fillStyle = l.first ? c.oom : c.text;
      ctx.fillText(l.text, l.x, y + LANE_H - 2);
      if (!l.first) {  // a faint line down from a drawn label, through the curves
        ctx.globalAlpha = 0.25;
        ctx.fillRect(l.x, PLOT_TOP, 1, bottom - PLOT_TOP);
        ctx.globalAlpha = 1;
      }
      boxes.push([l.x, y, l.width, LANE_H, l.text, l.kind]);
    });
    canvas.dataset.labels = String(boxes.length);
    canvas.dataset.labelsThinned = String(labels.length - boxes.length);
    canvas.dataset.labelBoxes = JSON.stringify(boxes);
    canvas.dataset.markSpan = JSON.stringify(labels.length ? [lo, hi] : []);
    // the points' span (a forecast's reach runs the axis on past them)
    span.textContent = `${spanText(s.t0, zoomed ? s.t1 : Number(points[points.length - 1][0]))}` +
      (marks.length ? ` · last marker: ${marks[marks.length - 1].label}` : "");
  }
  const schedule = () => { if (!raf) raf = requestAnimationFrame(draw); };
  // the theme's colours are read at each draw: a theme change redraws
  const theme = new MutationObserver(schedule);
  theme.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name"] });

  return {
    /** @param {TimelineUpdate} msg */
    apply(msg) {
      if (msg.reset) {
        zoomed = null;
        points = msg.points.slice();
        marks = (msg.marks || []).slice();
        waiting = false;
        devices = new Set(deviceOf(msg));
      } else if (waiting) {
        return;  // the device shown before: its points wait for the new device's reset
      } else if (msg.first === next) {
        points.push(...msg.points);
        for (const d of deviceOf(msg)) devices.add(d);
        if (points.length > 4000) points.splice(0, points.length - 4000);
      } else if (msg.first > next) {
        opts.onSync(next);  // missed some: ask for what follows what we hold
        return;
      } else {
        return;  // already held
      }
      next = msg.first + msg.points.length;
      schedule();
    },
    /** @param {Forecast | Record<string, never> | null} f the live forecast ({}: none) */
    setForecast(f) {
      forecast = f && "seconds" in f ? /** @type {Forecast} */ (f) : null;
      schedule();
    },
    get forecast() { return forecast; },
    /** @param {Mark[]} more */
    addMarks(more) { if (!waiting) { marks.push(...more); schedule(); } },
    /** Forget what is held (another device was chosen) until the next reset arrives. */
    clear() {
      zoomed = null;
      forecast = null;
      points = [];
      marks = [];
      next = 0;
      waiting = true;
      devices = new Set();
      schedule();
    },
    get points() { return points; },
    get marks() { return marks; },
    get canvas() { return canvas; },
    /** @param {[number, number] | null} span the time span to show (null: all of it) */
    zoom(span) { zoomed = span; schedule(); },
    /** the labelled markers' x (drawn or thinned) and the drawn labels' boxes, in pixels */
    get labelled() { return { xs: labelXs.slice(), boxes: JSON.parse(canvas.dataset.labelBoxes || "[]") }; },
    drawNow: draw,
    destroy() { if (raf) cancelAnimationFrame(raf); theme.disconnect(); wrap.remove(); },
  };
}
