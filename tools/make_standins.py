"""Write tests/data/standin/: model-made stand-ins for the real recordings only CI has.

The real files that may ship (tests/data/real/) hold no expandable-segments file, no multi-device
or multi-stream file, no long training trace and no OOM with a trace; those classes exist only
among the unlicensed recordings that CI reads from ../shared/real-snapshots/. Each stand-in here
is the allocator model driven through a program of that class, written in torch's format (frames
on every trace entry and live block, shared frame dicts as torch's pickles share them), so that a
user's clone tests every class:

- `standin__expandable_oom_3dev.pickle`: expandable segments on devices 0-2 (3 idle), training
  on each, device 1 runs out of memory (an `oom` entry, the release-and-retry unmaps before it);
  the snapshot is taken after the failed step let go of its activations, as a user's handler
  would.
- `standin__streams10.pickle`: ten streams sharing a device, frees that wait on other streams
  (`active_pending_free`, free_completed later), empty_cache bursts; no settings and no
  `time_us` (an older torch's keys).
- `standin__training_10k.pickle`: a GPT-2-shaped training loop in a 10,000-entry ring
  (`max_entries=10000`, so the trace starts mid-run), an empty_cache mid-run and the segments
  that grow back after it, `time_us` in microseconds, and the forward, backward and optimizer
  scopes inside the window as `external_annotations`.

Run from the repository root: ``.venv/bin/python tools/make_standins.py`` (``--check`` compares
with the committed files instead of writing). Deterministic: the same files every time.
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpumemviz.allocator.addresses import DescendingAddresses
from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.allocator.workloads import TransformerShape, training_loop

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "standin"
MIB = 1 << 20
GIB = 1 << 30

# A small decoder: enough layers and phases for a trace of a few thousand entries.
SMALL = TransformerShape(hidden=512, layers=6, heads=8, vocab=32000)

_SITE = "/home/user/.venv/lib/python3.11/site-packages/torch"
_USER = "/home/user/project"


def _frame(name: str, filename: str, line: int) -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": line}


# The native frames every recorded stack starts with (torch >= 2.1 records C++ frames too).
_NATIVE = [
    _frame("torch::unwind::unwind()", "??", 0),
    _frame("torch::CapturedTraceback::gather(bool, bool, bool)", "??", 0),
    _frame(
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc("
        "signed char, unsigned long, CUstream_st*)",
        "CUDACachingAllocator.cpp",
        0,
    ),
    _frame("at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)", "??", 0),
]
_MODULE = [
    _frame("_call_impl", f"{_SITE}/nn/modules/module.py", 1784),
    _frame("_wrapped_call_impl", f"{_SITE}/nn/modules/module.py", 1773),
]
_OPS = {
    "linear": _frame("forward", f"{_SITE}/nn/modules/linear.py", 125),
    "softmax": _frame("softmax", f"{_SITE}/nn/functional.py", 2140),
    "gelu": _frame("forward", f"{_SITE}/nn/modules/activation.py", 734),
    "layer_norm": _frame("layer_norm", f"{_SITE}/nn/functional.py", 2910),
    "embedding": _frame("embedding", f"{_SITE}/nn/functional.py", 2546),
    "backward": _frame("_engine_run_backward", f"{_SITE}/autograd/graph.py", 829),
    "adamw": _frame("_multi_tensor_adamw", f"{_SITE}/optim/adamw.py", 481),
    "to": _frame("convert", f"{_SITE}/nn/modules/module.py", 1355),
}
_USER_FRAMES = {
    "block": _frame("forward", f"{_USER}/model.py", 88),
    "attn": _frame("attention", f"{_USER}/model.py", 51),
    "mlp": _frame("mlp", f"{_USER}/model.py", 70),
    "model": _frame("forward", f"{_USER}/model.py", 112),
    "init": _frame("__init__", f"{_USER}/train.py", 31),
    "step": _frame("train_step", f"{_USER}/train.py", 64),
    "loop": _frame("main", f"{_USER}/train.py", 97),
    "stage": _frame("run_stage", f"{_USER}/pipeline.py", 40),
}


def _stack(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    """Innermost first, as torch lists frames; a fresh list of shared frame dicts."""
    return [*_NATIVE, *parts]


def _phase_stacks() -> dict[str, list[list[dict[str, Any]]]]:
    """For each program phase a few stacks to draw from (the frame dicts are shared)."""
    u, o = _USER_FRAMES, _OPS
    fwd = [
        _stack(o["layer_norm"], *_MODULE, u["block"], *_MODULE, u["model"], u["step"], u["loop"]),
        _stack(o["linear"], *_MODULE, u["attn"], u["block"], *_MODULE, u["model"], u["step"]),
        _stack(o["softmax"], u["attn"], u["block"], *_MODULE, u["model"], u["step"], u["loop"]),
        _stack(o["gelu"], *_MODULE, u["mlp"], u["block"], *_MODULE, u["model"], u["step"]),
        _stack(o["embedding"], *_MODULE, u["model"], u["step"], u["loop"]),
    ]
    return {
        "weights": [_stack(o["to"], u["init"], u["loop"])],
        "iteration": fwd,
        "backward": [_stack(o["backward"], u["step"], u["loop"])],
        "optimizer": [_stack(o["adamw"], u["step"], u["loop"])],
        "stage": [_stack(o["linear"], *_MODULE, u["stage"], u["loop"])],
    }


STACKS = _phase_stacks()
# the record_function scope each phase runs in (as torch names its own)
_SCOPES = {
    "weights": "## init ##",
    "iteration": "## forward ##",
    "backward": "## backward ##",
    "optimizer": "Optimizer.step#AdamW.step",
    "stage": "## stage ##",
}


class _Recorder:
    """Drives one model and gives every trace entry and live block the stack of its step."""

    def __init__(
        self, allocator: CachingAllocator, seed: int, clock: Callable[[], int] | None = None
    ) -> None:
        self.a = allocator
        self.rng = random.Random(seed)
        # with a clock, each phase is a record_function scope in `external_annotations`
        self.clock = clock
        self.annotations: list[dict[str, Any]] = []
        self.entry_frames: list[list[dict[str, Any]]] = []
        self.block_frames: dict[int, list[dict[str, Any]]] = {}
        self.phase = "weights"
        self.where: dict[int, int] = {}

    def _stamp(self, fn: Callable[[], Any], stack: list[dict[str, Any]]) -> Any:
        """Run one allocator call; the entries it emits carry `stack` (a fresh list each)."""
        before = self.a.trace_len()
        try:
            return fn()
        finally:
            self.entry_frames += [list(stack) for _ in range(self.a.trace_len() - before)]

    def stack(self) -> list[dict[str, Any]]:
        return self.rng.choice(STACKS[self.phase])

    def malloc(self, key: int, size: int, stream: int = 0) -> None:
        stack = self.stack()
        addr = self._stamp(lambda: self.a.malloc(size, stream), stack)
        self.where[key] = addr
        self.block_frames[addr] = stack

    def free(self, key: int) -> None:
        addr = self.where.pop(key)
        self._stamp(lambda: self.a.free(addr), self.stack())

    def call(self, fn: Callable[[], Any]) -> Any:
        return self._stamp(fn, self.stack())

    def run_ops(self, ops: Iterable[tuple], stop_at: int | None = None) -> None:
        """Workload steps until they end, or until the trace holds `stop_at` entries."""
        for op in ops:
            if op[0] == "malloc":
                self.malloc(op[1], op[2], op[3])
            elif op[0] == "free":
                self.free(op[1])
            elif op[0] == "empty_cache":
                self.call(self.a.empty_cache)
            elif op[0] == "mark":
                self._scope("END")
                self.phase = str(op[1]).split()[0]
                self.phase = self.phase if self.phase in STACKS else "iteration"
                self._scope("START")
            if stop_at is not None and self.a.trace_len() >= stop_at:
                return

    def _scope(self, stage: str) -> None:
        if self.clock is not None:
            name = _SCOPES[self.phase]
            self.annotations.append(
                {"stage": stage, "name": name, "device": self.a.device, "time_us": self.clock()}
            )

    def snapshot(self, *, time_us: bool = True) -> dict[str, Any]:
        """The model's snapshot with frames on entries and live blocks (torch's layout)."""
        snap = self.a.snapshot(record=False)
        trace = snap["device_traces"][self.a.device]
        frames = self.entry_frames[len(self.entry_frames) - len(trace) :]
        for entry, stack in zip(trace, frames, strict=True):
            entry["frames"] = stack
            if not time_us:
                for key in ("time_us", "compile_context", "user_metadata"):
                    entry.pop(key, None)
        for seg in snap["segments"]:
            for b in seg["blocks"]:
                if b["state"] != "inactive":
                    b["frames"] = list(self.block_frames.get(b["address"], ()))
        if self.clock is not None and trace:  # the scopes of the trace's window, as a ring keeps
            first, last = trace[0]["time_us"], trace[-1]["time_us"]
            snap["external_annotations"] = [
                a for a in self.annotations if first <= a["time_us"] <= last
            ]
        return snap


def _microseconds(seed: int, start: int = 1_757_000_000_000_000) -> Callable[[], int]:
    """A clock in Unix microseconds that moves 2-400 us per call, as a busy GPU's does."""
    rng = random.Random(seed)
    now = [start]

    def tick() -> int:
        now[0] += rng.randint(2, 400)
        return now[0]

    return tick


