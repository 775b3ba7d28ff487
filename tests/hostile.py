"""Hostile and unlucky snapshots for the tests of what reads them downstream (analysis, reports,
exports, diff, the CLI's output): small torch dicts built in memory, and a child-process runner
for code that, broken, would run without end.

A shared reference is one list placed twice: `shared_list(30)` is a 1 KB pickle that expands to
2^30 leaves, which any code that reprs, str()s or JSON-dumps it walks path by path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
ADDR = 0x7F0000000000
#: What a file can use to drive a terminal: ESC sequences (title, screen clear), BEL, CR, a bidi
#: override, a bidi isolate.
TERMINAL_ATTACK = "\x1b]0;pwned\x07\x1b[2J\r\u202eevil\u2066"


def shared_list(depth: int = 30) -> list:
    """A list of the same list, `depth` levels deep: 2^depth leaves once expanded."""
    x: list = []
    for _ in range(depth):
        x = [x, x]
    return x


def frame(filename: Any = "/home/ann/model.py", line: Any = 3, name: Any = "forward") -> dict:
    return {"filename": filename, "line": line, "name": name}


def snapshot_dict(frames: Any = None, **top: Any) -> dict:
    """One 2 MiB segment, its first block allocated at `frames` (also the segment's and the
    trace entry's frames), one alloc entry in the trace; `top` replaces or adds top-level keys."""
    fr = [frame()] if frames is None else frames
    seg = {
        "device": 0,
        "address": ADDR,
        "total_size": 2 << 20,
        "stream": 0,
        "segment_type": "small",
        "allocated_size": 512,
        "active_size": 512,
        "requested_size": 100,
        "frames": fr,
        "blocks": [
            {"address": ADDR, "size": 512, "requested_size": 100, "state": "active_allocated",
             "frames": fr},
            {"address": ADDR + 512, "size": (2 << 20) - 512, "requested_size": 0,
             "state": "inactive", "frames": []},
        ],
    }  # fmt: skip
    entry = {"action": "alloc", "addr": ADDR, "size": 512, "stream": 0, "time_us": 1, "frames": fr}
    d = {
        "segments": [seg],
        "device_traces": [[entry]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
        "external_annotations": [],
    }
    d.update(top)
    return d


def shared_frames_dict(n: int, depth: int = 300) -> dict:
    """`n` allocated blocks and `n` alloc entries that all share one `depth`-frame list, as real
    files share frames: a small pickle, a JSON of n * depth frames."""
    fr = [frame(f"/home/ann/lib/module_{i}.py", i, f"f{i}") for i in range(depth)]
    blocks = [
        {"address": ADDR + 512 * i, "size": 512, "requested_size": 500,
         "state": "active_allocated", "frames": fr}
        for i in range(n)
    ]  # fmt: skip
    seg = {"device": 0, "address": ADDR, "total_size": 512 * n, "stream": 0,
           "segment_type": "large", "frames": fr, "blocks": blocks}  # fmt: skip
    trace = [
        {"action": "alloc", "addr": ADDR + 512 * i, "size": 512, "stream": 0, "time_us": i,
         "frames": fr}
        for i in range(n)
    ]  # fmt: skip
    return {"segments": [seg], "device_traces": [trace]}


def not_terminal_safe(text: str) -> list[str]:
    """The characters of `text` a terminal would act on (all but printable ones and newlines),
    each named."""
    bad = {c for c in text if not (c.isprintable() or c == "\n")}
    return sorted(f"U+{ord(c):04X} {unicodedata.category(c)}" for c in bad)


_LIMIT = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({3 << 30}, {3 << 30}))\n"


def isolated(code: str, *, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `code` in a child Python with gpumemviz from src/, at most 3 GiB of address space
    and `timeout` seconds: code that would walk a shared subtree path by path fails the test
    instead of taking the machine."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": "0"}
    try:
        return subprocess.run(
            [sys.executable, "-c", _LIMIT + code],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"still running after {timeout} s: unbounded work") from e
