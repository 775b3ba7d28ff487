// The timeline: allocated, reserved, NVML used, non-PyTorch memory and fragmentation over time,
// with step and per-cell markers. Points arrive incrementally; a gap asks for a resync.

/** Point fields, as render/timeline.py FIELDS. */
export const FIELDS = ["t", "allocated", "reserved", "nvml_used", "non_pytorch", "fragmentation"];
export const TL_H = 90;

/**
 * @typedef {{t: number, label: string, kind: string}} Mark a step or cell marker
 *   (render/timeline.py)
 * @typedef {{first: number, points: (number | null)[][], reset?: boolean, marks?: Mark[]}}
 *   TimelineUpdate points from index `first` on (`reset`: instead of those held)
 */

/**
 * Where each point goes: x by time over the whole span, y by bytes (top = the largest byte
 * figure) and, for fragmentation, 0..1 over the same height.
 * @param {(number | null)[][]} points
 * @param {number} width
 * @param {number} height
 * @returns {{x: (t: number) => number, y: (bytes: number) => number, yf: (f: number) => number,
 *   t0: number, t1: number, top: number}}
 */
export function timelineScale(points, width, height) {
  const t0 = points.length ? Number(points[0][0]) : 0;
  const t1 = points.length ? Number(points[points.length - 1][0]) : 1;
  let top = 1;
  for (const p of points) for (let i = 1; i <= 4; i++) if (p[i] !== null && Number(p[i]) > top) top = Number(p[i]);
  const span = t1 > t0 ? t1 - t0 : 1;
  return {
    t0, t1, top,
    x: (t) => ((t - t0) / span) * (width - 1),
    y: (b) => height - 1 - (b / top) * (height - 4),
    yf: (f) => height - 1 - f * (height - 4),
  };
}

export const LABEL_LANES = 3;
export const LANE_H = 11;
export const LABEL_MAX_W = 160;
export const LABEL_GAP = 6;

/**
 * Where each marker label goes so that none overprints another: labels in x order take the
 * first of `lanes` rows whose last label ends `gap` pixels before them; a label no row has room
 * for is left out (thinned: its full text stays on hover).
 * @param {{x: number, width: number}[]} items
 * @param {number} lanes
 * @param {number} gap
 * @returns {number[]} the lane of each item, -1 when left out
 */
export function labelLanes(items, lanes = LABEL_LANES, gap = LABEL_GAP) {
  const order = items.map((_, i) => i).sort((a, b) => items[a].x - items[b].x);
  const ends = new Array(lanes).fill(-Infinity);
  const out = new Array(items.length).fill(-1);
  for (const i of order) {
    const lane = ends.findIndex((end) => end + gap <= items[i].x);
    if (lane < 0) continue;
    out[i] = lane;
    ends[lane] = items[i].x + items[i].width;
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
 * @param {HTMLElement} host
 * @param {{onSync: (since: number) => void, colours: () => Record<string, string>}} opts
 */
export function createTimeline(host, opts) {
  const wrap = document.createElement("div");
  wrap.className = "gmv-timeline";
  const canvas = document.createElement("canvas");
  canvas.height = TL_H;
  const legend = document.createElement("div");
  legend.className = "gmv-tl-legend";
  wrap.append(canvas, legend);
  wrap.hidden = true;  // a fixed snapshot has no timeline: no empty band
  host.append(wrap);
  /** @type {(number | null)[][]} */
  let points = [];
  /** @type {Mark[]} */
  let marks = [];
  let next = 0;
  let raf = 0;
  /** @type {{x: number, label: string}[]} markers drawn, for the hover */
  let placed = [];
  canvas.addEventListener("mousemove", (ev) => {
    const r = canvas.getBoundingClientRect();
    const x = ((ev.clientX - r.left) * canvas.width) / Math.max(1, r.width);
    const near = placed.filter((p) => Math.abs(p.x - x) <= 4 && p.label).map((p) => p.label);
    canvas.title = near.join("\n");
  });

  function draw() {
    raf = 0;
    const width = Math.max(200, wrap.clientWidth || 600);
    if (canvas.width !== width) canvas.width = width;
    const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d"));
    const c = opts.colours();
    ctx.fillStyle = c.bg;
    ctx.fillRect(0, 0, width, TL_H);
    canvas.dataset.points = String(points.length);
    canvas.dataset.marks = String(marks.length);
    wrap.hidden = !points.length;
    if (!points.length) return;
    const s = timelineScale(points, width, TL_H);
    /** @param {number} field @param {string} colour @param {boolean} frac */
    const line = (field, colour, frac) => {
      ctx.strokeStyle = colour;
      ctx.beginPath();
      let open = false;
      for (const p of points) {
        const v = p[field];
        if (v === null || v === undefined) { open = false; continue; }
        const x = s.x(Number(p[0]));
        const y = frac ? s.yf(Number(v)) : s.y(Number(v));
        if (open) ctx.lineTo(x, y); else ctx.moveTo(x, y);
        open = true;
      }
      ctx.stroke();
    };
    line(3, c.text, false);
    line(4, c.pending, false);
    line(2, c.muted, false);
    line(1, c.allocated, false);
    line(5, c.trapped, true);
    ctx.font = "10px sans-serif";
    placed = [];
    /** @type {{x: number, width: number, text: string}[]} */
    const labels = [];
    for (const m of marks) {
      if (m.t < s.t0 || m.t > s.t1 + 1) continue;
      const x = Math.min(width - 2, s.x(m.t));
      ctx.fillStyle = m.kind === "cell" ? c.muted : c.text;
      ctx.fillRect(x, 0, 1, TL_H);
      placed.push({ x, label: m.label });
      if (m.kind === "cell" || !m.label) continue;
      const text = fitLabel(m.label, LABEL_MAX_W, (t) => ctx.measureText(t).width);
      labels.push({ x: x + 3, width: ctx.measureText(text).width, text });
    }
    const lanes = labelLanes(labels);
    ctx.fillStyle = c.text;
    labels.forEach((l, i) => { if (lanes[i] >= 0) ctx.fillText(l.text, l.x, 10 + lanes[i] * LANE_H); });
    const shownLabels = lanes.filter((l) => l >= 0).length;
    canvas.dataset.labels = String(shownLabels);
    canvas.dataset.labelsThinned = String(labels.length - shownLabels);
    legend.textContent = `${spanText(s.t0, s.t1)} · allocated, reserved, NVML used, ` +
      `non-PyTorch (0 – ${Math.round(s.top / 2 ** 20)} MiB), fragmentation (0 – 1)` +
      (marks.length ? ` · last marker: ${marks[marks.length - 1].label}` : "");
  }
  const schedule = () => { if (!raf) raf = requestAnimationFrame(draw); };

  return {
    /** @param {TimelineUpdate} msg */
    apply(msg) {
      if (msg.reset) {
        points = msg.points.slice();
        marks = (msg.marks || []).slice();
      } else if (msg.first === next) {
        points.push(...msg.points);
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
    /** @param {Mark[]} more */
    addMarks(more) { marks.push(...more); schedule(); },
    get points() { return points; },
    get marks() { return marks; },
    destroy() { if (raf) cancelAnimationFrame(raf); wrap.remove(); },
  };
}
