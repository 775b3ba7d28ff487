"""A recorded snapshot played back as a live source, scrubbing its `allocator.replay.recording`.

The panel then shows a run that happened elsewhere (a file from a cluster, a colleague's OOM) the
way it would have looked live: segment state after each trace entry, rebuilt by
`allocator.replay.recording.Recording` (reconstruct the start, apply the entries forwards at the
recorded addresses).

A file (or a `Snapshot`) is read as the `Snapshot`'s numpy columns: the recording is built from
the trace's columns, and the panel reads them (`columns`: entry times, recorded OOMs), so no
dict per trace entry is made; `raw`, the torch dict `export` hands on, is built when asked for
(and not kept). A torch dict handed in is read as it is.

Long traces (10^6 entries, a stack per entry) are millions of containers the cyclic GC would
scan again and again: the source is built with the GC paused and one collection after it, so
the collections that follow see those objects as old and leave them be (a full pass over them
took over a second in the middle of a seek); a seek builds only the shown entry's segments (not
the trace up to it) with the GC paused too.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.live.sources.base import SourceCommandError, short_error
from gpumemviz.snapshot import Snapshot, Trace
from gpumemviz.snapshot.gc_pause import no_gc
from gpumemviz.snapshot.sample import SEGMENTS_NOT_READ, DeviceInfo, MemoryStats, Sample

if TYPE_CHECKING:
    from gpumemviz.io import SnapshotLike
    from gpumemviz.snapshot.schema import TorchDict, TorchList, TorchMapping

__all__ = ["PlaybackSource"]


def _opened(snapshot: SnapshotLike) -> TorchDict | Snapshot:
    """A torch dict as given, else a `Snapshot` (a path or bytes through the restricted loader):
    its traces stay numpy columns."""
    if isinstance(snapshot, dict | Snapshot):
        return snapshot
    if isinstance(snapshot, list):
        raise ValueError(
            "a bare segment list has no recorded history to replay "
            "(record with torch.cuda.memory._record_memory_history())"
        )
    to_torch = getattr(snapshot, "to_torch", None)
    if callable(to_torch):
        data: TorchDict = to_torch()
        return data
    if isinstance(snapshot, str | bytes | os.PathLike):
        from gpumemviz.io import load_snapshot

        return load_snapshot(snapshot)
    raise TypeError(f"cannot replay a {type(snapshot).__name__}: give a snapshot dict or file")


def _lengths(opened: TorchDict | Snapshot) -> list[int]:
    """Entries in each device's trace, by device index."""
    if isinstance(opened, dict):
        return [len(t) for t in opened.get("device_traces") or []]
    n = max(opened.traces, default=-1) + 1
    return [len(opened.traces[d]) if d in opened.traces else 0 for d in range(n)]


