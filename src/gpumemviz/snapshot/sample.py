"""Frozen values that travel from sources to the sampler, the panel and reports.

Sampling and drawing are separate (nvitop's snapshot boundary): a source builds these once, and
nothing downstream can change them. `MemoryStats` keeps torch's ~150 counters as one int64 array
plus a shared key tuple, so a long history of stats costs about 1.3 KB per sample, not a dict each.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gpumemviz.snapshot.escaping import short_repr

if TYPE_CHECKING:  # the columnar snapshot; imported for types only (sample stays cheap)
    from gpumemviz.snapshot import Snapshot
    from gpumemviz.snapshot.schema import TorchDict, TorchMapping

__all__ = [
    "MAX_INTERVAL_S",
    "MIN_INTERVAL_S",
    "NOT_CLASSIFIED",
    "SEGMENTS_NOT_READ",
    "STAT_FIGURES",
    "DeviceInfo",
    "HasHistory",
    "HasSamples",
    "MemoryStats",
    "NvmlInfo",
    "OomEvent",
    "Peaks",
    "Sample",
    "check_device",
    "check_interval",
    "snapshot_nbytes",
]

SEGMENTS_NOT_READ = "segment state not read this tick"
"""`Sample.segments_note` of a tick that read stats only (segments are read less often)."""
MIN_INTERVAL_S = 0.01
"""The shortest interval between reads a sampler takes, in seconds."""
MAX_INTERVAL_S = 86400.0
"""The longest: one day (threading's waits overflow near 9.2e9 s)."""


def check_device(device: object) -> int:
    """A CUDA device index, checked: sources and samplers take only a non-negative int.

    Raises
    ------
    ValueError
        Naming the value, for a bool, a non-int or a negative int.
    """
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"device must be a non-negative int, got {short_repr(device)}")
    return device


def check_interval(value: Any, name: str = "interval") -> float:
    """`value` as seconds when it is a number from `MIN_INTERVAL_S` to `MAX_INTERVAL_S`.

    Raises
    ------
    ValueError
        One line naming `name`, the range and the value (a bool, NaN or inf included).

    Examples
    --------
    >>> check_interval(0.5)
    0.5
    >>> check_interval(float("inf"))
    Traceback (most recent call last):
    ...
    ValueError: interval must be a positive number of seconds from 0.01 to 86400 (one day), got inf
    """
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        raise ValueError(
            f"{name} must be a positive number of seconds from {MIN_INTERVAL_S:g} to "
            f"{MAX_INTERVAL_S:g} (one day), got {short_repr(value)}"
        )
    return float(value)


# One shared (keys tuple, key -> index) pair per distinct key set: every sample of a run shares it.
_KEY_INDEX: dict[tuple[str, ...], tuple[tuple[str, ...], dict[str, int]]] = {}
_KEY_INDEX_MAX = 64


def _interned(keys: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, int]]:
    hit = _KEY_INDEX.get(keys)
    if hit is None:
        if len(_KEY_INDEX) >= _KEY_INDEX_MAX:  # private-pool keys come and go; stay bounded
            _KEY_INDEX.clear()
        hit = (keys, {k: i for i, k in enumerate(keys)})
        _KEY_INDEX[keys] = hit
    return hit


class _Figure:
    """A `MemoryStats` property that reads one torch key (0 when this torch lacks it)."""

    def __init__(self, key: str, doc: str) -> None:
        self.key = key
        self.__doc__ = f"{doc} (``{key}``)"

    def __get__(self, stats: MemoryStats | None, owner: type | None = None) -> int:
        if stats is None:
            return self  # type: ignore[return-value]  # the descriptor, for help() and docs
        return stats.figure(self.key)


