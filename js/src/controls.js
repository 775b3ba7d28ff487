// The header above the map: title, badges, status line, figures and the colour legend.
import { KIND_NAMES } from "./decode.js";
import { formatSize } from "./rows.js";

/** Figures in display order: [key, label, is bytes]. */
export const FIGURES = /** @type {const} */ ([
  ["reserved", "reserved", true],
  ["allocated", "allocated", true],
  ["free", "free in reserved", true],
  ["free_trapped", "trapped", true],
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

const LEGEND = ["allocated", "pending free", "free, empty_cache releases it", "free, trapped"];

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
  const size = typeof oom.alloc_size === "number" ? ` of ${formatSize(oom.alloc_size)}` : "";
  return `OOM${size} (${oom.cause}): ${oom.explanation || ""}`.trim();
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
    destroy() { root.remove(); },
  };
}
