"""The one-way data flow of docs/internals.md, enforced by reading every module's imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "gpumemviz"

# Everything below the panel: what the panel's commands, the panel and the front ends build on.
_ANALYSIS = {
    *("units", "_callable", "snapshot", "io", "allocator", "sample", "sources", "history"),
    *("sampler", "fragmentation", "advice", "advice_check", "render", "frames", "sites", "diff"),
    *("export", "report_html", "report_page", "figures", "capture", "live", "bundles"),
    *("distributed", "peaks"),
}

# module (dotted, relative to the package; a trailing "." means the whole subpackage; "" is the
# package's own __init__) -> the top-level modules it may import
ALLOWED: dict[str, set[str]] = {
    "units": set(),
    "_callable": set(),
    "bundles": set(),  # where the built front end is: the panel's and the report's
    "snapshot.": {"units", "snapshot"},
    "io.": {"snapshot", "units", "io"},
    "allocator.": {"snapshot", "io", "units", "allocator", "_callable"},
    "peaks": {"sample"},  # for types only: `sample` holds a `Peaks` itself
    "sample": {"snapshot", "units", "peaks"},
    "sources.": {"snapshot", "io", "allocator", "sample", "units", "sources"},
    "history": {"snapshot", "sample", "units"},  # what the sampler may, or less
    "sampler": {"snapshot", "sample", "sources", "units", "history", "peaks"},
    # sample: fragmentation.oom judges a source's OomEvent (classify_event)
    "fragmentation.": {
        *("snapshot", "io", "allocator", "units", "_callable", "fragmentation", "sample"),
    },
    "advice": {"snapshot", "io", "allocator", "units", "fragmentation"},
    # the layers that hand the sources fragmentation.oom's classifier: capture_oom, the samplers
    "capture": {"sources", "sample", "fragmentation"},
    "live": {"sample", "sources", "sampler", "fragmentation"},
    "advice_check": {"snapshot", "io", "allocator", "units", "advice"},
    "render.": {
        *("snapshot", "sample", "fragmentation", "advice", "units", "render", "io"),
        *("frames", "sites"),
    },
    "figures": {"render", "snapshot", "sample", "io", "units"},
    "frames": {"snapshot", "io", "units"},
    "sites": {"snapshot", "io", "frames", "units"},
    "diff": {"snapshot", "io", "fragmentation", "sites", "frames", "units", "_callable"},
    "export": {"snapshot", "io", "allocator", "sample", "frames", "units", "_callable"},
    "report_html": {
        *("snapshot", "io", "fragmentation", "advice", "advice_check", "sites", "frames"),
        "export",
        *("render", "units", "report_page"),
    },
    # the report's page around its data: the renderer's bundles, JSON made inert, blobs
    "report_page": {"snapshot", "io", "bundles"},
    # ranks publish to the job's store; the job view reads it (torch.distributed lazily)
    "distributed.": {
        *("snapshot", "io", "sample", "sources", "sampler", "live", "fragmentation", "render"),
        *("units", "prometheus", "distributed"),
    },
    # the exporter: the shared samplers' samples, judged by the analysis layer
    "prometheus.": {
        *("live", "sample", "sampler", "sources", "fragmentation", "snapshot", "units"),
        "prometheus",
    },
    # a step recorded on the meta device (torch lazily), driven through the allocator model
    "estimate.": {
        *("snapshot", "io", "allocator", "units", "fragmentation", "_callable", "estimate"),
    },
    "commands": _ANALYSIS,  # the panel's commands: never the panel itself
    "widget.": {*_ANALYSIS, "commands", "widget"},
    "magics": {*_ANALYSIS, "commands", "widget"},
    "cli.": {*_ANALYSIS, ""},  # "": the package, for __version__
    "": {*_ANALYSIS, "commands", "widget", "magics", "cli", "estimate"},  # re-exports
}
# third-party modules that may only be imported inside functions (lazily)
LAZY_ONLY = {"torch", "pynvml", "plotly", "anywidget", "IPython", "ipywidgets", "prometheus_client"}
# ... except in the modules that exist for them (the panel class subclasses anywidget's)
EAGER_OK = {"widget.panel", "magics"}
# a private name may be imported from another module only when that module says it is shared
SHARED = {"_util"}


def _module_name(path: Path, root: Path = PKG) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def _rule_for(name: str) -> set[str] | None:
    for key, allowed in ALLOWED.items():
        if key.endswith(".") and (name == key[:-1] or name.startswith(key)):
            return allowed
        if name == key:
            return allowed
    return None


def _is_type_checking(node: ast.stmt) -> bool:
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, *, type_checking: bool = True):
    """Every import statement, at module level and inside functions; those under
    ``if TYPE_CHECKING:`` only when `type_checking`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.stmt) and _is_type_checking(child):
                continue
            stack.append(child)


