"""SOFTMAX and LOG_SOFTMAX along any axis.

Quantized SOFTMAX reproduces the upstream integer kernel: input differences are rescaled to
Q5.26, exponentiated with gemmlowp's fixed-point exp, summed in Q12.19 and divided through a
fixed-point reciprocal, so the outputs match the reference driver bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops import fixedpoint as FP
from nnhal.ops.resolver import OpContext, OperationDef, OpError, Shape, register
from nnhal.ops.signature import V1_0, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

# T: the tensors, S: beta (FLOAT16 only with TENSOR_FLOAT16).
_FLOAT32 = {"T": T.TENSOR_FLOAT32, "S": T.FLOAT32}
_FLOAT16 = {"T": T.TENSOR_FLOAT16, "S": T.FLOAT16}

SIGNATURES = [
    sig(O.SOFTMAX, [
        Slot("input", "T", doc="rank 1 to 4"),
        Slot("beta", "S", doc="positive exponent scale"),
        Slot("axis", T.INT32, optional=True, omittable=True, since=V1_2, doc="default -1"),
    ], [Slot("output", "T", doc="quantized: scale 1/256, fixed zero point")], [
        *variants(V1_0, _FLOAT32, {"T": T.TENSOR_QUANT8_ASYMM, "S": T.FLOAT32}),
        *variants(V1_2, _FLOAT16),
        *variants(V1_3, {"T": T.TENSOR_QUANT8_ASYMM_SIGNED, "S": T.FLOAT32})]),
    sig(O.LOG_SOFTMAX, [
        Slot("input", "T", doc="rank 1 or more"),
        Slot("beta", "S", doc="positive exponent scale"),
        Slot("axis", T.INT32),
    ], [Slot("output", "T")], variants(V1_2, _FLOAT32, _FLOAT16)),
]
#: Required output zero point of a quantized softmax (the scale is always 1/256).
_SOFTMAX_OUT_ZP = {T.TENSOR_QUANT8_ASYMM: 0, T.TENSOR_QUANT8_ASYMM_SIGNED: -128}

_SCALED_DIFF_INT_BITS = 5   # Q5.26 input to exp
_ACCUM_INT_BITS = 12        # Q12.19 sum of exps


def _quantize_multiplier_gt_one(real: float) -> tuple[int, int]:
    """QuantizeMultiplierGreaterThanOne: (multiplier, left shift); real must exceed 1."""
    if not real > 1.0:
        raise OpError("softmax input multiplier must be greater than one")
    frac, shift = math.frexp(real)
    q = int(math.floor(frac * (1 << 31) + 0.5))
    if q == (1 << 31):
        q //= 2
        shift += 1
    return q, shift


def _input_radius(integer_bits: int, left_shift: int) -> int:
    max_rescaled = (((1 << integer_bits) - 1) * float(1 << (31 - integer_bits))
                    / float(1 << left_shift))
    return int(math.floor(max_rescaled))


def quant_softmax_last_axis(x: np.ndarray, beta: float, scale: float, t: OperandType,
                            xp: Any = np) -> np.ndarray:
    """The upstream fixed-point softmax over the last axis of a uint8/int8 array (``xp``: the
    array namespace; the XLA driver traces this function with ``jax.numpy``)."""
    real = min(1.0 * beta * scale * (1 << (31 - _SCALED_DIFF_INT_BITS)), (1 << 31) - 1.0)
    mult, left_shift = _quantize_multiplier_gt_one(real)
    diff_min = -_input_radius(_SCALED_DIFF_INT_BITS, left_shift)

    xi = x.astype(xp.int64)
    diff = xi - xi.max(axis=-1, keepdims=True)
    valid = diff >= diff_min
    scaled = C.srdhm(xp.where(valid, diff, 0) * np.int64(1 << left_shift), mult, xp)
    exps = FP.exp_on_negative_values(scaled, _SCALED_DIFF_INT_BITS, xp)
    # Rescale<12>: Q0.31 -> Q12.19 before accumulating.
    rescaled = C.rounding_divide_by_pot(exps, _ACCUM_INT_BITS, xp)
    total = xp.where(valid, rescaled, 0).sum(axis=-1, keepdims=True)
    headroom_plus_one = 32 - FP.bit_length(total, xp)
    bits_over_unit = _ACCUM_INT_BITS - headroom_plus_one
    shifted_minus_one = (total << headroom_plus_one) - (1 << 31)
    shifted_scale = FP.one_over_one_plus_x(shifted_minus_one, xp)
    out = C.rounding_divide_by_pot(C.srdhm(shifted_scale, exps, xp), bits_over_unit + 31 - 8,
                                   xp)
    qmin, qmax = C.qrange(t)
    if t == T.TENSOR_QUANT8_ASYMM_SIGNED:
        out = out - 128
    out = xp.where(valid, xp.clip(out, qmin, qmax), qmin)
    return out.astype(t.dtype)


# ---- operations -------------------------------------------------------------------------------

class _SoftmaxBase(OperationDef):
    def prepare(self, ctx: OpContext) -> list[Shape] | None:
        return [ctx.inputs[0].shape]


@register(O.SOFTMAX)
class Softmax(_SoftmaxBase):
    def validate(self, ctx: OpContext) -> None:
        t = ctx.inputs[0].type
        ctx.expect_rank(0, (1, 2, 3, 4))
        beta = ctx.const_float(1)
        ctx.require(beta is None or beta > 0.0, "beta must be positive")
        C.check_optional_axis(ctx, 2)
        if t in _SOFTMAX_OUT_ZP:
            o = ctx.outputs[0]
            ctx.require(ctx.inputs[0].scale > 0, "input scale must be positive")
            ctx.require(o.scale == np.float32(1.0 / 256) and o.zero_point == _SOFTMAX_OUT_ZP[t],
                        "quantized output must have scale 1/256 and the fixed zero point")

    def kernel(self, ctx: OpContext):
        t = ctx.inputs[0].type
        dt = t.dtype
        scale = ctx.inputs[0].scale

        def run(ins, rt):
            x = ins[0]
            beta = float(np.asarray(ins[1]))
            if not beta > 0.0:
                raise OpError("beta must be positive")
            if x.ndim == 0:
                raise OpError("input must have rank 1 to 4")
            axis = C.optional_axis(ins, 2, x.ndim)
            if x.size == 0:
                return [np.zeros(x.shape, dtype=dt)]
            xm = np.moveaxis(x, axis, -1)
            if t in C.FLOAT_TYPES:
                xf = xm.astype(np.float32)
                e = np.exp((xf - xf.max(axis=-1, keepdims=True)) * np.float32(beta))
                r = e / e.sum(axis=-1, keepdims=True, dtype=np.float32)
            else:
                r = quant_softmax_last_axis(xm, beta, scale, t)
            return [np.ascontiguousarray(np.moveaxis(r, -1, axis), dtype=dt)]

        return run


@register(O.LOG_SOFTMAX)
class LogSoftmax(_SoftmaxBase):
    def validate(self, ctx: OpContext) -> None:
        ctx.require(ctx.inputs[0].rank != 0, "input must have rank at least 1")
        C.check_optional_axis(ctx, 2)

    def kernel(self, ctx: OpContext):
        dt = ctx.inputs[0].type.dtype

        def run(ins, rt):
            x = ins[0]
            if x.ndim == 0:
                raise OpError("input must have rank at least 1")
            axis = C.optional_axis(ins, 2, x.ndim)
            if x.size == 0:
                return [np.zeros(x.shape, dtype=dt)]
            beta = np.float64(np.asarray(ins[1]))
            xf = np.moveaxis(x, axis, -1).astype(np.float64)
            z = (xf - xf.max(axis=-1, keepdims=True)) * beta
            r = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
            return [np.ascontiguousarray(np.moveaxis(r, -1, axis), dtype=dt)]

        return run
