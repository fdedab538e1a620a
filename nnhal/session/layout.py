"""One Request laid out in shared memory for a given set of input shapes, reused across runs.

Inputs live in pool 0 and outputs in pool 1, each argument at an aligned offset. Inputs are
written straight into typed views of the mapped pool (one copy) and outputs are read as one
copy out of it. Output buffers start at their known size (or the size an earlier run needed)
and grow when the driver reports OUTPUT_INSUFFICIENT_SIZE, up to :data:`MAX_FEED_BYTES`
each. Every failure to get or use the memory (the pool's own errors, the system's) is one
:class:`LayoutError`, which the Session reports as an ExecutionError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nnhal.errors import one_line
from nnhal.hal.types import DataLocation, OutputShape, Request, RequestArgument
from nnhal.memory import MemoryError_, SharedMemory
from nnhal.session.info import MAX_FEED_BYTES, TensorInfo

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def nbytes(info: TensorInfo, shape: Sequence[int]) -> int:
    return int(math.prod(shape)) * info.dtype.itemsize


class LayoutError(Exception):
    """The request memory could not be made, grown or read (one line)."""


def _memory(size: int, what: str) -> tuple[SharedMemory, np.ndarray]:
    """Shared memory of ``size`` bytes, mapped; LayoutError for any failure."""
    mem = None
    try:
        mem = SharedMemory.ashmem(size)
        return mem, mem.mapped()
    except (OSError, MemoryError, MemoryError_, ValueError, OverflowError) as e:
        if mem is not None:
            mem.close()
        raise LayoutError(f"cannot allocate {size} bytes of {what} memory: {one_line(e)}") \
            from None


class RequestLayout:
    """Shared memory and a Request for inputs of ``shapes``; ``out_sizes`` bytes per output."""

    def __init__(self, inputs: Sequence[TensorInfo], shapes: Sequence[tuple[int, ...]],
                 outputs: Sequence[TensorInfo], out_sizes: Sequence[int]):
        self.key = tuple(shapes)
        self.outputs = list(outputs)
        offsets, size = [], 0
        for info, shape in zip(inputs, shapes):
            offsets.append(size)
            size = _align(size + nbytes(info, shape))
        self.output_memory: SharedMemory | None = None
        self.input_memory, pool = _memory(max(size, ALIGN), "input")
        self._views = []
        args = []
        for info, shape, off in zip(inputs, shapes, offsets):
            n = nbytes(info, shape)
            self._views.append(pool[off:off + n].view(info.dtype).reshape(shape))
            # Dimensions go in the request only where the model leaves some unknown.
            dims = [] if info.fully_known else list(shape)
            args.append(RequestArgument(False, DataLocation(0, off, n), dims))
        self._input_args = args
        self.out_sizes: list[int] = []
        self.request = Request([], [], [])
        try:
            self._lay_outputs(out_sizes)
        except LayoutError:
            self.input_memory.close()
            raise

    def _lay_outputs(self, sizes: Sequence[int]) -> None:
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total = _align(total + n)
        if total > MAX_FEED_BYTES:
            raise LayoutError(f"the outputs would need {total} bytes, more than the "
                              f"{MAX_FEED_BYTES} a run may hold")
        if self.output_memory is not None:
            self.output_memory.close()
            self.output_memory = None
        self.output_memory, self._out_pool = _memory(max(total, ALIGN), "output")
        self._out_offsets = offsets
        self.out_sizes = [int(n) for n in sizes]
        self.request = Request(
            inputs=self._input_args,
            outputs=[RequestArgument(False, DataLocation(1, off, n), [])
                     for off, n in zip(offsets, sizes)],
            pools=[self.input_memory, self.output_memory])

    def write(self, arrays: Sequence[np.ndarray]) -> None:
        for view, arr in zip(self._views, arrays):
            np.copyto(view, arr, casting="no")

    def grow(self, shapes: Sequence[OutputShape]) -> None:
        """Make every output at least as large as the driver says it needs."""
        try:
            need = [max(have, nbytes(info, [int(d) for d in s.dimensions]))
                    for have, info, s in zip(self.out_sizes, self.outputs, shapes)]
        except Exception as e:  # noqa: BLE001 - a driver's answer of the wrong kind
            raise LayoutError(f"the driver reported unreadable output shapes: "
                              f"{one_line(e)}") from None
        self._lay_outputs(need)

    def read(self, k: int, shape: Sequence[int]) -> np.ndarray:
        info = self.outputs[k]
        off, n = self._out_offsets[k], nbytes(info, shape)
        if n > self.out_sizes[k]:
            raise LayoutError(f"the driver reported shape {tuple(shape)} for output "
                              f"'{info.name}': {n} bytes, its buffer has {self.out_sizes[k]}")
        return self._out_pool[off:off + n].view(info.dtype).reshape(tuple(shape)).copy()

    def close(self) -> None:
        self.input_memory.close()
        if self.output_memory is not None:
            self.output_memory.close()
