"""Run one operation directly through its resolver entry: for operation unit tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.hal.types import LOOP_TIMEOUT_DEFAULT_NS, OperandLifeTime, OperandType, OperationType
from nnhal.ops.catalog import check_operation, lookup
from nnhal.ops.resolver import OpContext, OperandInfo


def tensor(t: OperandType, value: Any, scale: float = 0.0, zero_point: int = 0, *,
           shape: Sequence[int] | None = None, const: bool = False,
           channel_scales: Sequence[float] | None = None, channel_dim: int = 0
           ) -> tuple[OperandInfo, np.ndarray]:
    """An operand and its value. Scalars are given as Python numbers with a scalar type."""
    arr = np.asarray(value, dtype=t.dtype)
    if shape is not None:
        arr = arr.reshape(shape)
    info = OperandInfo(
        type=t, shape=tuple(arr.shape), scale=scale, zero_point=zero_point,
        channel_scales=None if channel_scales is None else np.asarray(channel_scales, np.float32),
        channel_dim=channel_dim,
        lifetime=OperandLifeTime.CONSTANT_COPY if const or t.is_scalar
        else OperandLifeTime.SUBGRAPH_INPUT,
        value=arr if (const or t.is_scalar) else None)
    return info, arr


def omitted(t: OperandType) -> tuple[OperandInfo, None]:
    return OperandInfo(type=t, shape=None, lifetime=OperandLifeTime.NO_VALUE), None


def output(t: OperandType, shape: Sequence[int] | None = None, scale: float = 0.0,
           zero_point: int = 0) -> OperandInfo:
    return OperandInfo(type=t, shape=None if shape is None else tuple(shape), scale=scale,
                       zero_point=zero_point, lifetime=OperandLifeTime.SUBGRAPH_OUTPUT)


class _Rt:
    loop_timeout_ns = LOOP_TIMEOUT_DEFAULT_NS

    def check_deadline(self) -> None:
        return None


def run_op(op: OperationType, inputs: Sequence[tuple[OperandInfo, Any]],
           outputs: Sequence[OperandInfo], relaxed: bool = False) -> list[np.ndarray]:
    """Validate, bind and run one operation; raises OpError like the executor sees it."""
    definition = lookup(op)
    if definition is None:
        raise KeyError(f"{op.name} is not registered")
    ctx = OpContext(op_type=op, inputs=[i for i, _ in inputs], outputs=list(outputs),
                    relaxed=relaxed)
    check_operation(definition, ctx)
    kernel = definition.kernel(ctx)
    return kernel([v for _, v in inputs], _Rt())
