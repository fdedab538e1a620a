"""Activations: RELU, RELU1, RELU6, LOGISTIC, TANH, ELU, HARD_SWISH, PRELU.

Quantized LOGISTIC, TANH and HARD_SWISH are functions of one 8-bit value, so their kernels
evaluate the reference fixed-point arithmetic once for all 256 possible inputs at prepare time
and then only index that table: bit-exact with upstream and cheap per execution.
"""

from __future__ import annotations

import math

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops import fixedpoint as FP
from nnhal.ops.conv_engine import scratch
from nnhal.ops.elementwise import (
    check_output_shape,
    check_quant_scales,
    check_same_quant,
    float_unary,
    table_lookup,
)
from nnhal.ops.resolver import OpContext, OperandInfo, OperationDef, OpError, Shape, register
from nnhal.ops.signature import V1_0, V1_2, V1_3, Signature, Slot, Variant, sig, variants

T = OperandType
O = OperationType

_F32, _F16 = {"T": T.TENSOR_FLOAT32}, {"T": T.TENSOR_FLOAT16}
_Q8, _Q8S = {"T": T.TENSOR_QUANT8_ASYMM}, {"T": T.TENSOR_QUANT8_ASYMM_SIGNED}
_UNARY_1_0 = [*variants(V1_0, _F32, _Q8), *variants(V1_2, _F16), *variants(V1_3, _Q8S)]


def _unary(op: OperationType, rows: list[Variant], out_doc: str = "") -> Signature:
    return sig(op, [Slot("input", "T")], [Slot("output", "T", doc=out_doc)], rows)


_SAME_QUANT = "quantized: the input's scale and zero point"
SIGNATURES = [
    _unary(O.RELU, _UNARY_1_0, _SAME_QUANT),
    _unary(O.RELU1, _UNARY_1_0, _SAME_QUANT),
    _unary(O.RELU6, _UNARY_1_0, _SAME_QUANT),
    _unary(O.LOGISTIC, _UNARY_1_0, "quantized: scale 1/256, fixed zero point"),
    _unary(O.TANH, [*variants(V1_0, _F32), *variants(V1_2, _F16, _Q8), *variants(V1_3, _Q8S)],
           "quantized: scale 1/128, fixed zero point"),
    _unary(O.HARD_SWISH, variants(V1_3, _F16, _F32, _Q8, _Q8S),
           "quantized: any scale and zero point"),
    sig(O.ELU, [Slot("input", "T"), Slot("alpha", "S")], [Slot("output", "T")],
        variants(V1_3, {"T": T.TENSOR_FLOAT16, "S": T.FLOAT16},
                 {"T": T.TENSOR_FLOAT32, "S": T.FLOAT32})),
    sig(O.PRELU, [Slot("input", "T"), Slot("alpha", "T", doc="broadcast against input")],
        [Slot("output", "T", doc="quantized: any scale and zero point")],
        [*variants(V1_2, _F16, _F32, _Q8), *variants(V1_3, _Q8S)]),
]


def _round_half_away(v: float) -> int:
    return int(math.copysign(math.floor(abs(v) + 0.5), v))


def relu_range(code: int, info: OperandInfo) -> tuple[int, int]:
    """CalculateActivationRange for 8-bit values: float32 division, rounding half away."""
    qmin, qmax = C.qrange(info.type)
    scale = np.float32(info.scale)

    def q(v: float) -> int:
        with np.errstate(all="ignore"):
            r = float(np.float32(v) / scale)
        if not math.isfinite(r):  # a degenerate scale: only the sign survives
            r = math.copysign(float(1 << 40), r) if r == r else 0.0
        return info.zero_point + _round_half_away(r)

    if code == C.ACT_RELU:
        return max(qmin, q(0.0)), qmax
    if code == C.ACT_RELU6:
        return max(qmin, q(0.0)), min(qmax, q(6.0))
    if code == C.ACT_RELU1:
        return max(qmin, q(-1.0)), min(qmax, q(1.0))
    return qmin, qmax


def all_values(info: OperandInfo) -> np.ndarray:
    """Every stored value of an 8-bit type, in order, as int64."""
    qmin, qmax = C.qrange(info.type)
    return np.arange(qmin, qmax + 1, dtype=np.int64)


