"""A mutable segment/block layout of one device, moved by recorded trace entries.

Reconstruction walks a trace backwards over it and the timeline walks it forwards; neither makes
an allocator decision (the recorded addresses say where everything is). Only the split rule is
needed, to know how large a block an alloc carved (`rules.should_split`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchDict, TorchList, TorchMapping

from gpumemviz.snapshot.escaping import short_repr

__all__ = [
    "ALLOCATED",
    "INACTIVE",
    "PENDING_FREE",
    "STATE_NAMES",
    "Block",
    "Layout",
    "LayoutError",
    "Seg",
    "block_address",
]

INACTIVE, ALLOCATED, PENDING_FREE = 0, 1, 2
STATE_NAMES = ("inactive", "active_allocated", "active_pending_free")
_STATE_CODE = {name: code for code, name in enumerate(STATE_NAMES)}
_STATE_CODE["active_awaiting_free"] = PENDING_FREE  # the name torch's docstring uses


class LayoutError(ValueError):
    """A trace entry that does not fit the layout it is applied to (one line: what and where)."""


Block = tuple[int, int, int, int]  # (address, size, state, requested_size)
block_address = itemgetter(0)  # a block's address (C-level: bisects with it run per trace entry)


class Seg:
    """One segment (or one mapped run of an expandable segment): blocks in address order.

    A block is a tuple ``(address, size, state, requested_size)``; a move replaces it, never
    changes it, so a copy shares the blocks of its original (checkpoints cost a list of
    references per changed segment, and the GC leaves tuples of ints alone).
    """

    __slots__ = ("blocks", "cached", "expandable", "small", "stream")

    def __init__(self, stream: int, small: bool, expandable: bool, blocks: list[Block]):
        self.stream = stream
        self.small = small
        self.expandable = expandable
        self.blocks = blocks
        self.cached: TorchDict | None = None  # its torch dict, while unchanged

    @property
    def address(self) -> int:
        return self.blocks[0][0]

    @property
    def size(self) -> int:
        last = self.blocks[-1]
        return last[0] + last[1] - self.blocks[0][0]

    def index(self, addr: int) -> int:
        """Index of the block containing `addr` (the caller knows addr is inside the segment)."""
        return bisect.bisect_right(self.blocks, addr, key=block_address) - 1

    def copy(self) -> Seg:
        return Seg(self.stream, self.small, self.expandable, self.blocks[:])


def _segs_of(segments: Iterable[TorchMapping]) -> Iterator[Seg]:
    """The `Seg` of each torch-format segment dict, in turn (`Layout.from_segments`)."""
    for s in segments:
        base = int(s["address"])
        blocks: list[Block] = []
        at = base
        for b in s["blocks"]:
            size = int(b["size"])
            state = _STATE_CODE.get(b["state"])
            if state is None:
                raise LayoutError(
                    f"segment {base:#x}: unknown block state {short_repr(b['state'])}"
                )
            req = 0
            if state != INACTIVE:  # torch 2.0 keeps it in the block's history
                hist = b.get("history") or [{}]
                req = int(b.get("requested_size", hist[0].get("real_size", 0)) or 0)
            blocks.append((int(b.get("address", at)), size, state, req))
            at += size
        if not blocks:
            raise LayoutError(f"segment {base:#x} has no blocks")
        small = s.get("segment_type", "large") == "small"
        yield Seg(int(s["stream"]), small, bool(s.get("is_expandable")), blocks)


class Layout:
    """Segments of one device keyed by base address, with the primitive moves of a trace.

    Copies are copy-on-write: a copy shares every `Seg` with its original, and whichever
    layout changes a shared segment first gets its own copy of it. So checkpoints cost little,
    and a segment that did not change keeps its exported dict.
    """

    __slots__ = ("bases", "owned", "segs")

    def __init__(self, segs: Iterable[Seg] = ()) -> None:
        """A layout of `segs` (each its own from now on); LayoutError on two at one base."""
        self.bases: list[int] = []  # sorted segment base addresses
        self.segs: dict[int, Seg] = {}
        self.owned: set[Seg] = set()  # segments no other layout shares (safe to change)
        for seg in segs:
            self._insert(seg)

    # -- construction and export --------------------------------------------------------------
    @classmethod
    def from_segments(cls, segments: Iterable[TorchMapping]) -> Layout:
        """Build from torch-format segment dicts (block addresses computed when absent)."""
        return cls(_segs_of(segments))

    def to_segments(
        self,
        device: int = 0,
        *,
        shared: bool = False,
        frames: Callable[[int], TorchList] | None = None,
    ) -> list[TorchDict]:
        """Torch 2.11 segment dicts in address order (what `torch.cuda.memory_snapshot` gives).

        With `shared`, a segment unchanged since an earlier call returns the same dict as then
        (fast for scrubbing; the caller must not modify it). `frames(address)` gives an active
        block's allocation stack (the layout itself keeps none); without it stacks are empty.
        """
        out = []
        for base in self.bases:
            seg = self.segs[base]
            if shared and seg.cached is not None and seg.cached["device"] == device:
                out.append(seg.cached)
                continue
            blocks, allocated, active, requested = [], 0, 0, 0
            for addr, size, state, req in seg.blocks:
                if state:
                    active += size
                    requested += req
                    if state == ALLOCATED:
                        allocated += size
                blocks.append(
                    {
                        "address": addr,
                        "size": size,
                        "requested_size": req,
                        "state": STATE_NAMES[state],
                        "frames": frames(addr) if state and frames is not None else [],
                    }
                )
            d = {
                "device": device,
                "address": base,
                "total_size": seg.size,
                "allocated_size": allocated,
                "active_size": active,
                "requested_size": requested,
                "stream": seg.stream,
                "segment_type": "small" if seg.small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": seg.expandable,
                "frames": [],
                "blocks": blocks,
            }
            if shared:
                seg.cached = d
            out.append(d)
        return out

    def copy(self) -> Layout:
        """A copy sharing every segment until one side changes it (copy-on-write)."""
        lay = Layout()
        lay.bases = self.bases[:]
        lay.segs = dict(self.segs)
        self.owned = set()  # everything is shared now
        return lay

    def own(self, seg: Seg) -> Seg:
        """`seg` made safe to change: this layout's own copy, its cached dict dropped."""
        if seg in self.owned:
            seg.cached = None
            return seg
        mine = seg.copy()
        self.segs[mine.address] = mine
        self.owned.add(mine)
        return mine

    def key(
        self, requested: bool = True
    ) -> list[tuple[int, int, bool, bool, list[tuple[int, ...]]]]:
        """A comparable summary: (base, stream, small, expandable, blocks) per segment.

        Blocks are (address, size, state[, requested_size]); legacy files (torch 2.0) do not
        record requested sizes, so comparisons with a file leave them out.
        """
        n = 4 if requested else 3
        return [
            (b, s.stream, s.small, s.expandable, [tuple(x[:n]) for x in s.blocks])
            for b, s in ((b, self.segs[b]) for b in self.bases)
        ]

    # -- figures ----------------------------------------------------------------------------
    def totals(self) -> tuple[int, int, int]:
        """(reserved, allocated, segments); expandable runs count as segments here."""
        reserved = allocated = 0
        for seg in self.segs.values():
            reserved += seg.size
            for b in seg.blocks:
                if b[2] == ALLOCATED:
                    allocated += b[1]
        return reserved, allocated, len(self.segs)

    # -- lookups ----------------------------------------------------------------------------
    def segment_at(self, addr: int) -> Seg | None:
        """The segment containing `addr`, or None."""
        i = bisect.bisect_right(self.bases, addr) - 1
        if i < 0:
            return None
        seg = self.segs[self.bases[i]]
        last = seg.blocks[-1]
        return seg if addr < last[0] + last[1] else None

    def block_at(self, addr: int, what: str) -> tuple[Seg, int]:
        """The segment and index of the block that starts exactly at `addr`."""
        seg = self.segment_at(addr)
        if seg is not None:
            blocks = seg.blocks
            i = bisect.bisect_right(blocks, addr, key=block_address) - 1
            if blocks[i][0] == addr:
                return seg, i
        raise LayoutError(f"{what}: no block starts at {addr:#x}")

    # -- block moves ------------------------------------------------------------------------
    def carve(self, addr: int, size: int, state: int, requested: int, what: str) -> None:
        """Turn [addr, addr+size) of one free block into a block in `state`."""
        seg = self.segment_at(addr)
        if seg is None:
            raise LayoutError(f"{what}: {addr:#x} is in no segment")
        self.carve_at(seg, seg.index(addr), addr, size, state, requested, what)

    def carve_at(
        self, seg: Seg, i: int, addr: int, size: int, state: int, requested: int, what: str
    ) -> None:
        """`carve` inside block `i` of `seg` (the block containing `addr`)."""
        b = seg.blocks[i]
        if b[2] != INACTIVE or addr + size > b[0] + b[1]:
            raise LayoutError(f"{what}: [{addr:#x}, +{size}) is not inside one free block")
        seg = self.own(seg)
        new = [(addr, size, state, requested)]
        if addr > b[0]:
            new.insert(0, (b[0], addr - b[0], INACTIVE, 0))
        end = b[0] + b[1]
        if addr + size < end:
            new.append((addr + size, end - addr - size, INACTIVE, 0))
        seg.blocks[i : i + 1] = new

    def free_region(self, addr: int) -> tuple[Seg, int, int]:
        """(segment, start, end) of the free block containing `addr`."""
        seg = self.segment_at(addr)
        if seg is None:
            raise LayoutError(f"{addr:#x} is in no segment")
        b = seg.blocks[seg.index(addr)]
        if b[2] != INACTIVE:
            raise LayoutError(f"{addr:#x} is not free")
        return seg, b[0], b[0] + b[1]

    def release(self, addr: int, what: str) -> tuple[int, int]:
        """Make the block at `addr` free and merge it with free neighbours; returns the
        block's (state, size) before."""
        seg, i = self.block_at(addr, what)
        return self.release_at(seg, i, what)

    def release_at(self, seg: Seg, i: int, what: str) -> tuple[int, int]:
        """`release` of block `i` of `seg` (what `block_at` found)."""
        if seg.blocks[i][2] == INACTIVE:
            raise LayoutError(f"{what}: block at {seg.blocks[i][0]:#x} is already free")
        seg = self.own(seg)
        blocks = seg.blocks
        b = blocks[i]
        start, size, req, lo, hi = b[0], b[1], 0, i, i + 1
        if i + 1 < len(blocks) and blocks[i + 1][2] == INACTIVE:
            size += blocks[i + 1][1]
            hi += 1
        if i > 0 and blocks[i - 1][2] == INACTIVE:  # it takes the block in
            prev = blocks[i - 1]
            start, size, req, lo = prev[0], prev[1] + size, prev[3], i - 1
        blocks[lo:hi] = [(start, size, INACTIVE, req)]
        return b[2], b[1]

    def set_state(self, addr: int, state: int, what: str, only: int | None = None) -> int:
        """Change an active block's state (only from state `only`, when given); returns its
        size."""
        seg, i = self.block_at(addr, what)
        return self.set_state_at(seg, i, state, what, only)

    def set_state_at(self, seg: Seg, i: int, state: int, what: str, only: int | None = None) -> int:
        """`set_state` of block `i` of `seg` (what `block_at` found)."""
        addr = seg.blocks[i][0]
        if only is not None and seg.blocks[i][2] != only:
            raise LayoutError(f"block at {addr:#x} is not {STATE_NAMES[only].split('_')[-1]}")
        if seg.blocks[i][2] == INACTIVE:
            raise LayoutError(f"{what}: block at {addr:#x} is free")
        seg = self.own(seg)
        b = seg.blocks[i]
        seg.blocks[i] = (b[0], b[1], state, b[3])
        return b[1]

    # -- segment moves ----------------------------------------------------------------------
    def _insert(self, seg: Seg) -> None:
        base = seg.address
        if base in self.segs:
            raise LayoutError(f"two segments at {base:#x}")
        bisect.insort(self.bases, base)
        self.segs[base] = seg
        self.owned.add(seg)

    def _remove(self, base: int, keep: bool = True) -> Seg:
        """Take a segment out; with `keep`, the caller gets a copy it may change freely."""
        self.bases.pop(bisect.bisect_left(self.bases, base))
        seg = self.segs.pop(base)
        if seg in self.owned or not keep:
            self.owned.discard(seg)
            seg.cached = None
            return seg
        return seg.copy()

    def add_segment(self, addr: int, size: int, stream: int, small: bool, what: str) -> None:
        """A new, entirely free, non-expandable segment."""
        if self.segment_at(addr) is not None or self.segment_at(addr + size - 1) is not None:
            raise LayoutError(f"{what}: [{addr:#x}, +{size}) overlaps a segment")
        self._insert(Seg(stream, small, False, [(addr, size, INACTIVE, 0)]))

    def remove_segment(self, addr: int, size: int, what: str) -> Seg:
        """Drop an entirely free segment (cudaFree)."""
        seg = self.segs.get(addr)
        if seg is None:
            raise LayoutError(f"{what}: no segment at {addr:#x}")
        if len(seg.blocks) != 1 or seg.blocks[0][2] != INACTIVE or seg.blocks[0][1] != size:
            raise LayoutError(f"{what}: segment at {addr:#x} is not one free block of {size} B")
        return self._remove(addr, keep=False)

    def map_range(self, addr: int, size: int, stream: int, small: bool, what: str) -> None:
        """Map [addr, addr+size) of an expandable segment: free, joined to touching runs."""
        if self.segment_at(addr) is not None or self.segment_at(addr + size - 1) is not None:
            raise LayoutError(f"{what}: [{addr:#x}, +{size}) is already mapped")
        blocks: list[Block] = [(addr, size, INACTIVE, 0)]
        below = self.segment_at(addr - 1)
        if below is not None and below.expandable and below.stream == stream:
            below = self._remove(below.address)
            small = below.small
            last = below.blocks[-1]
            if last[2] == INACTIVE:
                below.blocks[-1] = (last[0], last[1] + size, last[2], last[3])
                blocks = below.blocks
            else:
                blocks = below.blocks + blocks
        above = self.segs.get(addr + size)
        if above is not None and above.expandable and above.stream == stream:
            above = self._remove(above.address)
            small = above.small
            if above.blocks[0][2] == INACTIVE:
                last = blocks[-1]
                blocks[-1] = (last[0], last[1] + above.blocks[0][1], last[2], last[3])
                blocks += above.blocks[1:]
            else:
                blocks += above.blocks
        self._insert(Seg(stream, small, True, blocks))

    def unmap_range(self, addr: int, size: int, what: str) -> None:
        """Unmap [addr, addr+size): it lies in one free block of an expandable run."""
        seg = self.segment_at(addr)
        if seg is None or not seg.expandable:
            raise LayoutError(f"{what}: {addr:#x} is in no expandable segment")
        i = seg.index(addr)
        b = seg.blocks[i]
        if b[2] != INACTIVE or addr + size > b[0] + b[1]:
            raise LayoutError(f"{what}: [{addr:#x}, +{size}) is not inside one free block")
        seg = self._remove(seg.address)
        lower = seg.blocks[:i]
        if addr > b[0]:
            lower.append((b[0], addr - b[0], INACTIVE, 0))
        upper = seg.blocks[i + 1 :]
        end = b[0] + b[1]
        if addr + size < end:
            upper.insert(0, (addr + size, end - addr - size, INACTIVE, 0))
        for part in (lower, upper):
            if part:
                self._insert(Seg(seg.stream, seg.small, True, part))
