"""The model's out-of-memory error: `OutOfMemory`, PyTorch's message and its numbers.

Apart from the model so that catching it (`gpumemviz.allocator.OutOfMemory`) loads nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import JsonDict

__all__ = ["OutOfMemory"]


class OutOfMemory(RuntimeError):
    """The model's `torch.OutOfMemoryError`: what PyTorch's message carries, as attributes.

    Attributes: device, size (the request), rounded_size, alloc_size ("Tried to allocate"),
    capacity (device total), free (device free), allocated, reserved, allowed (cap or None),
    private_pools (the bytes of the private pools' cached free blocks, which torch's message
    counts as "allocated in private pools").
    ``str()`` is PyTorch's message.
    """

    def __init__(
        self,
        *,
        device: int,
        size: int,
        rounded_size: int,
        alloc_size: int,
        capacity: int,
        free: int,
        allocated: int,
        reserved: int,
        allowed: int | None,
        private_pools: int = 0,
    ) -> None:
        self.device = device
        self.size = size
        self.rounded_size = rounded_size
        self.alloc_size = alloc_size
        self.capacity = capacity
        self.free = free
        self.allocated = allocated
        self.reserved = reserved
        self.allowed = allowed
        self.private_pools = private_pools
        super().__init__(self._message())

    def _message(self) -> str:
        allowed = f"{format_size(self.allowed)} allowed; " if self.allowed is not None else ""
        priv = self.private_pools
        private = (
            f"with {format_size(priv)} allocated in private pools (e.g., CUDA Graphs), "
            if priv > 0
            else ""
        )
        return (
            f"CUDA out of memory. Tried to allocate {format_size(self.alloc_size)}. "
            f"GPU {self.device} has a total capacity of {format_size(self.capacity)} of which "
            f"{format_size(self.free)} is free. {allowed}Of the allocated memory "
            f"{format_size(self.allocated + priv)} is allocated by PyTorch, {private}and "
            f"{format_size(self.reserved - self.allocated - priv)} is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )

    def fields(self) -> JsonDict:
        """The numbers of the message, as a dict."""
        return {k: getattr(self, k) for k in _OOM_FIELDS}

    def __reduce__(self) -> tuple[Any, ...]:  # keep picklable despite keyword-only __init__
        return (_rebuild_oom, (self.fields(),))


_OOM_FIELDS = (
    "device",
    "size",
    "rounded_size",
    "alloc_size",
    "capacity",
    "free",
    "allocated",
    "reserved",
    "allowed",
    "private_pools",
)


def _rebuild_oom(d: JsonDict) -> OutOfMemory:
    return OutOfMemory(**d)
