"""Shared references cost what the file costs: downstream of the loader, a value shared with
itself (a 1 KB pickle of 2^30 leaves) is formatted, hashed, redacted, rendered and measured
visiting each shared object once, and JSON export says what it would take before writing."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import pytest

from gpumemviz.io import load_snapshot
from gpumemviz.reporting.export import export
from gpumemviz.snapshot import SnapshotError
from gpumemviz.snapshot.escaping import short_repr
from hostile import isolated, shared_frames_dict, shared_list, snapshot_dict

PKG = Path(__file__).resolve().parents[2] / "src" / "gpumemviz"

#: Where a file can put a shared value: each place is read by different code downstream.
PLACES = {
    "settings": lambda v: snapshot_dict(
        allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": v, "garbage_collection_threshold": v}
    ),
    "annotations": lambda v: snapshot_dict(
        external_annotations=[{"stage": v, "name": v, "device": 0, "time_us": 1}, v]
    ),
    "unknown_top_key": lambda v: snapshot_dict(unknown=v),
    "frame_name": lambda v: snapshot_dict(
        frames=[{"filename": v, "line": v, "name": v}, {"filename": "/x/m.py", "line": 1}]
    ),
}

# Every command and writer on one file, in a child with 3 GiB and a time limit: broken, each of
# these walked the 2^30 paths (inspect: the settings' repr as a cache key; report, diff:
# str() of a frame name; JSON export: json.dumps; the panel: its writer thread did the same).
_DRIVER = """
import io, json, sys, contextlib
from gpumemviz.cli import main
path, out = sys.argv[1], sys.argv[2]
results = {}
for name, argv in {
    "inspect": ["inspect", path],
    "inspect --json": ["inspect", "--json", path],
    "report": ["report", "--no-replay", path, "-o", out + ".html"],
    "diff": ["diff", path, path],
    "diff --json": ["diff", "--json", path, path],
    "export pickle": ["export", path, "-o", out + ".pickle"],
    "export redacted": ["export", "--redact-paths", path, "-o", out + ".r.pickle"],
    "export csv": ["export", path, "-o", out + ".csv"],
    "export json": ["export", path, "-o", out + ".json"],
}.items():
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        code = main(argv)
    results[name] = [code, o.getvalue()[-300:], e.getvalue()]
