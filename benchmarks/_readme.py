"""Write benchmarks/README.md's measured part: every benchmark script's tables (`make bench`).

Each script `benchmarks/[!_]*.py` runs in its own interpreter with ``--markdown`` (and the
arguments given here, e.g. ``--quick``), which prints its output as one Markdown section
(`_common.run_main`). The README keeps what is above its marker line (the summary written by
hand) and gets, below it, a header saying how and on what machine the sections were made, then
the sections in script order. A script that fails stops the run and leaves the README as it was.

Run: .venv/bin/python benchmarks/_readme.py [--quick]   (what `make bench` runs)
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
MARKER = "<!-- make bench writes everything below this line -->\n"


def machine() -> str:
    """The CPU model and core count, Python's version and the platform, in one line."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} CPU cores ({model}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def main() -> int:
    args = sys.argv[1:]
    scripts = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_"))
    sections = []
    for script in scripts:
        print(f"== {script.name}", file=sys.stderr, flush=True)
        out = subprocess.run(
            [sys.executable, str(script), "--markdown", *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            print(f"{script.name} failed: README.md left as it was", file=sys.stderr)
            return 1
        sections.append(out.stdout.rstrip("\n") + "\n")
    made = shlex.join(["make", "bench", *([f"BENCH_ARGS={shlex.join(args)}"] if args else [])])
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    header = (
        f"## Measured\n\nWritten by `{made}` on {today}, on {machine()}. Each section is one "
        "script's output; the script's docstring says what it measures and against which "
        "target.\n"
    )
    if args:
        header += f"\nThese are `{shlex.join(args)}` figures; `make bench` gives the full ones.\n"
    kept = README.read_text().split(MARKER)[0] if README.exists() else "# Benchmarks\n\n"
    README.write_text(kept + MARKER + "\n" + header + "\n" + "\n".join(sections))
    print(f"wrote {README}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
