"""Where the model's invented driver puts new memory: address providers and their checks.

A model never sees real device addresses. An address provider, `(kind, size, stream) -> int`,
chooses the base of each new segment (kind "segment") or expandable reservation (kind
"expandable"); `DescendingAddresses` is the default. `reservation_starts` is the rule by which
`from_segments` (and replay's address bookkeeping) place expandable reservations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpumemviz.snapshot.escaping import short_repr

__all__ = [
    "AddressProvider",
    "DescendingAddresses",
    "check_address",
    "default_address_provider",
    "reservation_starts",
]

_ALIGN = 2 << 20
_DEFAULT_TOP = 0x7F0000000000

AddressProvider = Callable[[str, int, int], int]


class DescendingAddresses:
    """Invented driver addresses: each new range just below the previous one, 2 MiB aligned.

    Real drivers mostly hand out descending addresses; addresses are not reused. An object
    rather than a closure so that copies of a model get their own cursor.

    >>> p = DescendingAddresses(1 << 40)
    >>> hex(p("segment", 20 << 20, 0)), hex(p("segment", 2 << 20, 0))
    ('0xfffec00000', '0xfffea00000')
    """

    def __init__(self, top: int = _DEFAULT_TOP) -> None:
        self.cursor = top

    def __call__(self, kind: str, size: int, stream: int) -> int:
        addr = (self.cursor - size) & ~(_ALIGN - 1)
        if addr <= 0:
            raise OverflowError("DescendingAddresses ran out of invented address space")
        self.cursor = addr
        return addr


def reservation_starts(runs: Sequence[int], bases: Sequence[int], extent: int) -> list[int]:
    """Where `from_segments` starts the expandable reservations of one stream and pool.

    `runs` are the sorted addresses of the mapped runs, `bases` the sorted known reservation
    starts: a reservation starts at each base, else at the lowest run above the last
    reservation's `extent` bytes. Replay's address bookkeeping (`drive`) mirrors it.

    >>> reservation_starts([10, 30, 95], [0], 50)
    [0, 95]
    """
    out: list[int] = []
    i = k = 0
    while True:
        nxt = runs[i] if i < len(runs) else None
        if k < len(bases) and (nxt is None or bases[k] <= nxt):
            base = bases[k]
            k += 1
        elif nxt is not None:
            base = nxt
        else:
            return out
        out.append(base)
        while i < len(runs) and runs[i] < base + extent:
            i += 1


def default_address_provider(top: int = _DEFAULT_TOP) -> AddressProvider:
    """The provider a model uses when given none: `DescendingAddresses(top)`."""
    return DescendingAddresses(top)


def check_address(ptr: int, size: int) -> None:
    """Refuse what an address provider returned unless it is a positive multiple of 512."""
    if isinstance(ptr, bool) or not isinstance(ptr, int) or ptr <= 0 or ptr % 512:
        raise ValueError(
            f"address_provider returned {short_repr(ptr)}: need a positive int, a multiple of 512"
        )
