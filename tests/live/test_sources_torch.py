"""sources/torch_cuda.py, its OOM observer (sources/oom_observer.py) and capture_oom against the
real snapshot files, served through a stand-in torch.cuda.

Only what cannot exist on a CPU machine is stood in for: the few torch.cuda functions the source
calls (is_available, is_initialized, memory_stats, memory_snapshot, memory._snapshot, mem_get_info,
get_device_properties, empty_cache, get_allocator_backend, _record_memory_history, _lazy_call)
and the OOM observer attach in torch._C. The segment state they serve is a real file's; device
totals, free bytes and UUIDs are SYNTHETIC stand-in values and named so.
"""

from __future__ import annotations

import copy
import pickletools
import sys
import time
import types

import pytest
import torch

from conftest import REAL_DIR, read_real, real_file, standin_file
from gpumemviz.analysis.fragmentation.oom import classify_event, classify_oom
from gpumemviz.live.sources import SourceCommandError, default_source, oom
from gpumemviz.live.sources import nvml as nvml_mod
from gpumemviz.live.sources import oom_observer as obs
from gpumemviz.live.sources.oom import oom_stream
from gpumemviz.live.sources.oom_capture import OomCapture, capture_oom
from gpumemviz.live.sources.torch_cuda import TorchCudaSource
from gpumemviz.snapshot.sample import NOT_CLASSIFIED, MemoryStats, OomEvent

GiB = 1 << 30
SYNTHETIC_TOTAL = 80 * GiB  # SYNTHETIC: stand-in device total (the files do not record it)
SYNTHETIC_CONTEXT = 600 << 20  # SYNTHETIC: CUDA context + libraries outside the allocator
# a state-only real recording that ships (tests/data/real): 370 segments, no history
STATE_FILE = REAL_DIR / "ZijianDu__Attention__memory.7e5ba324.pickle"


def stats_from_segments(segments: list[dict], device: int) -> dict[str, int]:
    """memory_stats() figures that follow from a segment list (the allocator's own sums)."""
    mine = [s for s in segments if s.get("device", 0) == device]
    inactive_split = sum(
        b["size"]
        for s in mine
        if not s.get("is_expandable") and any(b["state"] != "inactive" for b in s["blocks"])
        for b in s["blocks"]
        if b["state"] == "inactive"
    )
    reserved = sum(s["total_size"] for s in mine)
    allocated = sum(s["allocated_size"] for s in mine)
    out = {
        "allocated_bytes.all.current": allocated,
        "allocated_bytes.all.peak": allocated,
        "reserved_bytes.all.current": reserved,
        "reserved_bytes.all.peak": reserved,
        "active_bytes.all.current": sum(s.get("active_size", s["allocated_size"]) for s in mine),
        "requested_bytes.all.current": sum(s.get("requested_size", 0) for s in mine),
        "inactive_split_bytes.all.current": inactive_split,
        "segment.all.current": sum(1 for s in mine if not s.get("is_expandable")),
        "num_device_alloc": len(mine),
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }
    return out


