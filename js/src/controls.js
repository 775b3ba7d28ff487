// The header above the map: title, badges, status line, figures and the colour legend.
import { KIND_NAMES } from "./decode.js";
import { EXP_KEY, formatSize } from "./rows.js";

/** Figures in display order: [key, label, is bytes]. */
export const FIGURES = /** @type {const} */ ([
  ["reserved", "reserved", true],
  ["allocated", "allocated", true],
  ["peak_reserved", "peak reserved (sampled)", true],
  ["peak_allocated", "peak allocated (sampled)", true],
  ["free", "free in reserved", true],
  ["free_stuck", "stuck after empty_cache", true],
  ["free_releasable", "releasable", true],
  ["largest_free", "largest free block", true],
  ["pending_free", "pending free", true],
  ["nvml_used", "NVML used", true],
  ["nvml_total", "NVML total", true],
  ["fragmentation", "fragmentation", false],
  ["num_alloc_retries", "alloc retries", false],
  ["num_ooms", "OOMs", false],
  ["segments", "segments", false],
  ["blocks", "blocks", false],
]);

/**
 * @typedef {{n: number, position: number, times: false, t_first?: undefined, t_last?: undefined,
 *   time_us?: undefined} | {n: number, position: number, times: true, t_first: number,
 *   t_last: number, time_us: number | null}} Replay the `controls` trait's ``replay``: a trace
 *   recorded with ``time_us`` has times (panel.py `_controls`)
 * @typedef {{live?: boolean, capabilities?: string[], paused?: boolean, interval?: number | null,
 *   routing?: string, replay?: Replay | null, can_reset_peaks?: boolean, devices?: number[],
 *   device?: number | null}} Controls the `controls` trait: what the buttons can do now
 * @typedef {{id: string, name: string, ok: boolean, text: string, thread?: string, ms?: number,
 *   url?: string, path?: string}} Reply a `reply` message: a command's outcome (panel.py `command`)
 */

const LEGEND = [
  "allocated",
  "pending free",
  "free, empty_cache releases it",
  "free, stays after empty_cache",
];

/**
 * Format one figure for display.
 * @param {string} key
 * @param {unknown} value
 * @param {boolean} bytes
 */
export function formatFigure(key, value, bytes) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (bytes) return formatSize(value);
  if (key === "fragmentation") return value.toFixed(3);
  return value.toLocaleString("en-US");
}

/**
 * The OOM line: cause and explanation of the last captured out-of-memory error ("" if none).
 * @param {Record<string, unknown> | undefined} oom
 */
export function oomText(oom) {
  if (!oom || !oom.cause) return "";
  if (typeof oom.sentence === "string") {  // gpumemviz.analyze's verdict, with ranked actions
    const actions = Array.isArray(oom.actions) ? oom.actions : [];
    const todo = actions.map((a, i) => `${i + 1}. ${a.sentence} (${formatSize(Number(a.effect))})`);
    return todo.length ? `${oom.sentence}. What to do: ${todo.join("; ")}` : oom.sentence;
  }
  const size = typeof oom.alloc_size === "number" ? ` of ${formatSize(oom.alloc_size)}` : "";
  const where = typeof oom.device === "number" ? ` on cuda:${oom.device}` : "";
  return `OOM${where}${size} (${oom.cause}): ${oom.explanation || ""}`.trim();
}

/**
 * The replay readout: the entry, and its recorded time where the trace has ``time_us``.
 * @param {Replay} r the `controls` trait's ``replay``
 */
export function replayText(r) {
  const entry = `entry ${r.position + 1} of ${r.n}`;
  if (!r.times) return `${entry} · events only (no recorded times)`;
  if (r.time_us === null || r.time_us === undefined || r.t_first === undefined) {
    return `${entry} · before the first event`;
  }
  const clock = new Date(r.time_us / 1000).toISOString().slice(11, 23);
  return `${entry} · +${((r.time_us - r.t_first) / 1e6).toFixed(3)} s (${clock} UTC)`;
}

