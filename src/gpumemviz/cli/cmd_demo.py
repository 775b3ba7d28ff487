"""`gpumemviz demo`: JupyterLab on the quickstart notebook (what `make demo` runs)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpumemviz.cli.common import UsageError

if TYPE_CHECKING:
    from gpumemviz.cli.common import Subparsers

__all__ = ["DEMO_NOTEBOOK", "add_demo", "demo_command", "run_demo"]

#: The notebook `gpumemviz demo` opens, relative to the source checkout's root.
DEMO_NOTEBOOK = Path("example_notebooks") / "01_quickstart.ipynb"
_INSTALL_HINT = "pip install jupyterlab 'gpumemviz[widget]'"


def add_demo(sub: Subparsers) -> None:
    p = sub.add_parser(
        "demo",
        help="open the quickstart notebook in JupyterLab (what `make demo` runs)",
        description="Start JupyterLab on example_notebooks/01_quickstart.ipynb: the live "
        "panel on a simulated GPU when there is no real one.",
    )
    p.add_argument("--port", type=int, default=8888, help="server port (default 8888)")
    p.add_argument(
        "--no-browser", action="store_true", help="print the URL instead of opening a browser"
    )
    p.add_argument(
        "--print-command",
        action="store_true",
        help="print the command (one shell-quoted line) instead of running it",
    )
    p.set_defaults(run=run_demo)


def demo_command(port: int = 8888, *, no_browser: bool = False) -> tuple[list[str], Path]:
    """The `jupyter lab` command line of `gpumemviz demo` and the folder it runs in.

    Raises `UsageError` (one line) when jupyterlab is missing or the notebook is not found.
    """
    try:
        import jupyterlab  # noqa: F401  (only asked whether it is there)
    except ImportError:
        raise UsageError(f"jupyterlab is not installed: {_INSTALL_HINT}") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0-65535, got {port}")
    root = Path(__file__).resolve().parents[3]  # src/gpumemviz/cli/cmd_demo.py -> the checkout
    notebook = root / DEMO_NOTEBOOK
    if not notebook.is_file():
        raise UsageError(
            f"{DEMO_NOTEBOOK} not found beside this gpumemviz ({root}): "
            "`gpumemviz demo` runs from a source checkout (git clone, then make demo)"
        )
    headless = sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        # the URL jupyter prints (and opens) is the notebook's, not the Launcher's
        f"--LabApp.default_url=/lab/tree/{notebook.name}",
    ]
    if no_browser or headless:
        cmd.append("--no-browser")
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")  # containers run as root; jupyter refuses it otherwise
    return cmd, notebook.parent


def run_demo(args: argparse.Namespace) -> int:
    import shlex
    import subprocess

    cmd, cwd = demo_command(args.port, no_browser=args.no_browser)
    if args.print_command:
        print(f"cd {shlex.quote(str(cwd))} && {shlex.join(cmd)}")
        return 0
    print(
        f"gpumemviz demo: JupyterLab on {DEMO_NOTEBOOK}; open the "
        f"http://127.0.0.1:{args.port}/lab/tree/{DEMO_NOTEBOOK.name}?token=... URL it prints "
        "(Ctrl-C stops it)",
        flush=True,
    )
    if os.name == "posix":  # become the server: Ctrl-C and kill reach jupyter, no orphan
        os.chdir(cwd)
        os.execv(cmd[0], cmd)
    try:  # pragma: no cover - Windows has no real exec
        return subprocess.call(cmd, cwd=cwd)
    except KeyboardInterrupt:  # pragma: no cover - the user stopped the server
        return 0
