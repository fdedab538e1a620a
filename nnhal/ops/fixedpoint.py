"""gemmlowp-style 32-bit fixed-point primitives and transcendental functions, vectorised over
int64 arrays (the 16-bit variants used by the quantized LSTMs are in ``recurrent_fixedpoint``).

Quantized LOGISTIC, TANH, SOFTMAX and L2_NORMALIZATION evaluate these functions on int32
fixed-point values; reproducing the arithmetic bit for bit (rather than calling ``np.tanh``)
keeps results identical to upstream, not merely close. Every array holds int32 values in int64
so intermediate products never overflow; additions that the C++ code performs in int32 wrap.

Each function takes the array namespace ``xp`` (numpy by default): the XLA driver traces the
same functions with ``jax.numpy`` (64-bit types enabled) for quantized SOFTMAX, so both drivers
compute one arithmetic.

Naming: ``raw`` values are fixed-point numbers with ``integer_bits`` integer bits, so a raw
``r`` with ``k`` integer bits stands for ``r * 2**(k - 31)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nnhal.ops.common import INT32_MAX, INT32_MIN, rounding_divide_by_pot, srdhm, wrap32


def saturating_shift_left(x: np.ndarray, exponent: int, xp: Any = np) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT with a positive exponent: a clamped left shift."""
    return xp.clip(xp.asarray(x, dtype=xp.int64) << exponent, INT32_MIN, INT32_MAX)


def bit_length(v: np.ndarray, xp: Any = np) -> np.ndarray:
    """Number of significant bits of non-negative integers (0 for 0)."""
    return xp.frexp(xp.asarray(v).astype(xp.float64))[1].astype(xp.int64)


def rounding_half_sum(a: np.ndarray, b: int | np.ndarray, xp: Any = np) -> np.ndarray:
    """(a + b) / 2 rounded half away from zero, with C++ truncating division."""
    s = xp.asarray(a, dtype=xp.int64) + np.int64(b)
    t = s + xp.where(s >= 0, 1, -1)
    return xp.where(t >= 0, t >> 1, -((-t) >> 1))


def _exp_quarter_interval(a: np.ndarray, xp: Any = np) -> np.ndarray:
    """exp(a) for a in [-1/4, 0) with 0 integer bits: a Taylor series around -1/8."""
    x = wrap32(a + (1 << 28), xp)
    x2 = srdhm(x, x, xp)
    x3 = srdhm(x2, x, xp)
    x4 = srdhm(x2, x2, xp)
    x4_over_4 = rounding_divide_by_pot(x4, 2, xp)
    poly = rounding_divide_by_pot(
        wrap32(srdhm(wrap32(x4_over_4 + x3, xp), 715827883, xp) + x2, xp), 1, xp)
    exp_minus_eighth = 1895147668
    return wrap32(exp_minus_eighth + srdhm(exp_minus_eighth, wrap32(x + poly, xp), xp), xp)


# exp(-2**k) in Q0.31 for the barrel shifter over the integer part of the argument.
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a: np.ndarray, integer_bits: int, xp: Any = np) -> np.ndarray:
    """exp(a) for a <= 0 with ``integer_bits`` integer bits; the result has 0 integer bits."""
    a = xp.asarray(a, dtype=xp.int64)
    frac_bits = 31 - integer_bits
    quarter = 1 << (frac_bits - 2)
    a_mod = (a & (quarter - 1)) - quarter
    result = _exp_quarter_interval(saturating_shift_left(a_mod, integer_bits, xp), xp)
    remainder = a_mod - a
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = 1 << (frac_bits + exponent)
            result = xp.where((remainder & bit) != 0, srdhm(result, multiplier, xp), result)
    if integer_bits > 5:
        clamp = -(1 << (36 - integer_bits))
        result = xp.where(a < clamp, 0, result)
    return xp.where(a == 0, INT32_MAX, result)


def _newton_reciprocal_half(a: np.ndarray, xp: Any = np) -> np.ndarray:
    """2 / (1 + a) for a in [0, 1] (0 integer bits in), with 2 integer bits out."""
    half_denominator = rounding_half_sum(a, INT32_MAX, xp)
    x = wrap32(1515870810 + srdhm(half_denominator, -1010580540, xp), xp)
    for _ in range(3):
        one_minus = wrap32((1 << 29) - srdhm(half_denominator, x, xp), xp)
        x = wrap32(x + saturating_shift_left(srdhm(x, one_minus, xp), 2, xp), xp)
    return x


def one_over_one_plus_x(a: np.ndarray, xp: Any = np) -> np.ndarray:
    """1 / (1 + a) for a in [0, 1], 0 integer bits in and out."""
    return saturating_shift_left(_newton_reciprocal_half(a, xp), 1, xp)


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
