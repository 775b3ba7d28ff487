"""The notebook panel: `MemoryPanel` (panel.py); `monitor` and `mark` (monitor.py) for live ones.

The panel's own pieces: writer.py (the one thread that writes its traits and sends its frames)
and subshell.py (kernel subshells, so clicks act while a cell runs); job.py is the panel of a
torch.distributed job's ranks (``monitor(job=...)``). The built front end it shows is located by
gpumemviz.reporting.bundles.
"""

from gpumemviz.widget.monitor import mark, monitor
from gpumemviz.widget.panel import MemoryPanel

__all__ = ["MemoryPanel", "mark", "monitor"]
