"""The panel in a real JupyterLab and Chromium: rows, pixels and screenshots of real snapshots."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import real_file  # tests/ is on sys.path
from gpumemviz.io import loads_restricted
from gpumemviz.render.rows import KIND_ALLOCATED, KIND_PENDING, KIND_RELEASABLE, KIND_TRAPPED
from gpumemviz.render.rows import build_rows as _build_rows
from gpumemviz.snapshot import Snapshot

pytestmark = pytest.mark.browser

# shipped (tests/data/real): 370 segments in 2 groups (201 large, 169 small), 3,019 blocks,
# allocated and trapped free mixed in a segment
PICTURE = real_file("ZijianDu__Attention__memory.7e5ba324.pickle")
BIG = PICTURE
# more rows where CI has them (../shared): 1,457 segments; skipped (one line) without
BIGGER = "kkaitlyn111__cs336-a2-systems__memory_snapshot.pickle"

# page-side helpers: the first panel view on the page and its segment map
VIEW = "() => window.__gpumemviz && Object.values(window.__gpumemviz.views)[0]"


def read_real(path: Path):
    """The raw torch dict, through the restricted loader (plain types only)."""
    return loads_restricted(path.read_bytes())


def _kind(seg: dict, block: dict) -> int:
    """A block's colour class from the raw torch dict (independent of render/rows.py)."""
    if block["state"] == "active_allocated":
        return KIND_ALLOCATED
    if block["state"] == "active_pending_free":
        return KIND_PENDING
    if any(b["state"] == "active_allocated" for b in seg["blocks"]):
        return KIND_TRAPPED
    return KIND_RELEASABLE


def _pick_segment(segs: list[dict]) -> int:
    """The non-expandable segment whose wide blocks (>= 2% of it) show the most kinds."""

    def score(i: int) -> tuple[int, int]:
        wide = [b for b in segs[i]["blocks"] if b["size"] * 50 >= segs[i]["total_size"]]
        return len({_kind(segs[i], b) for b in wide}), len(wide)

    return max((i for i, s in enumerate(segs) if not s.get("is_expandable")), key=score)


def _panel_cell(path: Path, title: str, extra: str = "") -> str:
    return (
        "from gpumemviz.io import load_snapshot\n"
        "from gpumemviz.widget import MemoryPanel\n"
        f"panel = MemoryPanel.from_snapshot(load_snapshot({str(path)!r}), title={title!r})\n"
        f"{extra}\n"
        "panel"
    )


def _wait_drawn(page, row: int | None = None) -> None:
    page.wait_for_function(
        """([view, row]) => {
            const v = eval(view)();
            if (!v || !v.root.dataset.seq) return false;
            // the advice list settles first (a check off the kernel's thread may still add
            // rows above the map, moving it under the pointer)
            const items = [...v.root.querySelectorAll(".gmv-advice li")];
            if (items.some((li) => li.textContent.startsWith("checking advice"))) return false;
            const c = v.map.canvas;
            if (!(Number(c.dataset.drawnRows) > 0)) return false;
            return row === null || v.map.cached(row) !== null;
        }""",
        arg=[VIEW, row],
        timeout=60_000,
    )


