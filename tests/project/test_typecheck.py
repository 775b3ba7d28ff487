"""The type checker is not vacuous: code that misuses the public API fails it.

`make lint` runs mypy over the package itself (strict, `[tool.mypy]` in pyproject.toml); here
a small module that imports `gpumemviz` and passes wrong types is checked with the same
configuration, and each planted error is reported on its line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PLANTED = """\
import gpumemviz

gpumemviz.format_size(12 << 30)  # fine
gpumemviz.format_size("12 GiB")  # a str where an int is expected
gpumemviz.monitor(source="cuda:0")  # a str where a Source is expected
report = gpumemviz.fragmentation({"segments": []})
free: str = report.total.free  # an int read as a str
"""


def test_mypy_reports_each_planted_type_error(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    planted = tmp_path / "planted.py"
    planted.write_text(PLANTED)
    out, err, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),  # the cache `make lint` leaves: the package is not redone
            "--no-error-summary",
            str(planted),
        ]
    )
    errors = [line for line in out.splitlines() if ": error: " in line]
    assert status == 1, (out, err)
    assert [int(line.split(":")[1]) for line in errors] == [4, 5, 7], out
    # none in the package (a cached result may name an earlier run's copy of the same file)
    assert {Path(line.split(":")[0]).name for line in errors} == {"planted.py"}, out
    assert '"format_size" has incompatible type "str"; expected "int | float"' in errors[0]
    assert '"monitor" has incompatible type "str"; expected "Source | None"' in errors[1]
    assert 'expression has type "int", variable has type "str"' in errors[2]
