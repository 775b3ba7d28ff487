"""Structure-aware hostile shapes for the fuzzer (tools/fuzz.py): shared references, odd field
types, and what a terminal must never receive.

Byte mutations rarely make these, yet they are what real and hostile files carry:

- Shared references (a DAG): real files share heavily (one frame list for thousands of blocks),
  and a few hundred bytes of pickle can hold a list of the same list 30 levels deep, 2^30
  leaves once expanded. `shared_case` puts such a value where a snapshot keeps free-form data
  (allocator settings, annotations, an unknown top-level key, a frame's name or file, a frames
  list) or makes every block and trace entry share one frame list, the realistic shape.
- Odd field types (`odd_fields_case`): a frame's ``line`` None, a float, inf, NaN, a string or
  a huge int; ``frames`` an int or a string; NaN in allocator settings; lone surrogates (what
  Python makes of non-UTF-8 file names) and terminal control sequences in every string.
- The terminal (`control_chars`): what may not reach a terminal from a file: C0 controls but
  tab and newline (ESC, BEL, CR, ...), DEL, C1 controls, and the bidi overrides.

Each generator takes a plain torch-shaped snapshot (dict or segment list) and a seeded
`random.Random` and returns a new value; the caller pickles it (pickle keeps the sharing, so
the file stays small) or hands it over as a dict.
"""

from __future__ import annotations

import copy
import math
import random
import re
from typing import Any

__all__ = [
    "TERMINAL_STRINGS",
    "control_chars",
    "doubling",
    "odd_fields_case",
    "shared_case",
]

#: Strings a hostile file may hold for a terminal: window title, screen clear, BEL, CR, a C1
#: CSI, bidi overrides, a lone surrogate, a NUL.
TERMINAL_STRINGS = (
    "\x1b]0;pwned\x07",
    "\x1b[2J\x1b[H",
    "bell\x07",
    "over\rwritten",
    "\x9b31mred",
    "evil\u202egnp.py",
    "\u2066isolate\u2069",
    "/home/u/\udcff\udcfe.py",
    "nul\x00byte",
    "del\x7f",
)

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def control_chars(text: str) -> list[str]:
    """The characters of `text` a terminal must not receive raw, each as its ``ascii()``
    escape (tab and newline pass; ESC, BEL, CR, C1 and the bidi overrides do not)."""
    return [ascii(m.group()) for m in _UNSAFE.finditer(text)]


def doubling(depth: int, leaf: Any = 0) -> list:
    """``[x, x]`` nested `depth` times over `leaf`: 2**depth leaves, depth + 1 objects."""
    x: Any = leaf
    for _ in range(depth):
        x = [x, x]
    return x


def _as_dict(d: Any) -> dict:
    """A copy of a snapshot as torch's dict shape (a bare segment list gains its keys)."""
    d = copy.deepcopy(d)
    if isinstance(d, list):
        return {"segments": d, "device_traces": []}
    return d if isinstance(d, dict) else {"segments": [], "device_traces": []}


def _frame_holders(d: dict) -> list[dict]:
    """Every dict of `d` that carries a ``frames`` list: segments, blocks, trace entries."""
    out: list[dict] = []
    for seg in d.get("segments") or []:
        if isinstance(seg, dict):
            out.append(seg)
            out += [b for b in seg.get("blocks") or [] if isinstance(b, dict)]
    for trace in d.get("device_traces") or []:
        if isinstance(trace, list):
            out += [e for e in trace if isinstance(e, dict)]
    return out


def _frames(d: dict) -> list[dict]:
    return [
        f
        for h in _frame_holders(d)
        if isinstance(h.get("frames"), list)
        for f in h["frames"]
        if isinstance(f, dict)
    ]


def shared_case(d: Any, rng: random.Random) -> dict:
    """`d` with shared references: a doubling DAG in a free-form slot, or one frame list shared
    by every block and trace entry (the shape real files have, which must stay cheap)."""
    d = _as_dict(d)
    holders = _frame_holders(d)
    kind = rng.randrange(8)
    if kind == 0 or not holders:  # the realistic one: one frame list for everything
        frame = {"filename": "train.py", "line": 7, "name": "forward"}
        shared = [frame] * rng.choice((1, 30))
        for h in holders:
            h["frames"] = shared
        d.setdefault("extra_frames", shared)
        return d
    dag = doubling(rng.choice((8, 20, 30)), rng.choice((0, "x", {"filename": "a.py"})))
    if kind == 1:
        d["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": dag}
    elif kind == 2:
        d["external_annotations"] = [{"device": 0, "stage": "START", "name": dag}]
    elif kind == 3:
        d["zzz_unknown"] = dag
    elif kind == 4:  # a frame's name or file
        frame = {"filename": "a.py", "line": 1, "name": "f"}
        frame[rng.choice(("name", "filename"))] = dag
        rng.choice(holders)["frames"] = [frame]
    elif kind == 5:  # a frames list that is the DAG itself
        rng.choice(holders)["frames"] = dag
    elif kind == 6:  # every block and entry sharing a frame list whose frame holds the DAG
        shared = [{"filename": "a.py", "line": 1, "name": dag}]
        for h in holders:
            h["frames"] = shared
    else:  # wide sharing: one dict referenced from a long list, in several places
        wide = [{"filename": "w.py", "line": 2, "name": "g"}] * rng.choice((1000, 100_000))
        d["zzz_unknown"] = wide
        rng.choice(holders)["frames"] = wide
    return d


_ODD_LINES: list[Any] = [None, 1.5, math.inf, -math.inf, math.nan, "12", "", -1, 2**70, True]
_ODD_FRAMES: list[Any] = [5, None, "frames", {}, 1.5, [None], [7]]
_ODD_SETTINGS: list[Any] = [
    {"garbage_collection_threshold": math.nan},
    {"max_split_size": math.inf},
    {"expandable_segments": "\x1b[2J"},
    {"roundup_power2_divisions": [math.nan, -1]},
    "max_split_size_mb:\x07128",
    math.nan,
    [1, 2],
]


def odd_fields_case(d: Any, rng: random.Random) -> dict:
    """`d` with a few fields of types real files may carry, or strings a terminal must not
    receive raw (`TERMINAL_STRINGS`)."""
    d = _as_dict(d)
    frames, holders = _frames(d), _frame_holders(d)
    for _ in range(rng.choice((1, 2, 4))):
        kind = rng.randrange(7)
        if kind == 0 and frames:
            rng.choice(frames)["line"] = rng.choice(_ODD_LINES)
        elif kind == 1 and frames:
            rng.choice(frames)[rng.choice(("filename", "name"))] = rng.choice(TERMINAL_STRINGS)
        elif kind == 2 and holders:
            rng.choice(holders)["frames"] = rng.choice(_ODD_FRAMES)
        elif kind == 3:
            d["allocator_settings"] = rng.choice(_ODD_SETTINGS)
        elif kind == 4:
            text = rng.choice(TERMINAL_STRINGS)
            d["external_annotations"] = [{"device": 0, "stage": "START", "name": text}]
        elif kind == 5 and holders:  # a whole frame of odd values
            rng.choice(holders)["frames"] = [
                {"filename": rng.choice(TERMINAL_STRINGS), "line": rng.choice(_ODD_LINES)}
            ]
        else:
            d[rng.choice(TERMINAL_STRINGS)] = rng.choice(TERMINAL_STRINGS)  # an unknown key
    return d
