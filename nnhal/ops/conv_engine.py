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

from nnhal.ops.common import INT32_MAX, activation_into, bias_activation_into

#: Largest integer below which every float32 integer (and sum of them) is exact.
FLOAT32_EXACT = 1 << 24


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.flat: dict[tuple[str, str], np.ndarray] = {}
        #: data addresses of the buffers in ``flat`` (for the native kernels)
        self.addr: dict[tuple[str, str], int] = {}


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
        _SCRATCH.addr.pop(key, None)
    return buf[:size].reshape(shape)


def scratch_address(slot: str, size: int, dtype: np.dtype | type) -> int:
    """The data address of this thread's buffer ``slot`` holding at least ``size`` elements
    (what :func:`scratch` would carve from), without making an array view."""
    key = (slot, np.dtype(dtype).str)
    buf = _SCRATCH.flat.get(key)
    if buf is not None and buf.size >= size:
        addr = _SCRATCH.addr.get(key)
        if addr is None:
            addr = _SCRATCH.addr[key] = buf.ctypes.data
        return addr
    scratch(slot, (size,), dtype)
    addr = _SCRATCH.addr[key] = _SCRATCH.flat[key].ctypes.data
    return addr


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
    #: the largest magnitude of one output's sum (quantized filters; None: not known)
    bound: int | None = None
    #: depthwise filters tiled over an output width, by width (see _depthwise_flat_weights)
    tiled: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)


def conv_weights(filt: np.ndarray, groups: int, dtype: type,
                 bound: int | None = None) -> ConvWeights:
    """``filt`` is [depth_out, kh, kw, depth_group] (zero point already removed); ``bound``
    as :attr:`ConvWeights.bound`."""
    cout, kh, kw, cg = filt.shape
    og = cout // groups
    f = filt.astype(dtype, copy=False)
    if groups == 1:
        mat = f.reshape(cout, kh * kw * cg).T
    elif cg == 1:
        mat = f.reshape(groups, og, kh, kw).transpose(2, 3, 0, 1)
    else:
        mat = f.reshape(groups, og, kh * kw * cg).transpose(0, 2, 1)
    return ConvWeights(groups, kh, kw, cout, np.ascontiguousarray(mat), dtype, bound)


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
    elif g == 1 and c < _COLS_T_MAX_C:
        # Few input channels (an image): gather the patch matrix transposed, [taps * C, M],
        # one row of OH*OW values per (tap, channel): each copy's inner loop runs along an
        # output row instead of over C values; the GEMM reads the transpose in place.
        cols_t = scratch("cols_t", (len(taps), c, n, oh, ow), w.dtype)
        xt = xp.transpose(3, 0, 1, 2)
        for t, (i, j) in enumerate(taps):
            np.copyto(cols_t[t], xt[:, :, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                                     j * dw: j * dw + (ow - 1) * sw + 1: sw])
        np.matmul(cols_t.reshape(len(taps) * c, m).T, w.mat, out=out.reshape(m, cout))
        return
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


#: Below this many input channels a convolution's patch matrix is gathered transposed.
_COLS_T_MAX_C = 8
#: Up to this many channels a strided depthwise convolution splits its input into column
#: phases (the per-position window einsum's inner loop over C channels is too short).
_PHASE_MAX_C = 32


def _depthwise_flat_weights(w: ConvWeights, ow: int, phase: int = 0,
                            step: int = 1) -> np.ndarray:
    """The depthwise filter columns ``phase::step`` [kh, kw', C] tiled ``ow`` times along the
    last axis (cached)."""
    key = (ow, phase, step)
    t = w.tiled.get(key)
    if t is None:
        t = np.ascontiguousarray(np.tile(w.mat[:, phase::step, :, 0], (1, 1, ow)))
        w.tiled[key] = t
    return t