def test_real_snapshot_pixels_match_its_blocks(page, notebook, artifacts):
    raw = read_real(PICTURE)
    segs = raw["segments"]
    rows = _build_rows(Snapshot.from_torch(raw))
    seg_index = _pick_segment(segs)
    row = int(list(rows.segment).index(seg_index))

    page.set_viewport_size({"width": 1400, "height": 1000})
    nb = notebook("pixels.ipynb", [_panel_cell(PICTURE, PICTURE.name.split("__")[0])])
    nb.run(0)
    _wait_drawn(page)
    assert page.evaluate(f"() => ({VIEW})().root.dataset.rows") == str(len(segs))

    page.evaluate(f"(row) => ({VIEW})().map.scrollToRow(row)", row)
    _wait_drawn(page, row)
    got = page.evaluate(
        """([view, row]) => {
            const v = eval(view)();
            v.map.drawNow();
            const r = v.map.rowRect(row);
            const ctx = v.map.canvas.getContext('2d');
            const px = ctx.getImageData(r.x, r.y + Math.floor(r.h / 2), r.w, 1).data;
            const rgb = [];
            for (let i = 0; i < px.length; i += 4) rgb.push([px[i], px[i + 1], px[i + 2]]);
            return { rgb, cells: r.w, kinds: v.map.palette.kinds,
                     label: v.map.cached(row).meta.total_size };
        }""",
        [VIEW, row],
    )
    seg = segs[seg_index]
    assert got["label"] == seg["total_size"]
    cells, total = got["cells"], seg["total_size"]
    assert len(got["rgb"]) == cells
    checked, colours = 0, set()
    offset = 0
    for b in seg["blocks"]:
        lo = -(-offset * cells // total)
        hi = (offset + b["size"]) * cells // total
        offset += b["size"]
        if hi - lo < 3:
            continue
        want = got["kinds"][_kind(seg, b)]
        for c in range(lo + 1, hi - 1):
            assert got["rgb"][c] == want, (c, b, got["rgb"][c], want)
        colours.add(tuple(want))
        checked += 1
    assert checked >= 3 and len(colours) >= 2

    # hover: the tooltip names the exact block under the pointer
    from gpumemviz.snapshot.units import format_size

    wide = max(range(len(seg["blocks"])), key=lambda j: seg["blocks"][j]["size"])
    start = sum(b["size"] for b in seg["blocks"][:wide])
    mid_cell = (start + seg["blocks"][wide]["size"] // 2) * cells // total
    box = page.evaluate(
        """([view, row]) => { const v = eval(view)(); const r = v.map.rowRect(row);
            const c = v.map.canvas.getBoundingClientRect();
            return { x: c.left + r.x, y: c.top + r.y + r.h / 2 }; }""",
        [VIEW, row],
    )
    page.mouse.move(box["x"] + mid_cell + 0.5, box["y"])
    tip = page.locator(".gmv-tip").first
    tip.wait_for(state="visible", timeout=5000)
    text = tip.text_content()
    want_block = seg["blocks"][wide]
    words = {"inactive": "free", "active_allocated": "allocated"}  # the legend's words
    state = want_block["state"]
    assert f"{format_size(want_block['size'])} {words.get(state, state)} (" in text, text
    assert f"torch: {state})" in text, text
    assert f"block 0x{seg['address'] + start:x} +{format_size(start)}:" in text, text
    page.mouse.move(0, 0)

    root = page.locator(".gmv-root").first
    root.scroll_into_view_if_needed()
    page.evaluate(f"() => ({VIEW})().map.scrollToRow(0)")
    _wait_drawn(page, 0)
    page.evaluate(f"() => ({VIEW})().map.drawNow()")
    root.screenshot(path=str(artifacts / "panel_real_snapshot.png"))


@pytest.mark.parametrize(
    "name", [pytest.param(BIG.name, id="370-rows"), pytest.param(BIGGER, id="ci-1457-rows")]
)
def test_hundreds_of_rows_scroll_virtually(page, notebook, artifacts, name):
    path = real_file(name)
    n = len(read_real(path)["segments"])
    assert n > 300  # far more rows than one view draws
    nb = notebook("rows.ipynb", [_panel_cell(path, f"{n:,} segments")])
    nb.run(0)
    _wait_drawn(page)
    state = page.evaluate(
        f"""() => {{ const v = ({VIEW})();
            return {{ rows: v.root.dataset.rows, nRows: v.map.nRows,
                      drawn: Number(v.map.canvas.dataset.drawnRows) }}; }}"""
    )
    assert state["rows"] == str(n) and state["nRows"] == n
    assert 0 < state["drawn"] < 100  # only the rows in view are drawn
    page.evaluate(f"(row) => ({VIEW})().map.scrollToRow(row)", n - 1)
    _wait_drawn(page, n - 1)
    frames = page.evaluate("() => window.__gpumemviz.log.filter(e => e.event === 'frame')")
    assert frames and max(f["bytes"] for f in frames) <= 256 << 10
    page.evaluate(f"() => ({VIEW})().map.drawNow()")
    shot = artifacts / f"panel_last_rows_{n}.png"
    page.locator(".gmv-root").first.screenshot(path=str(shot))


LIVE_CELL = """
import threading
from gpumemviz.snapshot import Snapshot
from gpumemviz.widget import MemoryPanel

MiB = 1 << 20


def state(k):
    n = k % 12 + 1  # n allocated 2 MiB blocks at the start of a 40 MiB segment
    sizes = [2 * MiB] * n + [(40 - 2 * n) * MiB]
    return Snapshot.from_columns(device=[0], address=[1 << 32], total_size=[40 * MiB], stream=[0],
        is_small=[False], block_count=[n + 1], size=sizes, requested_size=sizes,
        state=[1] * n + [0])


panel = MemoryPanel(title="fed from a thread")
panel.show_snapshot(state(0))
stop = threading.Event()


def feed():
    k = 0
    while not stop.wait(0.35):
        k += 1
        panel.show_snapshot(state(k))


threading.Thread(target=feed, daemon=True).start()
panel
"""


def test_panel_updates_while_another_cell_runs(page, notebook):
    from gpumemviz.render.rows import build_rows, encode_cells

    nb = notebook("live.ipynb", [LIVE_CELL, "import time\nfor _ in range(6):\n    time.sleep(1)"])
    nb.run(0)
    _wait_drawn(page, 0)
    nb.start(1)
    seen: dict[int, list[int]] = {}
    allocated: set[int] = set()
    busy_polls = 0
    deadline = page.evaluate("() => Date.now()") + 6000
    while page.evaluate("() => Date.now()") < deadline:
        got = page.evaluate(
            f"""() => {{ const v = ({VIEW})(); const row = v.map.cached(0);
                const fig = v.root.querySelector('[data-fig=allocated]');
                return {{ cells: row ? Array.from(row.cells) : null,
                         allocated: fig ? Number(fig.dataset.value) : null }}; }}"""
        )
        if nb.running() and got["cells"] is not None:
            busy_polls += 1
            n = round(got["cells"].count(63) / len(got["cells"]) * 20)
            seen.setdefault(n, got["cells"])
            allocated.add(got["allocated"])
        page.wait_for_timeout(150)
    nb.wait_idle()
    assert busy_polls >= 10
    assert len(seen) >= 5, sorted(seen)
    # the header's allocated figure follows: n x 2 MiB for the states the thread produced
    assert len(allocated) >= 5 and all(a % (2 << 20) == 0 and 0 < a <= 24 << 20 for a in allocated)
    for n, cells in seen.items():  # every state drawn is one the thread produced, exactly
        sizes = [2 << 20] * n + [(40 - 2 * n) << 20]
        snap = Snapshot.from_columns(
            device=[0],
            address=[1 << 32],
            total_size=[40 << 20],
            stream=[0],
            is_small=[False],
            block_count=[n + 1],
            size=sizes,
            requested_size=sizes,
            state=[1] * n + [0],
        )
        assert cells == encode_cells(build_rows(snap), cells=len(cells))[0].tolist()


def test_palette_follows_the_dark_theme(page, notebook, artifacts):
    nb = notebook("dark.ipynb", [_panel_cell(PICTURE, "dark theme")])
    nb.run(0)
    _wait_drawn(page)
    light = page.evaluate(f"() => ({VIEW})().map.palette.kinds")
    page.evaluate(
        "() => window.jupyterapp.commands.execute('apputils:change-theme', "
        "{theme: 'JupyterLab Dark'})"
    )
    page.wait_for_function(
        f"""light => {{ const k = ({VIEW})().map.palette.kinds;
            return JSON.stringify(k) !== JSON.stringify(light); }}""",
        arg=light,
        timeout=30_000,
    )
    dark = page.evaluate(f"() => ({VIEW})().map.palette.kinds")
    assert len({tuple(c) for c in dark}) == 4  # four distinct colours in both themes
    page.evaluate(f"() => ({VIEW})().map.drawNow()")
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "panel_dark.png"))
    page.evaluate(
        "() => window.jupyterapp.commands.execute('apputils:change-theme', "
        "{theme: 'JupyterLab Light'})"
    )