def expandable_oom_3dev() -> dict[str, Any]:
    """Three devices with expandable segments; device 1 runs out of memory mid-iteration."""
    config = "expandable_segments:True"
    snaps = []
    for device, (iterations, batch) in enumerate(((2, 2), (6, 8), (2, 3))):
        a = CachingAllocator(
            3 * GIB,  # three small cards, each the process's own; device 1 gets the big batch
            config,
            device=device,
            address_provider=DescendingAddresses(0x7F0000000000 - device * (1 << 40)),
            clock=_microseconds(device),
        )
        rec = _Recorder(a, seed=device)
        work = training_loop(
            shape=SMALL, batch=batch, iterations=iterations, min_seq=256, max_seq=1024, seed=7
        )
        try:
            rec.run_ops(work.ops())
        except OutOfMemory:
            # the failed step unwinds: its activations go, the weights and optimizer stay
            assert device == 1, "only device 1 is meant to run out of memory"
            for key in sorted(rec.where)[::-1]:
                if key > 12 * SMALL.layers:
                    rec.free(key)
        snaps.append(rec.snapshot())
    assert any(e["action"] == "oom" for e in snaps[1]["device_traces"][1])
    return {
        "segments": [s for snap in snaps for s in snap["segments"]],
        "device_traces": [snap["device_traces"][d] for d, snap in enumerate(snaps)] + [[]],
        "allocator_settings": snaps[0]["allocator_settings"],
        "external_annotations": [],
    }


