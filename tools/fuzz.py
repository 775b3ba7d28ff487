"""Fuzz everything that reads untrusted snapshot input (`make fuzz`).

Snapshot files come from strangers. The only acceptable outcomes of reading one are a `Snapshot`
or a one-line `SnapshotError` (the CLI: status 0, or status 2 with one line on stderr): no other
exception, no hang, no memory blow-up, and a global named in a pickle never runs.

How: a seeded, structure-aware mutation fuzzer. Seeds are the real snapshot files and small
slices of them (pickle protocols 2, 4, 5 and JSON). Mutations: byte flips, truncations, opcode
splices (delete, duplicate, move, cross-seed insert), opcode swaps, huge declared lengths and
memo indices, deep nesting and memo cycles, injected globals (GLOBAL, STACK_GLOBAL, INST, OBJ,
EXT, PERSID) pointing at a canary, and for dicts wrong types, huge and negative numbers, NaN,
removed keys and swapped subtrees. Inputs that produce a new outcome (exception type and message
shape) join the corpus and are mutated further, so the fuzzer digs into validation rather than
stopping at the first parse error. A share of the cases (``--shapes``) are built rather than
mutated (tools/fuzz_shapes.py): shared-reference DAGs where a snapshot keeps free-form data,
odd field types, and strings a terminal must not receive.

The CLI target runs ``inspect`` (text and --json), ``diff``, ``export --format json`` and
``report`` on each case: status 0, or 2 with one line on stderr; no control character, ESC,
bidi override or lone surrogate in what it prints; no NaN or Infinity in the JSON it writes.

Each case runs in a worker process under a guard: the parent kills the worker when a case runs
past ``--case-timeout`` or its RSS passes ``--rss-mb``, saves the input that did it, and starts a
new worker; the worker also caps its address space (RLIMIT_AS) so one allocation cannot take the
machine. Findings are saved under ``--out`` (default build/fuzz/) with a traceback and a shrunk
reproducer; `KNOWN` lists the ones already reported to their owners.

Run: ``python tools/fuzz.py [--seconds 600] [--seed N] [--targets pickle,json,dict,cli]``;
``python tools/fuzz.py --target cli --reproduce FILE...`` runs saved cases again.
"""

from __future__ import annotations

import argparse
import contextlib
import copyreg
import hashlib
import io
import json
import math
import os
import pickle
import pickletools
import random
import re
import resource
import select
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))  # the sibling module, also when loaded by file path
import fuzz_shapes  # noqa: E402

#: Where seeds come from: the shipped real files and stand-ins, and ../shared's when present.
SEED_DIRS = (
    REPO / "tests" / "data" / "real",
    REPO / "tests" / "data" / "standin",
    REPO.parent / "shared" / "real-snapshots",
)
TARGETS = ("pickle", "json", "dict", "cli")
CANARY = "gpumemviz_fuzz_canary"

#: Findings already reported to the module's owner, by signature; the seeded test slice tolerates
#: (and counts) them. Remove an entry once its owner fixed it, and add a regression test then.
KNOWN: dict[str, str] = {}


# --------------------------------------------------------------------------------------------
# the canary: globals a hostile pickle names resolve to it; if anything of it runs, that's fatal


def install_canary() -> types.ModuleType:
    """A module whose every callable records that it ran (a refused global never gets here)."""
    mod = types.ModuleType(CANARY)
    mod.tripped = []  # type: ignore[attr-defined]

    def trip(*args: Any, **kw: Any) -> None:
        mod.tripped.append(args)  # type: ignore[attr-defined]

    class Canary:
        def __new__(cls, *a: Any, **k: Any) -> Canary:  # INST and NEWOBJ call only __new__
            trip(a)
            return super().__new__(cls)

        def __init__(self, *a: Any, **k: Any) -> None:
            trip(a)

        def __reduce__(self) -> tuple:
            return (trip, ("reduce",))

        def __setstate__(self, state: Any) -> None:
            trip(state)

    mod.trip = trip  # type: ignore[attr-defined]
    mod.Canary = Canary  # type: ignore[attr-defined]
    mod.system = trip  # type: ignore[attr-defined]
    sys.modules[CANARY] = mod
    for name, code in _EXT_CODES.items():  # so EXT1/2/4 opcodes name the canary too
        if copyreg._extension_registry.get((CANARY, name)) != code:  # type: ignore[attr-defined]
            copyreg.add_extension(CANARY, name, code)
    return mod


_EXT_CODES = {"trip": 0xED, "system": 0x5EED, "Canary": 0x5EED01}


def _canary_payloads() -> list[bytes]:
    """Opcode sequences that push one object built by calling a canary global."""
    c = CANARY.encode()
    sb = len(c).to_bytes(1, "little")
    return [
        b"c" + c + b"\ntrip\n(S'x'\ntR",  # GLOBAL + REDUCE (protocol 0)
        b"c" + c + b"\nsystem\n(S'true'\ntR",
        b"\x8c" + sb + c + b"\x8c\x04trip\x93)R",  # STACK_GLOBAL + REDUCE (protocol 4)
        b"(i" + c + b"\nCanary\n",  # INST
        b"(c" + c + b"\nCanary\no",  # OBJ
        b"c" + c + b"\nCanary\n)\x81",  # NEWOBJ
        b"c" + c + b"\nCanary\n)}\x92",  # NEWOBJ_EX
        b"\x82\xed(S'x'\ntR",  # EXT1 (copyreg's registry) + REDUCE
        b"\x83\xed\x5e(S'x'\ntR",  # EXT2
        b"\x84\x01\xed\x5e\x00)\x81",  # EXT4 + NEWOBJ
        b"P1\n",  # PERSID
        b"U\x01x\x51",  # BINPERSID
        b"c" + c + b"\nCanary\n)\x81}b",  # NEWOBJ, then BUILD (__setstate__)
    ]


# --------------------------------------------------------------------------------------------
# seeds


@dataclass
class Seeds:
    """Torch dicts (real and sliced) and their encodings, built once per process."""

    dicts: list[dict]
    pickles: list[bytes]
    jsons: list[bytes]
    big_pickles: list[bytes]
    ops: dict[int, list[int]] = field(default_factory=dict)  # id(pickle) -> opcode offsets

    def offsets(self, data: bytes) -> list[int]:
        key = id(data)
        if key not in self.ops:
            pos = []
            with contextlib.suppress(Exception):
                for _, _, p in pickletools.genops(data):
                    pos.append(p)
            self.ops[key] = pos or [0]
        return self.ops[key]


