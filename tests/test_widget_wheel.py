"""The built wheel, installed (not editable) into a fresh venv, carries the panel's front end."""

from __future__ import annotations

import os
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHECK = """
import sys, pathlib
import gpumemviz.widget as w
from gpumemviz.snapshot import Snapshot
here = pathlib.Path(w.__file__).resolve()
assert pathlib.Path(sys.prefix).resolve() in here.parents, here
assert not (here.parents[1] / "js").exists()
text = w.MemoryPanel._esm
assert "gmv-root" in text and "msg:custom" in text, text[:200]
seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "segment_type": "small",
       "blocks": [{"size": 2 << 20, "requested_size": 5, "state": "active_allocated"}]}
p = w.MemoryPanel.from_snapshot(Snapshot.from_torch([seg]))
assert p.flush() and p.map_layout["n_rows"] == 1
p.close()
# the C walk: built into the wheel where a C compiler is, and loaded from this venv
import os, shlex, shutil, sysconfig
from gpumemviz.fragmentation import fragmentation, walk
cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
if cc and shutil.which(cc[0]) and sys.platform != "win32" and not os.environ.get("GPUMEMVIZ_NO_C"):
    assert walk._cwalk is not None, "the wheel's C walk did not load"
    lib = pathlib.Path(walk._cwalk.__file__).resolve()
    assert pathlib.Path(sys.prefix).resolve() in lib.parents, lib
    assert fragmentation([seg]).requested == 5
print("OK", here, len(text))
"""


def _have_cc() -> bool:
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    return bool(cc) and shutil.which(cc[0]) is not None and sys.platform != "win32"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="the package build needs npm")
def test_wheel_installs_a_working_widget(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(REPO), "-w", str(dist)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("gpumemviz-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"gpumemviz/static/widget.js", "gpumemviz/static/widget.css"} <= set(names)
    if _have_cc() and not os.environ.get("GPUMEMVIZ_NO_C"):  # the C walk makes it a platform wheel
        assert not wheel.name.endswith("-py3-none-any.whl"), wheel.name
        assert any(n.startswith("gpumemviz/fragmentation/_cwalk") for n in names), names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # third-party dependencies come from the test venv; gpumemviz itself only from the wheel
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
    )
    assert install.returncode == 0, install.stderr[-3000:]
    run = subprocess.run(
        [str(py), "-c", CHECK], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("OK")