def test_scrolling_gets_rows_while_a_cell_runs(page, notebook):
    """The view message reaches Python on a subshell, so far rows arrive during a busy cell."""
    n = len(read_real(BIG)["segments"])
    nb = notebook(
        "busy.ipynb",
        [_panel_cell(BIG, "busy kernel", "assert panel.subshell"), "import time\ntime.sleep(8)"],
    )
    nb.run(0)
    _wait_drawn(page)
    nb.start(1)
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
        " === 'busy'",
        timeout=10_000,
    )
    page.wait_for_timeout(500)
    target = n - 5
    page.evaluate(f"(row) => ({VIEW})().map.scrollToRow(row)", target)
    _wait_drawn(page, target)
    assert nb.running()  # the rows came while the cell still ran
    nb.wait_idle()


SIMULATED_CELL = """
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource
from gpumemviz.widget import MemoryPanel

panel = MemoryPanel(title="simulated training")
produced, allocated = [], []


def keep(sample):
    if sample.stats is not None:
        allocated.append(sample.stats.allocated)
    if sample.segments is not None:
        produced.append(sample.segments)


sampler = Sampler(SimulatedSource(), interval=0.3, segment_interval=0.3, cpu_budget=0.5)
sampler.add_listener(keep)
sampler.add_listener(panel.push_sample)
sampler.start()
panel
"""
SAVE_CELL = """
import json, pickle
sampler.stop()
with open("produced.pickle", "wb") as f:
    pickle.dump([s.to_torch() for s in produced], f, protocol=4)
with open("allocated.json", "w") as f:
    json.dump(allocated, f)
"""


