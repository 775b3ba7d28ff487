"""What every real recording's replay gives, as plain numbers: the golden record that
tests/test_replay_golden.py compares against (tests/data/golden_replay_results.json).

Regenerate only when a change is meant to alter replay results:
``PYTHONPATH=src python tests/replay_golden.py`` (it rewrites the JSON).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import CI_ONLY_FILES, DATA_DIR, SHIPPED_FILES
from gpumemviz.allocator.replay import ReplayError, replay
from gpumemviz.io import load_snapshot

GOLDEN = DATA_DIR / "golden_replay_results.json"
#: The what-if asked of every file: expandable segments under a capacity of 8 GiB.
WHATIF_CONF = "expandable_segments:True"
WHATIF_CAPACITY = 8 << 30


def _digest(a: Any) -> str:
    return hashlib.sha256(repr([int(x) for x in a]).encode()).hexdigest()[:16]


def _device(d: Any) -> dict[str, Any]:
    return {
        "allocs": d.allocs,
        "allocs_matched": d.allocs_matched,
        "allocs_matched_per_decision": d.allocs_matched_per_decision,
        "segments_recorded": d.segments_recorded,
        "segments_matched": d.segments_matched,
        "bursts": d.bursts,
        "bursts_matched": d.bursts_matched,
        "final_matched": d.final_matched,
        "oom": d.oom,
        "peak_reserved": d.peak_reserved,
        "peak_allocated": d.peak_allocated,
        "final_segments": len(d.final_segments),
        "final_reserved": sum(int(s["total_size"]) for s in d.final_segments),
        "reserved": _digest(d.reserved),
        "allocated": _digest(d.allocated),
        "segments": _digest(d.segments),
    }


def results_of(path: Path) -> dict[str, Any]:
    """The replay's numbers for one file: per device, as recorded and as the what-if."""
    snap = load_snapshot(path)
    try:
        rec = replay(snap)
        what = replay(snap, config=WHATIF_CONF, capacity=WHATIF_CAPACITY)
    except ReplayError as err:
        return {"error": str(err)}
    return {
        "recorded": {str(k): _device(v) for k, v in sorted(rec.recorded.items())},
        "whatif": {str(k): _device(v) for k, v in sorted(what.devices.items())},
    }


def main() -> None:
    out = {p.name: results_of(p) for p in [*SHIPPED_FILES, *CI_ONLY_FILES] if p.exists()}
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(out)} files)")


if __name__ == "__main__":
    main()
