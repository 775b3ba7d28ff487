"""Issue 7 acceptance: the panel's buttons in a real JupyterLab, clicked while a cell runs."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest

from conftest import read_real, real_file, standin_file  # tests/ is on sys.path
from gpumemviz.io import load_snapshot
from gpumemviz.snapshot.units import format_size

from .test_panel_browser import PICTURE, VIEW, _wait_drawn

pytestmark = pytest.mark.browser

# recorded traces with time_us whose segment count moves along the way
REPLAYS = [
    # shipped stand-in: a 10,000-entry ring, 24 to 46 segments (an empty_cache mid-run)
    pytest.param(lambda: standin_file("training_10k"), id="standin-training_10k"),
    # CI only (../shared): 8,694 entries (torch >= 2.2), 783 to 1,524 segments
    pytest.param(
        lambda: real_file("kkaitlyn111__cs336-a2-systems__memory_2.7b_forward.pickle"),
        id="ci-kkaitlyn-2.7b-forward",
    ),
]


def _live_cell(subshell: bool) -> str:
    return f"""
import gpumemviz
from gpumemviz.live.sources.simulated import SimulatedSource

src = SimulatedSource("training", autostart=False)  # driven by hand: its state is known
src.step(6000)
panel = gpumemviz.monitor(source=src, interval=0.25, subshell={subshell})
assert bool(panel.subshell) is {subshell}
panel
"""


def _wait_fig(page, key: str, want: int, timeout: int = 10_000) -> None:
    """Wait until the panel's header figure `key` shows `want`."""
    page.wait_for_function(
        f"""([key, want]) => {{ const f = ({VIEW})().root.querySelector(`[data-fig=${{key}}]`);
            return f !== null && Number(f.dataset.value) === want; }}""",
        arg=[key, want],
        timeout=timeout,
    )


def _fig(page, key: str) -> int | None:
    return page.evaluate(
        f"""key => {{ const f = ({VIEW})().root.querySelector(`[data-fig=${{key}}]`);
            return f ? Number(f.dataset.value) : null; }}""",
        key,
    )


def _reply(page, state: str = "ok", cmd: str | None = None, timeout: float = 20_000) -> dict:
    page.wait_for_function(
        f"""([state, cmd]) => {{ const l = ({VIEW})().root.querySelector('.gmv-reply');
            return l.dataset.state === state && (cmd === null || l.dataset.cmd === cmd); }}""",
        arg=[state, cmd],
        timeout=timeout,
    )
    return page.evaluate(
        f"""() => {{ const l = ({VIEW})().root.querySelector('.gmv-reply');
            const a = l.querySelector('a');
            return {{ text: l.textContent, thread: l.dataset.thread, cmd: l.dataset.cmd,
                      href: a ? a.getAttribute('href') : null }}; }}"""
    )


def _kernel_value(page, cell: int):
    out = page.evaluate(
        "i => window.jupyterapp.shell.currentWidget.content.widgets[i].model.outputs.toJSON()",
        cell,
    )
    return ast.literal_eval(out[-1]["data"]["text/plain"])