class FakeCuda(types.SimpleNamespace):
    """A stand-in `torch.cuda` serving one real snapshot dict; records what was called."""

    def __init__(
        self,
        snapshot: dict,
        *,
        initialized: bool = True,
        backend: str = "native",
        total: int = SYNTHETIC_TOTAL,
    ):
        super().__init__()
        self.state = copy.deepcopy(snapshot)
        self.total = total
        self.initialized = initialized
        self.backend = backend
        self.calls: list[str] = []
        self.queued: list = []
        self.history_calls: list[dict] = []
        self.snapshot_delay = 0.0
        n_dev = max([s["device"] for s in self.state["segments"]] + [0]) + 1
        self.n_devices = max(n_dev, len(self.state.get("device_traces", [])))
        fake = self

        def _record_memory_history(
            enabled="all",
            context="all",
            stacks="all",
            max_entries=sys.maxsize,
            device=None,
            clear_history=False,
            compile_context=False,
            global_record_annotations=False,
            skip_actions=None,
        ):
            fake.history_calls.append(
                {"enabled": enabled, "context": context, "stacks": stacks,
                 "max_entries": max_entries, "skip_actions": skip_actions}
            )  # fmt: skip

        def _snapshot(device=None, augment_with_fx_traces=False):
            fake.calls.append("_snapshot")
            return copy.deepcopy(fake.state)

        self.memory = types.SimpleNamespace(
            _snapshot=_snapshot, _record_memory_history=_record_memory_history
        )

    def _init(self) -> None:
        """What torch's _lazy_init does: mark initialised, then run the queued calls."""
        self.initialized = True
        for fn in self.queued:
            fn()
        self.queued.clear()

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return self.n_devices

    def _need_init(self, what: str) -> None:
        self.calls.append(what)
        if not self.initialized:  # these create a CUDA context: the source must not call them
            raise AssertionError(f"{what} called before CUDA was initialised")

    def memory_stats(self, device=None) -> dict:
        self.calls.append("memory_stats")
        if not self.initialized:
            return {}
        return stats_from_segments(self.state["segments"], device or 0)

    def memory_snapshot(self, mempool_id=None, include_traces=True):
        self._need_init(f"memory_snapshot(include_traces={include_traces})")
        if self.snapshot_delay:
            time.sleep(self.snapshot_delay)
        return copy.deepcopy(self.state["segments"])

    def mem_get_info(self, device=None):
        self._need_init("mem_get_info")
        reserved = stats_from_segments(self.state["segments"], device or 0)
        used = reserved["reserved_bytes.all.current"] + SYNTHETIC_CONTEXT
        return self.total - used, self.total

    def get_device_properties(self, device=None):
        self._need_init("get_device_properties")
        return types.SimpleNamespace(
            name="SYNTHETIC stand-in GPU",
            total_memory=self.total,
            uuid=f"5eed0000-0000-0000-0000-00000000000{device}",  # SYNTHETIC
            major=9,
            minor=0,
        )

    def get_allocator_backend(self) -> str:
        self.calls.append("get_allocator_backend")
        return self.backend

    def empty_cache(self) -> None:
        """torch's rule: free every fully free non-expandable segment, on every device."""
        self._need_init("empty_cache")
        self.state["segments"] = [
            s
            for s in self.state["segments"]
            if s.get("is_expandable") or any(b["state"] != "inactive" for b in s["blocks"])
        ]

    def _lazy_call(self, fn) -> None:
        if self.initialized:
            fn()
        else:
            self.queued.append(fn)


class LegacyFakeCuda(FakeCuda):
    """torch < 2.11: memory_snapshot has no include_traces and copies the recorded history."""

    def memory_snapshot(self, mempool_id=None):  # type: ignore[override]
        return super().memory_snapshot(mempool_id)


@pytest.fixture
def serve(monkeypatch):
    """Install a stand-in torch.cuda for one real file; returns (fake, observers attached)."""
    attached: list = []
    obs._reset_observer_for_tests()

    def install(snapshot: dict, cls=FakeCuda, history_enabled=False, **kw):
        fake = cls(snapshot, **kw)
        monkeypatch.setattr(torch, "cuda", fake)
        monkeypatch.setattr(
            torch._C, "_cuda_attach_out_of_memory_observer", attached.append, raising=False
        )
        monkeypatch.setattr(
            torch._C, "_cuda_isHistoryEnabled", lambda: fake.history_enabled, raising=False
        )
        fake.history_enabled = history_enabled
        return fake, attached

    yield install
    obs._reset_observer_for_tests()


@pytest.fixture(
    params=[
        (lambda: standin_file("expandable_oom_3dev"), 3 * GiB),
        (
            lambda: real_file(
                "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"
            ),
            SYNTHETIC_TOTAL,
        ),
    ],
    ids=["standin", "Constructor-Sun"],
)
def oom_file(request) -> tuple[dict, int]:
    """An OOM on device 1 of three, dumped after the failure unwound, and the device total to
    serve with it: the model-made stand-in (always there; its card is 3 GiB, as the reserved
    bytes plus the oom entry's device_free say) and the real recording (CI-only: skips in one
    line without ../shared; SYNTHETIC 80 GiB, near its 78.51 GiB capacity)."""
    load, total = request.param
    return read_real(load()), total


# ------------------------------------------------------------------------------------------------
def test_on_this_cpu_machine_the_real_torch_says_unavailable():
    src = TorchCudaSource(0)
    s = src.sample()
    assert s.state == "unavailable"
    assert s.stats is None
    assert "CUDA is not available" in s.errors[0]
    with pytest.raises(SourceCommandError, match="waiting for CUDA"):
        src.export()


def test_default_source_without_cuda_is_not_the_torch_source():
    src = default_source(0)
    try:
        assert not isinstance(src, TorchCudaSource)
        assert src.sample().demo
    finally:
        src.close()
    with pytest.raises(ValueError, match="non-negative int"):
        default_source(-1)