from gpumemviz.widget import MemoryPanel
p = MemoryPanel.from_snapshot(path)
results["panel"] = [0 if p.flush(30) else 1, "", "; ".join(p.errors)]
p.close()
print(json.dumps(results), flush=True)
# what is checked is above; the child's interpreter teardown under the 3 GiB limit is not (once
# in several runs a library's thread aborted it after the results were out)
import os; os._exit(0)
"""


@pytest.mark.parametrize("place", sorted(PLACES))
def test_every_command_reads_a_shared_value_in_bounded_time(place, tmp_path):
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps(PLACES[place](shared_list(30)), protocol=4))
    assert path.stat().st_size < 2000
    argv = ["x", str(path), str(tmp_path / "o")]
    run = isolated(f"import sys; sys.argv = {argv!r}\n" + _DRIVER)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout)
    refused = results.pop("export json")
    for name, (code, _, err) in results.items():
        assert code == 0 and err == "", (name, err)
    # JSON has no references: the export says what it would take, and that a pickle keeps them
    assert refused[0] == 2, refused
    assert "GiB" in refused[2] and "pickle" in refused[2] and len(refused[2].splitlines()) == 1
    assert not (tmp_path / "o.json").exists()
    assert load_snapshot(tmp_path / "o.pickle").n_blocks == 2  # the sharing kept


def test_messages_name_shared_values_briefly():
    from gpumemviz.snapshot.escaping import MAX_REPR, error_line

    deep = shared_list(40)
    assert len(short_repr(deep)) <= MAX_REPR
    assert len(short_repr(dict.fromkeys(range(100000), deep))) <= MAX_REPR  # no sorted(keys)
    assert short_repr(10**5000) == "<int of 16610 bits>"
    line = error_line(KeyError(deep))
    assert line.startswith("[[[[") and len(line) <= MAX_REPR
    assert error_line(ValueError("first\nsecond")) == "first"
    assert error_line(ValueError()) == "ValueError"


def test_json_size_is_exact_and_visits_each_shared_object_once():
    from gpumemviz.io.json_text import json_size

    d = snapshot_dict(external_annotations=[{"x": [1.5, None, True, "é\udcff"]}])
    assert json_size(d) == len(json.dumps(d, separators=(",", ":")))
    assert json_size(shared_list(60)) == 5 * 2**60 - 3  # 2^60 leaves "[]", never built
    fr = shared_frames_dict(50, depth=20)
    assert json_size(fr) == len(json.dumps(fr, separators=(",", ":")))
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(SnapshotError, match="too deep"):
        json_size(cycle)


def test_json_export_states_its_size_and_refuses_past_the_limit(tmp_path, monkeypatch):
    """A file sharing one 300-frame list between its blocks and trace entries (as real files
    share frames): the JSON export is refused with the estimate and the alternative, before
    a byte is written; under the limit, the estimate is the file's exact size."""
    from gpumemviz.io import json_text
    from gpumemviz.io.json_text import check_json_size, json_size

    d = shared_frames_dict(400)
    size = json_size(d)
    assert size > 100 * len(pickle.dumps(d, protocol=4))
    out = tmp_path / "x.json"
    out.write_text("old")
    monkeypatch.setattr(json_text, "JSON_LIMIT", size - 1)
    with pytest.raises(SnapshotError) as e:
        export(d, out)
    msg = str(e.value)
    assert "\n" not in msg and "pickle" in msg and "MiB" in msg
    assert out.read_text() == "old" and list(tmp_path.iterdir()) == [out]
    monkeypatch.setattr(json_text, "JSON_LIMIT", size)
    assert export(d, out).stat().st_size == size
    assert check_json_size(d) == size


def _raises_with_repr(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, expression) of every `!r` or repr() in the message of a raise statement, outside
    `__getattr__` (whose name is the attribute protocol's string)."""
    found = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_getattr = stack.pop()
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            in_getattr = True
        if isinstance(node, ast.Raise) and node.exc is not None and not in_getattr:
            for sub in ast.walk(node.exc):
                if isinstance(sub, ast.FormattedValue) and sub.conversion == ord("r"):
                    found.append((sub.lineno, ast.unparse(sub.value)))
                elif isinstance(sub, ast.Call) and ast.unparse(sub.func) == "repr":
                    found.append((sub.lineno, ast.unparse(sub)))
        stack += [(c, in_getattr) for c in ast.iter_child_nodes(node)]
    return sorted(found)


#: Modules whose messages may use a plain repr (none: units sits beside the formatter now).
_PLAIN_REPR_OK: set[str] = set()


def test_every_message_embeds_values_through_the_bounded_formatter():
    bad = [
        f"{path.relative_to(PKG)}:{line}: {expr}"
        for path in sorted(PKG.rglob("*.py"))
        if path.relative_to(PKG).as_posix() not in _PLAIN_REPR_OK
        for line, expr in _raises_with_repr(ast.parse(path.read_text()))
    ]
    assert bad == [], "use snapshot.escaping.short_repr: " + ", ".join(bad)


def test_the_formatter_check_finds_a_plain_repr():
    planted = ast.parse(
        "def f(x):\n    raise ValueError(f'bad {x!r}')\n"
        "def g(x):\n    raise ValueError('bad ' + repr(x))\n"
        "def __getattr__(name):\n    raise AttributeError(f'no {name!r}')\n"
        "def h(x):\n    raise ValueError(f'bad {short_repr(x)}')\n"
    )
    assert _raises_with_repr(planted) == [(2, "x"), (4, "repr(x)")]