# ---- RELU family ---------------------------------------------------------------------------

class _Activation(OperationDef):
    """One tensor in, same type and shape out (RELU*, LOGISTIC, TANH)."""

    max_rank: int | None = 4

    def validate(self, ctx: OpContext) -> None:
        info = ctx.inputs[0]
        if self.max_rank is not None and info.rank is not None and info.rank > self.max_rank:
            raise ctx.fail(f"input rank must be at most {self.max_rank}")
        check_quant_scales(ctx)
        check_output_shape(ctx, info.shape)
        if info.type in C.QUANT8_TYPES:
            self.check_quant(ctx)

    def check_quant(self, ctx: OpContext) -> None:
        check_same_quant(ctx, ctx.inputs[0], ctx.outputs[0], "input and output")

    def prepare(self, ctx: OpContext) -> list[Shape]:
        return [ctx.inputs[0].shape]


class _Relu(_Activation):
    code = C.ACT_RELU

    def kernel(self, ctx: OpContext):
        info = ctx.inputs[0]
        dt = info.type.dtype
        if info.type in C.QUANT8_TYPES:
            lo, hi = relu_range(self.code, info)
            return lambda ins, rt: [np.clip(ins[0], lo, hi).astype(dt, copy=False)]
        lo_f, hi_f = C.float_activation_bounds(self.code)
        return float_unary(lambda x: np.clip(x, np.float32(lo_f), np.float32(hi_f)), dt)

    def kernel_into(self, ctx: OpContext):
        """float32 only: one clamp into the output."""
        if ctx.inputs[0].type != T.TENSOR_FLOAT32:
            return None
        code = self.code

        def run_into(ins, outs, rt) -> None:
            np.copyto(outs[0], ins[0])
            C.activation_into(outs[0], code)

        return run_into


@register(O.RELU)
class _Relu0(_Relu):
    code = C.ACT_RELU


@register(O.RELU1)
class _Relu1(_Relu):
    code = C.ACT_RELU1


@register(O.RELU6)
class _Relu6(_Relu):
    code = C.ACT_RELU6


# ---- LOGISTIC and TANH -----------------------------------------------------------------------

_INPUT_INTEGER_BITS = 4


def _input_rescaling(info: OperandInfo) -> tuple[int, int, int]:
    """(multiplier, left shift, input radius) mapping centred inputs to Q4.27."""
    real = float(np.float32(info.scale)) * float(1 << (31 - _INPUT_INTEGER_BITS))
    if not real > 1.0:
        raise OpError("input scale too small for the fixed-point activation")
    multiplier, shift = C.quantize_multiplier(real)
    max_rescaled = (((1 << _INPUT_INTEGER_BITS) - 1) * float(1 << (31 - _INPUT_INTEGER_BITS))
                    / float(1 << shift))
    return multiplier, shift, int(math.floor(max_rescaled))


def _sigmoid_table(info: OperandInfo, out_zero_point: int, tanh: bool) -> np.ndarray:
    qmin, qmax = C.qrange(info.type)
    multiplier, shift, radius = _input_rescaling(info)
    centred = all_values(info) - info.zero_point
    # Beyond a shift of 31 the radius is 0 and every value saturates below.
    rescaled = C.multiply_by_quantized_multiplier(centred, multiplier, min(shift, 31))
    if tanh:
        out = C.rounding_divide_by_pot(FP.tanh(rescaled, _INPUT_INTEGER_BITS), 24)
    else:
        out = C.rounding_divide_by_pot(FP.logistic(rescaled, _INPUT_INTEGER_BITS), 23)
    out = np.clip(out + out_zero_point, qmin, qmax)
    out = np.where(centred <= -radius, qmin, np.where(centred >= radius, qmax, out))
    return out.astype(info.type.dtype)


