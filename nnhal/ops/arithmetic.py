"""Broadcasting binary arithmetic: ADD, SUB, MUL, DIV (with fused activations)."""

from __future__ import annotations

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.conv_engine import scratch
from nnhal.ops.resolver import OpContext, OperationDef, Shape, register
from nnhal.ops.signature import V1_0, V1_1, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

_INPUTS = [Slot("input0", "T"), Slot("input1", "T", doc="broadcast against input0"),
           Slot("activation", T.INT32, doc="fused activation (FuseCode)")]
_OUTPUTS = [Slot("output", "T")]
_F32, _F16, _I32 = {"T": T.TENSOR_FLOAT32}, {"T": T.TENSOR_FLOAT16}, {"T": T.TENSOR_INT32}
_Q8, _Q8S = {"T": T.TENSOR_QUANT8_ASYMM}, {"T": T.TENSOR_QUANT8_ASYMM_SIGNED}

SIGNATURES = [
    sig(O.ADD, _INPUTS, _OUTPUTS, [*variants(V1_0, _F32, _Q8), *variants(V1_2, _F16),
                                   *variants(V1_3, _Q8S, _I32)]),
    sig(O.MUL, _INPUTS, _OUTPUTS, [*variants(V1_0, _F32, _Q8), *variants(V1_2, _F16),
                                   *variants(V1_3, _Q8S, _I32)]),
    sig(O.SUB, _INPUTS, _OUTPUTS, [*variants(V1_1, _F32), *variants(V1_2, _F16, _Q8),
                                   *variants(V1_3, _Q8S, _I32)]),
    sig(O.DIV, _INPUTS, _OUTPUTS, [*variants(V1_1, _F32), *variants(V1_2, _F16),
                                   *variants(V1_3, _I32)]),
]