def _slice_dict(d: Any, rng: random.Random) -> Any:
    """A small copy of a real snapshot: a few segments and trace entries keep it fast."""
    if isinstance(d, list):
        return d[: rng.randint(0, 3)]
    out = dict(d)
    segs = d.get("segments", [])
    if segs:
        start = rng.randrange(len(segs))
        out["segments"] = segs[start : start + rng.randint(0, 4)]
    traces = d.get("device_traces")
    if isinstance(traces, list):
        out["device_traces"] = [
            t[(s := rng.randrange(max(1, len(t)))) : s + rng.randint(0, 40)] for t in traces
        ]
    return out


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=repr))


def seed_files(dirs: tuple[Path, ...] = SEED_DIRS) -> list[Path]:
    """The recorded snapshots in `dirs` (absent ones skipped), one copy per file name (the
    first folder's wins), by name."""
    found: dict[str, Path] = {}
    for d in dirs:
        for path in sorted(d.glob("*.pickle")) if d.is_dir() else []:
            found.setdefault(path.name, path)
    return [found[name] for name in sorted(found)]


def load_seeds(seed: int, dirs: tuple[Path, ...] = SEED_DIRS, slices: int = 6) -> Seeds:
    """Recorded files (whole) plus `slices` small slices of each, as pickle 2/4/5 and JSON."""
    rng = random.Random(seed)
    from gpumemviz.io import loads_restricted  # the fuzzer trusts the files it was given

    dicts: list[dict] = []
    big: list[bytes] = []
    for path in seed_files(dirs):
        data = path.read_bytes()
        big.append(data)
        d = loads_restricted(data)
        dicts += [_slice_dict(d, rng) for _ in range(slices)]
    # plain shapes every generation of torch has written, so a missing shared/ still fuzzes
    dicts += [
        {"segments": [], "device_traces": [[]]},
        [
            {
                "device": 0,
                "address": 4096,
                "total_size": 2097152,
                "stream": 0,
                "segment_type": "small",
                "allocated_size": 512,
                "active_size": 512,
                "requested_size": 100,
                "blocks": [
                    {"size": 512, "state": "active_allocated", "requested_size": 100},
                    {"size": 2096640, "state": "inactive", "requested_size": 0},
                ],
            }
        ],
    ]
    pickles = [pickle.dumps(d, protocol=rng.choice((2, 4, 5))) for d in dicts]
    jsons = [json.dumps(_jsonable(d)).encode() for d in dicts]
    return Seeds(dicts=dicts, pickles=pickles, jsons=jsons, big_pickles=big)


# --------------------------------------------------------------------------------------------
# mutators

_LEN_OPS = {  # opcode byte -> width of its length / index argument
    b"X"[0]: 4,  # BINUNICODE
    b"B"[0]: 4,  # BINBYTES
    b"T"[0]: 4,  # BINSTRING
    0x8A: 1,  # LONG1
    0x8B: 4,  # LONG4
    0x8C: 1,  # SHORT_BINUNICODE
    0x8D: 8,  # BINUNICODE8
    0x8E: 8,  # BINBYTES8
    0x96: 8,  # BYTEARRAY8
    0x95: 8,  # FRAME
    b"r"[0]: 4,  # LONG_BINPUT
    b"j"[0]: 4,  # LONG_BINGET
    b"q"[0]: 1,  # BINPUT
    b"h"[0]: 1,  # BINGET
    b"C"[0]: 1,  # SHORT_BINBYTES
    b"U"[0]: 1,  # SHORT_BINSTRING
}
_HUGE = [
    0,
    1,
    0x7F,
    0xFF,
    0xFFFF,
    0x7FFFFFFF,
    0xFFFFFFFF,
    0x100000,
    0x1000000,
    2**63 - 1,
    2**64 - 1,
]
_OPCODES = bytes(sorted({op.code.encode("latin-1")[0] for op in pickletools.opcodes}))