def streams10() -> dict[str, Any]:
    """Ten streams share a device: each stage allocates on its own stream, some buffers are
    used on the next stage's stream before they are freed, and empty_cache runs now and then."""
    a = CachingAllocator(40 * GIB, "", address_provider=DescendingAddresses(0x7F8000000000))
    rec = _Recorder(a, seed=10)
    rng = random.Random(10)
    streams = [0, *(123_288_560 + 59_136 * i for i in range(1, 10))]
    rec.phase = "weights"
    for key in range(40):  # weights on the default stream
        rec.malloc(key, rng.choice((4, 8, 16, 24)) * MIB + rng.randint(0, 4) * 512)
    rec.phase = "stage"
    key = 1000
    live: dict[int, list[int]] = {s: [] for s in streams}
    for step in range(160):
        s = streams[1 + step % 9]
        for _ in range(rng.randint(2, 5)):
            size = rng.choice((256, 4096, 300_000, 1_500_000, 3 * MIB, 9 * MIB, 26 * MIB))
            rec.malloc(key, size + rng.randint(0, 511), s)
            live[s].append(key)
            key += 1
        while len(live[s]) > 6:
            k = live[s].pop(rng.randrange(len(live[s])))
            if rng.random() < 0.3:  # used on the next stage's stream: its free waits on an event
                nxt = streams[1 + (step + 1) % 9]
                rec.call(lambda k=k, nxt=nxt: a.record_stream(rec.where[k], nxt))
            rec.free(k)
        if step % 7 == 6:
            rec.call(lambda: a.complete_events(process=True))
        if step % 40 == 39:
            rec.call(a.empty_cache)
    snap = rec.snapshot(time_us=False)
    return {"segments": snap["segments"], "device_traces": snap["device_traces"]}


def training_10k() -> dict[str, Any]:
    """A training loop recorded in a 10,000-entry ring: the trace starts mid-run."""
    clock = _microseconds(42)
    a = CachingAllocator(
        24 * GIB,
        "",
        address_provider=DescendingAddresses(0x7F4000000000),
        trace_max_entries=10_000,
        clock=clock,
    )
    rec = _Recorder(a, seed=42, clock=clock)
    ops = training_loop(
        shape=SMALL, batch=4, iterations=40, min_seq=128, max_seq=1024, seed=5
    ).ops()
    rec.run_ops(ops, stop_at=6_000)
    rec.call(a.empty_cache)  # a cache flush mid-run: segment_free entries, then regrowth
    rec.run_ops(ops, stop_at=14_000)
    snap = rec.snapshot()
    assert len(snap["device_traces"][0]) == 10_000
    return snap


STANDINS: dict[str, Callable[[], dict[str, Any]]] = {
    "standin__expandable_oom_3dev.pickle": expandable_oom_3dev,
    "standin__streams10.pickle": streams10,
    "standin__training_10k.pickle": training_10k,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, make in STANDINS.items():
        data = pickle.dumps(make(), protocol=4)
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_bytes() != data:
                stale.append(name)
            continue
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        print(f"{path.relative_to(OUT.parents[2])}: {len(data):,} bytes")
    if stale:
        print("stale stand-ins (run tools/make_standins.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
