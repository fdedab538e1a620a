"""Type conversions: CAST, QUANTIZE, DEQUANTIZE.

CAST ignores quantization parameters and converts stored values like a C++ ``static_cast``:
float to integer truncates toward zero, and conversions to TENSOR_QUANT8_ASYMM saturate to
[0, 255] first. QUANTIZE rounds half away from zero (``std::round``) and saturates.
"""

from __future__ import annotations

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.elementwise import check_output_shape, check_quant_scales
from nnhal.ops.resolver import OpContext, OperationDef, Shape, register
from nnhal.ops.signature import V1_0, V1_2, V1_3, Slot, Variant, sig

T = OperandType
O = OperationType

#: Types that convert to one another (HAL 1.2).
CAST_NUMERIC = (T.TENSOR_FLOAT16, T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM)
#: Types that may only be "cast" to themselves (HAL 1.3).
CAST_IDENTITY = (T.TENSOR_BOOL8, T.TENSOR_INT32, T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM,
                 T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM)


# T: the input type, U: the output type.
_CAST_VARIANTS = [
    *(Variant({"T": a, "U": b}, V1_2) for a in CAST_NUMERIC for b in CAST_NUMERIC),
    *(Variant({"T": a, "U": a}, V1_3) for a in CAST_IDENTITY if a not in CAST_NUMERIC)]
_F32, _F16 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16
_QUANTIZE_VARIANTS = [Variant({"T": a, "U": b}, since)
                      for b, since in ((T.TENSOR_QUANT8_ASYMM, V1_2),
                                       (T.TENSOR_QUANT8_ASYMM_SIGNED, V1_3))
                      for a in (_F32, _F16)]
#: Each input type with the version that added it; a FLOAT16 output exists since HAL 1.2.
_DEQUANTIZE_INPUTS = ((T.TENSOR_QUANT8_ASYMM, V1_0), (T.TENSOR_QUANT8_SYMM, V1_2),
                      (T.TENSOR_QUANT8_SYMM_PER_CHANNEL, V1_2),
                      (T.TENSOR_QUANT8_ASYMM_SIGNED, V1_3))
_DEQUANTIZE_VARIANTS = [Variant({"T": a, "U": b}, max(since, b_since, key=lambda v: v.value))
                        for a, since in _DEQUANTIZE_INPUTS
                        for b, b_since in ((_F32, V1_0), (_F16, V1_2))]

SIGNATURES = [
    sig(O.CAST, [Slot("input", "T", doc="rank 1 or more")],
        [Slot("output", "U", doc="the input's shape")], _CAST_VARIANTS,
        doc="stored values converted, quantization parameters ignored"),
    sig(O.QUANTIZE, [Slot("input", "T", doc="rank 1 or more")],
        [Slot("output", "U", doc="the input's shape")], _QUANTIZE_VARIANTS),
    sig(O.DEQUANTIZE, [Slot("input", "T", doc="rank up to 4")],
        [Slot("output", "U", doc="the input's shape")], _DEQUANTIZE_VARIANTS),
]


def _float_to_int(x: np.ndarray, lo: int, hi: int, dtype: np.dtype) -> np.ndarray:
    """Truncate toward zero and saturate (out-of-range is undefined in C++; NaN becomes 0)."""
    with np.errstate(invalid="ignore"):
        r = np.clip(np.trunc(x.astype(np.float64)), lo, hi)
    return np.where(np.isnan(r), 0, r).astype(dtype)


def cast_values(x: np.ndarray, src: OperandType, dst: OperandType) -> np.ndarray:
    """Convert stored values of type ``src`` to type ``dst`` as the reference CAST does."""
    if src == dst:
        return np.array(x, dtype=dst.dtype, copy=True)
    if dst in C.FLOAT_TYPES:
        with np.errstate(over="ignore"):
            return x.astype(dst.dtype)
    if dst == T.TENSOR_INT32:
        return _float_to_int(x, C.INT32_MIN, C.INT32_MAX, np.dtype(np.int32))
    # TENSOR_QUANT8_ASYMM: saturate to [0, 255], then truncate.
    if src == T.TENSOR_INT32:
        return np.clip(x, 0, 255).astype(np.uint8)
    return _float_to_int(x, 0, 255, np.dtype(np.uint8))


