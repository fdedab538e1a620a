"""2-D pooling: AVERAGE_POOL_2D, MAX_POOL_2D and L2_POOL_2D.

All three share one parameter layout (explicit or implicit padding, optional NCHW flag) and
one window walk. Windows only count the input pixels they cover, never the padding, as the
TFLite kernels that the upstream CPU driver runs do. Quantized average pooling averages the
stored integers (input and output share scale and zero point) with integer rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.lib.stride_tricks import as_strided

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.resolver import OpContext, OperationDef, OpError, Shape, elements, register, visits
from nnhal.ops.signature import V1_0, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

PADDING_NONE, PADDING_SAME, PADDING_VALID = 0, 1, 2

_INPUT = Slot("input", "T", doc="4-D, [batches, height, width, depth]")
_WINDOW = [Slot("stride_w", T.INT32), Slot("stride_h", T.INT32), Slot("filter_w", T.INT32),
           Slot("filter_h", T.INT32), Slot("activation", T.INT32, doc="fused activation")]
#: Absent or omitted: NHWC.
_NCHW = Slot("nchw", T.BOOL, optional=True, omittable=True, since=V1_2, doc="NCHW data layout")
_FORMS = {
    "explicit": [_INPUT, Slot("pad_left", T.INT32), Slot("pad_right", T.INT32),
                 Slot("pad_top", T.INT32), Slot("pad_bottom", T.INT32), *_WINDOW, _NCHW],
    "implicit": [_INPUT, Slot("padding_scheme", T.INT32, doc="0 NONE, 1 SAME, 2 VALID"),
                 *_WINDOW, _NCHW],
}
_OUTPUTS = [Slot("output", "T", doc="[batches, out_height, out_width, depth]")]
_F32, _F16 = {"T": T.TENSOR_FLOAT32}, {"T": T.TENSOR_FLOAT16}
_Q8, _Q8S = {"T": T.TENSOR_QUANT8_ASYMM}, {"T": T.TENSOR_QUANT8_ASYMM_SIGNED}
_ALL_TYPES = [*variants(V1_0, _F32, _Q8), *variants(V1_2, _F16), *variants(V1_3, _Q8S)]

SIGNATURES = [
    sig(O.AVERAGE_POOL_2D, _FORMS, _OUTPUTS, _ALL_TYPES),
    sig(O.MAX_POOL_2D, _FORMS, _OUTPUTS, _ALL_TYPES),
    sig(O.L2_POOL_2D, _FORMS, _OUTPUTS, [*variants(V1_0, _F32), *variants(V1_2, _F16)]),
]


def explicit_padding(in_size: int, stride: int, filter_size: int, scheme: int) -> tuple[int, int]:
    """(head, tail) padding of an implicit padding scheme; only SAME pads."""
    if scheme != PADDING_SAME:
        return 0, 0
    out_size = (in_size + stride - 1) // stride
    needed = (out_size - 1) * stride + filter_size
    if needed <= in_size:
        return 0, 0
    total = needed - in_size
    return total // 2, total - total // 2


def out_size(in_size: int, filter_size: int, stride: int, head: int, tail: int) -> int:
    """computeOutSize with C++ truncating division."""
    num = in_size - filter_size + stride + head + tail
    return int(num / stride) if num < 0 else num // stride


@dataclass(frozen=True)
class PoolParams:
    pad_left: int
    pad_right: int
    pad_top: int
    pad_bottom: int
    stride_w: int
    stride_h: int
    filter_w: int
    filter_h: int
    activation: int
    nchw: bool


def resolve_params(values: list, n_inputs: int, height: int, width: int) -> PoolParams:
    """Turn the scalar inputs (values[i] = input i + 1) into checked explicit parameters."""
    explicit = n_inputs >= 10
    nchw = False
    if explicit:
        pl, pr, pt, pb, sw, sh, fw, fh, act = (int(np.asarray(v)) for v in values[:9])
        if n_inputs == 11:
            nchw = _nchw(values[9])
    else:
        scheme, sw, sh, fw, fh, act = (int(np.asarray(v)) for v in values[:6])
        if n_inputs == 8:
            nchw = _nchw(values[6])
        if scheme not in (PADDING_NONE, PADDING_SAME, PADDING_VALID):
            raise OpError(f"invalid implicit padding scheme {scheme}")
        if sw <= 0 or sh <= 0 or fw <= 0 or fh <= 0:
            raise OpError("strides and filter sizes must be positive")
        pl, pr = explicit_padding(width, sw, fw, scheme)
        pt, pb = explicit_padding(height, sh, fh, scheme)
    p = PoolParams(pl, pr, pt, pb, sw, sh, fw, fh, act, nchw)
    _check_params(p)
    return p


def _layout_index(n_inputs: int) -> int:
    """Where the optional layout flag is in either form."""
    return 10 if n_inputs >= 10 else 7


def _nchw(value: object) -> bool:
    """A run-time layout flag; an omitted one (None) means NHWC."""
    return value is not None and bool(np.asarray(value))


def _check_params(p: PoolParams) -> None:
    if min(p.pad_left, p.pad_right, p.pad_top, p.pad_bottom) < 0:
        raise OpError("padding must not be negative")
    if p.stride_w <= 0 or p.stride_h <= 0:
        raise OpError("strides must be positive")
    if p.filter_w <= 0 or p.filter_h <= 0:
        raise OpError("filter sizes must be positive")
    if p.activation not in (0, 1, 2, 3):
        raise OpError(f"invalid fused activation {p.activation}")
    if not (p.filter_w > p.pad_left and p.filter_w > p.pad_right
            and p.filter_h > p.pad_top and p.filter_h > p.pad_bottom):
        raise OpError("padding must be smaller than the filter")


def _window_counts(in_size: int, out_n: int, stride: int, head: int, filt: int) -> np.ndarray:
    """How many real (non-padding) input positions each output window covers along one axis."""
    start = np.arange(out_n, dtype=np.int64) * stride - head
    lo = np.maximum(start, 0)
    hi = np.minimum(start + filt, in_size)
    return np.maximum(hi - lo, 0)


class _Pool(OperationDef):
    """Shared validation, shape inference and window extraction."""

    def validate(self, ctx: OpContext) -> list[Shape] | None:
        n = len(ctx.inputs)
        t = ctx.inputs[0].type
        n_int = 9 if n >= 10 else 6
        ctx.expect_rank(0, 4)
        ctx.expect_rank(0, 4, output=True)
        if t in C.QUANT8_TYPES:
            i, o = ctx.inputs[0], ctx.outputs[0]
            ctx.require(i.scale > 0, "input scale must be positive")
            ctx.require(o.scale == i.scale and o.zero_point == i.zero_point,
                        "output scale and zero point must equal the input's")
        C.check_activation(ctx, n_int)
        ints = [ctx.const_int(i) for i in range(1, n_int + 1)]
        if n >= 10:
            pads, (sw, sh, fw, fh) = ints[0:4], ints[4:8]
            for v in pads:
                ctx.require(v is None or v >= 0, "padding must not be negative")
            for f, pa, pb in ((fw, pads[0], pads[1]), (fh, pads[2], pads[3])):
                if f is not None:
                    ctx.require(pa is None or f > pa, "padding must be smaller than the filter")
                    ctx.require(pb is None or f > pb, "padding must be smaller than the filter")
        else:
            scheme, sw, sh, fw, fh = ints[0:5]
            ctx.require(scheme is None or scheme in (0, 1, 2),
                        f"invalid implicit padding scheme {scheme}")
        for v in (sw, sh):
            ctx.require(v is None or v > 0, "strides must be positive")
        for v in (fw, fh):
            ctx.require(v is None or v > 0, "filter sizes must be positive")
        shape = self.prepare(ctx)
        if shape and shape[0] is not None:
            ctx.require(all(d >= 0 for d in shape[0]), "output size must be positive")
        return shape

    def prepare(self, ctx: OpContext) -> list[Shape] | None:
        shape = ctx.inputs[0].shape
        if shape is None or len(shape) != 4:
            return [None]
        n = len(ctx.inputs)
        consts = [ctx.const(i) for i in range(1, n)]
        nchw = False
        if ctx.has_value(_layout_index(n)):
            flag = ctx.const(_layout_index(n))
            if flag is None:  # only known at run time
                return [None]
            nchw = bool(flag)
        b, h, w, c = (shape[0], shape[2], shape[3], shape[1]) if nchw else shape
        oh = ow = 0
        n_int = 9 if n >= 10 else 6
        if h > 0 and w > 0 and all(v is not None for v in consts[:n_int]):
            try:
                p = resolve_params(consts, n, h, w)
            except OpError as e:
                raise ctx.fail(str(e)) from None
            ow = out_size(w, p.filter_w, p.stride_w, p.pad_left, p.pad_right)
            oh = out_size(h, p.filter_h, p.stride_h, p.pad_top, p.pad_bottom)
            if oh <= 0 or ow <= 0:
                raise ctx.fail("output size must be positive")
        return [(b, c, oh, ow) if nchw else (b, oh, ow, c)]

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Every output element reads its window (filter width x height)."""
        first = 7 if len(ctx.inputs) >= 10 else 4  # filter_w, then filter_h
        area = max(ctx.const_int(first) or 1, 1) * max(ctx.const_int(first + 1) or 1, 1)
        return visits(ctx, outputs) + elements(outputs[0]) * area

    def kernel(self, ctx: OpContext):
        n = len(ctx.inputs)
        t = ctx.inputs[0].type
        out_info = ctx.outputs[0]
        reduce = self._reducer(ctx)
        dtype = t.dtype

        def run(ins, rt):
            x = ins[0]
            if x.ndim != 4:
                raise OpError("input must be 4-D")
            p0 = list(ins[1:])
            nchw = _nchw(p0[-1]) if n in (8, 11) else False
            if nchw:
                x = x.transpose(0, 2, 3, 1)
            b, h, w, c = x.shape
            if h <= 0 or w <= 0 or c <= 0:
                raise OpError("height, width and depth must be positive")
            p = resolve_params(p0, n, h, w)
            oh = out_size(h, p.filter_h, p.stride_h, p.pad_top, p.pad_bottom)
            ow = out_size(w, p.filter_w, p.stride_w, p.pad_left, p.pad_right)
            if oh <= 0 or ow <= 0:
                raise OpError("output size must be positive")
            if b == 0:
                y = np.zeros((0, oh, ow, c), dtype=dtype)
            else:
                y = reduce(x, p, oh, ow, out_info)
            if nchw:
                y = y.transpose(0, 3, 1, 2)
            return [np.ascontiguousarray(y, dtype=dtype)]

        return run

    def _reducer(self, ctx: OpContext):  # pragma: no cover - overridden
        raise NotImplementedError