def test_simulated_source_states_reach_the_canvas(page, notebook, lab, artifacts):
    """Acceptance (issue 6): a 10-second loop runs in the next cell; the browser shows at least 5
    distinct segment maps, each one the source produced, and the allocated figure follows."""
    from gpumemviz.render.rows import build_rows, encode_cells

    nb = notebook(
        "simulated.ipynb",
        [SIMULATED_CELL, "import time\nfor _ in range(10):\n    time.sleep(1)", SAVE_CELL],
    )
    nb.run(0)
    _wait_drawn(page)
    nb.start(1)
    states: dict[tuple, int] = {}
    figures: set[int] = set()
    polls = 0
    while True:
        running = nb.running()
        got = page.evaluate(
            f"""() => {{ const v = ({VIEW})(); const rows = {{}};
                for (let r = v.map.view.first; r < v.map.view.first + v.map.view.count; r++) {{
                    const c = v.map.cached(r); if (c) rows[r] = Array.from(c.cells); }}
                const fig = v.root.querySelector('[data-fig=allocated]');
                const demo = !v.root.querySelector('.gmv-badge').hidden;
                return {{ rows, cells: v.map.view.cells, demo,
                         allocated: fig ? Number(fig.dataset.value) : null }}; }}"""
        )
        if not running:
            break
        polls += 1
        key = tuple(sorted((int(r), tuple(c)) for r, c in got["rows"].items()))
        if key:
            states.setdefault(key, got["cells"])
        figures.add(got["allocated"])
        page.wait_for_timeout(200)
    nb.wait_idle()
    assert got["demo"]  # simulated data is labelled as such
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "panel_simulated.png"))
    nb.run(2)
    produced = [Snapshot.from_torch(d) for d in read_real(lab.root / "produced.pickle")]
    allocated = set(json.loads((lab.root / "allocated.json").read_text()))
    assert polls >= 10
    assert len(states) >= 5, len(states)
    encoded: dict[int, list[dict[int, tuple]]] = {}
    for key, cells in states.items():
        if cells not in encoded:
            encoded[cells] = []
            for snap in produced:
                rows = build_rows(snap, device=0)
                grid = encode_cells(rows, cells=cells)
                encoded[cells].append({r: tuple(grid[r].tolist()) for r in range(rows.n_rows)})
        assert any(all(m.get(r) == c for r, c in key) for m in encoded[cells]), key[:2]
    # the header's allocated figure follows the source (stats, or the snapshot's blocks)
    for snap in produced:
        allocated.add(int(snap.blocks.size[snap.blocks.state == 1].sum()))
    assert len(figures - {None}) >= 5
    assert figures - {None} <= allocated


