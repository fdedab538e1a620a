"""Numeric engines of the forward convolutions, writing into a given accumulator.

Everything here works on NHWC data in one compute dtype (float32 for float models and for
quantized models whose integer sums stay exact in float32; float64 otherwise, see
:func:`exact_dtype`). The engines only accumulate ``sum(input * filter)``: bias, activation
and requantisation are the caller's epilogue.

Temporaries (the zero-padded input, the patch matrix of a GEMM, the per-tap product of a
depthwise convolution) live in per-thread scratch buffers that grow to the largest size any
kernel asked for and are then reused by every kernel on that thread. Two executions running
at once on different threads therefore never share scratch memory, and steady-state
executions allocate none.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

#: Largest integer below which every float32 integer (and sum of them) is exact.
FLOAT32_EXACT = 1 << 24


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.flat: dict[tuple[str, str], np.ndarray] = {}


_SCRATCH = _Scratch()


def scratch(slot: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A C-contiguous array of ``shape`` carved from this thread's buffer ``slot`` (contents
    undefined). Different slots never overlap; a slot is only valid until its next use."""
    dt = np.dtype(dtype)
    size = 1
    for d in shape:
        size *= d
    key = (slot, dt.str)
    buf = _SCRATCH.flat.get(key)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1), dt)
        _SCRATCH.flat[key] = buf
    return buf[:size].reshape(shape)


def exact_dtype(terms: int, max_input: int, max_filter: int) -> type:
    """float32 when a sum of ``terms`` products of integers bounded by ``max_input`` and
    ``max_filter`` in magnitude stays below 2**24 (then every partial sum, in any order, is
    an exactly representable integer), else float64 (exact below 2**53, which 8-bit products
    never approach)."""
    return np.float32 if terms * max_input * max_filter < FLOAT32_EXACT else np.float64


def padded_input(x: np.ndarray, pads: tuple[int, int, int, int], dtype: type,
                 zero_point: int = 0) -> np.ndarray:
    """``x - zero_point`` in ``dtype``, zero-padded by (top, bottom, left, right).

    Returns ``x`` itself when nothing is to change; otherwise a scratch array whose border
    strips are zeroed and whose interior is written in one pass.
    """
    top, bottom, left, right = pads
    if top == bottom == left == right == 0 and zero_point == 0 and x.dtype == dtype:
        return x
    n, h, w, c = x.shape
    xp = scratch("pad", (n, h + top + bottom, w + left + right, c), dtype)
    if top:
        xp[:, :top] = 0
    if bottom:
        xp[:, top + h:] = 0
    if left:
        xp[:, top: top + h, :left] = 0
    if right:
        xp[:, top: top + h, left + w:] = 0
    inner = xp[:, top: top + h, left: left + w]
    if zero_point:
        np.subtract(x, dtype(zero_point), out=inner, casting="unsafe")
    else:
        np.copyto(inner, x, casting="unsafe")
    return xp


@dataclass
class ConvWeights:
    """A filter laid out for its engine, in the compute dtype.

    ``mat`` is [taps * cin, cout] for one group, [kh, kw, groups, out_per_group] when each
    group has one input channel (depthwise), else [groups, taps * cin_group, out_per_group].
    """

    groups: int
    kh: int
    kw: int
    cout: int
    mat: np.ndarray
    dtype: type
    #: depthwise filters tiled over an output width, by width (see _depthwise_flat_weights)
    tiled: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)


def conv_weights(filt: np.ndarray, groups: int, dtype: type) -> ConvWeights:
    """``filt`` is [depth_out, kh, kw, depth_group] (zero point already removed)."""
    cout, kh, kw, cg = filt.shape
    og = cout // groups
    f = filt.astype(dtype, copy=False)
    if groups == 1:
        mat = f.reshape(cout, kh * kw * cg).T
    elif cg == 1:
        mat = f.reshape(groups, og, kh, kw).transpose(2, 3, 0, 1)
    else:
        mat = f.reshape(groups, og, kh * kw * cg).transpose(0, 2, 1)
    return ConvWeights(groups, kh, kw, cout, np.ascontiguousarray(mat), dtype)


