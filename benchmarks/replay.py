"""How fast is replay, and how fast can the panel scrub through a recorded trace?

For every real trace (the ones shipped in tests/data/real/, plus ../shared/real-snapshots/'s
where it is checked out) and every model-made stand-in (tests/data/standin/, whose 10,000-entry
training ring is the largest trace a clone has): the time to build the recorded timeline
(reconstruct the start, replay forwards, checkpoints), the time of the full replay through the
model (with its scores), trace events per second, and `snapshot_at` over random jumps (target:
under 50 ms per jump on the largest trace). A file replay refuses (private pools) is listed as
such. Then the workload programs: time per run.

Run: .venv/bin/python benchmarks/replay.py [--jumps N] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from _common import REPO, best, real_files, run_main
from gpumemviz.allocator.replay import ReplayError, replay
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.allocator.workloads import WORKLOADS, run
from gpumemviz.io import loads_restricted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jumps", type=int, default=200, help="random snapshot_at jumps per trace")
    ap.add_argument("--quick", action="store_true", help="20 jumps per trace")
    args = ap.parse_args()
    if args.quick:
        args.jumps = 20
    standins = sorted((REPO / "tests" / "data" / "standin").glob("*.pickle"))
    files = real_files() + standins
    if not files:
        print("no recorded snapshots: neither tests/data/real/ nor tests/data/standin/ has one")
        return 1
    rng = random.Random(0)
    head = (
        f"{'trace':<44} {'dev':>3} {'events':>7} {'timeline ms':>11} {'replay ms':>10} "
        f"{'events/s':>9} {'match':>11} {'jump mean':>9} {'p99':>6} {'max ms':>6}"
    )
    print(head)
    print("-" * len(head))
    worst = 0.0
    for path in files:
        d = loads_restricted(path.read_bytes())
        if not isinstance(d, dict):
            continue
        traced = [i for i, t in enumerate(d.get("device_traces") or []) if len(t) > 1]
        if not traced:
            continue
        try:
            result = replay(d)
        except ReplayError as e:  # private pools (MemPool, CUDA graphs) are not modelled
            print(f"{path.stem[:44]:<44} refused: {str(e)[:70]}")
            continue
        t_replay = best(lambda d=d: replay(d), 3, time.perf_counter)
        for dev in traced:
            tl_time = best(
                lambda d=d, dev=dev: Recording.from_snapshot(d, dev), 3, time.perf_counter
            )
            tl = result.timelines[dev]
            jumps = []
            for _ in range(args.jumps):
                i = rng.randrange(-1, len(tl))
                t = time.perf_counter()
                tl.snapshot_at(i)
                jumps.append((time.perf_counter() - t) * 1e3)
            jumps.sort()
            worst = max(worst, jumps[-1])
            r = result.devices[dev]
            n = len(tl)
            share = t_replay * n / sum(len(d["device_traces"][k]) for k in traced)
            print(
                f"{path.stem[:44]:<44} {dev:>3} {n:>7} {tl_time * 1e3:>11.1f} "
                f"{share * 1e3:>10.1f} {n / share:>9.0f} "
                f"{f'{r.allocs_matched}/{r.allocs}':>11} {statistics.mean(jumps):>9.2f} "
                f"{jumps[int(0.99 * (len(jumps) - 1))]:>6.1f} {jumps[-1]:>6.1f}"
            )
    print(f"\nworst snapshot_at jump: {worst:.1f} ms (target < 50 ms)")
    print(f"\n{'workload':<24} {'operations':>10} {'ms':>7} {'outcome'}")
    for name, w in WORKLOADS.items():
        secs = best(lambda w=w: run(w), 3, time.perf_counter)
        o = run(w)
        outcome = "completed" if o.completed else f"OOM at operation {o.oom_step}"
        if o.iterations is not None:
            outcome += f" ({o.iterations_completed}/{o.iterations} training iterations done)"
        print(f"{name:<24} {o.operations:>10} {secs * 1e3:>7.1f} {outcome}")
    return 0


if __name__ == "__main__":
    run_main(main, __doc__)
