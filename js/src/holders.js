// Who holds the memory: the holders view of the offline report and of the panel (their data:
// src/gpumemviz/render/holders.py `holders_view`). An icicle of the call paths (the outermost
// user frame on top, width by bytes, the biggest first), a table along the key chosen (frame,
// call path, user_metadata, annotation, stream, pool), a filter over the keys and a hover that
// says bytes, count and key. Bytes are the findings' own: every key's rows plus its rest sum to
// allocated. Text from the file goes in as text nodes only.
import { formatSize } from "./rows.js";

/**
 * @typedef {{key: string | number | (string | number)[] | null, label: string, bytes: number,
 *   count: number}} HolderRow `HolderRow.to_dict()`
 * @typedef {{rows: HolderRow[], rest: {rows: number, bytes: number, count: number}}} HolderKeyData
 * @typedef {{keys: string[], allocated: number, by: Record<string, HolderKeyData>}} HoldersData
 * @typedef {{name: string, path: string, bytes: number, own: number, count: number, row: number,
 *   children: IcicleNode[]}} IcicleNode ``row``: the index of the row that ends here (-1: none)
 */

/** What a row with no key is shown as (analysis/holders.py `NO_STACK` for the stack keys). */
export const NO_KEY = { frame: "(no stack recorded)", call_path: "(no stack recorded)" };
const KEY_NAMES = /** @type {Record<string, string>} */ ({
  frame: "frame", call_path: "call path", user_metadata: "user_metadata",
  annotation: "annotation", stream: "stream", pool: "pool",
});
/** Icicle levels at most: a longer path's inner frames share its last level. */
export const MAX_DEPTH = 24;

/**
 * A row's key as text (what the filter matches and the table shows).
 * @param {string} by @param {HolderRow} row
 */
export function rowText(by, row) {
  if (row.key === null) return by in NO_KEY ? NO_KEY[/** @type {keyof NO_KEY} */ (by)] : String(row.label);
  return String(row.label);
}

/**
 * The icicle's tree: one node per call-path prefix, `bytes` of every row under it; a row
 * without a path and the rest (rows not sent) become top-level nodes of their own, so the
 * top level sums to allocated. Children biggest first.
 * @param {HolderKeyData} data the ``call_path`` rows
 * @param {(row: HolderRow) => boolean} [keep] the rows shown (the filter)
 * @returns {IcicleNode}
 */
export function icicleTree(data, keep = () => true) {
  /** @type {IcicleNode} */
  const root = { name: "", path: "", bytes: 0, own: 0, count: 0, row: -1, children: [] };
  /** @type {Map<string, IcicleNode>} */
  const nodes = new Map();
  data.rows.forEach((r, i) => {
    if (!keep(r)) return;
    let path = Array.isArray(r.key) ? r.key.map(String) : [NO_KEY.call_path];
    if (path.length > MAX_DEPTH) {  // the inner frames as one node, named by the innermost
      const inner = path.slice(MAX_DEPTH - 1);
      path = [...path.slice(0, MAX_DEPTH - 1), `(${inner.length - 1} frames) > ${inner[inner.length - 1]}`];
    }
    let at = root;
    at.bytes += r.bytes; at.count += r.count;
    let prefix = "";
    for (const name of path) {
      prefix = prefix ? `${prefix} > ${name}` : name;
      let n = nodes.get(prefix);
      if (!n) {
        n = { name, path: prefix, bytes: 0, own: 0, count: 0, row: -1, children: [] };
        nodes.set(prefix, n);
        at.children.push(n);
      }
      n.bytes += r.bytes; n.count += r.count;
      at = n;
    }
    at.own += r.bytes;
    at.row = i;
  });
  if (data.rest.rows && data.rest.bytes) {
    root.bytes += data.rest.bytes; root.count += data.rest.count;
    root.children.push({ name: `(${data.rest.rows} more call paths)`, path: "", bytes: data.rest.bytes,
      own: data.rest.bytes, count: data.rest.count, row: -1, children: [] });
  }
  /** @param {IcicleNode} n */
  const sort = (n) => { n.children.sort((a, b) => b.bytes - a.bytes); n.children.forEach(sort); };
  sort(root);
  return root;
}

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

/** The file name and line of a "path/to/file.py:88" frame key. @param {string} key */
function short(key) {
  const i = key.lastIndexOf("/");
  return i >= 0 ? key.slice(i + 1) : key;
}

/**
 * The holders view in `host`. ``onPick(by, index, row)``: a row was clicked (the panel marks its
 * blocks in the map); without it rows are not clickable.
 * @param {HTMLElement} host
 * @param {{onPick?: (by: string, index: number, row: HolderRow) => void}} [opts]
 */
