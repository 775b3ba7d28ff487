"""The allocator's settings: `PYTORCH_CUDA_ALLOC_CONF` parsed as torch 2.13 parses it.

The parser is a port of `c10::CachingAllocator::ConfigTokenizer` plus
`AcceleratorAllocatorConfig::parseArgs` and `CUDAAllocatorConfig::parseArgs`, quirks included
(for example `checkToken` only checks that a token exists, not what it is), so a string is
accepted or rejected exactly as PyTorch would, and rejections start with PyTorch's own message.

It lives in the snapshot layer, below the allocator model, so that a `Snapshot` holds its
recorded settings parsed once (`Snapshot.config`) as the frozen `AllocatorConfig` every layer
above reads; `gpumemviz.allocator.config` gives the allocator's modules the same names. The
settings' sizes and bounds that the parser checks (`MIB`, `K_LARGE_BUFFER`, ...) are defined
here for that reason, and `gpumemviz.allocator.rules` lists them with the rules that use them.

It stays whole at just over 500 lines: the parser, `AllocatorConfig` and the snapshot's
`allocator_settings` dict (`from_settings`, which runs the same parser, and `to_settings`) are
one job, the settings, sharing the key sets and `ConfigError`; split, the error would live
apart from the class whose methods raise it, and every module catching it would import it
from a parser it never calls.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from gpumemviz.snapshot.escaping import short_repr

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import TorchDict, TorchMapping

__all__ = [
    "CUDA_KEYS",
    "GENERIC_KEYS",
    "K_LARGE_BUFFER",
    "K_MIN_LARGE_ALLOC",
    "MIB",
    "N_ROUNDUP_INTERVALS",
    "UNLIMITED",
    "AllocatorConfig",
    "ConfigError",
]

MIB = 1 << 20
K_MIN_LARGE_ALLOC = 10 * MIB  # large requests below this get a large_segment_size segment
K_LARGE_BUFFER = 20 * MIB  # default large_segment_size (segment and large expandable page)
N_ROUNDUP_INTERVALS = 16  # power-of-two intervals for roundup_power2_divisions, from 1 MiB
UNLIMITED = (1 << 64) - 1  # SIZE_MAX: max_split_size when unset (reported as -1)

GENERIC_KEYS = frozenset(
    {
        "large_segment_size_mb",
        "max_split_size_mb",
        "max_non_split_rounding_mb",
        "garbage_collection_threshold",
        "roundup_power2_divisions",
        "expandable_segments",
        "pinned_use_background_threads",
    }
)
CUDA_KEYS = frozenset(
    {
        "backend",
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "release_lock_on_hipmalloc",
        "pinned_use_hip_host_register",
        "graph_capture_record_stream_reuse",
        "pinned_reserve_segment_size_mb",
        "pinned_num_register_threads",
        "per_process_memory_fraction",
        "pinned_free_catch_all",
        "throw_on_cudamalloc_oom",
    }
)
_SIZE_MAX_MB = UNLIMITED // MIB
_PINNED_MAX_REGISTER_THREADS = 128
_INDEX_MSG = "Index out of bounds in ConfigTokenizer"


class ConfigError(ValueError):
    """A settings string PyTorch would reject; the message starts with PyTorch's own."""


def _tokenize(s: str) -> list[str]:
    """`ConfigTokenizer`: split on , : [ ] (kept as tokens), drop all whitespace."""
    out: list[str] = []
    buf: list[str] = []
    for ch in s:
        if ch in ",:[]":
            if buf:
                out.append("".join(buf))
                buf = []
            out.append(ch)
        elif not ch.isspace():
            buf.append(ch)
    if buf:
        out.append("".join(buf))
    return out


_UINT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(
    r"[+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
    r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?)",
    re.IGNORECASE,
)