def test_bad_device_is_a_clear_error():
    with pytest.raises(ValueError, match="device must be a non-negative int, got 'x'"):
        TorchCudaSource("x")  # type: ignore[arg-type]


def test_waits_for_cuda_and_never_initialises_it(serve):
    fake, attached = serve(read_real(STATE_FILE), initialized=False)
    src = TorchCudaSource(0, nvml=False)
    src.set_oom_handler(lambda e: None)
    s = src.sample()
    assert s.state == "waiting"
    assert "waiting for CUDA" in s.segments_note
    assert s.stats is None and s.segments is None
    # nothing that creates a context was called, and the observer is only queued
    assert not [c for c in fake.calls if c not in ("memory_stats", "get_allocator_backend")]
    assert attached == []
    assert len(fake.queued) == 1
    fake._init()  # the user's code initialises CUDA: the queued attach runs then
    assert attached == [obs._trampoline]
    assert src.sample().state == "ok"


def test_serves_stats_and_segments_of_its_device_from_real_files(serve, recorded_dict):
    raw = recorded_dict
    if isinstance(raw, list):
        raw = {"segments": raw, "device_traces": []}
    fake, _ = serve(raw)
    device = max(s["device"] for s in raw["segments"])  # the last device, not always 0
    src = TorchCudaSource(device, nvml=False)
    s = src.sample(segments=True)
    assert s.state == "ok", s.errors
    mine = [seg for seg in raw["segments"] if seg["device"] == device]
    assert s.stats.reserved == sum(seg["total_size"] for seg in mine)
    assert s.segments.n_segments == len(mine)
    assert s.segments.n_blocks == sum(len(seg["blocks"]) for seg in mine)
    assert int(s.segments.segments.total_size.sum()) == s.stats.reserved
    assert "memory_snapshot(include_traces=False)" in fake.calls
    assert s.device_info.name == "SYNTHETIC stand-in GPU"
    assert s.device_info.uuid == f"5eed0000-0000-0000-0000-00000000000{device}"
    assert s.device_info.backend == "native"
    # stats-only ticks do not touch the segment map
    fake.calls.clear()
    s2 = src.sample(segments=False)
    assert s2.segments is None and s2.stats == s.stats
    assert not any(c.startswith("memory_snapshot") for c in fake.calls)


def test_old_torch_fallback_is_timed_and_spaced_out(serve):
    fake, _ = serve(read_real(STATE_FILE), cls=LegacyFakeCuda)
    fake.snapshot_delay = 0.05  # a large recorded history makes each call expensive
    src = TorchCudaSource(0, nvml=False)
    s = src.sample()
    assert s.segments is not None
    assert "memory_snapshot(include_traces=True)" in fake.calls
    assert src.segment_interval_hint >= 0.05 / 0.01 * 0.9
    assert "torch < 2.11" in s.segments_note


def test_reads_slowly_while_the_user_records_history_and_skips_own_snapshots(serve):
    fake, _ = serve(read_real(STATE_FILE), history_enabled=True)
    src = TorchCudaSource(0, nvml=False)
    assert src.segment_interval_hint >= 10
    src.record_history(max_entries=5000)
    assert fake.history_calls[-1] == {
        "enabled": "all",
        "context": "all",
        "stacks": "python",
        "max_entries": 5000,
        "skip_actions": ["snapshot"],
    }
    assert src.segment_interval_hint == 0  # our own recording skips snapshot entries
    src.record_history(False)
    assert fake.history_calls[-1]["enabled"] is None
    with pytest.raises(ValueError, match="stacks must be"):
        src.record_history(stacks="cpp")


def test_cuda_malloc_async_backend_keeps_stats_and_says_why_no_map(serve):
    fake, _ = serve(read_real(STATE_FILE), backend="cudaMallocAsync")
    src = TorchCudaSource(0, nvml=False)
    s = src.sample(segments=True)
    assert s.segments is None and s.stats is not None
    assert "cudaMallocAsync" in s.segments_note
    assert "segments" not in src.capabilities
    assert not any(c.startswith("memory_snapshot") for c in fake.calls)