def _windows(x: np.ndarray, p: PoolParams, oh: int, ow: int, fill) -> np.ndarray:
    """(N, OH, OW, C, FH, FW) view of the padded input's pooling windows."""
    b, h, w, c = x.shape
    need_h = (oh - 1) * p.stride_h + p.filter_h
    need_w = (ow - 1) * p.stride_w + p.filter_w
    pad_b = max(0, need_h - p.pad_top - h)
    pad_r = max(0, need_w - p.pad_left - w)
    if p.pad_top or pad_b or p.pad_left or pad_r:
        xp = np.pad(x, ((0, 0), (p.pad_top, pad_b), (p.pad_left, pad_r), (0, 0)),
                    constant_values=fill)
    else:
        xp = x
    # as_strided directly: sliding_window_view's checks cost ~0.1 ms per call.
    s0, s1, s2, s3 = xp.strides
    return as_strided(xp, shape=(b, oh, ow, c, p.filter_h, p.filter_w),
                      strides=(s0, s1 * p.stride_h, s2 * p.stride_w, s3, s1, s2),
                      writeable=False)


def _counts(x: np.ndarray, p: PoolParams, oh: int, ow: int) -> np.ndarray:
    _, h, w, _ = x.shape
    return _counts_for(h, w, oh, ow, p.stride_h, p.stride_w, p.pad_top, p.pad_left,
                       p.filter_h, p.filter_w)


