"""The terminal's words for who holds the memory, whether it grows and when it runs out: the
`Findings` parts `gpumemviz inspect` prints (the holders table, leak suspects, the forecast,
the newer torch fields a file holds). Every value from the file goes through `one_line`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumemviz.analysis.holders import HOLDER_KEYS
from gpumemviz.snapshot.escaping import one_line
from gpumemviz.snapshot.units import format_size

if TYPE_CHECKING:
    from gpumemviz.analysis.findings import Findings

__all__ = ["HOLDER_CHOICES", "SHOWN_HOLDERS", "findings_lines", "holders_lines"]

HOLDER_CHOICES = HOLDER_KEYS
#: Holders listed in `inspect`'s summary (``--holders KEY`` lists all).
SHOWN_HOLDERS = 5

_FIELD_WORDS = {
    "annotate": "annotate entries",
    "compile_context": "entries in compiled regions (compile_context)",
    "forward_frames": "backward allocations with their forward stack (forward_frames)",
    "fx": "entries with FX node fields in their frames",
    "internal_metadata": "entries with internal_metadata",
    "pool_id": "entries with their pool_id",
    "user_metadata": "entries with user_metadata",
}


def holders_lines(found: Findings, by: str, *, top: int | None = SHOWN_HOLDERS) -> list[str]:
    """The holders of the allocated bytes grouped `by`, most first (`top` of them; None: all),
    then what the rest hold.

    Examples
    --------
    >>> from gpumemviz.analysis.findings import analyze
    >>> seg = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "blocks": [
    ...     {"size": 2 << 20, "requested_size": 2 << 20, "state": "active_allocated",
    ...      "frames": [{"filename": "train.py", "line": 9, "name": "step"}]}]}
    >>> print("\\n".join(holders_lines(analyze([seg]), "frame")))
    holders of the 2.00 MiB allocated, by frame (the innermost frame of the user's code):
      2.00 MiB in 1 block: train.py:9
    """
    rows = found.holders(by)
    what = " (the innermost frame of the user's code)" if by == "frame" else ""
    lines = [
        f"holders of the {format_size(found.figures.allocated)} allocated, by "
        f"{by.replace('_', ' ')}{what}:"
    ]
    if not rows:
        return [*lines[:-1], lines[-1][:-1] + ": none"]
    shown = rows if top is None else rows[:top]
    for r in shown:
        blocks = "block" if r.count == 1 else "blocks"
        lines.append(f"  {format_size(r.bytes)} in {r.count} {blocks}: {one_line(r.label)}")
    rest = rows[len(shown) :]
    if rest:
        lines.append(
            f"  ... {len(rest)} more holder(s) with {format_size(sum(r.bytes for r in rest))} "
            f"(--holders {by} lists every one)"
        )
    return lines


def findings_lines(found: Findings) -> list[str]:
    """The holders by frame, the leak suspects, the steps, the forecast and the newer torch
    fields of `found`, as `inspect` prints them after the advice."""
    lines = holders_lines(found, "frame")
    if found.recorded:
        fields = ", ".join(
            f"{n:,} {_FIELD_WORDS.get(k, one_line(k))}" for k, n in found.recorded.items()
        )
        lines.append(f"newer torch fields recorded: {fields}")
    steps = found.steps
    if found.growth:
        lines.append("growing (leak suspects, live bytes kept step over step):")
        lines += [f"  - {one_line(g.sentence)}" for g in found.growth]
    elif steps is not None:
        lines.append(
            f"growing: nothing ({len(steps.starts)} steps of {steps.period} allocations found "
            f"in {steps.basis})"
        )
    if found.forecast is not None:
        lines.append(f"forecast: {found.forecast.sentence}")
    return lines