def conv_into(xp: np.ndarray, w: ConvWeights, stride: tuple[int, int],
              dilation: tuple[int, int], out: np.ndarray) -> None:
    """Accumulate the convolution of the padded input ``xp`` [N, Hp, Wp, C] into ``out``
    [N, OH, OW, depth_out] (C-contiguous, ``w.dtype``), overwriting it."""
    n, oh, ow, cout = out.shape
    c = xp.shape[3]
    sh, sw = stride
    dh, dw = dilation

    def tap(i: int, j: int) -> np.ndarray:
        return xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                  j * dw: j * dw + (ow - 1) * sw + 1: sw, :]

    taps = [(i, j) for i in range(w.kh) for j in range(w.kw)]
    g = w.groups
    if g > 1 and c == g:
        if cout == g:
            _depthwise_contract(xp, w, stride, dilation, out)
        else:
            _depthwise_into(tap, taps, w, out)
        return
    m = n * oh * ow
    if len(taps) == 1 and xp.shape[1:3] == (oh, ow) and xp.flags.c_contiguous:
        cols = xp.reshape(m, c)  # a 1x1 stride-1 convolution: the input is the patch matrix
    else:
        cols = scratch("cols", (m, len(taps) * c), w.dtype)
        view = cols.reshape(n, oh, ow, len(taps), c)
        for t, (i, j) in enumerate(taps):
            np.copyto(view[:, :, :, t, :], tap(i, j))
    out2 = out.reshape(m, cout)
    if g == 1:
        np.matmul(cols, w.mat, out=out2)
        return
    cg, og = c // g, cout // g
    grouped = cols.reshape(m, len(taps), g, cg)
    part = scratch("group", (m, len(taps), cg), w.dtype)
    for k in range(g):
        np.copyto(part, grouped[:, :, k, :])
        np.matmul(part.reshape(m, -1), w.mat[k], out=out2[:, k * og:(k + 1) * og])


def _depthwise_flat_weights(w: ConvWeights, ow: int) -> np.ndarray:
    """The depthwise filter [kh, kw, C] tiled ``ow`` times along the last axis (cached)."""
    t = w.tiled.get(ow)
    if t is None:
        t = np.ascontiguousarray(np.tile(w.mat[:, :, :, 0], (1, 1, ow)))
        w.tiled[ow] = t
    return t


def _depthwise_contract(xp: np.ndarray, w: ConvWeights, stride: tuple[int, int],
                        dilation: tuple[int, int], out: np.ndarray) -> None:
    """A depthwise convolution with one output channel per input channel as one strided-window
    contraction (every tap summed in a single pass, no temporaries).

    With a unit column stride the taps of one kernel position read ``ow * C`` consecutive
    input values of a row, so the window is viewed as [N, OH, kh, kw, OW*C] against the filter
    tiled over the output columns: the innermost loop then runs over a whole output row. Other
    strides use the [N, OH, OW, kh, kw, C] window. Both are views of ``xp`` (no copy).
    """
    n, oh, ow, c = out.shape
    sh, sw = stride
    dh, dw = dilation
    s0, s1, s2, s3 = xp.strides
    item = xp.itemsize
    if sw == 1 and s3 == item and s2 == c * item:
        win = np.lib.stride_tricks.as_strided(
            xp, shape=(n, oh, w.kh, w.kw, ow * c),
            strides=(s0, s1 * sh, s1 * dh, s2 * dw, s3), writeable=False)
        np.einsum("nhijx,ijx->nhx", win, _depthwise_flat_weights(w, ow),
                  out=out.reshape(n, oh, ow * c), optimize=False)
        return
    win = np.lib.stride_tricks.as_strided(
        xp, shape=(n, oh, ow, w.kh, w.kw, c),
        strides=(s0, s1 * sh, s2 * sw, s1 * dh, s2 * dw, s3), writeable=False)
    np.einsum("nhwijc,ijc->nhwc", win, w.mat[:, :, :, 0], out=out, optimize=False)