@pytest.mark.parametrize(
    ("name", "n_free", "least"),
    [
        ("ZijianDu__Attention__memory.7e5ba324.pickle", 11, 330 << 20),
        ("kkaitlyn111__cs336-a2-systems__memory_snapshot.pickle", 561, 10 * GiB),  # CI-only
    ],
    ids=["ZijianDu", "kkaitlyn111"],
)
def test_empty_cache_reports_release_per_device(serve, name, n_free, least):
    raw = read_real(real_file(name))
    serve(raw)
    free = [s for s in raw["segments"] if all(b["state"] == "inactive" for b in s["blocks"])]
    free_segments = sum(s["total_size"] for s in free)
    assert len(free) == n_free and free_segments >= least  # fully free cached segments
    released = TorchCudaSource(0, nvml=False).empty_cache()
    # one figure per device the file lists (ZijianDu's lists two, its segments all on 0)
    others = dict.fromkeys(range(1, len(raw["device_traces"])), 0)
    assert released == {0: free_segments, **others}


def test_export_is_the_full_snapshot(serve, oom_file):
    raw, total = oom_file
    serve(raw, total=total)
    assert TorchCudaSource(1, nvml=False).export() == raw


def test_nvml_failure_becomes_not_available_and_cudamemgetinfo_fills_in(serve):
    nvml_mod._reset_for_tests()
    serve(read_real(STATE_FILE))
    s = TorchCudaSource(0).sample(segments=False)
    assert s.nvml.available is False
    assert s.nvml.reason.startswith("NVML not available: NVMLError_LibraryNotFound")
    # cudaMemGetInfo (this process already uses the device) still gives memory outside PyTorch
    assert s.nvml.non_pytorch == SYNTHETIC_CONTEXT
    assert s.non_pytorch_bytes is None  # ... but it is not NVML's figure
    nvml_mod._reset_for_tests()


def test_a_raising_memory_stats_becomes_an_error_sample(serve):
    fake, _ = serve({"segments": [], "device_traces": [[]]})

    def boom(device=None):
        raise RuntimeError("CUDA error: an illegal memory access\nmore lines")

    fake.memory_stats = boom
    s = TorchCudaSource(0, nvml=False).sample()
    assert s.state == "error"
    assert s.errors == ("memory_stats: RuntimeError: CUDA error: an illegal memory access",)


# OOM ----------------------------------------------------------------------------------------------
def _oom_args(raw: dict, total: int = SYNTHETIC_TOTAL) -> tuple[int, int, int, int]:
    for device, trace in enumerate(raw["device_traces"]):
        for e in trace:
            if e["action"] == "oom":
                return device, e["size"], total, e["device_free"]
    raise AssertionError("no oom entry")


