"""Where the built front end lies and whether it is older than js/: one rule for panel and report.

esbuild bundles ``js/`` into ``gpumemviz/static/`` when the package is built (pyproject's
jupyter-builder hook) and, in a source checkout, through ``make js``; nothing here builds. A
wheel ships ``static/`` and has no ``js/``. In a source checkout a bundle older than ``js/`` gets
a one-line `StaleBundleWarning`; a missing one raises `FileNotFoundError` naming the command that
builds it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

__all__ = [
    "BUILD_COMMAND",
    "JS",
    "STATIC",
    "StaleBundleWarning",
    "bundle_path",
    "sources",
    "stale",
]

STATIC = Path(__file__).resolve().parents[1] / "static"
"""The built bundles (git-ignored in a checkout, shipped in every wheel)."""
JS = Path(__file__).resolve().parents[3] / "js"
"""The front end's sources: present in a source checkout only."""
BUILD_COMMAND = "make js"
"""What builds the bundles in a source checkout (npm install, then esbuild, in js/)."""


class StaleBundleWarning(UserWarning):
    """A built bundle is older than the js/ sources it is built from."""


def sources(js: Path = JS) -> list[Path]:
    """The files every bundle is built from: js/src/*.js, js/*.css, js/package.json and the
    palette the bundles import (src/gpumemviz/render/palette.json, beside js/)."""
    palette = js.parent / "src" / "gpumemviz" / "render" / "palette.json"
    return [
        *sorted((js / "src").glob("*.js")),
        *sorted(js.glob("*.css")),
        js / "package.json",
        palette,
    ]


def stale(target: Path, js: Path = JS) -> bool:
    """Whether `target` is missing or older than one of the `sources` in `js` (False when the
    sources are absent, as in an installed wheel: what is there is what was built)."""
    if not (js / "src").is_dir():
        return False
    if not target.is_file():
        return True
    built = target.stat().st_mtime
    return any(p.stat().st_mtime > built for p in sources(js) if p.is_file())


def bundle_path(name: str, *, static: Path = STATIC, js: Path = JS) -> Path:
    """The built front-end file `name` (``widget.js``, ``widget.css``, ``report.js``, ...).

    Never builds: in a source checkout a bundle older than ``js/`` is returned with a
    `StaleBundleWarning` saying how to rebuild it.

    Raises
    ------
    FileNotFoundError
        When the file is missing; the message names the command that builds it.
    """
    target = static / name
    checkout = (js / "src").is_dir()
    if not target.is_file():
        how = (
            f"build it with `{BUILD_COMMAND}` (or `npm --prefix {js} install && "
            f"npm --prefix {js} run build`)"
            if checkout
            else "reinstall gpumemviz: its wheel ships the built front end"
        )
        raise FileNotFoundError(f"gpumemviz's front end {target} is missing: {how}")
    if checkout and stale(target, js):
        warnings.warn(
            f"{target} is older than {js}: rebuild it with `{BUILD_COMMAND}`",
            StaleBundleWarning,
            stacklevel=2,
        )
    return target
