import { test } from "node:test";
import assert from "node:assert/strict";
import { formatFigure, oomText } from "../src/controls.js";

test("the OOM line names size, cause and explanation", () => {
  assert.equal(oomText({}), "");
  assert.equal(oomText(undefined), "");
  assert.equal(
    oomText({ cause: "fragmentation", alloc_size: 20 * 2 ** 20, explanation: "no block fits" }),
    "OOM of 20.00 MiB (fragmentation): no block fits",
  );
});

test("figures: bytes, the fragmentation index and counts", () => {
  assert.equal(formatFigure("reserved", 2 ** 31, true), "2.00 GiB");
  assert.equal(formatFigure("fragmentation", 0.80312, false), "0.803");
  assert.equal(formatFigure("num_ooms", 1234, false), "1,234");
  assert.equal(formatFigure("nvml_used", null, true), "–");
});

test("a pending command says queued only when the kernel cannot take it now", async () => {
  const { pendingText, QUEUED_AFTER_MS } = await import("../src/controls.js");
  assert.equal(pendingText("main", 10), "…");
  assert.equal(pendingText("main", QUEUED_AFTER_MS), "queued until the cell finishes");
  assert.equal(pendingText("subshell", QUEUED_AFTER_MS), "working…");
});

test("the header's stuck figure is the report's free_stuck, labelled by what it means", async () => {
  const { FIGURES } = await import("../src/controls.js");
  const keys = FIGURES.map(([key]) => key);
  assert.ok(!keys.includes("free_trapped"), "one definition of stuck bytes in the header");
  const stuck = FIGURES.find(([key]) => key === "free_stuck");
  assert.deepEqual(stuck, ["free_stuck", "stuck after empty_cache", true]);
});

test("replayText shows the recorded time where the trace has one, else says events only", async () => {
  const { replayText } = await import("../src/controls.js");
  assert.equal(replayText({ n: 10, position: 3, times: false }),
    "entry 4 of 10 · events only (no recorded times)");
  const t0 = Date.UTC(2026, 0, 2, 3, 4, 5, 600) * 1000;
  assert.equal(replayText({ n: 10, position: 3, times: true, t_first: t0, time_us: t0 + 1_250_000 }),
    "entry 4 of 10 · +1.250 s (03:04:06.850 UTC)");
  assert.equal(replayText({ n: 10, position: -1, times: true, t_first: t0, time_us: null }),
    "entry 0 of 10 · before the first event");
});
