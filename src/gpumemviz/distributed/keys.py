"""The job store's wire: which gpumemviz keys a rank writes, and the JSON that goes in them.

Ranks and the job view share nothing but the torch.distributed store of the job, so this module
is the whole contract between them: the key names (all under `PREFIX`), the compact JSON of a
rank's summary (at most `MAX_SUMMARY_BYTES`, key included), and the file names ranks write.
Values read back come from other processes, and anyone who reaches the store may have written
them: `decode` bounds a value before parsing it (`MAX_VALUE_BYTES`, `MAX_DEPTH`) and returns
None for anything that is not a JSON object; `check_summary` keeps only the fields a summary has,
each type- and range-checked, and says why a value is not a summary; every string a view shows
is untrusted text.
"""

from __future__ import annotations

import json
import math
from itertools import accumulate
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_RANKS",
    "MAX_SUMMARY_BYTES",
    "MAX_VALUE_BYTES",
    "MEMBERS",
    "OOM_COUNT",
    "PREFIX",
    "STALE_INTERVALS",
    "answer_key",
    "check_summary",
    "decode",
    "encode",
    "fit_summary",
    "member_entry",
    "oom_done_key",
    "oom_file",
    "oom_key",
    "parse_members",
    "peer_oom_file",
    "request_key",
    "request_nonce_key",
    "short_text",
    "snapshot_file",
    "summary_key",
]

PREFIX = "gpumemviz/"
MEMBERS = PREFIX + "members"  # appended "rank:device;" once a rank's first summary is there
OOM_COUNT = PREFIX + "oom/n"  # bumped by each rank that runs out of memory
MAX_SUMMARY_BYTES = 4096  # one summary: key plus value
STALE_INTERVALS = 3  # a summary older than this many of its rank's intervals is stale
_MAX_TEXT = 200  # longest string kept in a summary (host, verdict, label)
MAX_VALUE_BYTES = 64 << 10  # a value read back that is longer is not parsed
MAX_DEPTH = 32  # nor one nested deeper
MAX_RANKS = 4096  # (rank, device) pairs a view reads when the job's world size is unknown
_COUNT_LIMIT = 1 << 63  # counts and sizes are 0 <= x < 2**63
_MAX_BINS = 4096

Json = dict[str, Any]  # Any: a JSON object's values


def summary_key(rank: int, device: int) -> str:
    """Where rank `rank` publishes the summary of its device `device`."""
    return f"{PREFIX}s/{int(rank)}/{int(device)}"


def request_key(rank: int) -> str:
    """The counter a job view bumps to ask `rank` for its full snapshot."""
    return f"{PREFIX}req/{int(rank)}"


def answer_key(rank: int) -> str:
    """Where `rank` answers: ``{"n": requests served, "path": str | None, "error": ...}``."""
    return f"{PREFIX}ans/{int(rank)}"


def oom_key(n: int) -> str:
    """The `n`-th OOM of the job: ``{"rank", "device", "time"}`` of the rank that ran out."""
    return f"{PREFIX}oom/{int(n)}"


def oom_done_key(n: int) -> str:
    """The counter of ranks that wrote (or failed to write) their file for OOM `n`."""
    return f"{PREFIX}oom/{int(n)}/done"


def request_nonce_key(rank: int) -> str:
    """The nonce of the newest request to `rank`: its answer must echo it."""
    return f"{PREFIX}req/{int(rank)}/nonce"


def member_entry(rank: int, device: int) -> str:
    return f"{int(rank)}:{int(device)};"


def parse_members(text: str) -> list[tuple[int, int]]:
    """The (rank, device) pairs of the members key, sorted, each once; junk entries skipped.

    >>> parse_members("1:0;0:0;1:0;x;2:1;")
    [(0, 0), (1, 0), (2, 1)]
    """
    seen: set[tuple[int, int]] = set()
    for part in text.split(";"):
        rank, sep, device = part.partition(":")
        if sep and rank.isdigit() and device.isdigit():
            seen.add((int(rank), int(device)))
    return sorted(seen)


