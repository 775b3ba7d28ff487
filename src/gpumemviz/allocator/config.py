"""The allocator's settings, by the name the allocator's modules and users import them under.

`AllocatorConfig` (the settings the model obeys), its parser and `ConfigError` are defined in
`gpumemviz.snapshot.settings`, in the snapshot layer below the allocator, so that a `Snapshot`
parses its recorded ``allocator_settings`` once (`Snapshot.config`) into the very value the
model, replay and analyses take. This module names them for the allocator package.
"""

from __future__ import annotations

from gpumemviz.snapshot.settings import CUDA_KEYS, GENERIC_KEYS, AllocatorConfig, ConfigError

__all__ = ["CUDA_KEYS", "GENERIC_KEYS", "AllocatorConfig", "ConfigError"]
