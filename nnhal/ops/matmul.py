"""BATCH_MATMUL (AIDL v2): slices of two tensors of one rank (2 to 4) multiplied pairwise.

The leading (batch) dimensions of both inputs must be equal, one by one: the HAL asks for the
same batch size and defines no broadcasting. Either operand may be adjointed (for the real
types the HAL has, transposed). Float32 multiplies in float32, float16 in float32 rounded to
float16; TENSOR_INT32 accumulates with int32 wraparound; TENSOR_QUANT8_ASYMM_SIGNED
accumulates the zero-point-centred products exactly (in float64 through BLAS: every partial
sum stays far below 2**53), wraps the sum in int32 as the reference kernels' accumulator does,
and requantizes with the reference fixed-point multiplier ``lhs_scale * rhs_scale /
output_scale`` (:func:`nnhal.ops.common.requantize_int32_sum`), rounding half away from zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.resolver import OpContext, OperationDef, OpError, Shape, elements, register, visits
from nnhal.ops.shape import const_bool, flag
from nnhal.ops.signature import Slot, sig, variants

T = OperandType
O = OperationType

_ADJ_DOC = "true: the slices of input {} are transposed first (default false)"

SIGNATURES = [
    sig(O.BATCH_MATMUL,
        [Slot("lhs", "T", doc="rank 2 to 4: [..., r_x, c_x]"),
         Slot("rhs", "T", doc="[..., r_y, c_y]; same rank and batch dimensions as lhs"),
         Slot("adj_x", T.BOOL, optional=True, omittable=True, doc=_ADJ_DOC.format(0)),
         Slot("adj_y", T.BOOL, optional=True, omittable=True, doc=_ADJ_DOC.format(1))],
        [Slot("output", "T", doc="[..., r_o, c_o]")],
        variants(FeatureLevel.AIDL_V2, *({"T": t} for t in (
            T.TENSOR_FLOAT16, T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM_SIGNED,
            T.TENSOR_INT32)))),
]

_NAME = "BATCH_MATMUL"


def matmul_shape(lhs: Sequence[int], rhs: Sequence[int], adj_x: bool | None,
                 adj_y: bool | None, *, strict: bool = False) -> tuple[int, ...]:
    """The output shape; unless ``strict`` (run-time shapes), 0 means unknown, and an unknown
    flag (None) leaves the dimensions it decides unknown. Raises OpError on a mismatch."""
    if len(lhs) != len(rhs):
        raise OpError(f"{_NAME}: inputs have ranks {len(lhs)} and {len(rhs)}, expected equal")
    if not 2 <= len(lhs) <= 4:
        raise OpError(f"{_NAME}: inputs have rank {len(lhs)}, expected 2 to 4")
    batch = []
    for k, (a, b) in enumerate(zip(lhs[:-2], rhs[:-2])):
        if a != b and (strict or (a and b)):
            raise OpError(f"{_NAME}: batch dimension {k} differs: {a} vs {b}")
        batch.append(a or b)
    r_x, c_x = lhs[-2:]
    r_y, c_y = rhs[-2:]
    if adj_x is None or adj_y is None:
        inner_x = inner_y = 0
    else:
        inner_x = r_x if adj_x else c_x
        inner_y = c_y if adj_y else r_y
    if inner_x != inner_y and (strict or (inner_x and inner_y)):
        raise OpError(f"{_NAME}: the inner dimensions differ: {inner_x} (lhs) vs "
                      f"{inner_y} (rhs)")
    r_o = 0 if adj_x is None else (c_x if adj_x else r_x)
    c_o = 0 if adj_y is None else (r_y if adj_y else c_y)
    return (*batch, r_o, c_o)


@register(O.BATCH_MATMUL)
class BatchMatmul(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        for i in (0, 1):
            ctx.expect_rank(i, (2, 3, 4))
        lhs, rhs, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        if lhs.type == T.TENSOR_QUANT8_ASYMM_SIGNED:
            ctx.require(lhs.scale > 0 and rhs.scale > 0 and out.scale > 0,
                        "quantized operands need a positive scale")
        if out.shape is not None and lhs.rank is not None:
            ctx.require(len(out.shape) == lhs.rank,
                        f"output has rank {len(out.shape)}, expected {lhs.rank}")
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext) -> list[Shape]:
        lhs, rhs = ctx.inputs[0].shape, ctx.inputs[1].shape
        if lhs is None or rhs is None:
            known = lhs if lhs is not None else rhs
            return [None if known is None else (0,) * len(known)]
        return [matmul_shape(lhs, rhs, const_bool(ctx, 2), const_bool(ctx, 3))]

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Each output value sums one row of lhs by one column of rhs."""
        lhs = ctx.inputs[0].shape
        inner = 1
        if lhs and len(lhs) >= 2:
            inner = max(lhs[-2] if const_bool(ctx, 2) else lhs[-1], 1)
        return visits(ctx, outputs) + elements(outputs[0]) * inner

    def kernel(self, ctx: OpContext):
        core = self._core(ctx)

        def run(ins, rt):
            return [core(ins, None)]

        return run

    def kernel_into(self, ctx: OpContext):
        core = self._core(ctx)

        def run_into(ins, outs, rt) -> None:
            core(ins, outs[0])

        return run_into

    @staticmethod
    def _core(ctx: OpContext):
        """The multiplication for this type, its flags and requantization fixed at bind."""
        lhs, rhs, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        t = out.type
        adj = (const_bool(ctx, 2), const_bool(ctx, 3))
        if t == T.TENSOR_QUANT8_ASYMM_SIGNED:
            real = float(np.float32(lhs.scale)) * float(np.float32(rhs.scale)) / \
                float(np.float32(out.scale))
            multiplier, shift = C.quantize_multiplier(real)
            zx, zy, zo = lhs.zero_point, rhs.zero_point, out.zero_point
            qmin, qmax = C.qrange(t)

        def multiply(x: np.ndarray, y: np.ndarray, dst: np.ndarray | None) -> np.ndarray:
            if t == T.TENSOR_FLOAT32:
                return np.matmul(x, y) if dst is None else np.matmul(x, y, out=dst)
            if t == T.TENSOR_FLOAT16:
                return np.matmul(x.astype(np.float32), y.astype(np.float32)).astype(np.float16)
            if t == T.TENSOR_INT32:  # int64 sums wrap to the same low 32 bits as int32 ones
                return np.matmul(x.astype(np.int64), y.astype(np.int64)).astype(np.int32)
            acc = np.matmul(x.astype(np.float64) - zx, y.astype(np.float64) - zy)
            scaled = C.requantize_int32_sum(acc.astype(np.int64), multiplier, shift)
            return np.clip(scaled + zo, qmin, qmax).astype(np.int8)

        def core(ins: Sequence[Any], dst: np.ndarray | None) -> np.ndarray:
            x, y = ins[0], ins[1]
            adj_x = flag(ins, 2) if adj[0] is None else adj[0]
            adj_y = flag(ins, 3) if adj[1] is None else adj[1]
            shape = matmul_shape(x.shape, y.shape, adj_x, adj_y, strict=True)
            if dst is not None and dst.shape != shape:
                raise OpError(f"{_NAME}: output shape {dst.shape}, computed {shape}")
            if adj_x:
                x = np.swapaxes(x, -1, -2)
            if adj_y:
                y = np.swapaxes(y, -1, -2)
            result = multiply(x, y, dst)
            if dst is not None and result is not dst:
                np.copyto(dst, result)
            return result if dst is None else dst

        return core
