"""The snapshot invariants as a checker returning readable problems.

The rules and their numbers are those of docs/allocator.md, Invariants. Every real snapshot
recorded on a GPU satisfies them, and so must every snapshot the model makes. Rule 5 (2 MiB
aligned addresses) is an observation, not a guarantee, and is not checked; rule 10 is a remark.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpumemviz.allocator.config import AllocatorConfig, ConfigError
from gpumemviz.allocator.rules import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    MIB,
)
from gpumemviz.allocator.rules import round_size as _round_size

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchList, TorchMapping

__all__ = ["check_invariants"]

_LIMIT = 50  # problems reported before giving up (a broken file would list thousands)


_CACHE: dict[str, AllocatorConfig] = {}


def _settings(snapshot: TorchMapping) -> AllocatorConfig:
    """The settings a snapshot was recorded with (parsed once per distinct settings dict)."""
    d = snapshot.get("allocator_settings")
    key = repr(d)
    cfg = _CACHE.get(key)
    if cfg is None:
        try:
            cfg = AllocatorConfig.from_settings(d)
        except (ConfigError, ValueError, TypeError):
            cfg = AllocatorConfig()
        if len(_CACHE) > 64:
            _CACHE.clear()
        _CACHE[key] = cfg
    return cfg


def _block_sizes(b: TorchMapping) -> tuple[int, int]:
    """(size, requested_size); legacy torch 2.0 blocks keep requested size in `history`."""
    if "frames" in b or "history" not in b:
        return b["size"], b.get("requested_size", b["size"])
    hist = b["history"] or [{}]
    return b["size"], hist[0].get("real_size", b["size"])


def check_invariants(snapshot: TorchMapping | TorchList) -> list[str]:
    """Check a torch snapshot dict (or bare segment list) against the invariants; [] when sound.

    Checked: 1 block sizes add up to total/allocated/active sizes; 2 block addresses are
    contiguous; 3 sizes are multiples of 512; 4 segment sizes (small 2 MiB, large 20 MiB or a
    2 MiB multiple >= 10 MiB; expandable runs whole pages); 6 no two adjacent inactive blocks;
    7 an allocated block is round_size(requested) plus at most the unsplit leftover the split
    rules allow; 8 inactive blocks carry no frames; 9 trace time_us never decreases.

    Parameters
    ----------
    snapshot : dict or list
        What `torch.cuda.memory._snapshot()` returns (or `memory_snapshot()`'s list).

    Returns
    -------
    list of str
        One line per problem, naming the segment and block.

    Examples
    --------
    >>> seg = {"address": 0, "total_size": 2 * 2**20, "allocated_size": 512, "active_size": 512,
    ...        "segment_type": "small", "blocks": [
    ...        {"address": 0, "size": 512, "requested_size": 100, "state": "active_allocated"},
    ...        {"address": 512, "size": 2 * 2**20 - 512, "requested_size": 0, "state": "inactive"}]}
    >>> check_invariants({"segments": [seg]})
    []
    >>> seg["blocks"][1]["size"] -= 512
    >>> check_invariants({"segments": [seg]})[0]
    'segment 0 (0x0): blocks add up to 2096640 bytes, total_size is 2097152'
    """
    try:
        return _check(snapshot)
    except (KeyError, TypeError, AttributeError) as e:
        return [f"not a snapshot this checker can read: {type(e).__name__} {e}"]


def _check(snapshot: TorchMapping | TorchList) -> list[str]:
    """The checks of `check_invariants`; malformed input raises (caught by the caller)."""
    if isinstance(snapshot, list):
        snapshot = {"segments": snapshot}
    cfg = _settings(snapshot)
    divisions = cfg.divisions
    mss = cfg.max_split_size
    large_segment = cfg.large_segment_size
    problems: list[str] = []

    def bad(msg: str) -> bool:
        problems.append(msg)
        return len(problems) >= _LIMIT

    plain_rounding = divisions is None
    for si, seg in enumerate(snapshot.get("segments") or []):
        blocks = seg.get("blocks") or []
        small = seg.get("segment_type") == "small"
        expandable = bool(seg.get("is_expandable"))
        total = seg.get("total_size", 0)
        base = seg.get("address", 0)
        where = f"segment {si} ({base:#x})"
        addr = base
        alloc = active = 0
        prev_state = None
        stop = False
        for bi, b in enumerate(blocks):  # one pass: rules 2, 3, 6, 7, 8 and the sums of rule 1
            size = b["size"]
            state = b["state"]
            # 2
            if "address" in b and b["address"] != addr:
                stop = bad(f"{where}, block {bi}: address {b['address']:#x}, expected {addr:#x}")
            addr += size
            # 3
            if size % K_MIN_BLOCK_SIZE:
                stop = stop or bad(f"{where}, block {bi}: size {size} is not a multiple of 512")
            if state == "inactive":
                # 6
                if prev_state == "inactive":
                    stop = stop or bad(f"{where}, block {bi}: two adjacent inactive blocks")
                # 8
                if b.get("frames"):
                    stop = stop or bad(f"{where}, block {bi}: inactive block carries frames")
            else:
                active += size
                if state == "active_allocated":
                    alloc += size
                    # 7
                    requested = _block_sizes(b)[1]
                    if requested <= K_MIN_BLOCK_SIZE:
                        r = K_MIN_BLOCK_SIZE
                    elif plain_rounding:
                        r = (
                            (requested + K_MIN_BLOCK_SIZE - 1)
                            // K_MIN_BLOCK_SIZE
                            * K_MIN_BLOCK_SIZE
                        )
                    else:
                        r = _round_size(requested, divisions)
                    extra = size - r
                    if small or r <= K_SMALL_SIZE or expandable:
                        allowed = K_MIN_BLOCK_SIZE - 1
                    elif r >= mss:
                        # oversize: whole segments, waste under max_non_split_rounding
                        allowed = max(cfg.max_non_split_rounding_size, 2 * MIB) - 1
                    else:
                        allowed = K_SMALL_SIZE
                    if extra < 0 or extra > allowed:
                        stop = stop or bad(
                            f"{where}, block {bi}: size {size} for a request of {requested} "
                            f"(round_size {r}): leftover {extra} is outside [0, {allowed}]"
                        )
            prev_state = state
            if stop:
                return problems
        # 1
        if addr - base != total and bad(
            f"{where}: blocks add up to {addr - base} bytes, total_size is {total}"
        ):
            break
        if (
            "allocated_size" in seg
            and alloc != seg["allocated_size"]
            and bad(
                f"{where}: allocated blocks add up to {alloc}, allocated_size is "
                f"{seg['allocated_size']}"
            )
        ):
            break
        if (
            "active_size" in seg
            and active != seg["active_size"]
            and bad(
                f"{where}: active blocks add up to {active}, active_size is {seg['active_size']}"
            )
        ):
            break
        # 4
        if expandable:
            page = K_SMALL_BUFFER if small else large_segment
            ok = total > 0 and total % page == 0
            rule = f"a multiple of its {page} byte page"
        elif small:
            ok = total == K_SMALL_BUFFER
            rule = "2 MiB (small pool)"
        else:
            ok = total in (large_segment, K_LARGE_BUFFER) or (
                total >= 10 * MIB and total % (2 * MIB) == 0
            )
            rule = "20 MiB or a multiple of 2 MiB >= 10 MiB (large pool)"
        if not ok and bad(f"{where}: total_size {total} is not {rule}"):
            break
    # 9
    for d, trace in enumerate(snapshot.get("device_traces") or []):
        last = None
        for i, e in enumerate(trace or []):
            t = e.get("time_us") if isinstance(e, Mapping) else None
            if t is None:
                continue
            if last is not None and t < last:
                if bad(f"device {d} trace entry {i}: time_us {t} is before {last}"):
                    return problems
                break
            last = t
    return problems
