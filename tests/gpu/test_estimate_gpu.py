"""One small step run for real on the GPU and compared with its estimate (skipped without CUDA).

The same GPT-shaped model (tests/gpt_shaped.py) is built on the GPU in a fresh process, warmed
up, then one step is recorded with torch's memory history; `gpumemviz.estimate` predicts it
from the meta device with the GPU's own compute capability. The bounds are those the real-trace
comparison in tests/test_estimate.py holds: at least 90 % of the alloc sizes in order, the
step's allocated delta within 10 %, peak allocated within 2 %.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpt_shaped import inference_step, make_setup, training_step

SHAPE = {"d_model": 256, "d_ff": 1024, "layers": 4, "heads": 4, "vocab": 2048}


REPO = Path(__file__).resolve().parents[2]

# runs in a fresh interpreter, so no cuBLAS workspace of an earlier test is already there
_REAL = """
import json, sys
import torch
from gpt_shaped import inference_step, make_setup, training_step

shape, train = json.loads(sys.argv[1]), sys.argv[2] == "training"
step = training_step if train else inference_step
state = make_setup(shape, 8, 128, train=train)(torch.device("cuda"))
step(state)  # warm-up: cuBLAS workspaces, optimizer state
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
start = torch.cuda.memory_allocated()
torch.cuda.memory._record_memory_history(max_entries=1_000_000)
step(state)
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
trace = snap["device_traces"][torch.cuda.current_device()]
sizes = [e["size"] for e in trace if e["action"] == "alloc"]
print(json.dumps({"sizes": sizes, "start": start, "peak": torch.cuda.max_memory_allocated()}))
"""


def _real(kind: str) -> tuple[list[int], int, int]:
    """Set up on the GPU, warm up, then record one step: alloc sizes, allocated at the start,
    peak allocated."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    proc = subprocess.run(
        [sys.executable, "-c", _REAL, json.dumps(SHAPE), kind],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return got["sizes"], got["start"], got["peak"]


def _warmed(setup, step):
    def warmed(device):
        state = setup(device)
        step(state)
        return state

    return warmed


@pytest.mark.parametrize("kind", ["inference", "training"])
def test_small_step_matches_its_estimate(kind):
    import torch

    from gpumemviz.estimator import estimate

    train = kind == "training"
    step = training_step if train else inference_step
    setup = make_setup(SHAPE, 8, 128, train=train)
    sizes, start, peak = _real(kind)
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