export function createHolders(host, opts = {}) {
  const box = el("div", "gmv-holders");
  const bar = el("div", "gmv-holders-bar");
  const keyPick = el("select", "gmv-holders-key");
  keyPick.setAttribute("aria-label", "group the allocated bytes by");
  const filter = el("input", "gmv-holders-filter");
  filter.type = "search";
  filter.placeholder = "filter (part of a key)";
  filter.setAttribute("aria-label", "show holders whose key contains");
  const summary = el("span", "gmv-muted gmv-holders-summary");
  bar.append(el("span", "gmv-muted", "by "), keyPick, filter, summary);
  const icicle = el("div", "gmv-icicle");
  const icicleNote = el("div", "gmv-muted gmv-icicle-note");
  const tableBox = el("div", "gmv-holders-table");
  const tip = el("div", "gmv-tip gmv-holders-tip");
  tip.hidden = true;
  box.append(bar, icicleNote, icicle, tableBox, tip);
  host.append(box);
  /** @type {HoldersData | null} */
  let data = null;
  let by = "frame";
  /** @type {{by: string, index: number, key: string} | null} */
  let picked = null;

  /** @param {MouseEvent} ev @param {string} text */
  function showTip(ev, text) {
    tip.textContent = text;
    tip.hidden = false;
    const r = box.getBoundingClientRect();
    tip.style.left = `${ev.clientX - r.left + 12}px`;
    tip.style.top = `${ev.clientY - r.top + 12}px`;
  }
  const needle = () => filter.value.trim().toLowerCase();
  /** @param {string} k @param {HolderRow} r */
  const matches = (k, r) => !needle() || rowText(k, r).toLowerCase().includes(needle());
  /** @param {string} k @param {number} i @param {HolderRow} r */
  function pick(k, i, r) {
    if (!opts.onPick) return;
    picked = { by: k, index: i, key: rowText(k, r) };
    box.querySelectorAll("[data-picked]").forEach((e) => e.removeAttribute("data-picked"));
    box.querySelectorAll(`[data-by="${k}"][data-index="${i}"]`)
      .forEach((e) => e.setAttribute("data-picked", "true"));
    opts.onPick(k, i, r);
  }

  function drawIcicle() {
    icicle.replaceChildren();
    const cp = data && data.by.call_path;
    if (!data || !cp) return;
    const tree = icicleTree(cp, (r) => matches("call_path", r));
    icicle.dataset.bytes = String(tree.bytes);
    icicleNote.textContent = data.allocated
      ? "Call paths, the outermost user frame on top; width by bytes held."
      : "No allocated blocks.";
    /** @param {IcicleNode} n @returns {HTMLElement} */
    const node = (n) => {
      const e = el("div", "gmv-icicle-node");
      e.style.flexGrow = String(n.bytes);
      e.style.flexBasis = "0";
      e.dataset.bytes = String(n.bytes);
      e.dataset.own = String(n.own);
      e.dataset.count = String(n.count);
      e.dataset.path = n.path;
      if (n.row >= 0) { e.dataset.by = "call_path"; e.dataset.index = String(n.row); }
      const label = el("div", "gmv-icicle-bar", short(n.name));
      label.addEventListener("mousemove", (ev) => {
        ev.stopPropagation();
        showTip(ev, `${n.path || n.name}\n${formatSize(n.bytes)} (${n.bytes.toLocaleString("en-US")} bytes)` +
          ` in ${n.count.toLocaleString("en-US")} blocks` +
          (n.own && n.own !== n.bytes ? `; ${formatSize(n.own)} allocated at this frame itself` : ""));
      });
      label.addEventListener("mouseleave", () => { tip.hidden = true; });
      if (n.row >= 0 && cp.rows[n.row]) label.dataset.pickable = "true";
      e.append(label);
      if (n.children.length) {
        const kids = el("div", "gmv-icicle-kids");
        for (const c of n.children) kids.append(node(c));
        const gap = n.bytes - n.children.reduce((s, c) => s + c.bytes, 0);
        if (gap > 0) {  // held by the frame itself: room left empty under it
          const g = el("div", "gmv-icicle-gap");
          g.style.flexGrow = String(gap);
          g.style.flexBasis = "0";
          kids.append(g);
        }
        e.append(kids);
      }
      return e;
    };
    const top = el("div", "gmv-icicle-kids gmv-icicle-top");
    for (const c of tree.children) top.append(node(c));
    icicle.append(top);
  }

  function drawTable() {
    tableBox.replaceChildren();
    if (!data) return;
    const d = data.by[by];
    if (!d) return;
    const t = el("table", "gmv-table");
    t.dataset.table = "holders";
    t.dataset.by = by;
    const head = el("tr");
    for (const h of [KEY_NAMES[by] || by, "bytes", "blocks", "share"]) head.append(el("th", "", h));
    const thead = el("thead");
    thead.append(head);
    const tbody = el("tbody");
    let shownBytes = 0, shown = 0;
    d.rows.forEach((r, i) => {
      if (!matches(by, r)) return;
      const tr = el("tr");
      tr.dataset.by = by;
      tr.dataset.index = String(i);
      tr.dataset.bytes = String(r.bytes);
      tr.dataset.count = String(r.count);
      tr.dataset.key = rowText(by, r);
      if (picked && picked.by === by && picked.index === i) tr.dataset.picked = "true";
      const share = data && data.allocated ? `${((100 * r.bytes) / data.allocated).toFixed(1)} %` : "–";
      for (const c of [rowText(by, r), formatSize(r.bytes), r.count.toLocaleString("en-US"), share]) {
        tr.append(el("td", "", c));
      }
      tr.addEventListener("mousemove", (ev) => showTip(ev,
        `${rowText(by, r)}\n${formatSize(r.bytes)} (${r.bytes.toLocaleString("en-US")} bytes) in ` +
        `${r.count.toLocaleString("en-US")} blocks` + (opts.onPick ? "\nclick: mark its blocks in the map" : "")));
      tr.addEventListener("mouseleave", () => { tip.hidden = true; });
      if (opts.onPick) tr.dataset.pickable = "true";
      tbody.append(tr);
      shownBytes += r.bytes; shown++;
    });
    if (d.rest.rows && !needle()) {
      const tr = el("tr", "gmv-muted");
      tr.dataset.rest = "true";
      tr.dataset.bytes = String(d.rest.bytes);
      tr.dataset.count = String(d.rest.count);
      for (const c of [`(${d.rest.rows} more)`, formatSize(d.rest.bytes), d.rest.count.toLocaleString("en-US"), ""]) {
        tr.append(el("td", "", c));
      }
      tbody.append(tr);
      shownBytes += d.rest.bytes;
    }
    t.append(thead, tbody);
    tableBox.append(t);
    tableBox.dataset.rows = String(shown);
    summary.textContent = ` ${formatSize(shownBytes)} of ${formatSize(data.allocated)} allocated shown`;
  }

  /**
   * The holder a press or release landed on: (by, index, key), read from the element's data, or
   * null off a pickable row.
   * @param {EventTarget | null} target
   */
  function holderAt(target) {
    const hit = target instanceof Element ? target.closest("[data-pickable]") : null;
    const row = hit && (hit.matches("tr") ? hit : hit.parentElement);
    if (!(row instanceof HTMLElement) || !row.dataset.by || !row.dataset.index) return null;
    return { by: row.dataset.by, index: Number(row.dataset.index), key: row.dataset.key || row.dataset.path || "" };
  }
  // A pick is a press and a release on the same holder, matched by its data rather than by the
  // element: the view is redrawn at every segment state read, and a click whose press and
  // release land on two elements (one replaced between them) is no click on either.
  /** @type {{by: string, index: number, key: string} | null} */
  let pressed = null;
  box.addEventListener("mousedown", (ev) => { pressed = ev.button === 0 ? holderAt(ev.target) : null; });
  box.addEventListener("mouseup", (ev) => {
    const at = ev.button === 0 ? holderAt(ev.target) : null;
    const was = pressed;
    pressed = null;
    if (!at || !was || at.by !== was.by || at.index !== was.index || at.key !== was.key) return;
    const row = data && data.by[at.by] && data.by[at.by].rows[at.index];
    if (row) pick(at.by, at.index, row);
  });

  function draw() { drawIcicle(); drawTable(); }
  keyPick.addEventListener("change", () => { by = keyPick.value; drawTable(); });
  filter.addEventListener("input", draw);

  return {
    element: box,
    /** @param {HoldersData | null | undefined} d */
    update(d) {
      data = d && d.by ? d : null;
      box.hidden = !data;
      if (!data) return;
      const keys = data.keys.filter((k) => data && data.by[k]);
      if (!keys.includes(by)) by = keys[0] || "frame";
      if (keyPick.options.length !== keys.length) {
        keyPick.replaceChildren(...keys.map((k) => {
          const o = el("option", "", KEY_NAMES[k] || k);
          o.value = k;
          return o;
        }));
      }
      keyPick.value = by;
      const was = picked && data.by[picked.by] && data.by[picked.by].rows[picked.index];
      if (picked && (!was || rowText(picked.by, was) !== picked.key)) picked = null;
      draw();
    },
    /** @param {string} k */
    setKey(k) { by = k; keyPick.value = k; drawTable(); },
    get key() { return by; },
    get filter() { return filter; },
    get picked() { return picked; },
    destroy() { box.remove(); },
  };
}
