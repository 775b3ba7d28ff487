"""An object's underscore attributes are its own: no other module or object reads or writes them,
enforced by reading every module of the package.

A module may write ``self._x`` and ``cls._x``; any other ``x._name`` (one leading underscore,
not a dunder) reaches into state its owner did not publish, and fails here: another instance of
the same class included (``new._pools`` in a copy method couples the copy to every field of the
original). The owner publishes what others need instead: a documented property, a method, a
frozen value. ``tests/project/test_layers.py`` (`_private_imports`) already holds the same line
for private module-level names imported across modules.

Exceptions are private APIs of other libraries that gpumemviz cannot reach any other way, and
only in the layers that talk to the outside world (``live/``, ``estimator/``) plus the one
kernel hook of ``widget/subshell.py``: each is a row of `ALLOWED`, and a row that no longer
matches anything fails too, so the list stays true.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "src" / "gpumemviz"

#: (module, the attribute chain as ``ast.unparse`` shows it, why it is allowed).
ALLOWED: tuple[tuple[str, str, str], ...] = (
    (
        "estimator.extras",
        "fu._get_foreach_kernels_supported_devices",
        "torch.utils._foreach_utils: wrapped so the meta device counts as a foreach device",
    ),
    (
        "estimator.extras",
        "fu._get_fused_kernels_supported_devices",
        "torch.utils._foreach_utils: wrapped so the meta device counts as a fused device",
    ),
    (
        "estimator.extras",
        "aten._scaled_dot_product_flash_attention",
        "torch's own flash attention op, called to record its memory on the meta device",
    ),
    (
        "estimator.extras",
        "aten._scaled_dot_product_efficient_attention",
        "torch's own memory-efficient attention op, called to record its memory",
    ),
    (
        "estimator.callers",
        "sys._getframe",
        "CPython's frame access: the user's frame that made a tensor",
    ),
    (
        "estimator.extras",
        "sys._getframe",
        "CPython's frame access: the compiled function dynamo is about to enter",
    ),
    (
        "estimator.extras",
        "torch._C._get_privateuse1_backend_name",
        "what torch.autocast's own __init__ sets, replayed for the meta device's CUDA policy",
    ),
    (
        "estimator.autocast",
        "t._is_view",
        "torch's autocast weight cache skips views (its own test, no public predicate)",
    ),
    (
        "estimator.record",
        "src._cdata",
        "a torch storage's identity: an out-of-place result folded back into its input",
    ),
    (
        "estimator.record",
        "dst._cdata",
        "a torch storage's identity: an out-of-place result folded back into its input",
    ),
    (
        "estimator.record",
        "torch._C._dispatch_has_kernel_for_dispatch_key",
        "torch's dispatcher: whether an op is a CompositeImplicitAutograd composite",
    ),
    (
        "estimator.record",
        "torch._C._current_graph_task_id",
        "torch's autograd engine: whether an op runs in the backward pass",
    ),
    (
        "estimator.record",
        "s._cdata",
        "a torch storage's identity (two tensors sharing storage share it)",
    ),
    (
        "live.job_store",
        "distributed_c10d._get_default_store",
        "torch has no public getter for the default process group's store",
    ),
    (
        "live.sources.oom_capture",
        "_torch().cuda.memory._snapshot",
        "torch's allocator snapshot (no public getter returns the raw dict)",
    ),
    (
        "live.sources.oom_observer",
        "torch.cuda.memory._snapshot",
        "torch's allocator snapshot (no public getter returns the raw dict)",
    ),
    (
        "live.sources.oom_observer",
        "torch._C",
        "torch's C module: the OOM observer hook, looked up with getattr",
    ),
    (
        "live.sources.torch_cuda",
        "torch._C",
        "torch's C module: history-enabled and allocator-settings getters, looked up with getattr",
    ),
    (
        "live.sources.torch_cuda",
        "torch.cuda.memory._snapshot",
        "torch's allocator snapshot (no public getter returns the raw dict)",
    ),
    (
        "live.sources.torch_cuda",
        "memory._allocation_traceback",
        "one live block's allocation stack without a snapshot (torch 2.13; no public getter)",
    ),
    (
        "live.sources.torch_cuda",
        "torch.cuda.memory._record_memory_history",
        "torch's allocation-history switch (the stack traces of a snapshot)",
    ),
    (
        "widget.subshell",
        "comm._reply_subshell_for",
        "ipykernel's hook (7.4+) is the only way to route a comm's messages to a kernel subshell",
    ),
)

#: The packages where an `ALLOWED` row may sit (besides the one hook of widget.subshell).
ALLOWED_LAYERS = ("live", "estimator")
ALLOWED_MODULES = ("widget.subshell",)


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    return ".".join(p for p in rel.parts if p != "__init__")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _reaches_in(node: ast.AST) -> bool:
    """`node` is ``x._name`` with ``x`` anything but the bare name ``self`` or ``cls``."""
    return (
        isinstance(node, ast.Attribute)
        and _is_private(node.attr)
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    )


def private_reaches(root: Path = PKG) -> list[tuple[str, str, int]]:
    """Every ``x._name`` of the package's modules: (module, chain, line), sorted.

    A chain of several private steps (``torch._C._current_graph_task_id``) counts once, as its
    longest form: the inner ``torch._C`` is part of the same reach."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        inner = set()
        for node in ast.walk(tree):
            if _reaches_in(node) and isinstance(node, ast.Attribute) and _reaches_in(node.value):
                inner.add(id(node.value))
        hits.extend(
            (_module_name(path, root), ast.unparse(node), node.lineno)
            for node in ast.walk(tree)
            if _reaches_in(node) and id(node) not in inner
        )
    return sorted(hits)


