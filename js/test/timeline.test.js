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