class _Tokens:
    """The tokenizer's accessors, raising what PyTorch raises."""

    def __init__(self, s: str) -> None:
        self.s = s
        self.t = _tokenize(s)

    def __len__(self) -> int:
        return len(self.t)

    def __getitem__(self, i: int) -> str:
        if i >= len(self.t):
            raise ConfigError(
                f"{_INDEX_MSG} (a key without ':value', a trailing ',' or an unclosed '[' "
                f"in allocator settings {short_repr(self.s)})"
            )
        return self.t[i]

    def check(self, i: int) -> None:
        """`checkToken`: PyTorch ignores the comparison result and only checks the index."""
        self[i]

    def size_t(self, i: int) -> int:
        tok = self[i]
        m = _UINT_RE.match(tok)
        if not m:
            raise ConfigError(
                f"stoull: {short_repr(tok)} is not an unsigned integer (in {short_repr(self.s)})"
            )
        v = int(m.group())
        if abs(v) > UNLIMITED:
            raise ConfigError(
                f"stoull: {short_repr(tok)} is out of range (in {short_repr(self.s)})"
            )
        return v & UNLIMITED  # strtoull negates in unsigned arithmetic: -1 is SIZE_MAX

    def double(self, i: int) -> float:
        tok = self[i]
        m = _FLOAT_RE.match(tok)
        if not m:
            raise ConfigError(f"stod: {short_repr(tok)} is not a number (in {short_repr(self.s)})")
        text = m.group()
        low = text.lower().lstrip("+-")
        if low.startswith("nan"):
            return math.nan
        if low.startswith("0x"):
            if "p" not in low:
                text += "p0"
            v = float.fromhex(text)
        else:
            v = float(text)
        mantissa = re.split(r"[pP]" if low.startswith("0x") else r"[eE]", low)[0]
        nonzero = re.search(
            r"[1-9a-fA-F]" if low.startswith("0x") else r"[1-9]",
            mantissa[2:] if low.startswith("0x") else mantissa,
        )
        if (math.isinf(v) and not low.startswith("inf")) or (v == 0 and nonzero):
            raise ConfigError(f"stod: {short_repr(tok)} is out of range (in {short_repr(self.s)})")
        return v

    def boolean(self, i: int) -> bool:
        tok = self[i]
        if tok == "True":
            return True
        if tok == "False":
            return False
        hint = ""
        if tok.lower() in ("true", "false"):  # what people type; PyTorch wants the capital
            hint = f" (use {tok.capitalize()}: PyTorch rejects {tok})"
        raise ConfigError(
            f"Expected 'True' or 'False' at index {i} in ConfigTokenizer but got '{tok}'{hint}"
        )

    def skip_key(self, i: int) -> int:
        self.check(i + 1)
        i += 2
        if self[i] != "[":
            return i
        i += 1
        while i < len(self.t) and self.t[i] != "]":
            i += 1
        if i >= len(self.t):
            raise ConfigError(
                "Expected closing bracket ']' in ConfigTokenizer but reached end of config "
                f"(in {short_repr(self.s)})"
            )
        return i


def _default_divisions() -> tuple[int, ...]:
    return (0,) * N_ROUNDUP_INTERVALS


