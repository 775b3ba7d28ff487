"""tests/gpu/: run only where CUDA is; every test here carries the `gpu` marker.

Skipped without a CUDA device (CI has none). `record_fixtures.py` beside this file records the
real data in tests/data/gpu/ that the CPU tests in tests/test_sources_recorded.py read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
collect_ignore = ["record_fixtures.py"]  # a script for GPU machines, not a test module


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    skip = None
    for item in items:
        if HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if skip is None:
            skip = (
                False
                if _cuda_available()
                else pytest.mark.skip(reason="needs a CUDA device (none here)")
            )
        if skip:
            item.add_marker(skip)
