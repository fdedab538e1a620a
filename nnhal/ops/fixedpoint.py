"""gemmlowp-style 32-bit fixed-point primitives and transcendental functions, vectorised over
int64 arrays (the 16-bit variants used by the quantized LSTMs are in ``recurrent_fixedpoint``).

Quantized LOGISTIC, TANH, SOFTMAX and L2_NORMALIZATION evaluate these functions on int32
fixed-point values; reproducing the arithmetic bit for bit (rather than calling ``np.tanh``)
keeps results identical to upstream, not merely close. Every array holds int32 values in int64
so intermediate products never overflow; additions that the C++ code performs in int32 wrap.

Naming: ``raw`` values are fixed-point numbers with ``integer_bits`` integer bits, so a raw
``r`` with ``k`` integer bits stands for ``r * 2**(k - 31)``.
"""

from __future__ import annotations

import numpy as np

from nnhal.ops.common import INT32_MAX, INT32_MIN, rounding_divide_by_pot, srdhm


def wrap32(x: np.ndarray) -> np.ndarray:
    """Two's-complement int32 wrap-around of int64 values (C++ int32 addition)."""
    return ((np.asarray(x, dtype=np.int64) + (1 << 31)) & 0xFFFF_FFFF) - (1 << 31)


def saturating_shift_left(x: np.ndarray, exponent: int) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT with a positive exponent: a clamped left shift."""
    return np.clip(np.asarray(x, dtype=np.int64) << exponent, INT32_MIN, INT32_MAX)


def bit_length(v: np.ndarray) -> np.ndarray:
    """Number of significant bits of non-negative integers (0 for 0)."""
    return np.frexp(np.asarray(v).astype(np.float64))[1].astype(np.int64)


def rounding_half_sum(a: np.ndarray, b: int | np.ndarray) -> np.ndarray:
    """(a + b) / 2 rounded half away from zero, with C++ truncating division."""
    s = np.asarray(a, dtype=np.int64) + np.int64(b)
    t = s + np.where(s >= 0, 1, -1)
    return np.where(t >= 0, t >> 1, -((-t) >> 1))


def _exp_quarter_interval(a: np.ndarray) -> np.ndarray:
    """exp(a) for a in [-1/4, 0) with 0 integer bits: a Taylor series around -1/8."""
    x = wrap32(a + (1 << 28))
    x2 = srdhm(x, x)
    x3 = srdhm(x2, x)
    x4 = srdhm(x2, x2)
    x4_over_4 = rounding_divide_by_pot(x4, 2)
    poly = rounding_divide_by_pot(wrap32(srdhm(wrap32(x4_over_4 + x3), 715827883) + x2), 1)
    exp_minus_eighth = 1895147668
    return wrap32(exp_minus_eighth + srdhm(exp_minus_eighth, wrap32(x + poly)))


# exp(-2**k) in Q0.31 for the barrel shifter over the integer part of the argument.
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a: np.ndarray, integer_bits: int) -> np.ndarray:
    """exp(a) for a <= 0 with ``integer_bits`` integer bits; the result has 0 integer bits."""
    a = np.asarray(a, dtype=np.int64)
    frac_bits = 31 - integer_bits
    quarter = 1 << (frac_bits - 2)
    a_mod = (a & (quarter - 1)) - quarter
    result = _exp_quarter_interval(saturating_shift_left(a_mod, integer_bits))
    remainder = a_mod - a
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = np.int64(1) << (frac_bits + exponent)
            result = np.where((remainder & bit) != 0, srdhm(result, multiplier), result)
    if integer_bits > 5:
        clamp = -(1 << (36 - integer_bits))
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, INT32_MAX, result)


def _newton_reciprocal_half(a: np.ndarray) -> np.ndarray:
    """2 / (1 + a) for a in [0, 1] (0 integer bits in), with 2 integer bits out."""
    half_denominator = rounding_half_sum(a, INT32_MAX)
    x = wrap32(1515870810 + srdhm(half_denominator, -1010580540))
    for _ in range(3):
        one_minus = wrap32((1 << 29) - srdhm(half_denominator, x))
        x = wrap32(x + saturating_shift_left(srdhm(x, one_minus), 2))
    return x


def one_over_one_plus_x(a: np.ndarray) -> np.ndarray:
    """1 / (1 + a) for a in [0, 1], 0 integer bits in and out."""
    return saturating_shift_left(_newton_reciprocal_half(a), 1)


def one_minus_x_over_one_plus_x(a: np.ndarray) -> np.ndarray:
    """(1 - a) / (1 + a) for a in [0, 1], 0 integer bits in and out."""
    return saturating_shift_left(wrap32(_newton_reciprocal_half(a) - (1 << 29)), 2)


def logistic(a: np.ndarray, integer_bits: int) -> np.ndarray:
    """1 / (1 + exp(-a)); the input has ``integer_bits`` integer bits, the result 0."""
    a = np.asarray(a, dtype=np.int64)
    positive = a > 0
    neg_abs = np.where(positive, -a, a)
    on_positive = one_over_one_plus_x(exp_on_negative_values(neg_abs, integer_bits))
    result = np.where(positive, on_positive, wrap32(INT32_MAX - on_positive))
    return np.where(a == 0, 1 << 30, result)


def tanh(a: np.ndarray, integer_bits: int) -> np.ndarray:
    """tanh(a); the input has ``integer_bits`` integer bits, the result 0."""
    a = np.asarray(a, dtype=np.int64)
    negative = a < 0
    neg_abs = np.where(negative, a, -a)
    # exp(2 * neg_abs): doubling the value is reinterpreting it with one more integer bit.
    t = one_minus_x_over_one_plus_x(exp_on_negative_values(neg_abs, integer_bits + 1))
    result = np.where(negative, -t, t)
    return np.where(a == 0, 0, result)