@dataclass(frozen=True)
class AllocatorConfig:
    """The allocator settings the model obeys (sizes in bytes; `UNLIMITED` = not set).

    Build one with `AllocatorConfig.parse(s)` or `AllocatorConfig.from_settings(d)`.
    """

    settings: str = ""
    large_segment_size: int = K_LARGE_BUFFER
    max_split_size: int = UNLIMITED
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = field(default_factory=_default_divisions)
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    per_process_memory_fraction: float = 1.0
    backend: str = "native"
    release_lock_on_cudamalloc: bool = False
    pinned_use_cuda_host_register: bool = False
    pinned_num_register_threads: int = 1
    pinned_use_background_threads: bool = False
    pinned_reserve_segment_size_mb: int = 0
    pinned_free_catch_all: bool = False
    graph_capture_record_stream_reuse: bool = False
    throw_on_cudamalloc_oom: bool = False

    @property
    def divisions(self) -> tuple[int, ...] | None:
        """The roundup table for `rules.round_size`, or None when no interval rounds."""
        return self.roundup_power2_divisions if any(self.roundup_power2_divisions) else None

    @classmethod
    def parse(cls, s: str | None, *, cuda_build: bool = True) -> AllocatorConfig:
        """Parse a `PYTORCH_CUDA_ALLOC_CONF` string as torch 2.13 does.

        Parameters
        ----------
        s : str or None
            ``"key:value,key:[a:b,c:d]"``; None or "" gives the defaults.
        cuda_build : bool
            True (default) behaves like a CUDA build: CUDA keys are parsed and unknown keys are
            rejected. False behaves like the CPU wheel, which has no CUDA parser and skips
            keys it does not know (used to compare against the real parser in tests).

        Returns
        -------
        AllocatorConfig

        Raises
        ------
        ConfigError
            When PyTorch would reject the string; the message starts with PyTorch's.

        Examples
        --------
        >>> c = AllocatorConfig.parse("expandable_segments:True,max_split_size_mb:128")
        >>> c.expandable_segments, c.max_split_size // 2**20
        (True, 128)
        >>> AllocatorConfig.parse("roundup_power2_divisions:[256:8,>:2]").roundup_power2_divisions
        (8, 8, 8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 2, 2, 2, 2)
        """
        return cls._parse(s, cuda_keys=cuda_build, reject_unknown=cuda_build)

    @classmethod
    def _parse(cls, s: str | None, *, cuda_keys: bool, reject_unknown: bool) -> AllocatorConfig:
        if s is None:
            s = ""
        if not isinstance(s, str):
            raise ConfigError(f"allocator settings must be a str, got {type(s).__name__}")
        cuda_build = reject_unknown
        v: dict[str, Any] = {"settings": s}  # Any: the fields, of their own types
        tok = _Tokens(s)
        n = len(tok)
        # large_segment_size_mb first: the minimum of the other sizes depends on it.
        large = K_LARGE_BUFFER
        i = 0
        while i < n:
            if tok[i] == "large_segment_size_mb":
                tok.check(i + 1)
                i += 2
                mb = tok.size_t(i)
                if mb <= K_MIN_LARGE_ALLOC // MIB:
                    raise ConfigError(
                        "CachingAllocator option large_segment_size_mb must be > "
                        f"{K_MIN_LARGE_ALLOC // MIB} MB"
                    )
                large = min(mb, _SIZE_MAX_MB) * MIB
            i += 1
        v["large_segment_size"] = large
        v["max_non_split_rounding_size"] = large
        divisions = [0] * N_ROUNDUP_INTERVALS
        i = 0
        while i < n:
            key = tok[i]
            if key == "large_segment_size_mb":
                i = tok.skip_key(i)
            elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                tok.check(i + 1)
                i += 2
                mb = tok.size_t(i)
                if mb < large // MIB:
                    raise ConfigError(
                        f"CachingAllocator option {key} too small, must be >= {large // MIB}"
                    )
                name = (
                    "max_split_size"
                    if key == "max_split_size_mb"
                    else "max_non_split_rounding_size"
                )
                v[name] = min(mb, _SIZE_MAX_MB) * MIB
            elif key == "garbage_collection_threshold":
                tok.check(i + 1)
                i += 2
                x = tok.double(i)
                if not (x > 0 and x < 1.0):
                    raise ConfigError("garbage_collect_threshold is invalid, set it in (0.0, 1.0)")
                v["garbage_collection_threshold"] = x
            elif key == "roundup_power2_divisions":
                i = _parse_divisions(tok, i, divisions)
            elif key in ("expandable_segments", "pinned_use_background_threads"):
                tok.check(i + 1)
                i += 2
                v[key] = tok.boolean(i)
            else:
                if cuda_build and key not in GENERIC_KEYS | CUDA_KEYS:
                    raise ConfigError(f"Unrecognized key '{key}' in Accelerator allocator config.")
                i = tok.skip_key(i)
            if i + 1 < n:
                tok.check(i + 1)
                i += 1
            i += 1
        v["roundup_power2_divisions"] = tuple(divisions)
        if cuda_keys:
            _parse_cuda(tok, v)
        return replace(cls(), **v)

    @classmethod
    def from_settings(cls, d: TorchMapping | None) -> AllocatorConfig:
        """Read a snapshot's `allocator_settings` dict (None or {} gives the defaults).

        The settings string is parsed first (it carries keys the dict lacks, such as
        large_segment_size_mb or per_process_memory_fraction), with the CUDA keys a CUDA build
        knows and skipping keys newer than torch 2.13; the dict's own values win where both
        exist.

        Examples
        --------
        >>> AllocatorConfig.from_settings({"max_split_size": -1, "expandable_segments": True,
        ...     "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}).expandable_segments
        True
        """
        if not d:
            return cls()
        if not isinstance(d, Mapping):
            raise ConfigError(f"allocator_settings must be a dict, got {type(d).__name__}")
        conf = cls._parse(
            d.get("PYTORCH_CUDA_ALLOC_CONF") or "", cuda_keys=True, reject_unknown=False
        )
        v: dict[str, Any] = {}  # Any: the fields, of their own types
        # values a file could not have had from torch (beyond an int64, NaN) are not read
        mss = d.get("max_split_size")
        if type(mss) is int and -(1 << 63) <= mss < 1 << 63:
            v["max_split_size"] = mss + (1 << 64) if mss < 0 else mss  # int64 back to size_t
        gc = d.get("garbage_collection_threshold")
        if isinstance(gc, int | float) and not isinstance(gc, bool) and math.isfinite(gc):
            v["garbage_collection_threshold"] = float(gc)
        for key in (
            "expandable_segments",
            "release_lock_on_cudamalloc",
            "pinned_use_cuda_host_register",
            "graph_capture_record_stream_reuse",
        ):
            if isinstance(d.get(key), bool):
                v[key] = d[key]
        threads = d.get("pinned_num_register_threads")
        if type(threads) is int and 0 <= threads < 1 << 63:
            v["pinned_num_register_threads"] = threads
        rd = d.get("roundup_power2_divisions")
        if isinstance(rd, Mapping) and rd:
            table = list(conf.roundup_power2_divisions)
            for k, val in rd.items():
                idx = _division_key(k).bit_length() - 1
                if 0 <= idx < N_ROUNDUP_INTERVALS:
                    table[idx] = _division_value(k, val)
            v["roundup_power2_divisions"] = tuple(table)
        return replace(conf, **v)

    def to_settings(self) -> TorchDict:
        """The `allocator_settings` dict torch 2.11 writes into a snapshot."""
        return {
            "PYTORCH_CUDA_ALLOC_CONF": self.settings,
            # an int64 in torch: SIZE_MAX (unset) reads -1, like any value >= 2**63 wraps
            "max_split_size": self.max_split_size - (1 << 64)
            if self.max_split_size >= 1 << 63
            else self.max_split_size,
            "garbage_collection_threshold": float(self.garbage_collection_threshold),
            "expandable_segments": self.expandable_segments,
            "pinned_num_register_threads": self.pinned_num_register_threads,
            "release_lock_on_cudamalloc": self.release_lock_on_cudamalloc,
            "pinned_use_cuda_host_register": self.pinned_use_cuda_host_register,
            "roundup_power2_divisions": {
                str(1 << k): v for k, v in enumerate(self.roundup_power2_divisions)
            },
            "graph_capture_record_stream_reuse": self.graph_capture_record_stream_reuse,
        }

    def changed(self) -> dict[str, Any]:  # Any: field values, of their own types
        """The fields that differ from the defaults (for messages and reports)."""
        base = AllocatorConfig()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "settings" and getattr(self, f.name) != getattr(base, f.name)
        }