class PlaybackSource:
    """Plays a recorded trace back as samples, at ``speed`` trace entries per second.

    Parameters
    ----------
    snapshot : dict, Snapshot, str or path
        A torch snapshot with recorded history (``device_traces``).
    device : int, optional
        The device to replay (default: the one with the longest trace).
    speed : float, optional
        Trace entries per second (default: the whole trace in ``duration`` seconds).
    duration : float
        Seconds a full pass takes when ``speed`` is not given (default 30).
    loop : bool
        Start again at the end (default True); otherwise stay on the last entry.

    Attributes
    ----------
    recording : Recording
        The device's recorded history, what a seek reads.
    columns : Trace or None
        The device's trace as columns (opened from a file or a `Snapshot`); None when handed
        a torch dict, whose entries `raw` holds.

    Examples
    --------
    >>> MiB = 1 << 20
    >>> seg = {"device": 0, "address": 1 << 30, "total_size": 2 * MiB, "allocated_size": 0,
    ...        "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "small",
    ...        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
    ...        "blocks": [{"address": 1 << 30, "size": 2 * MiB, "requested_size": 0,
    ...                    "state": "inactive", "frames": []}]}
    >>> trace = [{"action": "alloc", "addr": 1 << 30, "size": 512, "stream": 0},
    ...          {"action": "free_requested", "addr": 1 << 30, "size": 512, "stream": 0},
    ...          {"action": "free_completed", "addr": 1 << 30, "size": 512, "stream": 0}]
    >>> src = PlaybackSource({"segments": [seg], "device_traces": [trace]}, speed=1.0)
    >>> src.seek(0); src.sample().stats.allocated
    512
    """

    demo = False
    capabilities = frozenset({"segments", "export", "time_travel"})

    def __init__(
        self,
        snapshot: SnapshotLike,
        *,
        device: int | None = None,
        speed: float | None = None,
        duration: float = 30.0,
        loop: bool = True,
    ) -> None:
        # millions of containers: the GC would rescan them several times over; on leaving,
        # what a big file leaves is made old at once, so no collection in the middle of a seek
        # (or of the user's next cell) scans it as young objects
        with no_gc(promote_built=True):
            self._build(snapshot, device, speed, duration)
        self.loop = loop
        self._lock = threading.Lock()
        self._anchor_pos = -1.0
        self._anchor_t = time.monotonic()
        self._playing = True

    def _build(
        self, snapshot: SnapshotLike, device: int | None, speed: float | None, duration: float
    ) -> None:
        opened = _opened(snapshot)
        if device is None:
            lengths = _lengths(opened)
            if not lengths or max(lengths) == 0:
                raise ValueError(
                    "this snapshot has no recorded history (device_traces are empty): nothing "
                    "to replay; record with torch.cuda.memory._record_memory_history()"
                )
            device = lengths.index(max(lengths))
        if speed is not None and not speed > 0:
            raise ValueError(f"speed must be a positive number of entries per second, got {speed}")
        self.device = device
        self._raw: TorchDict | None = None
        self._snapshot: Snapshot | None = None
        self.columns: Trace | None = None
        if isinstance(opened, dict):
            self._raw = opened
            self.recording = Recording.from_snapshot(opened, device=device)
            traces = opened.get("device_traces") or []
            self._trace: Sequence[TorchDict] = traces[device] if device < len(traces) else []
            # OOMs recorded up to each entry: the header's "OOMs" at the entry shown
            is_oom = [isinstance(e, dict) and e.get("action") == "oom" for e in self._trace]
            self._settings = opened.get("allocator_settings")
            self._annotations = opened.get("external_annotations")
        else:
            # the segments as torch dicts, the trace as columns: no dict per entry
            self._snapshot = opened
            self.columns = opened.traces.get(device) or Trace.empty()
            self._trace = ()
            segments = opened.to_torch_segments()
            self.recording = Recording.from_snapshot(
                segments, device, columns=self.columns, config=opened.config
            )
            is_oom = self.columns.action == self.columns.action_names.index("oom")
            self._settings = opened.allocator_settings
            self._annotations = opened.external_annotations
        self._ooms = np.cumsum(np.asarray(is_oom, dtype=np.int64))
        self.n = len(self.recording)
        self.speed = float(speed) if speed else max(1.0, self.n / max(duration, 1e-3))
        self.label = f"replay of a recorded trace (device {device}, {self.n} entries)"

    @property
    def raw(self) -> TorchDict:
        """The recorded torch snapshot dict: as given, or built from the file's `Snapshot` each
        time it is asked for (a dict per trace entry: what `export` hands on, not what the
        panel reads; not kept, so the panel does not hold a second copy of the trace)."""
        if self._raw is not None:
            return self._raw
        assert self._snapshot is not None  # one of the two is set by `_build`
        return self._snapshot.to_torch()

    @property
    def snapshot(self) -> Snapshot:
        """The recorded file as a `Snapshot`: the one opened, else read from the torch dict
        given (what `gpumemviz.analyze` reads of a replay; its trace stays columns)."""
        if self._snapshot is not None:
            return self._snapshot
        from gpumemviz.io import as_snapshot

        assert self._raw is not None  # one of the two is set by `_build`
        return as_snapshot(self._raw)

    @property
    def allocator_settings(self) -> TorchMapping | None:
        """The recorded ``allocator_settings`` (None where the file has none)."""
        got = self._settings
        return got if isinstance(got, Mapping) else None

    @property
    def external_annotations(self) -> TorchList | None:
        """The recorded ``external_annotations`` as given (None where the file has none)."""
        got = self._annotations
        return got if isinstance(got, list) else None

    def _entry_note(self, i: int) -> str:
        """ ", (action, recorded at HH:MM:SS UTC)" for entry i where it has a time, else ""."""
        if self.columns is not None:
            trace = self.columns
            if not 0 <= i < len(trace) or trace.time_us[i] in (0, -1):  # -1: no time_us
                return ""
            stamp_us, action = int(trace.time_us[i]), trace.action_names[trace.action[i]]
        else:
            if not 0 <= i < len(self._trace) or not self._trace[i].get("time_us"):
                return ""
            stamp_us, action = self._trace[i]["time_us"], self._trace[i].get("action")
        stamp = time.strftime("%H:%M:%S", time.gmtime(stamp_us / 1e6))
        return f" ({action}, recorded at {stamp} UTC)"

    # time travel -------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """The trace entry shown now (-1: the state before the first entry)."""
        with self._lock:
            pos = self._anchor_pos
            if self._playing:
                pos += (time.monotonic() - self._anchor_t) * self.speed
        if self.n == 0:
            return -1
        if self.loop:
            return int((pos + 1) % (self.n + 1)) - 1
        return min(int(pos), self.n - 1)

    def seek(self, index: int) -> None:
        """Show the state after entry ``index`` (-1: before the first); pauses playback."""
        if not -1 <= index < self.n:
            raise ValueError(f"entry {index} is outside this trace (-1 .. {self.n - 1})")
        with self._lock:
            self._anchor_pos = float(index)
            self._anchor_t = time.monotonic()
            self._playing = False

    def play(self, speed: float | None = None) -> None:
        """Continue from the current entry (optionally at a new speed)."""
        pos = self.position
        with self._lock:
            if speed is not None:
                if not speed > 0:
                    raise ValueError(f"speed must be positive, got {speed}")
                self.speed = float(speed)
            self._anchor_pos = float(pos)
            self._anchor_t = time.monotonic()
            self._playing = True

    def pause(self) -> None:
        self.seek(self.position)

    # Source protocol -------------------------------------------------------------------------
    def sample(self, *, segments: bool = True) -> Sample:
        """The state at the current entry; never raises."""
        t, mono = time.time(), time.monotonic()
        i = self.position
        try:
            tl = self.recording
            if i < 0:
                reserved, allocated, n_seg = tl.start.totals()
            else:
                reserved, allocated, n_seg = tl.reserved[i], tl.allocated[i], tl.segments[i]
            stats = MemoryStats.from_torch(
                {
                    "reserved_bytes.all.current": int(reserved),
                    "allocated_bytes.all.current": int(allocated),
                    "segment.all.current": int(n_seg),
                    "num_ooms": int(self._ooms[i]) if 0 <= i < len(self._ooms) else 0,
                }
            )
            snap = self.segments_at(i) if segments else None
        except Exception as exc:
            return Sample.failed(
                self.device, f"replay: {short_error(exc)}", source_label=self.label
            )
        note = f"replay: entry {i + 1} of {self.n}{self._entry_note(i)}"
        settings = self.allocator_settings
        conf = settings.get("PYTORCH_CUDA_ALLOC_CONF", "") if settings is not None else ""
        return Sample(
            time=t,
            monotonic=mono,
            device=self.device,
            stats=stats,
            segments=snap,
            source_label=self.label,
            device_info=DeviceInfo(
                index=self.device,
                name="recorded trace",
                allocator_settings=conf if type(conf) is str else "",  # else malformed
            ),
            segments_note=None if segments else SEGMENTS_NOT_READ,
            notes=(note,),
        )

    def segments_at(self, index: int) -> Snapshot:
        """The segments after entry ``index`` (-1: before the first), as `Recording.snapshot_at`
        gives them but without its ``device_traces`` (a copy of the trace up to the entry)."""
        tl = self.recording
        with no_gc():  # thousands of short-lived containers: no collection in the seek
            segs = tl.layout_at(index).to_segments(
                tl.device, shared=True, frames=tl.frames_after(index)
            )
            return Snapshot.from_torch(segs)

    def empty_cache(self) -> dict[int, int]:
        raise SourceCommandError("a replay shows a recorded run: there is no cache to empty")

    def export(self) -> TorchDict:
        """The recorded snapshot, as given (a file's: its torch dict, `raw`)."""
        return self.raw

    def close(self) -> None:
        with self._lock:
            self._playing = False