class _Sigmoid(_Activation):
    tanh = False
    #: Required output (scale, zero point) for unsigned and signed 8-bit tensors.
    out_params: dict[OperandType, tuple[float, int]] = {}

    def check_quant(self, ctx: OpContext) -> None:
        scale, zp = self.out_params[ctx.inputs[0].type]
        out = ctx.outputs[0]
        ctx.require(np.float32(out.scale) == np.float32(scale) and out.zero_point == zp,
                    f"output must have scale {scale} and zero point {zp}")

    def kernel(self, ctx: OpContext):
        info = ctx.inputs[0]
        t = info.type
        if t in C.QUANT8_TYPES:
            table = _sigmoid_table(info, self.out_params[t][1], self.tanh)
            qmin = C.qrange(t)[0]
            return lambda ins, rt: [table_lookup(table, ins[0], qmin)]
        if self.tanh:
            return float_unary(np.tanh, t.dtype)
        one = np.float32(1.0)
        return float_unary(lambda x: one / (one + np.exp(-x)), t.dtype)


@register(O.LOGISTIC)
class _Logistic(_Sigmoid):
    tanh = False
    out_params = {T.TENSOR_QUANT8_ASYMM: (1 / 256, 0),
                  T.TENSOR_QUANT8_ASYMM_SIGNED: (1 / 256, -128)}


@register(O.TANH)
class _Tanh(_Sigmoid):
    tanh = True
    out_params = {T.TENSOR_QUANT8_ASYMM: (1 / 128, 128),
                  T.TENSOR_QUANT8_ASYMM_SIGNED: (1 / 128, 0)}


# ---- HARD_SWISH ------------------------------------------------------------------------------

def finite_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier, refusing the infinite ratios that extreme scales produce."""
    if not math.isfinite(real):
        raise OpError("quantization scales give an unrepresentable multiplier")
    return C.quantize_multiplier(real)


def _int16_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier then the rounding down-scale of its mantissa to 16 bits."""
    m32, exponent = finite_multiplier(real)
    if m32 >= C.INT32_MAX - (1 << 15):
        return 32767, exponent
    return (m32 + (1 << 15)) >> 16, exponent


def _srdhm16(a: np.ndarray, b: int) -> np.ndarray:
    """SaturatingRoundingDoublingHighMul on int16 values."""
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    s = ab + nudge
    res = np.where(s >= 0, s >> 15, -((-s) >> 15))
    return np.where((a == -32768) & (b == -32768), 32767, res)


def _sdhm16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """SaturatingDoublingHighMul on int16 values: truncating, not rounding."""
    ab = a * b
    res = np.where(ab >= 0, ab >> 15, -((-ab) >> 15))
    return np.where((a == -32768) & (b == -32768), 32767, res)


def _sat_shift16(x: np.ndarray, amount: int) -> np.ndarray:
    # Shifting int16 values by 17 or more saturates every non-zero value either way.
    return np.clip(x * (1 << min(amount, 17)), -32768, 32767)


def _hard_swish_table(inp: OperandInfo, out: OperandInfo) -> np.ndarray:
    """Reference 16-bit fixed-point hard swish, evaluated for every input value."""
    hires_scale = np.float32(1.0 / 128.0) * np.float32(inp.scale)
    with np.errstate(all="ignore"):
        out_real = float(hires_scale / np.float32(out.scale))
        relu_real = float(hires_scale / np.float32(3.0 / 32768.0))
    out_m, out_e = _int16_multiplier(out_real)
    if out_e > 0:
        raise OpError("HARD_SWISH: output scale too small relative to the input scale")
    relu_m, relu_e = _int16_multiplier(relu_real)

    hires = (all_values(inp) - inp.zero_point) * 128
    preshift_out = _srdhm16(hires, out_m)
    reluish = hires
    if relu_e > 0:
        reluish = _sat_shift16(reluish, relu_e - 1)
    reluish = _srdhm16(reluish, relu_m)
    if relu_e > 0:
        reluish = _sat_shift16(reluish, 1)
    elif relu_e < 0:
        reluish = C.rounding_divide_by_pot(reluish, -relu_e)
    reluish = (reluish + (1 << 15)) >> 1
    value = C.rounding_divide_by_pot(_sdhm16(reluish, preshift_out), -out_e) + out.zero_point
    qmin, qmax = C.qrange(out.type)
    return np.clip(value, qmin, qmax).astype(out.type.dtype)