@dataclass(frozen=True, eq=False, slots=True)
class MemoryStats(Mapping[str, int]):
    """torch's flattened ``memory_stats()`` dict, frozen and compact.

    Reads like the dict (``stats["allocated_bytes.all.current"]``) and names the figures a live
    view needs as properties. Missing keys read as 0 in the properties (older torch lacks some).

    >>> s = MemoryStats.from_torch(
    ...     {"allocated_bytes.all.current": 3, "reserved_bytes.all.current": 8}
    ... )
    >>> s.allocated, s.reserved, s.cached, s["reserved_bytes.all.current"]
    (3, 8, 5, 8)
    """

    keys_: tuple[str, ...]
    values: np.ndarray  # type: ignore[assignment]  # the column shadows Mapping.values (a public field)

    @classmethod
    def from_torch(cls, stats: TorchMapping) -> MemoryStats:
        """Build from ``torch.cuda.memory_stats(device)`` (or the allocator model's dict).

        Raises
        ------
        ValueError
            When ``stats`` is not a mapping of str to numbers.
        """
        if not isinstance(stats, Mapping):
            raise ValueError(f"memory stats must be a dict, got {type(stats).__name__}")
        keys = tuple(sorted(stats))
        vals = []
        for k in keys:
            v = stats[k]
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(
                    f"memory stats entry {short_repr(k)}: expected a number, got {short_repr(v)}"
                )
            vals.append(v)
        dtype = np.int64 if all(isinstance(v, int) for v in vals) else np.float64
        arr = np.asarray(vals, dtype=dtype) if vals else np.zeros(0, np.int64)
        arr.flags.writeable = False
        keys, _ = _interned(keys)
        return cls(keys, arr)

    # Mapping protocol -------------------------------------------------------------------------
    def __getitem__(self, key: str) -> int:
        i = _interned(self.keys_)[1][key]
        v = self.values[i]
        return int(v) if self.values.dtype.kind == "i" else float(v)  # type: ignore[return-value]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MemoryStats):
            return self.keys_ == other.keys_ and bool(np.array_equal(self.values, other.values))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def figure(self, key: str) -> int:
        """One torch key's value as an int, 0 when this torch lacks the key: what the figure
        properties (`allocated`, `reserved`, ...) read.

        Parameters
        ----------
        key : str
            A flattened ``memory_stats()`` key, such as ``"num_alloc_retries"``.

        Examples
        --------
        >>> s = MemoryStats.from_torch({"num_ooms": 2.0})
        >>> s.figure("num_ooms"), s.figure("num_alloc_retries"), s["num_ooms"]
        (2, 0, 2.0)
        """
        i = _interned(self.keys_)[1].get(key)
        return 0 if i is None else int(self.values[i])

    # The figures a live view needs (missing keys read 0) ---------------------------------------
    allocated = _Figure("allocated_bytes.all.current", "Bytes in tensors.")
    reserved = _Figure("reserved_bytes.all.current", "Bytes held from the device by the allocator.")
    active = _Figure(
        "active_bytes.all.current",
        "Allocated plus pending-free bytes (``record_stream`` frees not yet completed).",
    )
    requested = _Figure(
        "requested_bytes.all.current",
        "Bytes the user asked for; ``allocated - requested`` is rounding overhead.",
    )
    inactive_split = _Figure(
        "inactive_split_bytes.all.current",
        "Free bytes trapped inside partly used segments (only defragmenting frees them).",
    )

    @property
    def cached(self) -> int:
        """Reserved but not allocated: what ``empty_cache`` could at most give back."""
        return self.reserved - self.allocated

    peak_allocated = _Figure("allocated_bytes.all.peak", "Peak of ``allocated``.")
    peak_reserved = _Figure("reserved_bytes.all.peak", "Peak of ``reserved``.")
    num_alloc_retries = _Figure(
        "num_alloc_retries",
        "Times the allocator flushed its cache to satisfy a request: a pressure signal.",
    )
    num_ooms = _Figure("num_ooms", "Out-of-memory errors raised.")

    @property
    def nbytes(self) -> int:
        """Approximate memory this value holds (the key tuple is shared between samples).

        The object, the numpy array header and the data: measured with tracemalloc.
        """
        return int(self.values.nbytes) + 200

    def as_dict(self) -> dict[str, int]:
        """A plain dict copy, as torch returned it."""
        return dict(self.items())


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What a device is and how its allocator is set up (read once per source)."""

    index: int
    name: str = ""
    total_memory: int = 0
    uuid: str | None = None  # normalised: lower case, without the "GPU-"/"MIG-" prefix
    capability: tuple[int, int] | None = None
    backend: str | None = None  # "native" or "cudaMallocAsync"
    allocator_settings: str = ""  # the PYTORCH_(CUDA_)ALLOC_CONF string in effect
    torch_version: str = ""


@dataclass(frozen=True, slots=True)
class NvmlInfo:
    """Device-wide memory as the driver sees it, and who outside PyTorch uses it.

    ``available`` is False with a ``reason`` whenever NVML could not answer; every other field is
    then None. Per-process figures are None when NVML hides them (MIG, containers).
    """

    available: bool
    reason: str | None = None
    uuid: str | None = None
    matched_by: str | None = None  # "uuid" or "index (...)": how the torch device was found
    total: int | None = None
    used: int | None = None
    free: int | None = None
    utilization: int | None = None  # percent of time a kernel ran (None under MIG)
    processes: tuple[tuple[int, int | None], ...] = ()  # (pid, used bytes or None)
    non_pytorch: int | None = None  # device used - torch reserved: all processes together
    this_process_other: int | None = None  # our NVML usage - reserved (context, cuBLAS, NCCL...)
    other_processes: int | None = None  # sum over the other PIDs NVML lists
    split_reason: str | None = None  # why the per-process split is missing
    synthetic: bool = False  # True for stand-in values (tests, demo), never for driver data

    @classmethod
    def unavailable(cls, reason: str) -> NvmlInfo:
        return cls(available=False, reason=reason)


NOT_CLASSIFIED = "not classified yet: the source has not judged this OOM"
"""`OomEvent.explanation` of an event as a source builds it, before any classification."""


@dataclass(frozen=True, slots=True)
class OomEvent:
    """An out-of-memory failure, seen from inside the allocator's OOM observer.

    ``alloc_size`` is what torch passes the observer: the size of the *segment* it tried to
    get (20 MiB for a 4 MB tensor), not the tensor size. ``request_size`` and ``stream`` are the
    rounded request and its raw stream from the ``oom`` trace entry when history was recorded,
    else None.

    A source fills in the facts it has at the failure (sizes, ``device_total``, the snapshot);
    ``cause``, ``explanation`` and the figures from ``reserved`` to ``outside_bytes`` are the
    analysis layer's verdict on them (`gpumemviz.analysis.fragmentation.oom.classify_event`), which
    the source applies once, where the failure happens (`gpumemviz.live.sources.oom.judge`).
    Until then ``cause`` is "unknown" and ``explanation`` is `NOT_CLASSIFIED`.
    """

    time: float
    device: int
    alloc_size: int
    device_limit: int  # device total, or the memory-fraction cap when one is set
    device_free: int
    cause: str = "unknown"  # "capacity" | "fragmentation" | "outside" | "unknown"
    explanation: str = NOT_CLASSIFIED
    request_size: int | None = None
    reserved: int = 0
    allocated: int = 0
    free_in_segments: int = 0
    largest_free_block: int = 0
    outside_bytes: int = 0
    snapshot: TorchDict | None = field(default=None, repr=False)  # the full torch _snapshot() dict
    snapshot_error: str | None = None
    device_total: int = 0  # the device's total memory (0 if unknown)
    stream: int | None = None  # the failed request's raw stream (the ``oom`` trace entry's)


@dataclass(frozen=True, slots=True)
class Peaks:
    """The most allocated and reserved bytes gpumemviz's samples saw since ``since``.

    Never read from torch's peak counters: a rise and fall between two samples is missed, the
    price of figures nobody else can reset. ``torch_resets`` counts the resets of torch's
    counters gpumemviz saw and did not make; ``last_torch_reset`` is the ``time.time()`` of the
    sample that saw the newest. Samples share one value until a figure changes.

    Examples
    --------
    >>> Peaks(3, 8, 0.0).note is None
    True
    >>> Peaks(3, 8, 0.0, torch_resets=2, last_torch_reset=0.0).note.split(";")[0]
    "torch's peak counters were reset outside gpumemviz 2 times (last 00:00:00 UTC)"
    """

    allocated: int
    reserved: int
    since: float  # time.time() of the first sample counted (sampler start or the reset button)
    torch_resets: int = 0
    last_torch_reset: float | None = None

    @property
    def note(self) -> str | None:
        """One line for the panel once someone else reset torch's peak counters, else None."""
        if not self.torch_resets or self.last_torch_reset is None:
            return None
        when = time.strftime("%H:%M:%S", time.gmtime(self.last_torch_reset))
        times = "once" if self.torch_resets == 1 else f"{self.torch_resets} times"
        return (
            f"torch's peak counters were reset outside gpumemviz {times} (last {when} UTC); "
            "the peaks shown are gpumemviz's own"
        )


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of one device: stats always (when readable), segment state sometimes.

    ``state`` is "ok", "waiting" (CUDA not initialised yet: gpumemviz never initialises it),
    "unavailable" (no such device or backend) or "error" (the read failed; see ``errors``).
    A failed read is a Sample too: sampling never raises.
    """

    time: float  # time.time() of the read
    device: int
    stats: MemoryStats | None
    segments: Snapshot | None = None
    nvml: NvmlInfo | None = None
    errors: tuple[str, ...] = ()
    source_label: str = ""
    demo: bool = False
    state: str = "ok"
    device_info: DeviceInfo | None = None
    segments_note: str | None = None  # why ``segments`` is None (not due, throttled, backend...)
    oom: OomEvent | None = None
    notes: tuple[str, ...] = ()  # sampler remarks: budget stretch, listener errors, hung reads
    monotonic: float = 0.0  # time.monotonic() of the read (for drift-free plots)
    seq: int = -1  # position in the sampler's stream
    cpu_time: float = 0.0  # CPU seconds the reading thread spent on this read
    keyframe: bool = False  # the history keeps this sample's blocks
    peaks: Peaks | None = None  # gpumemviz's own peaks up to this sample (set by the sampler)

    @classmethod
    def failed(
        cls, device: int, reason: str, *, source_label: str = "", demo: bool = False
    ) -> Sample:
        """A sample that says why there is nothing to show."""
        import time

        return cls(
            time=time.time(),
            device=device,
            stats=None,
            errors=(reason,),
            source_label=source_label,
            demo=demo,
            state="error",
            monotonic=time.monotonic(),
        )

    @classmethod
    def for_oom(
        cls, event: OomEvent, device: int, segments: Snapshot | None, **fields: Any
    ) -> Sample:
        """The keyframe a source makes of an OOM event (`segments`: its snapshot, read);
        `fields` adds the source's own (source_label, demo, errors, device_info)."""
        import time

        return cls(
            time=event.time,
            monotonic=time.monotonic(),
            device=device,
            stats=None,
            segments=segments,
            oom=event,
            keyframe=True,
            **fields,
        )

    def replace(self, **changes: Any) -> Sample:  # Any: fields of their own types
        """A copy with some fields changed (the sampler adds seq, notes, cpu_time)."""
        return dataclasses.replace(self, **changes)

    @property
    def peak_figures(self) -> dict[str, int]:
        """gpumemviz's own peaks as the panel's header figures ({} before the sampler set any)."""
        p = self.peaks
        return {} if p is None else {"peak_allocated": p.allocated, "peak_reserved": p.reserved}

    @property
    def status_label(self) -> str:
        """``source_label`` for a status line, with `Peaks.note` once someone else has reset
        torch's peak counters."""
        note = self.peaks.note if self.peaks is not None else None
        return f"{self.source_label or 'live'} · {note}" if note else self.source_label

    @property
    def non_pytorch_bytes(self) -> int | None:
        """Device memory used outside PyTorch's allocator (all processes), when NVML knows."""
        if self.nvml is None or not self.nvml.available:
            return None
        return self.nvml.non_pytorch

    @property
    def nbytes(self) -> int:
        """Approximate bytes this sample keeps alive (for the sampler's bounded history).

        The constant parts were measured with tracemalloc on long runs (the object, its floats,
        device info and note strings: about 1.1 kB a stats-only sample of a replay); counting
        only the numpy columns under-counted a history of stats-only samples 2.5 times.
        """
        n = 480 + _text_bytes(self.notes) + _text_bytes(self.errors)
        if self.segments_note:
            n += 50 + len(self.segments_note)
        if self.device_info is not None:
            info = self.device_info
            n += 240 + len(info.name) + len(info.allocator_settings) + len(info.torch_version)
        if self.stats is not None:
            n += self.stats.nbytes
        if self.segments is not None:
            n += snapshot_nbytes(self.segments)
        if self.nvml is not None:
            n += 200 + 64 * len(self.nvml.processes)
        if self.oom is not None and self.oom.snapshot is not None:
            # the raw torch dict: ~200 B a segment dict, ~300 B a trace entry (frames shared)
            raw = self.oom.snapshot
            entries = sum(len(t) for t in raw.get("device_traces") or () if isinstance(t, list))
            n += 200 * len(raw.get("segments") or ()) + 300 * entries + 50_000
        return n


