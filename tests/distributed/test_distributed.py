"""gpumemviz.distributed in one process: ranks as publishers on a real TCPStore, the job view as
an outside client, the simulated device running out of memory through the OOM path."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

torch_dist = pytest.importorskip("torch.distributed")

from gpumemviz.allocator.oom import OutOfMemory  # noqa: E402
from gpumemviz.distributed import JobError, JobView, Publisher, StoreGone, grid_rows, publish  # noqa: E402
from gpumemviz.distributed.keys import MAX_SUMMARY_BYTES, request_key, summary_key  # noqa: E402
from gpumemviz.distributed.store import own_connection  # noqa: E402
from gpumemviz.distributed.summary import RankIdentity  # noqa: E402
from gpumemviz.distributed.terminal import grid_text  # noqa: E402
from gpumemviz.io import load_snapshot  # noqa: E402
from gpumemviz.live.sampler import Sampler  # noqa: E402
from gpumemviz.live.sources.simulated import SimulatedSource  # noqa: E402

TICK = 0.05


@pytest.fixture
def master():
    store = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield store


def rank(store, r, src, **kw) -> Publisher:
    """Rank `r` of a job, publishing `src` (a publisher as `publish` builds one, rank named)."""
    sampler = Sampler(src, interval=TICK)
    sampler.sample_once(segments=True)
    sampler.start()
    pub = Publisher(
        own_connection(store),
        [(sampler, True, True)],
        who=RankIdentity(r, r, "host-a", os.getpid()),
        **{"interval": TICK, **kw},
    )
    pub.tick()
    return pub.start()


def sim(workload="training", **kw) -> SimulatedSource:
    return SimulatedSource(workload, autostart=False, loop=False, **kw)


def test_summary_has_the_strip_and_rank_fields_within_4_kib(master):
    src = sim()
    src.step(3000)
    pub = rank(master, 0, src)
    try:
        (summary,) = pub.tick()
        raw = master.get(summary_key(0, 0))
        assert len(summary_key(0, 0)) + len(raw) <= MAX_SUMMARY_BYTES
        for key in ("rank", "local_rank", "host", "pid", "device", "time", "reserved"):
            assert key in summary
        for key in ("allocated", "free", "largest_free", "fragmentation", "alloc_retries"):
            assert key in summary
        assert summary["reserved"] > 0 and len(summary["bins"]) == 64
        assert summary["demo"] is True and "simulated" in summary["source"]
        assert summary["last_oom"] is None
    finally:
        pub.stop()


def test_the_view_lists_ranks_and_a_stopped_rank_turns_stale(master):
    pubs = [rank(master, r, sim()) for r in range(3)]
    view = JobView("127.0.0.1", master.port)
    rows = view.ranks()
    assert [(r["rank"], r["device"], r["stale"]) for r in rows] == [(i, 0, False) for i in range(3)]
    pubs[1].stop()
    time.sleep(4 * TICK + 0.1)
    stale = {r["rank"]: r["stale"] for r in view.ranks()}
    assert stale == {0: False, 1: True, 2: False}
    row = next(r for r in grid_rows(view.ranks()) if r["rank"] == 1)
    assert row["note"].startswith("stale: ")
    for p in pubs:
        p.stop()


def test_request_snapshot_writes_the_ranks_file_with_history(master, tmp_path):
    src = sim()
    src.step(2000)
    a = rank(master, 0, src, snapshot_dir=tmp_path)
    b = rank(master, 1, sim())  # no snapshot_dir
    view = JobView("127.0.0.1", master.port)
    try:
        path = view.request_snapshot(0, timeout=10)
        assert path == tmp_path / "rank0.pickle"
        snap = load_snapshot(path)
        assert snap.n_segments > 0 and len(snap.to_torch()["device_traces"][0]) > 0
        with pytest.raises(JobError, match="without snapshot_dir"):
            view.request_snapshot(1)
        with pytest.raises(JobError, match="has not published"):
            view.request_snapshot(7)
        with pytest.raises(ValueError, match="rank must be"):
            view.request_snapshot(-1)
        b.stop()
        time.sleep(4 * TICK + 0.1)
        with pytest.raises(JobError, match="stale"):
            view.request_snapshot(1)
    finally:
        a.stop()
        b.stop()


def test_a_request_made_as_soon_as_the_rank_is_listed_is_answered(master, tmp_path):
    """A viewer may ask the moment the rank's first summary is in the store, before the rank's
    thread has looked at the request counter: that request is new, not history."""
    sampler = Sampler(sim(), interval=TICK)
    sampler.sample_once(segments=True)
    pub = Publisher(
        own_connection(master),
        [(sampler, True, True)],
        who=RankIdentity(0, 0, "host-a", os.getpid()),
        interval=TICK,
        snapshot_dir=tmp_path,
    )
    pub.tick()  # listed: a viewer sees it from here on
    view = JobView("127.0.0.1", master.port)
    asked: list[object] = []
    viewer = threading.Thread(target=lambda: asked.append(_asked(view)), daemon=True)
    viewer.start()
    wait_until(lambda: master.check([request_key(0)]))
    pub.start()
    try:
        viewer.join(15)
        assert asked == [tmp_path / "rank0.pickle"]
    finally:
        pub.stop()


def _asked(view: JobView) -> object:
    try:
        return view.request_snapshot(0, timeout=10)
    except Exception as exc:
        return exc


def test_a_rank_that_does_not_answer_times_out(master, tmp_path):
    a = rank(master, 0, sim(), snapshot_dir=tmp_path)
    a.stop()  # its last summary is fresh for 3 intervals, but nobody answers any more
    view = JobView("127.0.0.1", master.port)
    with pytest.raises(TimeoutError, match=r"within 0\.1 s"):
        view.request_snapshot(0, timeout=0.1)


def test_an_oom_writes_every_ranks_file_before_the_error_goes_on(master, tmp_path):
    failing = sim("training")
    others = [sim("inference_paged") for _ in range(2)]
    pubs = [rank(master, 0, failing, oom_dir=tmp_path)]
    pubs += [rank(master, r, src, oom_dir=tmp_path) for r, src in enumerate(others, 1)]
    try:
        with pytest.raises(OutOfMemory) as caught:
            while failing.step(500, raise_oom=True):
                for src in others:
                    src.step(50)
        # the files were written before the error left step(), in this thread
        names = sorted(p.name for p in tmp_path.iterdir())
        peers = ["rank1_at_rank0_oom.pickle", "rank2_at_rank0_oom.pickle"]
        assert names == ["rank0_oom.pickle", *peers]
        assert pubs[0].oom is not None and pubs[0].oom.answered == (2, 2)
        own = load_snapshot(tmp_path / "rank0_oom.pickle").to_torch()
        assert any(e["action"] == "oom" for e in own["device_traces"][0])
        assert caught.value.alloc_size > 0
        summary = pubs[0].tick()[0]
        assert summary["last_oom"]["cause"] in {"capacity", "fragmentation"}
        assert summary["ooms"] == 1
    finally:
        for p in pubs:
            p.stop()


def test_an_oom_waits_at_most_oom_wait_for_silent_ranks(master, tmp_path):
    failing = sim("training")
    # a long interval keeps it fresh however slowly the failing rank reaches its OOM
    quiet = rank(master, 1, sim(), oom_dir=tmp_path, interval=60.0)
    quiet.stop()  # looks fresh, never answers
    pub = rank(master, 0, failing, oom_dir=tmp_path, oom_wait=0.3)
    t0 = time.monotonic()
    with pytest.raises(OutOfMemory):
        while failing.step(2000, raise_oom=True):
            pass
    assert time.monotonic() - t0 < 2.0
    assert pub.oom is not None and pub.oom.answered == (0, 1)
    assert (tmp_path / "rank0_oom.pickle").exists()
    pub.stop()


def test_history_off_is_said_once_and_record_history_turns_it_on(master, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="gpumemviz.distributed")
    src = sim(record_history=False)
    pub = rank(master, 0, src, snapshot_dir=tmp_path)
    pub.tick()
    pub.stop()
    said = [r for r in caplog.records if "history is not recorded" in r.getMessage()]
    assert len(said) == 1
    src2 = sim(record_history=False)
    pub2 = rank(master, 1, src2, snapshot_dir=tmp_path, record_history=True)
    pub2.stop()
    assert src2.history_enabled() is True
    src2.step(100)
    assert len(src2.export()["device_traces"][0]) > 0


@contextlib.contextmanager
def store_that_goes_away() -> Iterator[int]:
    """The port of a TCPStore served by a child process, which is killed as the block ends."""
    code = (
        "import sys, torch.distributed as d\n"
        "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
        "print(s.port, flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        yield int(child.stdout.readline())
    finally:
        child.kill()
        child.communicate()


def test_a_store_that_goes_away_stops_the_publisher_with_one_line(caplog):
    caplog.set_level(logging.WARNING, logger="gpumemviz.distributed")
    with store_that_goes_away() as port:
        client = torch_dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
        pub = publish(TICK, store=client, source=sim())
        time.sleep(2 * TICK)
        assert pub.running
    deadline = time.monotonic() + 10
    while pub.running and time.monotonic() < deadline:
        time.sleep(TICK)
    assert not pub.running and "went away" in (pub.stopped or "")
    assert len([r for r in caplog.records if "went away" in r.getMessage()]) == 1
    pub.stop()


def test_bad_arguments_are_one_line_errors(master):
    with pytest.raises(ValueError, match="interval"):
        publish(0, store=master, source=sim())
    with pytest.raises(ValueError, match="no default process group"):
        publish(1.0, source=sim())
    with pytest.raises(ValueError, match="oom_wait"):
        publish(1.0, store=master, source=sim(), oom_wait=-1)
    with pytest.raises(ValueError, match="port"):
        JobView("127.0.0.1", 0)
    with pytest.raises(StoreGone, match=r"no job store answers at 127\.0\.0\.1:1 "):
        JobView("127.0.0.1", 1, timeout=0.5)


def test_grid_puts_the_rank_closest_to_oom_first(master):
    roomy, tight = sim("inference_paged"), sim("training")
    tight.step(9000)
    roomy.step(100)
    pubs = [rank(master, 0, roomy), rank(master, 1, tight)]
    rows = JobView("127.0.0.1", master.port).ranks()
    order = [r["rank"] for r in grid_rows(rows)]
    assert order == [1, 0], [(r["rank"], r["headroom"], r["total"]) for r in rows]
    text = grid_text(rows)
    assert text.splitlines()[1].split()[0] == "1" and "host-a" in text
    for p in pubs:
        p.stop()


def test_gpumemviz_job_prints_the_grid_once_and_asks_for_a_snapshot(master, tmp_path, capsys):
    from gpumemviz.cli import main

    src = sim()
    src.step(2000)
    pubs = [rank(master, 0, src, snapshot_dir=tmp_path), rank(master, 1, sim())]
    try:
        assert main(["job", f"127.0.0.1:{master.port}", "--once"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(f"gpumemviz job 127.0.0.1:{master.port}")
        assert [line.split()[0] for line in out[2:]] == ["0", "1"]  # the fuller one first
        assert main(["job", f"127.0.0.1:{master.port}", "--snapshot", "0"]) == 0
        written = capsys.readouterr().out.strip()
        assert written == str(tmp_path / "rank0.pickle")
        assert main(["inspect", written]) == 0
        assert main(["job", f"127.0.0.1:{master.port}", "--snapshot", "1"]) == 2
        assert "without snapshot_dir" in capsys.readouterr().err
    finally:
        for p in pubs:
            p.stop()
    assert main(["job", "nohost"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
    assert main(["job", "127.0.0.1:1", "--once", "--timeout", "0.5"]) == 2
    assert "no job store answers" in capsys.readouterr().err


def test_an_oom_no_observer_saw_still_gets_its_file_as_it_leaves_the_block(master, tmp_path):
    from gpumemviz.allocator.model import CachingAllocator

    model = CachingAllocator(64 << 20)  # not behind any source: no observer runs
    with (
        pytest.raises(OutOfMemory) as caught,
        rank(master, 0, sim(), oom_dir=tmp_path, oom_wait=0.1),
    ):
        try:
            model.malloc(1 << 30)
        except OutOfMemory as err:
            original = err
            raise
    assert caught.value is original  # the same error object goes on
    assert (tmp_path / "rank0_oom.pickle").exists()


def test_the_job_feed_hands_listeners_the_ordered_grid(master):
    from gpumemviz.distributed import JobFeed

    pubs = [rank(master, r, sim()) for r in range(2)]
    feed = JobFeed(JobView("127.0.0.1", master.port), interval=TICK)
    got: list[tuple[list, str | None]] = []
    feed.add_listener(lambda strips, why: got.append((strips, why)))
    feed.add_listener(lambda strips, why: 1 / 0)  # a broken listener is counted, not raised
    feed.start()
    try:
        strips, why = wait_until(lambda: got and got[-1])
        assert why is None and sorted(s["rank"] for s in strips) == [0, 1]
        assert all("title" in s and "note" in s and "bins" in s for s in strips)
        assert feed.listener_errors > 0
    finally:
        feed.stop()
        for p in pubs:
            p.stop()


def wait_until(what, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(TICK)
    raise AssertionError("timed out")


def test_prometheus_port_serves_the_ranks_own_samplers(master, monkeypatch):
    """publish(prometheus_port=P) serves the rank's devices from the publisher's samplers."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    monkeypatch.setenv("LOCAL_RANK", "0")
    src = sim()
    src.step(300)
    handle = publish(0.1, store=master, source=src, prometheus_port=0)
    try:
        assert handle.exporter is not None
        handle.feeds[0].sampler.sample_once()
        text = urllib.request.urlopen(handle.exporter.url, timeout=10).read().decode()
        families = {f.name: f.samples for f in text_string_to_metric_families(text)}
        (reserved,) = families["gpumemviz_reserved_bytes"]
        assert reserved.labels["pid"] == str(os.getpid())
        assert reserved.value == handle.feeds[0].sampler.history.latest_stats().stats.reserved > 0
    finally:
        handle.stop()
    assert handle.exporter._stopped
