"""`no_gc`: the cyclic garbage collector paused while millions of containers are built.

Reading or writing a snapshot builds one dict per block, and a full GC pass over 10^7 objects
costs about half a second; the snapshot modules, `gpumemviz.io` and the replay timeline use it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC while millions of containers are built (it would rescan them: ~3x
    slower); io and the replay timeline use it too."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
