// anywidget entry: wires the model (traits, frames) to the header and the segment map.
import { decodeBlocks, decodeFrame } from "./decode.js";
import { createGlance } from "./glance.js";
import { createHeatmap } from "./heatmap.js";
import { createHolders } from "./holders.js";
import { createHeader, createToolbar } from "./controls.js";
import { createJobDetail } from "./jobdetail.js";
import { createStrips } from "./strips.js";
import { createTimeline } from "./timeline.js";
import { coloursOf, installPalette } from "./palette.js";
import { logEvent, registerView } from "./probe.js";

let nextId = 0;

/**
 * The synced traits (widget/panel.py `MemoryPanel`).
 * @typedef {{title: string, status: string, demo: boolean, header: Record<string, unknown>,
 *   advice: {kind: string, message: string}[], oom: Record<string, unknown>,
 *   controls: import("./controls.js").Controls, map_layout: import("./heatmap.js").Layout,
 *   strips: import("./strips.js").StripSet, glance: import("./glance.js").GlanceSet,
 *   holders?: import("./holders.js").HoldersData,
 *   forecast: import("./timeline.js").Forecast | Record<string, never>,
 *   job?: import("./jobdetail.js").Job}} Traits
 *   (``job``: a job's panel only, widget/job.py `JobPanel`)
 */
/**
 * A custom message from Python, told apart by `kind` (a message of another kind is ignored).
 * @typedef {import("./decode.js").FrameContent & {kind: "frame"}} FrameMsg
 * @typedef {import("./decode.js").BlocksContent & {kind: "blocks"}} BlocksMsg
 * @typedef {import("./controls.js").Reply & {kind: "reply"}} ReplyMsg
 * @typedef {import("./timeline.js").TimelineUpdate & {kind: "timeline", view?: string}} TimelineMsg
 * @typedef {{kind: "marks", marks: import("./timeline.js").Mark[]}} MarksMsg
 * @typedef {{kind: "holder_blocks", view: string, by: string, index: number, layout?: number,
 *   row: number[], offset: number[], size: number[], bytes: number, count: number}} HolderBlocksMsg
 *   where one holder's blocks lie in the map (render/holders.py `holder_marks`)
 * @typedef {{kind: "stack", view: string, row: number, block: number, layout: number,
 *   stack: import("./decode.js").Stack | null}} StackMsg one block's stack, asked on hover
 *   (widget/panel.py `allocation_stack`)
 * @typedef {FrameMsg | BlocksMsg | ReplyMsg | TimelineMsg | MarksMsg | HolderBlocksMsg |
 *   StackMsg} Msg
 */

