"""Arena planning: temporaries of known shape placed at prepare time in one reused buffer.

The planner works like TFLite's simple arena planner: each planned tensor has a byte size and
a lifetime ``[first, last]`` in step positions (``first`` the step producing it, ``last`` the
last step reading it, both inclusive, so a step's inputs and its outputs are always live
together and an output never shares memory with an input of its own step). Tensors are placed
largest first, each at the lowest offset (a multiple of :data:`ALIGNMENT`) where it overlaps,
in memory, no already placed tensor whose lifetime overlaps its own.

An :class:`Arena` is the buffer of one plan with a typed view per planned tensor, built once;
an :class:`ArenaPool` lends arenas to executions, one per concurrent execution, so executions
running at the same time on one prepared model never share memory. Arena memory is allocated
and touched when the arena is created, then reused by every execution that borrows it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

#: Byte alignment of every planned offset (a cache line; enough for any SIMD load).
ALIGNMENT = 64
#: Arenas kept for reuse per subgraph; more concurrent executions allocate and drop theirs.
POOL_CAP = 4


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def plan_offsets(sizes: Sequence[int], lifetimes: Sequence[tuple[int, int]]
                 ) -> tuple[list[int], int]:
    """Offsets (aligned) for tensors of ``sizes`` bytes live over inclusive ``lifetimes``, and
    the arena's total size. Tensors whose lifetimes overlap never overlap in memory."""
    n = len(sizes)
    offsets = [0] * n
    order = sorted(range(n), key=lambda k: (-sizes[k], lifetimes[k][0], k))
    placed: list[int] = []
    total = 0
    for k in order:
        first, last = lifetimes[k]
        size = _align(max(1, sizes[k]))
        live = sorted((offsets[j], offsets[j] + _align(max(1, sizes[j]))) for j in placed
                      if lifetimes[j][0] <= last and first <= lifetimes[j][1])
        at = 0
        for start, end in live:
            if at + size <= start:
                break
            at = max(at, end)
        offsets[k] = at
        placed.append(k)
        total = max(total, at + size)
    return offsets, total


class ArenaLayout:
    """Where each planned tensor lives: ``slots[k] = (operand index, offset, dtype, shape)``;
    ``steps[pos]`` the output operands of step ``pos`` when all of them are planned (its
    output list is then prebuilt per arena), else None."""

    __slots__ = ("slots", "total", "steps")

    def __init__(self, slots: list[tuple[int, int, np.dtype, tuple[int, ...]]], total: int,
                 steps: Sequence[tuple[int, ...] | None] = ()):
        self.slots = slots
        self.total = total
        self.steps = list(steps)


class Arena:
    """One buffer of a layout and a view per planned operand (``views[operand index]``)."""

    __slots__ = ("buffer", "views", "step_outs")

    def __init__(self, layout: ArenaLayout):
        raw = np.empty(layout.total + ALIGNMENT, dtype=np.uint8)
        raw.fill(0)  # every page touched now, not at each execution's first write
        skip = (-raw.ctypes.data) % ALIGNMENT
        self.buffer = raw[skip:skip + layout.total]
        self.views: dict[int, np.ndarray] = {}
        for idx, offset, dtype, shape in layout.slots:
            nbytes = int(np.dtype(dtype).itemsize) * _prod(shape)
            self.views[idx] = self.buffer[offset:offset + nbytes].view(dtype).reshape(shape)
        #: Per step: its output arrays, when all are planned (None: built at each run).
        self.step_outs: list[list[np.ndarray] | None] = [
            None if outs is None else [self.views[i] for i in outs] for outs in layout.steps]


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class ArenaPool:
    """Arenas of one layout lent to executions: :meth:`take` one at the start of a run,
    :meth:`give` it back at the end. Two runs never hold the same arena."""

    __slots__ = ("layout", "_free", "_lock", "created", "cap")

    def __init__(self, layout: ArenaLayout, cap: int = POOL_CAP):
        self.layout = layout
        self._free: list[Arena] = []
        self._lock = threading.Lock()
        #: How many arenas were ever created (for tests and benchmarks).
        self.created = 0
        self.cap = cap

    def take(self) -> Arena:
        with self._lock:
            if self._free:
                return self._free.pop()
            self.created += 1
        return Arena(self.layout)

    def give(self, arena: Arena) -> None:
        with self._lock:
            if len(self._free) < self.cap:
                self._free.append(arena)

    @property
    def free_count(self) -> int:
        return len(self._free)
