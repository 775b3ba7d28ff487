"""A step under torch.compile: the estimate says which regions ran eager (never silence), and
leaves torch.compile working for the program afterwards."""

from __future__ import annotations

import torch

from gpumemviz.estimator import estimate


def test_compiled_regions_are_named_in_the_notes_and_still_compile_afterwards():
    calls: list[object] = []

    def backend(gm, inputs):  # counts the graphs torch.compile hands to a backend
        calls.append(gm)
        return gm.forward

    @torch.compile(backend=backend)
    def block(x):
        return (x * 2).sin().cos() + 1

    model = torch.compile(torch.nn.Linear(64, 64), backend=backend)

    def step(device):
        x = torch.randn(256, 64, device=device)
        return block(model.to(device)(x))

    est = estimate(step, capacity="1GiB")
    assert calls == []  # nothing was compiled: the regions ran eager
    regions = [n for n in est.notes if n.startswith("torch.compile region")]
    assert len(regions) == 2
    assert any("block (" in n and "test_compile.py" in n for n in regions)
    assert all("ran eager" in n for n in regions)
    assert "ran eager" in str(est)
    # the estimate is the eager step's: every operator of block allocated
    assert len(est.step_allocs) >= 6
    # torch.compile was not turned off for these functions by the estimate
    block(torch.randn(8))
    assert len(calls) == 1
