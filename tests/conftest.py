"""Shared fixtures: the real snapshots recorded on GPUs by others, read-only."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
REAL_DIR = REPO.parent / "shared" / "real-snapshots"
REAL_FILES = sorted(REAL_DIR.glob("*.pickle")) if REAL_DIR.is_dir() else []
DATA_DIR = Path(__file__).resolve().parent / "data"


class _NoGlobals(pickle.Unpickler):
    """Test-side reader: the real files hold only plain types, so any global is a failure."""

    def find_class(self, module: str, name: str):  # pragma: no cover - would be a broken fixture
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")


def read_real(path: Path):
    """The raw torch dict of a real file, read without gpumemviz (an independent oracle)."""
    with path.open("rb") as f:
        return _NoGlobals(f).load()


def _ids(paths: list[Path]) -> list[str]:
    return [p.name.split("__")[0] + ":" + p.stem.split("__")[-1] for p in paths]


@pytest.fixture(params=REAL_FILES, ids=_ids(REAL_FILES))
def real_path(request) -> Path:
    """Each real snapshot file in turn (the test is skipped when shared/ is absent)."""
    return request.param


@pytest.fixture
def real_dict(real_path: Path):
    return read_real(real_path)


def pytest_collection_modifyitems(config, items):
    if not REAL_FILES:
        skip = pytest.mark.skip(reason=f"no real snapshots in {REAL_DIR}")
        for item in items:
            if "real_path" in getattr(item, "fixturenames", ()):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_shared_sampler_outlives_its_test():
    """A test that touched `gpumemviz.sampler.shared` leaves no running sampler or source thread
    behind: a stray simulated allocator thread would skew later tests' memory and timing."""
    yield
    sampler_module = sys.modules.get("gpumemviz.sampler")
    if sampler_module is None:
        return
    with sampler_module._SHARED_LOCK:
        left = list(sampler_module._SHARED.values())
        sampler_module._SHARED.clear()
    for sampler in left:
        sampler.close()


def random_expandable_model(seed: int, pending: float):
    """The allocator model after 60 random mallocs and frees on streams 0 and 7 in expandable
    mode; a `pending` share of the frees was used on stream 9 first, so it waits on an event."""
    import numpy as np

    from gpumemviz.allocator.model import CachingAllocator

    mib = 1 << 20
    rng = np.random.default_rng(seed)
    m = CachingAllocator(1 << 40, "expandable_segments:True", device_total=1 << 44)
    live: list[int] = []
    for _ in range(60):
        if live and rng.random() < 0.4:
            addr = live.pop(int(rng.integers(len(live))))
            if rng.random() < pending:
                m.record_stream(addr, 9)
            m.free(addr)
        else:
            size = int(rng.choice([600, 300_000, 3 * mib, 7 * mib, 25 * mib, 61 * mib]))
            size += int(rng.integers(0, 1 << 19))
            live.append(m.malloc(size, int(rng.choice([0, 7]))))
    return m


def fragmented_segments(n: int = 8) -> list[dict]:
    """n 96 MiB segments, each 2 MiB allocated and 94 MiB free: fragmentation every advice rule
    reads (expandable_segments and max_split_size_mb both apply)."""
    return [
        {
            "device": 0,
            "address": 0x7F0000000000 + i * 96 * 2**20,
            "total_size": 96 * 2**20,
            "stream": 0,
            "segment_type": "large",
            "blocks": [
                {"size": 2 * 2**20, "requested_size": 2**21, "state": "active_allocated"},
                {"size": 94 * 2**20, "requested_size": 0, "state": "inactive"},
            ],
        }
        for i in range(n)
    ]


def blk(size: Any, state: Any = "inactive", requested: Any = None) -> dict:
    """A torch >= 2.1 block dict (requested_size defaults to the size); any values, so that
    tests can hand the analysis strange ones."""
    return {
        "size": size,
        "requested_size": size if requested is None else requested,
        "state": state,
        "frames": [],
    }
