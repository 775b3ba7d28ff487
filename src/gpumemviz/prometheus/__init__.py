"""Prometheus for fleets: gpumemviz's allocator figures beside DCGM's and nvitop's.

DCGM's and nvitop's exporters see device and process totals; these series add what only the
allocator knows (free bytes inside reserved segments, the largest free block, fragmentation,
alloc retries), labelled so that they join theirs on ``gpu_uuid`` and ``pid``. `serve` starts
the endpoint (`server`), `collector` builds the series at each scrape from the shared samplers,
and `metrics` is the table of what is exported. prometheus_client is imported only by `serve`.
"""

from __future__ import annotations

from gpumemviz.prometheus.metrics import LABELS, METRICS, exported_names
from gpumemviz.prometheus.server import Exporter, PortInUseError, rank_port, serve, serve_rank

__all__ = [
    "LABELS",
    "METRICS",
    "Exporter",
    "PortInUseError",
    "exported_names",
    "rank_port",
    "serve",
    "serve_rank",
]
