"""The job store's wire: which gpumemviz keys a rank writes, and the JSON that goes in them.

Ranks and the job view share nothing but the torch.distributed store of the job, so this module
is the whole contract between them: the key names (all under `PREFIX`), the compact JSON of a
rank's summary (at most `MAX_SUMMARY_BYTES`, key included), and the file names ranks write.
Values read back come from other processes: `decode` returns None for anything that is not a
JSON object, and every string a view shows is untrusted text.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "MAX_SUMMARY_BYTES",
    "MEMBERS",
    "OOM_COUNT",
    "PREFIX",
    "STALE_INTERVALS",
    "answer_key",
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


def decode(raw: bytes | str | None) -> Json | None:
    """A JSON object read back from the store, or None for anything else.

    >>> decode(b'{"rank": 1}'), decode(b"[1]"), decode(b"\\xff")
    ({'rank': 1}, None, None)
    """
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


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
