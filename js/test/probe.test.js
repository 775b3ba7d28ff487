import { test } from "node:test";
import assert from "node:assert/strict";
import { logEvent, registerView, testHooks } from "../src/probe.js";

const g = /** @type {any} */ (globalThis);

test("without a test's hooks nothing is kept and nothing global is made", () => {
  delete g.__gpumemviz;
  assert.equal(testHooks(), null);
  logEvent({ event: "frame" });
  registerView("v0", { map: 1 });
  assert.equal("__gpumemviz" in g, false);
});

test("a test's hooks get the views and the capped event log", () => {
  g.__gpumemviz = { views: {}, log: [] };
  try {
    registerView("v0", { map: 1 });
    assert.deepEqual(g.__gpumemviz.views, { v0: { map: 1 } });
    registerView("v0", null);
    assert.deepEqual(g.__gpumemviz.views, {});
    for (let i = 0; i < 2001; i++) logEvent({ event: "draw", i });
    assert.equal(g.__gpumemviz.log.length, 1001);
    assert.equal(g.__gpumemviz.log.at(-1).i, 2000);
    assert.equal(typeof g.__gpumemviz.log[0].t, "number");
  } finally {
    delete g.__gpumemviz;
  }
});
