"""`estimate(..., warmup=N)`: the measured step meets the warmed-up cache, as in a program that
runs N steps first; and `max_batch` finds an affine start by itself."""

from __future__ import annotations

import pytest
import torch

from gpumemviz.estimator import estimate, max_batch
from gpumemviz.estimator.record import ALLOC, FREE
from gpumemviz.estimator.run import record_step

NO_WORKSPACE = ":0:0"  # the two ways of warming up place cuBLAS workspaces differently


def _setup(device):
    with torch.device(device):
        model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))
        batch = torch.randn(32, 256)
    return model, torch.optim.AdamW(model.parameters()), batch


def _step(state):
    model, opt, batch = state
    model(batch).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_warmup_runs_until_steady_and_drives_the_rest():
    rec = record_step(_step, setup=_setup, warmup=5)
    # AdamW's first step makes its state; the second and third allocate the same
    assert len(rec.run_starts) == 3 and rec.repeats == 4
    est = estimate(_step, setup=_setup, warmup=5, cublas_workspace_config=NO_WORKSPACE)
    assert est.runs == 3 and est.repeats == 4

    def warmed_in_setup(device):  # the documented workaround: warm up inside setup
        state = _setup(device)
        for _ in range(5):
            _step(state)
        return state

    by_hand = estimate(_step, setup=warmed_in_setup, cublas_workspace_config=NO_WORKSPACE)
    assert est.start_allocated == by_hand.start_allocated
    assert est.start_reserved == by_hand.start_reserved
    assert est.start_segments == by_hand.start_segments
    assert est.step_allocs == by_hand.step_allocs
    assert est.segments == by_hand.segments
    assert est.peak_allocated - est.start_allocated == by_hand.peak_allocated - (
        by_hand.start_allocated
    )
    # the peaks are the measured step's (as after torch.cuda.reset_peak_memory_stats)
    assert est.peak_reserved <= by_hand.peak_reserved


def test_folded_gradient_accumulation_leaks_nothing_across_steps():
    def setup(device):
        with torch.device(device):
            return torch.nn.Linear(64, 64, bias=False), torch.randn(8, 64)

    def step(state):
        lin, x = state
        y = lin(x)
        (y + y * 2 + y.exp()).sum().backward()  # y's gradient accumulated three times

    rec = record_step(step, setup=setup, warmup=3)
    held = 0
    at_end = []
    for i, e in enumerate(rec.events):
        held += e.size if e.kind == ALLOC else -e.size if e.kind == FREE else 0
        if i + 1 in rec.run_starts[1:]:
            at_end.append(held)
    assert rec.in_place >= 2
    assert len(set(at_end)) == 1  # every run ends holding what the one before held


def test_warmup_arguments():
    with pytest.raises(ValueError, match="warmup needs a setup"):
        estimate(lambda d: None, warmup=2)
    with pytest.raises(ValueError, match="warmup must be a number of steps"):
        estimate(_step, setup=_setup, warmup=-1)


def test_max_batch_fits_from_the_next_batch_when_the_first_takes_another_path():
    def make(batch):
        def step(device):
            x = torch.empty(batch, 1 << 18, device=device)
            if batch > 1:  # a path the smallest batch does not take: one more copy
                x = x.clone()
            return torch.cat([x, x])

        return step, None

    fit = max_batch(make, capacity="400MiB", configs=("",))
    exhaustive = max_batch(make, capacity="400MiB", configs=("",), extrapolate=False)
    assert fit[""] == exhaustive[""] > 1
    assert fit.meta_runs <= 4 < exhaustive.meta_runs
