"""Helpers for the browser tests: the Lab handle and a notebook driven through Lab's commands."""

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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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

# Turns the front end's test hooks on (js/src/probe.js): run before a page's own scripts, it gives
# the views a registry to join and an event log to write; shipped pages have neither.
TEST_HOOKS = "globalThis.__gpumemviz = { views: {}, log: [] };"


@dataclass(frozen=True)
class Lab:
    url: str
    token: str
    root: Path
    app: str = "lab"  # "lab": JupyterLab 4; "notebook": Notebook 7

    def notebook_url(self, name: str) -> str:
        """The page that opens notebook `name`. Lab's opens it in a fresh layout (``reset``):
        the server keeps the layout between pages, and one test's extra tab (a panel's output
        view docked below the notebook) would otherwise squeeze the next test's notebook into
        half the window, its map out of the pointer's reach."""
        if self.app == "notebook":
            return f"{self.url}/notebooks/{name}?token={self.token}"
        return f"{self.url}/lab/tree/{name}?reset&token={self.token}"


class Notebook:
    """One open notebook in the page: run its cells one at a time through Lab's commands."""

    def __init__(self, page, lab: Lab, name: str, cells: list[str]) -> None:
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
        nbformat.write(nb, lab.root / name)
        self.page = page
        self.name = name
        page.goto(lab.notebook_url(name))
        page.wait_for_function(
            """name => {
                const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                const k = w && w.context && w.context.path === name && w.sessionContext.session
                    && w.sessionContext.session.kernel;
                return k && k.status === 'idle';
            }""",
            arg=name,
            timeout=120_000,
        )
        if lab.app == "lab":
            shown = page.evaluate(
                "() => Array.from(window.jupyterapp.shell.widgets('main')).map(w => w.title.label)"
            )
            assert shown == [name], f"Lab's main area holds {shown}, not {name} alone"

    def run(self, index: int, timeout: float = 120_000) -> None:
        """Run cell `index` and wait for it to finish; fail on an error output."""
        error = self.page.evaluate(
            """async ([i, timeout]) => {
                const nb = window.jupyterapp.shell.currentWidget;
                nb.content.activeCellIndex = i;
                const run = window.jupyterapp.commands.execute('notebook:run-cell');
                await Promise.race([run, new Promise((_, no) => setTimeout(
                    () => no(new Error('cell ' + i + ' timed out')), timeout))]);
                const outs = nb.content.widgets[i].model.outputs.toJSON();
                const bad = outs.find(o => o.output_type === 'error');
                if (!bad) return null;
                return bad.ename + ': ' + bad.evalue + '\\n' + bad.traceback.join('\\n');
            }""",
            [index, timeout],
        )
        assert error is None, error

    def start(self, index: int) -> None:
        """Start running cell `index` without waiting for it (see `wait_idle`)."""
        self.page.evaluate(
            """i => {
                const nb = window.jupyterapp.shell.currentWidget;
                nb.content.activeCellIndex = i;
                window.__gmvRunning = true;
                window.__gmvRun = window.jupyterapp.commands.execute('notebook:run-cell')
                    .finally(() => { window.__gmvRunning = false; });
            }""",
            index,
        )

    def running(self) -> bool:
        """Whether the cell started by `start` still runs. (Lab's kernel status is no guide: it
        shows "idle" once a subshell has answered, while the main shell still runs the cell.)"""
        return self.page.evaluate("() => window.__gmvRunning === true")

    def wait_idle(self, timeout: float = 120_000) -> None:
        """Wait for the cell started by `start` to finish."""
        self.page.evaluate(
            """async timeout => { await Promise.race([window.__gmvRun, new Promise((_, no) =>
                setTimeout(() => no(new Error('cell timed out')), timeout))]); }""",
            timeout,
        )

    def shutdown(self) -> None:
        """Stop this notebook's kernel (found by path: another tab may be current)."""
        self.page.evaluate(
            """name => { for (const w of window.jupyterapp.shell.widgets('main')) {
                if (w.context && w.context.path === name && w.sessionContext)
                    return w.sessionContext.shutdown(); } }""",
            self.name,
        )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_lab(base: Path, app: str = "lab") -> Iterator[Lab]:
    """JupyterLab (``app="notebook"``: Notebook 7, built on the same parts) on 127.0.0.1 with its
    config, data and notebooks under `base`; stopped on exit.

    Its flags: a token, --allow-root (CI runs as root), a read-only extension manager (the
    default one queries PyPI), no update checks, and `window.jupyterapp` exposed.
    """
    root = base / "notebooks"
    settings = base / "settings"
    root.mkdir()
    notif = settings / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTER_DATA_DIR": str(base / "data"),
        "IPYTHONDIR": str(base / "ipython"),
    }
    jupyter = Path(sys.executable).with_name("jupyter")
    cls = "JupyterNotebookApp" if app == "notebook" else "LabApp"
    cmd = [
        str(jupyter) if jupyter.exists() else shutil.which("jupyter") or "jupyter",
        app,
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.port_retries=0",
        "--allow-root",
        f"--{cls}.expose_app_in_browser=True",
        f"--{cls}.user_settings_dir={settings}",
        f"--{cls}.workspaces_dir={base / 'workspaces'}",
    ]
    if app == "lab":
        cmd += [
            "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
    url = f"http://127.0.0.1:{port}"
    with serving(cmd, env, base / "lab.log", f"{url}/api/status?token={token}", "jupyter", 90):
        yield Lab(url=url, token=token, root=root, app=app)


@contextmanager
def serving(
    cmd: list[str],
    env: dict[str, str],
    log_path: Path,
    ready: str,
    what: str,
    timeout: float,
    cwd: Path | None = None,
) -> Iterator[None]:
    """Run the server `cmd` (its output to `log_path`) until `ready` answers 200 within
    `timeout` seconds; stopped on exit (terminated, killed after 15 s)."""
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(ready, timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer within {timeout:g} s")
            time.sleep(0.25)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