def _targets(
    node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules: set[str], top: str
) -> list[tuple[str, str | None]]:
    """(module imported, dotted relative to the package; name taken from it or None) pairs.

    ``from pkg import sub`` where ``sub`` is a module imports that module; any other name comes
    from the module named in the statement."""
    if isinstance(node, ast.Import):
        return [
            (a.name.removeprefix(top).lstrip("."), None)
            for a in node.names
            if a.name == top or a.name.startswith(top + ".")
        ]
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = [p for p in package if p]
        base = package[: len(package) - node.level + 1]
        mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
    elif node.module and (node.module == top or node.module.startswith(top + ".")):
        mod = node.module.removeprefix(top).lstrip(".")
    else:
        return []
    out = []
    for alias in node.names:
        sub = f"{mod}.{alias.name}" if mod else alias.name
        out.append((sub, None) if sub in modules else (mod, alias.name))
    return out


def _gpumemviz_imports(tree: ast.AST, name: str, is_package: bool = False) -> set[str]:
    """The top-level modules of the package that a module's source imports."""
    mods = set(_package_modules(PKG))
    return {
        mod.split(".")[0]
        for node in _imports(tree)
        for mod, _ in _targets(node, name, is_package, mods, "gpumemviz")
    }


def _package_modules(root: Path) -> dict[str, tuple[Path, bool]]:
    return {_module_name(p, root): (p, p.name == "__init__.py") for p in sorted(root.rglob("*.py"))}


def import_graph(root: Path = PKG, *, top: str = "gpumemviz") -> dict[str, set[str]]:
    """Module -> the package's modules it imports, read from every module's source.

    Counted: imports at module level and imports inside functions (a lazy import that closes
    a circle is still a circle in the design). Not counted: imports under
    ``if TYPE_CHECKING:``, which never run and only name types for annotations. Importing
    ``a.b`` counts as an edge to ``a.b`` only, not to the package ``a`` whose ``__init__``
    Python runs first (a package's ``__init__`` re-exporting its modules is no circle).
    """
    mods = _package_modules(root)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        deps = set()
        for node in _imports(tree, type_checking=False):
            deps.update(m for m, _ in _targets(node, name, is_package, set(mods), top))
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph: each strongly connected component of more than one
    module, sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        cycles.append(sorted(comp))
    return sorted(cycles)


def test_every_module_has_a_layer_rule():
    missing = [
        f"module {_module_name(p) or '(the package __init__)'} has no layer rule"
        for p in sorted(PKG.rglob("*.py"))
        if _rule_for(_module_name(p)) is None
    ]
    assert not missing, missing


def test_modules_import_only_lower_layers():
    problems = []
    mods = _package_modules(PKG)
    for name, (path, is_package) in mods.items():
        allowed = _rule_for(name)
        assert allowed is not None, f"module {name} has no layer rule"
        tree = ast.parse(path.read_text(), str(path))
        own = name.split(".")[0]
        for node in _imports(tree):
            for mod, _ in _targets(node, name, is_package, set(mods), "gpumemviz"):
                dep = mod.split(".")[0]
                if dep != own and dep not in allowed:
                    problems.append(f"{name} imports {mod}")
    assert not problems, problems


def test_no_import_cycles_inside_the_package():
    assert find_cycles(import_graph()) == []


def test_the_cycle_check_finds_a_planted_cycle(tmp_path):
    """A fake package: a lazy import in a function closes a circle; a TYPE_CHECKING one does
    not; a package __init__ re-exporting its module is no circle."""
    pkg = tmp_path / "fakepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from fakepkg.a import f\n")
    (pkg / "a.py").write_text("from . import c\n\ndef f():\n    from fakepkg.sub import b\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fakepkg.a import f\n"
    )
    (pkg / "sub" / "__init__.py").write_text("from .b import g\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\n\ndef g():\n    return f\n")
    graph = import_graph(pkg, top="fakepkg")
    assert graph["a"] == {"c", "sub.b"} and graph["c"] == set() and graph["sub.b"] == {"a"}
    assert find_cycles(graph) == [["a", "sub.b"]]
    assert find_cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
    assert find_cycles({"x": {"y"}, "y": set()}) == []


