"""Arithmetic shared by operation families: type groups, activations, broadcasting and the
reference fixed-point requantisation (gemmlowp / TFLite semantics), vectorised with numpy.

The fixed-point helpers take int64 arrays and reproduce the C++ integer arithmetic exactly,
including truncating division and saturation, so quantized results match upstream.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.hal.types import OperandType
from nnhal.ops.resolver import OpContext, OperandInfo, OpError

T = OperandType

FLOAT_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)
QUANT8_TYPES = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
#: The scalar type that goes with each tensor type for parameters such as alpha or beta.
SCALAR_OF = {T.TENSOR_FLOAT32: T.FLOAT32, T.TENSOR_FLOAT16: T.FLOAT16}

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# Fused activation function codes (FuseCode).
ACT_NONE, ACT_RELU, ACT_RELU1, ACT_RELU6 = 0, 1, 2, 3


def qrange(t: OperandType) -> tuple[int, int]:
    """Representable integer range of a quantized (or integer) tensor type."""
    info = np.iinfo(t.dtype)
    return int(info.min), int(info.max)


# ---- activations --------------------------------------------------------------------------

def check_activation(ctx: OpContext, index: int) -> None:
    """A constant fused activation must be a FuseCode (the signature checks it is INT32)."""
    v = ctx.const(index)
    if v is not None and int(v) not in (0, 1, 2, 3):  # the message worded only when needed
        raise ctx.fail(f"invalid fused activation {int(v)}")


def activation_code(value: object) -> int:
    code = int(np.asarray(value))
    if code not in (0, 1, 2, 3):
        raise OpError(f"invalid fused activation {code}")
    return code


def float_activation_bounds(code: int) -> tuple[float, float]:
    return {ACT_NONE: (-np.inf, np.inf), ACT_RELU: (0.0, np.inf),
            ACT_RELU1: (-1.0, 1.0), ACT_RELU6: (0.0, 6.0)}[code]


def activation_into(x: np.ndarray, code: int) -> None:
    """Apply a fused activation to a float array in place (NaN stays NaN, as np.clip)."""
    if code == ACT_RELU:
        np.maximum(x, x.dtype.type(0.0), out=x)
    elif code != ACT_NONE:
        lo, hi = float_activation_bounds(code)
        np.clip(x, x.dtype.type(lo), x.dtype.type(hi), out=x)


def bias_activation_into(x: np.ndarray, bias: np.ndarray | None, code: int) -> None:
    """The float epilogue of a convolution or dense layer, in place on its output: add the
    bias (broadcast over the last axis), then clamp for the fused activation."""
    if bias is not None:
        np.add(x, bias, out=x, casting="unsafe")
    activation_into(x, code)


def apply_float_activation(x: np.ndarray, code: int) -> np.ndarray:
    if code == ACT_NONE:
        return x
    lo, hi = float_activation_bounds(code)
    return np.clip(x, lo, hi, out=x if x.flags.writeable else None)


def quant_activation_range(code: int, scale: float, zero_point: int,
                           t: OperandType) -> tuple[int, int]:
    """CalculateActivationRangeQuantized: the integer clamp of a fused activation."""
    qmin, qmax = qrange(t)

    def q(v: float) -> int:
        # Upstream divides in single precision, then rounds halves away from zero.
        return zero_point + round_half_away_scalar(float(np.float32(v) / np.float32(scale)))

    if code == ACT_RELU:
        return max(qmin, q(0.0)), qmax
    if code == ACT_RELU6:
        return max(qmin, q(0.0)), min(qmax, q(6.0))
    if code == ACT_RELU1:
        return max(qmin, q(-1.0)), min(qmax, q(1.0))
    return qmin, qmax


def round_half_away_scalar(v: float) -> int:
    """std::round: halves away from zero (Python's round() goes to even)."""
    r = math.floor(abs(v) + 0.5)
    return int(-r if v < 0 else r)


# ---- fixed-point requantisation --------------------------------------------------------------

def quantize_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier: real = q * 2**(shift - 31), q in [2**30, 2**31). Returns (q, shift)."""
    if real == 0.0:
        return 0, 0
    frac, shift = math.frexp(real)
    q = round_half_away_scalar(frac * (1 << 31))
    if q == (1 << 31):
        q //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return q, shift


def quantize_multiplier_smaller_than_one(real: float) -> tuple[int, int]:
    """Returns (multiplier, right_shift) for 0 <= real < 1 (NNAPI's legacy helper)."""
    q, shift = quantize_multiplier(real)
    return q, -shift


def srdhm(a: np.ndarray, b: int | np.ndarray, xp: Any = np) -> np.ndarray:
    """SaturatingRoundingDoublingHighMul on int64 arrays holding int32 values.

    ``xp`` is the array namespace (numpy, or ``jax.numpy`` with 64-bit types enabled: the XLA
    driver traces these very formulas, so both drivers compute one arithmetic)."""
    a = xp.asarray(a, dtype=xp.int64)
    b64 = xp.asarray(b, dtype=xp.int64)
    ab = a * b64
    nudge = xp.where(ab >= 0, xp.int64(1 << 30), xp.int64(1 - (1 << 30)))
    s = ab + nudge
    # C++ division truncates toward zero.
    res = xp.where(s >= 0, s >> 31, -((-s) >> 31))
    overflow = (a == INT32_MIN) & (b64 == INT32_MIN)
    if xp is not np or np.any(overflow):
        res = xp.where(overflow, INT32_MAX, res)
    return res


def rounding_divide_by_pot(x: np.ndarray, exponent: int | np.ndarray,
                           xp: Any = np) -> np.ndarray:
    """RoundingDivideByPOT: divide by 2**exponent rounding half away from zero."""
    x = xp.asarray(x, dtype=xp.int64)
    exponent = xp.asarray(exponent, dtype=xp.int64)
    mask = xp.left_shift(xp.int64(1), exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def wrap32(x: np.ndarray, xp: Any = np) -> np.ndarray:
    """Two's-complement int32 wrap-around of int64 values: what the reference's C++ int32
    arithmetic gives on overflow (formally undefined behaviour; its compilers wrap)."""
    return ((xp.asarray(x, dtype=xp.int64) + (1 << 31)) & 0xFFFF_FFFF) - (1 << 31)


def requantize_int32_sum(total: np.ndarray, multiplier: int | np.ndarray,
                         shift: int | np.ndarray, xp: Any = np) -> np.ndarray:
    """The requantisation of a convolution's or dense layer's ``total`` (the exact sum of
    products plus the bias, in int64) as the reference kernels compute it.

    TFLite's kernels (reference and optimised) and the NNAPI CPU executor hold the sum and the
    bias in one int32 accumulator, so a total beyond int32 wraps modulo 2**32 (a bias near
    +-2**31 flips the result's sign: measured against ai-edge-litert, XNNPACK and TFLite's
    builtin and reference kernels all wrap, tests/ops/test_conv_bias_limits.py), and
    MultiplyByQuantizedMultiplier's left shift (a multiplier above 1) is an int32 product,
    which wraps too (TFLite's builtin and reference convolutions; XNNPACK saturates there).
    Then the rounding doubling high multiply and the rounding right shift."""
    shift = np.asarray(shift, dtype=np.int64)  # a constant of the operation
    x = wrap32(total, xp)
    if np.any(shift > 0):
        x = wrap32(x * (np.int64(1) << np.maximum(shift, 0)), xp)
    return rounding_divide_by_pot(srdhm(x, multiplier, xp), np.maximum(-shift, 0), xp)


def multiply_by_quantized_multiplier(x: np.ndarray, multiplier: int | np.ndarray,
                                     shift: int | np.ndarray, xp: Any = np) -> np.ndarray:
    """MultiplyByQuantizedMultiplier (TFLite): x * multiplier * 2**(shift - 31), rounded."""
    shift = np.asarray(shift, dtype=np.int64)  # a constant of the operation
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    x = xp.asarray(x, dtype=xp.int64) * (np.int64(1) << left)
    # Shifting can leave the int32 range only for pathological multipliers; saturate as C++
    # wraps are undefined behaviour anyway.
    x = xp.clip(x, INT32_MIN, INT32_MAX)
    return rounding_divide_by_pot(srdhm(x, multiplier, xp), right, xp)


def tflite_compare_ranks(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray | None:
    """What TFLite's 8-bit comparisons compare for each stored value ``q`` (as int64): (q -
    zero point) << 8 times the scale's fixed-point multiplier, rounded twice (the doubling
    high multiply, then the shift: ai-edge-litert's kernels, measured; a build rounding once
    differs at a few ties). None for a scale outside (0, 1): TFLite's other branch shifts
    by a negative amount (undefined, and saturating where measured)."""
    if not 0.0 < scale < 1.0:
        return None
    m, shift = quantize_multiplier(scale)
    return rounding_divide_by_pot(srdhm((q.astype(np.int64) - zero_point) << 8, m), -shift)


def tflite_ranks_exactly(scale: float) -> bool:
    """Whether TFLite's 8-bit comparisons (:func:`tflite_compare_ranks`) rank two stored
    values of one quantization as the values rank: strictly increasing in q where 256 x
    scale >= 2 (each rounding is within half a step) or is 1, 2, 4... (exact), the scale
    below 1; below, neighbouring values round together."""
    s = float(np.float32(scale))
    return s < 1.0 and (s * 256 >= 2.0 or (s * 256 >= 1.0 and math.frexp(s)[0] == 0.5))


def requantize(acc: np.ndarray, real_multiplier: float | np.ndarray, zero_point: int,
               t: OperandType, act_min: int | None = None,
               act_max: int | None = None) -> np.ndarray:
    """int32 accumulator -> quantized output through a fixed-point multiplier, then clamp."""
    if np.ndim(real_multiplier) == 0:
        m, s = quantize_multiplier(float(real_multiplier))
    else:
        pairs = [quantize_multiplier(float(r)) for r in np.ravel(real_multiplier)]
        m = np.array([p[0] for p in pairs], dtype=np.int64).reshape(np.shape(real_multiplier))
        s = np.array([p[1] for p in pairs], dtype=np.int64).reshape(np.shape(real_multiplier))
    out = multiply_by_quantized_multiplier(acc, m, s) + zero_point
    qmin, qmax = qrange(t)
    lo = qmin if act_min is None else act_min
    hi = qmax if act_max is None else act_max
    return np.clip(out, lo, hi).astype(t.dtype)


def dequantize(x: np.ndarray, info: OperandInfo) -> np.ndarray:
    """Real values of a quantized tensor as float32."""
    return ((x.astype(np.float32) - np.float32(info.zero_point)) * np.float32(info.scale))


def quantize(x: np.ndarray, info: OperandInfo) -> np.ndarray:
    """Real values -> quantized, rounding half away from zero and saturating."""
    qmin, qmax = qrange(info.type)
    q = _round_half_away(x.astype(np.float32) / np.float32(info.scale))
    return np.clip(q + info.zero_point, qmin, qmax).astype(info.type.dtype)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


round_half_away = _round_half_away


# ---- shapes --------------------------------------------------------------------------------

#: The most dimensions a numpy array holds (NPY_MAXDIMS): an operand of more is valid NNAPI
#: but nothing here can hold it (numpy raises ValueError, LiteRT's Python wrapper crashes the
#: process), so the analysis and the importer refuse it where its rank is first known.
MAX_RANK = 64


def rank_refusal(shape: Sequence[int] | None, what: str) -> str | None:
    """The one-line reason a shape of more than :data:`MAX_RANK` dimensions is refused."""
    if shape is None or len(shape) <= MAX_RANK:
        return None
    return f"{what} has rank {len(shape)}, more than the {MAX_RANK} dimensions an array holds"


def broadcast_shapes(a: Sequence[int] | None, b: Sequence[int] | None) -> tuple[int, ...] | None:
    """NNAPI broadcasting with 0 meaning unknown at prepare time; raises on a mismatch."""
    if a is None or b is None:
        return None
    if a == b:  # the same shape (most element-wise operations): itself, unknowns and all
        return tuple(a)
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif x == 0 or y == 0:
            out.append(0)
        else:
            raise OpError(f"shapes {tuple(a)} and {tuple(b)} are not broadcastable")
    return tuple(out)


def broadcast_static(*shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy's broadcasting of fully known shapes (0 a real zero-sized dimension), of any rank:
    ``np.broadcast_shapes`` raises RuntimeError past 32 dimensions, which a hostile file can
    reach and nothing expects; this raises ValueError on a mismatch, as numpy does."""
    n = max(map(len, shapes), default=0)
    if len(shapes) == 1 or (len(shapes) == 2 and tuple(shapes[0]) == tuple(shapes[1])):
        return tuple(shapes[0])  # (most: one input, or two of one shape)
    out = [1] * n
    for shape in shapes:
        for k, d in enumerate(shape, n - len(shape)):
            if d != 1:
                if out[k] == 1:
                    out[k] = d
                elif out[k] != d:
                    raise ValueError(f"shapes {[tuple(s) for s in shapes]} cannot be broadcast")
    return tuple(out)


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise OpError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def check_optional_axis(ctx: OpContext, index: int) -> None:
    """An optional trailing axis input (default -1) must fit input 0's rank when constant."""
    rank = ctx.inputs[0].rank
    if len(ctx.inputs) > index and rank is not None:
        v = ctx.const(index)
        if v is not None:
            ctx.require(-rank <= int(v) < rank, f"axis {int(v)} out of range for rank {rank}")


def optional_axis(ins: Sequence[object], index: int, rank: int) -> int:
    """The run-time value of an optional trailing axis input (absent or omitted: -1)."""
    axis = int(np.asarray(ins[index])) if len(ins) > index and ins[index] is not None else -1
    return normalize_axis(axis, rank)
