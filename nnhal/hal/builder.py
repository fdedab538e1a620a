"""Building HAL models and requests by hand, the way the NNAPI runtime lays them out.

Constants up to 128 bytes go into ``operandValues`` (CONSTANT_COPY); larger ones into one
shared-memory pool (CONSTANT_REFERENCE). Requests put inputs and outputs in shared memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.hal.types import (
    DataLocation,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    OperationType,
    Request,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
)
from nnhal.memory import SharedMemory

#: Constants larger than this many bytes go to a pool, as the NNAPI runtime does.
MAX_INLINE = 128


def _align(n: int, a: int = 8) -> int:
    return (n + a - 1) // a * a


class ModelBuilder:
    """Accumulates operands and operations of a main subgraph; :meth:`build` makes the Model."""

    def __init__(self, relaxed: bool = False):
        self.operands: list[Operand] = []
        self.operations: list[Operation] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.relaxed = relaxed
        self._values = bytearray()
        self._pool = bytearray()

    def operand(self, t: OperandType, dims: Sequence[int] = (), scale: float = 0.0,
                zero_point: int = 0, channel_quant: SymmPerChannelQuantParams | None = None
                ) -> int:
        self.operands.append(Operand(type=t, dimensions=list(dims), scale=scale,
                                     zero_point=zero_point, extra_params=channel_quant))
        return len(self.operands) - 1

    def input(self, t: OperandType, dims: Sequence[int] = (), scale: float = 0.0,
              zero_point: int = 0) -> int:
        i = self.operand(t, dims, scale, zero_point)
        self.operands[i].lifetime = OperandLifeTime.SUBGRAPH_INPUT
        self.inputs.append(i)
        return i

    def output(self, t: OperandType, dims: Sequence[int] = (), scale: float = 0.0,
               zero_point: int = 0) -> int:
        i = self.operand(t, dims, scale, zero_point)
        self.operands[i].lifetime = OperandLifeTime.SUBGRAPH_OUTPUT
        self.outputs.append(i)
        return i

    def constant(self, t: OperandType, value: Any, dims: Sequence[int] | None = None,
                 scale: float = 0.0, zero_point: int = 0,
                 channel_quant: SymmPerChannelQuantParams | None = None) -> int:
        arr = np.asarray(value, dtype=np.uint8 if t.dtype == np.bool_ else t.dtype)
        if dims is None:
            dims = () if t.is_scalar else arr.shape
        i = self.operand(t, dims, scale, zero_point, channel_quant)
        blob = arr.tobytes()
        op = self.operands[i]
        if len(blob) <= MAX_INLINE:
            off = _align(len(self._values))
            self._values.extend(b"\0" * (off - len(self._values)))
            self._values.extend(blob)
            op.lifetime = OperandLifeTime.CONSTANT_COPY
            op.location = DataLocation(0, off, len(blob))
        else:
            off = _align(len(self._pool))
            self._pool.extend(b"\0" * (off - len(self._pool)))
            self._pool.extend(blob)
            op.lifetime = OperandLifeTime.CONSTANT_REFERENCE
            op.location = DataLocation(0, off, len(blob))
        return i

    def scalar(self, t: OperandType, value: Any) -> int:
        return self.constant(t, value)

    def operation(self, op: OperationType, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        for i in inputs:
            self.operands[i].number_of_consumers += 1
        self.operations.append(Operation(int(op), list(inputs), list(outputs)))

    def build(self) -> Model:
        pools = [SharedMemory.from_bytes(bytes(self._pool))] if self._pool else []
        main = Subgraph(self.operands, self.operations, list(self.inputs), list(self.outputs))
        return Model(main=main, operand_values=bytes(self._values), pools=pools,
                     relax_computation_float32_to_float16=self.relaxed)


class RequestBuilder:
    """Inputs in one ashmem pool and outputs in another; read outputs back with :meth:`output`."""

    def __init__(self, inputs: Sequence[np.ndarray], output_nbytes: Sequence[int]):
        blobs = [np.ascontiguousarray(a).tobytes() for a in inputs]
        offs, size = [], 0
        for b in blobs:
            size = _align(size)
            offs.append(size)
            size += len(b)
        self.input_memory = SharedMemory.ashmem(size)
        for off, b in zip(offs, blobs):
            self.input_memory.write(off, b)
        out_offs, osize = [], 0
        for n in output_nbytes:
            osize = _align(osize)
            out_offs.append(osize)
            osize += n
        self.output_memory = SharedMemory.ashmem(osize)
        self.request = Request(
            inputs=[RequestArgument(False, DataLocation(0, o, len(b)), [])
                    for o, b in zip(offs, blobs)],
            outputs=[RequestArgument(False, DataLocation(1, o, n), [])
                     for o, n in zip(out_offs, output_nbytes)],
            pools=[self.input_memory, self.output_memory])

    def output(self, k: int, dtype: np.dtype | type, shape: Sequence[int]) -> np.ndarray:
        loc = self.request.outputs[k].location
        count = int(np.prod(shape, dtype=np.int64))
        raw = self.output_memory.view(loc.offset, count * np.dtype(dtype).itemsize)
        return raw.view(dtype).reshape(shape).copy()

    def close(self) -> None:
        self.input_memory.close()
        self.output_memory.close()
