import { test } from "node:test";
import assert from "node:assert/strict";
import { rankFields } from "../src/jobdetail.js";
import { totalsText } from "../src/strips.js";

const MiB = 2 ** 20;

test("a rank's fields say where it runs, how old its summary is and its last OOM", () => {
  const d = { rank: 2, host: "node-b", pid: 41, local_rank: 0, age_s: 12.04, stale: true,
    headroom: 3 * MiB, last_oom: { cause: "fragmentation", alloc_size: 2 * MiB },
    source: "simulated" };
  assert.equal(rankFields(d), "host node-b · pid 41 · local rank 0 · updated 12.0 s ago " +
    "(stale) · headroom 3.00 MiB · last OOM: fragmentation asking 2.00 MiB · source simulated");
  assert.match(rankFields({}), /^host \? · pid \? .* updated never · .* last OOM: none/);
});

test("a job's totals count its ranks and their devices", () => {
  const set = { strips: [{ rank: 0, device: 0 }, { rank: 0, device: 1 }, { rank: 1, device: 0 }],
    totals: {} };
  assert.match(totalsText(set), /^2 ranks · 3 devices · reserved /);
});
