"""Sources: the only code that touches torch.cuda or pynvml (both imported lazily)."""

from __future__ import annotations

from gpumemviz.live.sources.base import (
    CAPABILITIES,
    Source,
    SourceCommandError,
    UnavailableSource,
)
from gpumemviz.live.sources.default import default_source

__all__ = ["CAPABILITIES", "Source", "SourceCommandError", "UnavailableSource", "default_source"]