def _depthwise_into(tap, taps, w: ConvWeights, out: np.ndarray) -> None:
    """One input channel per group: a multiply-accumulate per filter tap, in place.

    Measured on MobileNet's layers this beats a strided-window einsum and a block-diagonal
    GEMM everywhere but the smallest (14x14 and below) layers, where all are within 20%.
    """
    n, oh, ow, cout = out.shape
    g = w.groups
    og = cout // g
    acc = out.reshape(n, oh, ow, g, og) if og > 1 else out
    tmp = scratch("tap", acc.shape, w.dtype)
    first = True
    for i, j in taps:
        src = tap(i, j)
        if og > 1:
            src = src[..., None]
            wt = w.mat[i, j]
        else:
            wt = w.mat[i, j, :, 0]
        if first:
            np.multiply(src, wt, out=acc)
            first = False
        else:
            np.multiply(src, wt, out=tmp)
            np.add(acc, tmp, out=acc)


def requantize_into(acc: np.ndarray, bias: np.ndarray, multiplier: np.ndarray,
                    shift: np.ndarray, zero_point: int, lo: int, hi: int,
                    dst: np.ndarray) -> bool:
    """The reference fixed-point requantisation of ``acc + bias`` into ``dst`` in few passes.

    ``acc`` holds exact integers below 2**24 in magnitude (a float32 accumulator of an exact
    sum), ``bias`` is int32 broadcast over the last axis, ``multiplier``/``shift`` are scalar
    or per-last-axis (see :func:`nnhal.ops.common.quantize_multiplier`). Returns False, having
    written nothing, where the fast form does not apply (a left shift, a sum that may leave
    int32, shifts too large for int64): the caller then runs the step-by-step reference.

    Why it is exact: with ``x = acc + bias`` in int32 and ``M`` the positive multiplier,
    SaturatingRoundingDoublingHighMul is ``y = floor((x*M + 2**30) / 2**31)`` for either sign
    of ``x*M`` (the reference's negative nudge ``1 - 2**30`` followed by truncation toward zero
    equals that floor), and RoundingDivideByPOT by ``e > 0`` is ``floor((y + 2**(e-1) -
    [y<0]) / 2**e)``. The rounding term and the output zero point (``zp * 2**e``) are added
    before the first shift as multiples of ``2**31``; ``y < 0`` exactly when ``x*M < -2**30``,
    i.e. ``x < 0`` (``x < -1`` when ``M == 2**30``), tested on the float32 accumulator.
    """
    mult = np.asarray(multiplier, dtype=np.int64)
    sh = np.asarray(shift, dtype=np.int64)
    if acc.dtype != np.float32 or np.any(sh > 0) or np.any(mult < 0):
        return False
    b = np.asarray(bias, dtype=np.int64)
    if b.size and int(np.abs(b).max()) + FLOAT32_EXACT > (1 << 31) - 1:
        return False
    right = -sh
    if int(right.max(initial=0)) + 31 + 9 > 62:  # room for the zero point term and the sum
        return False
    one = np.int64(1)
    # y = floor((x*M + 2**30) / 2**31) + [e > 0] * 2**(e-1) + zp * 2**e, all in one int64 pass
    # chain; the divisions by 2**31 and 2**e are arithmetic shifts (floors).
    half = np.where(right > 0, one << np.maximum(right - 1, 0), 0)
    offset = b * mult + (one << 30) + ((half + np.int64(zero_point) * (one << right)) << 31)
    # x*M + 2**30 < 0 exactly when x < t: t = 0 for M > 2**30, -1 for M == 2**30 and never
    # for M == 0; compared on the float32 accumulator as acc < t - bias (exact: every value
    # involved is an integer below 2**25 in magnitude once clipped, and |acc| < 2**24).
    t = np.where(mult > (one << 30), 0, np.where(mult == (one << 30), -1, -(one << 40)))
    t = np.where(right > 0, t, -(one << 40))  # no correction without a rounding shift
    thr = np.clip(t - b, -(1 << 25), 1 << 25).astype(np.float32)
    z = scratch("requant", acc.shape, np.int64)
    np.copyto(z, acc, casting="unsafe")
    np.multiply(z, mult, out=z)
    np.add(z, offset, out=z)
    np.right_shift(z, 31, out=z)
    neg = scratch("requant_neg", acc.shape, np.bool_)
    np.less(acc, thr, out=neg)
    np.subtract(z, neg.view(np.uint8), out=z)
    if right.ndim == 0 or bool(np.all(right == right.flat[0])):
        np.right_shift(z, int(right.flat[0]), out=z)
    else:
        np.right_shift(z, right, out=z)
    np.clip(z, lo, hi, out=dst, casting="unsafe")
    return True
