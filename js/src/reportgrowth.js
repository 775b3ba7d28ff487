// The report's answers to "is it growing, when will it run out, which rank is worst" (issue 32):
// the growth suspects and the forecast of the file's findings, and for a folder of per-rank
// files the rank grid worst first, each rank's findings one click away (a details element per
// rank) and what differs between the ranks. Fed by reporting/html_report.py's `growth`,
// `forecast` and `ranks`; kept apart from report.js's other sections. Every text from a file
// goes in as a text node.

import { formatSize } from "./rows.js";

/**
 * @typedef {{frame: string | null, label: string, bytes_per_step: number, since_step: number,
 *   kept: number, steps: number, sentence: string}} Suspect analysis/growth.py `Suspect`
 * @typedef {{sentence: string, seconds: number}} Forecast analysis/forecast.py `Forecast`
 * @typedef {{figures?: Record<string, number>, oom?: {sentence?: string} | null,
 *   advice?: {message?: string}[], growth?: Suspect[], forecast?: Forecast | null,
 *   notes?: string[]}} RankFindings a rank's `Findings.to_dict()` (the parts shown)
 * @typedef {{rank: number, file: string, reserved: number, allocated: number,
 *   largest_free: number, fragmentation: number, oom: string | null, suspects: number,
 *   forecast_s: number | null, findings?: RankFindings}} RankRow analysis/ranks.py's row
 * @typedef {{folder: string, grid: RankRow[], differences: string[], ranks: RankRow[]}} Ranks
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

/** @param {HTMLElement} host @param {string} title @param {string} name */
function section(host, title, name) {
  const s = el("section", "gmv-section");
  s.dataset.section = name;
  s.append(el("h2", "", title));
  host.append(s);
  return s;
}

/**
 * The suspects' sentences and the forecast's, in a host (a rank's details or the page).
 * @param {HTMLElement} host
 * @param {Suspect[]} growth
 * @param {Forecast | null | undefined} forecast
 */
function growthLines(host, growth, forecast) {
  if (growth.length) {
    const ul = el("ul", "gmv-growth");
    for (const g of growth) {
      const li = el("li", "", String(g.sentence));
      li.dataset.frame = String(g.frame ?? "");
      ul.append(li);
    }
    host.append(ul);
  } else {
    host.append(el("p", "gmv-muted gmv-growth-none",
      "Nothing grows step over step (or the trace has no repeated steps)."));
  }
  const p = forecast
    ? el("p", "gmv-forecast", `Forecast: ${String(forecast.sentence)}.`)
    : el("p", "gmv-muted gmv-forecast-none",
      "No forecast: no clear growth of reserved memory (or no recorded times).");
  host.append(p);
}

/**
 * "Is it growing": the file's leak suspects and its forecast of the time to OOM.
 * @param {{growth?: Suspect[], forecast?: Forecast | null}} data
 * @param {HTMLElement} host
 */
export function growthSection(data, host) {
  const s = section(host, "Is it growing, and when will it run out", "growth");
  growthLines(s, data.growth || [], data.forecast);
  return s;
}

/** @param {RankRow} r */
function rowCells(r) {
  return [`rank ${r.rank}`, String(r.file), formatSize(r.reserved), formatSize(r.allocated),
    formatSize(r.largest_free), Number(r.fragmentation).toFixed(3), r.oom ? "OOM" : "–",
    String(r.suspects), r.forecast_s === null ? "–" : `${Math.round(r.forecast_s)} s`];
}

const GRID_HEAD = ["rank", "file", "reserved", "allocated", "largest free", "fragmentation",
  "OOM", "growing", "time to OOM"];

/**
 * One rank's findings, behind its summary line: the figures, the OOM, the advice, the growth
 * and the forecast, the notes.
 * @param {RankRow} r
 */
function rankDetails(r) {
  const d = el("details", "gmv-rank");
  d.dataset.rank = String(r.rank);
  d.append(el("summary", "", `rank ${r.rank} · ${r.file} · reserved ${formatSize(r.reserved)}` +
    (r.oom ? " · ran out of memory" : "")));
  const f = r.findings || {};
  const body = el("div", "gmv-rank-findings");
  const figs = f.figures || {};
  const dl = el("table", "gmv-table");
  dl.dataset.table = `rank-${r.rank}-figures`;
  const tbody = el("tbody");
  for (const [key, label] of [["reserved", "reserved"], ["allocated", "allocated"],
    ["free_in_reserved", "free in reserved"], ["releasable", "empty_cache() releases"],
    ["largest_free", "largest free block"]]) {
    if (typeof figs[key] !== "number") continue;
    const tr = el("tr");
    tr.append(el("th", "", label), el("td", "", formatSize(figs[key])));
    tbody.append(tr);
  }
  dl.append(tbody);
  body.append(dl);
  if (f.oom && f.oom.sentence) body.append(el("p", "gmv-oom-story", String(f.oom.sentence)));
  const advice = (f.advice || []).filter((a) => a.message);
  if (advice.length) {
    const ul = el("ul", "gmv-advice-list");
    for (const a of advice) ul.append(el("li", "", String(a.message)));
    body.append(ul);
  }
  growthLines(body, f.growth || [], f.forecast);
  for (const n of f.notes || []) body.append(el("p", "gmv-muted gmv-note", String(n)));
  d.append(body);
  return d;
}

/**
 * A folder's ranks: the grid worst first (a click on a rank's line opens its findings), what
 * differs between the ranks, and each rank's findings in a details element.
 * @param {Ranks} ranks
 * @param {HTMLElement} host
 */
export function ranksSection(ranks, host) {
  const s = section(host, `Ranks (${ranks.grid.length}, worst first)`, "ranks");
  s.append(el("p", "gmv-muted", `Every snapshot file of ${ranks.folder}; the map and the ` +
    "sections below are the worst rank's."));
  const t = el("table", "gmv-table");
  t.dataset.table = "ranks";
  const head = el("tr");
  for (const h of GRID_HEAD) head.append(el("th", "", h));
  const thead = el("thead");
  thead.append(head);
  const tbody = el("tbody");
  t.append(thead, tbody);
  s.append(t);
  s.append(el("h3", "", "What differs between ranks"));
  const diffs = el("ul", "gmv-rank-differences");
  for (const line of ranks.differences) diffs.append(el("li", "", String(line)));
  if (!ranks.differences.length) diffs.append(el("li", "gmv-muted", "Nothing stands out."));
  s.append(diffs);
  s.append(el("h3", "", "Each rank's findings"));
  const byRank = new Map(ranks.ranks.map((r) => [r.rank, r]));
  for (const r of ranks.grid) {
    const details = rankDetails(byRank.get(r.rank) || r);
    const tr = el("tr", "gmv-rank-row");
    tr.dataset.rank = String(r.rank);
    if (r.oom) tr.dataset.oom = "1";
    for (const c of rowCells(r)) tr.append(el("td", "", c));
    tr.title = "show this rank's findings";
    tr.addEventListener("click", () => {
      details.open = true;
      details.scrollIntoView({ block: "nearest" });
    });
    tbody.append(tr);
    s.append(details);
  }
  return s;
}
