"""`gpumemviz.allocator` re-exports its public names lazily (checked in fresh interpreters)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import gpumemviz.allocator as pkg

HEAVY = (
    *("model", "workloads", "replay"),
    *("replay.layout", "replay.reconstruct", "replay.recording", "replay.driver"),
    "replay.evidence",
)
# the modules CachingAllocator is built from (its structures, trace vocabulary and snapshot
# writer): they load with the model only
HEAVY += ("blocks", "trace", "dump")


def _fresh(code: str) -> dict:
    """Run `code` in a new interpreter; it prints one JSON line, returned here."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loaded_of(names: tuple[str, ...]) -> str:
    return (
        "json.dumps(sorted(n for n in "
        f"{list(names)!r} if 'gpumemviz.allocator.' + n in sys.modules))"
    )


def test_config_and_the_fragmentation_report_do_not_load_the_model():
    got = _fresh(
        "import json, sys\n"
        "import gpumemviz.allocator\n"
        f"bare = {_loaded_of((*HEAVY, 'config'))}\n"
        "import gpumemviz.allocator.config\n"
        "import gpumemviz.analysis.fragmentation, gpumemviz.analysis.advice\n"
        f"print(json.dumps([json.loads(bare), json.loads({_loaded_of(HEAVY)})]))"
    )
    assert got == [[], []]


def test_the_recording_and_replay_load_the_model_only_when_replay_runs():
    """export and playback read `Recording`; the replay package loads the model (and its
    driver) only when `replay` is called."""
    drive = ("model", "replay.driver")
    got = _fresh(
        "import json, sys\n"
        "import gpumemviz.allocator.replay.recording, gpumemviz.reporting.export\n"
        "from gpumemviz.allocator.replay import replay\n"
        f"before = {_loaded_of(drive)}\n"
        "from gpumemviz.allocator.model import CachingAllocator\n"
        "a = CachingAllocator(1 << 30)\n"
        "a.free(a.malloc(100))\n"
        "r = replay(a.snapshot())\n"
        f"print(json.dumps([json.loads(before), json.loads({_loaded_of(drive)}), r.allocs]))"
    )
    assert got == [[], list(drive), 1]


def test_the_public_names_import_from_the_package():
    got = _fresh(
        "import json, sys, types\n"
        "from gpumemviz.allocator import (AllocatorConfig, CachingAllocator, ConfigError,\n"
        "    OutOfMemory, replay, workloads)\n"
        "import gpumemviz.allocator.config as c, gpumemviz.allocator.model as m\n"
        "import gpumemviz.allocator.oom as o\n"
        "print(json.dumps({\n"
        "    'same': [CachingAllocator is m.CachingAllocator, OutOfMemory is o.OutOfMemory,\n"
        "             AllocatorConfig is c.AllocatorConfig, ConfigError is c.ConfigError],\n"
        "    'replay': [replay is sys.modules['gpumemviz.allocator.replay'],\n"
        "               callable(replay.replay)],\n"
        "    'workloads': workloads is sys.modules['gpumemviz.allocator.workloads'],\n"
        "}))"
    )
    assert got == {"same": [True] * 4, "replay": [True, True], "workloads": True}


def test_loaded_names_work_and_are_listed():
    assert (
        pkg.__all__
        == sorted(pkg.__all__)
        == [
            "AllocatorConfig",
            "CachingAllocator",
            "ConfigError",
            "OutOfMemory",
            "replay",
            "workloads",
        ]
    )
    assert set(pkg.__all__) <= set(dir(pkg))
    a = pkg.CachingAllocator(40 << 20, pkg.AllocatorConfig.parse("max_split_size_mb:30"))
    a.malloc(30 << 20)
    with pytest.raises(pkg.OutOfMemory):
        a.malloc(30 << 20)
    with pytest.raises(pkg.ConfigError):
        pkg.AllocatorConfig.parse("max_split_size_mb:nope")
    with pytest.raises(AttributeError, match=r"module 'gpumemviz\.allocator' has no attribute 'X'"):
        _ = pkg.X
