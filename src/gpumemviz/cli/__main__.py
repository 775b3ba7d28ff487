"""``python -m gpumemviz.cli``: the `gpumemviz` command without the console script."""

from __future__ import annotations

import sys

from gpumemviz.cli import main

if __name__ == "__main__":
    sys.exit(main())
