"""The state `model.CachingAllocator` shares with its mixins, declared once for the type checker.

`CachingAllocator.__init__` (model.py) and `TraceMixin._init_trace` (trace.py) set these
attributes; the mixins (trace, events, release, expandable, pools, load, dump, clone) read and write
them through ``self``, and call methods that another part of the class defines. `AllocatorState`
is the base of every mixin: at run time an empty class (annotations only), for the type checker
the attributes' types and the signatures of those cross-module methods.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumemviz.allocator import stats as S
    from gpumemviz.allocator.addresses import AddressProvider
    from gpumemviz.allocator.blocks import BlockPool, ModelBlock, PrivatePool, Reservation
    from gpumemviz.allocator.config import AllocatorConfig
    from gpumemviz.snapshot.schema import TorchDict

__all__ = ["AllocatorState"]

TraceEntry = tuple[int, int, int, int, int]  # (action, addr, size, stream, time_us)


class AllocatorState:
    """The attributes of a `CachingAllocator`, and the methods its mixins call on each other."""

    # model.CachingAllocator.__init__
    config: AllocatorConfig
    capacity: int
    device: int
    device_total: int
    stats: S.DeviceStats
    _provide: AddressProvider
    _mss: int  # max_split_size
    _mnsr: int  # max_non_split_rounding_size
    _lss: int  # large_segment_size
    _div: tuple[int, ...] | None
    _expandable: bool
    _small: BlockPool
    _large: BlockPool
    _allocated: dict[int, ModelBlock]
    _pending: dict[int, ModelBlock]
    # stream -> FIFO of [block, done] pairs, `done` flipped in place (`complete_events`)
    _events: dict[int, deque[list[Any]]]
    _total: int
    _allowed: int | None
    _gc_threshold: float
    _gc: bool
    _record: bool
    # pools.PoolsMixin._init_pools
    _pools: dict[tuple[int, int], PrivatePool]
    _alloc_to: list[tuple[tuple[int, int], Callable[[int], bool]]]
    _use_on_oom: list[tuple[int, int]]
    _capture_deferred: list[ModelBlock]
    _next_ids: list[int]
    # trace.TraceMixin._init_trace
    _trace: deque[TraceEntry]
    _tappend: Callable[[TraceEntry], None] | None
    _tick: Callable[[], int]
    _trace_count: int
    _default_clock: bool
    _clock: Callable[[], int] | None

    if TYPE_CHECKING:

        def __init__(
            self,
            capacity: int,
            config: str | AllocatorConfig = "",
            device: int = 0,
            device_total: int | None = None,
            **kwargs: Any,  # model.CachingAllocator's keyword-only options
        ) -> None: ...

        # model.py
        def _free_block(self, b: ModelBlock) -> None: ...

        # trace.py
        def _emit(self, action: int, addr: int, size: int, stream: int) -> None: ...
        def _counted_tick(self) -> int: ...
        def trace_len(self) -> int: ...

        # events.py
        def _process_events(self) -> None: ...
        def _synchronize_and_free_events(self) -> None: ...

        # events.py
        def _free_deferred(self, b: ModelBlock) -> None: ...

        # release.py
        def _release_blocks(self, pool: BlockPool) -> None: ...

        # dump.py
        def snapshot(self, *, include_traces: bool = True, record: bool = True) -> TorchDict: ...
        def _all_blocks(self) -> list[ModelBlock]: ...

        # pools.py
        def _release_private_pools(self) -> None: ...
        def _private_block_pools(self) -> list[BlockPool]: ...
        def _create_or_incref(self, pid: tuple[int, int]) -> None: ...

        # expandable.py
        def _unmap_block(self, b: ModelBlock) -> None: ...
        def _new_reservation(
            self, stream: int, small: bool, base: int | None = None
        ) -> Reservation: ...