class HasSamples(Protocol):
    """What holds samples: a `gpumemviz.live.history.History`."""

    def samples(self) -> list[Sample]: ...


class HasHistory(Protocol):
    """What has a history of samples: a `gpumemviz.live.sampler.Sampler`."""

    @property
    def history(self) -> HasSamples: ...


def _text_bytes(texts: tuple[str, ...]) -> int:
    """A tuple of strings: the tuple, and each string's object and characters."""
    return 56 + sum(8 + 50 + len(t) for t in texts) if texts else 0


def _array_bytes(obj: object) -> int:
    """Sum of numpy nbytes over an object's attributes (dataclass, slots or __dict__)."""
    if obj is None:
        return 0
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    names: list[str] = []
    if dataclasses.is_dataclass(obj):
        names = [f.name for f in dataclasses.fields(obj)]
    elif hasattr(obj, "__dict__"):
        names = list(vars(obj))
    else:
        for klass in type(obj).__mro__:
            names.extend(getattr(klass, "__slots__", ()))
    total = 0
    for name in names:
        v = getattr(obj, name, None)
        if isinstance(v, np.ndarray):
            total += int(v.nbytes)
    return total


def snapshot_nbytes(snapshot: object) -> int:
    """Estimate the bytes a columnar Snapshot holds, from its numpy columns.

    Frames and other Python objects are not counted exactly; a floor of 40 bytes per block and
    100 per segment keeps the estimate honest when columns are views or missing.
    """
    n_seg = int(getattr(snapshot, "n_segments", 0) or 0)
    n_blk = int(getattr(snapshot, "n_blocks", 0) or 0)
    cols = _array_bytes(getattr(snapshot, "segments", None))
    cols += _array_bytes(getattr(snapshot, "blocks", None))
    traces = getattr(snapshot, "traces", None)
    if isinstance(traces, Mapping):
        for t in traces.values():
            cols += _array_bytes(t)
    return max(cols, 100 * n_seg + 40 * n_blk) + 256


# The `MemoryStats` figures read from torch keys, in definition order (CSV exports use it).
STAT_FIGURES: tuple[str, ...] = tuple(
    name for name, v in vars(MemoryStats).items() if isinstance(v, _Figure)
)