def _flip(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    if not b:
        return bytes([rng.randrange(256)])
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
        i = rng.randrange(len(b))
        b[i] = rng.randrange(256) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
    return bytes(b)


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def _splice(data: bytes, seeds: Seeds, rng: random.Random) -> bytes:
    """Delete, duplicate or move a run of opcodes, or insert one from another seed."""
    pos = [*seeds.offsets(data), len(data)]
    i, j = sorted(rng.sample(range(len(pos)), 2)) if len(pos) > 1 else (0, 0)
    a, b = pos[i], pos[j]
    k = pos[rng.randrange(len(pos))]
    kind = rng.randrange(4)
    if kind == 0:
        return data[:a] + data[b:]
    if kind == 1:
        return data[:b] + data[a:b] + data[b:]
    if kind == 2:
        chunk = data[a:b]
        rest = data[:a] + data[b:]
        k = min(k, len(rest))
        return rest[:k] + chunk + rest[k:]
    other = rng.choice(seeds.pickles)
    opos = [*seeds.offsets(other), len(other)]
    x, y = sorted(rng.sample(range(len(opos)), 2)) if len(opos) > 1 else (0, 0)
    return data[:k] + other[opos[x] : opos[y]] + data[k:]


def _swap_opcode(data: bytes, seeds: Seeds, rng: random.Random) -> bytes:
    pos = seeds.offsets(data)
    p = rng.choice(pos)
    if p >= len(data):
        return data
    return data[:p] + bytes([rng.choice(_OPCODES)]) + data[p + 1 :]


def _huge_length(data: bytes, seeds: Seeds, rng: random.Random) -> bytes:
    """Overwrite the length or memo index of a length-prefixed opcode with an edge value."""
    cands = [p for p in seeds.offsets(data) if p < len(data) and data[p] in _LEN_OPS]
    if not cands:
        return _flip(data, rng)
    p = rng.choice(cands)
    w = _LEN_OPS[data[p]]
    v = rng.choice(_HUGE) % (1 << (8 * w))
    return data[: p + 1] + v.to_bytes(w, "little") + data[p + 1 + w :]


def _deep(rng: random.Random) -> bytes:
    """Deep nesting, memo cycles and huge declarations, built from scratch."""
    n = rng.choice((10, 70, 1000, 100_000, 1_000_000))
    kind = rng.randrange(7)
    if kind == 0:  # nested lists through MARK ... LIST
        return b"\x80\x02" + b"(" * n + b"l" * n + b"."
    if kind == 1:  # nested lists through EMPTY_LIST + APPEND
        return b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."
    if kind == 2:  # a dict that contains itself
        return b"\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02h\x00aX\x01\x00\x00\x00xh\x00u."
    if kind == 3:  # a list that contains itself
        return b"\x80\x02]q\x00h\x00a."
    if kind == 4:  # a memo index far out of range
        idx = rng.choice((0x100000, 0x1000000, 0x10000000, 0xFFFFFFFF))
        return b"\x80\x04N" + b"r" + struct.pack("<I", idx) + b"."
    if kind == 5:  # a frame or string declaring gigabytes
        return b"\x80\x04\x95" + struct.pack("<Q", rng.choice(_HUGE)) + b"X\xff\xff\xff\x7fab."
    # shared references: level j is [level j-1, level j-1], a 2**n tree in a small file
    body = b"\x80\x02]q\x00"
    for j in range(min(n, 250)):
        body += b"(h" + bytes([j]) + b"h" + bytes([j]) + b"lq" + bytes([j + 1])
    return body + b"."


def _inject(data: bytes, seeds: Seeds, rng: random.Random) -> bytes:
    pay = rng.choice(_canary_payloads())
    pos = seeds.offsets(data)
    k = rng.choice(pos)
    if rng.random() < 0.3:  # a whole pickle that is just the payload
        return b"\x80\x02" + pay + b"."
    return data[:k] + pay + data[k:]


def mutate_pickle(data: bytes, seeds: Seeds, rng: random.Random) -> bytes:
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        r = rng.random()
        if r < 0.25:
            data = _flip(data, rng)
        elif r < 0.35:
            data = _truncate(data, rng)
        elif r < 0.6:
            data = _splice(data, seeds, rng)
        elif r < 0.7:
            data = _swap_opcode(data, seeds, rng)
        elif r < 0.82:
            data = _huge_length(data, seeds, rng)
        elif r < 0.92:
            data = _inject(data, seeds, rng)
        else:
            data = _deep(rng)
    return data


_JSON_TOKENS = [
    b"1e400", b"-1", b"18446744073709551617", b"NaN", b"-Infinity", b"null", b"true", b'""',
    b'"\\ud800"', b"[]", b"{}", b"0.5", b'"active_allocated"', b'"segments"', b"-0",
    b"123456789012345678901234567890", b"1" + b"0" * 5000, b'"\\u001b]0;x\\u0007"',
]  # fmt: skip


def mutate_json(data: bytes, seeds: Seeds, rng: random.Random) -> bytes:
    for _ in range(rng.choice((1, 1, 2, 3))):
        r = rng.random()
        if r < 0.2:
            data = _flip(data, rng)
        elif r < 0.3:
            data = _truncate(data, rng)
        elif r < 0.7:  # replace a token (number, string, literal) with an edge value
            toks = [
                m.span()
                for m in re.finditer(rb'-?\d[\d.eE+-]*|"(?:[^"\\]|\\.)*"|true|false|null', data)
            ]
            if toks:
                a, b = rng.choice(toks)
                data = data[:a] + rng.choice(_JSON_TOKENS) + data[b:]
        elif r < 0.8:  # duplicate or delete a span between commas
            commas = [m.start() for m in re.finditer(rb",", data)] or [0]
            a, b = sorted((rng.choice(commas), rng.choice(commas)))
            data = data[:a] + data[b:] if rng.random() < 0.5 else data[:b] + data[a:b] + data[b:]
        elif r < 0.9:  # deep nesting
            n = rng.choice((70, 1000, 100_000))
            data = (
                (b"[" * n + b"]" * n)
                if rng.random() < 0.5
                else b'{"segments":' * n + b"[]" + b"}" * n
            )
        else:
            data = rng.choice((b"\xef\xbb\xbf", b" \n\t", b"\x00")) + data
    return data


_WEIRD: list[Any] = [
    None, "", "x", "active_allocated", "inactive", "large", "small", -1, 0, 1, 2**31, 2**63,
    2**64 + 1, -(2**63) - 1, 1.5, math.nan, math.inf, -math.inf, True, False, [], {}, [[]],
    [{}], {"size": 1}, b"\x00", (1, 2),
]  # fmt: skip


def _nodes(obj: Any, limit: int = 5000) -> list[tuple[Any, Any]]:
    """(container, key) of up to `limit` slots, breadth-first."""
    out: list[tuple[Any, Any]] = []
    level = [obj]
    while level and len(out) < limit:
        nxt = []
        for c in level:
            its = c.items() if isinstance(c, dict) else enumerate(c)
            for k, v in its:
                out.append((c, k))
                if isinstance(v, dict | list):
                    nxt.append(v)
        level = nxt
    return out


def _copy(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj, protocol=5))


def mutate_dict(obj: Any, seeds: Seeds, rng: random.Random) -> Any:
    try:
        obj = _copy(obj)
    except RecursionError:  # a corpus entry nested too deep to copy: start from a seed
        obj = _copy(rng.choice(seeds.dicts))
    holder = [obj]
    for _ in range(rng.choice((1, 1, 2, 3, 5))):
        with contextlib.suppress(RecursionError):  # a deep value met copy or str: leave it
            _mutate_slot(holder, rng)
    return holder[0]


def _mutate_slot(holder: list, rng: random.Random) -> None:
    """One structure-aware change at a random slot of the tree."""
    slots = _nodes(holder)
    c, k = rng.choice(slots)
    r = rng.random()
    if r < 0.45:
        c[k] = _copy(rng.choice(_WEIRD)) if rng.random() < 0.9 else _deep_obj(rng)
    elif r < 0.6 and isinstance(c, dict):
        del c[k]
    elif r < 0.7 and isinstance(c, list):
        c.insert(k, _copy(c[k]))  # duplicate a segment, block or trace entry
    elif r < 0.8 and isinstance(c[k], int) and not isinstance(c[k], bool):
        c[k] = rng.choice((-c[k], c[k] * 2**40, c[k] + 1, c[k] - 1, 0))
    elif r < 0.9:
        c2, k2 = rng.choice(slots)
        with contextlib.suppress(Exception):
            c[k], c2[k2] = c2[k2], c[k]
    elif isinstance(c, dict):
        c[rng.choice(("segments", "device_traces", "allocator_settings", "zzz", 7, None))] = _copy(
            rng.choice(_WEIRD)
        )
    else:
        c[k] = str(c[k])


def _deep_obj(rng: random.Random) -> Any:
    n = rng.choice((70, 1000, 50_000))
    x: Any = []
    for _ in range(n):
        x = [x]
    return x