# shipped: GPT-2 medium inference, 98 segments, a 3,840-entry trace
REPLAY = real_file(
    "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
)


def test_magic_replays_a_real_file_and_shows_its_rows(page, notebook, artifacts):
    """Acceptance (issue 6): `%gpumemviz --replay FILE` opens on the state the file records."""
    n = len(read_real(REPLAY)["segments"])
    nb = notebook("replay.ipynb", ["%load_ext gpumemviz", f"%gpumemviz --replay {REPLAY}"])
    nb.run(0)
    nb.run(1)
    _wait_drawn(page)
    got = page.evaluate(
        f"""() => {{ const v = ({VIEW})();
            return {{ rows: v.root.dataset.rows, nRows: v.map.nRows,
                      title: v.root.querySelector('.gmv-title').textContent,
                      status: v.root.querySelector('.gmv-status').textContent }}; }}"""
    )
    assert got["rows"] == str(n) and got["nRows"] == n
    assert got["title"] == "recorded trace" and got["status"].startswith(f"replay of {REPLAY.name}")
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "panel_replay.png"))


FULL_CELL = """
import gpumemviz
from gpumemviz.live.sources.simulated import SimulatedSource

# the training workload at 6x speed, held at its out-of-memory error
src = SimulatedSource("training", steps_per_second=2500, loop=False)
panel = gpumemviz.monitor(source=src, interval=0.25)
panel
"""


def test_full_header_on_the_simulated_oom(page, notebook, artifacts):
    """Every header figure of a live source, the demo badge, the OOM verdict and the advice: the
    README picture."""
    page.set_viewport_size({"width": 1300, "height": 900})
    nb = notebook("full.ipynb", [FULL_CELL, "src.ooms[-1].cause, src.ooms[-1].explanation"])
    nb.run(0)
    _wait_drawn(page)
    page.wait_for_function(
        f"""() => {{ const v = ({VIEW})(); const o = v.root.querySelector('.gmv-oom');
            const n = v.root.querySelector('[data-fig=num_ooms]');
            return !o.hidden && v.root.querySelectorAll('.gmv-advice li').length > 0
                && n !== null && n.dataset.value === '1'; }}""",
        timeout=60_000,
    )
    nb.run(1)
    got = page.evaluate(
        f"""() => {{ const v = ({VIEW})(); const r = v.root;
            return {{ figs: Array.from(r.querySelectorAll('[data-fig]')).map(f => f.dataset.fig),
                      demo: !r.querySelector('.gmv-badge').hidden,
                      title: r.querySelector('.gmv-title').textContent,
                      cause: r.querySelector('.gmv-oom').dataset.cause,
                      oom: r.querySelector('.gmv-oom').textContent,
                      advice: Array.from(r.querySelectorAll('.gmv-advice li'))
                          .map(li => li.dataset.kind) }}; }}"""
    )
    out = page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.widgets[1].model.outputs.toJSON()"
    )
    want_cause, want_text = ast.literal_eval(out[0]["data"]["text/plain"])
    assert got["cause"] == want_cause == "fragmentation"
    assert want_text in got["oom"]
    assert got["demo"] and got["title"] == "simulated caching allocator (demo)"
    for key in ("nvml_total", "nvml_used", "reserved", "allocated", "free", "largest_free"):
        assert key in got["figs"]
    assert {"fragmentation", "num_alloc_retries", "num_ooms"} <= set(got["figs"])
    assert "expandable_segments" in got["advice"]
    page.evaluate(f"() => ({VIEW})().map.drawNow()")
    root = page.locator(".gmv-root").first
    root.scroll_into_view_if_needed()
    root.screenshot(path=str(artifacts / "panel_full.png"))
    # the README picture of this panel is `make screenshots`' (tools/screenshots.py)
