"""Allocation stacks: which frames to show, which one is the user's line, and path redaction.

Hover, reports, sites and diff all read stacks the same way. The filter is MemoryViz's
(the same lists as `torch.cuda._memory_viz._frame_filter`), so a stack reads
here as it does in PyTorch's viewer. Frames are innermost first: index 0 is the allocator call.

`redact_paths` exists because an export is made to be shared: home directories and user names
in frame filenames (and anywhere else a string of the snapshot holds them) become placeholders.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import filterfalse
from typing import Any

from gpumemviz.io import SnapshotLike, as_snapshot
from gpumemviz.snapshot import Snapshot
from gpumemviz.snapshot.plain import rewrite_leaves
from gpumemviz.snapshot.schema import TorchDict, TorchList

__all__ = [
    "NO_HISTORY",
    "OMIT_FILENAMES",
    "OMIT_FUNCTIONS",
    "UNKNOWN",
    "Redactor",
    "UserFrames",
    "cell_of",
    "elide_repeats",
    "filter_frames",
    "find_user_names",
    "format_frame",
    "format_stack",
    "frame_fields",
    "is_interpreter_frame",
    "is_torch_frame",
    "keep_frame",
    "name_cells",
    "redact_paths",
    "redact_torch",
    "user_frame",
    "user_frame_index",
]

# MemoryViz / torch.cuda._memory_viz._frame_filter: substrings that mark interpreter and
# dispatcher frames (`torch.cuda._memory_viz._frame_filter`).
OMIT_FUNCTIONS = (
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
)
OMIT_FILENAMES = (
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
)

# Native code: C/C++/CUDA sources and objects, and the "??" / "" of unsymbolised frames.
_NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh", ".o", ".so")
# The Python standard library (lib/python3.X/x.py, not under site-/dist-packages), frozen
# modules, and the interpreter's own pseudo-files.
_STDLIB = re.compile(r"[\\/]lib[\\/]python\d+(\.\d+)?[\\/](?!(site|dist)-packages[\\/])", re.I)
# torch's own Python (installed or a source tree), its siblings, and inductor's generated code.
_TORCH = re.compile(
    r"(^|[\\/])((site|dist)-packages[\\/](torch|functorch|torchgen)[\\/]"
    r"|torch[\\/](nn|_\w+|autograd|utils|cuda|distributed|optim|amp|fx|nested|sparse|"
    r"testing|overrides|functional|serialization|storage|library)\b"
    r"|torchinductor_[^\\/]*[\\/])"
)


@lru_cache(maxsize=1 << 16)
def _keep(name: str, filename: str) -> bool:
    return not any(o in name for o in OMIT_FUNCTIONS) and not any(
        o in filename for o in OMIT_FILENAMES
    )


UNKNOWN = "?"
"""How a malformed frame field reads: a name or filename that is not a string, a line that is
not an int. Files from strangers hold such frames; they are shown as unknown, never fatal."""


def frame_fields(frame: object) -> tuple[str, int | None, str]:
    """A frame's ``(filename, line, name)`` as torch writes them; a field of another type is
    unknown: `UNKNOWN` for the texts, None for the line (a missing field reads "" or 0, and a
    frame that is not a dict as all missing).

    Examples
    --------
    >>> frame_fields({"filename": "m.py", "line": 3, "name": "f"})
    ('m.py', 3, 'f')
    >>> frame_fields({"filename": ["m.py"], "line": float("nan"), "name": None})
    ('?', None, '?')
    """
    if type(frame) is not dict:
        return "", 0, ""
    filename, line, name = frame.get("filename", ""), frame.get("line", 0), frame.get("name", "")
    return (
        filename if type(filename) is str else UNKNOWN,
        line if type(line) is int else None,
        name if type(name) is str else UNKNOWN,
    )


def _fields(frame: object) -> tuple[str, str]:
    """(name, filename): what the frame filters read."""
    filename, _, name = frame_fields(frame)
    return name, filename


def keep_frame(frame: TorchDict) -> bool:
    """False for the interpreter and dispatcher frames MemoryViz hides (`_frame_filter`)."""
    return _keep(*_fields(frame))


def filter_frames(frames: Iterable[TorchDict]) -> list[TorchDict]:
    """The frames MemoryViz shows, in the given order (the dicts themselves, not copies)."""
    return [f for f in frames if _keep(*_fields(f))]


@lru_cache(maxsize=1 << 16)
def _is_interpreter(name: str, filename: str) -> bool:
    if not _keep(name, filename):
        return True
    if filename in ("", "??") or filename.lower().endswith(_NATIVE_SUFFIXES):
        return True
    return (
        filename.startswith(("<frozen ", "<built-in"))
        or filename in ("<string>", "<stdin>", "<aten>")  # <aten>: the estimate's operator
        or _STDLIB.search(filename) is not None
    )


@lru_cache(maxsize=1 << 16)
def _is_torch(filename: str) -> bool:
    return _TORCH.search(filename) is not None or filename.startswith("torch/")


def is_interpreter_frame(frame: TorchDict) -> bool:
    """Native code (C/C++, unsymbolised), the Python standard library, frozen modules, and the
    frames MemoryViz filters: everything that is neither torch's Python nor the user's."""
    return _is_interpreter(*_fields(frame))


def is_torch_frame(frame: TorchDict) -> bool:
    """torch's own Python (torch/, functorch/, torchgen/) or inductor's generated kernels."""
    return _is_torch(_fields(frame)[1])


def user_frame_index(frames: Sequence[TorchDict]) -> int | None:
    """Index of the first frame (innermost first) outside torch and the interpreter, or None.

    That frame is "the user's line": the code that asked for the memory. A third-party library
    (einops, transformers) counts as outside torch, as MemoryViz shows it.
    """
    for i, f in enumerate(frames):
        name, filename = _fields(f)
        if not _is_interpreter(name, filename) and not _is_torch(filename):
            return i
    return None


def user_frame(frames: Sequence[TorchDict]) -> TorchDict | None:
    """The first frame outside torch and the interpreter (see `user_frame_index`), or None."""
    i = user_frame_index(frames)
    return None if i is None else frames[i]


class UserFrames:
    """`user_frame` over many stacks that share their frame dicts, as torch's traces do (a
    fresh list per entry over a few hundred distinct frames): each distinct frame object is
    judged once, then a stack is searched at C speed by its frames' identities. The finder
    holds every frame it judged, so an identity is never reused while it lives.

    >>> a = {"filename": "/x/site-packages/torch/nn/m.py", "line": 1, "name": "f"}
    >>> b = {"filename": "train.py", "line": 9, "name": "step"}
    >>> find = UserFrames()
    >>> find([a, b]) is b, find([a]), find([b, a]) is b
    (True, None, True)
    """

    def __init__(self) -> None:
        self._other: dict[int, object] = {}  # id -> frame: torch's or the interpreter's
        self._user: dict[int, TorchDict] = {}  # id -> frame: the user's

    def __call__(self, frames: Sequence[TorchDict]) -> TorchDict | None:
        """The first frame of `frames` outside torch and the interpreter, or None."""
        while True:
            # the first frame not known to be torch's or the interpreter's
            hit = next(filterfalse(self._other.__contains__, map(id, frames)), None)
            if hit is None:
                return None
            user = self._user.get(hit)
            if user is not None:
                return user
            self._judge(frames)  # a frame not seen before: judge the stack's new ones

    def _judge(self, frames: Sequence[TorchDict]) -> None:
        for f in frames:
            if id(f) not in self._other and id(f) not in self._user:
                name, filename = _fields(f)
                user = not _is_interpreter(name, filename) and not _is_torch(filename)
                (self._user if user else self._other)[id(f)] = f


#: A plain IPython shell names a cell's code ``<ipython-input-5-3f2a...>``.
_IPYTHON_INPUT = re.compile(r"<ipython-input-(\d+)-[0-9a-f]+>")
#: filename -> the notebook cell it is, for kernels that name cells by a hash of their code
#: (ipykernel's temporary files): filled by the notebook layer (`name_cells`), read here.
_CELLS: dict[str, int] = {}


def name_cells(cells: dict[str, int]) -> None:
    """Say which notebook cell each of these code filenames is (``{filename: execution count}``),
    so frames in them read "cell [5], line 14" instead of a kernel's temporary file name.

    The widget layer calls this from inside a kernel, where the cells' sources are known;
    analysis itself never asks the kernel. Later calls add to (or correct) earlier ones.

    Examples
    --------
    >>> name_cells({"/tmp/ipykernel_7/463998876.py": 5})
    >>> format_frame({"filename": "/tmp/ipykernel_7/463998876.py", "line": 14, "name": "step"})
    'cell [5], line 14: step'
    """
    _CELLS.update(cells)


def cell_of(filename: str) -> int | None:
    """The notebook cell a code filename is (see `name_cells`), or None."""
    m = _IPYTHON_INPUT.fullmatch(filename)
    return int(m.group(1)) if m else _CELLS.get(filename)


def format_frame(frame: TorchDict, *, full_filename: bool = False) -> str:
    """'model.py:39:forward', torch's `_frame_fmt` format; a notebook cell's line reads
    'cell [5], line 14: step' (IPython's own words for it).

    Parameters
    ----------
    frame : dict
        `{"filename", "line", "name"}`.
    full_filename : bool
        Keep the whole path; by default only the last component (split on / and on \\,
        so Windows paths shorten too).

    Examples
    --------
    >>> format_frame({"filename": "/home/a/model.py", "line": 39, "name": "forward"})
    'model.py:39:forward'
    >>> format_frame({"filename": "<ipython-input-3-8a1f2b>", "line": 2, "name": "<module>"})
    'cell [3], line 2: <module>'
    """
    filename, line, name = frame_fields(frame)
    at = UNKNOWN if line is None else line
    cell = cell_of(filename)
    if cell is not None:
        return f"cell [{cell}], line {at}: {name}"
    if not full_filename:
        filename = re.split(r"[\\/]", filename)[-1]
    return f"{filename}:{at}:{name}"


NO_HISTORY = "<block was allocated before _record_history was enabled>"  # MemoryViz's words


def elide_repeats(lines: Sequence[str]) -> list[str]:
    """MemoryViz's `elideRepeats`: a run of 3+ equal lines becomes the line and
    "<repeats N times>" (N = the run length - 1); runs of 1 or 2 stay as they are."""
    out: list[str] = []
    i, n = 0, len(lines)
    while i < n:
        j = i + 1
        while j < n and lines[j] == lines[i]:
            j += 1
        out += [lines[i]] * (j - i) if j - i <= 2 else [lines[i], f"<repeats {j - i - 1} times>"]
        i = j
    return out


def format_stack(
    frames: Sequence[TorchDict],
    *,
    full_filename: bool = False,
    limit: int | None = None,
    elide: bool = False,
) -> list[str]:
    """The filtered stack as lines, innermost first, at most `limit` of them.

    `full_filename=True, elide=True` is exactly what MemoryViz shows for a block (recursion
    such as `_call_impl` chains folds into "<repeats N times>"); an empty stack gives
    `[NO_HISTORY]` then, as MemoryViz says it.
    """
    if elide and full_filename and not frames:
        return [NO_HISTORY]
    lines = [format_frame(f, full_filename=full_filename) for f in filter_frames(frames)]
    if elide:
        lines = elide_repeats(lines)
    return lines if limit is None else lines[:limit]


# ---------------------------------------------------------------------------------------------
# Redaction

_NAME = r"[^\\/\s:*?\"<>|']+"
# A home directory and the user name in it: /home/NAME, /Users/NAME, C:\Users\NAME (either
# slash, any case), and /root (the root user's home, no user name to hide).
_HOME = re.compile(
    rf"/home/(?P<posix>{_NAME})"
    rf"|/Users/(?P<mac>{_NAME})"
    rf"|\b[A-Za-z]:[\\/]+[Uu][Ss][Ee][Rr][Ss][\\/]+(?P<win>{_NAME})"
    r"|(?<![\w.\-/\\])/root(?=[\\/]|$|\s)"
)
_NOT_USERS = frozenset({"shared", "public", "default", "all users", "default user"})


class Redactor:
    """Replaces home directories and user names with placeholders, consistently.

    `/home/alice/x.py` becomes `~user1/x.py`, `C:\\Users\\Bob\\x.py` becomes `~user2\\x.py`,
    `/root/x.py` becomes `~root/x.py`, and the user name elsewhere
    (`/tmp/torchinductor_alice/...`) becomes `user1`. The users of one `redact` call are
    numbered in sorted order of their names, so the result does not depend on where in the
    snapshot a name first appears (the dict and the Snapshot paths agree); one `Redactor` used
    on several snapshots (a diff's two sides) keeps the numbers it already gave.

    Parameters
    ----------
    names : iterable of str
        User names to hide besides those found in home directories (e.g. `getpass.getuser()`).
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names: dict[str, str] = {}
        self._pending: set[str] = set(names)
        self._cache: dict[str, str] = {}
        self._pattern: re.Pattern[str] | None = None

    def assign_numbers(self) -> None:
        """Number the names learnt (`learn`) since the last call, in sorted order: `names` then
        holds them. `text` and `redact` call it; a caller that only learns (to list the names
        a snapshot holds, `find_user_names`) calls it once at the end."""
        for name in sorted(self._pending - self.names.keys()):
            self.names[name] = f"user{len(self.names) + 1}"
        if self._pending:
            self._pending = set()
            self._pattern = None
            self._cache = {}

    def learn(self, text: str) -> None:
        """Record the user names of the home directories in `text`."""
        for m in _HOME.finditer(text):
            name = m.group("posix") or m.group("mac") or m.group("win")
            if name and name.lower() not in _NOT_USERS and name not in self.names:
                self._pending.add(name)

    def _names_pattern(self) -> re.Pattern[str] | None:
        if self._pattern is None and self.names:
            alt = "|".join(re.escape(n) for n in sorted(self.names, key=len, reverse=True))
            self._pattern = re.compile(rf"(?<![A-Za-z0-9])(?:{alt})(?![A-Za-z0-9])")
        return self._pattern

    def _home(self, m: re.Match[str]) -> str:
        name = m.group("posix") or m.group("mac") or m.group("win")
        if name is None:
            return "~root"
        if name.lower() in _NOT_USERS:
            return m.group(0)
        return "~" + self.names[name]

    def text(self, s: str) -> str:
        """`s` with home directories and known user names replaced."""
        out = self._cache.get(s)
        if out is not None:
            return out
        self.learn(s)
        if self._pending:
            self.assign_numbers()
        out = _HOME.sub(self._home, s)
        pat = self._names_pattern()
        if pat is not None:
            out = pat.sub(lambda m: self.names[m.group(0)], out)
        self._cache[s] = out
        return out

    def redact(self, obj: Any) -> Any:  # Any: plain data of any shape, returned in kind
        """A copy of plain data with every string redacted (dict keys are kept).

        Containers with nothing to change are returned as they are, and a container shared
        between places (frames lists are) is redacted once and stays shared.
        """
        strings = _unique_strings(obj)
        for s in strings:
            self.learn(s)
        self.assign_numbers()
        changed = {}
        for s in strings:
            r = self.text(s)
            if r != s:
                changed[s] = r
        if not changed or type(obj) not in _CONTAINERS:
            return changed.get(obj, obj) if type(obj) is str else obj
        return rewrite_leaves(obj, lambda v: changed.get(v, v) if type(v) is str else v)


_CONTAINERS = (dict, list, tuple)


def _unique_strings(obj: object) -> dict[str, None]:
    """Every distinct string value in plain data, in the order first met (an ordered set)."""
    out: dict[str, None] = {}
    if type(obj) is str:
        out[obj] = None
    elif type(obj) in _CONTAINERS:
        _collect(obj, out, set())
    return out


def _collect(obj: Any, out: dict[str, None], seen: set[int]) -> None:  # Any: a dict, list or tuple
    if id(obj) in seen:  # shared containers (frames lists) are read once
        return
    seen.add(id(obj))
    for v in obj.values() if type(obj) is dict else obj:
        t = type(v)
        if t is str:
            out[v] = None
        elif t is dict or t is list or t is tuple:
            _collect(v, out, seen)


def find_user_names(obj: object) -> list[str]:
    """User names of the home directories found in any string of plain data, sorted."""
    r = Redactor()
    for s in _unique_strings(obj):
        r.learn(s)
    r.assign_numbers()
    return list(r.names)


def redact_torch(obj: TorchDict | TorchList, *, names: Iterable[str] = ()) -> TorchDict | TorchList:
    """A torch snapshot dict (or segment list) with home directories and user names replaced.

    Covers segment, block (torch 2.0: inside `history`) and trace frames, annotations, and every
    other string; numbers, keys and structure are unchanged. See `Redactor` for the format.
    """
    redacted: TorchDict | TorchList = Redactor(names).redact(obj)
    return redacted


def redact_paths(snapshot: SnapshotLike, *, names: Iterable[str] = ()) -> Snapshot:
    """The snapshot with home directories and user names replaced by placeholders.

    Parameters
    ----------
    snapshot : Snapshot, torch dict or list, path or bytes
        Anything `gpumemviz.io.as_snapshot` accepts.
    names : iterable of str
        More user names to hide (those in home directories are found on their own).

    Returns
    -------
    Snapshot
        Equal to the input except for the redacted strings: every string of segment, block
        (torch 2.0 ``history`` too) and trace frames, annotations, compile_context and
        user_metadata; keys, numbers and structure untouched, unchanged containers reused,
        shared lists still shared. Built through `Snapshot.map_objects` (no per-block dicts),
        it equals ``redact_torch(snapshot.to_torch())``, tested on every real file.

    Examples
    --------
    >>> snap = redact_paths([{"device": 0, "address": 0, "total_size": 512, "stream": 0,
    ...     "segment_type": "small", "frames": [{"filename": "/home/ann/t.py", "line": 3,
    ...     "name": "f"}], "blocks": [{"size": 512, "state": "inactive",
    ...     "requested_size": 0, "frames": []}]}])
    >>> snap.segment(0).frames[0]["filename"]
    '~user1/t.py'
    """
    return as_snapshot(snapshot).map_objects(Redactor(names).redact)
