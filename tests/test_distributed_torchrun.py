"""gpumemviz.distributed under torchrun: 4 gloo ranks on 127.0.0.1 publish through the job's own
store; this test reads it from outside, as `gpumemviz job` does. One launch per scenario."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch_dist = pytest.importorskip("torch.distributed")

from gpumemviz.cli import main  # noqa: E402
from gpumemviz.distributed import JobView, grid_rows  # noqa: E402
from gpumemviz.io import load_snapshot  # noqa: E402

RANK_PROGRAM = Path(__file__).with_name("torchrun_rank.py")
SRC = Path(__file__).resolve().parents[1] / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(scenario: str, out: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--monitor-interval", "0.1"]
    cmd += [str(RANK_PROGRAM), scenario, str(out)]
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


@pytest.mark.slow
def test_grid_stale_rank_and_snapshot_request(tmp_path, capsys):
    port = free_port()
    job = torchrun("grid", tmp_path, port)
    try:
        view = view_of(port, job)
        rows = wait_for(lambda: len(view.ranks()) == 4 and view.ranks())
        assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
        assert {r["local_rank"] for r in rows} == {0, 1, 2, 3}
        assert len({r["pid"] for r in rows}) == 4
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
        view.store.set("test/done", b"1")
        assert job.wait(60) == 0
    finally:
        if job.poll() is None:
            job.kill()
        job.communicate()


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
