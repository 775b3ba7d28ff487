"""growth.py and forecast.py: a leak planted in a model-made training loop is found at its line
with its rate, a clean loop has no suspect; the time to OOM of a leak riding a training
sawtooth is forecast within 20 % of when the allocator model runs out, and a flat run or a
sawtooth without net growth gets no forecast."""

from __future__ import annotations

import numpy as np
import pytest

from gpumemviz.allocator.model import CachingAllocator
from gpumemviz.allocator.oom import OutOfMemory
from gpumemviz.analysis.findings import analyze
from gpumemviz.analysis.forecast import MIN_SAMPLES, forecast
from gpumemviz.analysis.growth import find_steps
from gpumemviz.io import load_snapshot

MiB, GiB = 1 << 20, 1 << 30
TORCH = {"filename": "/x/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}
LEAK_LINE = 88


class Loop:
    """The allocator model driven like a training loop, each alloc with its stack (torch's
    frames, innermost first), as `_snapshot()` records them."""

    def __init__(self, capacity: int, step_us: int = 500_000) -> None:
        self.now = 1_700_000_000_000_000
        self.step_us = step_us
        self.model = CachingAllocator(capacity, clock=lambda: self.now)
        self.stacks: list[list[dict]] = []
        self.live: dict[int, list[dict]] = {}

    def malloc(self, size: int, line: int) -> int:
        self.now += 100
        addr = self.model.malloc(size)
        stack = [TORCH, {"filename": "/w/train.py", "line": line, "name": "train_step"}]
        self.stacks.append(stack)
        self.live[addr] = stack
        return addr

    def free(self, addr: int) -> None:
        self.now += 100
        self.model.free(addr)

    def snapshot(self) -> dict:
        d = self.model.snapshot(record=False)
        stacks = iter(self.stacks)
        for e in d["device_traces"][0]:
            if e["action"] == "alloc":
                e["frames"] = next(stacks)
        for s in d["segments"]:
            for b in s["blocks"]:
                allocated = b["state"] == "active_allocated"
                b["frames"] = self.live.get(b["address"], []) if allocated else []
        return d


def train(loop: Loop, steps: int, *, leak_from: int | None, act: int, leak: int) -> int:
    """`steps` training steps (all that fit: an OOM ends the loop); returns the steps done.
    Each step: free last step's grads, three activations and an output (line 88), a loss,
    grads; the optimizer state once. From step `leak_from` a list keeps each step's output
    (`leak` bytes), as ``history.append(out)`` would."""
    for _ in range(4):
        loop.malloc(32 * MiB, 10)  # parameters
    grads: list[int] = []
    for step in range(1, steps + 1):
        try:
            for g in grads:
                loop.free(g)
            acts = [loop.malloc(act, 20 + i) for i in range(3)]
            out = loop.malloc(leak, LEAK_LINE)
            loss = loop.malloc(512, 90)
            grads = [loop.malloc(32 * MiB, 95) for _ in range(4)]
            if leak_from is None or step < leak_from:
                loop.free(out)
            for x in acts:
                loop.free(x)
            loop.free(loss)
            if step == 1:
                for _ in range(8):
                    loop.malloc(32 * MiB, 99)  # the optimizer state, kept
        except OutOfMemory:
            return step - 1
        loop.now += loop.step_us
    return steps


def _run(steps: int, leak_from: int | None, capacity: int = 80 * GiB) -> dict:
    loop = Loop(capacity)
    train(loop, steps, leak_from=leak_from, act=48 * MiB, leak=64 * MiB)
    return loop.snapshot()


def test_a_planted_leak_is_found_at_its_line_with_its_rate():
    f = analyze(_run(12, leak_from=3))
    assert f.steps is not None and f.steps.period == 9  # 3 acts, out, loss, 4 grads
    (s,) = f.growth
    assert s.frame == f"/w/train.py:{LEAK_LINE}"
    assert abs(s.bytes_per_step - 64 * MiB) <= 0.1 * 64 * MiB
    assert s.since_step == 3
    assert "per step at train.py:88:train_step, kept since step 3" in s.sentence
    life = {x.frame: x for x in f.lifetimes}
    assert life["/w/train.py:88"].forever == 10  # steps 3..12
    assert life["/w/train.py:20"].within_step == 12 and life["/w/train.py:20"].forever == 0
    d = f.to_dict()
    assert d["growth"][0]["frame"] == "/w/train.py:88" and d["growth"][0]["since_step"] == 3


def test_a_clean_training_trace_has_no_suspect():
    f = analyze(_run(12, leak_from=None))
    assert f.steps is not None and len(f.steps.starts) == 12
    assert f.growth == () and f.to_dict()["growth"] == []


def test_a_trace_without_repeated_steps_has_no_steps():
    loop = Loop(80 * GiB)
    for i in range(30):
        loop.malloc((i + 1) * MiB, 100 + i)
    f = analyze(loop.snapshot())
    assert f.steps is None and f.growth == ()
    assert find_steps(load_snapshot(loop.snapshot()).traces[0]) is None


def _until_oom(capacity: int, leak_from: int | None, steps: int) -> tuple[Loop, int]:
    loop = Loop(capacity)
    done = train(loop, steps, leak_from=leak_from, act=256 * MiB, leak=32 * MiB)
    return loop, done


def test_forecast_of_a_leak_riding_a_sawtooth_is_within_20_percent():
    capacity = 4 * GiB
    full, done = _until_oom(capacity, leak_from=1, steps=10_000)
    assert 50 < done < 10_000  # it did run out
    oom_us = full.now
    half, _ = _until_oom(capacity, leak_from=1, steps=done // 2)
    d = half.snapshot()
    f = analyze(d, device_total=capacity, check=False)
    assert f.forecast is not None
    last_us = d["device_traces"][0][-1]["time_us"]
    actual = (oom_us - last_us) / 1e6
    assert abs(f.forecast.seconds - actual) <= 0.2 * actual, (f.forecast.seconds, actual)
    assert f.forecast.low <= f.forecast.seconds <= f.forecast.high
    assert f.forecast.steps == pytest.approx(f.forecast.seconds / 0.5008, rel=0.05)
    assert f.to_dict()["forecast"]["seconds"] == f.forecast.seconds
    assert analyze(d, check=False).forecast is None  # capacity unknown: no forecast


def test_no_forecast_for_a_sawtooth_without_growth_or_a_flat_run():
    capacity = 4 * GiB
    loop, done = _until_oom(capacity, leak_from=None, steps=60)
    assert done == 60
    assert analyze(loop.snapshot(), device_total=capacity, check=False).forecast is None
    flat = Loop(capacity)
    for _ in range(60):
        flat.now += 500_000
        flat.free(flat.malloc(64 * MiB, 7))
    assert analyze(flat.snapshot(), device_total=capacity, check=False).forecast is None


@pytest.mark.parametrize("period", [5.0, 7.3, 37.0, 90.0])
def test_forecast_rule_on_sampled_sawtooths(period):
    rng = np.random.default_rng(0)
    t = np.arange(0, 600, 0.1)
    saw = 10 * GiB + 2 * GiB * ((t % period) / period) + rng.normal(0, 50 * MiB, len(t))
    assert forecast(t, saw, 40 * GiB) is None  # no net growth: the interval holds zero
    grow = 8 * MiB
    f = forecast(t, saw + grow * t, 40 * GiB)
    assert f is not None
    actual = (40 * GiB - 12 * GiB) / grow - 600  # when the peaks reach the capacity
    assert abs(f.seconds - actual) <= 0.2 * actual
    assert forecast(t, np.full(len(t), 5 * GiB) + rng.normal(0, MiB, len(t)), 40 * GiB) is None


def test_forecast_needs_enough_samples_and_a_capacity():
    t = np.arange(MIN_SAMPLES - 1, dtype=float)
    assert forecast(t, t * MiB, GiB) is None
    t = np.arange(100, dtype=float)
    assert forecast(t, t * MiB, None) is None
    assert forecast(t, t * MiB, 50 * MiB) is None  # already past it


def test_step_markers_set_the_steps_where_the_file_has_them():
    loop = Loop(80 * GiB)
    ends = []
    for _ in range(6):  # each step ends with an Optimizer.step scope, as record_function marks it
        a = loop.malloc(8 * MiB, 20)
        loop.free(a)
        loop.now += 1000
        ends.append(loop.now)
        loop.now += 1000
    d = loop.snapshot()
    d["external_annotations"] = [
        {"name": "Optimizer.step#AdamW.step", "stage": stage, "device": 0, "time_us": t + dt}
        for t in ends
        for stage, dt in (("START", -500), ("END", 0))
    ]
    f = analyze(d, check=False)
    assert f.steps is not None and f.steps.basis == "the ends of Optimizer.step"
    assert len(f.steps.starts) == 5  # the last end has no entry after it
    assert f.steps.period == 1
