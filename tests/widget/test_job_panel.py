"""The job's panel (`%gpumemviz --job HOST:PORT`): ranks publishing to a real TCPStore in this
process, the panel reading them as an outside client: strips in grid order, a stale rank marked,
a click showing a rank's published map, the snapshot button answering with the path or why not."""

from __future__ import annotations

import threading
import time

import pytest

torch_dist = pytest.importorskip("torch.distributed")

from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

from gpumemviz.distributed import JobView  # noqa: E402
from gpumemviz.distributed.grid import closeness  # noqa: E402
from gpumemviz.io import load_snapshot  # noqa: E402
from gpumemviz.widget import MemoryPanel, monitor  # noqa: E402
from gpumemviz.widget.job import SUMMARY_NOTE, JobPanel  # noqa: E402
from gpumemviz.widget.magics import _MAGICS  # noqa: E402
from test_distributed import TICK, rank, sim, store_that_goes_away, wait_until  # noqa: E402

STALE_AFTER = 4 * TICK + 0.1  # a stopped rank's summary is stale after 3 intervals


def _ranks(panel: JobPanel, n: int, *, stale: int = 0) -> list[dict]:
    """The strips once `n` are shown, `stale` of them stale."""

    def ready():
        panel.flush()
        strips = panel.strips.get("strips") or []
        return len(strips) == n and sum(bool(s.get("stale")) for s in strips) == stale and strips

    return wait_until(ready)


@pytest.fixture
def master():
    return torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


@pytest.fixture
def job(master, tmp_path):
    """Three ranks: 0 nearly full (with snapshot_dir), 1 roomy, 2 middling (stopped: stale)."""
    tight, roomy, mid = sim("training"), sim("inference_paged"), sim("training")
    tight.step(9000)
    roomy.step(100)
    mid.step(3000)
    pubs = [rank(master, 0, tight, snapshot_dir=tmp_path), rank(master, 1, roomy)]
    pubs.append(rank(master, 2, mid))
    pubs[2].stop()
    time.sleep(STALE_AFTER)
    panel = JobPanel(JobView("127.0.0.1", master.port), interval=TICK, subshell=False)
    yield panel, tmp_path
    panel.close()
    for p in pubs:
        p.stop()


def test_the_panel_draws_a_strip_per_rank_closest_to_oom_first_stale_marked(job):
    panel, _ = job
    strips = _ranks(panel, 3, stale=1)
    assert [closeness(s) for s in strips] == sorted(closeness(s) for s in strips)
    assert strips[0]["rank"] == 0  # the nearly full one
    assert {s["label"] for s in strips} == {
        f"rank {r} \u00b7 cuda:0 \u00b7 host-a" for r in (0, 1, 2)
    }
    (stale,) = [s for s in strips if s["stale"]]
    assert stale["rank"] == 2 and stale["note"].startswith("stale: ")
    assert all(len(s["bins"]) == 64 for s in strips)
    note = panel.strips["note"]
    assert note.startswith("3 ranks \u00b7 3 devices \u00b7 1 stale") and "closest to OOM" in note
    assert panel.job["stale"] == [2] and panel.job["address"] == f"127.0.0.1:{panel.view.port}"
    assert panel.controls["live"] is False  # no sampler: no pause, export, ... buttons act


def test_a_click_shows_the_ranks_published_map_and_fields(job):
    panel, _ = job
    _ranks(panel, 3, stale=1)
    assert panel.strips["selected"] == 0 and panel.job["detail"]["rank"] == 0  # the first
    reply = panel.command("rank", rank=1, device=0)
    assert reply["ok"] and reply["text"] == "showing rank 1 cuda:0"
    assert panel.flush()
    detail = panel.job["detail"]
    assert panel.job["selected"] == {"rank": 1, "device": 0} and detail["rank"] == 1
    assert len(detail["bins"]) == 64 and detail["host"] == "host-a" and "pid" in detail
    assert panel.strips["strips"][panel.strips["selected"]]["rank"] == 1
    assert panel.header["reserved"] == detail["reserved"] > 0
    assert panel.header["num_ooms"] == detail["ooms"]
    assert panel.job["what"] == SUMMARY_NOTE and "(64 bins), not the full" in SUMMARY_NOTE
    assert panel.status == f"reading the job's store every {TICK:g} s"
    port = panel.view.port
    assert panel.title == f"job 127.0.0.1:{port} \u00b7 rank 1 \u00b7 cuda:0 \u00b7 host-a"
    panel.command("rank", rank=2, device=0)
    assert panel.flush() and panel.status.startswith(
        f"reading the job's store every {TICK:g} s; rank 2 is stale: "
    )
    bad = panel.command("rank", rank=9, device=0)
    assert not bad["ok"] and bad["text"] == "rank: no strip of rank 9 cuda:0 here"


