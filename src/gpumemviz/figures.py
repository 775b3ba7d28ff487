"""`gpumemviz.figures`: plotly figures for notebooks (defined in `gpumemviz.render.figures`)."""

from gpumemviz.render.figures import (
    MAX_POINTS,
    outcome_rows,
    timeline,
    timeline_series,
    what_if,
    workloads,
)

__all__ = ["MAX_POINTS", "outcome_rows", "timeline", "timeline_series", "what_if", "workloads"]