def snapshot_file(rank: int) -> str:
    """The file a rank writes when a job view asks for its snapshot."""
    return f"rank{int(rank)}.pickle"


def oom_file(rank: int) -> str:
    """The file a rank writes when it runs out of memory."""
    return f"rank{int(rank)}_oom.pickle"


def peer_oom_file(rank: int, at: int) -> str:
    """The file rank `rank` writes when rank `at` runs out of memory."""
    return f"rank{int(rank)}_at_rank{int(at)}_oom.pickle"


def encode(value: Json) -> bytes:
    """Compact JSON (ASCII, no NaN): what goes in the store."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii")


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


_DEPTH = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _depth(raw: bytes) -> int:
    """How deeply brackets nest in `raw`, strings ignored (a bound, checked before parsing)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return MAX_DEPTH  # too few brackets to nest deeper: the common case, no scan
    out = bytearray()
    in_string = escaped = False
    for c in raw:
        if in_string:
            if escaped:
                escaped = False
            elif c == 92:  # backslash
                escaped = True
            elif c == 34:  # quote
                in_string = False
        elif c == 34:
            in_string = True
        elif c in _DEPTH:
            out.append(c)
    return max(accumulate(_DEPTH[c] for c in out), default=0)


def decode(raw: bytes | str | None, limit: int = MAX_VALUE_BYTES) -> Json | None:
    """A JSON object read back from the store, or None for anything else: longer than `limit`
    bytes, nested deeper than `MAX_DEPTH`, NaN or infinity, not an object.

    >>> decode(b'{"rank": 1}'), decode(b"[1]"), decode(b"\\xff")
    ({'rank': 1}, None, None)
    >>> decode(b"[" * 40 + b"]" * 40), decode(b'{"t": NaN}')
    (None, None)
    """
    if raw is None:
        return None
    data = raw.encode("utf-8", "replace") if isinstance(raw, str) else bytes(raw)
    if len(data) > limit or _depth(data) > MAX_DEPTH:
        return None
    try:
        value = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _COUNT_LIMIT


def _finite(v: object) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return -_COUNT_LIMIT < v < _COUNT_LIMIT  # a 4000-digit int is no time
    return isinstance(v, float) and math.isfinite(v)


def _fraction(v: object) -> bool:
    return _finite(v) and 0.0 <= float(v) <= 1.0  # type: ignore[arg-type]


def _interval(v: object) -> bool:
    return _finite(v) and 0.0 < float(v) <= 86400.0  # type: ignore[arg-type]


def _bins(v: object) -> bool:
    return (
        isinstance(v, list)
        and len(v) <= _MAX_BINS
        and all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in v)
    )


_COUNTS = [
    "reserved",
    "allocated",
    "pending_free",
    "free",
    "free_releasable",
    "free_trapped",
    "largest_free",
    "segments",
    "blocks",
    "ooms",
    "alloc_retries",
    "pid",
    "local_rank",
]
_OPTIONAL_COUNTS = ("total", "device_free", "headroom")
_FLAGS = ("demo", "snapshots", "oom_files")
_TEXTS = ("host", "state", "source", "error")
_OOM_TEXTS = {"cause": 40, "explanation": 300}


def _check_oom(v: object) -> tuple[Json | None, str | None]:
    if v is None:
        return None, None
    if not isinstance(v, dict):
        return None, "last_oom is not an object"
    out: Json = {}
    for key, size in _OOM_TEXTS.items():
        if key in v:
            if not isinstance(v[key], str):
                return None, f"last_oom.{key} is not text"
            out[key] = short_text(v[key], size)
    for key in ("alloc_size", "device_free"):
        if key in v and v[key] is not None:
            if not _count(v[key]):
                return None, f"last_oom.{key} is not a size"
            out[key] = v[key]
    if "time" in v:
        if not _finite(v["time"]):
            return None, "last_oom.time is not a finite number"
        out["time"] = float(v["time"])
    return out, None


