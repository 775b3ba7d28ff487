"""The one-way data flow of docs/internals.md, enforced by reading every module's imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "src" / "gpumemviz"
ROOT = PKG.parents[1]
INTERNALS = ROOT / "docs" / "internals.md"

#: The layers, lowest first: package -> (the packages it may import, what it is).
#: docs/internals.md shows this table (`layer_table`); `python tests/project/test_layers.py`
#: writes it there.
_BELOW_WIDGET = ("snapshot", "io", "allocator", "analysis", "live", "estimator", "render")
LAYERS: dict[str, tuple[tuple[str, ...], str]] = {
    "snapshot": (
        (),
        "frozen values: Snapshot (numpy columns), Sample, MemoryStats, OomEvent, "
        "peaks, units, the parsed allocator settings, text escaping",
    ),
    "io": (("snapshot",), "snapshot files: the restricted unpickler, JSON, atomic writes, bounds"),
    "allocator": (("snapshot", "io"), "the CPU model of the caching allocator, replay, workloads"),
    "analysis": (
        ("snapshot", "io", "allocator"),
        "Snapshot -> answers: fragmentation, fit, "
        "OOM cause, advice and its replay check, holders, frames, diff",
    ),
    "live": (
        ("snapshot", "io", "allocator", "analysis"),
        "the outside world -> Samples: "
        "sources (torch.cuda, NVML, simulated, playback), sampler, history, OOM capture",
    ),
    "estimator": (
        ("snapshot", "io", "allocator", "analysis"),
        "a step recorded on the meta device, driven through the allocator model",
    ),
    "render": (
        ("snapshot", "analysis"),
        "answers + Snapshot -> rows, strips, timeline, wire frames, plotly plots",
    ),
    "reporting": ((*_BELOW_WIDGET,), "the offline HTML report, exports, the built bundles"),
    "prometheus": ((*_BELOW_WIDGET, "reporting"), "the metrics exporter"),
    "distributed": (
        (*_BELOW_WIDGET, "reporting", "prometheus"),
        "ranks publish to the job's store; the job view reads it",
    ),
    "widget": (
        (*_BELOW_WIDGET, "reporting", "prometheus", "distributed"),
        "MemoryPanel, `%gpumemviz`, the panel's commands, writer, subshell, job panel",
    ),
    "cli": (
        (*_BELOW_WIDGET, "reporting", "prometheus", "distributed", ""),
        "the `gpumemviz` command: inspect, report, whatif, diff, export, job, demo",
    ),
    "": (
        tuple(
            name
            for name in (
                "snapshot",
                "io",
                "allocator",
                "analysis",
                "live",
                "estimator",
                "render",
                "reporting",
                "widget",
            )
        ),
        "the package: lazy re-exports of the public names",
    ),
}
#: At most this many modules at the package's top (`__init__`, `__main__`, one more if earned).
MAX_TOP_MODULES = 3

# third-party modules that may only be imported inside functions (lazily)
LAZY_ONLY = {"torch", "pynvml", "plotly", "anywidget", "IPython", "ipywidgets", "prometheus_client"}
# ... except in the modules that exist for them (the panel class subclasses anywidget's)
EAGER_OK = {"widget.panel", "widget.magics"}
# a private name may be imported from another module only when that module says it is shared
SHARED = {"_util"}


def layer_table() -> str:
    """The layer table of docs/internals.md, as Markdown."""
    rows = ["| package | may import | what it holds |", "|---|---|---|"]
    for name, (allowed, what) in LAYERS.items():
        shown = ", ".join(f"`{a}`" if a else "the package (`__version__`)" for a in allowed)
        rows.append(f"| `{name or '__init__'}` | {shown or 'nothing'} | {what} |")
    return "\n".join(rows) + "\n"


BEGIN, END = "<!-- layer table: begin -->\n", "<!-- layer table: end -->\n"


def _module_name(path: Path, root: Path = PKG) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def _rule_for(name: str) -> set[str] | None:
    """The packages module `name` may import besides its own (None: no layer)."""
    layer = name.split(".")[0]
    if layer not in LAYERS or (layer == "" and name):
        return None
    return set(LAYERS[layer][0])


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


def import_graph(
    root: Path = PKG, *, top: str = "gpumemviz", type_checking: bool = False
) -> dict[str, set[str]]:
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
        for node in _imports(tree, type_checking=type_checking):
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


def test_no_import_cycles_even_through_type_only_imports():
    assert find_cycles(import_graph(type_checking=True)) == []


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


def test_few_modules_sit_at_the_package_top():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_no_module_carries_a_public_name():
    """`gpumemviz.estimate` is a function: a submodule of that name would rebind it on import."""
    import gpumemviz

    clash = [n for n in gpumemviz.__all__ if (PKG / n).is_dir() or (PKG / f"{n}.py").exists()]
    assert clash == []


def test_no_module_swaps_its_class():
    swaps = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "__class__" for t in node.targets
            ):
                swaps.append(f"{_module_name(path)}:{node.lineno}")
    assert swaps == []


def test_the_public_functions_stay_callable_after_their_modules_load():
    code = (
        "import gpumemviz.estimator, gpumemviz.analysis.diff, gpumemviz.reporting.export, "
        "gpumemviz.analysis.fragmentation, gpumemviz.allocator.replay, gpumemviz\n"
        "import types\n"
        "names = ['estimate', 'diff', 'export', 'fragmentation', 'replay', 'report']\n"
        "print([n for n in names if not isinstance(getattr(gpumemviz, n), types.FunctionType)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_internals_shows_the_layer_table():
    text = INTERNALS.read_text()
    assert BEGIN in text and END in text, f"{INTERNALS} lacks the layer table's markers"
    shown = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    assert shown == layer_table(), "run `python tests/project/test_layers.py` to rewrite it"


def write_layer_table(path: Path = INTERNALS) -> None:
    """Rewrite the table between the markers of docs/internals.md."""
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(head + BEGIN + layer_table() + END + tail)


if __name__ == "__main__":
    write_layer_table()
