"""Request validation against the prepared model's main subgraph."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nnhal.hal.types import (
    LOOP_TIMEOUT_MAXIMUM_NS,
    DataLocation,
    MeasureTiming,
    Request,
    RequestArgument,
    Subgraph,
    operand_type,
)
from nnhal.validation.model import ValidationError

#: A pool that is a driver-managed buffer (memory-domain token) has no byte size here.
BUFFER_POOL = -1


def _fail(msg: str) -> ValidationError:
    return ValidationError(msg)


def _merge_dims(where: str, model_dims: Sequence[int], arg_dims: Sequence[int],
                is_tensor: bool) -> list[int]:
    if not is_tensor:
        if arg_dims:
            raise _fail(f"{where}: a scalar takes no dimensions")
        return []
    if not arg_dims:
        return list(model_dims)
    if any((not isinstance(d, (int, np.integer))) or d < 0 for d in arg_dims):
        raise _fail(f"{where}: invalid dimensions {list(arg_dims)}")
    if model_dims and len(model_dims) != len(arg_dims):
        raise _fail(f"{where}: rank {len(arg_dims)} differs from the model's "
                    f"{len(model_dims)}")
    for m, a in zip(model_dims, arg_dims):
        if m and a != m:
            raise _fail(f"{where}: dimensions {list(arg_dims)} disagree with the model's "
                        f"{list(model_dims)}")
    return [int(d) for d in arg_dims]


def validate_request(request: Request, main: Subgraph, pool_sizes: Sequence[int],
                     *, require_output_dims: bool = False) -> None:
    """Argument counts, dimensions and locations; ``pool_sizes[i]`` is BUFFER_POOL for tokens.

    ``require_output_dims`` is set for fenced executions, whose outputs must be fully specified.
    """
    if len(request.inputs) != len(main.input_indexes):
        raise _fail(f"request has {len(request.inputs)} inputs, model has "
                    f"{len(main.input_indexes)}")
    if len(request.outputs) != len(main.output_indexes):
        raise _fail(f"request has {len(request.outputs)} outputs, model has "
                    f"{len(main.output_indexes)}")
    used = [False] * len(pool_sizes)
    for kind, args, indexes in (("input", request.inputs, main.input_indexes),
                                ("output", request.outputs, main.output_indexes)):
        for k, (arg, idx) in enumerate(zip(args, indexes)):
            where = f"request {kind} {k}"
            if not isinstance(arg, RequestArgument):
                raise _fail(f"{where}: not a RequestArgument")
            op = main.operands[idx]
            t = operand_type(op.type)
            if arg.has_no_value:
                if arg.location != DataLocation(0, 0, 0) or arg.dimensions:
                    raise _fail(f"{where}: an omitted argument must have no location or "
                                f"dimensions")
                if kind == "output":
                    raise _fail(f"{where}: outputs cannot be omitted")
                continue
            dims = _merge_dims(where, op.dimensions, arg.dimensions, t.is_tensor)
            loc = arg.location
            if not 0 <= loc.pool_index < len(pool_sizes):
                raise _fail(f"{where}: pool index {loc.pool_index} out of range")
            used[loc.pool_index] = True
            size = pool_sizes[loc.pool_index]
            if size == BUFFER_POOL:
                if loc.offset != 0 or loc.length != 0:
                    raise _fail(f"{where}: a driver-managed buffer takes offset 0 and length 0")
                if kind == "output" and require_output_dims and t.is_tensor and \
                        (not dims or 0 in dims):
                    raise _fail(f"{where}: fenced execution needs fully specified outputs")
                continue
            if loc.offset < 0 or loc.length < 0 or loc.offset + loc.length > size:
                raise _fail(f"{where}: location [{loc.offset}, {loc.offset + loc.length}) "
                            f"beyond pool {loc.pool_index} of {size} bytes")
            known = t.is_scalar or (dims and 0 not in dims)
            if kind == "input":
                if not known:
                    raise _fail(f"{where}: input dimensions {dims} are not fully specified")
                need = t.byte_size * int(math.prod(dims))  # math.prod([]) == 1
                if loc.length < need:
                    raise _fail(f"{where}: location length {loc.length} is smaller than the "
                                f"{need} bytes of the input")
            elif require_output_dims and not known:
                raise _fail(f"{where}: fenced execution needs fully specified outputs")


def validate_loop_timeout(loop_timeout_ns: int | None) -> None:
    if loop_timeout_ns is not None and not 0 <= loop_timeout_ns <= LOOP_TIMEOUT_MAXIMUM_NS:
        raise _fail(f"loop timeout {loop_timeout_ns} ns is outside [0, "
                    f"{LOOP_TIMEOUT_MAXIMUM_NS}]")


def validate_measure(measure: int) -> None:
    try:
        MeasureTiming(measure)
    except ValueError:
        raise _fail(f"invalid MeasureTiming {measure}") from None
