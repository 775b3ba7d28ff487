"""gpumemviz.distributed under torchrun: 4 gloo ranks on 127.0.0.1 publish through the job's own
store; this test reads it from outside, as `gpumemviz job` does. One launch per scenario."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

torch_dist = pytest.importorskip("torch.distributed")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpumemviz.cli import main  # noqa: E402
from gpumemviz.distributed import JobView, grid_rows  # noqa: E402
from gpumemviz.io import load_snapshot  # noqa: E402

RANK_PROGRAM = Path(__file__).parents[1] / "torchrun_rank.py"
SRC = Path(__file__).resolve().parents[2] / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(scenario: str, out: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--monitor-interval", "0.1"]
    cmd += [str(RANK_PROGRAM), scenario, str(out), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_for(what, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def view_of(port: int, job: subprocess.Popen[bytes]) -> JobView:
    def connect() -> JobView | None:
        assert job.poll() is None, job.stderr.read().decode() if job.stderr else ""
        try:
            return JobView("127.0.0.1", port, timeout=1.0)
        except ConnectionError:
            return None

    return wait_for(connect)


def free_ports(n: int) -> int:
    """The first of `n` consecutive ports free on 127.0.0.1 now."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise AssertionError(f"no {n} consecutive free ports")


def scrape(port: int) -> dict[str, list]:
    """The exporter's families on 127.0.0.1:port, parsed by prometheus_client's own parser."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def reserved_series(port: int) -> list | None:
    """The reserved-bytes series once it shows memory reserved (None before)."""
    series = scrape(port)["gpumemviz_reserved_bytes"]
    return series if series and all(s.value > 0 for s in series) else None


@pytest.mark.slow
def test_grid_stale_rank_and_snapshot_request(tmp_path, capsys):
    port = free_port()
    prom = free_ports(4)
    # rank 2 (local rank 2) finds its port taken: one logged line, and it publishes on
    taken = socket.socket()
    taken.bind(("127.0.0.1", prom + 2))
    taken.listen()
    job = torchrun("grid", tmp_path, port, str(prom))
    try:
        view = view_of(port, job)
        rows = wait_for(lambda: len(view.ranks()) == 4 and view.ranks())
        assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
        assert {r["local_rank"] for r in rows} == {0, 1, 2, 3}
        assert len({r["pid"] for r in rows}) == 4
        # two ranks on one host serve on prometheus_port + local_rank, with their own labels
        for r in (r for r in rows if r["local_rank"] in (0, 1)):
            # the rank's simulated device reserves its first segment once it has stepped
            (reserved,) = wait_for(lambda r=r: reserved_series(prom + r["local_rank"]))
            assert reserved.labels["rank"] == str(r["rank"])
            assert reserved.labels["local_rank"] == str(r["local_rank"])
            assert reserved.labels["pid"] == str(r["pid"])
        # rank 3 exits after a second: no update for 3 intervals -> stale, marked in the grid
        stale = wait_for(lambda: [r for r in view.ranks() if r["stale"]], timeout=30)
        assert [r["rank"] for r in stale] == [3]
        grid = grid_rows(view.ranks())
        assert next(r for r in grid if r["rank"] == 3)["note"].startswith("stale: ")
        path = view.request_snapshot(0, timeout=30)
        assert path == tmp_path / "rank0.pickle"
        assert load_snapshot(path).n_segments > 0
        assert main(["inspect", str(path)]) == 0
        assert "reserved" in capsys.readouterr().out.lower()
        assert main(["job", f"127.0.0.1:{port}", "--once"]) == 0
        assert "stale" in capsys.readouterr().out
        view.store.call(lambda s: s.set("test/done", b"1"))
        assert job.wait(60) == 0
    finally:
        taken.close()
        if job.poll() is None:
            job.kill()
        _, err = job.communicate()
    said = [line for line in err.decode().splitlines() if "Prometheus metrics not served" in line]
    assert len(said) == 1 and "in use" in said[0], err.decode()[-2000:]


@pytest.mark.slow
def test_a_rank_out_of_memory_writes_every_ranks_file_and_the_job_fails(tmp_path):
    port = free_port()
    job = torchrun("oom", tmp_path, port)
    try:
        code = job.wait(120)
    finally:
        if job.poll() is None:
            job.kill()
        _, err = job.communicate()
    assert code != 0
    names = sorted(p.name for p in tmp_path.iterdir())
    peers = [f"rank{r}_at_rank1_oom.pickle" for r in (0, 2, 3)]
    assert names == sorted(["rank1_oom.pickle", *peers]), err.decode()[-2000:]
    own = load_snapshot(tmp_path / "rank1_oom.pickle").to_torch()
    assert any(e["action"] == "oom" for e in own["device_traces"][0])
    assert b"OutOfMemory" in err
    for name in peers:
        assert load_snapshot(tmp_path / name).n_segments > 0
