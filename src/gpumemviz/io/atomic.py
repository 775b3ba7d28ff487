"""`atomic_write`: every file gpumemviz writes goes to a temp file beside its target, is
fsynced and renamed over it, so a crash or an error never leaves half a file.

The target is what the user meant: ``"-"`` is standard output, a symlink is written through
(its target replaced, the link kept), a read-only file is replaced only when forced, and a
directory, device, fifo or socket is never replaced. `claim_new_file` picks a name nobody has
(the panel's exports), so two writers never share a file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["STDOUT", "atomic_write", "check_target", "claim_new_file", "is_stdout"]

#: The path that means standard output (``-o -``); a file named "-" is ``./-``.
STDOUT = "-"

_SPOOL_BYTES = 32 << 20  # stdout output is held in memory up to this, then in a temp file
_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a fifo"),
    (stat.S_ISSOCK, "a socket"),
)


def is_stdout(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is ``"-"``, standard output."""
    return os.fspath(path) == STDOUT


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


def _refusal(cls: type[OSError], code: int, path: Path, reason: str) -> OSError:
    err = cls(f"cannot write {path}: {reason}")
    err.errno = code
    return err


def _target(path: Path, force: bool) -> tuple[Path, os.stat_result | None]:
    """The regular file `path` names (a symlink's target) and its stat, None when new.

    Refuses a directory, a device, fifo or socket, and (unless `force`) a read-only file: one
    whose owner write bit is off, or that this process may not write.
    """
    try:
        st: os.stat_result | None = path.stat()  # through symlinks
    except FileNotFoundError:
        st = None  # a new file, or a dangling link whose target is created
    except OSError as e:  # a symlink loop, a folder we may not search, ...
        raise _write_error(e, path) from None
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    if st is None:
        return target, None
    if stat.S_ISDIR(st.st_mode):
        raise _refusal(IsADirectoryError, errno.EISDIR, path, "Is a directory")
    for test, kind in _KINDS:
        if test(st.st_mode):
            raise _refusal(
                OSError,
                errno.EINVAL,
                path,
                f"it is {kind}, not a regular file; only regular files are replaced "
                '("-" writes to standard output)',
            )
    if not stat.S_ISREG(st.st_mode):
        raise _refusal(OSError, errno.EINVAL, path, "not a regular file")
    read_only = not st.st_mode & stat.S_IWUSR or not os.access(target, os.W_OK)
    if read_only and not force:
        raise _refusal(
            PermissionError,
            errno.EACCES,
            path,
            "the file is read-only (--force, or force=True, replaces it)",
        )
    return target, st


def check_target(path: str | os.PathLike[str], *, force: bool = False) -> None:
    """Raise the OSError `atomic_write` would raise for `path` before writing anything (a
    directory, device, fifo or socket; a read-only file unless `force`), so a command can
    refuse its output before the work. Standard output always passes."""
    if not is_stdout(path):
        _target(Path(path), force)


def _write_stdout(write: Callable[[BinaryIO], None]) -> None:
    """All of `write`'s output, or nothing, on standard output (spooled first, so a failure
    half-way prints nothing)."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:
        raise ValueError("cannot write to standard output here: it takes no bytes")
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
        write(spool)  # type: ignore[arg-type]
        spool.seek(0)
        sys.stdout.flush()
        shutil.copyfileobj(spool, out, 1 << 20)
        out.flush()


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[BinaryIO], None], *, force: bool = False
) -> None:
    """Call `write(f)` on a temp file beside `path`, fsync it, then rename it over `path`.

    An exception (from `write` or the OS) leaves the old file as it was and no temp file; the
    old file's permission bits are kept. Every file gpumemviz writes goes through here. An OS
    error says ``cannot write PATH: reason`` in one line, naming the target, never the temp
    file the user did not ask for (same exception class and errno).

    ``"-"`` writes to standard output (all or nothing). A symlink is written through: its
    target is replaced atomically and the link stays. A read-only file is refused with a
    PermissionError unless `force`; a directory, device, fifo or socket is always refused.
    """
    if is_stdout(path):
        _write_stdout(write)
        return
    path = Path(path)
    target, st = _target(path, force)
    folder = target.parent
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
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
        tmp.chmod(st.st_mode & 0o777 if st is not None else 0o644)
        tmp.replace(target)
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


def claim_new_file(
    folder: str | os.PathLike[str], prefix: str, suffix: str, *, when: float | None = None
) -> Path:
    """Create an empty file ``PREFIX-YYYYmmdd-HHMMSS-mmm[-N]SUFFIX`` in `folder` that did not
    exist before, and return its path: the time to the millisecond, then a counter, and an
    exclusive create, so two writers (two panels, two kernels) never get the same file.

    Parameters
    ----------
    folder : str or PathLike
    prefix, suffix : str
        E.g. ``"gpumemviz-snapshot"`` and ``".pickle"``.
    when : float, optional
        The time stamped (seconds since the epoch; default now).

    Examples
    --------
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> a = claim_new_file(d, "x", ".pickle", when=0.0)
    >>> b = claim_new_file(d, "x", ".pickle", when=0.0)
    >>> a != b and a.exists() and b.name.endswith("-2.pickle")
    True
    """
    t = time.time() if when is None else when
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(t)) + f"-{int(t % 1 * 1000):03d}"
    folder = Path(folder)
    for n in range(1, 10_000):
        path = folder / f"{prefix}-{stamp}{f'-{n}' if n > 1 else ''}{suffix}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        except OSError as e:
            raise _write_error(e, path) from None
        os.close(fd)
        return path
    raise _refusal(FileExistsError, errno.EEXIST, folder / f"{prefix}-{stamp}{suffix}", "taken")
