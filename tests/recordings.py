"""The real recordings the estimator is checked against, and what each says about its step:
shared by tests/estimator/test_real_programs.py and benchmarks/estimate_accuracy.py, so the
study and its test read the same files the same way."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gpumemviz
from gpumemviz.io import load_snapshot

TESTS = Path(__file__).resolve().parent
SHIPPED = TESTS / "data" / "real"
LICENSED = TESTS.parents[1] / "shared" / "real-snapshots-licensed"
NAME = "Wedsonlin__assignment2-systems__results-medium_{context}_{kind}_memory_snapshot.pickle"
#: (context, kind, autocast as the original program ran it): the eight GPT-2-medium files
FILES = (
    (128, "inference", False),
    (256, "inference", False),
    (512, "inference", True),
    (1024, "inference", False),
    (128, "training", False),
    (256, "training", False),
    (512, "training", True),
    (1024, "training", True),
)
#: silmont2000's GPT-2-small forward step: the second program (it ships)
SECOND = SHIPPED / "silmont2000__assignment2-systems__memory_forward_fp32_128.pickle"


def find(context: int, kind: str) -> Path | None:
    """The recording: shipped in tests/data/real, else in ../shared's licensed folder."""
    name = NAME.format(context=context, kind=kind)
    for folder in (SHIPPED, LICENSED):
        if (folder / name).exists():
            return folder / name
    return None


@dataclass(frozen=True)
class Recorded:
    """What a recording says about its step. Allocated counts blocks, as
    `torch.cuda.memory_allocated` does (a 1.5 MiB tensor in a 2 MiB block that is not split
    counts 2 MiB): it is read from the file's own history, not summed from the trace's
    requested sizes."""

    sizes: list[int]  # the alloc entries' sizes in order, as requested (as the estimate lists)
    start: int  # allocated at the start of the step
    peak: int  # allocated at its peak
    reserved: int  # peak reserved
    segments: int  # segments at the peak


def recorded(path: Path) -> Recorded:
    trace = load_snapshot(path).to_torch()["device_traces"][0]
    replay = gpumemviz.replay(path)
    start = replay.timelines[0].start.totals()[1]
    return Recorded(
        sizes=[e["size"] for e in trace if e["action"] == "alloc"],
        start=start,
        peak=max(int(replay.figures(0)["recorded_allocated"].max(initial=0)), start),
        reserved=replay.recorded_peak_reserved(0),
        segments=replay.peak_segments(0, "recording"),
    )