@register(O.HARD_SWISH)
class _HardSwish(_Activation):
    max_rank = None

    def check_quant(self, ctx: OpContext) -> None:
        return None  # the output may have its own scale and zero point

    def kernel(self, ctx: OpContext):
        inp = ctx.inputs[0]
        if inp.type in C.QUANT8_TYPES:
            table = _hard_swish_table(inp, ctx.outputs[0])
            qmin = C.qrange(inp.type)[0]
            return lambda ins, rt: [table_lookup(table, ins[0], qmin)]
        three, six = np.float32(3.0), np.float32(6.0)
        return float_unary(lambda x: x * np.clip(x + three, np.float32(0.0), six) / six,
                           inp.type.dtype)


# ---- ELU -------------------------------------------------------------------------------------

@register(O.ELU)
class _Elu(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        check_output_shape(ctx, ctx.inputs[0].shape)

    def prepare(self, ctx: OpContext) -> list[Shape]:
        return [ctx.inputs[0].shape]

    def kernel(self, ctx: OpContext):
        dt = ctx.inputs[0].type.dtype
        zero, one = np.float32(0.0), np.float32(1.0)

        def run(ins, rt):
            x = np.asarray(ins[0], dtype=np.float32)
            alpha = np.float32(ins[1])
            with np.errstate(all="ignore"):
                r = np.maximum(zero, x) + np.minimum(zero, alpha * (np.exp(x) - one))
            return [r.astype(dt, copy=False)]

        return run


# ---- PRELU -----------------------------------------------------------------------------------

@register(O.PRELU)
class _Prelu(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        check_quant_scales(ctx)
        check_output_shape(ctx, C.broadcast_shapes(ctx.inputs[0].shape, ctx.inputs[1].shape))

    def prepare(self, ctx: OpContext) -> list[Shape]:
        return [C.broadcast_shapes(ctx.inputs[0].shape, ctx.inputs[1].shape)]

    def kernel_into(self, ctx: OpContext):
        """float32: ``min(x, 0) * alpha + max(x, 0)`` in the output and one scratch buffer,
        which is ``where(x >= 0, x, x * alpha)`` (up to the sign of a zero) when alpha is
        finite; a run-time or non-finite alpha takes the ``where`` form."""
        if ctx.inputs[0].type != T.TENSOR_FLOAT32:
            return None
        const_alpha = ctx.const(1)
        finite = const_alpha is not None and bool(np.all(np.isfinite(const_alpha)))
        zero = np.float32(0.0)

        def run_into(ins, outs, rt) -> None:
            v, a, out = ins[0], ins[1], outs[0]
            if not finite:
                np.copyto(out, np.where(v >= zero, v, v * a))
                return
            np.minimum(v, zero, out=out)
            np.multiply(out, a, out=out)
            pos = scratch("prelu", out.shape, np.float32)
            np.maximum(v, zero, out=pos)
            np.add(out, pos, out=out)

        return run_into

    def kernel(self, ctx: OpContext):
        x, alpha, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        dt = out.type.dtype
        if x.type in C.FLOAT_TYPES:
            zero = np.float32(0.0)

            def run(ins, rt):
                v = np.asarray(ins[0], np.float32)
                a = np.asarray(ins[1], np.float32)
                return [np.where(v >= zero, v, v * a).astype(dt, copy=False)]

            return run
        sx, sa, so = np.float32(x.scale), np.float32(alpha.scale), np.float32(out.scale)
        with np.errstate(all="ignore"):
            m_pos, s_pos = finite_multiplier(float(sx / so))
            m_neg, s_neg = finite_multiplier(float(sx * sa) / float(so))
        zx, za, zo = x.zero_point, alpha.zero_point, out.zero_point
        qmin, qmax = C.qrange(out.type)

        def run_quant(ins, rt):
            v = np.asarray(ins[0], np.int64) - zx
            a = np.asarray(ins[1], np.int64) - za
            shape = C.broadcast_static(v.shape, a.shape)  # (broadcast_arrays: 32 dims at most)
            v, a = np.broadcast_to(v, shape), np.broadcast_to(a, shape)
            pos = C.multiply_by_quantized_multiplier(v, m_pos, s_pos)
            neg = C.multiply_by_quantized_multiplier(v * a, m_neg, s_neg)
            r = np.where(v >= 0, pos, neg) + zo
            return [np.clip(r, qmin, qmax).astype(dt)]

        return run_quant
