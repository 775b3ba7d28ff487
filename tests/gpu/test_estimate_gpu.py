"""One small step run for real on the GPU and compared with its estimate (skipped without CUDA).

The same GPT-shaped model (tests/gpt_shaped.py) is built on the GPU, warmed up, then one step is
recorded with torch's memory history; `gpumemviz.estimate` predicts it from the meta device with
the GPU's own compute capability. The bounds are those the real-trace comparison in
tests/test_estimate.py holds: at least 90 % of the alloc sizes in order, the step's allocated
delta within 10 %, peak allocated within 2 %.
"""

from __future__ import annotations

import difflib

import pytest

from gpt_shaped import inference_step, make_setup, training_step

SHAPE = {"d_model": 256, "d_ff": 1024, "layers": 4, "heads": 4, "vocab": 2048}


def _real(step, setup) -> tuple[list[int], int, int]:
    """Run `setup` and one warm-up step on the GPU, then record `step`: alloc sizes, allocated
    at the start, peak allocated."""
    import torch

    dev = torch.device("cuda")
    state = setup(dev)
    step(state)  # warm-up: cuBLAS workspaces, optimizer state
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    try:
        step(state)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated()
    trace = snap["device_traces"][torch.cuda.current_device()]
    sizes = [e["size"] for e in trace if e["action"] == "alloc"]
    del state
    torch.cuda.empty_cache()
    return sizes, start, peak


def _warmed(setup, step):
    def warmed(device):
        state = setup(device)
        step(state)
        return state

    return warmed


@pytest.mark.parametrize("kind", ["inference", "training"])
def test_small_step_matches_its_estimate(kind):
    import torch

    from gpumemviz.estimate import estimate

    train = kind == "training"
    step = training_step if train else inference_step
    setup = make_setup(SHAPE, 8, 128, train=train)
    sizes, start, peak = _real(step, setup)
    major, minor = torch.cuda.get_device_capability()
    est = estimate(step, setup=_warmed(setup, step), capacity="80GiB", arch=f"{major}.{minor}")
    matcher = difflib.SequenceMatcher(None, sizes, list(est.step_allocs), autojunk=False)
    matched = sum(b.size for b in matcher.get_matching_blocks()) / max(1, len(sizes))
    delta = (est.peak_allocated - est.start_allocated) / max(1, peak - start) - 1
    peak_error = est.peak_allocated / peak - 1
    print(f"{kind}: matched {matched:.1%}, delta {delta:+.2%}, peak {peak_error:+.2%}")
    assert matched >= 0.90
    assert abs(delta) <= 0.10
    assert abs(peak_error) <= 0.02