def test_empty_cache_click_is_handled_on_a_subshell_while_a_cell_runs(
    page, notebook, lab, artifacts
):
    """A click during a busy cell acts before the cell ends, on a subshell thread; the header
    shows the released bytes. Export and "would N fit?" answer in the same panel."""
    nb = notebook(
        "buttons.ipynb",
        [
            _live_cell(True),
            "import time\ntime.sleep(10)",
            "from gpumemviz.io import save_snapshot\n"
            "save_snapshot(src.export(), 'expected.pickle')\n"
            "s = src.sample()\n"
            "str(gpumemviz.fragmentation(s.segments).can_fit("
            "'2GiB', device=0, device_free=s.nvml.free))",
        ],
    )
    nb.run(0)
    _wait_drawn(page)
    page.wait_for_function(f"() => ({VIEW})().root.querySelector('[data-fig=free_releasable]')")
    reserved, releasable = _fig(page, "reserved"), _fig(page, "free_releasable")
    assert releasable > 0
    nb.start(1)
    page.wait_for_timeout(1000)  # the cell is well inside its sleep
    assert nb.running()
    page.locator("button[data-cmd=empty_cache]").first.click()
    got = _reply(page, cmd="empty_cache")
    assert nb.running(), "the click was answered only after the cell finished"
    assert got["thread"].startswith("subshell-"), got
    assert f"released cuda:0 {format_size(releasable)}" in got["text"]
    _wait_fig(page, "reserved", reserved - releasable)
    assert _fig(page, "free_releasable") == 0

    page.locator("button[data-cmd=export]").first.click()
    got = _reply(page, cmd="export")
    assert got["href"] and got["href"].startswith("/files/"), got
    name = got["href"].rsplit("/", 1)[1]
    # the link downloads it through the Jupyter server (not through the comm)
    with page.expect_download() as download:
        page.locator(".gmv-reply a").first.click()
    downloaded = Path(download.value.path()).read_bytes()
    assert downloaded == (lab.root / name).read_bytes()
    assert nb.running()
    page.locator("input[data-cmd=fit-input]").first.fill("2GiB")
    page.locator("button[data-cmd=fit]").first.click()
    fit = _reply(page, cmd="fit")
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "panel_buttons.png"))
    nb.wait_idle()

    nb.run(2)
    # the exported file, beside the notebook, reads back equal to the source's own export
    got_snap = load_snapshot(lab.root / name)
    want = load_snapshot(lab.root / "expected.pickle")
    assert (lab.root / name).read_bytes()[:2] == b"\x80\x04"
    assert got_snap.n_segments == want.n_segments and got_snap.n_blocks == want.n_blocks
    assert (got_snap.blocks.size == want.blocks.size).all()
    assert (got_snap.blocks.state == want.blocks.state).all()
    # "would 2GiB fit?" echoes what was typed and answers as can_fit does with the device's
    # free memory
    assert fit["text"] == f"fit: 2 GiB: {_kernel_value(page, 2)}"


def test_with_routing_off_a_click_is_queued_until_the_cell_finishes(page, notebook):
    nb = notebook("queued.ipynb", [_live_cell(False), "import time\ntime.sleep(6)"])
    nb.run(0)
    _wait_drawn(page)
    page.wait_for_function(f"() => ({VIEW})().root.querySelector('[data-fig=free_releasable]')")
    reserved, releasable = _fig(page, "reserved"), _fig(page, "free_releasable")
    nb.start(1)
    page.wait_for_timeout(1000)
    page.locator("button[data-cmd=empty_cache]").first.click()
    queued = _reply(page, state="queued", cmd="empty_cache", timeout=5_000)
    assert "queued until the cell finishes" in queued["text"]
    assert nb.running() and _fig(page, "reserved") == reserved  # nothing happened yet
    got = _reply(page, cmd="empty_cache", timeout=30_000)
    assert not nb.running()  # ...and it acted once the cell ended
    assert got["thread"] == "MainThread"
    assert f"released cuda:0 {format_size(releasable)}" in got["text"]
    _wait_fig(page, "reserved", reserved - releasable)


def test_peaks_are_gpumemvizs_own_and_a_reset_by_someone_else_is_noted(page, notebook):
    """The header's peaks come from gpumemviz's samples; torch's counters reset by another
    monitor leave them and put a note in the status line; the button says it resets torch's
    counters for everyone in the process."""
    nb = notebook(
        "peaks.ipynb",
        [
            _live_cell(False),
            "while src.sample().stats.peak_allocated <= src.sample().stats.allocated:\n"
            "    src.step(50)\n"
            "before = src.sample().stats.peak_allocated\n"
            "src.reset_peaks()  # another monitor's torch.cuda.reset_peak_memory_stats\n"
            "before, src.sample().stats.peak_allocated",
        ],
    )
    nb.run(0)
    _wait_drawn(page)
    page.wait_for_function(f"() => ({VIEW})().root.querySelector('[data-fig=peak_allocated]')")
    title = page.locator("button[data-cmd=reset_peaks]").first.get_attribute("title")
    assert "resets torch's peak counters" in title and "for everyone in this process" in title
    own = _fig(page, "peak_allocated")
    nb.run(1)
    before, after = _kernel_value(page, 1)
    assert after < before  # torch's counter forgot its high...
    page.wait_for_function(
        f"""() => ({VIEW})().root.querySelector('.gmv-status').textContent
            .includes("torch's peak counters were reset outside gpumemviz once")""",
        timeout=10_000,
    )
    assert _fig(page, "peak_allocated") >= own  # ...gpumemviz's did not
    page.locator("button[data-cmd=reset_peaks]").first.click()
    got = _reply(page, cmd="reset_peaks")
    assert "torch's peak counters reset for everyone in this process" in got["text"]


