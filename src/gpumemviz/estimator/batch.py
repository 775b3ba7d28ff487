"""`max_batch(make, capacity=, configs=)`: the largest batch that fits, per allocator setting.

Each batch size is run on the meta device once; every allocator setting then drives the same
recording through the model, so trying two settings costs one meta run per batch, not two.
The search doubles the batch until one fails, then bisects between the last that fits and the
first that does not: it assumes memory does not shrink as the batch grows.

Most steps allocate the same tensors at every batch size, each of a size affine in the batch
(activations, logits). With `extrapolate` (the default), two batches are run on meta and every
other batch's recording from the first of them up is computed from them; each setting's
answer is then run on meta for real. The fit is taken from the batches `2 * start` and
`3 * start` first (a step's smallest batch often takes another path: a kernel that skips a
copy at batch 1), else from `start` and `2 * start`. Where an answer's real sizes differ from
the computed ones only past some batch (a kernel's scratch reaching its cap), the answer is
walked to the real one with a meta run per batch. A search then costs two meta runs plus one
or two per answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from gpumemviz.estimator.drive import fits
from gpumemviz.estimator.record import StepRecording
from gpumemviz.estimator.result import Estimate
from gpumemviz.estimator.run import check_args, estimate_recording, record_step, resolve_facts
from gpumemviz.snapshot.escaping import short_repr
from gpumemviz.snapshot.units import format_size

__all__ = ["MaxBatch", "max_batch"]

Make = Callable[[int], tuple[Callable[[Any], Any], Callable[[Any], Any] | None]]


class MaxBatch(Mapping[str, int]):
    """Allocator setting -> the largest batch that fits (0: not even the smallest tried).

    `estimates[config]` is the full `Estimate` at that batch (None for 0); `capacity` the
    bytes it was bisected under; `meta_runs` how many batch sizes ran on meta. ``str()`` shows
    the settings side by side.
    """

    def __init__(
        self,
        batches: dict[str, int],
        estimates: dict[str, Estimate | None],
        capacity: int,
        meta_runs: int,
        limit: int,
    ) -> None:
        self._batches = batches
        self.estimates = estimates
        self.capacity = capacity
        self.meta_runs = meta_runs
        self.limit = limit

    def __getitem__(self, config: str) -> int:
        return self._batches[config]

    def __iter__(self) -> Iterator[str]:
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)

    def __repr__(self) -> str:
        return f"MaxBatch({self._batches!r}, capacity={self.capacity})"

    def __str__(self) -> str:
        width = max(len("setting"), *(len(c or "default") for c in self._batches))
        head = f"{'setting':<{width}}  {'batch':>6}  {'peak allocated':>15}  {'peak reserved':>14}"
        lines = [f"largest batch that fits in {format_size(self.capacity)}:", head]
        for config, batch in self._batches.items():
            est = self.estimates[config]
            more = "" if batch < self.limit else "+"
            if est is None:
                lines.append(f"{config or 'default':<{width}}  {batch:>6}")
                continue
            lines.append(
                f"{config or 'default':<{width}}  {str(batch) + more:>6}  "
                f"{format_size(est.peak_allocated):>15}  {format_size(est.peak_reserved):>14}"
            )
        return "\n".join(lines)


def max_batch(
    make: Make,
    *,
    capacity: int | str,
    configs: Sequence[str] = ("", "expandable_segments:True"),
    arch: str | None = None,
    start: int = 1,
    limit: int = 1 << 16,
    cublas_workspace_config: str | None = None,
    cuda_paths: bool = True,
    extrapolate: bool = True,
    warmup: int | None = None,
    sm_count: int | None = None,
) -> MaxBatch:
    """The largest batch that fits in `capacity`, for each allocator setting, by bisection.

    Parameters
    ----------
    make : callable
        ``make(batch)`` returns ``(step, setup)`` as `estimate` takes them (`setup` may be
        None).
    capacity : int or str
        Bytes the process can get ("79GiB").
    configs : sequence of str
        ``PYTORCH_CUDA_ALLOC_CONF`` settings to compare ("" is the default).
    arch, cublas_workspace_config, cuda_paths, warmup, sm_count
        As in `estimate`.
    start, limit : int
        The smallest batch tried, and the largest (a setting that fits `limit` reports it).
    extrapolate : bool
        Compute the recordings of the batches tried from two meta runs where the step's
        allocation sizes are affine in the batch (checked on each answer; module docstring).

    Returns
    -------
    MaxBatch
        A mapping of each setting to its largest batch; ``str()`` compares them side by side.

    Examples
    --------
    >>> import torch
    >>> def make(batch):
    ...     def step(device):
    ...         x = torch.empty(batch, 1 << 20, device=device)  # 4 MiB per sample
    ...         return torch.cat([x, x])
    ...     return step, None
    >>> fit = max_batch(make, capacity="100MiB", configs=("",))
    >>> fit[""]  # 12 MiB per sample (x and the cat): 8 x 12 MiB = 96 MiB
    8
    """
    if not callable(make):
        raise TypeError(f"make must be callable, got {type(make).__name__}")
    if isinstance(configs, str):
        raise ValueError(
            f"configs must be a sequence of settings, got the string {short_repr(configs)}"
        )
    for name, v in (("start", start), ("limit", limit)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {short_repr(v)}")
    if limit < start:
        raise ValueError(f"limit {limit} is below start {start}")
    facts = resolve_facts(arch, sm_count)
    parsed = {c: check_args(capacity, c, facts.arch, cublas_workspace_config) for c in configs}
    real: dict[int, tuple[StepRecording, bool]] = {}
    model: list[Callable[[int], StepRecording | None] | None] = [None]
    fit_from = [start]  # the smallest batch the model computes

    def run_meta(batch: int) -> tuple[StepRecording, bool]:
        if batch not in real:
            made = make(batch)
            if not isinstance(made, tuple) or len(made) != 2:
                raise ValueError(f"make({batch}) must return (step, setup), got {short_repr(made)}")
            step, setup = made
            rec = record_step(step, setup=setup, cuda_paths=cuda_paths, warmup=warmup, facts=facts)
            real[batch] = (rec, setup is not None and warmup is None)
        return real[batch]

    def recording(batch: int) -> tuple[StepRecording, bool]:
        at = model[0]
        if batch not in real and at is not None and batch >= fit_from[0]:
            rec = at(batch)
            if rec is not None:
                return rec, real[fit_from[0]][1]
        return run_meta(batch)

    def ok_real(batch: int, *, config: str) -> bool:
        cap, conf, ws = parsed[config]
        rec, warm = run_meta(batch)
        return fits(rec, capacity=cap, config=conf, workspace=ws, warm=warm)

    def ok(batch: int, *, config: str) -> bool:
        cap, conf, ws = parsed[config]
        rec, warm = recording(batch)
        return fits(rec, capacity=cap, config=conf, workspace=ws, warm=warm)

    made = make(start)  # checked first: building the step is cheap, recording it is not
    if not isinstance(made, tuple) or len(made) != 2:
        raise ValueError(f"make({start}) must return (step, setup), got {short_repr(made)}")
    if extrapolate:
        # from the second and third batches first: the smallest often takes another path
        for a, b in ((2 * start, 3 * start), (start, 2 * start)):
            if b > limit:
                continue
            model[0] = _affine(a, run_meta(a)[0], b, run_meta(b)[0])
            if model[0] is not None:
                fit_from[0] = a
                break
    batches: dict[str, int] = {}
    estimates: dict[str, Estimate | None] = {}
    configs = list(configs)
    i = 0
    while i < len(configs):
        config = configs[i]
        check = partial(ok, config=config)
        low = fit_from[0]  # batches below the fit are searched only if it does not fit
        best = _largest(check, low, limit) if check(low) else _largest(check, start, low - 1)
        batches[config] = best
        estimates[config] = None
        if best:
            guess = recording(best)[0]
            rec, warm = run_meta(best)
            if model[0] is not None and [e.size for e in guess.events] != [
                e.size for e in rec.events
            ]:
                # the sizes stop being affine somewhere (a kernel's scratch reaching its cap):
                # walk from the computed answer with real runs to the real one
                best = _walk(partial(ok_real, config=config), best, start, limit)
                batches[config] = best
                if not best:
                    i += 1
                    continue
                rec, warm = run_meta(best)
            cap, conf, ws = parsed[config]
            estimates[config] = estimate_recording(
                rec, capacity=cap, config=conf, workspace=ws, warm=warm, arch=facts.arch
            )
        i += 1
    capacity_bytes = parsed[configs[0]][0] if configs else 0
    return MaxBatch(batches, estimates, capacity_bytes, len(real), limit)


def _affine(
    a: int, ra: StepRecording, b: int, rb: StepRecording
) -> Callable[[int], StepRecording | None] | None:
    """`at(n)`: the recording at batch n where every event's size is affine in the batch (the
    same events in the same order at batches a and b), None at an n that gives a fraction or a
    negative size; None when the two recordings differ in anything but sizes."""
    ea, eb = ra.events, rb.events
    if len(ea) != len(eb) or ra.fake_ops != rb.fake_ops:
        return None
    if (ra.run_starts, ra.repeats) != (rb.run_starts, rb.repeats):
        return None
    for x, y in zip(ea, eb, strict=True):
        if (x.kind, x.key, x.op, x.phase, x.blas) != (y.kind, y.key, y.op, y.phase, y.blas):
            return None
    slopes = [y.size - x.size for x, y in zip(ea, eb, strict=True)]
    span = b - a

    def at(n: int) -> StepRecording | None:
        events = []
        for x, d in zip(ea, slopes, strict=True):
            if d == 0:
                events.append(x)
                continue
            grown, rest = divmod(d * (n - a), span)
            if rest or x.size + grown < 0:
                return None
            events.append(replace(x, size=x.size + grown))
        return StepRecording(
            events=events,
            fake_ops=dict(ra.fake_ops),
            ops=ra.ops,
            notes=list(ra.notes),
            run_starts=list(ra.run_starts),
            repeats=ra.repeats,
        )

    return at


def _walk(ok: Callable[[int], bool], guess: int, start: int, limit: int) -> int:
    """The largest b in [start, limit] with ok(b), walking from `guess` one batch at a time
    (ok monotone); 0 when none."""
    if ok(guess):
        while guess < limit and ok(guess + 1):
            guess += 1
        return guess
    while guess > start and not ok(guess - 1):
        guess -= 1
    return guess - 1 if guess > start else 0


def _largest(ok: Callable[[int], bool], start: int, limit: int) -> int:
    """The largest b in [start, limit] with ok(b), assuming ok is monotone; 0 when none."""
    if not ok(start):
        return 0
    good, bad = start, None
    b = start
    while bad is None:
        nxt = min(b * 2, limit)
        if nxt == b:
            return b
        if ok(nxt):
            good = b = nxt
        else:
            bad = nxt
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good
