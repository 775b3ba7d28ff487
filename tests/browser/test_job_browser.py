"""Issue 17's grid in a real JupyterLab: a kernel runs a job store and four ranks publishing
simulated devices (one stopped, so stale), then ``%gpumemviz --job``: a strip per rank, the
rank closest to OOM first, the stale one marked; a click shows a rank's published map; the
button asks a rank for its snapshot and shows the path written, or why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_panel_browser import VIEW

pytestmark = pytest.mark.browser

SETUP = """\
import os, pathlib, tempfile, time
import torch.distributed as dist
from gpumemviz.distributed import Publisher
from gpumemviz.distributed.store import own_connection
from gpumemviz.distributed.summary import RankIdentity
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource

master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
snapdir = pathlib.Path(tempfile.mkdtemp())
pubs = []
for r, (workload, steps) in enumerate(
    [("training", 3000), ("inference_paged", 100), ("training", 9000), ("training", 1000)]
):
    src = SimulatedSource(workload, autostart=False, loop=False)
    src.step(steps)
    sampler = Sampler(src, interval=0.2)
    sampler.sample_once(segments=True)
    sampler.start()
    pub = Publisher(own_connection(master), [(sampler, True, True)],
                    who=RankIdentity(r, 0, "node-a", os.getpid()), interval=0.2,
                    snapshot_dir=snapdir if r == 2 else None)
    pub.tick()
    pubs.append(pub.start())
pubs[3].stop()
time.sleep(1.0)  # rank 3's summary is older than 3 intervals: stale
PORT = master.port
"""

STRIPS = f"""() => {{ const v = ({VIEW})(); if (!v) return null;
    const data = (v.model.get('strips') || {{}}).strips || [];
    return Array.from(v.root.querySelectorAll('.gmv-strip')).map((s, i) => ({{
        rank: Number(s.dataset.rank), stale: s.dataset.stale === 'true',
        selected: s.dataset.selected === 'true',
        label: s.querySelector('.gmv-strip-label').textContent,
        note: s.querySelector('.gmv-strip-note').hidden ? ''
            : s.querySelector('.gmv-strip-note').textContent,
        bins: Number(s.querySelector('canvas').dataset.bins),
        share: data[i].headroom / data[i].total }})); }}"""
DETAIL = f"""() => {{ const v = ({VIEW})(); const j = v && v.root.querySelector('.gmv-job');
    if (!j || j.hidden) return null;
    const r = j.querySelector('.gmv-job-result');
    return {{ rank: j.dataset.rank, mode: v.root.dataset.mode,
        what: j.querySelector('.gmv-job-what').textContent,
        bins: Number(j.querySelector('.gmv-job-map').dataset.bins),
        fields: j.querySelector('.gmv-job-fields').textContent,
        button: j.querySelector('.gmv-job-snapshot').textContent,
        state: r.dataset.state, result: r.textContent, path: r.dataset.path,
        hint: j.querySelector('.gmv-job-hint').textContent,
        map: getComputedStyle(v.root.querySelector('.gmv-scroll')).display,
        figs: v.root.querySelector('.gmv-fig[data-fig=reserved]') !== null }}; }}"""


def _detail(page, cond: str) -> dict:
    page.wait_for_function(
        f"() => {{ const d = ({DETAIL})(); return d && ({cond}); }}", timeout=30_000
    )
    return page.evaluate(DETAIL)


def test_the_job_grid_shows_every_rank_and_a_click_and_the_button_act(page, notebook, artifacts):
    nb = notebook(
        "job.ipynb",
        ["%load_ext gpumemviz", SETUP, "%gpumemviz --job 127.0.0.1:$PORT --interval 0.2"],
    )
    for i in range(3):
        nb.run(i)
    page.wait_for_function(
        f"() => {{ const s = ({STRIPS})(); return s && s.length === 4 && s.every(x => x.bins); }}",
        timeout=60_000,
    )
    strips = page.evaluate(STRIPS)
    assert [s["share"] for s in strips] == sorted(s["share"] for s in strips)
    assert strips[0]["rank"] == 2  # 9000 steps of training: the least headroom
    assert sorted(s["rank"] for s in strips) == [0, 1, 2, 3]
    assert all(s["bins"] == 64 for s in strips)
    assert strips[0]["label"] == "rank 2 \u00b7 cuda:0 \u00b7 node-a"
    assert [(s["rank"], s["note"][:7]) for s in strips if s["stale"]] == [(3, "stale: ")]
    assert [s["selected"] for s in strips] == [True, False, False, False]
    totals = page.locator(".gmv-strips-totals").first.text_content()
    assert totals.startswith("4 ranks \u00b7 4 devices \u00b7 reserved")

    first = _detail(page, "d.rank === '2'")
    assert first["mode"] == "job" and first["map"] == "none" and first["figs"]
    assert "published summary (64 bins), not the full segment map" in first["what"]
    assert first["bins"] == 64 and "host node-a" in first["fields"]

    page.locator(".gmv-strip[data-rank='1']").first.click()
    one = _detail(page, "d.rank === '1'")
    assert one["what"].startswith("rank 1 \u00b7 cuda:0 \u00b7 node-a: ")
    assert one["button"] == "ask rank 1 for its snapshot"
    page.locator(".gmv-job-snapshot").first.click()
    failed = _detail(page, "d.state === 'error'")
    assert "without snapshot_dir" in failed["result"] and not failed["path"]

    page.locator(".gmv-strip[data-rank='2']").first.click()
    _detail(page, "d.rank === '2'")
    page.locator(".gmv-job-snapshot").first.click()
    done = _detail(page, "d.state === 'done' || (d.state === 'error' && d.rank === '2')")
    assert done["state"] == "done", done["result"]
    path = Path(done["path"])
    assert path.name == "rank2.pickle" and path.is_file() and path.stat().st_size > 0
    assert done["result"] == f"rank 2 wrote {path}"
    assert done["hint"] == f"open it: gpumemviz inspect {path}  or  %gpumemviz --replay {path}"
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / "job-grid.png"))