def _flat_window(src: np.ndarray, oh: int, kh: int, kw: int, ow: int, sh: int,
                 dh: int) -> np.ndarray:
    """[N, OH, kh, kw, OW*C] view of a C-contiguous-rows ``src`` [N, H, W, C]: taps of one
    kernel position at unit column stride read ``ow * C`` consecutive values of a row."""
    s0, s1, s2, s3 = src.strides
    return np.lib.stride_tricks.as_strided(
        src, shape=(src.shape[0], oh, kh, kw, ow * src.shape[3]),
        strides=(s0, s1 * sh, s1 * dh, s2, s3), writeable=False)


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
    if sw > 1 and dw == 1 and c <= _PHASE_MAX_C and out.flags.c_contiguous:
        # Column phases: tap j at output column x reads input column j + sw*x, i.e. column
        # j // sw + x of phase j % sw (the input's columns p::sw, copied contiguous). Each
        # phase is then a unit-stride window contraction over whole output rows.
        first = True
        flat = out.reshape(n, oh, ow * c)
        for p in range(min(sw, w.kw)):
            kq = len(range(p, w.kw, sw))
            ph = scratch(f"phase{p}", (n, xp.shape[1], len(range(p, xp.shape[2], sw)), c),
                         w.dtype)
            np.copyto(ph, xp[:, :, p::sw])
            dst = flat if first else scratch("phase_acc", flat.shape, w.dtype)
            np.einsum("nhijx,ijx->nhx", _flat_window(ph, oh, w.kh, kq, ow, sh, dh),
                      _depthwise_flat_weights(w, ow, p, sw), out=dst, optimize=False)
            if not first:
                np.add(flat, dst, out=flat)
            first = False
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


#: Magnitude below which every multiple of 2**-31 is an exact float64 (2**22 * 2**31 = 2**53).
_U_EXACT = 1 << 22
#: Length range of the inner loop of a tiled epilogue pass (elements).
_TILE_MIN, _TILE_MAX = 2048, 16384


