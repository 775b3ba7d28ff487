"""The one palette of every picture gpumemviz draws, read from render/palette.json.

The panel, the offline report and the plotly figures used to pick their own colours, so
"reserved" was grey in the panel and orange in a figure. The JSON file holds each series'
colour per theme (light and dark, Okabe-Ito hues, colour-blind safe); js/src/palette.js makes
the panel's and the report's CSS variables of it and `gpumemviz.render.plots` reads it here.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files

from gpumemviz.snapshot.escaping import short_repr

__all__ = ["THEMES", "palette"]

THEMES = ("light", "dark")


@cache
def _load() -> dict[str, dict[str, str]]:
    text = files("gpumemviz.render").joinpath("palette.json").read_text(encoding="utf-8")
    data = json.loads(text)
    return {theme: dict(data[theme]) for theme in THEMES}


def palette(theme: str = "light") -> dict[str, str]:
    """Each series' colour (``#rrggbb``) in ``theme``.

    Parameters
    ----------
    theme : {"light", "dark"}

    Returns
    -------
    dict
        Series name -> colour: allocated, pending, releasable, trapped, outside, reserved,
        nvml_used, non_pytorch, fragmentation, oom, empty, bg, text, muted.

    Raises
    ------
    ValueError
        For another theme.

    Examples
    --------
    >>> palette()["allocated"], palette("dark")["allocated"]
    ('#0072b2', '#56b4e9')
    """
    if theme not in THEMES:
        raise ValueError(f"theme must be one of {', '.join(THEMES)}, not {short_repr(theme)}")
    return dict(_load()[theme])
