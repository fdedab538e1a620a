"""L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION and INSTANCE_NORMALIZATION.

Quantized L2 normalization follows the TFLite integer kernel the upstream driver runs: the
inverse square root of the sum of squares comes from a fixed-point Newton-Raphson iteration,
and the output has the fixed scale 1/128, so results match within rounding of one step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops import fixedpoint as FP
from nnhal.ops.resolver import (
    OpContext,
    OperandInfo,
    OperationDef,
    OpError,
    Shape,
    elements,
    register,
    visits,
)
from nnhal.ops.signature import V1_0, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

#: An absent or omitted axis is the last one.
_AXIS = Slot("axis", T.INT32, optional=True, omittable=True, since=V1_2, doc="default -1")
_F32, _F16 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16
# T: the tensors, S: the scalar parameters of a float tensor type.
_FLOAT32, _FLOAT16 = {"T": _F32, "S": T.FLOAT32}, {"T": _F16, "S": T.FLOAT16}

SIGNATURES = [
    sig(O.L2_NORMALIZATION, [Slot("input", "T", doc="rank 1 to 4"), _AXIS],
        [Slot("output", "T", doc="quantized: scale 1/128, fixed zero point")],
        [*variants(V1_0, {"T": _F32}),
         *variants(V1_2, {"T": _F16}, {"T": T.TENSOR_QUANT8_ASYMM}),
         *variants(V1_3, {"T": T.TENSOR_QUANT8_ASYMM_SIGNED})]),
    sig(O.LOCAL_RESPONSE_NORMALIZATION, [
        Slot("input", "T", doc="rank 1 to 4"), Slot("radius", T.INT32, doc="window radius"),
        Slot("bias", "S", doc="not zero"), Slot("alpha", "S"), Slot("beta", "S"), _AXIS,
    ], [Slot("output", "T")], [*variants(V1_0, _FLOAT32), *variants(V1_2, _FLOAT16)]),
    sig(O.INSTANCE_NORMALIZATION, [
        Slot("input", "T", doc="4-D"), Slot("gamma", "S"), Slot("beta", "S"),
        Slot("epsilon", "S"), Slot("nchw", T.BOOL, doc="NCHW data layout"),
    ], [Slot("output", "T")], variants(V1_2, _FLOAT32, _FLOAT16)),
]

#: Required output zero point of a quantized L2 normalization (the scale is always 1/128).
_L2_OUT_ZP = {T.TENSOR_QUANT8_ASYMM: 128, T.TENSOR_QUANT8_ASYMM_SIGNED: 0}


def inv_sqrt_multiplier(sq: np.ndarray, xp: Any = np) -> tuple[np.ndarray, np.ndarray]:
    """GetInvSqrtQuantizedMultiplierExp: 1/sqrt(sq) as (Q0.31 multiplier, right shift).

    Sums of 0 and 1 give (INT32_MAX, 0), so an all-zero slice normalizes to zero. ``xp``: the
    array namespace (the XLA driver traces this with ``jax.numpy``: its loop runs the bound
    of 16 steps, numpy's stops once no value is left to reduce).
    """
    sq = xp.asarray(sq, dtype=xp.int64)
    tiny = sq <= 1
    v = xp.where(tiny, 4, sq)
    shift = xp.full(v.shape, 11, dtype=xp.int64)
    for _ in range(16):  # int64 sums below 2**61 are under 2**29 after 16 quarterings
        big = v >= (1 << 29)
        if xp is np and not big.any():
            break
        v = xp.where(big, v // 4, v)
        shift = shift + big
    pairs = (32 - FP.bit_length(v, xp) - 1) // 2 - 1
    shift = shift - pairs
    v = v << (2 * pairs)
    half_input = C.rounding_divide_by_pot(v >> 1, 1, xp)   # Q3.28
    half_three = np.int64((1 << 28) + (1 << 27))
    x = xp.full(v.shape, 1 << 28, dtype=xp.int64)      # 1.0 in Q3.28
    for _ in range(5):
        x3 = FP.saturating_shift_left(C.srdhm(C.srdhm(x, x, xp), x, xp), 6, xp)
        x = FP.saturating_shift_left(
            C.srdhm(half_three, x, xp) - C.srdhm(half_input, x3, xp), 3, xp)
    x = C.srdhm(x, 1518500250, xp)                          # times sqrt(2)/2
    neg = shift < 0
    x = xp.where(neg, x << xp.where(neg, -shift, 0), x)
    shift = xp.where(neg, 0, shift)
    return xp.where(tiny, C.INT32_MAX, x), xp.where(tiny, 0, shift)


def quant_l2_normalize(x: np.ndarray, info: OperandInfo, axis: int,
                       xp: Any = np) -> np.ndarray:
    """The upstream integer L2 normalization of a uint8/int8 array along ``axis`` (output
    scale 1/128 and the fixed zero point)."""
    t = info.type
    diff = x.astype(xp.int64) - info.zero_point
    mult, shift = inv_sqrt_multiplier((diff * diff).sum(axis=axis, keepdims=True), xp)
    scaled = C.rounding_divide_by_pot(C.srdhm(diff * 128, mult, xp), shift, xp) + _L2_OUT_ZP[t]
    qmin, qmax = C.qrange(t)
    return xp.clip(scaled, qmin, qmax).astype(t.dtype)


class _SameShape(OperationDef):
    def prepare(self, ctx: OpContext) -> list[Shape] | None:
        return [ctx.inputs[0].shape]


@register(O.L2_NORMALIZATION)
class L2Normalization(_SameShape):
    def validate(self, ctx: OpContext) -> None:
        t = ctx.inputs[0].type
        ctx.expect_rank(0, (1, 2, 3, 4))
        C.check_optional_axis(ctx, 1)
        if t in _L2_OUT_ZP:
            o = ctx.outputs[0]
            ctx.require(o.scale == np.float32(1.0 / 128) and o.zero_point == _L2_OUT_ZP[t],
                        "quantized output must have scale 1/128 and the fixed zero point")

    def kernel(self, ctx: OpContext):
        t = ctx.inputs[0].type
        dt = t.dtype
        info = ctx.inputs[0]

        def run(ins, rt):
            x = ins[0]
            if not 1 <= x.ndim <= 4:
                raise OpError("input rank must be 1 to 4")
            axis = C.optional_axis(ins, 1, x.ndim)
            if x.size == 0:
                return [np.zeros(x.shape, dtype=dt)]
            if t in C.FLOAT_TYPES:
                xf = x.astype(np.float32)
                norm = np.sqrt((xf * xf).sum(axis=axis, keepdims=True, dtype=np.float32))
                r = xf / np.maximum(norm, np.float32(1e-6))
                return [r.astype(dt)]
            return [quant_l2_normalize(x, info, axis)]

        return run


@register(O.LOCAL_RESPONSE_NORMALIZATION)
class LocalResponseNormalization(_SameShape):
    def validate(self, ctx: OpContext) -> None:
        ctx.expect_rank(0, (1, 2, 3, 4))
        C.check_optional_axis(ctx, 5)
        radius = ctx.const_int(1)
        ctx.require(radius is None or radius >= 0, "radius must not be negative")
        bias = ctx.const_float(2)
        ctx.require(bias is None or bias != 0.0, "bias must not be zero")

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Each element sums the squares of its window: 2 * radius + 1 neighbours along the
        axis, at most the whole axis."""
        shape = ctx.inputs[0].shape
        radius = max(ctx.const_int(1) or 0, 0)
        axis = ctx.const_int(5) if ctx.has_value(5) else -1
        depth = radius * 2 + 1
        if shape and axis is not None and -len(shape) <= axis < len(shape) and shape[axis] > 0:
            depth = min(depth, shape[axis])
        return visits(ctx, outputs) + elements(shape) * depth

    def kernel(self, ctx: OpContext):
        dt = ctx.inputs[0].type.dtype

        def run(ins, rt):
            x = ins[0]
            if not 1 <= x.ndim <= 4:
                raise OpError("input rank must be 1 to 4")
            radius = int(np.asarray(ins[1]))
            if radius < 0:
                raise OpError("radius must not be negative")
            bias, alpha, beta = (np.float32(np.asarray(v)) for v in ins[2:5])
            axis = C.optional_axis(ins, 5, x.ndim)
            if x.size == 0:
                return [np.zeros(x.shape, dtype=dt)]
            xf = np.moveaxis(x, axis, -1).astype(np.float32)
            n = xf.shape[-1]
            sq = (xf * xf).astype(np.float64)
            cs = np.concatenate([np.zeros(sq.shape[:-1] + (1,)), np.cumsum(sq, axis=-1)], axis=-1)
            idx = np.arange(n)
            hi = np.minimum(idx + radius + 1, n)
            lo = np.maximum(idx - radius, 0)
            window = (cs[..., hi] - cs[..., lo]).astype(np.float32)
            with np.errstate(all="ignore"):
                r = xf * np.power(bias + alpha * window, -beta)
            return [np.ascontiguousarray(np.moveaxis(r, -1, axis), dtype=dt)]

        return run


@register(O.INSTANCE_NORMALIZATION)
class InstanceNormalization(_SameShape):
    def validate(self, ctx: OpContext) -> None:
        ctx.expect_rank(0, 4)

    def kernel(self, ctx: OpContext):
        dt = ctx.inputs[0].type.dtype

        def run(ins, rt):
            x = ins[0]
            if x.ndim != 4:
                raise OpError("input must be 4-D")
            gamma, beta, eps = (np.float64(np.asarray(v)) for v in ins[1:4])
            nchw = bool(np.asarray(ins[4]))
            if x.size == 0:
                return [np.zeros(x.shape, dtype=dt)]
            spatial = (2, 3) if nchw else (1, 2)
            xf = x.astype(np.float64)
            mean = xf.mean(axis=spatial, keepdims=True)
            var = ((xf - mean) ** 2).mean(axis=spatial, keepdims=True)
            with np.errstate(all="ignore"):
                r = (xf - mean) * gamma / np.sqrt(var + eps) + beta
            return [r.astype(dt)]

        return run