@pytest.mark.parametrize("recording", REPLAYS)
def test_replay_slider_moves_the_map_to_a_recorded_state(page, notebook, artifacts, recording):
    from gpumemviz.live.sources.playback import PlaybackSource

    replay = recording()
    tl = PlaybackSource(replay, loop=False).recording
    # an entry whose state differs from the last one (where the replay opens) in rows and bytes
    counts = np.asarray(tl.segments)
    moved = np.nonzero((counts != counts[-1]) & (np.asarray(tl.allocated) != tl.allocated[-1]))[0]
    k = int(moved[len(moved) // 2])
    want_rows = len(tl.snapshot_at(k)["segments"])
    assert want_rows == counts[k] != counts[-1]
    nb = notebook("slider.ipynb", ["%load_ext gpumemviz", f"%gpumemviz --replay {replay}"])
    nb.run(0)
    nb.run(1)
    _wait_drawn(page)
    slider = page.locator("input[data-cmd=seek]").first
    slider.wait_for(state="visible")
    assert slider.get_attribute("max") == str(len(tl) - 1)
    slider.evaluate(
        "(el, k) => { el.value = String(k); el.dispatchEvent(new Event('change')); }", k
    )
    got = _reply(page, cmd="seek")
    assert got["text"] == f"seek: entry {k + 1} of {len(tl)}"
    page.wait_for_function(
        f"n => ({VIEW})().root.dataset.rows === String(n)", arg=want_rows, timeout=10_000
    )
    assert _fig(page, "reserved") == int(tl.reserved[k])
    assert _fig(page, "allocated") == int(tl.allocated[k])
    # by time: the slider spans the recorded run in µs; a time between two entries shows the
    # earlier one (times read from the file itself, not through gpumemviz)
    times = [e["time_us"] for e in read_real(replay)["device_traces"][0]]
    gaps = [i for i in range(len(times) - 1) if times[i + 1] - times[i] >= 2 and i != k]
    j = gaps[len(gaps) // 4]
    t = times[j] + (times[j + 1] - times[j]) // 2
    page.locator("input[data-cmd=seek-by-time]").first.check()
    assert slider.get_attribute("data-mode") == "time"
    assert slider.get_attribute("max") == str(times[-1] - times[0])
    slider.evaluate(
        "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('change')); }",
        t - times[0],
    )
    got = _reply(page, cmd="seek")
    assert got["text"] == f"seek: entry {j + 1} of {len(tl)}", got
    pos = page.locator(".gmv-pos").first
    page.wait_for_function(
        "([el, j]) => el.dataset.position === String(j)", arg=[pos.element_handle(), j]
    )
    assert pos.get_attribute("data-time-us") == str(times[j])
    seconds = (times[j] - times[0]) / 1e6
    assert f"entry {j + 1} of {len(tl)} · +{seconds:.3f} s (" in pos.text_content()
    page.wait_for_function(
        f"n => ({VIEW})().root.dataset.rows === String(n)",
        arg=len(tl.snapshot_at(j)["segments"]),
        timeout=10_000,
    )
    assert _fig(page, "allocated") == int(tl.allocated[j])
    shot = artifacts / f"panel_replay_slider_{replay.stem[:24]}.png"
    page.locator(".gmv-root").first.screenshot(path=str(shot))


def test_a_second_view_for_the_side_stays_live(page, notebook, artifacts):
    """Side-panel mode: JupyterLab's "Create New View for Output" opens the panel in its own tab,
    a second view of the same model that gets its own frames and keeps updating."""
    nb = notebook("side.ipynb", [_live_cell(True)])
    nb.run(0)
    _wait_drawn(page)
    page.evaluate(
        """() => { const nb = window.jupyterapp.shell.currentWidget;
            nb.content.activeCellIndex = 0;
            return window.jupyterapp.commands.execute('notebook:create-output-view'); }"""
    )
    page.wait_for_function(
        """() => { const views = Object.values(window.__gpumemviz.views);
            return views.length === 2 && views.every(v => v.root.dataset.seq
                && Number(v.map.canvas.dataset.drawnRows) > 0); }""",
        timeout=30_000,
    )
    rows = page.evaluate(
        "() => Object.values(window.__gpumemviz.views).map(v => v.root.dataset.rows)"
    )
    assert len(set(rows)) == 1 and rows[0] != "0"
    # a click in the side view acts on the same panel; both views show the result
    side = page.locator(".jp-LinkedOutputView .gmv-root button[data-cmd=empty_cache]")
    side.click()
    page.wait_for_function(
        """() => Object.values(window.__gpumemviz.views).every(v =>
            Number(v.root.querySelector('[data-fig=free_releasable]').dataset.value) === 0)""",
        timeout=10_000,
    )
    page.locator(".jp-LinkedOutputView").first.screenshot(path=str(artifacts / "panel_side.png"))


# recordings whose blocks carry stacks with a user frame, in view when the panel opens
STACKS = [
    # shipped, real: torch 2.0 format, the stacks read from each block's `history`
    pytest.param(
        lambda: real_file("Yiyi-philosophy__LLM-inference__oom_snapshot.pickle"), id="torch-2.0"
    ),
    # shipped stand-in: expandable segments on 3 devices, torch, native and user frames
    pytest.param(lambda: standin_file("expandable_oom_3dev"), id="standin-expandable"),
    # CI only (../shared): the real expandable OOM on 3 devices, torch >= 2.1 C++ frames
    pytest.param(
        lambda: real_file("Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"),
        id="ci-expandable",
    ),
]


@pytest.mark.parametrize("recording", STACKS)
def test_hover_shows_a_real_blocks_stack_and_a_click_pins_it(page, notebook, artifacts, recording):
    from gpumemviz.analysis.frames import filter_frames, format_frame, user_frame_index
    from gpumemviz.render.rows import build_rows

    from .test_panel_browser import _panel_cell

    stacks = recording()
    nb = notebook("stack.ipynb", [_panel_cell(stacks, "stacks")])
    nb.run(0)
    _wait_drawn(page)
    page.locator(".gmv-scroll").first.scroll_into_view_if_needed()  # below the bar and timeline
    # a block in view whose stack travelled with the frame, and the point in its middle
    spot = page.evaluate(
        f"""() => {{ const v = ({VIEW})(); const c = v.map.canvas.getBoundingClientRect();
            for (let r = v.map.view.first; r < v.map.view.first + v.map.view.count; r++) {{
                const row = v.map.cached(r);
                if (!row || !row.blocks || !row.blocks.stack) continue;
                for (let j = 0; j < row.blocks.size.length; j++) {{
                    const s = row.blocks.stack[j];
                    const cells = row.cells.length, total = row.meta.total_size;
                    const lo = row.blocks.offset[j] * cells / total;
                    const hi = (row.blocks.offset[j] + row.blocks.size[j]) * cells / total;
                    if (!s || s.user === null || hi - lo < 4) continue;
                    const rect = v.map.rowRect(r);
                    return {{ row: r, j, x: c.left + rect.x + (lo + hi) / 2,
                              y: c.top + rect.y + rect.h / 2 }};
                }} }}
            return null; }}"""
    )
    assert spot is not None, "no block with a stack in view"
    page.mouse.move(spot["x"], spot["y"])
    tip = page.locator(".gmv-tip").first
    tip.wait_for(state="visible", timeout=5000)
    text = tip.text_content()

    snap = load_snapshot(stacks)
    rows = build_rows(snap)
    seg = int(rows.segment[spot["row"]])
    b = int(snap.segments.block_start[seg]) + spot["j"]
    kept = filter_frames(snap.block_frames()[b])
    user = user_frame_index(kept)
    assert f"▶ {format_frame(kept[user])}" in text, text
    assert f"block 0x{int(snap.blocks.address[b]):x} " in text
    # the map's short "exp" label has its key in the legend
    legend = page.locator(".gmv-legend").first.text_content() or ""
    assert "exp: an expandable segment's mapped run" in legend, legend
    req = format_size(int(snap.blocks.requested_size[b]))
    size = format_size(int(snap.blocks.size[b]))
    # the legend's word first ("allocated"), torch's after it
    assert f"{size} allocated (requested {req}; torch: active_allocated)" in text

    page.mouse.click(spot["x"], spot["y"])  # pin
    assert tip.get_attribute("data-pinned") == "true"
    page.mouse.move(spot["x"], spot["y"] + 40)
    page.wait_for_timeout(200)
    assert tip.is_visible() and tip.text_content() == text  # pinned: the pointer moved on
    shot = artifacts / f"panel_hover_stack_{stacks.stem[:24]}.png"
    page.locator(".gmv-root").first.screenshot(path=str(shot))
    # the screenshot scrolled the page (the panel is taller than the window): the block again
    page.locator(".gmv-scroll").first.scroll_into_view_if_needed()
    # (the scroll may fetch the row again: its point once it is back in the map's cache)
    again = page.wait_for_function(
        f"""([r, j]) => {{ const v = ({VIEW})(); const c = v.map.canvas.getBoundingClientRect();
            const row = v.map.cached(r), rect = v.map.rowRect(r);
            if (!row || !row.blocks) return null;
            const cells = row.cells.length, total = row.meta.total_size;
            const lo = row.blocks.offset[j] * cells / total;
            const hi = (row.blocks.offset[j] + row.blocks.size[j]) * cells / total;
            return {{ x: c.left + rect.x + (lo + hi) / 2, y: c.top + rect.y + rect.h / 2 }}; }}""",
        arg=[spot["row"], spot["j"]],
        timeout=10_000,
    ).json_value()
    page.mouse.click(again["x"], again["y"])  # unpin
    assert tip.get_attribute("data-pinned") == "false"


def test_timeline_follows_the_sampler_with_step_and_cell_markers(page, notebook, artifacts):
    nb = notebook(
        "timeline.ipynb",
        [
            "%load_ext gpumemviz",
            "%gpumemviz --demo training --interval 0.25",
            "import time, gpumemviz\ngpumemviz.mark('epoch 3')\ntime.sleep(3)",
            "from gpumemviz.widget.magics import _MAGICS\n"
            "panel = next(iter(_MAGICS.values())).feeds[0].panel\n"
            "panel.sampler.stop()\n"
            "panel.flush()\n"
            "[p[:3] for p in panel.timeline.since(0)[1]]",
        ],
    )
    nb.run(0)
    nb.run(1)
    _wait_drawn(page)
    nb.run(2)
    page.wait_for_function(
        f"""() => {{ const t = ({VIEW})().timeline;
            return t.points.length >= 5 && t.marks.some(m => m.kind === 'cell'); }}""",
        timeout=20_000,
    )
    nb.run(3)
    page.wait_for_timeout(500)  # the last points the stopped sampler sent
    want = _kernel_value(page, 3)
    got = page.evaluate(
        f"""() => {{ const t = ({VIEW})().timeline;
            return {{ points: t.points.map(p => p.slice(0, 3)), marks: t.marks,
                      drawn: Number(({VIEW})().root.querySelector('.gmv-timeline canvas')
                                    .dataset.points) }}; }}"""
    )
    # every point the panel recorded, in order; the cell's own end-of-cell read may add one
    assert got["points"][: len(want)] == want and len(got["points"]) - len(want) <= 1
    assert len(want) >= 5 and got["drawn"] == len(got["points"])
    assert all(a[0] < b[0] for a, b in itertools.pairwise(want))
    labels = [(m["kind"], m["label"]) for m in got["marks"]]
    assert ("mark", "epoch 3") in labels
    cell = [label for kind, label in labels if kind == "cell" and label.startswith("cell [3]")]
    assert cell and "allocated " in cell[0] and ", peak " in cell[0], labels
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "panel_timeline.png"))


def test_zoom_into_a_segment_down_to_a_block_narrower_than_a_cell(page, notebook, artifacts):
    from gpumemviz.io import loads_restricted
    from gpumemviz.render.rows import build_rows

    from .test_panel_browser import _kind, _panel_cell

    raw = loads_restricted(PICTURE.read_bytes())
    rows = build_rows(load_snapshot(PICTURE))
    # a segment with an inner block narrower than half a cell even at 1,024 cells
    pick = None
    for r in range(rows.n_rows):
        s = raw["segments"][int(rows.segment[r])]
        if len(s["blocks"]) > 200:
            continue
        for j in range(1, len(s["blocks"]) - 1):
            if s["blocks"][j]["size"] * 2048 < s["total_size"]:
                pick = {"row": r, "j": j}
                break
        if pick:
            break
    assert pick is not None
    many = (  # one segment of 3,000 1 KiB blocks, free every third: more blocks than cells
        "blocks = [{'size': 1024, 'requested_size': 1024, 'state': 'inactive' if i % 3 == 0 "
        "else 'active_allocated'} for i in range(3000)]\n"
        "panel.show_snapshot([{'device': 0, 'address': 1 << 32, 'total_size': 3000 * 1024, "
        "'stream': 0, 'segment_type': 'large', 'blocks': blocks}])"
    )
    huge = many.replace("3000", "70000")  # more blocks than one message carries (65,536)
    nb = notebook("zoom.ipynb", [_panel_cell(PICTURE, "zoom"), many, huge])
    nb.run(0)
    _wait_drawn(page)
    page.evaluate(f"(row) => ({VIEW})().map.scrollToRow(row)", pick["row"])
    _wait_drawn(page, pick["row"])
    seg = raw["segments"][int(rows.segment[pick["row"]])]
    block = seg["blocks"][pick["j"]]
    start = sum(b["size"] for b in seg["blocks"][: pick["j"]])
    centre = start + block["size"] / 2
    # zoom around the block until it is at least 8 pixels wide
    got = page.evaluate(
        f"""([row, centre, size]) => {{ const m = ({VIEW})().map;
            m.openZoom(row);
            for (let k = 0; k < 40; k++) {{
                const z = m.zoom, w = m.zoomCanvas.width;
                if (size / (z.hi - z.lo) * w >= 8) break;
                m.zoomBy(4, (centre - z.lo) / (z.hi - z.lo));
            }}
            m.drawNow();
            const z = m.zoom, c = m.zoomCanvas, w = c.width;
            const x = Math.floor((centre - z.lo) / (z.hi - z.lo) * w);
            const px = c.getContext('2d').getImageData(x, 18, 1, 1).data;
            return {{ lo: z.lo, hi: z.hi, x, rgb: [px[0], px[1], px[2]], kinds: m.palette.kinds,
                      blocks: Number(c.dataset.blocks), exact: c.dataset.exact }}; }}""",
        [pick["row"], centre, block["size"]],
    )
    assert got["exact"] == "1"
    assert got["rgb"] == got["kinds"][_kind(seg, block)]
    offs, n_in = 0, 0
    for b in seg["blocks"]:
        if offs < got["hi"] and offs + b["size"] > got["lo"]:
            n_in += 1
        offs += b["size"]
    assert got["blocks"] == n_in and n_in < len(seg["blocks"])
    # hovering the zoomed block names it exactly; the move is aimed again (the block is at
    # least 8 pixels wide) until it lands: on a loaded machine the zoom box may still be
    # settling when the first move arrives
    tip = page.locator(".gmv-tip").first
    for k in range(20):
        box = page.locator(".gmv-seg-zoom-canvas").first.bounding_box()
        page.mouse.move(box["x"] + got["x"] + 0.5 + (k % 2) * 0.25, box["y"] + 18)
        if tip.is_visible():
            break
        page.wait_for_timeout(250)
    tip.wait_for(state="visible", timeout=5000)
    text = tip.text_content()
    assert f"block 0x{seg['address'] + start:x} +{format_size(start)}: " in text, text
    assert f"{format_size(block['size'])} " in text and f"torch: {block['state']})" in text
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "panel_zoom.png"))
    page.mouse.move(0, 0)

    # a segment of 3,000 blocks travels as cells only; the zoom fetches its exact blocks
    nb.run(1)
    page.wait_for_function(f"() => ({VIEW})().root.dataset.rows === '1'", timeout=20_000)
    _wait_drawn(page, 0)
    assert page.evaluate(f"() => ({VIEW})().map.cached(0).blocks") is None
    page.evaluate(f"() => ({VIEW})().map.openZoom(0)")
    page.wait_for_function(f"() => ({VIEW})().map.zoomCanvas.dataset.exact === '1'", timeout=20_000)
    j = 1001  # an allocated block, 1 MiB into the segment: zoom until it is 8 pixels wide
    got = page.evaluate(
        f"""([centre, size]) => {{ const m = ({VIEW})().map;
            for (let k = 0; k < 40; k++) {{
                const z = m.zoom, w = m.zoomCanvas.width;
                if (size / (z.hi - z.lo) * w >= 8) break;
                m.zoomBy(4, (centre - z.lo) / (z.hi - z.lo));
            }}
            m.drawNow();
            const z = m.zoom, w = m.zoomCanvas.width;
            return {{ x: Math.floor((centre - z.lo) / (z.hi - z.lo) * w),
                      n: m.cached(0).blocks.size.length }}; }}""",
        [j * 1024 + 512, 1024],
    )
    assert got["n"] == 3000
    box = page.locator(".gmv-seg-zoom-canvas").first.bounding_box()
    page.mouse.move(box["x"] + got["x"] + 0.5, box["y"] + 18)
    tip.wait_for(state="visible", timeout=5000)
    text = tip.text_content()
    assert f"block 0x{(1 << 32) + j * 1024:x} +{format_size(j * 1024)}: " in text, text
    assert f"{format_size(1024)} allocated (requested " in text, text
    page.mouse.move(0, 0)

    # 70,000 blocks: the zoom asks for the blocks of its window once it rests; block 69,001 lies
    # beyond the first 65,536, so only the window's own blocks can name it
    nb.run(2)
    page.wait_for_function(
        f"() => {{ const r = ({VIEW})().map.cached(0); return r && r.meta.n_blocks === 70000; }}",
        timeout=30_000,
    )
    j = 69001
    got = page.evaluate(
        f"""([centre, size]) => {{ const m = ({VIEW})().map;
            m.openZoom(0);
            for (let k = 0; k < 40; k++) {{
                const z = m.zoom, w = m.zoomCanvas.width;
                if (size / (z.hi - z.lo) * w >= 8) break;
                m.zoomBy(4, (centre - z.lo) / (z.hi - z.lo));
            }}
            const z = m.zoom, w = m.zoomCanvas.width;
            return {{ x: Math.floor((centre - z.lo) / (z.hi - z.lo) * w) }}; }}""",
        [j * 1024 + 512, 1024],
    )
    page.wait_for_function(f"() => ({VIEW})().map.zoomCanvas.dataset.exact === '1'", timeout=20_000)
    asks = page.evaluate(
        "() => window.__gpumemviz.log.filter(e => e.event === 'blocks').map(e => [e.lo, e.hi])"
    )
    assert len(asks) == 2, asks  # the 3,000-block row whole, then this zoom's resting window
    box = page.locator(".gmv-seg-zoom-canvas").first.bounding_box()
    page.mouse.move(box["x"] + got["x"] + 0.5, box["y"] + 18)
    tip.wait_for(state="visible", timeout=5000)
    text = tip.text_content()
    assert f"block 0x{(1 << 32) + j * 1024:x} +{format_size(j * 1024)}: " in text, text
    assert f"{format_size(1024)} allocated (requested " in text, text
