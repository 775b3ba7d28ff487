"""A real JupyterLab on 127.0.0.1 and Debian's Chromium, driven by pytest-playwright.

pytest-playwright's own fixtures drive Debian's Chromium (`executable_path`, headless flags), so
no browser is downloaded. Lab runs from temporary dirs (its config, data and runtime files stay
out of the home folder) with a token, --allow-root (CI runs as root), a read-only extension
manager and `window.jupyterapp` exposed, so tests drive notebooks through Lab's commands rather
than through clicks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .labtools import CHROMIUM, CHROMIUM_ARGS, TEST_HOOKS, Lab, Notebook, running_lab

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.browser)
            # one xdist worker runs them all: they share one JupyterLab (a session fixture)
            item.add_marker(pytest.mark.xdist_group("browser"))
            if not Path(CHROMIUM).exists():
                item.add_marker(pytest.mark.skip(reason=f"{CHROMIUM} is not installed"))


@pytest.fixture(scope="session")
def base_url() -> None:
    """Shadows pytest-playwright's own `base_url`, a session fixture written as an instance method
    that pytest 9 warns about (PytestRemovedIn10Warning); pages here open full URLs."""
    return None


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture
def context(context):
    """pytest-playwright's context with the front end's test hooks on in every page it opens
    (`TEST_HOOKS`): the tests read the views and the event log through them."""
    context.add_init_script(TEST_HOOKS)
    return context


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Iterator[Lab]:
    """JupyterLab for the whole session, in temporary dirs; stopped at the end."""
    with running_lab(tmp_path_factory.mktemp("lab")) as handle:
        yield handle


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def notebook(page, lab):
    """Open notebooks in the page: ``notebook(name, cells)``; their kernels stop afterwards."""
    opened: list[Notebook] = []

    def make(name: str, cells: list[str]) -> Notebook:
        nb = Notebook(page, lab, name, cells)
        opened.append(nb)
        return nb

    yield make
    for nb in opened:
        nb.shutdown()