def _division_key(k: object) -> int:
    """A recorded roundup_power2_divisions key (an interval in MiB: int or digit string)."""
    if type(k) is int and k >= 0:
        return k
    if type(k) is str and k.isascii() and k.isdigit():
        return int(k)
    raise ConfigError(
        f"allocator_settings: roundup_power2_divisions key {short_repr(k)} is not an interval "
        "(a non-negative integer)"
    )


def _division_value(k: object, val: object) -> int:
    """A recorded divisions count: 0 (no rounding) or a power of two, as torch accepts."""
    if type(val) is int and 0 <= val < 1 << 64 and (val == 0 or _is_pow2(val)):
        return val
    raise ConfigError(
        f"allocator_settings: roundup_power2_divisions[{short_repr(k)}] is {short_repr(val)}, "
        "not 0 or a power of 2"
    )


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _parse_divisions(tok: _Tokens, i: int, divisions: list[int]) -> int:
    """`parseRoundUpPower2Divisions` (newest semantics: '>' fills after the last key)."""
    tok.check(i + 1)
    i += 2
    if tok[i] != "[":
        value = tok.size_t(i)
        if not _is_pow2(value):
            raise ConfigError("For roundups, the divisions has to be power of 2 ")
        divisions[:] = [value] * N_ROUNDUP_INTERVALS
        return i
    first = True
    last_index = 0
    n = len(tok)
    i += 1
    while i < n and tok[i] != "]":
        key_index = i
        tok.check(i + 1)
        i += 2
        value = tok.size_t(i)
        if not (value == 0 or _is_pow2(value)):
            raise ConfigError(
                "For roundups, the divisions has to be power of 2 or 0 to disable roundup "
            )
        if tok[key_index] == ">":
            for k in range(last_index + 1, N_ROUNDUP_INTERVALS):
                divisions[k] = value
        else:
            boundary = tok.size_t(key_index)
            if not _is_pow2(boundary):
                raise ConfigError("For roundups, the intervals have to be power of 2 ")
            index = min(boundary.bit_length() - 1, N_ROUNDUP_INTERVALS - 1)
            if first:
                for k in range(index):
                    divisions[k] = value
                first = False
            divisions[index] = value
            last_index = index
        if tok[i + 1] != "]":
            tok.check(i + 1)
            i += 1
        i += 1
    if i >= n:
        raise ConfigError(
            "Expected closing bracket ']' in ConfigTokenizer but reached end of config"
        )
    return i


