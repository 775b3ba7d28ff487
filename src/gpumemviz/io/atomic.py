"""`atomic_write`: every file gpumemviz writes goes to a temp file beside its target, is
fsynced and renamed over it, so a crash or an error never leaves half a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def _write_error(e: OSError, path: Path, where: str = "") -> OSError:
    """`e` reworded as ``cannot write PATH: [where: ]reason``, one line, same class and errno."""
    reason = e.strerror or (str(e).splitlines()[0] if str(e) else type(e).__name__)
    msg = f"cannot write {path}: {where + ': ' if where else ''}{reason}"
    try:
        err = type(e)(msg)
    except TypeError:  # a subclass with its own constructor
        err = OSError(msg)
    err.errno = e.errno
    return err


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> None:
    """Call `write(f)` on a temp file beside `path`, fsync it, then rename it over `path`.

    An exception (from `write` or the OS) leaves the old file as it was and no temp file; the
    old file's permission bits are kept. Every file gpumemviz writes goes through here. An OS
    error says ``cannot write PATH: reason`` in one line, naming the target, never the temp
    file the user did not ask for (same exception class and errno).
    """
    path = Path(path)
    folder = path.parent
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise _write_error(e, path, f"folder {folder}") from None
    tmp = Path(name)
    in_write = False
    try:
        with os.fdopen(fd, "wb") as f:
            in_write = True
            write(f)
            in_write = False
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        tmp.chmod(mode)
        tmp.replace(path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        # The caller's own errors pass unchanged; the OS's (an errno, or our steps) name `path`.
        if isinstance(e, OSError) and (e.errno is not None or not in_write):
            raise _write_error(e, path) from None
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
