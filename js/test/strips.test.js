import { test } from "node:test";
import assert from "node:assert/strict";
import { stripText, totalsText } from "../src/strips.js";

const MiB = 2 ** 20;

test("a strip's text carries its header figures and its OOM count", () => {
  const s = { device: 1, reserved: 8 * MiB, allocated: 2 * MiB, free: 6 * MiB,
    largest_free: 4 * MiB, fragmentation: 1 / 3, ooms: 1, bins: [63, 192] };
  assert.equal(stripText(s), "reserved 8.00 MiB · allocated 2.00 MiB · free 6.00 MiB · " +
    "largest free 4.00 MiB · fragmentation 0.33 · OOMs 1");
  assert.match(stripText({}), /^reserved 0 bytes .* OOMs 0$/);
});

test("the totals line sums the strips and names the devices with OOMs", () => {
  const set = {
    strips: [{ device: 0, label: "cuda:0", ooms: 0 }, { device: 1, label: "cuda:1", ooms: 2 },
      { device: 2, label: "rank 3", ooms: 1 }],
    totals: { reserved: 3 * MiB, allocated: 2 * MiB, free: 2 * MiB },
  };
  assert.equal(totalsText(set), "3 devices · reserved 3.00 MiB · allocated 2.00 MiB · " +
    "free 2.00 MiB · OOMs: cuda:1 (2), rank 3 (1)");
  assert.match(totalsText({ strips: [{ device: 0 }] }), /OOMs: none$/);
});
