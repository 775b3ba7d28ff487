"""How close is `gpumemviz.estimate` to real recordings of the program it estimates?

The eight licensed recordings of one public program (Wedsonlin/assignment2-systems at commit
8630bcfe, cs336_systems/nsys_profile.py run by scripts/run_profile_configs.sh; provenance in
tests/data/real/PROVENANCE.md and ../shared/real-snapshots-PROVENANCE.md): GPT-2 medium
(d_model 1024, d_ff 4096, 24 layers, 16 heads, vocabulary 10,000) at batch 4 and contexts 128,
256, 512 and 1024, one inference and one training step each, recorded after five warm-up steps
on a GPU with the pre-Hopper cuBLAS workspace (8 MiB + 128 KiB, visible in the files).

The program is reproduced as written in tests/gpt_shaped.py (its model, its own loss and AdamW,
its inputs kept as it keeps them) and estimated with what the program does: `warmup=5`, the
recording GPU's `arch="8.0"`, and `torch.autocast("cuda", dtype=torch.bfloat16)` around the
forward (and loss) where the original ran with autocast on (the traces say which: 512
inference, 512 and 1024 training). No casts are written by hand.

Per file: peak allocated and peak reserved (the recorded step's, as after
`reset_peak_memory_stats`), segments at the allocated peak, the step's own delta (peak minus
allocated at its start), the share of recorded allocation sizes the estimate has in the same
order, the error's sign (P(estimate < real) over the files, as the xMem paper reports it) and
the seconds per `estimate` call (median of 3 after a first call; --quick: one).

A second program, so the figures are not those of an estimator fitted to one program: another
student's CS336 assignment 2 (silmont2000/assignment2-systems at commit 0f94da4e,
cs336_systems/benchmark.py), whose recording memory_forward_fp32_128.pickle ships in
tests/data/real: a GPT-2-small forward step of their own model (d_model 768, 12 layers,
vocabulary 10,000), fp32 under `torch.no_grad()`, batch 4, context 128, after five warm-up steps
and one timed step (`warmup=6`), on a GPU with the pre-Hopper workspace. tests/silmont_shaped.py
reproduces it.

Run: .venv/bin/python benchmarks/estimate_accuracy.py [--quick]
"""

from __future__ import annotations

import argparse
import difflib
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from _common import REPO

sys.path.insert(0, str(REPO / "tests"))

from gpt_shaped import MEDIUM, inference_step, make_setup, training_step
from gpumemviz.estimator import Estimate, estimate
from recordings import FILES, NAME, SECOND, find, recorded
from silmont_shaped import GPT2_SMALL, forward_step
from silmont_shaped import make_setup as silmont_setup


def run(context: int, kind: str, autocast: bool) -> Estimate:
    train = kind == "training"
    setup = make_setup(MEDIUM, 4, context, train=train, autocast=autocast, program_optimizer=True)
    step = training_step if train else inference_step
    return estimate(step, setup=setup, capacity="80GiB", arch="8.0", warmup=5)


def run_second() -> Estimate:
    """The second program's forward step as written: fp32, six steps before the recorded one."""
    setup = silmont_setup(GPT2_SMALL, 4, 128)  # built on the device: the same figures, faster
    return estimate(forward_step, setup=setup, capacity="80GiB", arch="8.0", warmup=6)


def row(name: str, path: Path, run_once: Callable[[], Estimate], reps: int) -> bool:
    """Print one file's row (and the estimate's notes); True when the estimate of the peak is
    below the recording."""
    real = recorded(path)
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        est = run_once()
        seconds.append(time.perf_counter() - t0)
    sizes = real.sizes
    blocks = difflib.SequenceMatcher(None, sizes, list(est.step_allocs), autojunk=False)
    in_order = sum(b.size for b in blocks.get_matching_blocks()) / len(sizes)
    peak, start, reserved, segments = real.peak, real.start, real.reserved, real.segments
    delta = (est.peak_allocated - est.start_allocated) / (peak - start) - 1
    print(
        f"{name:<22} {est.peak_allocated / peak - 1:>+10.3%} "
        f"{est.peak_reserved / reserved - 1:>+9.3%} "
        f"{f'{est.segments} / {segments}':>13} {delta:>+8.3%} {in_order:>8.1%} "
        f"{'<' if est.peak_allocated < peak else '>=':>5} "
        f"{statistics.median(seconds):>7.2f}"
    )
    for note in est.notes:
        print(f"{'':<22} note: {note}")
    return est.peak_allocated < peak


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one timed call per file")
    reps = 1 if parser.parse_args().quick else 3
    run(128, "inference", False)  # the first call in a process imports torch's meta kernels
    head = (
        f"{'file':<22} {'peak alloc':>10} {'reserved':>9} {'segments':>13} {'delta':>8} "
        f"{'in order':>8} {'sign':>5} {'s/call':>7}"
    )
    print(head)
    under = total = 0
    for context, kind, autocast in FILES:
        name = f"{kind} {context}" + (" bf16" if autocast else "")
        path = find(context, kind)
        if path is None:
            print(f"{name:<22} skipped: {NAME.format(context=context, kind=kind)} not found")
            continue
        total += 1
        under += row(name, path, partial(run, context, kind, autocast), reps)
    if total:
        print(f"P(estimate < real) over {total} files: {under / total:.2f}")
    print("second program (silmont2000/assignment2-systems):")
    row("forward 128 (small)", SECOND, run_second, reps)


if __name__ == "__main__":
    main()
