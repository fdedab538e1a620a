"""Boolean logic and selection: LOGICAL_AND, LOGICAL_OR, LOGICAL_NOT, SELECT."""

from __future__ import annotations

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.elementwise import (
    BroadcastBinary,
    check_output_shape,
    check_quant_scales,
    requantize_table,
    shapes_compatible,
    table_lookup,
)
from nnhal.ops.resolver import OpContext, OperationDef, OpError, Shape, register
from nnhal.ops.signature import V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

_B8 = T.TENSOR_BOOL8
_LOGICAL = variants(V1_2, {})

SIGNATURES = [
    *(sig(op, [Slot("input0", _B8), Slot("input1", _B8, doc="broadcast against input0")],
          [Slot("output", _B8)], _LOGICAL) for op in (O.LOGICAL_AND, O.LOGICAL_OR)),
    sig(O.LOGICAL_NOT, [Slot("input", _B8)], [Slot("output", _B8)], _LOGICAL),
    sig(O.SELECT, [Slot("condition", _B8, doc="true: take input1"),
                   Slot("input1", "T", doc="the condition's shape"),
                   Slot("input2", "T", doc="the condition's shape; quantization may differ")],
        [Slot("output", "T", doc="quantization may differ")],
        [*variants(V1_2, *({"T": t} for t in (T.TENSOR_FLOAT16, T.TENSOR_FLOAT32,
                                              T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM))),
         *variants(V1_3, {"T": T.TENSOR_QUANT8_ASYMM_SIGNED})]),
]


class _LogicalBinary(BroadcastBinary):
    def kernel(self, ctx: OpContext):
        fn = np.logical_and if self.op_type == O.LOGICAL_AND else np.logical_or
        return lambda ins, rt: [fn(ins[0], ins[1])]


register(O.LOGICAL_AND)(type("_LogicalAnd", (_LogicalBinary,), {}))
register(O.LOGICAL_OR)(type("_LogicalOr", (_LogicalBinary,), {}))


@register(O.LOGICAL_NOT)
class _LogicalNot(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        check_output_shape(ctx, ctx.inputs[0].shape)

    def prepare(self, ctx: OpContext) -> list[Shape]:
        return [ctx.inputs[0].shape]

    def kernel(self, ctx: OpContext):
        return lambda ins, rt: [np.logical_not(ins[0])]


@register(O.SELECT)
class _Select(OperationDef):
    """out = cond ? x : y over three tensors of one shape (no broadcasting)."""

    def validate(self, ctx: OpContext) -> None:
        check_quant_scales(ctx)
        shapes = [info.shape for info in ctx.inputs]
        for i, j in ((0, 1), (1, 2), (0, 2)):
            ctx.require(shapes_compatible(shapes[i], shapes[j]),
                        f"inputs {i} and {j} must have the same shape")
        check_output_shape(ctx, self._shape(ctx))

    @staticmethod
    def _shape(ctx: OpContext) -> Shape:
        known = [info.shape for info in ctx.inputs if info.shape is not None]
        if not known:
            return None
        return tuple(max(dims) for dims in zip(*known))

    def prepare(self, ctx: OpContext) -> list[Shape]:
        return [self._shape(ctx)]

    def kernel(self, ctx: OpContext):
        a, b, out = ctx.inputs[1], ctx.inputs[2], ctx.outputs[0]
        dt = out.type.dtype
        convert = None
        if a.type in C.QUANT8_TYPES:
            qmin = C.qrange(a.type)[0]
            ta, tb = requantize_table(a, out), requantize_table(b, out)

            def convert(x, y):
                return table_lookup(ta, x, qmin), table_lookup(tb, y, qmin)

        def run(ins, rt):
            cond, x, y = ins
            if not (np.shape(cond) == np.shape(x) == np.shape(y)):
                raise OpError(f"SELECT: shapes {np.shape(cond)}, {np.shape(x)} and "
                              f"{np.shape(y)} differ")
            if convert is not None:
                x, y = convert(x, y)
            return [np.where(cond, x, y).astype(dt, copy=False)]

        return run