class _Binary(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        self._validated(ctx)

    def validate_and_prepare(self, ctx: OpContext) -> list[Shape]:
        return [self._validated(ctx)]  # validate infers what prepare would

    def _validated(self, ctx: OpContext) -> Shape:
        """Every rule checked; the broadcast output shape (prepare's)."""
        t = ctx.inputs[0].type
        for i in (0, 1):
            shape = ctx.inputs[i].shape
            if shape is not None and len(shape) > 4:  # the message worded only when needed
                raise ctx.fail(f"input {i} rank must be at most 4")
        C.check_activation(ctx, 2)
        if t == T.TENSOR_INT32:
            act = ctx.const(2)
            ctx.require(act is None or int(act) == 0, "INT32 tensors take no fused activation")
        return C.broadcast_shapes(ctx.inputs[0].shape, ctx.inputs[1].shape)

    def prepare(self, ctx: OpContext):
        return [C.broadcast_shapes(ctx.inputs[0].shape, ctx.inputs[1].shape)]

    def kernel(self, ctx: OpContext):
        t = ctx.inputs[0].type
        op = self.op_type
        if t in C.FLOAT_TYPES:
            fn = {O.ADD: np.add, O.SUB: np.subtract, O.MUL: np.multiply, O.DIV: np.divide}[op]
            dt = t.dtype

            def run(ins, rt):
                code = C.activation_code(ins[2])
                with np.errstate(all="ignore"):
                    r = fn(ins[0].astype(np.float32), ins[1].astype(np.float32))
                return [C.apply_float_activation(r, code).astype(dt, copy=False)]

            return run
        if t == T.TENSOR_INT32:
            def run_int(ins, rt):
                x = ins[0].astype(np.int64)
                y = ins[1].astype(np.int64)
                if op == O.ADD:
                    r = x + y
                elif op == O.SUB:
                    r = x - y
                elif op == O.MUL:
                    r = x * y
                else:
                    # Upstream defines integer division by zero as 0 rather than failing.
                    zero = y == 0
                    r = np.where(zero, 0, np.floor_divide(x, np.where(zero, 1, y)))
                return [r.astype(np.int32)]

            return run_int
        if op == O.MUL:
            return self._quant_mul(ctx)
        return self._quant_add(ctx, subtract=(op == O.SUB))

    def kernel_into(self, ctx: OpContext):
        """float32: the operation and its fused activation in place in the output; 8-bit
        quantized ADD, SUB and MUL: one lookup in a table of every pair of input values."""
        t = ctx.inputs[0].type
        if t in C.QUANT8_TYPES and self.op_type != O.DIV:
            return self._quant_table_into(ctx)
        if t != T.TENSOR_FLOAT32:
            return None
        fn = {O.ADD: np.add, O.SUB: np.subtract, O.MUL: np.multiply,
              O.DIV: np.divide}[self.op_type]

        def run_into(ins, outs, rt) -> None:
            code = C.activation_code(ins[2])
            out = outs[0]
            with np.errstate(all="ignore"):
                fn(ins[0], ins[1], out=out)
            C.activation_into(out, code)

        return run_into

    def _quant_table_into(self, ctx: OpContext):
        """The quantized result depends only on the pair of 8-bit inputs: the reference
        arithmetic (see :meth:`_quant_add` / :meth:`_quant_mul`) is run once on all 65536
        pairs per fused activation, then each execution is an index build and a take."""
        op = self.op_type
        ref = self._quant_mul(ctx) if op == O.MUL else self._quant_add(ctx, op == O.SUB)
        a, b = ctx.inputs[0], ctx.inputs[1]
        grid = np.arange(256, dtype=np.uint8)
        va = grid.view(a.type.dtype)[:, None]
        vb = grid.view(b.type.dtype)[None, :]
        tables: dict[int, np.ndarray] = {}

        def run_into(ins, outs, rt) -> None:
            code = C.activation_code(ins[2])
            table = tables.get(code)
            if table is None:
                table = ref([va, vb, np.int32(code)], rt)[0].reshape(-1)
                tables[code] = table
            out = outs[0]
            idx = scratch("qtable", out.shape, np.uint16)
            np.left_shift(ins[0].view(np.uint8), np.uint16(8), out=idx)
            np.bitwise_or(idx, ins[1].view(np.uint8), out=idx)
            np.take(table, idx, out=out, mode="clip")

        return run_into

    @staticmethod
    def _quant_add(ctx: OpContext, subtract: bool):
        a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        left_shift = 20
        twice_max = 2.0 * max(a.scale, b.scale)
        m1, s1 = C.quantize_multiplier(a.scale / twice_max)
        m2, s2 = C.quantize_multiplier(b.scale / twice_max)
        mo, so = C.quantize_multiplier(twice_max / ((1 << left_shift) * out.scale))
        if subtract:
            m2 = -m2
        za, zb, zo = a.zero_point, b.zero_point, out.zero_point

        def run(ins, rt):
            lo, hi = C.quant_activation_range(C.activation_code(ins[2]), out.scale, zo, out.type)
            x = (ins[0].astype(np.int64) - za) << left_shift
            y = (ins[1].astype(np.int64) - zb) << left_shift
            sx = C.multiply_by_quantized_multiplier(x, m1, s1)
            sy = C.multiply_by_quantized_multiplier(y, m2, s2)
            r = C.multiply_by_quantized_multiplier(sx + sy, mo, so) + zo
            return [np.clip(r, lo, hi).astype(out.type.dtype)]

        return run

    @staticmethod
    def _quant_mul(ctx: OpContext):
        a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        m, s = C.quantize_multiplier(a.scale * b.scale / out.scale)
        za, zb, zo = a.zero_point, b.zero_point, out.zero_point

        def run(ins, rt):
            lo, hi = C.quant_activation_range(C.activation_code(ins[2]), out.scale, zo, out.type)
            prod = (ins[0].astype(np.int64) - za) * (ins[1].astype(np.int64) - zb)
            r = C.multiply_by_quantized_multiplier(prod, m, s) + zo
            return [np.clip(r, lo, hi).astype(out.type.dtype)]

        return run


for _op in (O.ADD, O.SUB, O.MUL, O.DIV):
    register(_op)(type(f"_{_op.name.title()}", (_Binary,), {}))
