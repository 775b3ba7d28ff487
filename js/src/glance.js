// The device at a glance: one horizontal bar per device, its parts the findings' figures as
// render/glance.py `glance_bar` sends them (allocated | pending free | free empty_cache releases |
// free that stays | other processes and the CUDA context | headroom), to scale of the device's
// total or, where that is unknown, of reserved (the bar says which). Under the parts: the largest
// free block, and the last OOM's request against it. Each part's hover gives its figure and what
// it means. Parts are placed in percent of the bar, so they add up to its width at any size.
import { formatSize } from "./rows.js";

/**
 * @typedef {{key: string, label: string, colour: string, bytes: number}} Part
 * @typedef {{device: number | null, parts: Part[], total: number, scale: string, note: string,
 *   reserved: number, largest_free: number, oom: {request: number, sentence: string} | null}} Bar
 * @typedef {{bars?: Bar[], shown?: number | null, meanings?: Record<string, string>}} GlanceSet
 *   the `glance` trait (``meanings``: what each part means, by its key)
 */

/**
 * A part's hover: its figure, its share of the bar's scale and what it means.
 * @param {Part} p
 * @param {Bar} bar
 * @param {string} meaning
 * @returns {string}
 */
export function partText(p, bar, meaning) {
  const share = bar.total > 0 ? (100 * p.bytes) / bar.total : 0;
  const of = bar.scale === "device" ? "of the device" : "of reserved";
  return `${p.label}: ${formatSize(p.bytes)} (${share.toFixed(1)}% ${of})\n${meaning}`;
}

/**
 * Where each part goes, in percent of the bar: [left, width] (they add up to 100 when the
 * parts add up to the total, as render/glance.py makes them).
 * @param {Bar} bar
 * @returns {[number, number][]}
 */
export function partSpans(bar) {
  let at = 0;
  const total = bar.total > 0 ? bar.total : 1;
  return bar.parts.map((p) => {
    const span = /** @type {[number, number]} */ ([(100 * at) / total, (100 * p.bytes) / total]);
    at += p.bytes;
    return span;
  });
}

/** @param {string} key a palette key @returns {string} its CSS variable */
const colourVar = (key) => `var(--gmv-${key.replace(/_/g, "-")})`;

/** @param {HTMLElement} host */
export function createGlance(host) {
  const wrap = document.createElement("div");
  wrap.className = "gmv-glance";
  wrap.hidden = true;
  host.append(wrap);

  /** @param {Bar} bar @param {boolean} label @param {Record<string, string>} meanings */
  function barElement(bar, label, meanings) {
    const row = document.createElement("div");
    row.className = "gmv-glance-bar";
    row.dataset.device = String(bar.device ?? "");
    row.dataset.total = String(bar.total);
    row.dataset.scale = bar.scale;
    const name = document.createElement("span");
    name.className = "gmv-glance-label";
    name.textContent = label && bar.device !== null ? `cuda:${bar.device}` : "";
    const track = document.createElement("div");
    track.className = "gmv-glance-track";
    const spans = partSpans(bar);
    bar.parts.forEach((p, i) => {
      const part = document.createElement("span");
      part.className = "gmv-glance-part";
      part.dataset.part = p.key;
      part.dataset.bytes = String(p.bytes);
      part.style.left = `${spans[i][0]}%`;
      part.style.width = `${spans[i][1]}%`;
      part.style.background = colourVar(p.colour);
      part.title = partText(p, bar, meanings[p.key] || "");
      track.append(part);
    });
    const marks = document.createElement("div");
    marks.className = "gmv-glance-marks";
    const free0 = bar.parts.slice(0, 2).reduce((n, p) => n + p.bytes, 0);  // allocated, pending
    const total = bar.total > 0 ? bar.total : 1;
    /** @param {string} cls @param {number} bytes @param {string} text @param {string} tip */
    const mark = (cls, bytes, text, tip) => {
      const m = document.createElement("span");
      m.className = cls;
      m.dataset.bytes = String(bytes);
      const left = (100 * free0) / total;
      const width = Math.min((100 * bytes) / total, 100 - left);
      m.style.top = `${19 * marks.childElementCount + 1}px`;  // one under the other
      m.style.left = `${left}%`;
      m.style.width = `${width}%`;
      m.dataset.over = String(free0 + bytes > total);
      m.title = tip;
      const t = document.createElement("span");
      t.className = "gmv-glance-mark-text";
      t.textContent = text;
      m.append(t);
      marks.append(m);
      return m;
    };
    if (bar.largest_free > 0) {
      mark("gmv-glance-largest", bar.largest_free, `largest free block ${formatSize(bar.largest_free)}`,
        "the largest free block in reserved: the biggest request that fits without a new segment");
    }
    if (bar.oom && bar.oom.request > 0) {
      mark("gmv-glance-oom", bar.oom.request, `last OOM asked ${formatSize(bar.oom.request)}`,
        bar.oom.sentence || "the last out-of-memory request");
    }
    marks.style.height = `${19 * marks.childElementCount}px`;  // a bracket and its words each
    const note = document.createElement("span");
    note.className = "gmv-glance-note";
    note.textContent = (bar.scale === "device"
      ? `${formatSize(bar.reserved)} reserved of ${formatSize(bar.total)}`
      : `${formatSize(bar.reserved)} reserved`) + ` · ${bar.note}`;
    row.append(name, track, note, marks);
    return row;
  }

  return {
    /** @param {GlanceSet} set */
    update(set) {
      const bars = (set && set.bars) || [];
      wrap.hidden = bars.length === 0;
      wrap.dataset.bars = String(bars.length);
      const meanings = (set && set.meanings) || {};
      wrap.replaceChildren(...bars.map((b) => barElement(b, bars.length > 1 || b.device !== null,
        meanings)));
    },
    get element() { return wrap; },
    destroy() { wrap.remove(); },
  };
}
