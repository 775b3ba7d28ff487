"""Every rank of a torch.distributed job: its allocator summary in the job's own store.

`publish` (in each rank) keeps a compact summary of the rank's devices under ``gpumemviz/``
keys of the store every torchrun job already has (no new server, no new port), answers snapshot
requests and, with ``oom_dir``, writes per-rank snapshots when a rank runs out of memory.
`JobView` (and ``gpumemviz job HOST:PORT``) reads them from outside; `grid_rows` orders them
for the rank grid and `JobFeed` re-reads them on a schedule for a front end that redraws it.
torch is imported lazily, by `gpumemviz.distributed.store` only.
"""

from __future__ import annotations

from gpumemviz.distributed.feed import JobFeed
from gpumemviz.distributed.grid import grid_rows
from gpumemviz.distributed.jobview import JobError, JobView
from gpumemviz.distributed.publisher import Publisher, publish
from gpumemviz.distributed.store import StoreGone

__all__ = ["JobError", "JobFeed", "JobView", "Publisher", "StoreGone", "grid_rows", "publish"]
