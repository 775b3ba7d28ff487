"""Will it fit? A step's GPU memory predicted from a run on the meta device, no GPU needed.

`estimate(step, setup=, capacity=, config=)` records the step's storage allocations and frees
on the meta device (`record`), adds what CUDA adds (`extras`: cuBLAS workspaces, the foreach
optimizer paths), and drives the caching allocator model with them (`drive`): peaks, segments,
fragmentation and the first OOM (`result`). `max_batch(make, capacity=, configs=)` bisects the
largest batch that fits under each allocator setting (`batch`). torch is imported only when
one of them runs. docs/estimate.md says what the estimate sees and what it cannot.
"""

from __future__ import annotations

from gpumemviz.estimator.batch import MaxBatch, max_batch
from gpumemviz.estimator.result import Estimate, EstimateOom
from gpumemviz.estimator.run import estimate

__all__ = ["Estimate", "EstimateOom", "MaxBatch", "estimate", "max_batch"]