def problems(
    root: Path = PKG, allowed: tuple[tuple[str, str, str], ...] = ALLOWED
) -> tuple[list[str], list[str]]:
    """(the reaches not in `allowed`, the rows of `allowed` that match nothing)."""
    rows = {(module, chain) for module, chain, _ in allowed}
    hits = private_reaches(root)
    found = [f"{m}:{line}: {chain}" for m, chain, line in hits if (m, chain) not in rows]
    used = {(m, chain) for m, chain, _ in hits}
    stale = [f"{m}: {chain}" for m, chain in sorted(rows - used)]
    return found, stale


def test_no_module_reads_another_objects_private_attributes():
    found, _ = problems()
    assert found == [], "\n".join(found)


def test_every_allowed_row_still_matches():
    _, stale = problems()
    assert stale == [], "\n".join(stale)


def test_allowed_rows_sit_in_the_outside_world_layers():
    wrong = [
        f"{module}: {chain}"
        for module, chain, _ in ALLOWED
        if module.split(".")[0] not in ALLOWED_LAYERS and module not in ALLOWED_MODULES
    ]
    assert wrong == []
    assert all(why.strip() for _, _, why in ALLOWED)
    assert len({(m, c) for m, c, _ in ALLOWED}) == len(ALLOWED)


def test_the_checker_finds_planted_reaches(tmp_path):
    """A fake package: a panel's writer, a copy's pools and a report's free sizes are read from
    outside their owners; ``self``/``cls``, dunders and public names are not reported."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "messages.py").write_text(
        "def send(panel, report):\n"
        "    panel._writer.write(report._free_size)\n"
        "    return panel.__class__, panel.writer\n"
    )
    (pkg / "pool.py").write_text(
        "class Pool:\n"
        "    def __init__(self):\n"
        "        self._pools = []\n"
        "\n"
        "    def clone(self):\n"
        "        new = Pool.__new__(Pool)\n"
        "        new._pools = list(self._pools)\n"
        "        return new\n"
        "\n"
        "    @classmethod\n"
        "    def make(cls):\n"
        "        return cls._build()\n"
    )
    assert private_reaches(pkg) == [
        ("messages", "panel._writer", 2),
        ("messages", "report._free_size", 2),
        ("pool", "new._pools", 7),
    ]
    found, stale = problems(pkg, (("pool", "new._pools", "a test row"), ("pool", "gone._x", "")))
    assert found == ["messages:2: panel._writer", "messages:2: report._free_size"]
    assert stale == ["pool: gone._x"]


def test_a_chain_of_private_steps_counts_once(tmp_path):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("import torch\n\nx = torch._C._hook\ny = torch._C.public\n")
    assert private_reaches(pkg) == [("a", "torch._C", 4), ("a", "torch._C._hook", 3)]
