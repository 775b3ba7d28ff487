"""Shared fixtures: the snapshots recorded on GPUs by others (read-only), and the model-made
stand-ins for the classes of recording that only CI has."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

import recordings  # tests/ is on sys.path

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(__file__).resolve().parent / "data"
#: Real recordings under permissive licences: they ship with the repository (PROVENANCE.md).
REAL_DIR = DATA_DIR / "real"
#: Real recordings with no licence found: read where ../shared/real-snapshots exists (CI).
CI_REAL_DIR = REPO.parent / "shared" / "real-snapshots"
#: Real recordings under permissive licences that are not shipped (their size): read where
#: ../shared/real-snapshots-licensed exists (CI), as tests/recordings.py reads them.
LICENSED_DIR = REPO.parent / "shared" / "real-snapshots-licensed"
#: Model-made stand-ins for what only the CI-only files hold (tools/make_standins.py).
STANDIN_DIR = DATA_DIR / "standin"

#: The CI-only recordings by name, so a clone without ../shared lists their cases as skipped.
CI_ONLY_NAMES = (
    "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle",
    "MAGMA27__assignment2-systems__memory_snapshot.pickle",
    "Maphsge4__select_n__snapshot_10streams.pickle",
    "albi2__thesis-text-to-SQL__dump_snapshot_expandable.pickle",
    "cranberrii__ftcourse__memory_snapshot.pickle",
    "kkaitlyn111__cs336-a2-systems__memory_2.7b_forward.pickle",
    "kkaitlyn111__cs336-a2-systems__memory_snapshot.pickle",
)
CI_ONLY_REASON = "CI-only real snapshot (no licence to ship it): ../shared/real-snapshots is absent"

SHIPPED_FILES = sorted(REAL_DIR.glob("*.pickle"))
_shipped = {p.name for p in SHIPPED_FILES}
#: The licensed recordings not shipped: the GPT-2-medium ones tests/recordings.py names.
_licensed = {recordings.NAME.format(context=c, kind=k) for c, k, _ in recordings.FILES} - _shipped
_ci_names = set(CI_ONLY_NAMES)
if CI_REAL_DIR.is_dir():
    _ci_names |= {p.name for p in CI_REAL_DIR.glob("*.pickle")}
#: Every CI-only recording, present or not (one copy per file name: shipped ones win).
CI_ONLY_FILES = sorted(CI_REAL_DIR / n for n in _ci_names - _shipped)
#: The real recordings this checkout can read: the shipped ones, plus CI's where present.
REAL_FILES = sorted([*SHIPPED_FILES, *(p for p in CI_ONLY_FILES if p.exists())])
STANDIN_FILES = sorted(STANDIN_DIR.glob("*.pickle"))
#: What the recorded-file tests run on: every real recording (CI-only ones skip when absent)
#: and every stand-in.
RECORDED_FILES = sorted([*SHIPPED_FILES, *CI_ONLY_FILES]) + STANDIN_FILES


class _NoGlobals(pickle.Unpickler):
    """Test-side reader: the recorded files hold only plain types, so any global is a failure."""

    def find_class(self, module: str, name: str):  # pragma: no cover - would be a broken fixture
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")


def read_real(path: Path):
    """The raw torch dict of a recorded file, read without gpumemviz (an independent oracle)."""
    if not path.exists():
        _skip_absent(path)
    with path.open("rb") as f:
        return _NoGlobals(f).load()


def _skip_absent(path: Path):
    if path.parent == CI_REAL_DIR:
        pytest.skip(f"{CI_ONLY_REASON} ({path.name})")
    if path.parent == LICENSED_DIR:
        pytest.skip(f"licensed real snapshot not shipped: {LICENSED_DIR} is absent ({path.name})")
    raise FileNotFoundError(path)  # a shipped file is missing: a broken checkout


def real_file(name: str) -> Path:
    """A real recording by file name: shipped, else CI's (the licensed ones not shipped, then
    the unlicensed ones); the test skips (one line) without it."""
    if name in _shipped:
        path = REAL_DIR / name
    elif name in _licensed:
        path = LICENSED_DIR / name
    else:
        path = CI_REAL_DIR / name
    if not path.exists():
        _skip_absent(path)
    return path


def standin_file(name: str) -> Path:
    """A stand-in by its short name (`expandable_oom_3dev`, `streams10`, `training_10k`)."""
    path = STANDIN_DIR / f"standin__{name}.pickle"
    if not path.exists():
        raise FileNotFoundError(path)
    return path


def traced_devices(d: Any) -> list[int]:
    """The devices of torch dict `d` with a trace; the test skips in one line where none has."""
    traces = d.get("device_traces") or [] if isinstance(d, dict) else []
    devices = [i for i, t in enumerate(traces) if t]
    if not devices:
        pytest.skip("no trace in this file")
    return devices


def has_private_pools(d: Any) -> bool:
    """A recording with segments in private pools (MemPool, CUDA graphs)."""
    segs = d["segments"] if isinstance(d, dict) else d
    return any(tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0) for s in segs)


def unallocated_bytes(d: Any, state: str) -> int:
    """Bytes of `state` blocks in non-expandable segments that hold nothing allocated: the
    segments empty_cache returns whole, once it has synced their pending frees."""
    segs = d["segments"] if isinstance(d, dict) else d
    return sum(
        b["size"]
        for s in segs
        if not s.get("is_expandable")
        and not any(b["state"] == "active_allocated" for b in s["blocks"])
        for b in s["blocks"]
        if b["state"] == state
    )


def recorded_peaks(d: dict, device: int = 0) -> tuple[int, int]:
    """Peak reserved bytes and peak segment count of a recording, from the raw dict alone: the
    final state minus the later segment entries, walked backwards (maps and unmaps change the
    bytes of an expandable segment, not the count)."""
    reserved = sum(s["total_size"] for s in d["segments"] if s["device"] == device)
    count = sum(1 for s in d["segments"] if s["device"] == device)
    sign = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    peak_reserved, peak_count = reserved, count
    for e in reversed(d["device_traces"][device]):
        reserved -= sign.get(e["action"], 0) * e["size"]
        count -= {"segment_alloc": 1, "segment_free": -1}.get(e["action"], 0)
        peak_reserved, peak_count = max(peak_reserved, reserved), max(peak_count, count)
    return peak_reserved, peak_count


def _ids(paths: list[Path]) -> list[str]:
    """'owner:stem-end' for a real file, 'standin:name' for a stand-in."""
    return [p.name.split("__")[0] + ":" + p.stem.split("__")[-1] for p in paths]


@pytest.fixture(params=RECORDED_FILES, ids=_ids(RECORDED_FILES))
def recorded_path(request) -> Path:
    """Each recorded snapshot in turn: real ones (CI-only ones skip where ../shared is absent)
    and the model-made stand-ins."""
    path = request.param
    if not path.exists():
        _skip_absent(path)
    return path


@pytest.fixture
def recorded_dict(recorded_path: Path):
    return read_real(recorded_path)


@pytest.fixture(autouse=True)
def _no_shared_sampler_outlives_its_test():
    """A test that touched `gpumemviz.live.shared.shared` leaves no running sampler or source thread
    behind: a stray simulated allocator thread would skew later tests' memory and timing."""
    yield
    live = sys.modules.get("gpumemviz.live.shared")
    if live is None:
        return
    with live._SHARED_LOCK:
        left = list(live._SHARED.values())
        live._SHARED.clear()
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


#: Test files whose module-scoped fixtures are expensive (a notebook's kernel run, a wheel
#: build, memory_viz subprocesses, replays of big real files): under pytest-xdist each file
#: runs on one worker, so those fixtures are built once, not once per worker.
_ONE_WORKER = {
    "test_notebook.py",
    "test_widget_wheel.py",
    "test_export.py",
    "test_advice_check.py",
    "test_render_plots.py",
    "test_frames.py",
    "test_standins.py",
    "test_allocator_config.py",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = Path(str(item.fspath)).name
        if name in _ONE_WORKER:
            item.add_marker(pytest.mark.xdist_group(name.removesuffix(".py")))
