"""What the benchmark scripts share: where the real files are, a safe plain reader, the timer,
a uniform synthetic snapshot, and `run_main` (``--markdown``: the output as a section of
benchmarks/README.md) (each script imports this as `_common`; run them from the
repository root as `.venv/bin/python benchmarks/NAME.py`)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import pickle
import random
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[1]
#: The licensed real snapshots shipped with the repository.
SHIPPED_DIR = REPO / "tests" / "data" / "real"
#: More real snapshots, read where ../shared is checked out (CI).
REAL_DIR = REPO.parent / "shared" / "real-snapshots"
MIB = 1 << 20


def quick_or_full(doc: str | None) -> tuple[int, tuple[int, ...]]:
    """Parse the command line (`--quick`): (repetitions, synthetic sizes in blocks).

    Full: 3 repetitions at 10^4, 10^5 and 10^6 blocks; quick: one, without 10^6.
    """
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip 10^6 blocks, one repetition")
    quick = parser.parse_args().quick
    return (1, (10**4, 10**5)) if quick else (3, (10**4, 10**5, 10**6))


def real_files() -> list[Path]:
    """The real snapshots recorded on GPUs: the shipped ones, plus ../shared's where present;
    one copy per file name (the shipped one wins), sorted by name."""
    found: dict[str, Path] = {}
    for folder in (SHIPPED_DIR, REAL_DIR):
        for p in sorted(folder.glob("*.pickle")) if folder.is_dir() else []:
            found.setdefault(p.name, p)
    return [found[name] for name in sorted(found)]


def label(path: Path, head: int = 20, tail: int = 13) -> str:
    """A short row name for a real file: 'owner:stem-end'."""
    return path.name.split("__")[0][:head] + ":" + path.stem.split("__")[-1][:tail]


class _NoGlobals(pickle.Unpickler):
    """The C unpickler refusing every global (never a plain pickle.load): the real files hold
    plain types only."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def read_plain(data: bytes, *, gc_paused: bool = False) -> Any:
    """Unpickle plain data without gpumemviz; `gc_paused` makes it the fastest safe reader."""
    was = gc.isenabled()
    if gc_paused:
        gc.disable()
    try:
        return _NoGlobals(io.BytesIO(data)).load()
    finally:
        if was:
            gc.enable()


def best(fn: Callable[[], Any], reps: int, clock: Callable[[], float] = time.process_time) -> float:
    """Smallest time of `reps` calls (CPU seconds by default, so a busy machine distorts less);
    the result is dropped outside the timed region."""
    times = []
    for _ in range(reps):
        t0 = clock()
        result = fn()
        times.append(clock() - t0)
        del result
    return min(times)


def uniform_snapshot(
    n_blocks: int, per_segment: int = 10, stacks: list[list[dict]] | None = None, seed: int = 0
) -> dict:
    """A consistent torch-2.11-shaped dict: 1 MiB blocks, `per_segment` to a segment, every
    third one free, every seventh segment expandable.

    Live blocks get a stack drawn from `stacks` (shared lists, as torch's pickles share them);
    without `stacks`, and for free blocks, each block has its own empty frames list.
    """
    rng = random.Random(seed)
    segments = []
    address = 1 << 40
    for s in range(n_blocks // per_segment):
        blocks, offset, allocated, requested = [], 0, 0, 0
        for j in range(per_segment):
            live = j % 3 != 2
            blocks.append({"address": address + offset, "size": MIB,
                           "requested_size": MIB - 8 if live else 0,
                           "state": "active_allocated" if live else "inactive",
                           "frames": rng.choice(stacks) if live and stacks else []})  # fmt: skip
            offset += MIB
            if live:
                allocated += MIB
                requested += MIB - 8
        segments.append({"device": 0, "address": address, "total_size": offset,
                         "allocated_size": allocated, "active_size": allocated,
                         "requested_size": requested, "stream": 0, "segment_type": "large",
                         "segment_pool_id": (0, 0), "is_expandable": s % 7 == 0, "frames": [],
                         "blocks": blocks})  # fmt: skip
        address += offset + 2 * MIB
    return {"segments": segments, "device_traces": [[]]}


def run_main(main: Callable[[], int | None], doc: str | None) -> NoReturn:
    """Run a benchmark's `main` and exit with its status.

    With ``--markdown`` on the command line (taken out before `main` parses it), the script's
    output becomes one section of benchmarks/README.md, which `make bench` writes: a heading
    naming the script, the first line of its docstring, the command that ran, and the output as
    a fixed-width block (the tables keep their columns).
    """
    if "--markdown" not in sys.argv[1:]:
        raise SystemExit(main())
    sys.argv.remove("--markdown")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main()
    name = Path(sys.argv[0]).name
    title = " ".join((doc or name).strip().split("\n\n")[0].split())
    command = shlex.join(["python", f"benchmarks/{name}", *sys.argv[1:]])
    print(f"### `benchmarks/{name}`\n\n{title}\n\n`{command}`\n\n```text")
    print(out.getvalue().rstrip("\n"))
    print("```\n")
    raise SystemExit(status)
