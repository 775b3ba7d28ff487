// A job's selected rank in detail (widget/job.py `JobPanel`): there is no segment state to draw,
// so its published 64-bin map drawn large, what it is (a summary, not the full map), the rank's
// own fields, and the button that asks the rank for its full snapshot, with the answer.
import { formatSize } from "./rows.js";
import { paintBins } from "./strips.js";

/**
 * The `job` trait.
 * @typedef {{rank?: number, state?: string, text?: string, path?: string, hint?: string}} Asked
 * @typedef {{address?: string, interval?: number, ranks?: number, devices?: number,
 *   stale?: number[], stopped?: string | null, selected?: {rank: number, device: number} | null,
 *   detail?: Record<string, unknown> | null, what?: string, snapshot?: Asked}} Job
 */

export const DETAIL_H = 40;

/** @param {unknown} v */
const text = (v) => (v === undefined || v === null ? "?" : String(v));

/**
 * The rank's own fields, one line.
 * @param {Record<string, unknown>} d
 * @returns {string}
 */
export function rankFields(d) {
  const age = typeof d.age_s === "number" ? `${d.age_s.toFixed(1)} s ago` : "never";
  const oom = /** @type {Record<string, unknown> | null} */ (
    d.last_oom && typeof d.last_oom === "object" ? d.last_oom : null);
  const size = oom && typeof oom.alloc_size === "number" ? ` asking ${formatSize(oom.alloc_size)}` : "";
  const verdict = oom ? `${text(oom.cause)}${size}` : "none";
  const room = typeof d.headroom === "number" ? formatSize(d.headroom) : "?";
  return `host ${text(d.host)} · pid ${text(d.pid)} · local rank ${text(d.local_rank)}` +
    ` · updated ${age}${d.stale ? " (stale)" : ""} · headroom ${room}` +
    ` · last OOM: ${verdict} · source ${text(d.source)}`;
}

/**
 * @param {HTMLElement} host
 * @param {(name: string, args: Record<string, unknown>) => string} send
 */
export function createJobDetail(host, send) {
  const wrap = document.createElement("div");
  wrap.className = "gmv-job";
  wrap.hidden = true;
  const what = document.createElement("div");
  what.className = "gmv-job-what";
  const canvas = document.createElement("canvas");
  canvas.className = "gmv-job-map";
  const fields = document.createElement("div");
  fields.className = "gmv-job-fields";
  const ask = document.createElement("button");
  ask.className = "gmv-job-snapshot";
  ask.type = "button";
  const result = document.createElement("div");
  result.className = "gmv-job-result";
  const hint = document.createElement("div");
  hint.className = "gmv-job-hint";
  const row = document.createElement("div");
  row.className = "gmv-job-ask";
  row.append(ask, result);
  wrap.append(what, canvas, fields, row, hint);
  host.append(wrap);
  /** @type {Job} */
  let shown = {};
  ask.addEventListener("click", () => {
    const sel = shown.selected;
    if (sel) send("rank_snapshot", { rank: sel.rank });
  });

  /** @param {Job} job */
  function update(job) {
    shown = job || {};
    wrap.hidden = !shown.address;
    const d = shown.detail;
    wrap.dataset.rank = d && typeof d.rank === "number" ? String(d.rank) : "";
    if (!d) {
      what.textContent = shown.address ? "click a strip for its published map" : "";
      canvas.hidden = fields.hidden = row.hidden = hint.hidden = true;
      return;
    }
    canvas.hidden = fields.hidden = row.hidden = false;
    what.textContent = `${text(d.title)}: ${shown.what || ""}`;
    const bins = Array.isArray(d.bins) ? d.bins.filter((b) => typeof b === "number") : [];
    canvas.dataset.bins = String(bins.length);
    paintBins(canvas, bins, DETAIL_H, wrap);
    fields.textContent = rankFields(d);
    const asked = shown.snapshot || {};
    const mine = asked.rank === d.rank || asked.state === "asking";
    ask.textContent = `ask rank ${text(d.rank)} for its snapshot`;
    ask.disabled = asked.state === "asking";
    result.textContent = mine ? asked.text || "" : "";
    result.dataset.state = mine ? asked.state || "" : "";
    result.dataset.path = mine && asked.path ? asked.path : "";
    hint.hidden = !(mine && asked.hint);
    hint.textContent = mine && asked.hint ? `open it: ${asked.hint}` : "";
  }

  return {
    update,
    get element() { return wrap; },
    destroy() { wrap.remove(); },
  };
}
