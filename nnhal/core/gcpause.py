"""The cyclic garbage collector held off while a model is opened.

Reading, analysing and exporting a model allocates tens of thousands of small objects (records,
operands, infos, tuples), almost none of them in cycles; each 700 allocations start a
collection and every few of those walk every object the process holds (with numpy and the
engines imported, tens of thousands), which cost an open about a sixth of its Python time
here. :func:`paused` holds collections off for the span of an open and lets them resume after
it (what cycles the open left are collected then). Nested and concurrent opens share one pause:
collections resume when the last one ends, and only if they were enabled when the first
began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_resume = False


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic garbage collection while the block runs (reference counting goes on)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            if _resume:
                gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
