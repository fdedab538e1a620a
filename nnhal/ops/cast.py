"""Type conversions: CAST, QUANTIZE, DEQUANTIZE.

CAST ignores quantization parameters and converts stored values like a C++ ``static_cast``:
float to integer truncates toward zero, and conversions to TENSOR_QUANT8_ASYMM saturate to
[0, 255] first. QUANTIZE rounds half away from zero (``std::round``) and saturates.
"""

from __future__ import annotations

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.elementwise import check_output_shape, check_quant_scales, check_tensor
from nnhal.ops.registry import OpContext, OperationDef, Shape, register

T = OperandType
O = OperationType

#: Types that convert to one another (HAL 1.2).
CAST_NUMERIC = (T.TENSOR_FLOAT16, T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM)
#: Types that may only be "cast" to themselves (HAL 1.3).
CAST_IDENTITY = (T.TENSOR_BOOL8, T.TENSOR_INT32, T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM,
                 T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM)

DEQUANTIZE_INPUTS = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM,
                     T.TENSOR_QUANT8_SYMM_PER_CHANNEL)


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
        ctx.expect_counts(1, 1)
        self.check_types(ctx)
        check_quant_scales(ctx)
        check_output_shape(ctx, ctx.inputs[0].shape)

    def check_types(self, ctx: OpContext) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


@register(O.CAST)
class _Cast(_SameShape):
    def check_types(self, ctx: OpContext) -> None:
        src, dst = ctx.inputs[0].type, ctx.outputs[0].type
        ok = (src in CAST_NUMERIC and dst in CAST_NUMERIC) or (src == dst and src in CAST_IDENTITY)
        ctx.require(ok, f"cannot cast {src.name} to {dst.name}")

    def kernel(self, ctx: OpContext):
        src, dst = ctx.inputs[0].type, ctx.outputs[0].type
        return lambda ins, rt: [cast_values(np.asarray(ins[0]), src, dst)]


@register(O.QUANTIZE)
class _Quantize(_SameShape):
    def check_types(self, ctx: OpContext) -> None:
        check_tensor(ctx, 0, C.FLOAT_TYPES)
        ctx.require(ctx.outputs[0].type in C.QUANT8_TYPES,
                    f"unsupported output type {ctx.outputs[0].type.name}")

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


@register(O.DEQUANTIZE)
class _Dequantize(_SameShape):
    def check_types(self, ctx: OpContext) -> None:
        info = check_tensor(ctx, 0, DEQUANTIZE_INPUTS, max_rank=4)
        ctx.require(ctx.outputs[0].type in C.FLOAT_TYPES,
                    f"unsupported output type {ctx.outputs[0].type.name}")
        if info == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            inp = ctx.inputs[0]
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
