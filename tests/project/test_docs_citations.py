"""Comments cite only what a clone has: no private documents, and docs/allocator.md sections exist.

The allocator rules used to be cited as sections of a document outside the repository; they now
live in docs/allocator.md, and comments point there as "docs/allocator.md, <Section>". These
tests fail on a citation of an outside document (its name, or a bare "section 2.7"-style number)
and on a pointer to a heading docs/allocator.md does not have. Public upstream sources (torch
files by path and commit, PRs, a JEP by URL) are fine.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()

#: What is scanned: these folders (recursively) and files, relative to the repository root.
SCANNED = ("src", "js/src", "tests", "tools", "benchmarks", "docs", "README.md")
#: Not scanned: recorded data, build and cache folders.
SKIPPED_DIRS = frozenset({"data", "artifacts", "node_modules", "__pycache__", ".ipynb_checkpoints"})

# Names of outside documents, spelled in pieces so that this file does not cite them itself.
_OUTSIDE = [
    r"reference\s+sections?\b",
    r"reference\s*§",
    r"reference\s+\d+\.\d+",
    r"torch-allocator" + r"\.md",
    r"toolchain" + r"\.md",
    r"\bdesign" + r"\.md",
    r"\.\./shared/" + r"reference",
    r"\bsections?[ -]\d+\.\d+",  # "section 2.7", "sections 2.3-2.15": numbered outside sections
    r"§\s*\d",
]
CITATION = re.compile("|".join(f"(?:{p})" for p in _OUTSIDE), re.IGNORECASE)
POINTER = "docs/allocator.md, "
# a comment wrapped onto the next line: the newline, indentation and comment marker go
_WRAP = re.compile(r"[ \t]*\n[ \t]*(?:#:?|//|\*)?[ \t]*")


def _files(root: Path) -> Iterator[Path]:
    for name in SCANNED:
        top = root / name
        if top.is_file():
            yield top
        elif top.is_dir():
            for p in sorted(top.rglob("*")):
                rel = p.relative_to(root).parts
                if rel[:2] == ("tests", "data") or SKIPPED_DIRS.intersection(rel[:-1]):
                    continue
                if p.is_file() and p.resolve() != HERE:
                    yield p


def _text(p: Path) -> str | None:
    try:
        return p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary (images, pickles): nothing to cite


def outside_citations(root: Path) -> list[str]:
    """`path:line: text` for every citation of a document outside the repository."""
    found = []
    for p in _files(root):
        text = _text(p)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if CITATION.search(line):
                found.append(f"{p.relative_to(root)}:{n}: {line.strip()}")
    return found


def allocator_headings(root: Path) -> set[str]:
    """The section headings (## and ###) of docs/allocator.md."""
    text = (root / "docs" / "allocator.md").read_text(encoding="utf-8")
    return {m.group(1).strip() for m in re.finditer(r"^#{2,3}\s+(.+)$", text, re.MULTILINE)}


def section_pointers(root: Path) -> tuple[int, list[str]]:
    """(pointers seen, the ones naming no heading) of "docs/allocator.md, <Section>" in comments.

    A pointer is good when the text after it starts with a heading, followed by anything but a
    letter or digit; a comment wrapped over lines is read as one line.
    """
    headings = sorted(allocator_headings(root), key=len, reverse=True)
    seen, bad = 0, []
    target = (root / "docs" / "allocator.md").resolve()
    for p in _files(root):
        if p.resolve() == target:
            continue
        text = _text(p)
        if text is None or POINTER not in text:
            continue
        flat = _WRAP.sub(" ", text)
        for m in re.finditer(re.escape(POINTER), flat):
            seen += 1
            after = flat[m.end() : m.end() + 200]
            if not any(re.match(re.escape(h) + r"(?![A-Za-z0-9])", after) for h in headings):
                bad.append(f"{p.relative_to(root)}: {POINTER}{after[:60]!r}")
    return seen, bad


# ---------------------------------------------------------------------------------- the repo


def test_no_comment_cites_a_document_outside_the_repository():
    assert outside_citations(ROOT) == []


def test_every_allocator_md_pointer_names_an_existing_heading():
    seen, bad = section_pointers(ROOT)
    assert bad == []
    assert seen >= 20  # the rules modules, fragmentation and tests point there


def test_allocator_md_names_the_torch_sources_by_commit():
    text = (ROOT / "docs" / "allocator.md").read_text(encoding="utf-8")
    assert "c10/cuda/CUDACachingAllocator.cpp" in text
    assert re.search(r"`[0-9a-f]{40}`", text)


# --------------------------------------------------------------------------- planted cases


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "docs" / "allocator.md").write_text(
        "# Title\n\n## Splitting\n\ntext\n\n## Streams and events\n\n### Release bursts\n"
    )
    for rel, body in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return tmp_path


@pytest.mark.parametrize(
    "line",
    [
        '"""Bookkeeping (reference section 2.15)."""',
        "# see the reference § 3.9",
        "# ../shared/" + "reference/toolch" + "ain.md sections 4, 5",
        "# as torch-allo" + "cator.md says",
        "# export (des" + "ign.md)",
        "# best fit (section 2." + "7)",
    ],
)
def test_a_planted_outside_citation_is_caught(tmp_path, line):
    root = _tree(tmp_path, {"src/pkg/mod.py": f"x = 1\n{line}\n"})
    found = outside_citations(root)
    assert len(found) == 1 and found[0].startswith("src/pkg/mod.py:2:")


def test_recorded_data_and_plain_words_are_not_citations(tmp_path):
    root = _tree(
        tmp_path,
        {
            "tests/data/notes.txt": "reference section 2.7\n",
            "src/pkg/mod.py": "# reference counting frees it; passed by reference\n",
            "README.md": "Real files live in ../shared/real-snapshots/ where CI has them.\n",
        },
    )
    assert outside_citations(root) == []


def test_a_planted_pointer_to_a_missing_heading_is_caught(tmp_path):
    good = (
        "# (docs/allocator.md, Splitting)\n"
        "# wrapped: docs/allocator.md, Streams and\n# events.\n"
        '"""See docs/allocator.md, Release bursts."""\n'
    )
    root = _tree(tmp_path, {"src/pkg/good.py": good})
    assert section_pointers(root) == (3, [])
    root = _tree(tmp_path / "b", {"src/pkg/bad.py": "# docs/allocator.md, Splits\n"})
    seen, bad = section_pointers(root)
    assert seen == 1 and len(bad) == 1 and "Splits" in bad[0]
