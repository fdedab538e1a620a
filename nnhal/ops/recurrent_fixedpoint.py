"""16-bit gemmlowp fixed-point arithmetic (FixedPoint<int16_t, IntegerBits>), vectorised.

The quantized LSTMs evaluate their gate nonlinearities with gemmlowp's fixed-point exp,
logistic and tanh on int16 raw values. These helpers reproduce that arithmetic bit for bit on
int64 numpy arrays that hold int16 values, including int16 wrap-around of plain additions and
the saturation of the 'saturating' primitives. A fixed-point value is passed around as its raw
array; the number of integer bits is a separate argument where it matters.
"""

from __future__ import annotations

import numpy as np

from nnhal.ops.common import rounding_divide_by_pot

I16_MIN, I16_MAX = -32768, 32767


def wrap16(x: np.ndarray) -> np.ndarray:
    """int16 two's-complement wrap-around (C++ narrowing of an int result)."""
    return ((np.asarray(x, dtype=np.int64) + 32768) & 0xFFFF) - 32768


def sat16(x: np.ndarray) -> np.ndarray:
    return np.clip(x, I16_MIN, I16_MAX)


def _trunc_div(x: np.ndarray, d: int) -> np.ndarray:
    """C++ integer division (rounds toward zero)."""
    q = np.abs(x) // d
    return np.where(x < 0, -q, q)


def srdhm16(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """SaturatingRoundingDoublingHighMul for int16: the fixed-point product."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    res = _trunc_div(ab + nudge, 1 << 15)
    return np.where((a == b) & (a == I16_MIN), I16_MAX, res)


def mul_pot16(x: np.ndarray, exponent: int) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT on int16 raw values."""
    if exponent == 0:
        return np.asarray(x, dtype=np.int64)
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (15 - exponent)) - 1
    x = np.asarray(x, dtype=np.int64)
    return np.where(x > threshold, I16_MAX, np.where(x < -threshold, I16_MIN, x << exponent))


def rescale16(x: np.ndarray, src_bits: int, dst_bits: int) -> np.ndarray:
    return mul_pot16(x, src_bits - dst_bits)


def const16(raw32: int) -> int:
    """A gemmlowp constant given as int32 raw, rescaled to int16 (rounding shift by 16)."""
    return int(rounding_divide_by_pot(np.int64(raw32), 16))


def rounding_half_sum16(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    s = np.asarray(a, dtype=np.int64) + b
    return _trunc_div(s + np.where(s >= 0, 1, -1), 2)


def saturating_add16(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    return sat16(np.asarray(a, dtype=np.int64) + b)


_ONE_F0 = I16_MAX
_EXP_M1_8 = const16(1895147668)
_ONE_THIRD = const16(715827883)
_C48_17 = const16(1515870810)
_CN32_17 = const16(-1010580540)
_BARREL = [(-2, const16(1672461947)), (-1, const16(1302514674)), (0, const16(790015084)),
           (1, const16(290630308)), (2, const16(39332535)), (3, const16(720401)),
           (4, const16(242))]


def _exp_quarter(a: np.ndarray) -> np.ndarray:
    """exp(a) for a in [-1/4, 0), Q0.15 in and out."""
    x = wrap16(a + (1 << 12))
    x2 = srdhm16(x, x)
    x3 = srdhm16(x2, x)
    x4 = srdhm16(x2, x2)
    x4_4 = mul_pot16(x4, -2)
    poly = mul_pot16(wrap16(srdhm16(wrap16(x4_4 + x3), _ONE_THIRD) + x2), -1)
    return saturating_add16(_EXP_M1_8, srdhm16(_EXP_M1_8, wrap16(x + poly)))


def exp_on_negative_values(a: np.ndarray, int_bits: int) -> np.ndarray:
    """exp(a) for a <= 0 given with int_bits integer bits; returns Q0.15."""
    frac = 15 - int_bits
    quarter = 1 << (frac - 2)
    a = np.asarray(a, dtype=np.int64)
    a_mod = wrap16((a & (quarter - 1)) - quarter)
    result = _exp_quarter(rescale16(a_mod, int_bits, 0))
    remainder = wrap16(a_mod - a)
    for exponent, mult in _BARREL:
        if int_bits > exponent:
            bit = 1 << (frac + exponent)
            result = np.where((remainder & bit) != 0, srdhm16(result, mult), result)
    if int_bits > 5:
        clamp = const16(-(1 << (36 - int_bits)))
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, _ONE_F0, result)


def _newton_reciprocal(a: np.ndarray) -> np.ndarray:
    """x ~= 1 / ((1 + a) / 2) in Q2.13 after three Newton-Raphson steps."""
    half_den = rounding_half_sum16(a, _ONE_F0)
    x = wrap16(_C48_17 + srdhm16(half_den, _CN32_17))
    one_f2 = 1 << 13
    for _ in range(3):
        t = wrap16(one_f2 - srdhm16(half_den, x))
        x = wrap16(x + rescale16(srdhm16(x, t), 4, 2))
    return x


def one_over_one_plus_x(a: np.ndarray) -> np.ndarray:
    return rescale16(_newton_reciprocal(a), 1, 0)


def one_minus_x_over_one_plus_x(a: np.ndarray) -> np.ndarray:
    return rescale16(wrap16(_newton_reciprocal(a) - (1 << 13)), 2, 0)


def logistic16(a: np.ndarray, int_bits: int) -> np.ndarray:
    """gemmlowp::logistic: Q(int_bits) int16 in, Q0.15 out."""
    a = np.asarray(a, dtype=np.int64)
    pos = a > 0
    abs_in = np.where(pos, a, wrap16(-a))
    r_pos = one_over_one_plus_x(exp_on_negative_values(wrap16(-abs_in), int_bits))
    r_neg = wrap16(_ONE_F0 - r_pos)
    return np.where(a == 0, 1 << 14, np.where(pos, r_pos, r_neg))


def tanh16(a: np.ndarray, int_bits: int) -> np.ndarray:
    """gemmlowp::tanh: Q(int_bits) int16 in, Q0.15 out."""
    a = np.asarray(a, dtype=np.int64)
    neg = a < 0
    n = np.where(neg, a, wrap16(-a))
    t = one_minus_x_over_one_plus_x(exp_on_negative_values(n, int_bits + 1))
    return np.where(a == 0, 0, np.where(neg, wrap16(-t), t))
