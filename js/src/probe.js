// Test hooks, off unless a test turns them on. A browser test defines
// `globalThis.__gpumemviz = { views: {}, log: [] }` before the page's scripts run (Playwright's
// add_init_script, see tests/browser/conftest.py); the views then register there and log their
// events. A page without it keeps no registry of views and no event log.

const LOG_LIMIT = 2000;

/**
 * What a test installs (each part checked before use: the page does not trust it).
 * @typedef {{views?: Record<string, object>, log?: Record<string, unknown>[], report?: object}}
 *   TestHooks
 * @typedef {{__gpumemviz?: unknown}} HookedGlobal the global a test may set
 */

/** The hooks a test installed, or null.
 * @returns {TestHooks | null} */
export function testHooks() {
  const h = /** @type {HookedGlobal} */ (globalThis).__gpumemviz;
  return h && typeof h === "object" ? h : null;
}

/** Append an event to the test log (the oldest half goes past LOG_LIMIT entries).
 * @param {Record<string, unknown>} entry */
export function logEvent(entry) {
  const h = testHooks();
  if (!h || !Array.isArray(h.log)) return;
  h.log.push({ t: Date.now(), ...entry });
  if (h.log.length > LOG_LIMIT) h.log.splice(0, LOG_LIMIT / 2);
}

/** Register a view under its id (null removes it).
 * @param {string} id @param {object | null} view */
export function registerView(id, view) {
  const h = testHooks();
  if (!h || !h.views || typeof h.views !== "object") return;
  if (view) h.views[id] = view;
  else delete h.views[id];
}
