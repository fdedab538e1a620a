"""A request's inputs and outputs laid out in shared memory, and grown on
OUTPUT_INSUFFICIENT_SIZE: the one implementation every caller (the request builder, the
Session, the runtime's executions and its split-model steps, conformance) uses.

Each argument is a :class:`ArgSlot`: omitted, bytes in the layout's own memory (inputs in one
shared memory, outputs in another, each argument at an :data:`ALIGN`-byte offset), or bytes of
a pool the caller already has (the NDK's ``setInputFromMemory``). Callers differ only in where
memory comes from (``take`` / ``give``: the runtime pools it) and in how much outputs may grow
to (``max_output_bytes``): a driver's absurd size answer is a :class:`LayoutError`, never an
allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnhal.errors import one_line
from nnhal.hal.types import DataLocation, Request, RequestArgument
from nnhal.memory import MemoryError_, SharedMemory

#: Offset alignment of every argument in the layout's memory (a cache line).
ALIGN = 64
#: Default bound on the bytes of a layout's outputs (the device's default tensor limit).
MAX_OUTPUT_BYTES = 1 << 32


class LayoutError(Exception):
    """The request memory could not be made, grown or read (one line)."""


@dataclass(frozen=True)
class ArgSlot:
    """One request argument: ``size`` bytes in the layout's memory (``pool`` None), bytes
    ``[offset, offset + size)`` of a caller's ``pool``, or ``omitted``; ``dims`` go in the
    request as given (empty where the model's are known)."""

    size: int = 0
    dims: tuple[int, ...] = ()
    omitted: bool = False
    pool: Any = None
    offset: int = 0


def place(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of blobs of ``sizes`` laid one after another, each aligned; the total size."""
    offsets, total = [], 0
    for n in sizes:
        total += -total % ALIGN
        offsets.append(total)
        total += int(n)
    return offsets, total


class RequestLayout:
    """A :class:`Request` over ``inputs`` and ``outputs``; the layout's memories come from
    ``take(size)`` and go back through ``give(memory)`` (default: new ashmem, closed).
    ``both_pools``: the layout's input and output memories exist even when no argument uses
    them (pool 0 and pool 1 of a request without caller pools)."""

    def __init__(self, inputs: Sequence[ArgSlot], outputs: Sequence[ArgSlot], *,
                 max_output_bytes: int = MAX_OUTPUT_BYTES, sealed: bool = False,
                 both_pools: bool = False,
                 take: Callable[[int], SharedMemory] | None = None,
                 give: Callable[[SharedMemory], None] | None = None):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.max_output_bytes = max_output_bytes
        self._sealed = sealed
        self._take = take
        self._give = give
        self._pools: list[Any] = []
        index: dict[int, int] = {}
        for s in (*self.inputs, *self.outputs):
            if s.pool is not None and id(s.pool) not in index:
                index[id(s.pool)] = len(self._pools)
                self._pools.append(s.pool)
        self._index = index
        own_in = both_pools or any(_own(s) for s in self.inputs)
        self._own_out = both_pools or any(_own(s) for s in self.outputs)
        self._in_pool = len(self._pools) if own_in else -1
        self._out_pool = len(self._pools) + int(own_in) if self._own_out else -1
        self.input_memory: SharedMemory | None = None
        self.output_memory: SharedMemory | None = None
        offs, total = place([s.size if _own(s) else 0 for s in self.inputs])
        if own_in:
            self.input_memory = self._memory(total, "input")
        self._in_args = [self._arg(s, self._in_pool, off) for s, off in zip(self.inputs, offs)]
        self._in_offsets = offs
        self.out_sizes: list[int] = []
        self.request = Request([], [], [])
        try:
            self._lay_outputs([s.size if _own(s) else 0 for s in self.outputs])
        except LayoutError:
            self._release(self.input_memory)
            raise

    def _memory(self, size: int, what: str) -> SharedMemory:
        size = int(size)
        try:
            if self._take is not None:
                return self._take(size)
            return SharedMemory.ashmem(size, sealed=self._sealed)
        except (OSError, MemoryError, MemoryError_, ValueError, OverflowError) as e:
            raise LayoutError(f"cannot allocate {size} bytes of {what} memory: "
                              f"{one_line(e)}") from None

    def _release(self, mem: SharedMemory | None) -> None:
        if mem is None:
            return
        if self._give is not None:
            self._give(mem)
        else:
            mem.close()

    def _arg(self, s: ArgSlot, own_pool: int, offset: int) -> RequestArgument:
        if s.omitted:
            return RequestArgument(True, DataLocation(0, 0, 0), [])
        if s.pool is not None:
            return RequestArgument(False, DataLocation(self._index[id(s.pool)], s.offset,
                                                       s.size), list(s.dims))
        return RequestArgument(False, DataLocation(own_pool, offset, s.size), list(s.dims))

    def _lay_outputs(self, sizes: Sequence[int]) -> None:
        offs, total = place(sizes)
        if total > self.max_output_bytes:
            raise LayoutError(f"the outputs would need {total} bytes, more than the "
                              f"{self.max_output_bytes} a request may hold")
        if self.output_memory is not None:
            self._release(self.output_memory)
            self.output_memory = None
        if self._own_out:
            self.output_memory = self._memory(total, "output")
        self._out_offsets = offs
        self.out_sizes = [int(n) for n in sizes]
        self._out_args = [
            self._arg(ArgSlot(n, s.dims, s.omitted, s.pool, s.offset) if _own(s) else s,
                      self._out_pool, off)
            for s, n, off in zip(self.outputs, sizes, offs)]
        pools = list(self._pools)
        for mem in (self.input_memory, self.output_memory):
            if mem is not None:
                pools.append(mem)
        self.request = Request(inputs=self._in_args, outputs=self._out_args, pools=pools)

    def input_view(self, k: int) -> np.ndarray:
        """The bytes of input ``k`` in the layout's memory (uint8, writable)."""
        n = self.inputs[k].size
        off = self._in_offsets[k]
        assert self.input_memory is not None and _own(self.inputs[k])
        return self.input_memory.mapped()[off:off + n]

    def output_view(self, k: int, n: int | None = None) -> np.ndarray:
        """The first ``n`` bytes (default all) of output ``k``'s buffer; LayoutError when the
        buffer holds fewer."""
        have = self.out_sizes[k]
        n = have if n is None else int(n)
        if n > have or n < 0:
            raise LayoutError(f"output {k} needs {n} bytes, its buffer has {have}")
        assert self.output_memory is not None and _own(self.outputs[k])
        off = self._out_offsets[k]
        return self.output_memory.mapped()[off:off + n]

    def read_output(self, k: int, dtype: Any, shape: Sequence[int]) -> np.ndarray:
        """A copy of output ``k`` as ``dtype`` of ``shape`` (bool read as non-zero bytes)."""
        dt = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        count = 1
        for d in shape:
            count *= d
        raw = self.output_view(k, count * dt.itemsize)
        arr = raw != 0 if dt == np.bool_ else raw.view(dt)
        return arr.reshape(shape).copy()

    def grow(self, needs: Sequence[int | None]) -> bool:
        """Make each output at least ``needs[k]`` bytes (None: unchanged); whether any grew.
        LayoutError past ``max_output_bytes`` or when memory cannot be had."""
        sizes = list(self.out_sizes)
        grown = False
        for k, need in enumerate(needs[:len(sizes)]):
            if need is not None and _own(self.outputs[k]) and int(need) > sizes[k]:
                sizes[k] = int(need)
                grown = True
        if grown:
            self._lay_outputs(sizes)
        return grown

    def close(self) -> None:
        """Give the layout's memories back (the caller's pools are the caller's)."""
        self._release(self.input_memory)
        self._release(self.output_memory)
        self.input_memory = self.output_memory = None


def _own(s: ArgSlot) -> bool:
    return not s.omitted and s.pool is None
