"""LSH_PROJECTION: locality-sensitive hashing of the input rows into a bit vector.

Each bit is the sign of sum_i weight[i] * fingerprint64(seed || row_i) where seed is the
hash-function coefficient as float32 bytes and row_i the raw bytes of input row i. The
fingerprint is FarmHash's Fingerprint64 (the farmhashna 64-bit hash), implemented here from
the published algorithm and vectorised over all (seed, row) keys, which share one length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops.lstm import expect_rank_if_given, value_given, with_required
from nnhal.ops.resolver import OpContext, OperationDef, OpError, Shape, elements, register, visits
from nnhal.ops.signature import V1_0, V1_2, Slot, sig, variants

T = OperandType

SPARSE_DEPRECATED, DENSE, SPARSE = 1, 2, 3

# "H": the hash functions' (and weights') float type; "T": the input, of any supported type.
_INPUT_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM)
LSH_PROJECTION_SIGNATURE = sig(
    OperationType.LSH_PROJECTION,
    [Slot("hash_functions", "H", doc="[num_hash, num_bits]"), Slot("input", "T"),
     Slot("weight", "H", omittable=True, doc="one per input row; 1.0 when omitted"),
     Slot("type", T.INT32, doc="1 sparse (legacy), 2 dense, 3 sparse")],
    [Slot("output", T.TENSOR_INT32)],
    [*variants(V1_0, *({"H": T.TENSOR_FLOAT32, "T": t} for t in _INPUT_TYPES)),
     *variants(V1_2, {"H": T.TENSOR_FLOAT32, "T": T.TENSOR_FLOAT16},
               *({"H": T.TENSOR_FLOAT16, "T": t} for t in (T.TENSOR_FLOAT16, *_INPUT_TYPES)))],
    doc="locality-sensitive hashing of the input rows")

SIGNATURES = [LSH_PROJECTION_SIGNATURE]

_U = np.uint64
_K0 = _U(0xC3A5C85C97CB3127)
_K1 = _U(0xB492B66FBE98F273)
_K2 = _U(0x9AE16A3B2F90404F)


# ---- FarmHash Fingerprint64 over rows of equal-length keys --------------------------------------

def _fetch64(keys: np.ndarray, off: int) -> np.ndarray:
    return np.ascontiguousarray(keys[:, off:off + 8]).view("<u8")[:, 0].astype(_U)


def _fetch32(keys: np.ndarray, off: int) -> np.ndarray:
    return np.ascontiguousarray(keys[:, off:off + 4]).view("<u4")[:, 0].astype(_U)


def _rot(v: np.ndarray, s: int) -> np.ndarray:
    if s == 0:
        return v
    return (v >> _U(s)) | (v << _U(64 - s))


def _shift_mix(v: np.ndarray) -> np.ndarray:
    return v ^ (v >> _U(47))


def _len16(u: np.ndarray, v: np.ndarray, mul: np.ndarray | np.uint64) -> np.ndarray:
    a = (u ^ v) * mul
    a ^= a >> _U(47)
    b = (v ^ a) * mul
    b ^= b >> _U(47)
    return b * mul


def _weak32(keys: np.ndarray, off: int, a: np.ndarray, b: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    w, x = _fetch64(keys, off), _fetch64(keys, off + 8)
    y, z = _fetch64(keys, off + 16), _fetch64(keys, off + 24)
    a = a + w
    b = _rot(b + a + z, 21)
    c = a
    a = a + x + y
    b = b + _rot(a, 44)
    return a + z, b + c


def fingerprint64(keys: np.ndarray) -> np.ndarray:
    """Fingerprint64 of each row of a uint8 matrix [n, length]; returns uint64 [n]."""
    n, length = keys.shape
    ln = _U(length)
    if length <= 16:
        if length >= 8:
            mul = _K2 + ln * _U(2)
            a = _fetch64(keys, 0) + _K2
            b = _fetch64(keys, length - 8)
            c = _rot(b, 37) * mul + a
            d = (_rot(a, 25) + b) * mul
            return _len16(c, d, mul)
        if length >= 4:
            mul = _K2 + ln * _U(2)
            a = _fetch32(keys, 0)
            return _len16(ln + (a << _U(3)), _fetch32(keys, length - 4), mul)
        if length > 0:
            a = keys[:, 0].astype(_U)
            b = keys[:, length >> 1].astype(_U)
            c = keys[:, length - 1].astype(_U)
            y = a + (b << _U(8))
            z = ln + (c << _U(2))
            return _shift_mix(y * _K2 ^ z * _K0) * _K2
        return np.full(n, _K2, dtype=_U)
    if length <= 32:
        mul = _K2 + ln * _U(2)
        a = _fetch64(keys, 0) * _K1
        b = _fetch64(keys, 8)
        c = _fetch64(keys, length - 8) * mul
        d = _fetch64(keys, length - 16) * _K2
        return _len16(_rot(a + b, 43) + _rot(c, 30) + d, a + _rot(b + _K2, 18) + c, mul)
    if length <= 64:
        mul = _K2 + ln * _U(2)
        a = _fetch64(keys, 0) * _K2
        b = _fetch64(keys, 8)
        c = _fetch64(keys, length - 8) * mul
        d = _fetch64(keys, length - 16) * _K2
        y = _rot(a + b, 43) + _rot(c, 30) + d
        z = _len16(y, a + _rot(b + _K2, 18) + c, mul)
        e = _fetch64(keys, 16) * mul
        f = _fetch64(keys, 24)
        g = (y + _fetch64(keys, length - 32)) * mul
        h = (z + _fetch64(keys, length - 24)) * mul
        return _len16(_rot(e + f, 43) + _rot(g, 30) + h, e + _rot(f + a, 18) + g, mul)
    return _long_hash(keys)


def _long_hash(keys: np.ndarray) -> np.ndarray:
    n, length = keys.shape
    seed = 81
    zeros = np.zeros(n, dtype=_U)
    x = zeros + _U(seed)
    y = zeros + _U((seed * int(_K1) + 113) % 2**64)
    z = _shift_mix(y * _K2 + _U(113)) * _K2
    v0, v1, w0, w1 = zeros, zeros, zeros, zeros
    x = x * _K2 + _fetch64(keys, 0)
    end = ((length - 1) // 64) * 64
    last64 = end + ((length - 1) & 63) - 63
    pos = 0
    while True:
        x = _rot(x + y + v0 + _fetch64(keys, pos + 8), 37) * _K1
        y = _rot(y + v1 + _fetch64(keys, pos + 48), 42) * _K1
        x ^= w1
        y = y + v0 + _fetch64(keys, pos + 40)
        z = _rot(z + w0, 33) * _K1
        v0, v1 = _weak32(keys, pos, v1 * _K1, x + w0)
        w0, w1 = _weak32(keys, pos + 32, z + w1, y + _fetch64(keys, pos + 16))
        z, x = x, z
        pos += 64
        if pos == end:
            break
    mul = _K1 + ((z & _U(0xFF)) << _U(1))
    pos = last64
    w0 = w0 + _U((length - 1) & 63)
    v0 = v0 + w0
    w0 = w0 + v0
    x = _rot(x + y + v0 + _fetch64(keys, pos + 8), 37) * mul
    y = _rot(y + v1 + _fetch64(keys, pos + 48), 42) * mul
    x ^= w1 * _U(9)
    y = y + v0 * _U(9) + _fetch64(keys, pos + 40)
    z = _rot(z + w0, 33) * mul
    v0, v1 = _weak32(keys, pos, v1 * mul, x + w0)
    w0, w1 = _weak32(keys, pos + 32, z + w1, y + _fetch64(keys, pos + 16))
    z, x = x, z
    return _len16(_len16(v0, w0, mul) + _shift_mix(y) * _K0 + z,
                  _len16(v1, w1, mul) + x, mul)


# ---- the operation ---------------------------------------------------------------------------

def projection_bits(hash_seeds: np.ndarray, x: np.ndarray, weight: np.ndarray | None
                    ) -> np.ndarray:
    """Sign bits [num_hash, num_bits] of the weighted fingerprint sums."""
    seeds = hash_seeds.astype(np.float32).reshape(-1)
    rows = x.shape[0] if x.ndim else 1
    if rows == 0 or seeds.size == 0:
        return np.zeros(hash_seeds.shape, dtype=np.int32)
    row_bytes = np.ascontiguousarray(x).view(np.uint8).reshape(rows, -1)
    seed_bytes = seeds.view(np.uint8).reshape(-1, 4)
    keys = np.concatenate([np.repeat(seed_bytes, rows, axis=0),
                           np.tile(row_bytes, (seeds.size, 1))], axis=1)
    with np.errstate(over="ignore"):
        h = fingerprint64(keys).view(np.int64).astype(np.float64).reshape(seeds.size, rows)
    if weight is not None:
        h = h * weight.astype(np.float64)
    score = np.cumsum(h, axis=1)[:, -1]  # sequential, like the reference loop
    return (score > 0).astype(np.int32).reshape(hash_seeds.shape)


@register(OperationType.LSH_PROJECTION)
class LshProjection(OperationDef):
    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Every hash function and bit hashes the whole input."""
        return visits(ctx, outputs) + elements(ctx.inputs[0].shape) * \
            elements(ctx.inputs[1].shape)

    def validate(self, ctx: OpContext) -> None:
        ctx.expect_rank(0, 2)
        expect_rank_if_given(ctx, 2, 1)
        x = ctx.inputs[1]
        ctx.require(x.rank is None or x.rank >= 1, "input must have rank >= 1")
        num_hash, num_bits = ctx.dim(0, 0), ctx.dim(0, 1)
        ctx.require(num_bits is None or num_bits <= 32, "at most 32 bits per hash function")
        kind = ctx.const_int(3)
        if kind is not None:
            ctx.require(kind in (SPARSE_DEPRECATED, DENSE, SPARSE), f"invalid type {kind}")
            if kind == SPARSE and num_hash and num_bits:
                ctx.require(num_bits + math.ceil(math.log2(num_hash)) <= 32,
                            "sparse signatures do not fit in 32 bits")
            if kind == DENSE:
                ctx.require(ctx.has_value(2), "dense projection needs weights")

    def prepare(self, ctx: OpContext):
        kind = ctx.const_int(3)
        num_hash, num_bits = ctx.dim(0, 0) or 0, ctx.dim(0, 1) or 0
        if kind is None:
            return [(0,)]
        return [(num_hash * num_bits,) if kind == DENSE else (num_hash,)]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            seeds, x = ins[0], ins[1]
            weight = ins[2] if value_given(ins[2]) else None
            kind = int(ins[3])
            if seeds.ndim != 2 or seeds.shape[1] > 32:
                raise OpError("hash tensor must be 2-D with at most 32 bits per function")
            if x.ndim < 1:
                raise OpError("input must have rank >= 1")
            if weight is not None and weight.shape != (x.shape[0],):
                raise OpError("weight must have one value per input row")
            num_hash, num_bits = seeds.shape
            if kind == DENSE:
                if weight is None:
                    raise OpError("dense projection needs weights")
                return [projection_bits(seeds, x, weight).reshape(-1)]
            if kind not in (SPARSE, SPARSE_DEPRECATED):
                raise OpError(f"invalid projection type {kind}")
            bits = projection_bits(seeds, x, weight).astype(np.int64)
            powers = np.left_shift(np.int64(1), np.arange(num_bits - 1, -1, -1, dtype=np.int64))
            sig = bits @ powers if num_bits else np.zeros(num_hash, dtype=np.int64)
            if kind == SPARSE:
                sig = sig + np.arange(num_hash, dtype=np.int64) * (np.int64(1) << num_bits)
            return [((sig + 2**31) % 2**32 - 2**31).astype(np.int32)]

        return with_required(run, LSH_PROJECTION_SIGNATURE, len(ctx.inputs))
