"""Every picture README and the docs show is one `make screenshots` (tools/screenshots.py)
takes from the real panel, so none shows a panel that no longer exists."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# ![alt](path) and <img src="path">
LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)[^)]*\)|<img[^>]*\bsrc=[\"']([^\"']+)[\"']")


def _shots() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("screenshots", REPO / "tools" / "screenshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.SHOTS)


def _linked() -> dict[str, str]:
    """Each image README.md and docs/*.md link (relative to the repository) -> the page."""
    out = {}
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for m in LINK.finditer(page.read_text(encoding="utf-8")):
            target = m.group(1) or m.group(2)
            if re.match(r"[a-z]+:", target):  # a URL: not ours to take
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            out[path.relative_to(REPO).as_posix()] = page.name
    return out


def test_every_linked_image_is_one_the_script_takes():
    shots, linked = _shots(), _linked()
    assert "docs/panel.png" in linked  # the README's picture
    not_taken = {img: page for img, page in linked.items() if img not in shots}
    assert not not_taken, f"images no `make screenshots` writes: {not_taken}"


def test_every_picture_the_script_takes_is_shown_and_present():
    shots, linked = _shots(), _linked()
    assert set(shots) <= set(linked), f"taken but never shown: {set(shots) - set(linked)}"
    assert all((REPO / path).is_file() for path in shots)
    pictures = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.png")}
    assert pictures <= set(shots), f"pictures in docs/ no script takes: {pictures - set(shots)}"


def test_the_link_pattern_reads_both_forms():
    text = '![a](docs/x.png) and <img alt="b" src="docs/y.png"> and ![c](https://e.com/z.png)'
    found = [m.group(1) or m.group(2) for m in LINK.finditer(text)]
    assert found == ["docs/x.png", "docs/y.png", "https://e.com/z.png"]
