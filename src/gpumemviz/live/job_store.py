"""The store of a job's default torch.distributed process group, looked up here because torch
has no public getter for it: reading another library's private API is the outside-world layer's
job (live/; the allow-list of tests/project/test_privates.py), and `distributed.store` builds
its connections on what this returns."""

from __future__ import annotations

from typing import Any

__all__ = ["default_group_store"]


def default_group_store() -> Any:  # Any: a torch.distributed.Store, duck typed
    """The default process group's store, as torch holds it (under torchrun, PrefixStores over
    one TCPStore); the caller checks first that the default group is initialised."""
    from torch.distributed import distributed_c10d  # lazily: `import gpumemviz` never imports torch

    return distributed_c10d._get_default_store()
