"""Element-wise math: ABS, EXP, LOG, NEG, RSQRT, SIN, SQRT, FLOOR, POW, MAXIMUM, MINIMUM.

Float16 tensors are computed in float32 and rounded once, as the reference driver does.
Quantized RSQRT (feature level 7) is the NNAPI CPU executor's: the stored value dequantized
in float32, ``1 / sqrt`` in float32, divided by the output scale, rounded half away from zero,
the zero point added and the result saturated; a zero or negative real input (infinity or
NaN) saturates to the largest stored value. An 8-bit input has 256 values, so prepare builds
the table and execution looks it up.
Quantized MAXIMUM/MINIMUM requantise each input to the output's scale and zero point first,
through a 256-entry table built at prepare time (an 8-bit input has only 256 values).

The shape helpers here are shared by the other element-wise families (activations,
comparisons, logical, casts).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.resolver import OpContext, OperandInfo, OperationDef, Shape, register
from nnhal.ops.signature import V1_0, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

INT_OR_FLOAT = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32)

_F32, _F16, _I32 = {"T": T.TENSOR_FLOAT32}, {"T": T.TENSOR_FLOAT16}, {"T": T.TENSOR_INT32}
_Q8, _Q8S = {"T": T.TENSOR_QUANT8_ASYMM}, {"T": T.TENSOR_QUANT8_ASYMM_SIGNED}
_UNARY_IN, _OUT = [Slot("input", "T")], [Slot("output", "T", doc="the input's shape")]
_FLOATS_1_2 = variants(V1_2, _F16, _F32)
_BINARY_IN = [Slot("input0", "T"), Slot("input1", "T", doc="broadcast against input0")]

SIGNATURES = [
    *(sig(op, _UNARY_IN, _OUT, _FLOATS_1_2) for op in (O.EXP, O.LOG, O.SIN, O.SQRT)),
    sig(O.RSQRT, _UNARY_IN,
        [Slot("output", "T", doc="the input's shape; quantized: scale and zero point may "
                                 "differ")],
        [*_FLOATS_1_2, *variants(FeatureLevel.AIDL_V3, _Q8, _Q8S)]),
    sig(O.ABS, _UNARY_IN, _OUT, [*_FLOATS_1_2, *variants(V1_3, _I32)]),
    sig(O.NEG, _UNARY_IN, _OUT, variants(V1_2, _F16, _F32, _I32)),
    sig(O.FLOOR, _UNARY_IN, _OUT, [*variants(V1_0, _F32), *variants(V1_2, _F16)]),
    sig(O.POW, [Slot("base", "T"), Slot("exponent", "T", doc="broadcast against base")], _OUT,
        _FLOATS_1_2),
    *(sig(op, _BINARY_IN, [Slot("output", "T", doc="scale and zero point may differ")],
          [*variants(V1_2, _F16, _F32, _I32, _Q8), *variants(V1_3, _Q8S)])
      for op in (O.MAXIMUM, O.MINIMUM)),
]


# ---- shared validation and shape helpers ------------------------------------------------------

def shapes_compatible(a: Shape, b: Shape) -> bool:
    """Whether two shapes may describe the same tensor (0 and None mean unknown)."""
    if a is None or b is None:
        return True
    if len(a) != len(b):
        return False
    return all(x == 0 or y == 0 or x == y for x, y in zip(a, b))


def check_output_shape(ctx: OpContext, shape: Shape, index: int = 0) -> None:
    """Reject a model whose declared output shape contradicts the inferred one."""
    declared = ctx.outputs[index].shape
    if not shapes_compatible(declared, shape):  # the message worded only when needed
        raise ctx.fail(f"output {index} shape {declared} does not match the expected {shape}")


SCALED_TYPES = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM,
                T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM)


def check_quant_scales(ctx: OpContext) -> None:
    """Quantized operands have a positive finite scale and a representable zero point."""
    for info in (*ctx.inputs, *ctx.outputs):
        if info.type in SCALED_TYPES:
            ctx.require(math.isfinite(info.scale) and info.scale > 0,
                        f"{info.type.name} operand needs a positive scale")
            lo, hi = C.qrange(info.type)
            if info.type in (T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT16_SYMM):
                lo = hi = 0
            ctx.require(lo <= info.zero_point <= hi,
                        f"{info.type.name} operand has zero point {info.zero_point}")


def check_same_quant(ctx: OpContext, a: OperandInfo, b: OperandInfo, what: str) -> None:
    ctx.require(np.float32(a.scale) == np.float32(b.scale) and a.zero_point == b.zero_point,
                f"{what}: scale and zero point must match")


def float_unary(fn: Callable[[np.ndarray], np.ndarray], dtype: np.dtype):
    """A kernel applying ``fn`` in float32 and storing the result as ``dtype``."""

    def run(ins, rt):
        with np.errstate(all="ignore"):
            r = fn(np.asarray(ins[0], dtype=np.float32))
        return [np.asarray(r, dtype=np.float32).astype(dtype, copy=False)]

    return run


def requantize_table(src: OperandInfo, dst: OperandInfo) -> np.ndarray:
    """Requantised value of every stored value of ``src`` in ``dst``'s parameters.

    Matches the reference: the real value is formed in float32, divided in double, clamped
    and rounded half away from zero. Index the table with ``value - qmin``.
    """
    qmin, qmax = C.qrange(src.type)
    q = np.arange(qmin, qmax + 1, dtype=np.int32)
    with np.errstate(all="ignore"):
        real = ((q - np.int32(src.zero_point)).astype(np.float32) * np.float32(src.scale))
        ret = real.astype(np.float64) / float(np.float32(dst.scale)) + dst.zero_point
    dmin, dmax = C.qrange(dst.type)
    out = np.clip(C.round_half_away(np.clip(ret, dmin - 1, dmax + 1)), dmin, dmax)
    return out.astype(dst.type.dtype)


def table_lookup(table: np.ndarray, x: np.ndarray, qmin: int) -> np.ndarray:
    return table[np.asarray(x).astype(np.intp) - qmin]


# ---- unary operations -------------------------------------------------------------------------

def _rsqrt(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / np.sqrt(x)


_UNARY_FLOAT: dict[OperationType, Callable[[np.ndarray], np.ndarray]] = {
    O.EXP: np.exp, O.LOG: np.log, O.RSQRT: _rsqrt, O.SIN: np.sin, O.SQRT: np.sqrt,
    O.FLOOR: np.floor, O.ABS: np.abs, O.NEG: np.negative,
}


def rsqrt_table(src: OperandInfo, dst: OperandInfo) -> np.ndarray:
    """Quantized RSQRT of every stored value of ``src`` (index with ``value - qmin``)."""
    qmin, qmax = C.qrange(src.type)
    q = np.arange(qmin, qmax + 1, dtype=np.int32)
    f32 = np.float32
    with np.errstate(all="ignore"):
        real = (q - np.int32(src.zero_point)).astype(f32) * f32(src.scale)
        r = f32(1.0) / np.sqrt(real)
        # std::round is exact; rounded in float64 so that no float32 sum rounds first.
        steps = (r / f32(dst.scale)).astype(np.float64)
        v = f32(dst.zero_point) + C.round_half_away(steps).astype(f32)
    dmin, dmax = C.qrange(dst.type)
    # NaN (a negative input) compares false, and the reference's min(max, v) keeps max.
    v = np.where(np.isnan(v), f32(dmax), v)
    return np.clip(v, dmin, dmax).astype(dst.type.dtype)


class _Unary(OperationDef):
    max_rank: int | None = None

    def validate(self, ctx: OpContext) -> None:
        if ctx.inputs[0].type in C.QUANT8_TYPES:
            check_quant_scales(ctx)
        r = ctx.inputs[0].rank
        if self.max_rank is not None and r is not None and r > self.max_rank:
            raise ctx.fail(f"input 0 rank must be at most {self.max_rank}")
        check_output_shape(ctx, ctx.inputs[0].shape)

    def prepare(self, ctx: OpContext) -> list[Shape]:
        return [ctx.inputs[0].shape]

    def kernel(self, ctx: OpContext):
        t = ctx.inputs[0].type
        if t in C.QUANT8_TYPES:  # RSQRT, the only quantized unary operation here
            table, qmin = rsqrt_table(ctx.inputs[0], ctx.outputs[0]), C.qrange(t)[0]
            return lambda ins, rt: [table_lookup(table, ins[0], qmin)]
        if t == T.TENSOR_INT32:
            if self.op_type == O.ABS:
                return lambda ins, rt: [np.abs(ins[0]).astype(np.int32, copy=False)]
            return lambda ins, rt: [np.negative(ins[0]).astype(np.int32, copy=False)]
        return float_unary(_UNARY_FLOAT[self.op_type], t.dtype)


for _op in (O.ABS, O.EXP, O.LOG, O.NEG, O.RSQRT, O.SIN, O.SQRT):
    register(_op)(type(f"_{_op.name.title()}", (_Unary,), {}))


@register(O.FLOOR)
class _Floor(_Unary):
    max_rank = 4


# ---- binary operations ------------------------------------------------------------------------

class BroadcastBinary(OperationDef):
    """Two same-typed broadcastable tensors in, one tensor out (types: the signature)."""

    def validate(self, ctx: OpContext) -> None:
        check_quant_scales(ctx)
        shape = C.broadcast_shapes(ctx.inputs[0].shape, ctx.inputs[1].shape)
        check_output_shape(ctx, shape)

    def prepare(self, ctx: OpContext) -> list[Shape]:
        return [C.broadcast_shapes(ctx.inputs[0].shape, ctx.inputs[1].shape)]


@register(O.POW)
class _Pow(BroadcastBinary):
    def kernel(self, ctx: OpContext):
        dt = ctx.outputs[0].type.dtype

        def run(ins, rt):
            with np.errstate(all="ignore"):
                r = np.power(np.asarray(ins[0], np.float32), np.asarray(ins[1], np.float32))
            return [r.astype(dt, copy=False)]

        return run


class _MinMax(BroadcastBinary):
    fn: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.maximum

    def kernel(self, ctx: OpContext):
        a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        fn = type(self).fn
        if a.type in C.QUANT8_TYPES:
            qmin = C.qrange(a.type)[0]
            ta, tb = requantize_table(a, out), requantize_table(b, out)
            return lambda ins, rt: [fn(table_lookup(ta, ins[0], qmin),
                                       table_lookup(tb, ins[1], qmin))]
        dt = out.type.dtype
        return lambda ins, rt: [fn(ins[0], ins[1]).astype(dt, copy=False)]


@register(O.MAXIMUM)
class _Maximum(_MinMax):
    fn = np.maximum


@register(O.MINIMUM)
class _Minimum(_MinMax):
    fn = np.minimum
