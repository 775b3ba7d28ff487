import { test } from "node:test";
import assert from "node:assert/strict";
import { timelineScale } from "../src/timeline.js";

test("the timeline spans the points' time and the largest byte figure", () => {
  const pts = [[100, 10, 40, null, null, 0.5], [110, 20, 80, 90, 10, 0.25]];
  const s = timelineScale(pts, 101, 94);
  assert.equal(s.x(100), 0);
  assert.equal(s.x(110), 100);
  assert.equal(s.top, 90);  // NVML used is the largest figure
  assert.equal(s.y(90), 3);
  assert.equal(s.y(0), 93);
  assert.equal(s.yf(1), 3);
});

test("the legend shows clock times for Unix times and raw values for a counter clock", async () => {
  const { spanText } = await import("../src/timeline.js");
  const wall = spanText(1764430000, 1764430060);
  assert.doesNotMatch(wall, /recorded clock/);
  assert.equal(wall.split(" – ").length, 2);
  assert.match(wall, /\d{1,2}:\d{2}:\d{2}/);
  assert.match(wall, /\(60 s\)$/); // a run shorter than a second still shows its length
  assert.match(spanText(1764430000, 1764430000.8421), /\(0\.842 s\)$/);
  // the allocator model's tick clock (time_us from 0) and trace entry indices: no 1970 dates
  assert.equal(spanText(0.000012, 0.0345), "t 0.000012 – 0.0345 (recorded clock, not wall time)");
  assert.equal(spanText(0, 1500), "t 0 – 1,500 (recorded clock, not wall time)");
  assert.doesNotMatch(spanText(3, 86400 * 2), /19[67]\d|:/);
});

test("marker labels close together take other lanes or are left out, never overprint", async () => {
  const { labelLanes, LABEL_LANES } = await import("../src/timeline.js");
  // eight labels 100 px wide, 10 px apart: three lanes hold three, the rest are thinned
  const items = Array.from({ length: 8 }, (_, i) => ({ x: i * 10, width: 100 }));
  const lanes = labelLanes(items);
  assert.deepEqual(lanes.slice(0, LABEL_LANES), [0, 1, 2]);
  const ends = new Map();
  items.forEach((it, i) => {
    if (lanes[i] < 0) return;
    for (const [lane, end] of ends) if (lane === lanes[i]) assert.ok(it.x >= end, "overlap");
    ends.set(lanes[i], it.x + it.width);
  });
  assert.ok(lanes.includes(-1));
  // far apart: all in the first lane
  assert.deepEqual(labelLanes([{ x: 300, width: 50 }, { x: 0, width: 50 }]), [0, 0]);
});

test("a long label is cut to the width with an ellipsis", async () => {
  const { fitLabel } = await import("../src/timeline.js");
  const measure = (/** @type {string} */ t) => t.length * 6;
  assert.equal(fitLabel("enumerate", 100, measure), "enumerate");
  const cut = fitLabel("Optimizer.zero_grad#AdamW.zero_grad", 60, measure);
  assert.ok(cut.endsWith("…") && measure(cut) <= 60, cut);
});