def shaped_case(target: str, seeds: Seeds, rng: random.Random) -> Any:
    """One input for `target` built by tools/fuzz_shapes.py from a seed: a shared-reference
    DAG or odd field types (JSON, which has no references, gets odd fields only)."""
    base = rng.choice(seeds.dicts)
    if target == "json" or rng.random() < 0.5:
        shaped = fuzz_shapes.odd_fields_case(base, rng)
    else:
        shaped = fuzz_shapes.shared_case(base, rng)
    if target == "dict":
        return shaped
    if target == "json":
        return json.dumps(shaped, allow_nan=True).encode()
    return pickle.dumps(shaped, protocol=rng.choice((2, 4, 5)))


def make_case(
    target: str, seeds: Seeds, corpus: list, rng: random.Random, shapes: float = 0.0
) -> Any:
    """One input for `target`: a mutation of a seed (or of a corpus entry that got somewhere),
    or with probability `shapes` a shaped case (`shaped_case`)."""
    if shapes and rng.random() < shapes:
        return shaped_case(target, seeds, rng)
    if target == "dict":
        base = rng.choice(corpus) if corpus and rng.random() < 0.5 else rng.choice(seeds.dicts)
        return mutate_dict(base, seeds, rng)
    if target == "json":
        base = rng.choice(corpus) if corpus and rng.random() < 0.5 else rng.choice(seeds.jsons)
        return mutate_json(base, seeds, rng)
    if target == "cli" and rng.random() < 0.2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if target == "cli" and rng.random() < 0.3:
        return mutate_json(rng.choice(seeds.jsons), seeds, rng)
    if seeds.big_pickles and rng.random() < 0.03:
        base = rng.choice(seeds.big_pickles)
    elif corpus and rng.random() < 0.5:
        base = rng.choice(corpus)
    else:
        base = rng.choice(seeds.pickles)
    return mutate_pickle(base, seeds, rng)


# --------------------------------------------------------------------------------------------
# targets: each returns an outcome signature, or raises Finding


class Finding(Exception):
    """An unacceptable outcome: `sig` groups repeats, `detail` says what happened."""

    def __init__(self, sig: str, detail: str) -> None:
        super().__init__(detail)
        self.sig = sig
        self.detail = detail


def _shape(msg: str) -> str:
    """An error message with its numbers and quoted parts blanked: the outcome's kind."""
    msg = re.sub(r"'[^']*'|\"[^\"]*\"|b'[^']*'", "Q", msg)
    return re.sub(r"\d+(\.\d+)?\s*(B|KiB|MiB|GiB|TiB|bytes)?", "N", msg)[:80]


def _where(tb: Any) -> str:
    frames = traceback.extract_tb(tb)
    inner = [f for f in frames if "gpumemviz" in f.filename] or frames
    f = inner[-1]
    return f"{Path(f.filename).name}:{f.name}"


def _check_error(e: BaseException, what: str) -> str:
    from gpumemviz.snapshot import SnapshotError

    if isinstance(e, MemoryError) or "needs more memory" in str(e):
        raise Finding(f"memory@{what}", f"{type(e).__name__}: {e}") from e
    if not isinstance(e, SnapshotError):
        sig = f"{type(e).__name__}@{_where(e.__traceback__)}"
        raise Finding(sig, "".join(traceback.format_exception(e))) from e
    msg = str(e)
    if not msg or "\n" in msg:
        raise Finding("multiline@" + _where(e.__traceback__), f"SnapshotError message {msg!r}")
    if "internal error" in msg:  # load_snapshot's one line for an exception it did not expect
        cause = e.__cause__ or e
        raise Finding(f"{type(cause).__name__}@{_where(cause.__traceback__)}", msg) from e
    return "SnapshotError:" + _shape(msg)


def run_loader(data: Any, target: str) -> str:
    """pickle/json: load_snapshot on the bytes; dict: from_torch then validate (and load)."""
    from gpumemviz.io import load_snapshot, loads_restricted
    from gpumemviz.snapshot import Snapshot, validate

    try:
        if target == "dict":
            snap = Snapshot.from_torch(data)
            validate(snap)
            snap = load_snapshot(data)
        else:
            if target == "pickle" and data[:1] == b"\x80":
                with contextlib.suppress(Exception):
                    loads_restricted(data, max_bytes=64 << 20)  # the canary still must not run
            snap = load_snapshot(data, max_bytes=64 << 20)
    except RecursionError as e:  # one finding per module: the deep value is the cause
        where = _where(e.__traceback__).split(":")[0]
        raise Finding(
            "RecursionError@" + where, "".join(traceback.format_exception(e))[-3000:]
        ) from e
    except Exception as e:  # every exception is judged
        return _check_error(e, "loads_restricted" if target == "pickle" else target)
    if not isinstance(snap, Snapshot):
        raise Finding("not-a-snapshot", f"returned {type(snap).__name__}")
    return "Snapshot"


def _fragmentation_outcome(data: Any, through_snapshot: bool = False) -> tuple:
    """`gpumemviz.fragmentation` on a torch dict (or on `Snapshot.from_torch` of it): what a
    user sees of it, comparable."""
    from dataclasses import fields

    import numpy as np

    from gpumemviz.analysis.fragmentation import fragmentation
    from gpumemviz.snapshot import Snapshot, SnapshotError

    try:
        r = fragmentation(Snapshot.from_torch(data) if through_snapshot else data)
    except RecursionError as e:
        where = _where(e.__traceback__).split(":")[0]
        raise Finding(
            "frag:RecursionError@" + where, "".join(traceback.format_exception(e))[-3000:]
        ) from e
    except SnapshotError as e:
        return ("error", str(e))
    except Exception as e:  # every exception is judged
        sig = f"frag:{type(e).__name__}@{_where(e.__traceback__)}"
        raise Finding(sig, "".join(traceback.format_exception(e))[-3000:]) from e
    cols = []
    for f in fields(r.per_segment):
        a = np.asarray(getattr(r.per_segment, f.name))
        cols.append((f.name, a.dtype.str, a.shape, a.tobytes()))
    fits = []
    for d in sorted(r.devices)[:2]:
        for n in (512, 3 << 20, 25 << 20):
            for free in (None, 0):
                try:
                    fits.append(repr(r.can_fit(n, device=d, device_free=free)))
                except (ValueError, TypeError) as e:
                    fits.append(f"{type(e).__name__}: {e}")
    return ("report", repr(r.to_dict()), tuple(cols), tuple(fits))


#: What only `Snapshot.from_torch` reads, so only it may refuse: the segments' own sums, block
#: addresses, trace entries (the reader's messages: `gpumemviz.snapshot.read_torch`).
FULL_ONLY = re.compile(
    r"^(device_traces\[\d+\]"
    r"|.*(\): | has no )(allocated|active|requested)_size( is |$)"
    r"|.*: block \d+: address is )"
)


