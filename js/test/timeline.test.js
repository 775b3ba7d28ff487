import { test } from "node:test";
import assert from "node:assert/strict";
import { timelineScale } from "../src/timeline.js";

test("the timeline spans the points' time and a byte axis up to the largest figure", () => {
  const pts = [[100, 10, 40, null, null, 0.5], [110, 20, 80, 90, 10, 0.25]];
  const s = timelineScale(pts, { left: 50, top: 10, width: 100, height: 64 });
  assert.equal(s.x(100), 50);
  assert.equal(s.x(110), 150);
  assert.equal(s.top, 96);  // NVML used (90) is the largest figure; ticks of 32 bytes
  assert.deepEqual(s.ticks, [0, 32, 64, 96]);
  assert.equal(s.y(96), 10);
  assert.equal(s.y(0), 74);
  assert.equal(s.yf(1), 10);
  assert.equal(s.yf(0), 74);
});

test("byte ticks: at most four steps of a power of two, labelled in units", async () => {
  const { byteTicks, tickText } = await import("../src/timeline.js");
  const gib = 2 ** 30;
  const t = byteTicks(10354 * 2 ** 20);
  assert.deepEqual(t.ticks.map(tickText), ["0", "4 GiB", "8 GiB", "12 GiB"]);
  assert.equal(byteTicks(3 * gib).step, gib);
  assert.ok(byteTicks(1.3 * gib).ticks.length <= 5);
  assert.equal(tickText(1.5 * gib), "1.5 GiB");
  assert.equal(tickText(512 * 2 ** 20), "512 MiB");
  assert.equal(tickText(100), "100 bytes");
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
  // eight labels 100 px wide, 10 px apart: the lanes hold one each, the rest are thinned
  const items = Array.from({ length: 8 }, (_, i) => ({ x: i * 10, width: 100 }));
  const lanes = labelLanes(items);
  assert.deepEqual(lanes.slice(0, LABEL_LANES), Array.from({ length: LABEL_LANES }, (_, i) => i));
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

test("OOM labels are placed first; the others keep clear of them", async () => {
  const { labelLanes } = await import("../src/timeline.js");
  const items = [{ x: 0, width: 50 }, { x: 40, width: 30, first: true }, { x: 200, width: 50 }];
  const lanes = labelLanes(items, 1);
  assert.deepEqual(lanes, [-1, 0, 0]);  // one lane: the OOM keeps it, the label under it goes
  assert.deepEqual(labelLanes(items, 2), [1, 0, 0]);
});

test("dense markers: a label at least every ~100 px, none overlapping", async () => {
  const { labelLanes, LABEL_MAX_W, LABEL_GAP } = await import("../src/timeline.js");
  const items = Array.from({ length: 400 }, (_, i) => ({ x: i * 3, width: LABEL_MAX_W }));
  const lanes = labelLanes(items);
  const starts = items.filter((_, i) => lanes[i] === 0).map((it) => it.x);
  for (let i = 1; i < starts.length; i++) {
    assert.ok(starts[i] - starts[i - 1] >= LABEL_MAX_W + LABEL_GAP);
    assert.ok(starts[i] - starts[i - 1] <= 100, String(starts[i] - starts[i - 1]));
  }
});

test("a long label is cut to the width with an ellipsis", async () => {
  const { fitLabel } = await import("../src/timeline.js");
  const measure = (/** @type {string} */ t) => t.length * 6;
  assert.equal(fitLabel("enumerate", 100, measure), "enumerate");
  const cut = fitLabel("Optimizer.zero_grad#AdamW.zero_grad", 60, measure);
  assert.ok(cut.endsWith("…") && measure(cut) <= 60, cut);
});

test("the wheel's zoom stays inside the run and gives everything back when wide enough", async () => {
  const { zoomSpan } = await import("../src/timeline.js");
  assert.deepEqual(zoomSpan(null, 0, 100, 50, 0.5), [25, 75]);
  assert.deepEqual(zoomSpan(null, 0, 100, 0, 0.5), [0, 50]);  // at the start: from the start
  assert.deepEqual(zoomSpan([90, 100], 0, 100, 100, 0.5), [95, 100]);
  assert.equal(zoomSpan([25, 75], 0, 100, 50, 2), null);  // all of it again
  const tiny = zoomSpan([0, 0.01], 0, 100, 0, 0.5);
  assert.ok(tiny && tiny[1] - tiny[0] >= 0.01);  // no narrower than a ten-thousandth
});

test("a forecast's projection runs from the level at the last reading to the limit", async () => {
  const { projection } = await import("../src/timeline.js");
  const f = { seconds: 40, low: 30, high: 60, rate: 10, rate_low: 5, rate_high: 15, level: 600,
    capacity: 1000, t_last: 100, sentence: "at this rate, OOM in about 40 s", what: "reserved" };
  const p = projection({ ...f, high: 42 }, 0);
  assert.deepEqual(p, { start: [100, 600], end: [140, 1000], low: [130, 1000], high: [142, 1000],
    until: 144 });
  // the slope's lower bound reaches the limit beyond the axis' end: its edge stops there
  assert.deepEqual(projection(f, 0)?.high, [144, 600 + 5 * 44]);
  assert.deepEqual(projection({ ...f, high: null }, 0)?.high, [144, 600 + 5 * 44]);
  // a short history: the axis runs at most four times its span past the last reading
  assert.equal(projection(f, 95)?.until, 120);
  assert.equal(projection(null, 0), null);
  assert.equal(projection({ ...f, seconds: 0 }, 0), null);
});

test("with a forecast the axes reach the limit and the projection's end", () => {
  const pts = [[100, 10, 40, null, null, null], [110, 20, 80, null, null, null]];
  const plot = { left: 0, top: 0, width: 100, height: 100 };
  const s = timelineScale(pts, plot, null, { t1: 130, top: 1000 });
  assert.equal(s.t1, 130);
  assert.ok(s.top >= 1000);
  const zoomed = timelineScale(pts, plot, [100, 105], { t1: 130, top: 1000 });
  assert.equal(zoomed.t1, 105);  // a zoom shows what it asks for
  assert.equal(zoomed.top, 48);  // of the points in view
});
