"""gpumemviz.reporting.bundles: where the built front end is, when it is stale, and what it never
does."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest

from gpumemviz.reporting import bundles
from gpumemviz.reporting.bundles import StaleBundleWarning, bundle_path, stale


def _checkout(root: Path) -> tuple[Path, Path]:
    """A fake source checkout: js/ with its sources and static/ with one built bundle."""
    js, static = root / "js", root / "static"
    (js / "src").mkdir(parents=True)
    static.mkdir()
    for p in (js / "src" / "widget.js", js / "widget.css", js / "package.json"):
        p.write_text("x")
    (static / "widget.js").write_text("built")
    _age(*(js / "src").iterdir(), js / "widget.css", js / "package.json", seconds=100)
    return js, static


def _age(*paths: Path, seconds: float) -> None:
    for p in paths:
        t = p.stat().st_mtime - seconds
        os.utime(p, (t, t))


def test_a_fresh_bundle_is_returned_without_a_warning(tmp_path):
    js, static = _checkout(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bundle_path("widget.js", static=static, js=js) == static / "widget.js"
    assert not stale(static / "widget.js", js)


@pytest.mark.parametrize("source", ["src/widget.js", "widget.css", "package.json"])
def test_a_bundle_older_than_a_source_warns_and_is_not_rebuilt(tmp_path, source):
    js, static = _checkout(tmp_path)
    _age(static / "widget.js", seconds=1000)
    (js / source).write_text("edited")
    assert stale(static / "widget.js", js)
    with pytest.warns(StaleBundleWarning, match="rebuild it with `make js`") as caught:
        path = bundle_path("widget.js", static=static, js=js)
    assert path.read_text() == "built"  # used as it is: nothing ran
    assert len(caught) == 1 and "\n" not in str(caught[0].message)


def test_a_missing_bundle_names_the_command_that_builds_it(tmp_path):
    js, static = _checkout(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        bundle_path("report.js", static=static, js=js)
    text = str(err.value)
    assert "\n" not in text and "make js" in text
    assert f"npm --prefix {js} install && npm --prefix {js} run build" in text


def test_an_installed_package_has_no_sources_and_is_never_stale(tmp_path):
    static = tmp_path / "static"
    static.mkdir()
    (static / "widget.js").write_text("built")
    assert not stale(static / "widget.js", tmp_path / "no-js")
    assert bundle_path("widget.js", static=static, js=tmp_path / "no-js").is_file()
    with pytest.raises(FileNotFoundError, match="reinstall gpumemviz"):
        bundle_path("report.js", static=static, js=tmp_path / "no-js")


def test_nothing_in_the_package_runs_npm():
    """The build belongs to the package build and `make js`, never to an import or a panel."""
    pkg = Path(bundles.__file__).parent
    runs = [
        p.relative_to(pkg)
        for p in pkg.rglob("*.py")
        if re.search(r"[\"']npm[\"']", p.read_text())  # a command line naming npm
    ]
    assert runs == []


@pytest.mark.parametrize("name", ["widget.js", "report.js"])
def test_the_shipped_bundles_make_no_global_registry_or_log(name):
    """Only a test's hooks (js/src/probe.js) give the views a registry and an event log."""
    text = bundle_path(name).read_text()
    assert re.search(r"__gpumemviz\s*=(?!=)", text) is None
    assert text.count("__gpumemviz") == 1  # the one read, in testHooks()
