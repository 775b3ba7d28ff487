// The type check `make test` runs (`npm run typecheck`: tsc over js/src, tsconfig.json) fails on
// a type error: a copy of js/src with errors planted must not pass. And no `any` in a JSDoc type
// without its reason written beside it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  appendFileSync, cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, realpathSync,
  rmSync, symlinkSync, writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const JS = fileURLToPath(new URL("..", import.meta.url));
const TSC = join(JS, "node_modules", "typescript", "bin", "tsc");

test("tsc fails on type errors planted in a copy of js/src", () => {
  assert.ok(existsSync(TSC), `no ${TSC}: run \`npm ci\` in js/ (make js does)`);
  const top = mkdtempSync(join(tmpdir(), "gmv-tsc-"));
  // the checkout's layout, js/ beside src/: palette.js imports src/gpumemviz/render/palette.json
  const dir = join(top, "js");
  try {
    cpSync(join(JS, "src"), join(dir, "src"), { recursive: true });
    cpSync(join(JS, "tsconfig.json"), join(dir, "tsconfig.json"));
    const palette = join("src", "gpumemviz", "render", "palette.json");
    cpSync(join(JS, "..", palette), join(top, palette));
    symlinkSync(realpathSync(join(JS, "node_modules")), join(dir, "node_modules"), "dir");
    // a string where the JSDoc says number
    appendFileSync(join(dir, "src", "rows.js"),
      '\n/** @type {number} */\nexport const plantedNumber = "not a number";\n');
    // a trait the widget's model does not have (the anywidget model is typed by its traits)
    const widget = join(dir, "src", "widget.js");
    const text = readFileSync(widget, "utf8");
    const anchor = "  onHeader();\n";
    assert.ok(text.includes(anchor), "widget.js changed: move the planted error");
    writeFileSync(widget, text.replace(anchor, `${anchor}  model.get("no_such_trait");\n`));

    const run = spawnSync(process.execPath, [TSC, "-p", join(dir, "tsconfig.json")],
      { encoding: "utf8" });
    const out = `${run.stdout}${run.stderr}`;
    assert.notEqual(run.status, 0, `tsc passed the planted errors:\n${out}`);
    assert.match(out, /src\/rows\.js\(\d+,\d+\): error TS2322: Type 'string' is not assignable to type 'number'/);
    assert.match(out, /src\/widget\.js\(\d+,\d+\): error TS2345: Argument of type '"no_such_trait"'/);
    assert.equal(out.match(/error TS/g)?.length, 2, `errors besides the planted ones:\n${out}`);
  } finally {
    rmSync(top, { recursive: true, force: true });
  }
});

test("every `any` in a JSDoc type of js/src gives its reason (`any: why` beside it)", () => {
  const src = join(JS, "src");
  const bare = [];
  for (const name of readdirSync(src).filter((n) => n.endsWith(".js"))) {
    const text = readFileSync(join(src, name), "utf8");
    // each JSDoc comment with the rest of its last line (a cast's reason follows it there)
    for (const m of text.matchAll(/\/\*\*[\s\S]*?\*\/[^\n]*/g)) {
      if (jsdocTypes(m[0]).some((t) => /\bany\b/.test(t)) && !/\bany: \S/.test(m[0])) {
        bare.push(`${name}:${text.slice(0, m.index).split("\n").length}: ${m[0].split("\n")[0]}`);
      }
    }
  }
  assert.deepEqual(bare, []);
});

/** The type expressions in a JSDoc comment: the text inside its outermost braces.
 * @param {string} comment */
function jsdocTypes(comment) {
  const types = [];
  let depth = 0, start = 0;
  for (let i = 0; i < comment.length; i++) {
    if (comment[i] === "{" && depth++ === 0) start = i + 1;
    else if (comment[i] === "}" && depth > 0 && --depth === 0) types.push(comment.slice(start, i));
  }
  return types;
}

test("the `any` scan sees a bare one, also in a type over several lines", () => {
  assert.deepEqual(jsdocTypes("/** @type {{a: number,\n *   b: any}} */"), ["{a: number,\n *   b: any}"]);
  assert.deepEqual(jsdocTypes("/** @param {string} x any text */"), ["string"]);
});
