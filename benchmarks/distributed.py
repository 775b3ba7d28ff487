"""What publishing to the job's store costs a rank, and how fast the rank grid refreshes.

64 simulated ranks (the allocator model's training workload, each stopped at a different step)
publish to one real TCPStore on 127.0.0.1, served from this process, each rank over its own
connection, as under torchrun. Figures (wall clock, best of several rounds):

- publish cost per tick per rank: `Publisher.tick()` when the segment map is new (a new segment
  read: rows, bins, JSON) and when it is not (the cached map: only the rank fields and the set),
  against the named baseline, one store round trip (``add(key, 0)``; a TCPStore ``set`` does
  not wait for the server, so it is timed too, for scale). Every store call of a rank goes
  through its `Connection` (issue 34: a hung store cannot block the rank): the publisher's
  thread calls inline, watched by the connection's worker; the training thread's calls (an
  OOM) are handed to the worker. The same round trip both ways is timed, so the cost of each is
  in the table;
- store bytes per rank per second at the default interval (1 s): the summary set (key + value)
  plus the two counters polled every 0.25 s (key + 8 bytes each; framing not counted);
- the grid's refresh at 64 ranks: `JobView.ranks()` + `grid_rows` + `grid_text`, against the
  named baseline, the store's own ``multi_get`` of the 64 summaries. Target: under 100 ms.

Run: .venv/bin/python benchmarks/distributed.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch.distributed as dist

from _common import run_main
from gpumemviz.distributed import JobView, Publisher, grid_rows
from gpumemviz.distributed.keys import OOM_COUNT, request_key, summary_key
from gpumemviz.distributed.store import own_connection
from gpumemviz.distributed.summary import RankIdentity
from gpumemviz.distributed.terminal import grid_text
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources.simulated import SimulatedSource

RANKS = 64
POLL_S = 0.25  # gpumemviz.distributed.publisher._POLL_S
TARGET_MS = 100.0


def best(fn, reps: int) -> float:
    """Best wall time of `reps` calls, in seconds."""
    out = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def make_ranks(master: dist.TCPStore, n: int) -> list[Publisher]:
    pubs = []
    for r in range(n):
        src = SimulatedSource("training", autostart=False, loop=False)
        src.step(100 + 150 * r)
        sampler = Sampler(src, interval=1.0)
        sampler.sample_once(segments=True)
        pub = Publisher(
            own_connection(master),
            [(sampler, True, False)],
            who=RankIdentity(r, r % 8, f"node{r // 8}", os.getpid()),
            interval=1.0,
        )
        pub.tick()
        pubs.append(pub)
    return pubs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    reps = 20 if parser.parse_args().quick else 100
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pubs = make_ranks(master, RANKS)
    one = pubs[RANKS // 2]
    sampler = one.feeds[0].sampler
    key = summary_key(one.who.rank, 0)
    raw = master.get(key)

    def new_map() -> None:
        sampler.sample_once(segments=True)  # outside the timing below: the sampler's own read
        one.feeds[0].map_seq = -2

    t_new = float("inf")
    for _ in range(reps):
        new_map()
        t0 = time.perf_counter()
        one.tick()
        t_new = min(t_new, time.perf_counter() - t0)
    t_cached = best(one.tick, reps)
    conn = own_connection(master)  # a bare client, as a rank's own connection is under it
    t_set = best(lambda: conn.set(key, raw), reps)
    t_trip = best(lambda: conn.add(OOM_COUNT, 0), reps)
    t_guarded = best(lambda: one.store.call(lambda s: s.add(OOM_COUNT, 0)), reps)
    t_inline = best(lambda: one.store.call_inline(lambda s: s.add(OOM_COUNT, 0)), reps)
    t_poll = best(one.answers.poll, reps)

    polled = 2 * (len(request_key(RANKS - 1)) + 8) / POLL_S
    per_second = len(key) + len(raw) + polled

    view = JobView("127.0.0.1", master.port)
    keys = [summary_key(r, 0) for r in range(RANKS)]
    t_multi = best(lambda: conn.multi_get(keys), reps)

    def refresh() -> str:
        return grid_text(view.ranks())

    t_grid = best(refresh, reps)
    assert len(grid_rows(view.ranks())) == RANKS

    print(f"gpumemviz.distributed: {RANKS} simulated ranks on one TCPStore (127.0.0.1)")
    print(f"{'figure':<44} {'value':>12} {'baseline':>12} {'ratio':>7}")
    rows = [
        ("publish tick, new segment map (ms)", t_new * 1e3, t_trip * 1e3),
        ("publish tick, cached map (ms)", t_cached * 1e3, t_trip * 1e3),
        ("bare store.set of the summary (ms)", t_set * 1e3, t_trip * 1e3),
        ("store round trip, inline (ms)", t_inline * 1e3, t_trip * 1e3),
        ("store round trip, via the worker (ms)", t_guarded * 1e3, t_trip * 1e3),
        ("request + OOM poll (ms, every 0.25 s)", t_poll * 1e3, t_trip * 1e3),
        ("grid refresh at 64 ranks (ms)", t_grid * 1e3, t_multi * 1e3),
    ]
    for name, value, base in rows:
        print(f"{name:<44} {value:>12.3f} {base:>12.3f} {value / base:>6.1f}x")
    print(f"{'summary bytes (key + value)':<44} {len(key) + len(raw):>12d}")
    print(f"{'store bytes per rank per second (1 s)':<44} {per_second:>12.0f}")
    print("baselines: one store round trip (add(key, 0)); the store's multi_get of 64 keys")
    verdict = "met" if t_grid * 1e3 < TARGET_MS else "NOT met"
    print(f"target: grid refresh under {TARGET_MS:.0f} ms at 64 ranks: {verdict}")
    for pub in pubs:
        pub.stop()


if __name__ == "__main__":
    run_main(main, __doc__)
