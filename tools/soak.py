"""Soak the live path for minutes (`make soak`): samplers, sources and the panel's per-frame work.

A notebook panel runs for hours beside training. This runs a `Sampler` on the `SimulatedSource`
(training workload, looping through its OOMs) and one on a `PlaybackSource` looping the longest
recorded trace found (tests/data/real, the stand-ins in tests/data/standin, and
../shared/real-snapshots where present), both at once, with a listener per sampler that does
what the panel does for every sample (on a writer thread, latest sample wins): `build_rows`,
`Wire.set_rows`, `header_numbers`, `Wire.update` and now and then a scroll (`set_view`), without a
browser. Every few seconds it checks:

- RSS growth after warm-up stays within 64 MiB of what the histories grew (they fill up to
  their byte bounds; anything else growing is a leak);
- each history stays within its byte bound;
- no thread leaks (the count stays flat; after stop every thread we started is gone);
- tick drift stays small: ticks done vs. elapsed / interval (the schedule is a fixed grid, so
  time behind it is ticks skipped under load; at most 2 s + 10 % of elapsed);
- sampler errors, listener errors, hung reads, failed samples and writer errors stay zero.

It prints a table of the checks and exits 1 on any violation.

Run: ``python tools/soak.py [--seconds 600] [--interval 0.1]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Where recorded traces are looked for: the real ones that ship, the model-made stand-ins, and
#: the CI-only real ones where ../shared/real-snapshots exists.
REAL_DIRS = (
    REPO / "tests" / "data" / "real",
    REPO / "tests" / "data" / "standin",
    REPO.parent / "shared" / "real-snapshots",
)
MiB = 1 << 20


def rss_bytes() -> int:
    with Path("/proc/self/status").open() as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def os_threads() -> int:
    return sum(1 for _ in Path("/proc/self/task").iterdir())


class PanelWork:
    """What a panel does per sample, on its own writer thread (the newest sample wins)."""

    def __init__(self, name: str) -> None:
        from gpumemviz.render.wire import Wire

        self.name = name
        self.wire = Wire()
        self.wire.set_view("v1", 0, 40, 512)
        self.inbox: queue.Queue = queue.Queue(maxsize=1)
        self.frames = 0
        self.frame_bytes = 0
        self.renders = 0
        self.errors: list[str] = []
        self.render_s = 0.0
        self.max_render_s = 0.0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"soak-writer-{name}", daemon=True)
        self.thread.start()

    def listener(self, sample: Any) -> None:
        """The sampler's listener: hand over, never block the sampler thread."""
        if sample.segments is None:
            return
        with contextlib.suppress(queue.Empty):
            self.inbox.get_nowait()  # drop the older one: the panel shows the newest
        with contextlib.suppress(queue.Full):
            self.inbox.put_nowait(sample)

    def _run(self) -> None:
        from gpumemviz.render.rows import build_rows
        from gpumemviz.render.wire import header_numbers

        while not self._stop.is_set():
            try:
                sample = self.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            t0 = time.perf_counter()
            try:
                rows = build_rows(sample.segments, device=sample.device)
                self.wire.set_rows(rows)
                head = header_numbers(rows)
                assert isinstance(head, dict)
                frames = self.wire.update()
                if self.renders % 20 == 19 and rows.n_rows:  # a scroll now and then
                    first = (self.renders // 20) % max(1, rows.n_rows)
                    frames += self.wire.set_view("v1", first, 40, 512)
                for fr in frames:
                    self.frames += 1
                    self.frame_bytes += fr.nbytes
            except Exception as exc:  # every failure is a finding
                self.errors.append(f"{type(exc).__name__}: {exc}")
            dt = time.perf_counter() - t0
            self.renders += 1
            self.render_s += dt
            self.max_render_s = max(self.max_render_s, dt)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


@dataclass
class Run:
    name: str
    sampler: Any
    panel: PanelWork
    t0: float = 0.0
    ticks0: int = 0
    failed: int = 0
    ooms: int = 0
    gaps: list[float] = field(default_factory=list)
    _last: float = 0.0

    def on_sample(self, sample: Any) -> None:
        if sample.state == "error":
            self.failed += 1
        if sample.oom is not None:
            self.ooms += 1
        if self._last:
            self.gaps.append(sample.monotonic - self._last)
            if len(self.gaps) > 20000:
                del self.gaps[:10000]
        self._last = sample.monotonic


def replay_input() -> Any:
    """The recorded file with the longest trace, of 20,000 entries at most (loaded and checked
    by gpumemviz.io); one file name is read once (a shipped copy wins)."""
    from gpumemviz.io import load_snapshot

    best, best_n = None, 0
    seen: set[str] = set()
    for p in (p for d in REAL_DIRS if d.is_dir() for p in sorted(d.glob("*.pickle"))):
        if p.name in seen:
            continue
        seen.add(p.name)
        snap = load_snapshot(p)
        raw = snap.to_torch()
        n = max((len(t) for t in raw.get("device_traces") or []), default=0)
        if 0 < n <= 20000 and n > best_n:
            best, best_n = (p, raw), n
    return best


def build_runs(ns: argparse.Namespace) -> list[Run]:
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.live.sources.playback import PlaybackSource
    from gpumemviz.live.sources.simulated import SimulatedSource

    sources: list[tuple[str, Any]] = []
    if "simulated" in ns.sources:
        sources.append(("simulated", SimulatedSource("training", pause_after_oom=1.0)))
    if "replay" in ns.sources:
        found = replay_input()
        if found is None:
            where = ", ".join(str(d) for d in REAL_DIRS)
            print(f"no recorded trace in {where}: replay left out", file=sys.stderr)
        else:
            path, raw = found
            src = PlaybackSource(raw, duration=ns.replay_duration, loop=True)
            print(f"replay: {path.name}, {src.n} entries, a pass every {ns.replay_duration:.0f} s")
            sources.append(("replay", src))
    runs = []
    for name, src in sources:
        s = Sampler(
            src,
            interval=ns.interval,
            segment_interval=ns.segment_interval,
            history_bytes=ns.history_mib * MiB,
            keyframe_interval=10.0,
        )
        panel = PanelWork(name)
        run = Run(name, s, panel)
        s.add_listener(run.on_sample)
        s.add_listener(panel.listener)
        runs.append(run)
    return runs


def soak(ns: argparse.Namespace) -> int:
    # imported before the thread baseline is taken
    import gpumemviz.render.rows
    import gpumemviz.render.wire  # noqa: F401

    threads_before = set(threading.enumerate())
    os_before = os_threads()
    runs = build_runs(ns)
    if not runs:
        print("nothing to soak", file=sys.stderr)
        return 1
    t_start = time.monotonic()
    for r in runs:
        r.sampler.start()
        r.t0 = time.monotonic()
    warmup = min(ns.warmup, ns.seconds / 4)
    rows: list[tuple] = []
    violations: list[str] = []
    base_rss = base_threads = None
    base_hist = 0
    worst_unexplained = 0.0
    max_drift = {r.name: 0.0 for r in runs}
    next_check = t_start + ns.check_every
    while True:
        now = time.monotonic()
        if now >= t_start + ns.seconds:
            break
        time.sleep(max(0.0, min(next_check, t_start + ns.seconds) - now))
        now = time.monotonic()
        next_check += ns.check_every
        elapsed = now - t_start
        rss, nthreads = rss_bytes(), os_threads()
        hist = sum(r.sampler.history.nbytes for r in runs)
        if base_rss is None and elapsed >= warmup:
            base_rss, base_threads, base_hist = rss, nthreads, hist
        line: list[Any] = [elapsed, rss / MiB, nthreads]
        for r in runs:
            st = r.sampler.status()
            expected = (now - r.t0) / ns.interval
            drift = (expected - st["ticks"]) * ns.interval  # seconds behind the schedule
            max_drift[r.name] = max(max_drift[r.name], abs(drift))
            errs = st["errors"] + st["listener_errors"] + st["hung_reads"] + r.failed
            errs += len(r.panel.errors)
            line += [st["ticks"], st["history_bytes"] / MiB, drift, errs, r.panel.frames]
            if st["history_bytes"] > ns.history_mib * MiB:
                violations.append(
                    f"{elapsed:.0f} s: {r.name} history {st['history_bytes'] / MiB:.1f} MiB "
                    f"over its {ns.history_mib} MiB bound"
                )
            # the grid cannot slide (ticks sit on start + k * interval); under load a late tick
            # skips the slots it missed, so drift shows as time behind: a share of elapsed
            if drift > ns.max_drift + ns.max_skip * (now - r.t0) or drift < -ns.max_drift:
                violations.append(
                    f"{elapsed:.0f} s: {r.name} is {drift:.2f} s behind its schedule "
                    f"({st['ticks']} ticks of {expected:.0f})"
                )
            if errs:
                violations.append(
                    f"{elapsed:.0f} s: {r.name} errors (sampler {st['errors']}, listeners "
                    f"{st['listener_errors']}, hung {st['hung_reads']}, failed samples "
                    f"{r.failed}, panel {len(r.panel.errors)}): {st['last_error']} "
                    f"{r.panel.errors[:1]}"
                )
            if not st["running"]:
                violations.append(f"{elapsed:.0f} s: {r.name} sampler thread is not running")
        if base_rss is not None:
            # the histories may fill up to their bounds; any other growth is a leak
            unexplained = (rss - base_rss - max(0, hist - base_hist)) / MiB
            worst_unexplained = max(worst_unexplained, unexplained)
            if unexplained > ns.rss_slack_mib:
                violations.append(
                    f"{elapsed:.0f} s: RSS {rss / MiB:.0f} MiB grew {unexplained:.0f} MiB beyond "
                    f"the histories' growth since warm-up (limit {ns.rss_slack_mib} MiB)"
                )
        if base_threads is not None and nthreads > base_threads + 2:
            violations.append(f"{elapsed:.0f} s: {nthreads} threads (after warm-up {base_threads})")
        rows.append(tuple(line))
        if ns.verbose:
            print(_fmt(line, runs), flush=True)
        if violations and ns.fail_fast:
            break
    for r in runs:
        if not r.sampler.stop():
            violations.append(f"{r.name}: stop() did not return within its interval")
        r.panel.stop()
        r.sampler.source.close()
    time.sleep(0.5)
    leaked = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    if leaked:
        violations.append(f"threads left after stop: {[t.name for t in leaked]}")
    total = time.monotonic() - t_start

    print(_header(runs))
    step = max(1, len(rows) // ns.table_rows)
    for line in rows[::step] + ([rows[-1]] if rows and (len(rows) - 1) % step else []):
        print(_fmt(list(line), runs))
    print(f"\nsoak: {total:.0f} s, interval {ns.interval} s, checks every {ns.check_every} s")
    if base_rss is not None:
        peak = max(r[1] for r in rows)
        print(
            f"RSS after warm-up {base_rss / MiB:.0f} MiB, peak {peak:.0f} MiB, "
            f"end {rows[-1][1]:.0f} MiB; growth not explained by the histories at most "
            f"{worst_unexplained:.0f} MiB"
        )
    print(f"OS threads: before start {os_before}, after stop {os_threads()}")
    for r in runs:
        st = r.sampler.status()
        gaps = sorted(r.gaps) or [0.0]
        p99 = gaps[int(0.99 * (len(gaps) - 1))]
        p = r.panel
        print(
            f"{r.name} sampler: {st['ticks']} ticks, {st['segment_reads']} segment reads, "
            f"{r.ooms} OOM samples, {1 - st['ticks'] * ns.interval / total:.1%} of slots skipped, "
            f"max drift {max_drift[r.name]:.2f} s, gap p99 {p99:.3f} s "
            f"max {gaps[-1]:.3f} s; panel {p.renders} renders "
            f"(mean {p.render_s / max(1, p.renders) * 1e3:.1f} ms, max {p.max_render_s * 1e3:.0f} "
            f"ms), {p.frames} frames, {p.frame_bytes / MiB:.1f} MiB; sampler CPU "
            f"{st['cpu_share']:.2%} of a core"
        )
    if violations:
        print(f"\n{len(violations)} violation(s):")
        for v in violations[:30]:
            print(f"  - {v}")
        return 1
    print("no violations")
    return 0


def _header(runs: list[Run]) -> str:
    h = f"{'t s':>6} {'RSS MiB':>8} {'thr':>4}"
    for r in runs:
        n = r.name[:4]
        h += f" | {n + ' ticks':>11} {'hist MiB':>8} {'drift s':>7} {'err':>4} {'frames':>7}"
    return h


def _fmt(line: list[Any], runs: list[Run]) -> str:
    s = f"{line[0]:6.0f} {line[1]:8.1f} {line[2]:4d}"
    for i in range(len(runs)):
        ticks, hist, drift, errs, frames = line[3 + 5 * i : 8 + 5 * i]
        s += f" | {ticks:11d} {hist:8.2f} {drift:7.2f} {errs:4d} {frames:7d}"
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)))
    p.add_argument("--interval", type=float, default=0.1, help="sampler tick (s)")
    p.add_argument("--segment-interval", type=float, default=0.5)
    p.add_argument("--history-mib", type=int, default=8, help="each sampler's history bound")
    p.add_argument("--check-every", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the RSS baseline")
    p.add_argument(
        "--rss-slack-mib", type=int, default=64, help="RSS growth beyond the histories' growth"
    )
    p.add_argument("--max-drift", type=float, default=2.0, help="seconds behind, plus --max-skip")
    p.add_argument("--max-skip", type=float, default=0.10, help="share of ticks a loaded box skips")
    p.add_argument("--replay-duration", type=float, default=60.0, help="seconds a pass takes")
    p.add_argument("--sources", default="simulated,replay")
    p.add_argument("--table-rows", type=int, default=20)
    p.add_argument("--fail-fast", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true", help="print every check")
    return soak(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