/** @param {HTMLElement} host */
export function createHeader(host) {
  const root = document.createElement("div");
  root.className = "gmv-header";
  const top = document.createElement("div");
  top.className = "gmv-top";
  const title = document.createElement("span");
  title.className = "gmv-title";
  const demo = document.createElement("span");
  demo.className = "gmv-badge";
  demo.textContent = "demo data";
  const status = document.createElement("span");
  status.className = "gmv-status";
  top.append(title, demo, status);
  const figs = document.createElement("div");
  figs.className = "gmv-figs";
  const oom = document.createElement("div");
  oom.className = "gmv-oom";
  oom.hidden = true;
  const advice = document.createElement("ul");
  advice.className = "gmv-advice";
  const legend = document.createElement("div");
  legend.className = "gmv-legend";
  KIND_NAMES.forEach((kind, i) => {
    const item = document.createElement("span");
    const sw = document.createElement("i");
    sw.className = `gmv-swatch gmv-k${i}`;
    item.append(sw, document.createTextNode(LEGEND[i]));
    item.dataset.kind = kind;
    legend.append(item);
  });
  const key = document.createElement("span");
  key.className = "gmv-legend-key";
  key.textContent = EXP_KEY;
  legend.append(key);
  root.append(top, figs, oom, advice, legend);
  host.append(root);

  return {
    /**
     * @param {{title: string, status: string, demo: boolean, header: Record<string, unknown>,
     *   advice?: {kind: string, message: string}[], oom?: Record<string, unknown>}} s
     */
    update(s) {
      title.textContent = s.title || "GPU memory";
      demo.hidden = !s.demo;
      status.textContent = s.status || "";
      figs.replaceChildren();
      for (const [key, label, bytes] of FIGURES) {
        if (!(key in s.header)) continue;
        const fig = document.createElement("span");
        fig.className = "gmv-fig";
        fig.dataset.fig = key;
        fig.dataset.value = String(s.header[key]);
        const b = document.createElement("b");
        b.textContent = formatFigure(key, s.header[key], bytes);
        fig.append(document.createTextNode(`${label} `), b);
        figs.append(fig);
      }
      // text from sources and snapshot files goes in as text nodes only (never as HTML)
      const verdict = oomText(s.oom);
      oom.hidden = !verdict;
      oom.textContent = verdict;
      oom.dataset.cause = s.oom && s.oom.cause ? String(s.oom.cause) : "";
      advice.replaceChildren(...(s.advice || []).map((a) => {
        const li = document.createElement("li");
        li.dataset.kind = String(a.kind);
        li.textContent = String(a.message);
        return li;
      }));
    },
    /** the header's line of title, badges and status (the glance bars go under it) */
    get top() { return top; },
    destroy() { root.remove(); },
  };
}

/** Seconds offered by the interval menu. */
export const INTERVALS = [0.25, 0.5, 1, 2, 5];
/** A command with no reply after this long waits on a busy kernel (routing "main"). */
export const QUEUED_AFTER_MS = 300;

/**
 * What the reply line says while a command waits.
 * @param {string} routing "subshell" or "main"
 * @param {number} waitedMs
 */
export function pendingText(routing, waitedMs) {
  if (waitedMs < QUEUED_AFTER_MS) return "…";
  return routing === "main" ? "queued until the cell finishes" : "working…";
}

/**
 * The buttons. `send(name, args)` posts a command and returns its id.
 * @param {HTMLElement} host
 * @param {(name: string, args: Record<string, unknown>) => string} send
 */