/** @param {{model: import("@anywidget/types").AnyModel<Traits>, el: HTMLElement}} ctx */
function render({ model, el }) {
  const id = `v${Date.now().toString(36)}-${nextId++}`;
  installPalette(document);
  const root = document.createElement("div");
  root.className = "gmv-root";
  root.dataset.view = id;
  el.append(root);
  const header = createHeader(root);
  const glance = createGlance(root);
  header.top.after(glance.element);  // the device at a glance, above the figures
  let nextCmd = 0;
  /** @param {string} name @param {Record<string, unknown>} args */
  const send = (name, args) => {
    const cid = `${id}-c${nextCmd++}`;
    model.send({ kind: "command", id: cid, name, args });
    logEvent({ event: "command", view: id, id: cid, name });
    return cid;
  };
  const toolbar = createToolbar(root, send);
  const strips = createStrips(root, {
    onSelect(index, strip) {
      if (typeof strip.rank === "number") send("rank", { rank: strip.rank, device: strip.device });
      else {
        // the timeline held the device shown before: nothing is drawn until the chosen
        // device's own timeline arrives (widget/panel.py `_load_recorded` resets it)
        if (strips.shown.selected !== index) timeline.clear();
        send("select", { value: strip.device });
      }
    },
  });
  root.prepend(strips.element);  // every device first, then the selected one's header and map
  const job = createJobDetail(root, send);  // a job's panel: the selected rank's published map
  const timeline = createTimeline(root, {
    onSync(since) { model.send({ kind: "timeline_sync", view: id, since }); },
    colours() { return coloursOf(root); },
  });
  const map = createHeatmap(root, {
    onView(v) { model.send({ kind: "view", view: id, ...v }); },
    onBlocks(row, lo, hi) {
      model.send({ kind: "blocks", view: id, row, lo, hi });
      logEvent({ event: "blocks", view: id, row, lo, hi });
    },
    onStack(row, block) {
      model.send({ kind: "stack", view: id, row, block });
      logEvent({ event: "stack", view: id, row, block });
    },
  });

  // who holds the memory shown: a click asks Python where the holder's blocks lie
  const holders = createHolders(root, {
    onPick(by, index) {
      model.send({ kind: "holder_blocks", view: id, by, index });
      logEvent({ event: "holder_blocks", view: id, by, index });
    },
  });
  const onHolders = () => holders.update(model.get("holders"));

  const onHeader = () => header.update({
    title: model.get("title"), status: model.get("status"), demo: model.get("demo"),
    header: model.get("header") || {}, advice: model.get("advice") || [],
    oom: model.get("oom") || {},
  });
  const onControls = () => toolbar.update(model.get("controls") || {});
  const onStrips = () => strips.update(model.get("strips") || {});
  const onForecast = () => timeline.setForecast(model.get("forecast") || {});
  const onGlance = () => {
    glance.update(model.get("glance") || {});
    logEvent({ event: "glance", view: id });
  };
  const onJob = () => {
    const value = model.get("job") || {};
    root.dataset.mode = value.address ? "job" : "panel";  // a job hides the map, toolbar, timeline
    job.update(value);
  };
  const onLayout = () => {
    const layout = model.get("map_layout") || { n_rows: 0, groups: [] };
    root.dataset.rows = String(layout.n_rows || 0);
    root.dataset.layout = String(layout.version || 0);
    map.setLayout(layout);
  };
  /** @param {Msg | null} msg @param {DataView[]} buffers */
  const onMsg = (msg, buffers) => {
    if (msg && msg.kind === "reply") {
      // a refused device choice: the timeline shown before comes back
      if (msg.name === "select" && !msg.ok) model.send({ kind: "timeline_sync", view: id, since: 0 });
      toolbar.reply(msg);
      logEvent({ event: "reply", view: id, ...msg });
      return;
    }
    if (msg && msg.kind === "timeline") {
      if (!msg.view || msg.view === id) timeline.apply(msg);
      return;
    }
    if (msg && msg.kind === "marks") { timeline.addMarks(msg.marks); return; }
    if (msg && msg.kind === "holder_blocks") {
      // placed by the rows of the layout shown now only (row numbers mean other segments else)
      if (msg.view === id && (msg.layout === undefined || msg.layout === (model.get("map_layout") || {}).version)) {
        map.setMarks(msg);
        holders.element.dataset.marked = `${msg.by}:${msg.index}`;
      }
      return;
    }
    if (msg && msg.kind === "blocks" && msg.view === id) {
      // answered from rows of the layout shown now only (row numbers mean other segments else)
      if (msg.layout === (model.get("map_layout") || {}).version) {
        map.applyBlocks(decodeBlocks(msg, buffers));
      }
      return;
    }
    if (msg && msg.kind === "stack" && msg.view === id) {
      if (msg.layout === (model.get("map_layout") || {}).version) {
        map.setStack(msg.row, msg.block, msg.stack);
      }
      return;
    }
    if (!msg || msg.kind !== "frame" || msg.view !== id) return;
    const t0 = performance.now();
    const frame = decodeFrame(msg, buffers);
    map.applyFrame(frame);
    root.dataset.seq = String(frame.seq);
    logEvent({ event: "frame", view: id, seq: frame.seq, rows: frame.rows.length,
      bytes: buffers.reduce((n, b) => n + b.byteLength, 0), ms: performance.now() - t0 });
  };
  // every model event this view listens to: the cleanup unsubscribes this same list
  /** @type {[string, (msg: Msg | null, buffers: DataView[]) => void][]} */
  const events = [
    ["change:header", onHeader], ["change:title", onHeader], ["change:status", onHeader],
    ["change:demo", onHeader], ["change:advice", onHeader], ["change:oom", onHeader],
    ["change:map_layout", onLayout], ["change:controls", onControls], ["change:strips", onStrips],
    ["change:glance", onGlance], ["change:holders", onHolders], ["change:forecast", onForecast],
    ["change:job", onJob], ["msg:custom", onMsg],
  ];
  for (const [name, fn] of events) model.on(name, fn);
  onHeader();
  onControls();
  onStrips();
  onGlance();
  onHolders();
  onForecast();
  onJob();
  model.send({ kind: "timeline_sync", view: id, since: 0 });
  onLayout();
  registerView(id, { map, root, model, toolbar, timeline, strips, job, glance, holders });

  return () => {
    for (const [name, fn] of events) model.off(name, fn);
    try { model.send({ kind: "close", view: id }); } catch { /* the model is gone already */ }
    map.destroy();
    header.destroy();
    glance.destroy();
    holders.destroy();
    toolbar.destroy();
    strips.destroy();
    job.destroy();
    timeline.destroy();
    root.remove();
    registerView(id, null);
  };
}

export default { render };
