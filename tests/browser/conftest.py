"""A real JupyterLab on 127.0.0.1 and Debian's Chromium, driven by pytest-playwright.

Recipe: ../shared/reference/toolchain.md sections 4, 5 and 7. Lab runs from temporary dirs with a
token, a read-only extension manager and `window.jupyterapp` exposed, so tests drive notebooks
through Lab's commands rather than through clicks.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .labtools import Lab, Notebook

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.browser)
            if not Path(CHROMIUM).exists():
                item.add_marker(pytest.mark.skip(reason=f"{CHROMIUM} is not installed"))


@pytest.fixture(scope="session")
def base_url() -> None:
    """Shadows pytest-playwright's own `base_url`, a session fixture written as an instance method
    that pytest 9 warns about (toolchain.md section 5); pages here open full URLs."""
    return None


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Iterator[Lab]:
    """JupyterLab for the whole session, in temporary dirs; stopped at the end."""
    base = tmp_path_factory.mktemp("lab")
    root = base / "notebooks"
    settings = base / "settings"
    root.mkdir()
    notif = settings / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTER_DATA_DIR": str(base / "data"),
        "IPYTHONDIR": str(base / "ipython"),
    }
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [
        str(jupyter) if jupyter.exists() else shutil.which("jupyter") or "jupyter",
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.port_retries=0",
        "--allow-root",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.extension_manager=readonly",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={base / 'workspaces'}",
    ]
    log = (base / "lab.log").open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {(base / 'lab.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("jupyter lab did not answer within 90 s")
            time.sleep(0.25)
        yield Lab(url=url, token=token, root=root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


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
