"""What an estimate answers: `Estimate` (peaks, segments, fragmentation, OOM, the snapshot at
the peak) and `EstimateOom` (the first allocation that would fail, and why)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.analysis.fragmentation import FragmentationReport
    from gpumemviz.analysis.fragmentation.fit import FitAnswer
    from gpumemviz.snapshot import Snapshot

__all__ = ["Estimate", "EstimateOom"]


@dataclass(frozen=True)
class EstimateOom:
    """The first allocation the model could not serve.

    `size` is the request in bytes; `op` the aten operator that asked (or "cuBLAS workspace");
    `frame` the user's Python frame that called it ("file:line in function"); `phase` "setup"
    or "step"; `can_fit` the allocator's verdict on the state it failed in (reserved,
    fragmented, or the device full: `FitAnswer.verdict`); `message` PyTorch's OOM message.
    """

    size: int
    op: str
    frame: str
    phase: str
    can_fit: FitAnswer
    message: str

    def __str__(self) -> str:
        where = f" at {self.frame}" if self.frame else ""
        return (
            f"{format_size(self.size)} for {self.op or 'a tensor'}{where} ({self.phase}): "
            f"{self.can_fit.explanation}"
        )


@dataclass(frozen=True)
class Estimate:
    """A training or inference step's predicted GPU memory, from a meta-device run.

    Attributes
    ----------
    peak_allocated, peak_reserved : int
        Bytes held by tensors / by the caching allocator at their peaks (torch's
        `max_memory_allocated` / `max_memory_reserved`).
    start_allocated : int
        Allocated bytes when the measured part starts (setup's tensors, workspaces kept from
        warm-up); `peak_allocated - start_allocated` is the step's own peak.
    segments : int
        Segments (cudaMalloc'd or mapped runs) at the allocated peak.
    fragmentation : FragmentationReport
        `gpumemviz.fragmentation` of the state at the peak.
    oom : EstimateOom or None
        The first allocation that fails under `capacity`, or None when the step fits.
    snapshot : Snapshot
        The predicted allocator state at the peak (blocks carry the operator and user frame
        that allocated them): `MemoryPanel.from_snapshot`, `gpumemviz.report` show it.
    capacity, config, arch : the settings it was estimated under.
    workspaces : int
        cuBLAS workspaces added (one per handle: main thread, autograd thread).
    fake_ops : dict
        Operators meta had no kernel for, run through FakeTensorMode (name -> calls).
    step_allocs : tuple of int
        The measured part's allocation sizes in order (requests, before rounding).
    meta_seconds, drive_seconds : float
        Time spent running the step on meta, and driving the allocator model.
    start_reserved, start_segments : int
        Reserved bytes and segments when the measured part starts: with `warmup`, the
        warmed-up cache the step found.
    runs, repeats : int
        Meta runs of the step (with `warmup`, until two in a row allocated the same), and
        how many steps the last run was driven for (the rest of the warm-up and the step).
    notes : tuple of str
        What the meta run could not model as CUDA runs it (an autocast region for another
        device, a region compiled by torch.compile that ran eager): never silent.
    """

    peak_allocated: int
    peak_reserved: int
    start_allocated: int
    segments: int
    fragmentation: FragmentationReport
    oom: EstimateOom | None
    snapshot: Snapshot
    capacity: int
    config: str
    arch: str
    workspaces: int
    fake_ops: dict[str, int] = field(default_factory=dict)
    step_allocs: tuple[int, ...] = ()
    meta_seconds: float = 0.0
    drive_seconds: float = 0.0
    notes: tuple[str, ...] = ()
    start_reserved: int = 0
    start_segments: int = 0
    runs: int = 1
    repeats: int = 1

    @property
    def fits(self) -> bool:
        """True when no allocation failed under `capacity`."""
        return self.oom is None

    def __str__(self) -> str:
        conf = self.config or "default settings"
        lines = [
            f"estimate on {format_size(self.capacity)} ({conf}, arch {self.arch}): "
            + ("fits" if self.fits else "OUT OF MEMORY"),
            f"  peak allocated {format_size(self.peak_allocated)} "
            f"(step {format_size(self.peak_allocated - self.start_allocated)} over "
            f"{format_size(self.start_allocated)} at its start)",
            f"  peak reserved  {format_size(self.peak_reserved)}, {self.segments} segments "
            f"at the peak, largest free block {format_size(self.fragmentation.largest_free)}",
        ]
        if self.oom is not None:
            lines.append(f"  first failure: {self.oom}")
        if self.fake_ops:
            lines.append(
                "  run through FakeTensorMode (no meta kernel): " + ", ".join(self.fake_ops)
            )
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)
