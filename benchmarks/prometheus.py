"""What a Prometheus scrape of gpumemviz costs: a full HTTP GET of /metrics on 127.0.0.1.

`gpumemviz.prometheus.serve` on the shared samplers of 1 and 8 devices (without CUDA: the
simulated allocator's training run on each, driven 6,000 steps and held still: ~150 segments
and ~850 blocks a device). Two cases:

- "same state": no device read a new segment state since the last scrape;
- "new state": every device read a new segment state before the scrape (untimed), as with
  Prometheus' 15 s scrape interval and the sampler's 2 s segment reads. The endpoint computes
  each state's fragmentation figures on the sampler's thread as the state arrives, so the
  scrape only formats; that work is the last row (one `gpumemviz.fragmentation` per device and
  new state, on the sampler thread: not in any scrape).

Baseline, measured in the same run: the same GET of an empty registry served by
prometheus_client's own ``start_http_server`` (the HTTP floor). Medians of wall time per scrape
(client and server in this process) and of the process's CPU time per scrape.

Target (issue 18): under 5 ms per scrape at 8 devices.

Run: .venv/bin/python benchmarks/prometheus.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request
from collections.abc import Callable

from prometheus_client import CollectorRegistry, start_http_server

from _common import best, run_main
from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.live.shared import shared
from gpumemviz.prometheus import serve

TARGET_MS = 5.0


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return len(resp.read())


def timed(url: str, n: int, before: Callable[[], object] | None = None) -> tuple[float, float]:
    """Median wall and CPU milliseconds of `n` GETs (`before` runs untimed ahead of each)."""
    wall, cpu = [], []
    for _ in range(n):
        if before is not None:
            before()
        t0, c0 = time.perf_counter(), time.process_time()
        get(url)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


_DRIVEN: set[int] = set()


def held_still(devices: list[int]) -> None:
    """Stop each shared sampler's simulated workload at once, drive it by hand to ~6,000 steps
    (once per device), and read its segment state."""
    for d in devices:
        sampler = shared(d)
        sampler.pause()
        sampler.source.close()  # the simulated workload thread stops; samples still read
        if d not in _DRIVEN:
            sampler.source.step(6000)
            _DRIVEN.add(d)
        sampler.sample_once(segments=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer scrapes")
    n = 60 if parser.parse_args().quick else 400

    empty, thread = start_http_server(0, "127.0.0.1", CollectorRegistry())
    floor_url = f"http://127.0.0.1:{empty.server_address[1]}/metrics"
    get(floor_url)
    floor, floor_cpu = timed(floor_url, n)
    empty.shutdown()
    empty.server_close()
    thread.join()

    rows = [("empty registry (baseline)", floor, floor_cpu, 0)]
    for count in (1, 8):
        devices = list(range(count))
        exporter = serve(0, devices=devices, demo=True)  # no GPU here: the simulated devices
        held_still(devices)
        size = get(exporter.url)
        wall, cpu = timed(exporter.url, n)
        rows.append((f"{count} device{'s' * (count > 1)}, same state", wall, cpu, size))

        def new_states(devices: list[int] = devices) -> None:
            for d in devices:
                shared(d).sample_once(segments=True)

        wall, cpu = timed(exporter.url, max(20, n // 4), new_states)
        rows.append((f"{count} device{'s' * (count > 1)}, new state", wall, cpu, size))
        exporter.stop()
        for d in devices:
            shared(d).stop()

    states = [shared(d).history.latest_segments() for d in range(8)]
    snaps = [s.segments for s in states if s is not None and s.segments is not None]
    per_state = statistics.median(best(lambda s=s: fragmentation(s), 5) for s in snaps) * 1e3
    rows.append(("figures per new state (sampler)", per_state, per_state, 0))
    n_blocks = statistics.median(s.n_blocks for s in snaps)
    print(f"GET /metrics on 127.0.0.1, median of {n} scrapes; {n_blocks:.0f} blocks a device")
    print(f"{'case':32} {'wall ms':>8} {'CPU ms':>7} {'bytes':>7} {'x floor':>8} {'x target':>9}")
    for name, wall, cpu, size in rows:
        print(
            f"{name:32} {wall:8.2f} {cpu:7.2f} {size:7d} {wall / floor:8.1f} "
            f"{wall / TARGET_MS:9.2f}"
        )
    print(f"target: under {TARGET_MS:g} ms per scrape at 8 devices (x target < 1)")


if __name__ == "__main__":
    run_main(main, __doc__)
