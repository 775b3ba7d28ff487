import { test } from "node:test";
import assert from "node:assert/strict";
import { partSpans, partText } from "../src/glance.js";

const GIB = 2 ** 30;
/** @param {[string, number][]} parts @param {string} scale */
const bar = (parts, scale = "device") => ({
  device: 0, total: parts.reduce((n, p) => n + p[1], 0), scale, note: "", reserved: 0,
  largest_free: 0, oom: null,
  parts: parts.map(([key, bytes]) => ({ key, label: key, colour: key, bytes })),
});

test("the parts lie side by side and fill the bar", () => {
  const b = bar([["allocated", 3 * GIB], ["pending_free", 0], ["releasable", GIB], ["headroom", 4 * GIB]]);
  const spans = partSpans(b);
  assert.deepEqual(spans, [[0, 37.5], [37.5, 0], [37.5, 12.5], [50, 50]]);
  const last = spans[spans.length - 1];
  assert.equal(last[0] + last[1], 100);
});

test("a part's hover gives its figure, its share of the scale and its meaning", () => {
  const b = bar([["allocated", 3 * GIB], ["stays", GIB]], "reserved");
  assert.equal(partText(b.parts[0], b, "allocated means"), "allocated: 3.00 GiB (75.0% of reserved)\nallocated means");
  b.scale = "device";
  assert.match(partText(b.parts[1], b, "stays means"), /^stays: 1024\.00 MiB \(25\.0% of the device\)\n/);
});