def run_fragmentation(data: Any) -> str:
    """dict: `fragmentation(d)` against `fragmentation(Snapshot.from_torch(d))`, which read `d`
    with the same reader: a report or a one-line SnapshotError, and the same one both ways
    (report, per-segment columns, can_fit answers or error message). Only `from_torch` may
    refuse what the analysis does not read (`FULL_ONLY`). A difference is a finding."""
    if not isinstance(data, dict | list):
        return "frag:skip"  # a str or bytes would be read as a file
    try:
        twin = pickle.loads(pickle.dumps(data, protocol=5))  # what neither call has touched
    except RecursionError:
        twin = None
    by_dict = _fragmentation_outcome(data)
    if by_dict[0] == "error" and ("\n" in by_dict[1] or not by_dict[1]):
        raise Finding("frag:multiline", f"SnapshotError message {by_dict[1]!r}")
    if twin is None:
        return "frag:" + (_shape(by_dict[1]) if by_dict[0] == "error" else "report")
    by_snap = _fragmentation_outcome(twin, through_snapshot=True)
    if by_dict[0] == "report" and by_snap[0] == "error" and FULL_ONLY.match(by_snap[1]):
        return "frag:report/from_torch:" + _shape(by_snap[1])
    if by_dict != by_snap:
        if by_dict[0] != by_snap[0]:
            part = "outcome"
        elif by_dict[0] == "error":
            part = "error"
        else:
            part = next(
                name
                for name, i in (("report", 1), ("columns", 2), ("can_fit", 3))
                if by_dict[i] != by_snap[i]
            )
        detail = (
            f"fragmentation(dict):\n{str(by_dict[:3])[:3000]}\n"
            f"fragmentation(Snapshot.from_torch(dict)):\n{str(by_snap[:3])[:3000]}"
        )
        raise Finding(f"frag-differs@{part}", detail)
    return "frag:" + (_shape(by_dict[1]) if by_dict[0] == "error" else "report")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} in JSON output")


def _check_printed(cmd: str, stream: str, text: str) -> None:
    """What a command printed: UTF-8 a terminal takes, and no control sequence from the file."""
    try:  # a terminal takes UTF-8: a lone surrogate in the report would be a traceback
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Finding(f"cli:{stream}-not-utf8@{cmd}", f"{e}") from None
    bad = fuzz_shapes.control_chars(text)
    if bad:
        detail = f"{cmd} printed {', '.join(sorted(set(bad)))} on {stream}: {text[:2000]!r}"
        raise Finding(f"cli:control-chars@{cmd}", detail)


def _check_json(cmd: str, text: str) -> None:
    """JSON gpumemviz writes: strict JSON (no NaN, no Infinity)."""
    try:
        json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        raise Finding(f"cli:json@{cmd}", f"{e}: {text[:2000]!r}") from None


#: The case file's name: a file name is printed too, and may hold what a terminal must not get.
CASE_NAME = "case \x1b]0;title\x07\u202eevil.bin"
#: What `diff` compares each case with: a plain one-segment snapshot (written once).
BASE_SEGMENTS = [
    {"device": 0, "address": 1 << 40, "total_size": 2 << 20, "stream": 0,
     "segment_type": "small", "allocated_size": 512, "active_size": 512, "requested_size": 512,
     "blocks": [{"size": 512, "state": "active_allocated", "requested_size": 512},
                {"size": (2 << 20) - 512, "state": "inactive", "requested_size": 0}]},
]  # fmt: skip
#: The CLI runs of each case: (name, argv with FILE, BASE and OUT to fill in, whether stdout is
#: JSON).
CLI_RUNS = (
    ("inspect", ["inspect", "FILE"], False),
    ("inspect-json", ["inspect", "FILE", "--json"], True),
    ("diff", ["diff", "BASE", "FILE"], False),
    ("export-json", ["export", "FILE", "-o", "OUT", "--format", "json"], False),
    ("report", ["report", "FILE", "-o", "OUT", "--no-replay"], False),
)


def run_cli(data: bytes, tmp: Path) -> str:
    """The CLI on FILE (`CLI_RUNS`): status 0, or 2 with one stderr line; what it prints is
    terminal-safe UTF-8 and the JSON it prints or writes is strict."""
    from gpumemviz.cli import main

    path = tmp / CASE_NAME
    path.write_bytes(data)
    base = tmp / "base.pickle"
    if not base.exists():
        base.write_bytes(pickle.dumps(BASE_SEGMENTS, protocol=4))
    outs = []
    for name, argv, json_out in CLI_RUNS:
        out_file = tmp / f"out-{name}"
        out_file.unlink(missing_ok=True)
        fill = {"FILE": str(path), "BASE": str(base), "OUT": str(out_file)}
        args = [fill.get(a, a) for a in argv]
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(args)
        except BaseException as e:  # every exception out of main is judged
            if isinstance(e, KeyboardInterrupt):
                raise
            sig = f"cli:{type(e).__name__}@{_where(e.__traceback__)}"
            raise Finding(sig, "".join(traceback.format_exception(e))) from e
        _check_printed(name, "stdout", out.getvalue())
        _check_printed(name, "stderr", err.getvalue())
        lines = err.getvalue().splitlines()
        if rc == 2:
            if len(lines) != 1 or not lines[0].startswith(f"gpumemviz {argv[0]}: error: "):
                raise Finding(f"cli:stderr@{name}", f"status 2 with stderr {err.getvalue()!r}")
            if "needs more memory" in lines[0]:
                raise Finding("memory@cli", lines[0])
            outs.append("2:" + _shape(lines[0]))
            continue
        if rc != 0:
            raise Finding(f"cli:status{rc}@{name}", err.getvalue())
        outs.append("0")
        if json_out:
            _check_json(name, out.getvalue())
        if "json" in argv and out_file.exists():
            _check_json(name, out_file.read_text(encoding="utf-8", errors="replace"))
    return " ".join(outs)


# --------------------------------------------------------------------------------------------
# worker: runs cases in order, reports each on stdout; the parent guards it


def _encode_case(case: Any) -> bytes:
    if isinstance(case, bytes):
        return case
    try:
        return b"PICKLE4" + pickle.dumps(case, protocol=4)
    except RecursionError:  # nested deeper than pickle goes: say what it was
        try:
            return b"REPR" + repr(case).encode()[:1_000_000]
        except RecursionError:
            return b"UNSAVED nested deeper than repr goes: " + type(case).__name__.encode()