def _tile_factor(rows: int, cout: int) -> int:
    """How many rows of an [rows, cout] array one pass of the epilogue treats as a single row
    against per-channel tables tiled that many times (a divisor ``k`` of ``rows``).

    Long inner loops (``k * cout`` of a few thousand elements) instead of one short loop per
    row; among those, lengths that are not a multiple of 256 elements: measured here, rows
    whose byte length is a multiple of 2 KiB keep the table and the data at one fixed offset
    modulo 4 KiB, and some offsets run 4-8x slower (store/load address aliasing).
    """
    best, best_score = 1, (-1, 0)
    for k in range(1, min(rows, _TILE_MAX // max(cout, 1)) + 1):
        if rows % k:
            continue
        n = k * cout
        score = (int(n >= _TILE_MIN) + int(n % 256 != 0), n)
        if score > best_score:
            best, best_score = k, score
    return best


def float_epilogue_into(acc: np.ndarray, bias: np.ndarray | None, code: int,
                        tiles: dict | None = None) -> None:
    """Add ``bias`` (per last-axis channel) and clamp for the fused activation ``code``, in
    place on the float accumulator ``acc``.

    A C-contiguous ``acc`` with few channels is treated as rows of ``k * C`` values against
    the bias tiled ``k`` times (see :func:`_tile_factor`): one long inner loop per pass instead
    of one of C values per output position (measured on a 112x112x16 depthwise output: add +
    RELU6 140 -> 75 us). ``tiles`` caches the tiled bias by ``k`` when the bias is constant.
    """
    c = acc.shape[-1] if acc.ndim else 1
    if bias is None or acc.ndim < 2 or c == 0 or not acc.flags.c_contiguous \
            or c >= _TILE_MIN or bias.shape != (c,):
        bias_activation_into(acc, bias, code)
        return
    rows = acc.size // c
    k = _tile_factor(rows, c)
    key = (k, acc.dtype.str)
    bt = tiles.get(key) if tiles is not None else None
    if bt is None:
        bt = np.tile(bias.astype(acc.dtype, copy=False), k)
        if tiles is not None:
            tiles[key] = bt
    flat = acc.reshape(rows // k, k * c)
    np.add(flat, bt, out=flat)
    activation_into(flat, code)


@dataclass
class _FloatRoute:
    """Per-channel tables of the float64 requantisation for one bias and one clamp."""

    scale: np.ndarray  # float64: acc -> w
    offset: np.ndarray  # float64: added to w
    threshold: np.ndarray | None  # acc < threshold: the reference's y < 0 (sign route only)
    post: np.ndarray | None  # float64 2**-e applied after the sign correction (sign route only)
    lo: float  # clamp of w, in the shifted units (0 <= lo <= hi <= 255)
    hi: float
    off: int  # added back (mod 256) after the cast: min(lo, 0)
    tiles: dict = field(default_factory=dict, repr=False)

    def tiled(self, k: int, acc_dtype: np.dtype) -> tuple:
        key = (k, acc_dtype.str)
        t = self.tiles.get(key)
        if t is None:
            t = (np.tile(self.scale, k), np.tile(self.offset, k),
                 None if self.threshold is None else np.tile(self.threshold, k).astype(acc_dtype),
                 None if self.post is None else np.tile(self.post, k))
            self.tiles[key] = t
        return t


def _float_route(mult: np.ndarray, right: np.ndarray, bias: np.ndarray, zero_point: int,
                 lo: int, hi: int) -> _FloatRoute | None:
    """The tables of :class:`Requantizer`'s float64 route, or None where it is not exact.

    ``mult``, ``right`` (the right shift ``e = -shift >= 0``) and ``bias`` are int64 per
    output channel. See :class:`Requantizer` for the derivation and the bound checked here.
    """
    if (right < 0).any() or (mult < 0).any() or (mult >= 1 << 31).any() or not lo <= hi:
        return None
    if (right > 12).any() or (np.abs(bias) + (np.int64(1) << (right + 10)) + 2 >= _U_EXACT).any():
        return None
    off = min(lo, 0)
    one = np.int64(1)
    half = np.where(right > 0, one << np.maximum(right - 1, 0), 0)
    pot = (one << right).astype(np.float64)
    # w = (acc * M + bias * M + 2**30) / 2**31 + h + (zp - off) * 2**e: every term a multiple
    # of 2**-31 below 2**22 in magnitude (bias * M < 2**52 converts exactly).
    offset = ((bias * mult + (one << 30)).astype(np.float64) / float(1 << 31)
              + half.astype(np.float64) + float(zero_point - off) * pot)
    scale = mult.astype(np.float64) / float(1 << 31)
    sign = lo < zero_point and bool((right > 0).any())
    if sign:
        # y < 0 exactly when x * M + 2**30 < 0, i.e. x < T with T = -floor(2**30 / M); only
        # channels that round (e > 0) correct it. Compared on acc: acc < T - bias.
        t = np.where(mult > 0, -((one << 30) // np.maximum(mult, 1)), -(one << 40))
        t = np.where(right > 0, t, -(one << 40))
        threshold = np.clip(t - bias, -(1 << 25), 1 << 25).astype(np.float64)
        return _FloatRoute(scale, offset, threshold, 1.0 / pot, float(lo - off),
                           float(hi - off), off)
    return _FloatRoute(scale / pot, offset / pot, None, None, float(lo - off), float(hi - off),
                       off)


class Requantizer:
    """The reference fixed-point requantisation (MultiplyByQuantizedMultiplier with a right
    shift, plus the output zero point, then the activation clamp) of an exact integer
    accumulator plus an int32 bias into an 8-bit output, mostly in float64 passes.

    With ``x = acc + bias``, ``M`` the multiplier and ``e`` the right shift, the reference is
    ``y = floor((x*M + 2**30) / 2**31)`` (SaturatingRoundingDoublingHighMul, see
    :func:`requantize_into`) then ``z = floor((y + h - [y < 0]) / 2**e)`` with ``h = 2**(e-1)``
    (``h = 0`` and no correction when ``e = 0``), and ``clamp(z + zp, lo, hi)``. The two floors
    nest into one: ``z = floor(w / 2**e)`` with ``w = (x*M + 2**30) / 2**31 + h - [y < 0]``.

    float64 route: ``w`` is a multiple of ``2**-31``, so it is exact in float64 while below
    ``2**22`` in magnitude. Only accumulators whose result lands within a step of the clamp
    range need that: the computed ``w`` is a non-decreasing function of ``acc`` (a product by
    a positive constant, a sum and a subtraction of the non-increasing ``[y < 0]`` are all
    monotone under rounding), so every accumulator beyond the last exact one below the range
    (or the first above it) clamps the same way. Those have ``|w| <= 2**(e+9)``; requiring
    ``|bias| + 2**(e+10) + 2 < 2**22`` bounds every term of ``w`` below ``2**22``. The value is
    shifted by ``-min(lo, 0)`` so the clamped result is non-negative, where the float -> uint8
    cast (truncation) is the floor; the shift is added back modulo 256 in the output's bytes.
    The correction ``[y < 0]`` only matters for results below the zero point: when the clamp
    starts at ``zp`` or above (a fused RELU), it is dropped and the ``2**-e`` is folded into
    the multiplier, leaving a multiply, an add, the clamp and the cast.

    Cases the bound excludes (a left shift, ``e > 12``, a bias beyond about 2**21) fall back to
    :func:`requantize_into`'s int64 passes; :meth:`into` returns False when neither applies.
    Tables are cached per bias values and clamp; safe to share between threads (scratch is
    per thread, caches are replaced whole).
    """

    def __init__(self, multiplier: np.ndarray, shift: np.ndarray, zero_point: int):
        self.multiplier = np.asarray(multiplier, dtype=np.int64)
        self.shift = np.asarray(shift, dtype=np.int64)
        self.zero_point = int(zero_point)
        self._cache: tuple[np.ndarray, dict] | None = None

    def _route(self, bias: np.ndarray, cout: int, lo: int, hi: int) -> _FloatRoute | None:
        cache = self._cache
        if cache is None or cache[0].shape != bias.shape or not np.array_equal(cache[0], bias):
            cache = (np.array(bias, copy=True), {})
            self._cache = cache
        key = (lo, hi, cout)
        if key in cache[1]:
            return cache[1][key]
        mult = np.broadcast_to(self.multiplier, (cout,))
        right = np.broadcast_to(-self.shift, (cout,))
        b = np.broadcast_to(np.asarray(bias, dtype=np.int64), (cout,))
        route = _float_route(mult, right, b, self.zero_point, lo, hi)
        cache[1][key] = route
        return route

    def into(self, acc: np.ndarray, bias: np.ndarray, lo: int, hi: int,
             dst: np.ndarray, bound: int | None = None) -> bool:
        """Requantise ``acc + bias`` into ``dst`` (an 8-bit array of ``acc``'s shape, any
        layout); False, having written nothing, when neither fast route is exact.

        ``bound`` is the largest ``|acc|`` possible (None: unknown; a float32 accumulator is
        below 2**24 whatever it says). Both routes assume ``acc + bias`` stays in int32, where
        the reference's int32 accumulator does not wrap: the float64 route (whose bias is
        below 2**22) runs only where ``bound + 2**22`` is in int32."""
        if dst.dtype.itemsize != 1 or acc.dtype not in (np.float32, np.float64) or acc.ndim < 1:
            return False
        cout = acc.shape[-1]
        route = None
        if acc.dtype == np.float32:
            bound = FLOAT32_EXACT
        if acc.flags.c_contiguous and cout > 0 and self.multiplier.size in (1, cout) \
                and bound is not None and bound + _U_EXACT <= INT32_MAX:
            route = self._route(bias, cout, lo, hi)
        if route is None:
            return requantize_into(acc, bias, self.multiplier, self.shift, self.zero_point,
                                   lo, hi, dst)
        rows = acc.size // cout
        k = _tile_factor(rows, cout)
        scale, offset, threshold, post = route.tiled(k, acc.dtype)
        accT = acc.reshape(rows // k, k * cout)
        w = scratch("requant_f64", acc.shape, np.float64)
        wT = w.reshape(accT.shape)
        np.copyto(wT, accT)
        np.multiply(wT, scale, out=wT)
        np.add(wT, offset, out=wT)
        if threshold is not None:
            neg = scratch("requant_neg", accT.shape, np.float64)
            np.less(accT, threshold, out=neg, casting="unsafe")  # 1.0 where y < 0
            np.subtract(wT, neg, out=wT)
            np.multiply(wT, post, out=wT)
        np.clip(w, route.lo, route.hi, out=w)
        out = dst.view(np.uint8)
        np.copyto(out, w, casting="unsafe")
        if route.off:
            np.add(out, np.uint8(route.off % 256), out=out)
        return True


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