export function createToolbar(host, send) {
  const bar = document.createElement("div");
  bar.className = "gmv-toolbar";
  /** @param {string} cmd @param {string} label */
  const button = (cmd, label) => {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.cmd = cmd;
    b.textContent = label;
    bar.append(b);
    return b;
  };
  const empty = button("empty_cache", "empty cache");
  const exp = button("export", "export snapshot");
  const pause = button("pause", "pause");
  const interval = document.createElement("select");
  interval.dataset.cmd = "interval";
  interval.title = "seconds between reads";
  for (const s of INTERVALS) {
    const o = document.createElement("option");
    o.value = String(s);
    o.textContent = `every ${s} s`;
    interval.append(o);
  }
  bar.append(interval);
  const device = document.createElement("select");
  device.dataset.cmd = "device";
  device.title = "device";
  device.hidden = true;
  bar.append(device);
  const peaks = button("reset_peaks", "reset peaks");
  peaks.title = "resets torch's peak counters (torch.cuda.reset_peak_memory_stats) for everyone "
    + "in this process, and gpumemviz's own peaks; gpumemviz never resets them otherwise";
  const histLabel = document.createElement("label");
  const hist = document.createElement("input");
  hist.type = "checkbox";
  hist.dataset.cmd = "record_history";
  histLabel.append(hist, document.createTextNode(" record history"));
  bar.append(histLabel);
  const fitIn = document.createElement("input");
  fitIn.dataset.cmd = "fit-input";
  fitIn.placeholder = "2GiB";
  fitIn.size = 8;
  fitIn.title = "would a tensor of this size fit now? (2GiB, 512MB, bytes)";
  bar.append(fitIn);
  const fit = button("fit", "would it fit?");
  const replay = document.createElement("div");
  replay.className = "gmv-replay";
  replay.hidden = true;
  const slider = document.createElement("input");
  slider.type = "range";
  slider.dataset.cmd = "seek";
  slider.min = "-1";
  const pos = document.createElement("span");
  pos.className = "gmv-pos";
  const play = button("play", "play");
  const byTimeLabel = document.createElement("label");
  const byTime = document.createElement("input");
  byTime.type = "checkbox";
  byTime.dataset.cmd = "seek-by-time";
  byTime.title = "the slider moves over recorded time (the event at or before it) instead of events";
  byTimeLabel.append(byTime, document.createTextNode(" by time"));
  replay.append(slider, pos, byTimeLabel, play);
  /** @type {Replay | null} */
  let lastReplay = null;
  /** the slider's range and value for the last replay state, in events or in µs since t_first */
  const placeSlider = () => {
    const r = lastReplay;
    if (!r) return;
    const timed = byTime.checked && r.times;
    slider.dataset.mode = timed ? "time" : "events";
    slider.min = timed ? "0" : "-1";
    slider.max = String(timed ? r.t_last - r.t_first : r.n - 1);
    if (document.activeElement === slider) return;
    if (!timed) slider.value = String(r.position);
    else slider.value = String(r.time_us === null ? 0 : r.time_us - r.t_first);
  };
  const line = document.createElement("div");
  line.className = "gmv-reply";
  host.append(bar, replay, line);

  let routing = "main";
  let paused = false;
  /** @type {Map<string, {name: string, t0: number}>} */
  const pending = new Map();
  let timer = 0;

  /** @param {string} name @param {Record<string, unknown>} args */
  function run(name, args = {}) {
    const id = send(name, args);
    pending.set(id, { name, t0: performance.now() });
    line.dataset.state = "pending";
    line.dataset.cmd = name;
    line.textContent = `${name}: ${pendingText(routing, 0)}`;
    clearTimeout(timer);
    timer = setTimeout(() => {
      if (!pending.has(id)) return;
      line.dataset.state = routing === "main" ? "queued" : "pending";
      line.textContent = `${name}: ${pendingText(routing, QUEUED_AFTER_MS)}`;
    }, QUEUED_AFTER_MS);
  }
  empty.onclick = () => run("empty_cache");
  exp.onclick = () => run("export");
  pause.onclick = () => run(paused ? "resume" : "pause");
  interval.onchange = () => run("interval", { value: Number(interval.value) });
  device.onchange = () => run("device", { value: Number(device.value) });
  peaks.onclick = () => run("reset_peaks");
  hist.onchange = () => run("record_history", { on: hist.checked });
  fit.onclick = () => run("fit", { value: fitIn.value });
  fitIn.onkeydown = (ev) => { if (ev.key === "Enter") run("fit", { value: fitIn.value }); };
  slider.onchange = () => {
    // "time" is set only for a replay with times (placeSlider): the last check restates it
    if (slider.dataset.mode === "time" && lastReplay && lastReplay.times) {
      run("seek", { time_us: lastReplay.t_first + Number(slider.value) });
    } else {
      run("seek", { index: Number(slider.value) });
    }
  };
  byTime.onchange = placeSlider;
  play.onclick = () => run("play");

  return {
    /** @param {Controls} c the `controls` trait */
    update(c) {
      const caps = new Set(c.capabilities || []);
      routing = c.routing || "main";
      paused = !!c.paused;
      bar.dataset.routing = routing;
      empty.disabled = !caps.has("empty_cache");
      exp.disabled = c.live ? !caps.has("export") : false;
      pause.disabled = !c.live;
      pause.textContent = paused ? "resume" : "pause";
      pause.dataset.paused = String(paused);
      interval.disabled = !c.live;
      if (typeof c.interval === "number") {
        if (!INTERVALS.includes(c.interval)) {
          const o = document.createElement("option");
          o.value = String(c.interval);
          o.textContent = `every ${c.interval} s`;
          interval.append(o);
        }
        interval.value = String(c.interval);
      }
      const devs = c.devices || [];
      device.hidden = devs.length < 2;
      if (device.options.length !== devs.length) {
        device.replaceChildren(...devs.map((d) => {
          const o = document.createElement("option");
          o.value = String(d);
          o.textContent = `cuda:${d}`;
          return o;
        }));
      }
      if (c.device !== null && c.device !== undefined) device.value = String(c.device);
      peaks.disabled = !c.can_reset_peaks;
      hist.disabled = !caps.has("record_history");
      replay.hidden = !c.replay;
      if (c.replay) {
        lastReplay = c.replay;
        byTime.disabled = !c.replay.times;
        pos.dataset.timeUs = String(c.replay.time_us ?? "");
        pos.dataset.position = String(c.replay.position);
        pos.textContent = replayText(c.replay);
        placeSlider();
      }
    },
    /** @param {Reply} r a `reply` message */
    reply(r) {
      const mine = pending.get(r.id);
      pending.delete(r.id);
      if (!mine && pending.size) return;  // another view's command; ours still waits
      line.dataset.state = r.ok ? "ok" : "error";
      line.dataset.cmd = String(r.name);
      line.dataset.thread = String(r.thread || "");
      line.replaceChildren(document.createTextNode(`${r.name}: ${r.text}`));
      if (r.url) {
        const a = document.createElement("a");
        a.href = String(r.url);
        a.download = "";
        a.target = "_blank";
        a.textContent = "download";
        line.append(document.createTextNode(" · "), a);
      } else if (r.path) {
        line.append(document.createTextNode(` · ${r.path}`));  // no Jupyter server to link
      }
    },
    destroy() { clearTimeout(timer); bar.remove(); replay.remove(); line.remove(); },
  };
}