def decode_case(raw: bytes) -> Any:
    """The input a saved reproducer holds (a dict case is saved as a protocol-4 pickle)."""
    if raw.startswith(b"PICKLE4"):
        return pickle.loads(raw[7:])  # our own file, written by the fuzzer itself
    return raw


def _set_rlimit(extra_mb: int) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    with Path("/proc/self/statm").open() as f:
        vm = int(f.read().split()[0]) * page
    lim = vm + (extra_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))


def _save(out: Path, sig: str, case: Any, detail: str) -> Path:
    raw = _encode_case(case)
    h = hashlib.sha1(sig.encode()).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", sig)[:60] + "-" + h
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"{name}.bin"
    if not p.exists() or p.stat().st_size > len(raw):  # keep the smallest reproducer
        p.write_bytes(raw)
        (out / f"{name}.txt").write_text(f"{sig}\n{detail}\n")
    return p


def shrink(case: bytes, check: Callable[[bytes], bool], budget_s: float = 5.0) -> bytes:
    """Remove chunks (halving their size) while `check` still reproduces the same finding."""
    end = time.monotonic() + budget_s
    n = max(1, len(case) // 2)
    while n >= 1 and time.monotonic() < end:
        i, changed = 0, False
        while i < len(case) and time.monotonic() < end:
            cand = case[:i] + case[i + n :]
            if cand and check(cand):
                case, changed = cand, True
            else:
                i += n
        if not changed:
            n //= 2
    return case


def run_case(target: str, case: Any, tmp: Path) -> str:
    """One case through its target's oracle: its outcome, or a Finding raised."""
    if target == "_hang":  # the guard's self-test
        time.sleep(3600)
    if target == "cli":
        return run_cli(case, tmp)
    if target == "dict":  # both judged: the loader's finding first
        return run_loader(case, target) + " " + run_fragmentation(case)
    return run_loader(case, target)


def _memory_reproduces(case: Any, args: argparse.Namespace) -> bool:
    """Whether a case that ran out of memory does so in a fresh process under the same cap.

    A worker's heap grows and fragments over thousands of cases, so a long-lived worker can meet
    its address-space cap on a case that needs far less; only a case that fails afresh is a
    finding. A confirmation that cannot run or hangs counts as reproduced.
    """
    path = Path(tempfile.mkstemp(prefix="memory-", suffix=".bin", dir=args.workdir)[1])
    path.write_bytes(_encode_case(case))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--confirm-memory", str(path)]
    cmd += ["--target", args.target, "--rss-mb", str(args.rss_mb), "--workdir", args.workdir]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=max(60.0, 3 * args.case_timeout))
    except subprocess.TimeoutExpired:
        return True
    finally:
        path.unlink(missing_ok=True)
    return done.returncode != 0


def confirm_memory(args: argparse.Namespace) -> int:
    """`--confirm-memory FILE`: run one saved case as a fresh worker would; exit 3 if it still
    runs out of memory, 0 otherwise."""
    import gpumemviz.cli
    import gpumemviz.io  # noqa: F401

    case = decode_case(Path(args.confirm_memory).read_bytes())
    _set_rlimit(args.rss_mb + (4200 if args.target == "cli" else 0))
    tmp = Path(tempfile.mkdtemp(prefix="case-", dir=args.workdir))
    try:
        run_case(args.target, case, tmp)
    except Finding as f:
        return 3 if f.sig.startswith("memory@") else 0
    return 0


def reproduce(args: argparse.Namespace) -> int:
    """`--reproduce FILE...`: saved cases through `--target`'s oracle (default cli) in this
    process, under the workers' address-space cap; one line each, exit 1 on any finding."""
    canary = install_canary()
    import gpumemviz.cli
    import gpumemviz.io  # noqa: F401

    target = args.target or "cli"
    _set_rlimit(args.rss_mb + (4200 if target == "cli" else 0))
    found = 0
    with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
        for name in args.reproduce:
            case = decode_case(Path(name).read_bytes())
            try:
                outcome = run_case(target, case, Path(tmp))
            except Finding as f:
                found += 1
                outcome = f"FINDING {f.sig}: {f.detail.strip().splitlines()[-1][:300]}"
            if canary.tripped:
                found += 1
                outcome = f"FINDING canary: {canary.tripped!r}"
                canary.tripped.clear()
            print(f"{Path(name).name}: {outcome}".encode("ascii", "backslashreplace").decode())
    return 1 if found else 0


