"""What the panel's wire costs: bytes per frame and Python time per frame, 10^3..10^6 blocks.

Synthetic segment states (large segments of B blocks in 512-byte multiples, 70 % allocated,
no two free blocks adjacent) go through the code the panel runs on every sample: build_rows
(all blocks), then Wire frames for one view of 48 rows x 1,024 cells (the panel's default height
is ~28 rows; 48 leaves room). Columns:

  rows_ms     build_rows over every block (runs once per sample)
  open        first frame after a view opens: bytes, Python ms (rows in view + prefetch)
  steady      a sample in which 1 % of the blocks changed state: bytes of the largest frame
              sent, number of frames, Python ms for build_rows + frames
  same        a sample equal to the previous one: bytes sent (must be 0), Python ms
  all_ms      encode_cells of *every* row (not on the wire; what a full redraw would cost)

Targets (issue 6): steady frames <= 64 KiB at 10^6 blocks, the first frame <= 256 KiB, rows of
10^6 blocks encoded in well under 100 ms. Chromium's draw time per frame is measured by the
browser part below.

With --browser, the same synthetic states are shown in a real JupyterLab + Debian Chromium (as
in tests/browser): per size, the bytes of the steady frame the browser received, the time to
decode and apply it (decode_ms), and the canvas redraw of the whole view (draw_ms, median of 20
redraws of 48+ rows x 1,024 cells). Target: at most 16 ms per redraw at 10^5 blocks.

Devices (issue 16): a panel of 8 devices (`--device all`) does, per sample of every device,
build_rows + `render.strips.device_summary` for each and the selected device's frames; the strips
travel as one JSON trait. Columns: devices, blocks per device, strips_B (the trait's JSON bytes),
frame_KiB (largest frame of the selected map), update_ms (all devices' rows and summaries plus
the selected device's frames), ratio (update_ms over the 1-device panel's, measured in the same
run: the baseline). Target: strips and every frame within the 64 KiB per-frame limit at 8
devices.

Run: .venv/bin/python benchmarks/widget.py [--quick] [--browser]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import run_main
from gpumemviz.render.rows import build_rows, encode_cells
from gpumemviz.render.strips import device_summary, strip_set
from gpumemviz.render.wire import FIRST_FRAME_LIMIT, FRAME_LIMIT, Wire
from gpumemviz.snapshot import ALLOCATED, INACTIVE, PENDING_FREE, Snapshot

VIEW_ROWS = 48
CELLS = 1024
REPO = Path(__file__).resolve().parents[1]
VIEW_JS = "() => Object.values(window.__gpumemviz.views)[0]"


def synthetic(n_blocks: int, per_segment: int, seed: int, flip: float = 0.0) -> Snapshot:
    rng = np.random.default_rng(seed)
    n_seg = max(1, n_blocks // per_segment)
    units = rng.integers(1, 4096, size=(n_seg, per_segment))
    size = (units * 512).ravel()
    state = np.where(rng.random(size.size) < 0.7, ALLOCATED, INACTIVE).astype(np.uint8)
    state[1:][(state[1:] == INACTIVE) & (state[:-1] == INACTIVE)] = ALLOCATED
    if flip:
        idx = np.random.default_rng(seed + 1).choice(size.size, int(size.size * flip), False)
        state[idx] = np.where(state[idx] == ALLOCATED, PENDING_FREE, ALLOCATED)
    return Snapshot.from_columns(
        device=np.zeros(n_seg, np.int64),
        address=np.arange(n_seg, dtype=np.int64) << 36,
        total_size=units.sum(axis=1) * 512,
        stream=np.zeros(n_seg, np.int64),
        is_small=np.zeros(n_seg, bool),
        block_count=np.full(n_seg, per_segment),
        size=size,
        requested_size=size,
        state=state,
    )


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3, out


def measure(n_blocks: int, per_segment: int, repeat: int) -> dict:
    base = synthetic(n_blocks, per_segment, seed=0)
    changed = synthetic(n_blocks, per_segment, seed=0, flip=0.01)
    rows_ms, rows = best(lambda: build_rows(base), repeat)

    def open_view():
        wire = Wire()
        wire.set_rows(rows)
        return wire, wire.set_view("bench", first=0, count=VIEW_ROWS, cells=CELLS)

    open_ms, (wire, opened) = best(open_view, repeat)

    def steady():
        w = Wire()
        w.set_rows(rows)
        w.set_view("bench", first=0, count=VIEW_ROWS, cells=CELLS)
        t = time.perf_counter()
        w.set_rows(build_rows(changed))
        frames = w.update()
        return (time.perf_counter() - t) * 1e3, frames

    runs = [steady() for _ in range(repeat)]
    steady_ms = min(r[0] for r in runs)
    frames = runs[0][1]

    def same():
        wire.set_rows(build_rows(base))
        return wire.update()

    same_ms, same_frames = best(same, repeat)
    all_ms, _ = best(lambda: encode_cells(rows), 1)
    return {
        "blocks": len(base.blocks),
        "rows": rows.n_rows,
        "rows_ms": rows_ms,
        "open_kib": max(f.nbytes for f in opened) / 1024,
        "open_ms": open_ms,
        "steady_kib": max((f.nbytes for f in frames), default=0) / 1024,
        "steady_n": len(frames),
        "steady_ms": steady_ms,
        "same_b": sum(f.nbytes for f in same_frames),
        "same_ms": same_ms,
        "all_ms": all_ms,
    }


def measure_devices(n_dev: int, n_blocks: int, per_segment: int, repeat: int) -> dict:
    """One update of a panel of ``n_dev`` devices: every device's rows and strip summary, the
    selected device's frames (a view open on it), the strips trait's JSON."""
    states = [
        [synthetic(n_blocks, per_segment, seed=d, flip=f) for d in range(n_dev)]
        for f in (0.0, 0.01)
    ]
    wire = Wire()
    wire.set_rows(build_rows(states[0][0]))
    wire.set_view("bench", first=0, count=VIEW_ROWS, cells=CELLS)
    times, frame_b, strips_b = [], 0, 0
    for i in range(repeat * 2):  # alternate the two states: every update changes rows
        t = time.perf_counter()
        summaries = []
        for d, snap in enumerate(states[i % 2]):
            rows = build_rows(snap)
            summaries.append(device_summary(rows, device=d))
            if d == 0:
                wire.set_rows(rows)
                frames = wire.update()
        trait = json.dumps(strip_set(summaries, selected=0)) if n_dev > 1 else ""
        times.append((time.perf_counter() - t) * 1e3)
        frame_b = max([frame_b, *(f.nbytes for f in frames)])
        strips_b = max(strips_b, len(trait))
    return {"update_ms": min(times), "frame_kib": frame_b / 1024, "strips_b": strips_b}


def devices_table(sizes: list[int], repeat: int) -> bool:
    """Rows for 1 (the baseline) and 8 devices; True when the frame limits hold."""
    print(
        f"{'devices':>7} {'blocks/dev':>10} {'strips_B':>8} {'frame_KiB':>9} {'update_ms':>9} "
        f"{'ratio':>6}"
    )
    ok = True
    for n in sizes:
        base = measure_devices(1, n, 100, repeat)
        for n_dev in (1, 8):
            r = base if n_dev == 1 else measure_devices(n_dev, n, 100, repeat)
            print(
                f"{n_dev:>7} {n:>10,} {r['strips_b']:>8,} {r['frame_kib']:>9.1f} "
                f"{r['update_ms']:>9.1f} {r['update_ms'] / base['update_ms']:>6.2f}"
            )
            ok &= r["strips_b"] <= FRAME_LIMIT and r["frame_kib"] * 1024 <= FRAME_LIMIT
    print(
        f"target: 8 devices' strips and frames <= {FRAME_LIMIT >> 10} KiB each: "
        f"{'met' if ok else 'MISSED'} (ratio: update time over the 1-device panel's)"
    )
    return ok


def browser_table(sizes: list[int]) -> bool:
    """Show synthetic states in JupyterLab + Chromium; print what the browser spends per frame."""
    sys.path.insert(0, str(REPO / "tests" / "browser"))
    from labtools import CHROMIUM, CHROMIUM_ARGS, TEST_HOOKS, Notebook, running_lab
    from playwright.sync_api import sync_playwright

    setup = "\n".join(
        [
            "import numpy as np",
            "from gpumemviz.snapshot import ALLOCATED, INACTIVE, PENDING_FREE, Snapshot",
            "from gpumemviz.widget import MemoryPanel",
            inspect.getsource(synthetic),
            "panel = MemoryPanel(title='benchmark')",
            "panel.show_snapshot(synthetic(1000, 100, 0))",
            "panel",
        ]
    )
    cells = [setup]
    for n in sizes:
        cells.append(f"panel.show_snapshot(synthetic({n}, 100, 0)); assert panel.flush()")
        cells.append(f"panel.show_snapshot(synthetic({n}, 100, 0, 0.01)); assert panel.flush()")
    print(f"{'blocks':>9} {'frame_KiB':>9} {'decode_ms':>9} {'draw_ms':>8} {'rows_drawn':>10}")
    ok = True
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_lab(Path(tmp)) as lab,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.add_init_script(TEST_HOOKS)  # the views' registry and event log read below
        nb = Notebook(page, lab, "bench.ipynb", cells)
        nb.run(0)
        page.wait_for_function(
            f"() => window.__gpumemviz && ({VIEW_JS})() && ({VIEW_JS})().root.dataset.seq",
            timeout=60_000,
        )
        for i, n in enumerate(sizes):
            nb.run(1 + 2 * i)
            page.wait_for_timeout(300)
            before = page.evaluate("() => window.__gpumemviz.log.length")
            nb.run(2 + 2 * i)
            page.wait_for_function(
                "n => window.__gpumemviz.log.slice(n).some(e => e.event === 'frame')",
                arg=before,
                timeout=30_000,
            )
            got = page.evaluate(
                f"""n => {{ const v = ({VIEW_JS})();
                    const frames = window.__gpumemviz.log.slice(n).filter(e => e.event === 'frame');
                    const draws = [];
                    for (let i = 0; i < 20; i++) {{ v.map.drawNow(); draws.push(v.map.drawMs); }}
                    return {{ bytes: Math.max(...frames.map(f => f.bytes)),
                              decode: Math.max(...frames.map(f => f.ms)), draws,
                              drawn: Number(v.map.canvas.dataset.drawnRows) }}; }}""",
                before,
            )
            draw = statistics.median(got["draws"])
            print(
                f"{n:>9,} {got['bytes'] / 1024:>9.1f} {got['decode']:>9.2f} {draw:>8.2f} "
                f"{got['drawn']:>10}"
            )
            if n == 10**5:
                ok &= draw <= 16
        nb.shutdown()
        browser.close()
    print(f"target: redraw <= 16 ms at 10^5 blocks: {'met' if ok else 'MISSED'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, up to 10^5 blocks")
    ap.add_argument("--browser", action="store_true", help="also time decode and draw in Chromium")
    args = ap.parse_args(argv)
    sizes = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**4, 10**5, 10**6]
    repeat = 2 if args.quick else 5
    head = (
        f"{'blocks':>9} {'per_row':>7} {'rows':>6} {'rows_ms':>8} {'open_KiB':>9} {'open_ms':>8} "
        f"{'steady_KiB':>10} {'frames':>6} {'steady_ms':>9} {'same_B':>6} {'same_ms':>8} "
        f"{'all_ms':>8}"
    )
    print(head)
    ok = True
    for n in sizes:
        for per in (100, 1000):
            if per > n:
                continue
            r = measure(n, per, repeat)
            print(
                f"{r['blocks']:>9,} {per:>7} {r['rows']:>6} {r['rows_ms']:>8.1f} "
                f"{r['open_kib']:>9.1f} {r['open_ms']:>8.1f} {r['steady_kib']:>10.1f} "
                f"{r['steady_n']:>6} {r['steady_ms']:>9.1f} {r['same_b']:>6} {r['same_ms']:>8.1f} "
                f"{r['all_ms']:>8.1f}"
            )
            ok &= r["open_kib"] * 1024 <= FIRST_FRAME_LIMIT
            ok &= r["steady_kib"] * 1024 <= FRAME_LIMIT and r["same_b"] == 0
    print(
        f"targets: first frame <= {FIRST_FRAME_LIMIT >> 10} KiB, steady frames <= "
        f"{FRAME_LIMIT >> 10} KiB, unchanged samples send 0 B: {'met' if ok else 'MISSED'}"
    )
    print()
    ok &= devices_table([n for n in sizes if n <= 10**5], repeat)
    if args.browser:
        print()
        ok &= browser_table(sizes)
    return 0 if ok else 1


if __name__ == "__main__":
    run_main(main, __doc__)
