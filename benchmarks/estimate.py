"""How long does `gpumemviz.estimate` take for a GPT-2-medium step? Target: under 10 s here.

The model is tests/gpt_shaped.py's GPT-2-medium shape (d_model 1024, 24 layers, 16 heads,
d_ff 4096, vocabulary 10,000), the one the real-trace comparison uses. Rows: the recorded
inference step (batch 4, context 128) and a training step with AdamW (batch 4, context 512).
The baseline is the same step run on the meta device without gpumemviz ("bare meta"): what
any meta-device estimator pays. "meta run" is gpumemviz's recording of it (dispatch mode,
storage finalizers, the CUDA paths), "drive" the allocator model (peak pass, the pass to the
peak for the snapshot, the fragmentation report), "estimate" the whole call. Then `max_batch`
for the training step on 79 GiB, both settings. CPU seconds (time.process_time), best of the
repetitions, after one warm-up call (the first meta run in a process also imports torch's
Python meta kernels: a few seconds more, shown as "first call").

Run: .venv/bin/python benchmarks/estimate.py [--quick]
"""

from __future__ import annotations

import sys
import time

import torch

from _common import REPO, best, quick_or_full, run_main

sys.path.insert(0, str(REPO / "tests"))

from gpt_shaped import MEDIUM, inference_step, make_setup, training_step
from gpumemviz.estimator import estimate, max_batch
from gpumemviz.estimator.extras import cuda_paths

TARGET_S = 10.0


def bare(step, setup) -> None:
    state = setup(torch.device("meta"))
    with cuda_paths():
        step(state)


def main() -> None:
    reps, _ = quick_or_full(__doc__)
    t0 = time.process_time()
    estimate(inference_step, setup=make_setup(MEDIUM, 4, 128))
    first = time.process_time() - t0
    print(f"first call (imports torch's meta kernels): {first:.2f} s")
    print(
        f"{'GPT-2 medium step':<32} {'events':>7} {'bare meta s':>11} {'meta run s':>10} "
        f"{'drive s':>8} {'estimate s':>10} {'/bare':>6} {'/target':>8}"
    )
    rows = (
        ("inference, batch 4, context 128", inference_step, make_setup(MEDIUM, 4, 128)),
        (
            "training, batch 4, context 512",
            training_step,
            make_setup(MEDIUM, 4, 512, train=True),
        ),
    )
    for name, step, setup in rows:
        t_bare = best(lambda s=step, u=setup: bare(s, u), reps)
        found: list = []

        def run(s=step, u=setup, out=found) -> None:
            out.append(estimate(s, setup=u, capacity="80GiB"))

        t_est = best(run, reps)
        est = found[-1]
        print(
            f"{name:<32} {len(est.step_allocs):>7,} {t_bare:>11.2f} {est.meta_seconds:>10.2f} "
            f"{est.drive_seconds:>8.2f} {t_est:>10.2f} {t_est / t_bare:>5.2f}x "
            f"{t_est / TARGET_S:>7.2f}x"
        )
    t0 = time.process_time()
    fit = max_batch(
        lambda b: (training_step, make_setup(MEDIUM, b, 512, train=True)),
        capacity="79GiB",
        arch="9.0",
        start=8,
    )
    t_fit = time.process_time() - t0
    print(
        f"max_batch, training, context 512, 79 GiB: {dict(fit)} in {t_fit:.2f} s "
        f"({fit.meta_runs} meta runs; {t_fit / TARGET_S:.2f}x the one-estimate target)"
    )
    print(
        "events: the step's allocations; meta run and drive: the last estimate's own timers "
        "(wall clock); /bare: estimate over the bare meta run; /target: over 10 s. CPU times."
    )


if __name__ == "__main__":
    run_main(main, __doc__)