def test_the_snapshot_button_answers_with_the_path_or_why_not(job):
    panel, tmp_path = job
    _ranks(panel, 3, stale=1)
    seen: list[str] = []
    real = JobView.request_snapshot

    def spy(self, r, timeout=30.0):
        seen.append(threading.current_thread().name)
        return real(self, r, timeout)

    JobView.request_snapshot = spy  # records the thread only; the real request runs
    try:
        reply = panel.command("rank_snapshot", rank=0)
        assert reply["ok"] and reply["text"] == "asking rank 0 for its snapshot"
        assert panel.asking.result(20) == tmp_path / "rank0.pickle"
        assert load_snapshot(tmp_path / "rank0.pickle").n_segments > 0
        assert seen == ["gpumemviz-job-snapshot"]  # not the caller's thread
        assert panel.flush()
        done = panel.job["snapshot"]
        assert done["state"] == "done" and done["path"] == str(tmp_path / "rank0.pickle")
        assert done["hint"].startswith(f"gpumemviz inspect {tmp_path / 'rank0.pickle'}")
        assert "%gpumemviz --replay" in done["hint"]
        for r, why in ((1, "without snapshot_dir"), (2, "is stale")):
            assert panel.command("rank_snapshot", rank=r)["ok"]
            with pytest.raises(Exception, match=why):
                panel.asking.result(20)
            assert panel.flush()
            failed = panel.job["snapshot"]
            assert failed["state"] == "error" and why in failed["text"] and "path" not in failed
            assert "\n" not in failed["text"]
    finally:
        JobView.request_snapshot = real
    plain = MemoryPanel.from_snapshot([])
    try:
        assert (
            plain.command("rank_snapshot", rank=0)["text"]
            == "this panel shows no job: it has no ranks"
        )
    finally:
        plain.close()


def test_monitor_job_and_the_magic_open_the_panel_a_terminal_prints_the_grid(master, capsys):
    pubs = [rank(master, r, sim()) for r in range(2)]
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpumemviz")
    try:
        panel = monitor(job=f"127.0.0.1:{master.port}", interval=TICK)
        assert isinstance(panel, JobPanel) and panel.feed.running
        panel.close()
        assert not panel.feed.running
        with pytest.raises(ValueError, match="expected HOST:PORT"):
            monitor(job="nohost")
        with pytest.raises(ValueError, match="give no device nor source"):
            monitor(1, job=f"127.0.0.1:{master.port}")
        shell.run_line_magic("gpumemviz", f"--job 127.0.0.1:{master.port}")
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"gpumemviz job 127.0.0.1:{master.port}"
        assert sorted(line.split()[0] for line in out[2:]) == ["0", "1"]
        _MAGICS[id(shell)].widgets = True
        first = shell.run_line_magic("gpumemviz", f"--job 127.0.0.1:{master.port} --interval 0.1")
        second = shell.run_line_magic("gpumemviz", f"--job 127.0.0.1:{master.port}")
        assert isinstance(second, JobPanel) and not first.feed.running  # replaced
        assert len(_ranks(second, 2)) == 2
        shell.run_line_magic("gpumemviz", f"--job 127.0.0.1:{master.port} stop")
        assert not second.feed.running
        for line, why in (
            ("--job nohost", "expected HOST:PORT"),
            ("--job 127.0.0.1:1 --device 1", "--job takes only"),
            (f"--job 127.0.0.1:{master.port} --interval 0", "--interval"),
        ):
            with pytest.raises(UsageError, match=why):
                shell.run_line_magic("gpumemviz", line)
    finally:
        shell.run_line_magic("unload_ext", "gpumemviz")
        InteractiveShell.clear_instance()
        for p in pubs:
            p.stop()


def test_a_store_that_goes_away_stops_the_reads_and_keeps_the_last_grid():
    with store_that_goes_away() as port:
        client = torch_dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
        pub = rank(client, 0, sim())
        panel = JobPanel(JobView("127.0.0.1", port), interval=TICK, subshell=False)
        _ranks(panel, 1)
    try:
        wait_until(lambda: panel.flush() and panel.job["stopped"])
        assert panel.job["stopped"].startswith("the job store went away: ")
        assert panel.status.endswith("(the strips show the last read)")
        assert len(panel.strips["strips"]) == 1 and not panel.feed.running
    finally:
        panel.close()
        pub.stop()


def test_a_store_that_stops_answering_is_said_and_the_panel_recovers(master, monkeypatch):
    """Issue 34: a hung store is "not answering" in the panel (never "reading ... every"), the
    last strips stay, and the next answered read clears it."""
    from gpumemviz.distributed.store import StoreHung

    pub = rank(master, 0, sim())
    panel = JobPanel(JobView("127.0.0.1", master.port), interval=TICK, subshell=False)
    try:
        wait_until(lambda: panel.flush() and panel.grid)
        hung = threading.Event()
        real = panel.view.ranks

        def ranks():
            if hung.is_set():
                raise StoreHung("the job store is not answering (no reply in 1 s)")
            return real()

        monkeypatch.setattr(panel.view, "ranks", ranks)
        hung.set()
        wait_until(lambda: panel.flush() and "not answering" in panel.status)
        assert panel.grid and panel.feed.running
        hung.clear()
        wait_until(lambda: panel.flush() and panel.status.startswith("reading the job's store"))
    finally:
        panel.close()
        pub.stop()
