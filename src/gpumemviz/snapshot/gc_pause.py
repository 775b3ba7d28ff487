"""`no_gc`: the cyclic garbage collector paused while millions of containers are built.

Reading or writing a snapshot builds one dict per block, and a full GC pass over 10^7 objects
costs about half a second; the snapshot modules, `gpumemviz.io` and the replay timeline use it.

What a paused stretch built is mostly long-lived (a loaded snapshot, a replay's recording and
checkpoints). Left in the youngest generation, the first collections after it would scan all of
it once or twice before it reaches the oldest one (0.1 s after a 10^5-entry replay, about a
second after opening a 10^6-entry trace), to free nothing. So a one-off build (loading a file,
preparing a replay, opening playback) asks `no_gc(promote_built=True)`: where it leaves
more than `PROMOTE_OVER` new containers, every tracked object moves to the oldest generation
at once (`gc.freeze` then `gc.unfreeze`, which scan nothing). Full collections still run as
before and free whatever it was; only cyclic garbage made just before waits for one, which is
why work repeated while a program runs (a sample, a seek) never asks it. Nothing is done while
the program keeps objects frozen itself (`gc.get_freeze_count()`): unfreezing would release
them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PROMOTE_OVER", "no_gc", "promote"]

#: New containers a paused stretch must leave for `no_gc` to make them old at once.
PROMOTE_OVER = 50_000


def promote() -> None:
    """Move every object the GC tracks to its oldest generation, without scanning any (see
    the module docstring); nothing while the program keeps objects frozen itself."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


@contextmanager
def no_gc(*, promote_built: bool = False) -> Iterator[None]:
    """Pause the cyclic GC while millions of containers are built (it would rescan them: ~3x
    slower); io and the replay timeline use it too. With `promote_built` (a one-off build),
    what the outermost pause built is made old on leaving, where it is more than
    `PROMOTE_OVER` containers."""
    was = gc.isenabled()
    start = gc.get_count()[0]
    gc.disable()
    try:
        yield
    finally:
        if was:
            if promote_built and gc.get_count()[0] - start > PROMOTE_OVER:
                promote()
            gc.enable()
