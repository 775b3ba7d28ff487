"""Byte sizes for humans: torch's own formatting, and parsing of what users type."""

from __future__ import annotations

import re

__all__ = ["format_size", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def format_size(nbytes: int | float) -> str:
    """Format like PyTorch's OOM message (`format_size` in CUDACachingAllocator.cpp).

    >>> format_size(1536), format_size(20 * 2**20), format_size(3 * 2**30)
    ('1.50 KiB', '20.00 MiB', '3.00 GiB')
    """
    n = float(nbytes)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n <= 1024:
        return f"{sign}{int(n)} bytes"
    if n <= 1048576:
        return f"{sign}{n / 1024:.2f} KiB"
    if n <= 1073741824:
        return f"{sign}{n / 1048576:.2f} MiB"
    return f"{sign}{n / 1073741824:.2f} GiB"


def parse_size(text: str | int | float) -> int:
    """Parse "2GiB", "512MB", "1.5 GiB" or a plain byte count into bytes.

    Decimal units (KB, MB, GB) are powers of 1000 and binary units (KiB, MiB, GiB) powers of 1024,
    so "512MB" means what the user wrote.

    >>> parse_size("2GiB"), parse_size("512MB"), parse_size("4096")
    (2147483648, 512000000, 4096)
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try 2GiB, 512MB or a number of bytes)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)
