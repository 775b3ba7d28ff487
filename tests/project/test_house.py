"""The house's promises a newcomer reads first: a README that fits its job, a licence, a
changelog, one version string, and make's needs said where the two commands are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gpumemviz

tomllib = pytest.importorskip("tomllib")  # Python 3.11+: what reads pyproject.toml here

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_readme_fits_its_job():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200)"
    first_screen = "\n".join(lines[:25])
    assert "make demo" in first_screen and "make test" in first_screen
    assert re.search(r"!\[[^\]]+\]\(docs/panel\.png\)", first_screen)


def test_readme_says_what_make_needs():
    text = README.read_text()
    head = text[: text.index("## Install")]  # beside the two commands
    assert all(word in head for word in ("python3", "node", "npm")), head
    assert 'pip install ".[widget]"' in text and "pip install torch==2.13.0" in text


def test_licence_and_changelog_are_there():
    licence = (ROOT / "LICENSE").read_text()
    assert "Redistribution and use in source and binary forms" in licence  # BSD-3-Clause
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "BSD-3-Clause"
    assert "## [Unreleased]" in (ROOT / "CHANGELOG.md").read_text()


def test_the_version_is_written_once():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["hatch"]["version"]["path"] == "src/gpumemviz/__init__.py"
    assert re.fullmatch(r"\d+\.\d+\.\d+", gpumemviz.__version__)
    found = [
        p
        for p in (ROOT / "src").rglob("*.py")
        if re.search(r"^__version__\s*=", p.read_text(), re.M)
    ]
    assert found == [ROOT / "src" / "gpumemviz" / "__init__.py"]
