"""torch's `memory_stats()` bookkeeping, kept incrementally (docs/allocator.md, Statistics).

`DeviceStats` holds the counters the model updates on every event, flattened exactly as
`torch.cuda.memory_stats()` flattens them. `walk_stats` recomputes the current values from a
snapshot dict: an independent oracle for the incremental bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchMapping

__all__ = ["ARRAYS", "POOLS", "DeviceStats", "walk_stats"]

ARRAYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
POOLS = ("all", "small_pool", "large_pool")
ALLOCATION, SEGMENT, ACTIVE, INACTIVE_SPLIT, ALLOCATED_BYTES = 0, 1, 2, 3, 4
RESERVED_BYTES, ACTIVE_BYTES, INACTIVE_SPLIT_BYTES, REQUESTED_BYTES = 5, 6, 7, 8
OVERSIZE_ALLOCATIONS, OVERSIZE_SEGMENTS = 9, 10
SMALL, LARGE = 1, 2
_N = 11 * 3


class DeviceStats:
    """Current / peak / cumulative-increase counters for one device (torch's `DeviceStats`).

    Each stat keeps `current`, `peak` and `allocated` (cumulative increase); `freed` is
    `allocated - current`, which saves a write on every decrease. Index a stat as
    `3 * array + pool` (pool 0 = all, 1 = small, 2 = large); the oversize stats use pool 0.
    An array's `all` entry changes with its pool entry by the same amount, so its `allocated`
    is not kept: it is the sum of the pools' (one write fewer per change on the hot paths).
    """

    __slots__ = (
        "alloc",
        "cur",
        "max_split_size",
        "num_alloc_retries",
        "num_device_alloc",
        "num_device_free",
        "num_ooms",
        "num_sync_all_streams",
        "peak",
        "reset_base",
    )

    def __init__(self, max_split_size: int = -1) -> None:
        self.cur = [0] * _N
        self.peak = [0] * _N
        self.alloc = [0] * _N
        self.reset_base = [0] * _N  # `freed` offset after reset_accumulated
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.max_split_size = max_split_size

    def inc(self, array: int, pool: int, amount: int) -> None:
        """Increase a stat array's `all` entry and its pool entry."""
        cur, peak, alloc = self.cur, self.peak, self.alloc
        i = 3 * array
        c = cur[i] + amount
        cur[i] = c
        if c > peak[i]:
            peak[i] = c
        i += pool
        c = cur[i] + amount
        cur[i] = c
        if c > peak[i]:
            peak[i] = c
        alloc[i] += amount

    def dec(self, array: int, pool: int, amount: int) -> None:
        """Decrease a stat array's `all` entry and its pool entry."""
        cur = self.cur
        i = 3 * array
        cur[i] -= amount
        cur[i + pool] -= amount

    def inc1(self, stat: int, amount: int = 1) -> None:
        """Increase a single (non-array) stat such as oversize_allocations."""
        i = 3 * stat
        c = self.cur[i] + amount
        self.cur[i] = c
        if c > self.peak[i]:
            self.peak[i] = c
        self.alloc[i] += amount

    def dec1(self, stat: int, amount: int = 1) -> None:
        self.cur[3 * stat] -= amount

    # A block handed out: allocation, allocated_bytes, active, active_bytes and requested_bytes
    # go up. Generated below, one per pool (1 small, 2 large); the model calls them directly.
    on_alloc_1: Callable[[int, int], None]  # (size, requested)
    on_alloc_2: Callable[[int, int], None]

    def on_free_requested(self, p: int, size: int) -> None:
        """A user free: allocation and allocated_bytes go down."""
        cur = self.cur
        cur[0] -= 1
        cur[p] -= 1
        i = 3 * ALLOCATED_BYTES
        cur[i] -= size
        cur[i + p] -= size

    def reset_peak(self) -> None:
        """`resetPeakStats`: peak = current."""
        self.peak[:] = self.cur

    def reset_accumulated(self) -> None:
        """`resetAccumulatedStats`: allocated/freed and the num_* counters go to zero."""
        self.reset_base[:] = self.cur
        self.alloc[:] = [0] * _N
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = 0
        self.num_device_alloc = self.num_device_free = 0

    def as_dict(self) -> dict[str, int]:
        """The flattened, sorted dict `torch.cuda.memory_stats()` returns."""
        out: dict[str, int] = {}
        cur, peak, alloc, base = self.cur, self.peak, self.alloc, self.reset_base
        for a, name in enumerate(ARRAYS):
            for p, pool in enumerate(POOLS):
                i = 3 * a + p
                prefix = f"{name}.{pool}."
                allocated = alloc[i + 1] + alloc[i + 2] if p == 0 else alloc[i]
                out[prefix + "current"] = cur[i]
                out[prefix + "peak"] = peak[i]
                out[prefix + "allocated"] = allocated
                out[prefix + "freed"] = allocated - cur[i] + base[i]
        for s, name in (
            (OVERSIZE_ALLOCATIONS, "oversize_allocations"),
            (OVERSIZE_SEGMENTS, "oversize_segments"),
        ):
            i = 3 * s
            out[name + ".current"] = cur[i]
            out[name + ".peak"] = peak[i]
            out[name + ".allocated"] = alloc[i]
            out[name + ".freed"] = alloc[i] - cur[i] + base[i]
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_sync_all_streams"] = self.num_sync_all_streams
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        out["num_oom_rejections"] = 0
        out["max_split_size"] = self.max_split_size
        return dict(sorted(out.items()))

    def seed_current(self, values: Mapping[str, int]) -> None:
        """Start from a known state (`from_segments`): current = peak = allocated."""
        for key, v in values.items():
            name, pool, _ = key.split(".")
            i = 3 * ARRAYS.index(name) + POOLS.index(pool)
            self.cur[i] = self.peak[i] = self.alloc[i] = v


def _generate_on_alloc() -> None:
    """Write `on_alloc_1` / `on_alloc_2` out in full: constant indices, no loop, no calls.

    It runs on every malloc, and the unrolled form is about twice as fast as a loop over the
    five stat arrays.
    """
    terms = [(ALLOCATION, "1"), (ALLOCATED_BYTES, "size"), (ACTIVE, "1")]
    terms += [(ACTIVE_BYTES, "size"), (REQUESTED_BYTES, "requested")]
    for pool in (SMALL, LARGE):
        lines = [
            f"def on_alloc_{pool}(self, size, requested):",
            "    cur = self.cur; peak = self.peak; alloc = self.alloc",
        ]
        for array, amount in terms:
            for i in (3 * array, 3 * array + pool):
                lines += [
                    f"    c = cur[{i}] + {amount}",
                    f"    cur[{i}] = c",
                    f"    if c > peak[{i}]:",
                    f"        peak[{i}] = c",
                ]
                if i % 3:  # an `all` entry's allocated is the sum of the pools'
                    lines.append(f"    alloc[{i}] += {amount}")
        namespace: dict[str, Any] = {}  # exec's globals
        exec("\n".join(lines), namespace)  # fixed text built above from constants, no input
        fn = namespace[f"on_alloc_{pool}"]
        where = "the small pool" if pool == SMALL else "the large pool"
        fn.__doc__ = f"A block of {where} handed out: its five stat arrays go up."
        setattr(DeviceStats, f"on_alloc_{pool}", fn)


_generate_on_alloc()


def walk_stats(segments: Iterable[TorchMapping]) -> dict[str, int]:
    """The `X.pool.current` stats recomputed from torch-format segment dicts.

    Expandable segments count in reserved_bytes but not in `segment.*` nor `inactive_split*`
    (docs/allocator.md, Expandable segments), exactly as torch's incremental bookkeeping does.

    Examples
    --------
    >>> seg = {"total_size": 2 * 2**20, "segment_type": "small", "is_expandable": False,
    ...        "blocks": [{"size": 512, "requested_size": 100, "state": "active_allocated"},
    ...                   {"size": 2 * 2**20 - 512, "requested_size": 0, "state": "inactive"}]}
    >>> s = walk_stats([seg])
    >>> s["inactive_split_bytes.small_pool.current"], s["segment.all.current"]
    (2096640, 1)
    """
    # acc[array][pool index]: pool 1 small, 2 large; "all" is filled in at the end
    acc = [[0, 0, 0] for _ in ARRAYS]
    seg_a, act_a, actb_a = acc[SEGMENT], acc[ACTIVE], acc[ACTIVE_BYTES]
    req_a, alc_a, alcb_a = acc[REQUESTED_BYTES], acc[ALLOCATION], acc[ALLOCATED_BYTES]
    isp_a, ispb_a, res_a = acc[INACTIVE_SPLIT], acc[INACTIVE_SPLIT_BYTES], acc[RESERVED_BYTES]
    for seg in segments:
        p = SMALL if seg.get("segment_type") == "small" else LARGE
        expandable = bool(seg.get("is_expandable"))
        res_a[p] += seg["total_size"]
        if not expandable:
            seg_a[p] += 1
        blocks = seg["blocks"]
        split = len(blocks) > 1 and not expandable
        for b in blocks:
            state = b["state"]
            if state == "inactive":
                if split:
                    isp_a[p] += 1
                    ispb_a[p] += b["size"]
                continue
            size = b["size"]
            act_a[p] += 1
            actb_a[p] += size
            req_a[p] += b["requested_size"]
            if state == "active_allocated":
                alc_a[p] += 1
                alcb_a[p] += size
    out = {}
    for a, name in enumerate(ARRAYS):
        v = acc[a]
        out[f"{name}.all.current"] = v[1] + v[2]
        out[f"{name}.small_pool.current"] = v[1]
        out[f"{name}.large_pool.current"] = v[2]
    return out
