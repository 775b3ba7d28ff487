"""A few seconds of `make soak` (tools/soak.py), so the soak cannot rot.

Both samplers (simulated training and a replayed real trace) with the panel's per-frame work run
briefly; the checks must pass, and a bound that cannot hold must be reported as a violation.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load_soak():
    spec = importlib.util.spec_from_file_location(
        "gpumemviz_tools_soak", REPO / "tools" / "soak.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


soak = _load_soak()
SHORT = ["--seconds", "5", "--warmup", "1", "--check-every", "1", "--replay-duration", "5"]


def test_short_soak_passes_its_checks_and_leaves_no_thread(capsys):
    before = set(threading.enumerate())
    rc = soak.main(SHORT)
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "no violations" in text
    done = [
        ln for ln in text.splitlines() if ln.startswith(("simulated sampler:", "replay sampler:"))
    ]
    # replay runs on the longest recorded trace: a shipped file or stand-in is always there
    assert len(done) == 2, text
    assert any(ln.startswith("replay: ") for ln in text.splitlines()), text
    ticks = [int(ln.split()[2]) for ln in done]
    assert all(t >= 20 for t in ticks), text  # 5 s at 0.1 s, allowing a loaded box to skip
    assert set(threading.enumerate()) <= before


def test_a_bound_that_cannot_hold_is_a_violation(capsys):
    rc = soak.main(
        ["--seconds", "2", *SHORT[2:], "--sources", "simulated", "--rss-slack-mib", "-4096"]
    )
    text = capsys.readouterr().out
    assert rc == 1 and "violation" in text and "RSS" in text, text
