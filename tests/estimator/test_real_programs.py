"""The eight GPT-2-medium recordings of one public program, estimated as the program is written
(its autocast, its five warm-up steps, the recording GPU's arch): the acceptance bounds of
docs/estimate.md. The first file ships in tests/data/real; the other seven are read from
../shared/real-snapshots-licensed/ where it is checked out (they have no golden replay record
in tests/data yet), and skipped otherwise.

A second program holds the same bounds, so the estimator is not fitted to the first one's habits:
another student's forward step (tests/silmont_shaped.py), whose recording ships in
tests/data/real and runs in every clone."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from gpt_shaped import MEDIUM, inference_step, make_setup, training_step
from gpumemviz.estimator import estimate
from recordings import FILES, NAME, SECOND, find, recorded
from silmont_shaped import GPT2_SMALL, forward_step
from silmont_shaped import make_setup as silmont_setup

MiB = 1 << 20


def _path(context: int, kind: str) -> Path:
    path = find(context, kind)
    if path is None:
        name = NAME.format(context=context, kind=kind)
        pytest.skip(f"{name} is neither in tests/data/real nor in ../shared")
    return path


@pytest.mark.parametrize(("context", "kind", "autocast"), FILES, ids=lambda v: str(v))
def test_the_program_as_written_is_within_the_bounds(context, kind, autocast):
    rec = recorded(_path(context, kind))
    sizes, start, peak = rec.sizes, rec.start, rec.peak
    train = kind == "training"
    est = estimate(
        training_step if train else inference_step,
        setup=make_setup(
            MEDIUM, 4, context, train=train, autocast=autocast, program_optimizer=True
        ),
        arch="8.0",
        warmup=5,
    )
    assert est.notes == ()  # autocast is modelled: nothing ran unmodelled
    matcher = difflib.SequenceMatcher(None, sizes, list(est.step_allocs), autojunk=False)
    blocks = matcher.get_matching_blocks()
    assert sum(b.size for b in blocks) / len(sizes) >= 0.98
    assert abs(est.peak_allocated / peak - 1) <= 0.01
    assert abs(est.peak_reserved / rec.reserved - 1) <= 0.02
    assert abs(est.segments / rec.segments - 1) <= 0.05
    assert abs((est.peak_allocated - est.start_allocated) / (peak - start) - 1) <= 0.03
    if (context, kind) == (1024, "training"):
        # the 32 MiB staging buffers of autograd's sum_to reductions, at their positions
        staged = [i for i, s in enumerate(sizes[:-1]) if (s, sizes[i + 1]) == (32 * MiB, 32)]
        matched = {b.a + k for b in blocks for k in range(b.size)}
        assert len(staged) == 49 and all(i in matched for i in staged)


def test_a_second_program_as_written_is_within_the_bounds():
    """silmont2000/assignment2-systems' GPT-2-small forward step, fp32 under `no_grad`, batch 4,
    context 128, recorded after six steps (five warm-up, one timed) on a pre-Hopper GPU."""
    rec = recorded(SECOND)
    sizes, start, peak = rec.sizes, rec.start, rec.peak
    # built on the device, not on the CPU as the program does: the same figures, 5 times faster
    setup = silmont_setup(GPT2_SMALL, 4, 128)
    est = estimate(forward_step, setup=setup, arch="8.0", warmup=6)
    assert est.notes == ()
    matcher = difflib.SequenceMatcher(None, sizes, list(est.step_allocs), autojunk=False)
    assert sum(b.size for b in matcher.get_matching_blocks()) / len(sizes) >= 0.98
    assert list(est.step_allocs) == sizes  # all 681, in order: the reproduction is the program
    assert abs(est.peak_allocated / peak - 1) <= 0.01
    assert abs(est.peak_reserved / rec.reserved - 1) <= 0.02
    assert abs(est.segments / rec.segments - 1) <= 0.05
    assert abs((est.peak_allocated - est.start_allocated) / (peak - start) - 1) <= 0.03
