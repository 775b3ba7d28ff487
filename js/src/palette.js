// The one palette (src/gpumemviz/render/palette.json, also read by the plotly figures) as the
// --gmv-* CSS variables every part of the panel and the report reads: light values on the page,
// dark ones where JupyterLab (or Notebook 7) says its theme is dark, or where a page of its own
// (the report) is shown in a dark colour scheme.
import PALETTE from "../../src/gpumemviz/render/palette.json" with { type: "json" };

/** @typedef {"light" | "dark"} Theme */
/** @typedef {typeof PALETTE.light} Colours each series' colour ("#rrggbb") */

export { PALETTE };

/**
 * CSS declarations of one theme's colours: `--gmv-allocated: #0072b2; ...`.
 * @param {Theme} theme
 * @returns {string}
 */
export function declarations(theme) {
  return Object.entries(PALETTE[theme]).map(([k, v]) => `--gmv-${k.replace(/_/g, "-")}: ${v};`)
    .join(" ");
}

/**
 * The stylesheet: light by default; dark under JupyterLab's dark theme, and on a page marked
 * `gmv-page` (the report) when the browser prefers a dark scheme.
 * @returns {string}
 */
export function paletteCss() {
  return `:root { ${declarations("light")} }\n` +
    `body[data-jp-theme-light="false"] { ${declarations("dark")} }\n` +
    `@media (prefers-color-scheme: dark) { body.gmv-page { ${declarations("dark")} } }\n`;
}

const STYLE_ID = "gmv-palette";

/**
 * Put the palette's stylesheet into the document once (every view and the report call it).
 * @param {Document} doc
 */
export function installPalette(doc) {
  if (doc.getElementById(STYLE_ID)) return;
  const style = doc.createElement("style");
  style.id = STYLE_ID;
  style.textContent = paletteCss();
  doc.head.append(style);
}

/**
 * The theme an element is drawn in now (what its background variable says).
 * @param {Element} el
 * @returns {Theme}
 */
export function themeOf(el) {
  const bg = getComputedStyle(el).getPropertyValue("--gmv-bg").trim().toLowerCase();
  return bg === PALETTE.dark.bg ? "dark" : "light";
}

/**
 * Every colour as an element sees it now (the CSS variables, else the light palette).
 * @param {Element} el
 * @returns {Colours}
 */
export function coloursOf(el) {
  const css = getComputedStyle(el);
  const out = /** @type {Colours} */ ({ ...PALETTE.light });
  for (const k of /** @type {(keyof Colours)[]} */ (Object.keys(out))) {
    const v = css.getPropertyValue(`--gmv-${k.replace(/_/g, "-")}`).trim();
    if (v) out[k] = v;
  }
  return out;
}