@lru_cache(maxsize=256)
def _counts_for(h: int, w: int, oh: int, ow: int, sh: int, sw: int, top: int, left: int,
                fh: int, fw: int) -> np.ndarray:
    """[1, OH, OW, 1] int64 window sizes (cached: the same every execution; read-only)."""
    ch = _window_counts(h, oh, sh, top, fh)
    cw = _window_counts(w, ow, sw, left, fw)
    r = (ch[:, None] * cw[None, :])[None, :, :, None]
    r.flags.writeable = False
    return r


@lru_cache(maxsize=256)
def _float_counts(h: int, w: int, oh: int, ow: int, sh: int, sw: int, top: int, left: int,
                  fh: int, fw: int) -> np.ndarray:
    r = _counts_for(h, w, oh, ow, sh, sw, top, left, fh, fw).astype(np.float32)
    r.flags.writeable = False
    return r


@register(O.AVERAGE_POOL_2D)
class AveragePool2D(_Pool):
    def _reducer(self, ctx: OpContext):
        t = ctx.inputs[0].type
        if t in C.FLOAT_TYPES:
            def avg_float(x, p, oh, ow, out):
                b, h, w, c = x.shape
                xs = x.astype(np.float32, copy=False)
                if (h, w) == (p.filter_h, p.filter_w) and not (
                        p.pad_top or p.pad_bottom or p.pad_left or p.pad_right):
                    # One window over the whole input (a global average): a plain sum over
                    # the H*W rows of C values, without a window view or per-position counts.
                    s = np.add.reduce(xs.reshape(b, h * w, c), axis=1, dtype=np.float32)
                    r = np.divide(s, np.float32(h * w), out=s).reshape(b, 1, 1, c)
                    return C.apply_float_activation(r, p.activation)
                # Window axes ahead of the channels: the sum's inner loop runs over C.
                win = _windows(xs, p, oh, ow, 0.0).transpose(0, 1, 2, 4, 5, 3)
                s = win.sum(axis=(3, 4), dtype=np.float32)
                r = np.divide(s, _float_counts(h, w, oh, ow, p.stride_h, p.stride_w, p.pad_top,
                                               p.pad_left, p.filter_h, p.filter_w), out=s)
                return C.apply_float_activation(r, p.activation)

            return avg_float

        def avg_quant(x, p, oh, ow, out):
            acc = _windows(x.astype(np.int64), p, oh, ow, 0).sum(axis=(4, 5))
            cnt = _counts(x, p, oh, ow)
            # Integer division rounding half away from zero, as the TFLite integer kernels do.
            q = np.sign(acc) * ((np.abs(acc) + cnt // 2) // cnt)
            lo, hi = C.quant_activation_range(p.activation, out.scale, out.zero_point, out.type)
            return np.clip(q, lo, hi)

        return avg_quant


@register(O.MAX_POOL_2D)
class MaxPool2D(_Pool):
    def _reducer(self, ctx: OpContext):
        t = ctx.inputs[0].type
        if t in C.FLOAT_TYPES:
            def max_float(x, p, oh, ow, out):
                xs = x.astype(np.float32)
                r = _windows(xs, p, oh, ow, -np.inf).max(axis=(4, 5))
                return C.apply_float_activation(r, p.activation)

            return max_float

        qmin = C.qrange(t)[0]

        def max_quant(x, p, oh, ow, out):
            r = _windows(x, p, oh, ow, qmin).max(axis=(4, 5))
            lo, hi = C.quant_activation_range(p.activation, out.scale, out.zero_point, out.type)
            return np.clip(r, lo, hi)

        return max_quant


@register(O.L2_POOL_2D)
class L2Pool2D(_Pool):
    def _reducer(self, ctx: OpContext):
        def l2(x, p, oh, ow, out):
            xs = x.astype(np.float32)
            s = _windows(xs * xs, p, oh, ow, 0.0).sum(axis=(4, 5), dtype=np.float32)
            r = np.sqrt(s / _counts(x, p, oh, ow).astype(np.float32))
            return C.apply_float_activation(r, p.activation)

        return l2