def worker(args: argparse.Namespace) -> int:
    """Run cases for `args.target` from `args.start` until the deadline; one line per case."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    canary = install_canary()
    # imported before the address-space cap, so the cap measures the cases alone
    import gpumemviz.cli
    import gpumemviz.io  # noqa: F401

    seeds = load_seeds(args.seed, slices=args.slices)
    # io.snapshot_files._read asks the OS for max_bytes + 1 (4 GiB) up front (a finding): the
    # CLI's reads need that much address space, untouched, so its cap leaves room for it
    _set_rlimit(args.rss_mb + (4200 if args.target == "cli" else 0))
    out = Path(args.out)
    cur = Path(args.workdir) / f"current-{args.target}.bin"
    tmp = Path(tempfile.mkdtemp(prefix="case-", dir=args.workdir))
    rng = random.Random(f"{args.seed}:{args.target}:{args.start}")
    corpus: list = []
    seen: set[str] = set()
    deadline = args.deadline
    i = args.start

    def run(case: Any) -> str:
        return run_case(args.target, case, tmp)

    while time.time() < deadline and (args.cases <= 0 or i < args.start + args.cases):
        try:
            case = make_case(args.target, seeds, corpus, rng, args.shapes)
        except MemoryError:  # the mutator met the cap: this worker's heap grew over many cases
            print(f"B {i}\nE {i} 0.0000 worker heap full: restart", flush=True)
            return 0  # the guard starts a fresh worker at the next case
        cur.write_bytes(_encode_case(case))
        print(f"B {i}", flush=True)
        t0 = time.perf_counter()
        try:
            outcome = run(case)
        except Finding as f:
            if f.sig.startswith("memory@") and not _memory_reproduces(case, args):
                # this worker's heap, grown over many cases, met the cap: not the case's doing
                print(f"E {i} {time.perf_counter() - t0:.4f} worker heap full: restart", flush=True)
                return 0  # the guard starts a fresh worker at the next case
            if isinstance(case, bytes):

                def same(c: bytes, sig: str = f.sig) -> bool:
                    try:
                        run(c)
                    except Finding as g:
                        return g.sig == sig
                    return False

                case = shrink(case, same)
            _save(out, f.sig, case, f.detail)
            outcome = "FINDING " + f.sig
        dt = time.perf_counter() - t0
        if canary.tripped:
            _save(out, "canary", case, f"a refused global ran: {canary.tripped!r}")
            outcome = "FINDING canary"
            canary.tripped.clear()
        if outcome not in seen and not outcome.startswith("FINDING"):
            seen.add(outcome)
            corpus.append(case)  # a new kind of outcome: mutate it further
        outcome = outcome.encode("ascii", "backslashreplace").decode()  # lone surrogates too
        print(f"E {i} {dt:.4f} {outcome}", flush=True)
        i += 1
    return 0


# --------------------------------------------------------------------------------------------
# parent: time and RSS guard around the workers


@dataclass
class Report:
    cases: Counter = field(default_factory=Counter)  # target -> cases run
    outcomes: Counter = field(default_factory=Counter)  # (target, outcome) -> count
    findings: Counter = field(default_factory=Counter)  # signature -> count
    slowest: dict[str, float] = field(default_factory=dict)
    restarts: int = 0

    def unknown(self) -> list[str]:
        return sorted(s for s in self.findings if s not in KNOWN)


def _rss_mb(pid: int) -> float:
    try:
        with Path(f"/proc/{pid}/status").open() as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _spawn(target: str, start: int, ns: argparse.Namespace, deadline: float, cases: int) -> Any:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--worker", "--target", target,
        "--seed", str(ns.seed), "--start", str(start), "--deadline", str(deadline),
        "--cases", str(cases), "--out", str(ns.out), "--workdir", str(ns.workdir),
        "--rss-mb", str(ns.rss_mb), "--slices", str(ns.slices), "--shapes", str(ns.shapes),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OPENBLAS_NUM_THREADS="1")
    err = (Path(ns.workdir) / f"stderr-{target}.txt").open("wb")  # the child's stderr
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
    finally:
        err.close()


class _LineReader:
    """Whole lines from a worker's stdout as they come (unbuffered: select sees every byte)."""

    def __init__(self, proc: Any) -> None:
        self.fd = proc.stdout.fileno()
        self.buf = b""
        self.lines: list[str] = []
        self.eof = False

    def next(self, timeout: float) -> str | None:
        if not self.lines and not self.eof:
            r, _, _ = select.select([self.fd], [], [], timeout)
            if r:
                chunk = os.read(self.fd, 1 << 16)
                self.eof = not chunk
                self.buf += chunk
                *done, self.buf = self.buf.split(b"\n")
                self.lines += [ln.decode() for ln in done]
        return self.lines.pop(0) if self.lines else None


def guard(target: str, ns: argparse.Namespace, seconds: float, cases: int, rep: Report) -> None:
    """Run `target`'s worker for `seconds` (or `cases` cases), restarting it after a kill."""
    deadline = time.time() + seconds
    start, done = 0, 0
    while time.time() < deadline and (cases <= 0 or done < cases):
        proc = _spawn(target, start, ns, deadline, cases - done if cases > 0 else 0)
        reader = _LineReader(proc)
        current, began = None, time.monotonic()
        startup_until = time.monotonic() + 60  # seeds load before the first case
        try:
            while True:
                line = reader.next(0.1)
                now = time.monotonic()
                if line is None:
                    if reader.eof and proc.poll() is not None:
                        break
                else:
                    kind, idx, *rest = line.split(" ", 3)
                    if kind == "B":
                        current, began = int(idx), now
                    else:
                        current = None
                        dt, outcome = float(rest[0]), rest[1].strip()
                        rep.cases[target] += 1
                        done += 1
                        start = int(idx) + 1
                        rep.slowest[target] = max(rep.slowest.get(target, 0.0), dt)
                        if outcome.startswith("FINDING "):
                            rep.findings[outcome[8:]] += 1
                            print(f"  finding in {target} case {idx}: {outcome[8:]}", flush=True)
                        else:
                            rep.outcomes[(target, outcome)] += 1
                    continue
                rss = _rss_mb(proc.pid)
                hung = current is not None and now - began > ns.case_timeout
                if current is None and now > startup_until and rep.cases[target] == 0:
                    hung = True
                if hung or rss > ns.rss_mb + 400:
                    sig = f"{'hang' if hung else 'rss'}@{target}"
                    proc.kill()
                    proc.wait()
                    cur = Path(ns.workdir) / f"current-{target}.bin"
                    raw = cur.read_bytes() if cur.exists() else b""
                    _save(Path(ns.out), sig, raw, f"case {current}: {sig}, rss {rss:.0f} MiB")
                    rep.findings[sig] += 1
                    rep.cases[target] += 1
                    rep.restarts += 1
                    print(f"  {target} case {current}: {sig} (killed)", flush=True)
                    start = (current or start) + 1
                    done += 1
                    break
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
            errf = Path(ns.workdir) / f"stderr-{target}.txt"
            err = errf.read_text(errors="replace") if errf.exists() else ""
        if proc.returncode not in (0, -9) and err.strip():
            sig = f"worker-died@{target}"
            rep.findings[sig] += 1
            _save(Path(ns.out), sig, b"", err[-4000:])
            print(f"  {target}: worker exited {proc.returncode}: {err.strip()[-300:]}", flush=True)
            start += 1
            rep.restarts += 1


def fuzz(ns: argparse.Namespace) -> Report:
    """Share `ns.seconds` among the targets, one guarded worker at a time."""
    rep = Report()
    targets = ns.targets.split(",")
    for t in targets:
        if t not in TARGETS and t != "_hang":
            raise SystemExit(f"unknown target {t!r}: expected some of {', '.join(TARGETS)}")
    Path(ns.workdir).mkdir(parents=True, exist_ok=True)
    per = ns.seconds / len(targets)
    for t in targets:
        guard(t, ns, per, ns.cases, rep)
    return rep


def print_report(rep: Report, seconds: float) -> None:
    n = sum(rep.cases.values())
    print(f"\nmutation fuzzing: {n} cases, {seconds:.0f} s in all, {rep.restarts} worker restarts")
    print(f"{'target':8} {'cases':>8} {'Snapshot':>9} {'error':>7} {'slowest s':>10}")
    for t, n in rep.cases.items():
        ok = sum(
            c
            for (tt, o), c in rep.outcomes.items()
            if tt == t and (o in ("Snapshot", "0 0") or o.startswith("Snapshot "))
        )
        print(f"{t:8} {n:8} {ok:9} {n - ok:7} {rep.slowest.get(t, 0):10.3f}")
    kinds = Counter(t for t, _ in rep.outcomes)
    print("distinct outcome kinds: " + ", ".join(f"{t} {n}" for t, n in kinds.items()))
    for sig, n in rep.findings.most_common():
        tag = "known" if sig in KNOWN else "NEW"
        print(f"  [{tag}] {sig}: {n} case(s)" + (f" ({KNOWN[sig]})" if sig in KNOWN else ""))
    if not rep.findings:
        print("no findings")


