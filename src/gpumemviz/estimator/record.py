"""A step run on the meta device, recorded as the storage allocations and frees it makes.

`record(setup, step)` runs user code under a `TorchDispatchMode`: every operator's outputs are
looked at, each storage seen for the first time (by identity) is an allocation, and a
`weakref.finalize` on its `untyped_storage()` records the free when the storage dies, in the
order eager execution frees it. Views and in-place results share a storage already seen, so
they allocate nothing, as on CUDA. What `setup` allocates is recorded as the "setup" phase; the
storages reachable from its returned state that no operator made (tensors built outside the
dispatcher) are added to it, so all of them are live when the measured part starts.

Where meta has no kernel for an operator, its outputs' shapes come from `FakeTensorMode` (the
operator runs on fake copies of its inputs; its outputs are made as meta tensors), and the
operator is named in `StepRecording.fake_ops`. torch is imported only inside the functions here.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from gpumemviz.estimator.callers import library_dirs, user_frame

if TYPE_CHECKING:
    from gpumemviz.estimator.scratch import DeviceFacts

__all__ = ["Event", "MetaError", "StepRecording", "record"]

ALLOC, FREE, BLAS = 0, 1, 2

# Out-of-place operators that eager autograd runs in place in the backward, and that it runs
# out of place on meta tensors or under a dispatch mode (its "tensor subclass like" test,
# torch's ATen/TensorSubclassLikeUtils.h, counts both): the engine's gradient accumulation
# (`add_`), the backward of max / min / sort along a dimension (`scatter_`), of gather
# (`scatter_add_`) and of indexing (`index_put_`)
IN_PLACE_TWINS = frozenset({"add", "scatter", "scatter_add", "index_put", "_index_put_impl"})
# reductions whose CUDA kernel may take staging memory (`scratch.reduce_scratch`)
REDUCTIONS = frozenset({"sum", "mean"})


class MetaError(ValueError):
    """The step cannot run on the meta device: an operator whose output size depends on
    tensor values (nonzero, unique, `.item()`), or one with neither a meta nor a fake kernel."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


@dataclass(frozen=True, slots=True)
class Event:
    """One storage allocated (`kind` ALLOC) or freed (FREE) during the meta run, or the first
    cuBLAS operator run by a handle (BLAS: `blas` names it, "main" or "autograd" thread).

    `key` names the storage (the same for its alloc and its free); `size` is its bytes;
    `op` the operator whose output it was ("" when no operator made it) and `frame` the user's
    Python frame that called it ("file:line in function").
    """

    kind: int
    key: int
    size: int
    op: str = ""
    frame: str = ""
    phase: str = "step"
    blas: str = ""


@dataclass
class StepRecording:
    """The allocations and frees of one meta run, in order, and what was needed to get them."""

    events: list[Event] = field(default_factory=list)
    fake_ops: dict[str, int] = field(default_factory=dict)  # operator -> calls run by fake
    ops: int = 0  # operators dispatched
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the run could not model as on CUDA
    in_place: int = 0  # backward results folded into their input's storage (`record`)
    run_starts: list[int] = field(default_factory=list)  # where each run of the step starts
    repeats: int = 1  # times the last run is driven (warm-up steps it stands for, and itself)
    scratch: int = 0  # kernel launches that took scratch memory (`scratch`)

    def phase_events(self, phase: str) -> list[Event]:
        """The events of one phase ("setup" or "step")."""
        return [e for e in self.events if e.phase == phase]


def _tensors(value: Any) -> Iterator[Any]:  # Any: whatever an operator or setup returns
    """Every tensor in a (nested) value: tensors, lists, tuples, dicts, dataclasses, modules,
    optimizers."""
    import torch

    stack = [value]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, torch.Tensor):
            yield v
            if v.grad is not None:
                stack.append(v.grad)
        elif isinstance(v, list | tuple | set | frozenset):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, torch.nn.Module):
            stack.extend(v.parameters())
            stack.extend(v.buffers())
        elif is_dataclass(v) and not isinstance(v, type):
            stack.extend(getattr(v, f.name) for f in fields(v))
        elif isinstance(v, torch.optim.Optimizer):
            stack.extend(v.state.values())
            stack.extend(p for g in v.param_groups for p in g["params"])


@contextmanager
def _compiled_regions(notes: list[str]) -> Iterator[None]:
    """While inside, the torch.compile regions this thread enters run eager and are noted
    (`extras.cuda_paths` keeps dynamo from seeing them: under a dispatch mode it would skip
    the function for good)."""
    from gpumemviz.estimator.extras import compiled_regions

    compiled_regions()
    try:
        yield
    finally:
        for where in compiled_regions():
            notes.append(
                f"torch.compile region {where} ran eager: this part of the estimate is of "
                f"the eager step (Inductor's fused kernels allocate less)"
            )