def _parse_cuda(tok: _Tokens, v: dict[str, Any]) -> None:  # Any: field values
    """`CUDAAllocatorConfig::parseArgs`: the second pass of a CUDA build."""
    n = len(tok)
    i = 0
    while i < n:
        key = tok[i]
        if key == "backend":
            tok.check(i + 1)
            i += 2
            if tok[i] not in ("native", "cudaMallocAsync"):
                raise ConfigError(
                    "Unknown allocator backend, options are native and cudaMallocAsync"
                )
            v["backend"] = tok[i]
        elif key in ("release_lock_on_cudamalloc", "release_lock_on_hipmalloc"):
            tok.check(i + 1)
            i += 2
            v["release_lock_on_cudamalloc"] = tok.boolean(i)
        elif key in ("pinned_use_cuda_host_register", "pinned_use_hip_host_register"):
            tok.check(i + 1)
            i += 2
            v["pinned_use_cuda_host_register"] = tok.boolean(i)
        elif key in (
            "graph_capture_record_stream_reuse",
            "pinned_free_catch_all",
            "throw_on_cudamalloc_oom",
        ):
            tok.check(i + 1)
            i += 2
            v[key] = tok.boolean(i)
        elif key == "pinned_num_register_threads":
            tok.check(i + 1)
            i += 2
            val = tok.size_t(i)
            if not _is_pow2(val):
                raise ConfigError(f"Number of register threads has to be power of 2, got {val}")
            if val > _PINNED_MAX_REGISTER_THREADS:
                raise ConfigError(
                    "Number of register threads should be less than or equal to "
                    f"{_PINNED_MAX_REGISTER_THREADS}, got {val}"
                )
            v[key] = val
        elif key == "pinned_reserve_segment_size_mb":
            tok.check(i + 1)
            i += 2
            val = tok.size_t(i)
            if val == 0:
                raise ConfigError("Pinned reserve segment size has to be greater than 0")
            v[key] = val
        elif key == "per_process_memory_fraction":
            tok.check(i + 1)
            i += 2
            x = tok.double(i)
            if not (x >= 0.0 and x <= 1.0):
                raise ConfigError("per_process_memory_fraction is invalid, set it in [0.0, 1.0]")
            v[key] = x
        else:
            i = tok.skip_key(i)
        if i + 1 < n:
            tok.check(i + 1)
            i += 1
        i += 1