# --------------------------------------------------------------------------------------------
# coverage guidance: the same oracle under atheris (libFuzzer), where atheris is installed

ATHERIS_TARGETS = ("pickle", "json", "cli")


def have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def atheris_worker(args: argparse.Namespace) -> int:
    """libFuzzer on one byte target: coverage of gpumemviz's Python code guides the mutations.

    Same oracle as the guarded workers; `KNOWN` findings are counted and passed over, a new one
    stops libFuzzer with its input saved. libFuzzer's own guards: -timeout per case, and the
    address-space cap as in the workers.
    """
    import atheris

    canary = install_canary()
    with atheris.instrument_imports(include=["gpumemviz"]):
        import gpumemviz.analysis.advice
        import gpumemviz.analysis.fragmentation
        import gpumemviz.cli
        import gpumemviz.io
        import gpumemviz.snapshot  # noqa: F401
    seeds = load_seeds(args.seed, slices=args.slices)
    corpus = Path(args.workdir) / f"corpus-{args.target}"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(seeds.jsons if args.target == "json" else seeds.pickles):
        if len(data) <= 1 << 16:
            (corpus / f"seed-{i}").write_bytes(data)
    _set_rlimit(args.rss_mb + (4200 if args.target == "cli" else 0))
    out, tmp = Path(args.out), Path(tempfile.mkdtemp(prefix="case-", dir=args.workdir))
    out.mkdir(parents=True, exist_ok=True)  # libFuzzer writes its artifacts there
    known: Counter = Counter()

    def one(data: bytes) -> None:
        try:
            if args.target == "cli":
                run_cli(data, tmp)
            else:
                run_loader(data, args.target)
        except Finding as f:
            known[f.sig] += 1
            if known[f.sig] == 1:  # libFuzzer may end with exit(): say it at once
                print(f"SEEN {f.sig}", flush=True)
            if f.sig not in KNOWN:
                _save(out, f.sig, data, f.detail)
                print(f"FINDING {f.sig}", flush=True)
                raise
        if canary.tripped:
            _save(out, "canary", data, f"a refused global ran: {canary.tripped!r}")
            raise RuntimeError("a refused global ran")

    argv = [
        sys.argv[0], f"-max_total_time={max(1, int(args.seconds))}", "-timeout=10",
        "-max_len=65536", f"-seed={args.seed}", "-print_final_stats=1",
        f"-artifact_prefix={out}/atheris-{args.target}-", str(corpus),
    ]  # fmt: skip
    atheris.Setup(argv, one)
    atheris.Fuzz()
    return 0


def run_atheris(ns: argparse.Namespace, seconds: float) -> list[str]:
    """Each byte target under atheris for its share of `seconds`; returns the new findings."""
    new = []
    per = seconds / len(ATHERIS_TARGETS)
    for t in ATHERIS_TARGETS:
        cmd = [
            sys.executable, str(Path(__file__).resolve()), "--atheris-worker", "--target", t,
            "--seconds", str(per), "--seed", str(ns.seed), "--out", str(ns.out),
            "--workdir", str(ns.workdir), "--rss-mb", str(ns.rss_mb), "--slices", str(ns.slices),
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), *sys.path[1:]]))
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=per + 120)
        text = r.stdout + r.stderr
        stats = {m.group(1): m.group(2) for m in re.finditer(r"stat::(\w+):\s+(\d+)", text)}
        cov = re.findall(r"cov: (\d+) ft: (\d+)", text)
        known = sorted(set(re.findall(r"SEEN (\S+)", text)) & set(KNOWN))
        print(
            f"atheris {t}: {stats.get('number_of_executed_units', '?')} cases, "
            f"{stats.get('average_exec_per_sec', '?')}/s, coverage {cov[-1][0] if cov else '?'} "
            f"edges ({cov[-1][1] if cov else '?'} features), known findings seen: "
            f"{', '.join(known) or 'none'}",
            flush=True,
        )
        found = re.findall(r"FINDING (\S+)", text)
        if r.returncode != 0 and not found:
            found = [f"atheris-{t}-exit{r.returncode}"]
            _save(Path(ns.out), found[0], b"", text[-4000:])
        for f in found:
            print(f"  [NEW] {f} (atheris, {t}; reproducer in {ns.out})", flush=True)
        new += found
    return new


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", 600)))
    p.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED", 1)))
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--cases", type=int, default=0, help="stop each target after N cases")
    p.add_argument("--case-timeout", type=float, default=10.0)
    p.add_argument("--rss-mb", type=int, default=1024, help="address space a case may add")
    p.add_argument("--slices", type=int, default=6, help="small seeds cut from each real file")
    p.add_argument(
        "--shapes",
        type=float,
        default=0.15,
        help="share of cases built by tools/fuzz_shapes.py: shared references, odd fields",
    )
    p.add_argument("--out", default=str(REPO / "build" / "fuzz"))
    p.add_argument("--workdir", default=None)
    p.add_argument(
        "--atheris",
        type=float,
        default=0.5,
        help="share of the time for coverage-guided atheris where it is installed (default 0.5)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--reproduce",
        nargs="+",
        metavar="FILE",
        help="run saved cases (e.g. build/fuzz/*.bin) through --target's checks (default cli)",
    )
    p.add_argument("--confirm-memory", help=argparse.SUPPRESS)
    p.add_argument("--atheris-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--target", help="with --reproduce: whose checks run (default cli)")
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.confirm_memory:
        return confirm_memory(ns)
    if ns.reproduce:
        return reproduce(ns)
    if ns.worker:
        return worker(ns)
    if ns.atheris_worker:
        return atheris_worker(ns)
    new: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpumemviz-fuzz-") as wd:
        ns.workdir = ns.workdir or wd
        t0 = time.monotonic()
        share = ns.atheris if have_atheris() and ns.cases <= 0 else 0.0
        if share > 0:
            new = run_atheris(ns, ns.seconds * share)
        else:
            print("atheris not installed: mutation fuzzing only (pip install atheris for coverage)")
        ns.seconds *= 1 - share
        rep = fuzz(ns)
        print_report(rep, time.monotonic() - t0)
    print(f"reproducers: {ns.out}")
    return 1 if rep.unknown() or new else 0


if __name__ == "__main__":
    sys.exit(main())
