"""The built wheel: pure Python (py3-none-any) with the panel's front end, installed (not
editable) into a fresh venv, where its console script reads a real file and a real Jupyter kernel
loads the extension and replays that file."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpumemviz.analysis.fragmentation import fragmentation

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "real" / "Charran78__DocuBox__dump_snapshot.pickle"

CELL = f"""
%load_ext gpumemviz
%gpumemviz --replay {RECORDED}
import gpumemviz, gpumemviz.widget
print("LOADED", gpumemviz.__file__)
text = str(gpumemviz.widget.MemoryPanel._esm)
print("ESM", "gmv-root" in text and "msg:custom" in text)
"""


def _env() -> dict[str, str]:
    """The environment without anything that would put this checkout's src/ on sys.path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


# what a build never reads, or writes itself (the bundles): left out of the copy built from
LEFT_OUT = shutil.ignore_patterns(
    ".git", ".venv", "node_modules", "static", "__pycache__", "*_cache", "build", "dist"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds from a copy of this checkout: the package build runs npm and
    esbuild in the tree it builds, and this checkout's bundles serve the browser tests running
    beside this one (a rebuild there rewrote them mid-test)."""
    tree = tmp_path_factory.mktemp("tree") / "gpumemviz"
    shutil.copytree(REPO, tree, ignore=LEFT_OUT, symlinks=True)
    if (REPO / "js" / "node_modules").is_dir():  # esbuild already installed: no npm download
        shutil.copytree(REPO / "js" / "node_modules", tree / "js" / "node_modules", symlinks=True)
    dist = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(tree), "-w", str(dist)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (built,) = dist.glob("gpumemviz-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel; third-party dependencies come from the test venv."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    py = root / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # a path line, not a site dir: the test venv's own .pth files (the editable gpumemviz's
    # among them) are not read, so gpumemviz itself comes only from the wheel
    (Path(purelib) / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return root


def _purelib(venv: Path) -> Path:
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip()).resolve()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="the package build needs npm")
def test_the_wheel_is_pure_python_and_carries_the_front_end(wheel):
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert {
        "gpumemviz/static/widget.js",
        "gpumemviz/static/widget.css",
        "gpumemviz/static/report.js",
        "gpumemviz/static/report.css",
    } <= set(names)
    compiled = [n for n in names if n.endswith((".so", ".pyd", ".c", ".dylib"))]
    assert not compiled, compiled


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="the package build needs npm")
def test_its_console_script_inspects_a_real_file(venv):
    script = venv / "bin" / "gpumemviz"
    text = subprocess.run(
        [str(script), "inspect", str(RECORDED)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert text.returncode == 0, text.stderr[-3000:]
    assert "1 device(s), 12 segments, 116 blocks" in text.stdout, text.stdout[:2000]
    as_json = subprocess.run(
        [str(script), "inspect", "--json", str(RECORDED)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    total = json.loads(as_json.stdout)["memory"]
    here = fragmentation(RECORDED).total  # the checkout's package, in this process
    assert (total["reserved"], total["allocated"], total["largest_free"], total["blocks"]) == (
        here.reserved,
        here.allocated,
        here.largest_free,
        here.blocks,
    )
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import gpumemviz; print(gpumemviz.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
        cwd=venv,
    )
    assert _purelib(venv) in Path(where.stdout.strip()).resolve().parents, where.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="the package build needs npm")
def test_a_kernel_of_the_venv_loads_the_extension_and_replays_a_file(venv, tmp_path):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = tmp_path / "kernels" / "wheel-venv"
    spec.mkdir(parents=True)
    argv = [str(venv / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "wheel venv", "language": "python"})
    )
    ksm = KernelSpecManager(kernel_dirs=[str(spec.parent)])
    km = KernelManager(kernel_name="wheel-venv", kernel_spec_manager=ksm)
    km.start_kernel(cwd=str(tmp_path), env=_env())
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        out: list[str] = []
        errors: list[dict] = []

        def hook(msg: dict) -> None:
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                errors.append(content)

        reply = kc.execute_interactive(CELL, timeout=120, output_hook=hook)
        assert reply["content"]["status"] == "ok" and not errors, (reply["content"], errors)
        lines = dict(line.split(" ", 1) for line in "".join(out).splitlines() if " " in line)
        loaded = Path(lines["LOADED"]).resolve()
        assert _purelib(venv) in loaded.parents, loaded
        assert REPO / "src" not in loaded.parents
        assert lines["ESM"] == "True"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


#: torch 2.13's own dependencies: with torch, what the README's first command installs
_TORCH_DISTS = ("torch", "filelock", "typing_extensions", "sympy", "mpmath", "networkx", "jinja2")
_TORCH_DISTS += ("markupsafe", "fsspec", "numpy")


@pytest.fixture(scope="module")
def readme_venv(wheel, tmp_path_factory) -> Path:
    """A venv set up as README's install says: torch==2.13.0 first, then the package with its
    `[widget]` extra (the wheel a clone's `pip install ".[widget]"` builds), and ipykernel for
    the notebook's kernel. torch comes from this test venv through a path file holding only
    torch and its dependencies (a copy would be 750 MB); everything else pip resolves."""
    root = tmp_path_factory.mktemp("readme-venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    py = root / "bin" / "python"
    here = Path(site.getsitepackages()[0])
    only = tmp_path_factory.mktemp("torch-only")
    for entry in here.iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()
        if top in _TORCH_DISTS or top in {d.replace("_", "") for d in _TORCH_DISTS}:
            (only / entry.name).symlink_to(entry)
    purelib = _purelib(root)
    (purelib / "torch-only.pth").write_text(f"{only}\n")
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for args in (["torch==2.13.0"], [f"gpumemviz[widget] @ {wheel.as_uri()}", "ipykernel"]):
        done = subprocess.run(
            [*pip, *args], capture_output=True, text=True, timeout=600, env=_env()
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="the package build needs npm")
def test_the_readme_install_gives_a_working_magic_in_a_kernel(readme_venv, tmp_path, monkeypatch):
    """Issue 35's first item: plain `pip install .` left out anywidget; the README's install
    (with `[widget]`) gives a kernel where `%gpumemviz` shows the panel."""
    import nbformat
    from nbclient import NotebookClient

    spec = tmp_path / "kernels" / "readme-venv"
    spec.mkdir(parents=True)
    argv = [str(readme_venv / "bin" / "python"), "-m", "ipykernel_launcher"]
    (spec / "kernel.json").write_text(
        json.dumps(
            {"argv": [*argv, "-f", "{connection_file}"], "display_name": "r", "language": "python"}
        )
    )
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("%load_ext gpumemviz\n%gpumemviz --demo training")]
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))  # finds kernels/readme-venv
    # the client owns its kernel manager: it stops the kernel and closes every socket
    client = NotebookClient(
        nb, kernel_name="readme-venv", timeout=180, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env=_env())
    outputs = nb.cells[0].outputs
    assert not [o for o in outputs if o.output_type == "error"], outputs
    views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views, outputs
