"""The one-way data flow of docs/internals.md, enforced by reading every module's imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "gpumemviz"

# module (dotted, relative to the package; a trailing "." means the whole subpackage) -> allowed
ALLOWED: dict[str, set[str]] = {
    "units": set(),
    "_callable": set(),
    "snapshot": {"units"},
    "io": {"snapshot", "units"},
    "allocator.": {"snapshot", "io", "units", "allocator", "_callable"},
    "sample": {"snapshot", "units"},
    "sources.": {"snapshot", "io", "allocator", "sample", "units", "sources", "fragmentation"},
    "sampler": {"snapshot", "sample", "sources", "units"},
    "fragmentation.": {"snapshot", "io", "allocator", "units", "_callable", "fragmentation"},
    "advice": {"snapshot", "io", "allocator", "units", "fragmentation"},
    "advice_check": {"snapshot", "io", "allocator", "units", "advice"},
    "render.": {
        *("snapshot", "sample", "fragmentation", "advice", "units", "render", "io"),
        *("frames", "sites"),
    },
    "frames": {"snapshot", "io", "units"},
    "sites": {"snapshot", "io", "frames", "units"},
    "diff": {"snapshot", "io", "fragmentation", "sites", "frames", "units", "_callable"},
    "export": {"snapshot", "io", "allocator", "sample", "frames", "units", "_callable"},
    "report_html": {
        *("snapshot", "io", "fragmentation", "advice", "advice_check", "sites", "frames"),
        "export",
        *("render", "units"),
    },
}
# third-party modules that may only be imported inside functions (lazily)
LAZY_ONLY = {"torch", "pynvml", "plotly", "anywidget", "IPython", "ipywidgets"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def _rule_for(name: str) -> set[str] | None:
    for key, allowed in ALLOWED.items():
        if key.endswith(".") and (name == key[:-1] or name.startswith(key)):
            return allowed
        if name == key:
            return allowed
    return None


def _gpumemviz_imports(tree: ast.AST, name: str) -> set[str]:
    found = set()
    package = name.split(".")[:-1] if name else []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
                targets = (
                    [mod] if node.module else [f"{'.'.join(base)}.{a.name}" for a in node.names]
                )
            elif node.module and node.module.startswith("gpumemviz"):
                targets = [node.module.removeprefix("gpumemviz").lstrip(".")]
            else:
                continue
            found.update(t.strip(".").split(".")[0] for t in targets if t.strip("."))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("gpumemviz."):
                    found.add(alias.name.split(".")[1])
    return found


def test_modules_import_only_lower_layers():
    problems = []
    for path in sorted(PKG.rglob("*.py")):
        name = _module_name(path)
        allowed = _rule_for(name)
        if allowed is None:
            continue
        tree = ast.parse(path.read_text(), str(path))
        own = name.split(".")[0]
        for dep in _gpumemviz_imports(tree, name):
            if dep != own and dep not in allowed:
                problems.append(f"{name} imports {dep}")
    assert not problems, problems


def test_heavy_third_party_imports_are_lazy():
    problems = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:  # module level only; imports inside functions are lazy
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for n in names:
                if n.split(".")[0] in LAZY_ONLY and _module_name(path) not in {"widget", "magics"}:
                    problems.append(f"{_module_name(path)} imports {n} at module level")
    assert not problems, problems


def test_import_gpumemviz_stays_light():
    code = (
        "import sys, gpumemviz\n"
        "heavy = {'torch', 'pynvml', 'plotly', 'anywidget', 'IPython', 'ipywidgets'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
