"""Running a validated request against a prepared plan: read inputs, run, write outputs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nnhal.executor.plan import ExecutionError, ModelPlan, RunState
from nnhal.hal.request_pool import RequestPool
from nnhal.hal.types import ErrorStatus, OperandType, OutputShape, Request

_BOOLS = (OperandType.BOOL, OperandType.TENSOR_BOOL8)


def read_argument(raw: np.ndarray, t: OperandType, shape: tuple[int, ...]) -> np.ndarray:
    """Decode an input from pool bytes: a read-only view where the layout allows."""
    count = int(math.prod(shape))  # math.prod: no numpy reduction on the hot path
    nbytes = count * t.byte_size
    data = raw[:nbytes]
    arr = (data != 0) if t in _BOOLS else data.view(t.dtype)
    arr = arr.reshape(shape)
    arr.flags.writeable = False
    return arr


def encode(arr: np.ndarray) -> np.ndarray:
    """An output array as the bytes the HAL stores (booleans as one byte each)."""
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def input_shape(model_dims: Sequence[int], request_dims: Sequence[int]) -> tuple[int, ...]:
    if not request_dims:
        return tuple(model_dims)
    return tuple(int(d) for d in request_dims)


def run_request(plan: ModelPlan, request: Request, pools: Sequence[RequestPool],
                rt: RunState) -> tuple[ErrorStatus, list[OutputShape]]:
    """Execute; ``pools`` are uint8 arrays or driver buffers (RequestBuffer)."""
    main = plan.main
    inputs: list[np.ndarray | None] = []
    for arg, idx in zip(request.inputs, main.input_indexes):
        if arg.has_no_value:
            if idx in plan.required_inputs:
                raise ExecutionError(ErrorStatus.INVALID_ARGUMENT, f"input operand {idx} "
                                     "is required but has no value")
            inputs.append(None)
            continue
        info = main.infos[idx]
        pool = pools[arg.location.pool_index]
        shape = input_shape(info.shape or (), arg.dimensions) if info.type.is_tensor else ()
        if isinstance(pool, np.ndarray):
            raw = pool[arg.location.offset:arg.location.offset + arg.location.length]
            inputs.append(read_argument(raw, info.type, shape))
        else:
            inputs.append(pool.read_input(info, shape))
    outs = plan.run(inputs, rt)
    shapes: list[OutputShape] = []
    sufficient = True
    for arg, out in zip(request.outputs, outs):
        pool = pools[arg.location.pool_index] if not arg.has_no_value else None
        if isinstance(pool, np.ndarray):
            ok = encode(out).size <= arg.location.length
        elif pool is None:
            ok = True
        else:
            ok = pool.can_hold(out)
        sufficient &= ok
        shapes.append(OutputShape(dimensions=list(out.shape), is_sufficient=ok))
    if not sufficient:
        return ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, shapes
    for arg, out in zip(request.outputs, outs):
        if arg.has_no_value:
            continue
        pool = pools[arg.location.pool_index]
        if isinstance(pool, np.ndarray):
            data = encode(out)
            pool[arg.location.offset:arg.location.offset + data.size] = data
        else:
            pool.write_output(out)
    return ErrorStatus.NONE, shapes
