"""Byte sizes for humans: torch's own formatting, and parsing of what users type."""

from __future__ import annotations

import re

from gpumemviz.snapshot.escaping import short_repr

__all__ = ["echo_size", "format_size", "parse_size"]

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

    Parameters
    ----------
    nbytes : int or float
        A byte count; negative counts keep their sign.

    Returns
    -------
    str
        "N bytes" up to 1024, else KiB, MiB or GiB with two decimals (ties round to even, as
        the panel's ``rows.js formatSize`` does).

    Examples
    --------
    >>> format_size(1536), format_size(20 * 2**20), format_size(3 * 2**30)
    ('1.50 KiB', '20.00 MiB', '3.00 GiB')
    >>> format_size(1024), format_size(-2048)
    ('1024 bytes', '-2.00 KiB')
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

    Parameters
    ----------
    text : str, int or float
        "2GiB", "512MB", "1.5 GiB", "123" (bytes), or a number of bytes. Units: B, K/KB, M/MB,
        G/GB, T/TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024), any case.

    Returns
    -------
    int
        The size in bytes.

    Raises
    ------
    ValueError
        Naming the input: not a size, negative, or not a whole number of bytes.

    Examples
    --------
    >>> parse_size("2GiB"), parse_size("512MB"), parse_size("1.5 KiB"), parse_size(4096)
    (2147483648, 512000000, 1536, 4096)
    >>> parse_size("2 parsecs")
    Traceback (most recent call last):
    ...
    ValueError: not a size: '2 parsecs' (try 2GiB, 512MB or a number of bytes)
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {short_repr(text)}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {short_repr(text)} (try 2GiB, 512MB or a number of bytes)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value != int(value):
        raise ValueError(f"not a whole number of bytes: {short_repr(text)}")
    return int(value)


#: How a unit is written back to the user (what `parse_size` accepts, in one spelling).
_SPELLING = {"": "bytes", "b": "bytes", "k": "kB", "kb": "kB", "kib": "KiB", "m": "MB"}
_SPELLING |= {"mb": "MB", "mib": "MiB", "g": "GB", "gb": "GB", "gib": "GiB", "t": "TB"}
_SPELLING |= {"tb": "TB", "tib": "TiB"}


def echo_size(text: str | int) -> str:
    """What the user typed, as typed, and what it is in the units gpumemviz shows: a decimal
    unit (MB, GB) is not the binary one torch prints (MiB, GiB), so "512MB" is echoed as
    "512 MB = 488.28 MiB", never silently as "488.28 MiB".

    Examples
    --------
    >>> echo_size("512MB"), echo_size("1GiB"), echo_size(3 << 20), echo_size("100")
    ('512 MB = 488.28 MiB', '1 GiB', '3145728 bytes = 3.00 MiB', '100 bytes')
    """
    n = parse_size(text)
    match = _SIZE_RE.match(str(text))
    if match is None:  # parse_size took it: an int
        number, unit = str(n), ""
    else:
        number, unit = match.group(1), match.group(2).lower()
    typed = f"{number} {_SPELLING[unit]}"
    shown = format_size(n)
    return typed if unit.endswith("ib") or shown == typed else f"{typed} = {shown}"