def record(
    setup: Callable[[Any], Any] | None,
    step: Callable[[Any], Any],
    *,
    cuda_paths: bool = True,
    blas_ops: frozenset[str] = frozenset(),
    warmup: int | None = None,
    facts: DeviceFacts | None = None,
) -> StepRecording:
    """Run `setup` (if any) then `step` on the meta device and record their allocations.

    With `setup`, ``state = setup(device)`` runs first (phase "setup") and ``step(state)`` is
    the measured part; without, ``step(device)`` is. `cuda_paths` makes torch take the
    foreach / fused paths it takes for CUDA tensors (`extras.cuda_paths`). `blas_ops` names
    the operators (``overloadpacket`` names, e.g. "mm") that run through cuBLAS: the first one
    each handle runs is a BLAS event after its outputs.

    With `warmup` N (and a `setup`), the step runs as a program's warm-up loop runs it: again
    and again until two consecutive runs allocate the same (operator, size) sequence (an
    optimizer's first step makes its state), at most N + 1 times; `run_starts` says where each
    run's events start and `repeats` how many of the N + 1 steps the last run stands for.

    With `facts` (the GPU's SM count and threads per SM), the kernel scratch of `scratch`
    follows each reduction that takes it on CUDA: its staging buffer and semaphores,
    allocated after the output and freed when the launch returns.
    """
    import time

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from gpumemviz.estimator.extras import cuda_paths as patch_paths

    rec = StepRecording()
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    composites: dict[Any, bool] = {}  # operator -> has a CompositeImplicitAutograd kernel
    events = rec.events
    keys: dict[int, int] = {}  # StorageImpl address -> key, while the storage lives
    counter = itertools.count()
    alias: dict[int, int] = {}  # a folded result's key -> the key of the storage it took
    pending: list[tuple[int, int] | None] = [None]  # (result key, input key) to fold
    graph_task = torch._C._current_graph_task_id
    skip = library_dirs()
    phase = ["setup"]
    meta = torch.device("meta")

    def freed(cdata: int, key: int, size: int) -> None:
        if keys.get(cdata) == key:
            del keys[cdata]
        folding, pending[0] = pending[0], None
        if folding is not None and folding[1] == key and events[-1].key == folding[0]:
            # eager autograd would have written the result into this storage (in place):
            # no new allocation, and this storage lives on as the result's
            out = events.pop()
            alias[out.key] = alias.pop(key, key)
            rec.in_place += 1
            return
        if phase[0] != "done":  # what dies after the step returned is not part of it
            events.append(Event(FREE, alias.pop(key, key), size, phase=phase[0]))

    def track(t: Any, op: str) -> None:  # Any: a tensor
        if t.device.type != "meta":
            return
        s = t.untyped_storage()
        cdata = s._cdata
        if cdata in keys:
            return
        size = s.nbytes()
        key = next(counter)
        keys[cdata] = key
        pending[0] = None
        events.append(Event(ALLOC, key, size, op, user_frame(skip), phase[0]))
        weakref.finalize(s, freed, cdata, key, size)

    def fold_candidate(out: Any, args: Any) -> None:  # Any: a tensor, operator arguments
        """A backward result that eager autograd writes in place into its first input: fold
        it into that input's storage if the input dies right after (`freed`)."""
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor) or first.device.type != "meta":
            return
        if not first.is_contiguous():
            return
        src, dst = first.untyped_storage(), out.untyped_storage()
        key = keys.get(src._cdata)
        if key is None or src.nbytes() != dst.nbytes() or first.dtype != out.dtype:
            return
        if events and events[-1].kind == ALLOC and keys.get(dst._cdata) == events[-1].key:
            pending[0] = (events[-1].key, key)

    def add_scratch(name: str, args: Any) -> None:  # Any: operator arguments
        """The staging buffer and semaphores of CUDA's reduction kernel, if it takes them."""
        from gpumemviz.estimator.scratch import reduce_scratch

        x = args[0] if args else None
        if (
            facts is None
            or not isinstance(x, torch.Tensor)
            or x.device.type != "meta"
            or not x.is_floating_point()
            or not x.is_contiguous()
        ):
            return
        dims = args[1] if len(args) > 1 and args[1] is not None else range(x.dim())
        shape = list(x.shape)
        reduced = {
            d % max(1, x.dim())
            for d in (dims if isinstance(dims, list | tuple | range) else [dims])
        }
        if not reduced:
            reduced = set(range(x.dim()))
        kept = [d for d in range(x.dim()) if d not in reduced and shape[d] != 1]
        summed = [d for d in reduced if shape[d] != 1]
        if not summed:
            return
        if (kept and min(summed) > max(kept)) or not kept:
            fastest = True
        elif max(summed) < min(kept):
            fastest = False
        else:  # reduced dimensions between kept ones: a layout not modelled
            return
        outputs = 1
        for d in kept:
            outputs *= shape[d]
        inputs = x.numel() // max(1, outputs)
        acc = 8 if x.dtype == torch.float64 else 4
        staging, semaphores = reduce_scratch(
            outputs, inputs, fastest=fastest, acc_size=acc, facts=facts
        )
        if not staging:
            return
        pending[0] = None
        frame, here = user_frame(skip), phase[0]
        k1, k2 = next(counter), next(counter)
        events.append(Event(ALLOC, k1, staging, f"{name} staging", frame, here))
        events.append(Event(ALLOC, k2, semaphores, f"{name} semaphores", frame, here))
        events.append(Event(FREE, k2, semaphores, phase=here))
        events.append(Event(FREE, k1, staging, phase=here))
        rec.scratch += 1

    handles: set[str] = set()

    def fake_run(func: Any, args: Any, kwargs: Any) -> Any:  # Any: torch's operator values
        from torch._subclasses.fake_tensor import FakeTensorMode

        name = str(func.overloadpacket.__name__)
        rec.fake_ops[name] = rec.fake_ops.get(name, 0) + 1
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            flat, spec = tree_flatten((args, kwargs))
            fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in flat]
            fargs, fkwargs = spec.unflatten(fakes)
            out = func(*fargs, **fkwargs)
        outs, ospec = tree_flatten(out)
        made = [
            torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=meta)
            if isinstance(o, torch.Tensor)
            else o
            for o in outs
        ]
        return ospec.unflatten(made)

    class Recorder(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: Any = (),
            kwargs: Any = None,  # Any: torch's dispatch arguments
        ) -> Any:
            rec.ops += 1
            kwargs = kwargs or {}
            composite = composites.get(func)
            if composite is None:
                composite = composites[func] = has_kernel(func.name(), "CompositeImplicitAutograd")
            if composite:
                # under inference_mode the composite operator reaches the mode whole: run its
                # decomposition here, so its temporaries (einsum's copies) are seen as on CUDA
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            try:
                out = func(*args, **kwargs)
            except NotImplementedError as e:
                try:
                    out = fake_run(func, args, kwargs)
                except Exception:
                    raise MetaError(
                        f"aten::{func.overloadpacket.__name__} at {user_frame(skip) or '?'} "
                        f"cannot run on the meta device nor under FakeTensorMode: "
                        f"{_first_line(e)}"
                    ) from None
            name = str(func.overloadpacket.__name__)
            if isinstance(out, torch.Tensor):
                track(out, name)
                if facts is not None and name in REDUCTIONS:
                    add_scratch(name, args)
                if name in IN_PLACE_TWINS and graph_task() != -1 and not torch.is_grad_enabled():
                    fold_candidate(out, args)
            else:
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        track(t, name)
            if name in blas_ops:
                handle = "autograd" if torch._C._current_graph_task_id() != -1 else "main"
                if handle not in handles:
                    handles.add(handle)
                    frame = user_frame(skip)
                    events.append(Event(BLAS, -1, 0, name, frame, phase[0], handle))
            return out

    start = time.perf_counter()
    try:
        with patch_paths(cuda_paths) as policy, _compiled_regions(rec.notes), Recorder():
            try:
                if setup is not None:
                    state = setup(meta)
                    for t in _tensors(state):
                        track(t, "")
                else:
                    state = meta
                phase[0] = "step"
                runs: list[list[tuple[str, int]]] = []
                for _ in range(1 if warmup is None else warmup + 1):
                    rec.run_starts.append(len(events))
                    out = step(state)
                    del out
                    if warmup is None:
                        break
                    allocs = [
                        (e.op, e.size) for e in events[rec.run_starts[-1] :] if e.kind == ALLOC
                    ]
                    if runs and allocs == runs[-1]:  # steady: the rest repeat this run
                        rec.repeats = warmup + 2 - len(rec.run_starts)
                        break
                    runs.append(allocs)
                phase[0] = "done"
            finally:
                rec.notes.extend(policy.notes)
    except (RuntimeError, NotImplementedError) as e:  # what meta refuses, e.g. .item()
        where, phase[0] = phase[0], "done"
        raise MetaError(
            f"{'setup' if where == 'setup' else 'step'} failed on the meta device: "
            f"{type(e).__name__}: {_first_line(e)}"
        ) from e
    rec.seconds = time.perf_counter() - start
    return rec