def check_summary(value: Json) -> tuple[Json | None, str | None]:
    """The fields of a rank's summary, each checked, or (None, why it is not one).

    Counts and sizes are ints 0 <= x < 2**63, times finite numbers, the interval 0 to 86400 s,
    fragmentation 0 to 1, texts cut to 200 characters, bins at most 4096 bytes; other keys are
    dropped.

    >>> check_summary({"time": 1.5, "interval": 1, "reserved": 8, "x": 1})
    ({'time': 1.5, 'interval': 1.0, 'reserved': 8}, None)
    >>> check_summary({"time": 1.5, "interval": 1, "reserved": -1})
    (None, 'reserved is not a count or size (0 <= x < 2**63)')
    """
    out: Json = {}
    for key in ("time", "sample_time"):
        if key in value:
            if not _finite(value[key]):
                return None, f"{key} is not a finite number"
            out[key] = float(value[key])
    if "interval" in value:
        if not _interval(value["interval"]):
            return None, "interval is not 0 to 86400 seconds"
        out["interval"] = float(value["interval"])
    for key in _COUNTS:
        if key in value:
            if not _count(value[key]):
                return None, f"{key} is not a count or size (0 <= x < 2**63)"
            out[key] = value[key]
    for key in _OPTIONAL_COUNTS:
        if key in value and value[key] is not None:
            if not _count(value[key]):
                return None, f"{key} is not a count or size (0 <= x < 2**63)"
            out[key] = value[key]
    if "fragmentation" in value:
        if not _fraction(value["fragmentation"]):
            return None, "fragmentation is not 0 to 1"
        out["fragmentation"] = float(value["fragmentation"])
    for key in _FLAGS:
        if key in value:
            if not isinstance(value[key], bool):
                return None, f"{key} is not true or false"
            out[key] = value[key]
    for key in _TEXTS:
        if key in value and value[key] is not None:
            if not isinstance(value[key], str):
                return None, f"{key} is not text"
            out[key] = short_text(value[key])
    if "bins" in value:
        if not _bins(value["bins"]):
            return None, "bins is not a list of at most 4096 bytes"
        out["bins"] = value["bins"]
    if "last_oom" in value:
        oom, why = _check_oom(value["last_oom"])
        if why is not None:
            return None, why
        out["last_oom"] = oom
    return out, None


def short_text(text: object, limit: int = _MAX_TEXT) -> str:
    """A string bounded to `limit` characters (an ellipsis marks a cut)."""
    s = str(text)
    return s if len(s) <= limit else s[: limit - 1] + "\u2026"


def fit_summary(key: str, summary: Json) -> bytes:
    """`summary` encoded within `MAX_SUMMARY_BYTES` with its key: the OOM explanation goes
    first, then the map's bins are halved, then the strings are cut; raises ValueError if even
    that does not fit (it always does for a summary this package builds).

    >>> big = {"rank": 0, "bins": [63] * 4096, "last_oom": {"explanation": "x" * 5000}}
    >>> out = decode(fit_summary("k", big))
    >>> len(out["bins"]) < 4096 and "explanation" not in out["last_oom"]
    True
    """
    value = dict(summary)
    raw = encode(value)
    if len(key) + len(raw) <= MAX_SUMMARY_BYTES:
        return raw
    oom = value.get("last_oom")
    if isinstance(oom, dict) and "explanation" in oom:
        value["last_oom"] = {k: v for k, v in oom.items() if k != "explanation"}
    bins = value.get("bins")
    while True:
        raw = encode(value)
        if len(key) + len(raw) <= MAX_SUMMARY_BYTES:
            return raw
        if isinstance(bins, list) and len(bins) > 1:
            # neighbours merged: the larger cell byte keeps the more allocated / the kind
            bins = [max(bins[i : i + 2]) for i in range(0, len(bins), 2)]
            value["bins"] = bins
            continue
        cut = {k: short_text(v, 40) if isinstance(v, str) else v for k, v in value.items()}
        raw = encode(cut)
        if len(key) + len(raw) <= MAX_SUMMARY_BYTES:
            return raw
        raise ValueError(f"a summary of {len(raw)} bytes does not fit {MAX_SUMMARY_BYTES}")
