"""sampler.py: lifecycle, hung and broken sources, listeners, CPU budget, bounded history.

The sources here are real in-process ones: a real snapshot file's state served as samples, a
source whose read really blocks, one that really raises or returns garbage. Timing assertions
are generous: CI is a loaded 2-core machine.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import REAL_DIR, read_real
from gpumemviz.live.history import History
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.shared import shared
from gpumemviz.live.sources import UnavailableSource
from gpumemviz.snapshot.sample import MemoryStats, OomEvent, Sample

MiB = 1 << 20
# shipped real recordings (tests/data/real): a state with no history, and a 3,840-entry trace
STATE_FILE = REAL_DIR / "ZijianDu__Attention__memory.7e5ba324.pickle"
TRACED = (
    REAL_DIR / "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
)


_BASELINE: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def thread_baseline():
    """Threads alive before the test (other test files may leave their own running)."""
    _BASELINE.clear()
    _BASELINE.update(threading.enumerate())
    yield


def sampler_threads() -> list[threading.Thread]:
    """gpumemviz threads this test started and that are still alive."""
    return [
        t for t in threading.enumerate() if t.name.startswith("gpumemviz-") and t not in _BASELINE
    ]


def wait_for(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


class SnapshotSource:
    """Serves one segment state (a real file's, or a made-up one) as live samples."""

    label = "test-snapshot"
    demo = False
    capabilities = frozenset({"segments"})

    def __init__(self, snapshot, device: int = 0, burn_cpu: float = 0.0) -> None:
        self.snapshot = snapshot
        self.device = device
        self.burn_cpu = burn_cpu  # CPU seconds a segment read costs (spent for real)
        segs = snapshot.segments
        self.stats = MemoryStats.from_torch(
            {
                "reserved_bytes.all.current": int(segs.total_size.sum()),
                "allocated_bytes.all.current": int(segs.allocated_size.sum()),
            }
        )
        self.reads = {"stats": 0, "segments": 0}
        self.oom_handler = None
        self.closed = False

    def sample(self, *, segments: bool = True) -> Sample:
        self.reads["segments" if segments else "stats"] += 1
        if segments and self.burn_cpu:
            t0 = time.thread_time()
            while time.thread_time() - t0 < self.burn_cpu:
                pass
        now = time.time()
        return Sample(
            time=now,
            monotonic=time.monotonic(),
            device=self.device,
            stats=self.stats,
            segments=self.snapshot if segments else None,
            source_label=self.label,
        )

    def set_oom_handler(self, fn) -> None:
        self.oom_handler = fn

    def oom_sample(self, event: OomEvent) -> Sample:
        return Sample(
            time=event.time, device=self.device, stats=None, segments=self.snapshot, oom=event
        )

    def empty_cache(self) -> dict[int, int]:
        return {}

    def export(self) -> dict:
        return self.snapshot.to_torch()

    def close(self) -> None:
        self.closed = True


def synthetic_snapshot(n_blocks: int):
    """A made-up state of n_blocks blocks in 2 MiB segments (for byte-bound tests)."""
    from gpumemviz.snapshot import Snapshot

    per = 4
    segs = []
    for i in range(max(1, n_blocks // per)):
        blocks = [
            {"size": 512 * 1024, "requested_size": 512 * 1024, "state": st, "frames": []}
            for st in ("active_allocated", "inactive", "active_allocated", "inactive")
        ]
        segs.append(
            {
                "device": 0,
                "address": (1 << 40) + i * 2 * MiB,
                "total_size": 2 * MiB,
                "allocated_size": MiB,
                "active_size": MiB,
                "requested_size": MiB,
                "stream": 0,
                "segment_type": "small",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
    return Snapshot.from_torch({"segments": segs, "device_traces": [[]]})


@pytest.fixture
def real_source():
    from gpumemviz.snapshot import Snapshot

    return SnapshotSource(Snapshot.from_torch(read_real(STATE_FILE)))


class HangingSource(SnapshotSource):
    """Its read blocks until released (like a call stuck behind the allocator lock)."""

    def __init__(self) -> None:
        super().__init__(synthetic_snapshot(8))
        self.release = threading.Event()
        self.entered = threading.Event()

    def sample(self, *, segments: bool = True) -> Sample:
        self.entered.set()
        self.release.wait(30)
        return super().sample(segments=segments)


# ------------------------------------------------------------------------------------------------
def test_nothing_starts_by_itself():
    before = sampler_threads()
    s = Sampler(UnavailableSource(0, "no GPU"), interval=0.05)
    assert not s.running
    assert shared(0) is shared(0) and not shared(0).running
    assert sampler_threads() == before


def test_sample_once_stores_and_feeds_listeners_frozen_samples(real_source):
    s = Sampler(real_source, interval=0.5)
    got: list[Sample] = []
    s.add_listener(got.append)
    first = s.sample_once(segments=True)
    second = s.sample_once(segments=False)
    assert [g.seq for g in got] == [0, 1]
    assert got[0] is first and first.segments is real_source.snapshot and first.keyframe
    assert second.segments is None and second.stats.reserved > 0
    assert s.history.samples() == [first, second]
    assert s.history.latest_segments() is first
    times, values = s.history.series("reserved")
    assert values.tolist() == [real_source.stats.reserved] * 2 and times.shape == (2,)


def test_100_start_stop_cycles_leave_no_thread(real_source):
    s = Sampler(real_source, interval=0.02)
    t0 = time.monotonic()
    for _ in range(100):
        assert s.start() is True
        assert s.stop() is True
    assert not s.running
    assert wait_for(lambda: not sampler_threads(), 2.0), sampler_threads()
    assert time.monotonic() - t0 < 20
    # and the sampler still works afterwards
    s.start()
    assert wait_for(lambda: len(s.history) >= 2)
    s.stop()
    assert wait_for(lambda: not sampler_threads(), 2.0)


def test_many_samplers_start_stop_leave_no_thread(real_source):
    for _ in range(100):
        s = Sampler(real_source, interval=0.01)
        s.start()
        s.stop()
    assert wait_for(lambda: not sampler_threads(), 2.0), sampler_threads()


def test_stop_returns_within_one_interval_during_a_hung_read():
    src = HangingSource()
    s = Sampler(src, interval=0.5)
    s.start()
    assert src.entered.wait(5)
    t0 = time.monotonic()
    assert s.stop() is True
    took = time.monotonic() - t0
    assert took <= 0.5 + 0.3, took  # one interval, plus slack for a loaded machine
    assert s.counters["abandoned"] == 1
    assert "abandoned" in s.last_error
    src.release.set()  # the stuck call returns: its daemon thread ends
    assert wait_for(lambda: not sampler_threads(), 5.0), sampler_threads()


def test_a_hung_read_is_abandoned_reported_and_not_piled_up():
    src = HangingSource()
    s = Sampler(src, interval=0.05, read_timeout=0.2)
    got: list[Sample] = []
    s.add_listener(got.append)
    s.start()
    try:
        assert wait_for(lambda: len(got) >= 3, 10)
        assert s.counters["hung_reads"] == 1  # one abandoned read, not one per tick
        assert "did not return within 0.2 s" in got[0].errors[0]
        assert all(g.state == "error" for g in got)
        assert "still hung" in got[-1].errors[0]
        readers = [t for t in sampler_threads() if t.name == "gpumemviz-read"]
        assert len(readers) == 1
        src.release.set()
        # once the call returns, reading resumes
        assert wait_for(lambda: got[-1].state == "ok", 10)
    finally:
        src.release.set()
        s.stop()
    assert wait_for(lambda: not sampler_threads(), 5.0)


class RaisingSource(SnapshotSource):
    def sample(self, *, segments: bool = True) -> Sample:
        raise RuntimeError("driver went away\nsecond line")


class GarbageSource(SnapshotSource):
    def sample(self, *, segments: bool = True):
        return 42


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (RaisingSource, "source raised RuntimeError: driver went away"),
        (GarbageSource, "source returned int, not a Sample"),
    ],
)
def test_broken_sources_become_counted_error_samples(cls, message):
    s = Sampler(cls(synthetic_snapshot(4)), interval=0.02)
    one = s.sample_once()
    assert one.state == "error" and one.errors == (message,)
    s.start()
    assert wait_for(lambda: s.counters["errors"] >= 5)
    assert s.stop()
    assert s.last_error == message
    assert all(x.state == "error" for x in s.history)


def test_a_raising_listener_is_counted_and_reported_not_fatal(real_source):
    s = Sampler(real_source, interval=0.02)
    good: list[Sample] = []

    def bad(sample):
        raise ValueError("listener bug")

    s.add_listener(bad)
    s.add_listener(good.append)
    s.start()
    assert wait_for(lambda: len(good) >= 4)
    s.stop()
    assert s.counters["listener_errors"] >= 4
    assert any("bad raised ValueError: listener bug" in n for g in good for n in g.notes)
    s.remove_listener(bad)
    s.sample_once()
    assert s.counters["listener_errors"] == len(good) - 1
    with pytest.raises(TypeError, match="listener must be callable"):
        s.add_listener(3)  # type: ignore[arg-type]


def test_a_listener_may_read_again_without_deadlock(real_source):
    s = Sampler(real_source, interval=0.5)
    inner: list[Sample] = []
    calls = []

    def again(sample):
        calls.append(sample.seq)
        if len(calls) == 1:  # only the first time: the inner read calls this listener too
            inner.append(s.sample_once(segments=False))

    s.add_listener(again)
    first = s.sample_once()
    assert inner[0].state == "ok" and inner[0].seq == first.seq + 1
    assert calls == [first.seq, first.seq + 1]


def test_stop_from_inside_a_listener_does_not_deadlock(real_source):
    s = Sampler(real_source, interval=0.02)
    s.add_listener(lambda sample: s.stop())
    s.start()
    assert wait_for(lambda: not s.running, 3.0)
    assert wait_for(lambda: not sampler_threads(), 3.0)


def test_schedule_is_drift_free_and_segments_have_their_own_rate(real_source):
    s = Sampler(real_source, interval=0.05, segment_interval=0.25, cpu_budget=1.0)
    s.start()
    time.sleep(1.2)
    s.stop()
    ticks = s.counters["ticks"]
    assert 10 <= ticks <= 26, ticks  # ~24 on an idle machine
    seg = real_source.reads["segments"]
    assert 2 <= seg <= 7, seg  # ~5: segment state every 0.25 s
    assert real_source.reads["stats"] >= ticks - seg
    mono = np.array([x.monotonic for x in s.history])
    # no accumulated drift: the k-th tick sits near start + k * interval
    k = np.round((mono - mono[0]) / 0.05)
    assert np.max(np.abs(mono - mono[0] - k * 0.05)) < 0.05


def test_cpu_budget_stretches_only_the_segment_rate_and_says_so():
    src = SnapshotSource(synthetic_snapshot(16), burn_cpu=0.02)
    s = Sampler(src, interval=0.03, segment_interval=0.03, cpu_budget=0.02)
    s.start()
    time.sleep(1.5)
    s.stop()
    assert s.budget_limited
    assert s.segment_gap >= 0.5  # 20 ms per read at 2 % of a core: about one read a second
    assert src.reads["segments"] <= 4, src.reads
    assert src.reads["stats"] >= 15  # stats kept their rate
    notes = [n for x in s.history for n in x.notes]
    assert any("CPU budget" in n for n in notes)
    assert s.cpu_share < 0.05


def test_pause_and_resume(real_source):
    s = Sampler(real_source, interval=0.02)
    s.start()
    assert wait_for(lambda: len(s.history) >= 2)
    s.pause()
    time.sleep(0.1)
    n = len(s.history)
    time.sleep(0.2)
    assert len(s.history) == n and s.paused
    s.resume()
    assert wait_for(lambda: len(s.history) > n)
    s.stop()


def test_segments_are_not_read_while_no_panel_wants_them(real_source):
    s = Sampler(real_source, interval=0.02, segment_interval=0.02)
    s.segments_wanted = False
    for _ in range(5):
        s.sample_once()
    assert real_source.reads["segments"] == 0


def test_oom_from_the_users_thread_reaches_history_and_listeners(real_source):
    s = Sampler(real_source, interval=5.0)  # a long interval: only the OOM wakes the thread
    got: list[Sample] = []
    s.add_listener(got.append)
    s.start()
    assert real_source.oom_handler is not None
    assert wait_for(lambda: len(got) >= 1)
    event = OomEvent(
        time=time.time(),
        device=0,
        alloc_size=20 * MiB,
        device_limit=80 << 30,
        device_free=0,
        cause="capacity",
        explanation="test",
    )
    t = threading.Thread(target=real_source.oom_handler, args=(event,), name="user-thread")
    t.start()
    t.join()
    assert wait_for(lambda: any(g.oom is event for g in got), 3.0)
    oom = next(g for g in got if g.oom is event)
    assert oom.keyframe and oom.segments is real_source.snapshot
    s.stop()
    assert real_source.oom_handler is None  # the trampoline is a no-op for a stopped panel
    s.close()
    assert real_source.closed


def test_history_stays_within_its_byte_bound():
    snap = synthetic_snapshot(20_000)
    src = SnapshotSource(snap)
    h_bytes = 2 * MiB
    s = Sampler(src, interval=0.5, history_bytes=h_bytes, keyframe_interval=0.0)
    per = s.sample_once(segments=True).nbytes
    assert per > 200_000  # a 20k-block state is several hundred KB of columns
    for i in range(60):
        s.sample_once(segments=(i % 3 == 0))
        assert s.history.nbytes <= h_bytes
    samples = s.history.samples()
    assert all(x.stats is not None for x in samples)  # every sample keeps its stats
    with_blocks = [x for x in samples if x.segments is not None]
    assert 1 <= len(with_blocks) <= h_bytes // per
    assert s.history.latest_segments() is with_blocks[-1]
    assert s.history.dropped + s.history.stripped > 0


def test_history_keeps_only_newest_segments_and_keyframes():
    h = History(max_bytes=64 * MiB, keyframe_interval=10.0)
    snap = synthetic_snapshot(100)
    stats = MemoryStats.from_torch({"reserved_bytes.all.current": 1})
    for i in range(30):
        h.append(Sample(time=i, monotonic=float(i), device=0, stats=stats, segments=snap))
    kept = [x for x in h.samples() if x.segments is not None]
    assert [x.monotonic for x in kept] == [0.0, 10.0, 20.0, 29.0]
    assert all(x.keyframe for x in kept[:-1])
    assert len(h) == 30
    dropped = [x for x in h.samples() if x.segments is None]
    assert all("keyframes" in x.segments_note for x in dropped)


def test_a_state_larger_than_the_bound_is_not_kept():
    h = History(max_bytes=64 * 1024)
    snap = synthetic_snapshot(20_000)
    stats = MemoryStats.from_torch({"reserved_bytes.all.current": 1})
    stored = h.append(Sample(time=0, device=0, stats=stats, segments=snap))
    assert h.nbytes <= h.max_bytes
    assert h.samples()[0].segments is None
    assert "larger than the history bound" in h.samples()[0].segments_note
    assert stored.stats is stats


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"interval": 0},
            r"interval must be a positive number of seconds from 0\.01 to 86400 \(one day\), got 0",
        ),
        ({"interval": float("inf")}, "interval must be"),
        ({"segment_interval": -1}, "segment_interval must be"),
        ({"cpu_budget": 0}, "cpu_budget must be a share of one core"),
        ({"history_bytes": 10}, "history max_bytes must be at least 64 KiB"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampler(UnavailableSource(0, "x"), **kwargs)
    with pytest.raises(TypeError, match="unexpected keyword"):
        Sampler(UnavailableSource(0, "x"), intervall=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="source must have a sample"):
        Sampler(object())


def test_history_estimate_covers_what_stats_samples_really_hold():
    """The byte bound holds in real memory: tracemalloc measures what 1500 samples keep."""
    import gc
    import tracemalloc

    from gpumemviz.io import load_snapshot
    from gpumemviz.live.sources.playback import PlaybackSource

    raw = load_snapshot(TRACED).to_torch()
    assert raw["device_traces"][0]
    s = Sampler(PlaybackSource(raw, duration=10), interval=0.1, history_bytes=64 << 20)
    for _ in range(50):
        s.sample_once(segments=False)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        est0 = s.history.nbytes
        for _ in range(1500):
            s.sample_once(segments=False)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    estimated = s.history.nbytes - est0
    assert held <= estimated <= 3 * held, (held, estimated)


def test_set_interval_refuses_a_bad_interval():
    with pytest.raises(ValueError, match="interval must be a positive number"):
        Sampler(UnavailableSource(0, "x")).set_interval(0)


def test_set_interval_to_the_interval_it_has_does_nothing():
    sampler = Sampler(UnavailableSource(0, "x"), interval=0.5)
    sampler.set_interval(0.5)
    assert not sampler._regrid and not sampler._wake.is_set()
    sampler.set_interval(0.25)
    assert sampler.interval == 0.25 and sampler._regrid and sampler._wake.is_set()


def test_set_interval_keeps_the_running_thread_and_cuts_a_long_wait_short():
    """set_interval, not a restart: the same thread and history; a 30 s wait ends at once."""
    from gpumemviz.live.sources.simulated import SimulatedSource

    sampler = Sampler(SimulatedSource("training", autostart=False), interval=30.0)
    try:
        assert sampler.start()
        deadline = time.monotonic() + 5
        while sampler.counters["ticks"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        thread, ticks = sampler._thread, sampler.counters["ticks"]
        assert ticks == 1 and sampler.read_timeout == 120.0
        sampler.set_interval(0.02)
        deadline = time.monotonic() + 5
        while sampler.counters["ticks"] < ticks + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sampler.counters["ticks"] >= ticks + 5  # 30 s would give none
        assert sampler._thread is thread and sampler.running
        assert sampler.interval == 0.02 and sampler.read_timeout == 2.0
        assert len(sampler.history) >= ticks + 5
    finally:
        sampler.close()
    with pytest.raises(ValueError, match="interval must be a positive number"):
        sampler.set_interval(-1)


# --- issue 15, point 7: intervals checked; a listener's BaseException contained; a thread that
# stops on its own says why


@pytest.mark.parametrize("bad", [0.001, 86400.5, 2.4e9, 1e300, float("inf"), float("nan"), True])
def test_an_interval_outside_a_hundredth_of_a_second_to_a_day_is_refused_everywhere(bad):
    from gpumemviz.widget import monitor

    message = r"^interval must be a positive number of seconds from 0\.01 to 86400 \(one day\)"
    with pytest.raises(ValueError, match=message):
        Sampler(UnavailableSource(0, "x"), interval=bad)
    with pytest.raises(ValueError, match=message):
        Sampler(UnavailableSource(0, "x")).set_interval(bad)
    with pytest.raises(ValueError, match=message):
        monitor(source=UnavailableSource(0, "x"), interval=bad)
    with pytest.raises(ValueError, match=r"^segment_interval must be"):
        Sampler(UnavailableSource(0, "x"), segment_interval=bad)
    with pytest.raises(ValueError, match=r"^read_timeout must be"):
        Sampler(UnavailableSource(0, "x"), read_timeout=bad)
    assert not sampler_threads()


def test_the_longest_interval_runs_and_stops(real_source):
    s = Sampler(real_source, interval=86400)
    assert s.start() and wait_for(lambda: s.counters["ticks"] >= 1)
    time.sleep(0.1)  # the thread is in its (day-long) wait now: no overflow, still alive
    assert s.running and s.stopped is None and s.counters["errors"] == 0
    s.set_interval(0.02)
    assert wait_for(lambda: s.counters["ticks"] >= 3)
    assert s.stop()


@pytest.mark.parametrize("exc", [SystemExit(0), GeneratorExit(), KeyboardInterrupt()])
def test_a_listener_raising_any_base_exception_is_counted_not_fatal(real_source, exc):
    s = Sampler(real_source, interval=0.02)
    good: list = []

    def bad(sample):
        raise exc

    s.add_listener(bad)
    s.add_listener(good.append)
    if isinstance(exc, KeyboardInterrupt):  # on the user's thread, Ctrl-C stays theirs
        with pytest.raises(KeyboardInterrupt):
            s.sample_once()
    else:
        assert s.sample_once().state == "ok"  # sample_once on the user's thread returns
        assert s.counters["listener_errors"] == 1 and len(good) == 1
    try:
        assert s.start()
        assert wait_for(lambda: s.counters["listener_errors"] >= 4)  # on the sampler thread
        assert s.running and s.stopped is None
        assert any(f"raised {type(exc).__name__}" in n for g in good for n in g.notes)
    finally:
        assert s.stop()


class _BrokenWake(threading.Event):
    def wait(self, timeout=None):
        raise RuntimeError("the clock broke")


def test_a_thread_that_stops_on_its_own_says_why_and_the_panel_shows_it(real_source):
    from gpumemviz.widget import MemoryPanel

    s = Sampler(real_source, interval=0.02)
    s._wake = _BrokenWake()  # the loop's wait fails: a bug outside the read's own guard
    panel = MemoryPanel(subshell=False)
    try:
        panel.attach(s, owned=True)
        assert s.start()
        reason = "sampler thread stopped: RuntimeError: the clock broke"
        assert wait_for(lambda: not s.running)
        assert s.stopped == reason and s.status()["stopped"] == reason
        assert s.last_error == reason and s.counters["errors"] >= 1
        assert s.history.latest().errors == (reason,)
        assert panel.flush() and panel.status == reason
        s._wake = threading.Event()
        assert s.start() and s.stopped is None  # a restart clears it
    finally:
        panel.close()
    assert wait_for(lambda: not sampler_threads())
