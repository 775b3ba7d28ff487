"""Where a call came from: the innermost frame of the user's own code, for the events the
estimator records and the autocast regions it enters (record.py and extras.py both ask).
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["library_dirs", "user_frame"]

# frames in these folders are library code, never "the user's frame"
_GPUMEMVIZ_DIR = str(Path(__file__).resolve().parents[1])


def library_dirs() -> tuple[str, ...]:
    import torch

    return (str(Path(torch.__file__).resolve().parent), _GPUMEMVIZ_DIR)


def user_frame(skip: tuple[str, ...]) -> str:
    """The innermost Python frame outside torch and gpumemviz: "file:line in function"."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(skip) and not name.startswith("<frozen"):
            return f"{name}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back  # type: ignore[assignment]
    return ""
