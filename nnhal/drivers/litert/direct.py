"""The bound runs' calls into ai-edge-litert as one native call (``direct.c``), for models
whose whole run takes microseconds: there a Python frame around ``SetTensor`` + ``Invoke`` +
``GetTensor`` costs as much as the run, and ai-edge-litert's own call is the yardstick.

Built into nnhal's cache at first use (:func:`nnhal.core.native.build_extension`, on a
thread of its own); until then, and where it cannot be (no compiler or Python headers,
``NNHAL_NATIVE=0``), :func:`calls` answers None and the bindings keep their Python closures,
which do the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nnhal.core.native import NativeModule
from nnhal.executor import profile as _profile

#: The native module, built or loaded at first use.
DIRECT = NativeModule("nnhal_litert_direct", Path(__file__).with_name("direct.c"))


def calls(*, pool: list[Any] | None, calls: tuple[Any, Any, Any] | None,
          shapes: Sequence[tuple[int, ...]] | None, inputs: Sequence[int],
          outputs: Sequence[int], known: Sequence[tuple[int, ...] | None],
          general: Callable[[Sequence[Any]], list[Any] | None],
          failed: Callable[[BaseException, Sequence[Any]], list[Any] | None],
          fix: Callable[[list[Any]], list[Any] | None], bools: Sequence[int] = ()
          ) -> Any | None:
    """A native callable taking a list of input arrays and giving the output arrays (or
    None), as the binding's ``run``: on an engine taken from ``pool`` (the free list; one
    fitted to ``shapes``, the pool's one object for the layout, else ``general`` runs) or
    with the fixed ``calls``. ``general`` runs every other case (a profiled run, not a list
    of the inputs' count), ``failed`` is told of a call that raised, with the inputs (its
    answer is the call's: None, or the outputs of the run made another way), ``fix`` gets
    outputs of another shape than ``known``; ``bools``: the inputs whose arrays ``general``
    takes unless every byte is 0 or 1. None when the native module is not available, or
    cannot hold this layout, or while it is being built (:meth:`NativeModule.soon`: the
    caller's twin runs meanwhile)."""
    m = DIRECT.soon()
    if m is None:
        return None
    try:
        return m.Calls(pool, calls, shapes, tuple(int(i) for i in inputs),
                       tuple(int(i) for i in outputs),
                       tuple(tuple(int(d) for d in k) if k is not None else None
                             for k in known),
                       general, failed, fix, _profile, tuple(int(k) for k in bools))
    except (TypeError, ValueError, OverflowError, MemoryError):
        return None  # (a layout it cannot hold: the closure does it)