def _private_imports(root: Path = PKG, top: str = "gpumemviz") -> list[str]:
    """Private names (one leading underscore) taken from another module of the package, by
    ``from m import _x`` or as ``alias._x`` of a module imported whole, unless ``m`` is a
    shared module (`SHARED`)."""
    mods = _package_modules(root)
    problems = []
    for name, (path, is_package) in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}
        for node in _imports(tree):
            for mod, taken in _targets(node, name, is_package, set(mods), top):
                if mod == name or mod.split(".")[-1] in SHARED:
                    continue
                if taken is None:  # a module: `from pkg import mod as alias` / `import a.b as m`
                    for a in node.names:
                        if isinstance(node, ast.ImportFrom) or a.asname:
                            aliases[a.asname or a.name.split(".")[-1]] = mod
                elif taken.startswith("_") and not taken.startswith("__"):
                    problems.append(f"{name} imports {taken} from {mod or top}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                problems.append(f"{name} uses {aliases[node.value.id]}.{node.attr}")
    return sorted(set(problems))


def test_no_private_name_is_imported_across_modules():
    assert _private_imports() == []


def test_the_private_name_check_finds_one(tmp_path):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_util.py").write_text("def _ok():\n    pass\n")
    (pkg / "a.py").write_text("def _helper():\n    pass\n")
    (pkg / "b.py").write_text(
        "from fakepkg._util import _ok\nfrom fakepkg.a import _helper\nfrom . import a as m\n"
        "m._helper()\n"
    )
    assert _private_imports(pkg, "fakepkg") == ["b imports _helper from a", "b uses a._helper"]


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
                if n.split(".")[0] in LAZY_ONLY and _module_name(path) not in EAGER_OK:
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


MAX_LINES = 800  # no module longer than this
EXPLAIN_OVER = 500  # a module longer than this says in its docstring why it stays whole


def oversized_modules(root: Path = PKG) -> list[str]:
    """Modules over MAX_LINES, and modules over EXPLAIN_OVER whose docstring does not say
    why they stay whole (the phrase "stays whole" or "stay ... in one module")."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        n = text.count("\n")
        if n > MAX_LINES:
            found.append(f"{path.relative_to(root)}: {n} lines (at most {MAX_LINES})")
        elif n > EXPLAIN_OVER:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "stays whole" not in doc and "in one module" not in doc:
                found.append(f"{path.relative_to(root)}: {n} lines and no reason to stay whole")
    return found


def test_modules_are_small_or_say_why_not():
    assert oversized_modules() == []


def test_the_size_check_finds_long_modules(tmp_path):
    pkg = tmp_path / "fake"
    pkg.mkdir()
    (pkg / "long.py").write_text('"""Long."""\n' + "x = 1\n" * (MAX_LINES + 1))
    (pkg / "unsaid.py").write_text('"""Mid-sized."""\n' + "x = 1\n" * (EXPLAIN_OVER + 1))
    (pkg / "said.py").write_text(
        '"""Mid-sized: it stays whole because one class."""\n' + "x = 1\n" * (EXPLAIN_OVER + 1)
    )
    assert [line.split(":")[0] for line in oversized_modules(pkg)] == ["long.py", "unsaid.py"]


def mixed_import_styles(root: Path = PKG) -> list[str]:
    """Modules that import the package both relatively and by its absolute name (one style per
    file keeps a module's dependencies readable at a glance)."""
    mixed = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        styles = set()
        for node in _imports(tree):
            if isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module or ""]
            else:
                names = [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom) and node.level:
                styles.add("relative")
            elif any(n.split(".")[0] == root.name for n in names):
                styles.add("absolute")
        if len(styles) > 1:
            mixed.append(str(path.relative_to(root)))
    return mixed


def test_each_module_uses_one_import_style():
    assert mixed_import_styles() == []


def test_the_import_style_check_finds_a_mixed_module(tmp_path):
    pkg = tmp_path / "fake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\nfrom fake import c\n")
    (pkg / "b.py").write_text("from . import a\n")
    assert mixed_import_styles(pkg) == ["a.py"]
