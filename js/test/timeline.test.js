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