def test_oom_observer_takes_the_snapshot_once_per_failure(serve, oom_file):
    raw, total = oom_file
    # The file was dumped after the error unwound (only frees follow the `oom` entry: 174 in
    # the real file, 300 in the stand-in); inside the observer the trace ends at the `oom`
    # entry, so serve it that way.
    trace = raw["device_traces"][1]
    cut = max(i for i, e in enumerate(trace) if e["action"] == "oom") + 1
    after = {e["action"] for e in trace[cut:]}
    assert len(trace) - cut in (174, 300) and after == {"free_requested", "free_completed"}
    raw["device_traces"][1] = trace[:cut]
    fake, attached = serve(raw, total=total)
    src = TorchCudaSource(1, nvml=False)
    events: list[OomEvent] = []
    src.set_oom_handler(events.append)
    # replacing the handler does not attach twice
    src.set_oom_handler(events.append)
    assert attached == [obs._trampoline]
    device, size, total, free = _oom_args(raw, total)
    observer = attached[0]
    observer(device, size, total, free)
    captured_at = obs._OOM["last"][device]
    observer(device, size // 2, total, free)  # a retry with a smaller workspace: same failure
    assert len(events) == 1
    assert obs._OOM["last"][device] == captured_at  # a retry does not extend the window
    ev = events[0]
    assert (ev.device, ev.alloc_size, ev.device_free) == (1, size, free)
    assert ev.request_size == size  # read back from the real `oom` trace entry
    assert ev.snapshot == raw and fake.calls.count("_snapshot") == 1
    # this file was dumped after the error unwound (frees follow its `oom` entry): a free
    # block now fits the request, so the honest verdict is "unknown", saying why
    assert ev.cause == "unknown" and "freed after the failure" in ev.explanation
    assert obs.oom_observer_status()["dropped"] == 1
    # an OOM on another device is not this source's
    obs._OOM["last"].clear()
    observer(0, size, total, free)
    assert len(events) == 1
    # the sampler side: a keyframe sample with this device's segment state
    sample = src.oom_sample(ev)
    assert sample.oom is ev and sample.keyframe
    assert sample.segments.n_segments == sum(1 for s in raw["segments"] if s["device"] == 1)


def test_the_live_oom_is_judged_with_the_recorded_stream_and_settings(serve):
    """The observer classifies with the `oom` entry's stream and the recorded allocator
    settings: a 200 MiB free block refused by max_split_size is fragmentation (without the
    settings the snapshot would contradict the failure: "unknown")."""
    mib = 1 << 20
    seg = {
        "device": 0, "address": 0x7F0000000000, "total_size": 220 * mib, "stream": 0,
        "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
        "allocated_size": 20 * mib, "active_size": 20 * mib, "requested_size": 20 * mib,
        "frames": [],
        "blocks": [
            {"address": 0x7F0000000000, "size": 200 * mib, "requested_size": 0,
             "state": "inactive", "frames": []},
            {"address": 0x7F0000000000 + 200 * mib, "size": 20 * mib,
             "requested_size": 20 * mib, "state": "active_allocated", "frames": []},
        ],
    }  # fmt: skip
    oom = {"action": "oom", "addr": 0, "size": 30 * mib, "stream": 0, "device_free": 0,
           "frames": []}  # fmt: skip
    raw = {
        "segments": [seg],
        "device_traces": [[oom]],
        "allocator_settings": {"max_split_size": 64 * mib},
    }
    _, attached = serve(raw)
    src = TorchCudaSource(0, nvml=False)
    events: list[OomEvent] = []
    src.set_oom_handler(events.append)
    obs._OOM["totals"][0] = 220 * mib  # a device that is this segment: nothing outside
    attached[0](0, 30 * mib, 220 * mib, 0)
    (ev,) = events
    assert ev.cause == "fragmentation", ev.explanation
    assert "refused by the max_split_size rules" in ev.explanation


def _cut_at_oom(raw: dict) -> None:
    """Inside the observer the trace ends at the `oom` entry: serve it that way."""
    trace = raw["device_traces"][1]
    raw["device_traces"][1] = trace[
        : max(i for i, e in enumerate(trace) if e["action"] == "oom") + 1
    ]


def test_the_observer_judges_each_failure_once_for_every_handler(
    serve, oom_file, tmp_path, monkeypatch
):
    """The observer builds the event of raw facts and judges it once, in the allocating thread,
    with the analysis layer's `classify_event`; every handler (two sources, a capture) gets that
    one judged event."""
    raw, total = oom_file
    _cut_at_oom(raw)
    _, attached = serve(raw, total=total)
    calls: list[tuple[OomEvent, OomEvent]] = []

    def counting(event: OomEvent) -> OomEvent:
        verdict = classify_event(event)
        calls.append((event, verdict))
        return verdict

    monkeypatch.setattr(oom, "classify_event", counting)
    first: list[OomEvent] = []
    second: list[OomEvent] = []
    TorchCudaSource(1, nvml=False).set_oom_handler(first.append)
    TorchCudaSource(1, nvml=False).set_oom_handler(second.append)
    with OomCapture(tmp_path / "oom.pickle") as cap:
        device, size, _, free = _oom_args(raw, total)
        attached[0](device, size, total, free)
    ((ev, verdict),) = calls  # one judgement, of the raw event
    assert (ev.cause, ev.explanation) == ("unknown", NOT_CLASSIFIED)
    assert ev.reserved == ev.largest_free_block == 0
    assert (ev.device_total, ev.request_size, ev.device_free) == (total, size, free)
    assert ev.stream == oom_stream(raw, 1) is not None
    assert first == second == cap.events == [verdict]
    assert first[0] is second[0] is cap.events[0] is verdict
    assert verdict == classify_event(ev) and verdict.explanation != NOT_CLASSIFIED
    assert verdict.reserved == sum(s["total_size"] for s in raw["segments"] if s["device"] == 1)


def test_a_failed_verdict_leaves_the_raw_facts_with_the_reason(serve, oom_file, monkeypatch):
    """Judging runs in the user's allocating thread: when it raises, the handlers still get the
    failure's facts, saying why there is no verdict, and nothing reaches the user's code."""
    raw, total = oom_file
    _cut_at_oom(raw)
    _, attached = serve(raw, total=total)

    def broken(event: OomEvent) -> OomEvent:
        raise RuntimeError("verdict bug")

    monkeypatch.setattr(oom, "classify_event", broken)
    events: list[OomEvent] = []
    TorchCudaSource(1, nvml=False).set_oom_handler(events.append)
    device, size, _, free = _oom_args(raw, total)
    attached[0](device, size, total, free)  # must not raise
    (ev,) = events
    assert (ev.cause, ev.explanation) == ("unknown", "not classified: RuntimeError: verdict bug")
    assert ev.reserved == ev.largest_free_block == 0
    assert (ev.device_total, ev.request_size, ev.device_free) == (total, size, free)
    assert ev.snapshot == raw
    assert classify_event(ev).explanation != NOT_CLASSIFIED  # the facts, judged later


def test_stopped_handler_turns_the_observer_into_a_no_op(serve, oom_file):
    raw, total = oom_file
    fake, attached = serve(raw, total=total)
    src = TorchCudaSource(1, nvml=False)
    src.set_oom_handler(lambda e: None)
    src.close()
    attached[0](1, 1 << 20, total, 0)
    assert fake.calls.count("_snapshot") == 0  # no work at all in the user's thread


def test_observer_never_raises_into_user_code(serve, oom_file):
    raw, total = oom_file
    fake, attached = serve(raw, total=total)

    def broken_snapshot(*a, **k):
        raise RuntimeError("snapshot failed inside OOM")

    fake.memory._snapshot = broken_snapshot
    got: list[OomEvent] = []

    def bad_handler(e):
        got.append(e)
        raise ValueError("handler bug")

    src = TorchCudaSource(1, nvml=False)
    src.set_oom_handler(bad_handler)
    attached[0](1, 1 << 20, total, 0)  # must not raise
    assert got[0].snapshot is None and got[0].cause == "unknown"
    assert "snapshot failed inside OOM" in got[0].snapshot_error
    assert obs.oom_observer_status()["errors"] == 1
    assert "handler bug" in obs.oom_observer_status()["last_error"]
    attached[0]("garbage", None, None, None)  # even nonsense arguments


def test_capture_oom_writes_protocol_4_at_the_moment_of_failure(serve, tmp_path, oom_file):
    raw, total = oom_file
    fake, attached = serve(raw, initialized=False, total=total)
    with capture_oom(tmp_path / "oom_{rank}.pickle") as cap:
        assert attached == []  # CUDA not initialised: attach is queued, not forced
        fake._init()
        attached[0](*_oom_args(raw, total))
        assert cap.written == tmp_path / "oom_0.pickle"
    data = cap.written.read_bytes()
    protos = {arg for op, arg, _ in pickletools.genops(data) if op.name == "PROTO"}
    assert protos == {4}
    assert read_real(cap.written) == raw
    assert len(cap.events) == 1
    # after the block the observer does nothing for this capture
    obs._OOM["last"].clear()
    attached[0](*_oom_args(raw, total))
    assert len(cap.events) == 1


def test_capture_oom_falls_back_to_the_exception_when_no_observer_ran(serve, tmp_path, oom_file):
    raw, total = oom_file
    serve(raw, total=total)
    path = tmp_path / "late.pickle"
    with pytest.raises(torch.OutOfMemoryError), capture_oom(path) as cap:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.94 GiB")
    assert cap.written == path
    assert read_real(path)["segments"] == raw["segments"]


def test_capture_oom_writes_through_io_fsynced_and_leaves_nothing_partial(tmp_path, monkeypatch):
    import os

    from gpumemviz.io import snapshot_files

    snap = {"segments": [], "device_traces": [[]]}
    event = OomEvent(
        time=1.0,
        device=0,
        alloc_size=2 << 20,
        device_limit=1 << 30,
        device_free=0,
        cause="capacity",
        explanation="x",
        snapshot=snap,
    )
    path = tmp_path / "sub" / "oom.pickle"
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    cap = capture_oom(path)
    cap._on_oom(event)
    assert cap.written == path and cap.error is None and synced  # the folder was created
    assert read_real(path) == snap
    before = path.read_bytes()

    def half_then_fail(data, f):
        f.write(b"\x80\x04partial")
        raise OSError("disk full")

    monkeypatch.setattr(snapshot_files, "_write_pickle", half_then_fail)
    again = capture_oom(path)
    again._on_oom(event)
    assert again.written is None and again.error == f"could not write {path}: OSError: disk full"
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["oom.pickle"]


def test_capture_oom_without_cuda_does_nothing(tmp_path):
    with capture_oom(tmp_path / "x.pickle") as cap:
        pass
    assert cap.written is None and not cap.attached
    assert not (tmp_path / "x.pickle").exists()
    with pytest.raises(ValueError, match="only \\{rank\\} and \\{pid\\}"):
        capture_oom(tmp_path / "{user}.pickle")


def test_capture_oom_is_exported_lazily():
    import gpumemviz

    assert gpumemviz.capture_oom is capture_oom
    assert "capture_oom" in gpumemviz.__all__


# classification ----------------------------------------------------------------------------------
MiB = 1 << 20


def _seg(*blocks: tuple[int, str], device: int = 0) -> dict:
    return {
        "device": device,
        "total_size": sum(b[0] for b in blocks),
        "allocated_size": sum(b[0] for b in blocks if b[1] == "active_allocated"),
        "blocks": [{"size": s, "state": st} for s, st in blocks],
    }


def test_classify_capacity_fragmentation_outside():
    full = _seg((60 * MiB, "active_allocated"))
    holes = _seg(
        (8 * MiB, "inactive"), (8 * MiB, "active_allocated"), (8 * MiB, "inactive"), device=0
    )
    frag = classify_oom(
        [holes], 0, alloc_size=12 * MiB, device_total=100 * MiB, device_free=70 * MiB - 12 * MiB
    )
    assert frag["cause"] == "fragmentation"
    assert frag["free_in_segments"] == 16 * MiB and frag["largest_free_block"] == 8 * MiB
    cap = classify_oom([full], 0, alloc_size=20 * MiB, device_total=64 * MiB, device_free=2 * MiB)
    assert cap["cause"] == "capacity"
    out = classify_oom([full], 0, alloc_size=20 * MiB, device_total=200 * MiB, device_free=5 * MiB)
    assert out["cause"] == "outside" and out["outside_bytes"] == 135 * MiB
    assert "request size unknown" in out["explanation"]
    # other devices' segments are not counted
    other = classify_oom(
        [_seg((1 * GiB, "inactive"), device=3), full],
        0,
        alloc_size=20 * MiB,
        device_total=64 * MiB,
        device_free=2 * MiB,
    )
    assert other["reserved"] == 60 * MiB


def test_classify_the_real_capacity_oom_file():
    raw = read_real(REAL_DIR / "Yiyi-philosophy__LLM-inference__oom_snapshot.pickle")
    # torch 2.0 legacy blocks (no address): 11,292 of 11,296 MiB allocated, a true capacity OOM.
    reserved = sum(s["total_size"] for s in raw["segments"])
    got = classify_oom(
        raw["segments"],
        0,
        alloc_size=20 * MiB,
        device_total=reserved + SYNTHETIC_CONTEXT + 10 * MiB,  # SYNTHETIC: a full device
        device_free=10 * MiB,
    )
    assert got["cause"] == "capacity"
    assert got["reserved"] == reserved
    assert got["largest_free_block"] < 20 * MiB


def test_stats_helper_matches_the_memory_stats_names():
    s = MemoryStats.from_torch(stats_from_segments([_seg((2 * MiB, "active_allocated"))], 0))
    assert (s.allocated, s.reserved) == (2 * MiB, 2 * MiB)


def test_extra_oom_handlers_and_history_state_on_the_cuda_path(serve, oom_file, tmp_path):
    """`add_oom_handler` (what gpumemviz.distributed installs beside the sampler's handler) gets
    the same judged failure in the allocating thread; `history_enabled` reads torch's flag; and
    `publish` on this source writes the rank's OOM file and turns recording on when asked."""
    import torch.distributed as dist

    from gpumemviz.distributed import publish
    from gpumemviz.io import load_snapshot

    raw, total = oom_file
    trace = raw["device_traces"][1]
    raw["device_traces"][1] = trace[
        : max(i for i, e in enumerate(trace) if e["action"] == "oom") + 1
    ]
    fake, attached = serve(raw, total=total)
    src = TorchCudaSource(1, nvml=False)
    assert src.history_enabled() is False
    fake.history_enabled = True
    assert src.history_enabled() is True
    fake.history_enabled = False
    mine: list[OomEvent] = []
    src.add_oom_handler(mine.append)
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pub = publish(0.05, store=master, source=src, oom_dir=tmp_path, record_history=True)
    try:
        pub.tick()
        assert fake.history_calls and fake.history_calls[-1]["enabled"] == "all"
        device, size, _, free = _oom_args(raw, total)
        attached[0](device, size, total, free)
        (ev,) = mine
        assert ev.explanation != NOT_CLASSIFIED
        written = load_snapshot(tmp_path / "rank0_oom.pickle")
        assert written.n_segments == len(raw["segments"])
        assert pub.last_oom is not None and pub.last_oom["cause"] == ev.cause
        assert pub.oom is not None and pub.oom.answered == (0, 0)  # no other rank to ask
    finally:
        pub.stop()
    src.remove_oom_handler(mine.append)
    obs._OOM["last"].clear()
    attached[0](device, size, total, free)
    assert len(mine) == 1


# ------------------------------------------------------------------------------------------------
def _with_traceback(fake, frames_of):
    """Give the stand-in torch.cuda.memory torch 2.13's `_allocation_traceback(data_ptr)` (one
    live pointer's frames, innermost first; None for an address it does not know); it records
    each address asked."""
    asked: list[int] = []

    def _allocation_traceback(data_ptr):
        asked.append(data_ptr)
        return frames_of(data_ptr)

    fake.memory._allocation_traceback = _allocation_traceback
    return asked


def test_allocation_stack_asks_torch_for_one_pointer_without_a_snapshot(serve):
    state = read_real(STATE_FILE)
    fake, _ = serve(state)
    src = TorchCudaSource(0, nvml=False)
    assert src.allocation_stack(0x1000) is None  # torch before 2.13: no such function
    frames = [
        {"filename": "/x/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
        {"filename": "/home/me/train.py", "line": 88, "name": "step"},
    ]
    asked = _with_traceback(fake, lambda p: frames if p == 0x1000 else None)
    calls = len(fake.calls)
    assert src.allocation_stack(0x1000) == frames
    assert src.allocation_stack(0x2000) is None  # not a live allocation's start
    assert asked == [0x1000, 0x2000]
    assert "_snapshot" not in fake.calls[calls:] and not any(
        c.startswith("memory_snapshot") for c in fake.calls[calls:]
    )
    fake.memory._allocation_traceback = lambda p: 1 / 0  # a failing torch: None, no raise
    assert src.allocation_stack(0x1000) is None
    fake.initialized = False  # before CUDA is initialised: never asked
    asked.clear()
    _with_traceback(fake, lambda p: frames)
    assert src.allocation_stack(0x1000) is None


def test_the_panels_hover_gets_a_live_blocks_stack_from_torch(serve, monkeypatch):
    """A live panel on the torch source: an allocated block whose frame carried no stack is
    asked for by its address, and answered as the hover shows stacks."""
    from gpumemviz.live.sampler import Sampler
    from gpumemviz.render.rows import build_rows
    from gpumemviz.snapshot.schema import ALLOCATED
    from gpumemviz.widget.panel import MemoryPanel

    state = read_real(STATE_FILE)
    for seg in state["segments"]:
        for b in seg["blocks"]:
            b.pop("frames", None)  # a segment read without stacks
    fake, _ = serve(state)
    user = {"filename": "/home/me/train.py", "line": 88, "name": "step"}
    asked = _with_traceback(fake, lambda p: [user])
    panel = MemoryPanel(device=0)
    sampler = Sampler(TorchCudaSource(0, nvml=False))
    try:
        panel.attach(sampler, owned=True)
        sampler.sample_once(segments=True)
        assert panel.flush()
        seg = next(
            s
            for s in state["segments"]
            if s["device"] == 0 and any(b["state"] == "active_allocated" for b in s["blocks"])
        )
        rows = build_rows(panel.shown, device=0)  # the rows the panel's map shows
        row = next(r for r, a in enumerate(rows.address) if a == seg["address"])
        blocks = rows.blocks(row)
        k = next(i for i, st in enumerate(blocks["state"]) if st == ALLOCATED)
        stack = panel.allocation_stack(row, k)
        assert stack == {"lines": ["train.py:88:step"], "user": 0}
        assert asked == [seg["address"] + int(blocks["offset"][k])]
        free = [i for i, st in enumerate(blocks["state"]) if st != ALLOCATED]
        if free:
            assert panel.allocation_stack(row, free[0]) is None  # a free block: not asked
        assert len(asked) == 1
        # the browser's hover asks by message; the answer comes back on the writer thread
        sent: list[dict] = []
        real = panel.send
        monkeypatch.setattr(panel, "send", lambda c, b=None: (sent.append(c), real(c, b)))
        panel._handle_custom_msg({"kind": "stack", "view": "v", "row": row, "block": k}, [])
        assert panel.flush()
        (reply,) = [c for c in sent if c.get("kind") == "stack"]
        assert reply["view"] == "v" and reply["row"] == row and reply["block"] == k
        assert reply["stack"] == {"lines": ["train.py:88:step"], "user": 0}
        assert reply["layout"] == panel.map_layout["version"]
    finally:
        panel.close()
