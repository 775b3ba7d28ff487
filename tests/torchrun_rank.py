"""One rank of the torchrun tests (tests/test_distributed_torchrun.py): gloo, the simulated
device driven in the rank's own thread, `gpumemviz.distributed.publish` on the job's store.

    python -m torch.distributed.run --nproc-per-node 4 tests/torchrun_rank.py grid OUT [PROM]
    python -m torch.distributed.run --nproc-per-node 4 tests/torchrun_rank.py oom OUT

grid: every rank publishes (snapshot_dir=OUT, and prometheus_port=PROM when given: each rank
serves on PROM + its local rank); rank 3 exits after 1 s; the others run until the test sets the
key "test/done" (or 60 s). oom: every rank publishes (oom_dir=OUT); once all four
are listed, rank 1 runs the training workload until the model raises OutOfMemory.
"""

from __future__ import annotations

import sys
import time


def main(scenario: str, out: str, prometheus_port: int | None = None) -> None:
    import torch.distributed as dist

    from gpumemviz.distributed import publish
    from gpumemviz.distributed.jobview import read_ranks
    from gpumemviz.distributed.store import default_store
    from gpumemviz.live.sources.simulated import SimulatedSource

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = default_store()
    fails = scenario == "oom" and rank == 1
    src = SimulatedSource("training" if fails else "inference_paged", autostart=False, loop=False)
    dirs = {"snapshot_dir": out} if scenario == "grid" else {"oom_dir": out, "oom_wait": 20.0}
    handle = publish(0.1, source=src, prometheus_port=prometheus_port, **dirs)  # type: ignore[arg-type]
    if fails:
        while len(read_ranks(store)) < 4:
            time.sleep(0.05)
        while src.step(200, raise_oom=True):  # raises the model's OutOfMemory
            time.sleep(0.001)
        raise SystemExit("the training workload ended without running out of memory")
    deadline = time.monotonic() + (1.0 if scenario == "grid" and rank == 3 else 60.0)
    while time.monotonic() < deadline and not store.check(["test/done"]):
        src.step(5)
        time.sleep(0.02)
    handle.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