def _scaled(scale: np.ndarray | np.float32, x: np.ndarray, zp: np.int32,
            dtype: np.dtype) -> np.ndarray:
    """scale * (x - zero point) in float32, then stored as ``dtype``."""
    with np.errstate(over="ignore"):
        return (scale * (x.astype(np.int32) - zp).astype(np.float32)).astype(dtype)


class _SameShape(OperationDef):
    def prepare(self, ctx: OpContext) -> list[Shape]:
        return [ctx.inputs[0].shape]

    def validate(self, ctx: OpContext) -> None:
        check_quant_scales(ctx)
        check_output_shape(ctx, ctx.inputs[0].shape)


@register(O.CAST)
class _Cast(_SameShape):
    def kernel(self, ctx: OpContext):
        src, dst = ctx.inputs[0].type, ctx.outputs[0].type
        return lambda ins, rt: [cast_values(np.asarray(ins[0]), src, dst)]


@register(O.QUANTIZE)
class _Quantize(_SameShape):
    def kernel(self, ctx: OpContext):
        out = ctx.outputs[0]
        scale = np.float32(out.scale)
        zp = np.float32(out.zero_point)
        qmin, qmax = C.qrange(out.type)
        dt = out.type.dtype

        def run(ins, rt):
            with np.errstate(all="ignore"):
                q = zp + C.round_half_away(np.asarray(ins[0], np.float32) / scale)
            return [np.clip(np.nan_to_num(q), qmin, qmax).astype(dt)]

        return run

    def kernel_into(self, ctx: OpContext):
        """The same arithmetic as :meth:`kernel` in one float32 scratch array, in place:
        ``|x / scale| + 0.5`` floored, given the sign of ``x / scale`` back, plus the zero
        point, clamped; NaN becomes 0 as there."""
        out = ctx.outputs[0]
        scale = np.float32(out.scale)
        zp = np.float32(out.zero_point)
        qmin, qmax = C.qrange(out.type)
        half = np.float32(0.5)
        f32 = np.float32

        def run_into(ins, outs, rt) -> None:
            y = outs[0]
            with np.errstate(all="ignore"):
                q = np.divide(ins[0], scale, dtype=f32)
                a = np.abs(q)
                a += half
                np.floor(a, out=a)
                np.copysign(a, q, out=a)
                a += zp
            np.clip(a, qmin, qmax, out=a)
            nan = a != a
            if nan.any():
                a[nan] = 0
            np.copyto(y, a, casting="unsafe")

        return run_into


@register(O.DEQUANTIZE)
class _Dequantize(_SameShape):
    def validate(self, ctx: OpContext) -> None:
        super().validate(ctx)
        inp = ctx.inputs[0]
        ctx.require(inp.rank is None or inp.rank <= 4, "input rank must be at most 4")
        if inp.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            ctx.require(inp.channel_scales is not None, "per-channel scales are missing")
            if inp.rank is not None:
                ctx.require(0 <= inp.channel_dim < inp.rank, "channel dimension out of range")
                dim = inp.shape[inp.channel_dim]
                ctx.require(dim == 0 or dim == len(inp.channel_scales),
                            "one scale per channel is required")

    def kernel(self, ctx: OpContext):
        inp, out = ctx.inputs[0], ctx.outputs[0]
        dt = out.type.dtype
        zp = np.int32(inp.zero_point)
        if inp.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            scales = np.asarray(inp.channel_scales, dtype=np.float32)
            axis = inp.channel_dim

            def run_per_channel(ins, rt):
                x = np.asarray(ins[0])
                shape = [1] * x.ndim
                shape[axis] = -1
                return [_scaled(scales.reshape(shape), x, zp, dt)]

            return run_per_channel
        scale = np.float32(inp.scale)
        return lambda ins, rt: [_scaled(scale, np.asarray(ins[0]), zp, dt)]

    def kernel_into(self, ctx: OpContext):
        """Per-tensor scale into a float32 output: ``scale * float32(x - zero point)``."""
        inp, out = ctx.inputs[0], ctx.outputs[0]
        if inp.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL or out.type != T.TENSOR_FLOAT32:
            return None
        zp = np.int32(inp.zero_point)
        scale = np.float32(inp.scale)
        i32 = np.int32

        def run_into(ins, outs, rt) -> None:
            y = outs[0]
            np.copyto(y, np.subtract(ins[0], zp, dtype=i32), casting="unsafe")
            with np.errstate(over="ignore"):
                np.multiply(y, scale, out=y)

        return run_into
