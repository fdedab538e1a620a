"""Keep the garbage collector's full passes over the process's older objects out of a model's
open.

Why: CPython's first full collection after a process imports its libraries walks every object
they made (some 40,000 for numpy, ai-edge-litert and nnhal), 12-25 ms on this kind of
machine, and it comes due once enough new objects survive: opening a model of a few hundred
operations makes that many, so the walk landed in the open (BirdNET: a fifth of it) although
none of those objects is the open's. Inside :func:`new_objects_only` the objects that existed
before are frozen (``gc.freeze``): a collection there walks only what the open makes, and
its garbage is still collected. Leaving unfreezes them; the collector walks them again at its
next full pass, as it would have.

Left alone: a process with the collector disabled, and one that froze objects itself (a
pre-fork server): its frozen objects stay frozen. Nested and concurrent windows (Sessions
opened on several threads) unfreeze when the last one leaves. A thread that calls
``gc.freeze`` itself while a window is open sees its objects unfrozen when the window ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_open = 0


@contextlib.contextmanager
def new_objects_only() -> Iterator[None]:
    """Collections inside walk only objects made inside (see the module's docstring)."""
    global _open
    with _lock:
        ours = _open > 0 or (gc.isenabled() and not gc.get_freeze_count())
        if ours:
            if _open == 0:
                gc.freeze()
            _open += 1
    try:
        yield
    finally:
        if ours:
            with _lock:
                _open -= 1
                if _open == 0:
                    gc.unfreeze()


__all__ = ["new_objects_only"]
