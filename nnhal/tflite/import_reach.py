"""TFLite operators the HAL computes under another form (issue 27's reach): integer and floor
division, floor modulo, SELECT / SELECT_V2 whose operands broadcast, a RESHAPE of a bool
tensor, and custom operators that are HAL operations under another name (MediaPipe's
``Convolution2DTransposeBias``). Each becomes a short HAL subgraph that computes what TFLite's
kernel computes, bit for bit (float32 floor division included, for quotients below 2^24);
where it cannot, the converter's note says how close it is.

The converters here replace or wrap those of :mod:`nnhal.tflite.import_ops` for the same
builtins (DIV, SELECT, SELECT_V2, RESHAPE, PRELU), delegating what those already do."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence

import numpy as np
from tflite.TensorType import TensorType as TT

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops.common import broadcast_static
from nnhal.tflite import import_ops
from nnhal.tflite.import_ctx import Context, Unimportable, hal_dims, hal_type
from nnhal.tflite.import_fold import MAX_FOLD_ELEMENTS
from nnhal.tflite.import_ops import CONVERTERS, MAPPED, Converter
from nnhal.tflite.import_read import OpInfo, SubgraphInfo

T = OperandType
O = OperationType

#: Custom code -> converter, for custom operators that are HAL operations under another name.
CUSTOM_CONVERTERS: dict[str, Converter] = {}
#: Custom code -> how it maps (for the support table).
CUSTOM_MAPPED: dict[str, str] = {}
#: Builtins whose conversion is a HAL subgraph of several operations computing the same thing
#: (the support table's "lowered"), rather than one HAL operation.
LOWERED: set[str] = {"ADD_N", "SQUARED_DIFFERENCE", "SPLIT_V", "UNPACK"}

_FLOATS = (TT.FLOAT32, TT.FLOAT16)


def _register(name: str, note: str, lowered: bool = True) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        CONVERTERS[name] = fn
        MAPPED[name] = note
        if lowered:
            LOWERED.add(name)
        return fn
    return register


def _zero(ctx: Context, like: int, value: float = 0.0) -> int:
    """A [1] constant of tensor ``like``'s (float or int32) type holding ``value``."""
    ht = hal_type(ctx.t(like))[0]
    dtype = np.int32 if ht == T.TENSOR_INT32 else ht.dtype
    return ctx.sb.constant(ht, np.full(1, value, dtype), [1])


def _bools(ctx: Context, dims: Sequence[int]) -> int:
    return ctx.tmp(T.TENSOR_BOOL8, dims)


def _no_zero_divisor(ctx: Context, i: int, what: str) -> None:
    v = ctx.value(i)
    if v is not None and np.any(v == 0):
        raise Unimportable(f"{what} by a constant holding 0 (TFLite's kernel fails with "
                           f"'Division by 0')")


def _fixed_by(ctx: Context, op: OpInfo, value: int, fix: int) -> None:
    """Output = ``fix ? value + 1 : value`` (int32), the step that turns a floor quotient
    into a truncated one."""
    out = op.outputs[0]
    one = ctx.sb.constant(T.TENSOR_INT32, np.ones(1, np.int32), [1])
    plus = ctx.like(out)
    ctx.emit(O.ADD, [value, one, ctx.i32(0)], [plus])
    ctx.emit(O.SELECT, [fix, plus, value], [ctx.y(out)])


def _floor_remainder(ctx: Context, op: OpInfo, quotient: int) -> int:
    """x - quotient * y (an output-shaped temporary)."""
    x, y = op.inputs[:2]
    prod, rem = ctx.like(op.outputs[0]), ctx.like(op.outputs[0])
    ctx.emit(O.MUL, [quotient, ctx.x(y), ctx.i32(0)], [prod])
    ctx.emit(O.SUB, [ctx.x(x), prod, ctx.i32(0)], [rem])
    return rem


# ---- division --------------------------------------------------------------------------------

_plain_div = CONVERTERS["DIV"]


@_register("DIV", "DIV (broadcast, fused activation); int32, which TFLite truncates towards "
                  "zero and the HAL floors, as DIV + MUL + SUB + a SELECT adding 1 where the "
                  "signs differ and the remainder is not 0", lowered=False)
def _div(ctx: Context, op: OpInfo) -> None:
    if ctx.t(op.inputs[0]).ttype != TT.INT32:
        _plain_div(ctx, op)
        return
    act = op.options.FusedActivationFunction() if op.options is not None else 0
    if act != 0:
        raise Unimportable("int32 DIV with a fused activation (the HAL's int32 DIV takes none)")
    _no_zero_divisor(ctx, op.inputs[1], "DIV")
    x, y = op.inputs[:2]
    dims = hal_dims(ctx.t(op.outputs[0]))
    floor = ctx.like(op.outputs[0])
    ctx.emit(O.DIV, [ctx.x(x), ctx.x(y), ctx.i32(0)], [floor])
    rem = _floor_remainder(ctx, op, floor)
    inexact, x_neg, y_neg, signs, fix = (_bools(ctx, d) for d in
                                         (dims, hal_dims(ctx.t(x)), hal_dims(ctx.t(y)), dims,
                                          dims))
    ctx.emit(O.NOT_EQUAL, [rem, _zero(ctx, x)], [inexact])
    ctx.emit(O.LESS, [ctx.x(x), _zero(ctx, x)], [x_neg])
    ctx.emit(O.LESS, [ctx.x(y), _zero(ctx, y)], [y_neg])
    ctx.emit(O.NOT_EQUAL, [x_neg, y_neg], [signs])
    ctx.emit(O.LOGICAL_AND, [inexact, signs], [fix])
    _fixed_by(ctx, op, floor, fix)


class _Float:
    """Float32 arithmetic on HAL operands of one shape (the output's), each operation IEEE
    (no fused multiply-add), for the error-free steps of an exact floor division."""

    def __init__(self, ctx: Context, dims: list[int]):
        self.ctx, self.dims = ctx, dims

    def _op(self, op: OperationType, a: int, b: int, dims: list[int] | None = None) -> int:
        out = self.ctx.tmp(T.TENSOR_FLOAT32, dims or self.dims)
        self.ctx.emit(op, [a, b, self.ctx.i32(0)], [out])
        return out

    def mul(self, a: int, b: int) -> int:
        return self._op(O.MUL, a, b)

    def sub(self, a: int, b: int) -> int:
        return self._op(O.SUB, a, b)

    def const(self, v: float) -> int:
        return self.ctx.sb.constant(T.TENSOR_FLOAT32, np.full(1, v, np.float32), [1])

    def split(self, a: int, dims: list[int]) -> tuple[int, int]:
        """Veltkamp's split: a = hi + lo exactly, each with at most 12 significant bits."""
        c = self._op(O.MUL, a, self.const(4097.0), dims)
        hi = self._op(O.SUB, c, self._op(O.SUB, c, a, dims), dims)
        return hi, self._op(O.SUB, a, hi, dims)

    def two_product(self, a: int, a_dims: list[int], b: int, b_dims: list[int],
                    b_value: np.ndarray | None) -> tuple[int, int]:
        """Dekker's product: (p, e) with p = fl(a * b) and a * b = p + e exactly."""
        a_hi, a_lo = self.split(a, a_dims)
        if b_value is not None:  # a constant divisor: split at import, in float32 as well
            v = b_value.astype(np.float32)
            c = v * np.float32(4097.0)
            hi_v = c - (c - v)
            b_hi, b_lo = (self.ctx.sb.constant(T.TENSOR_FLOAT32, w.reshape(b_dims), b_dims)
                          for w in (hi_v, v - hi_v))
        else:
            b_hi, b_lo = self.split(b, b_dims)
        p = self.mul(a, b)
        e = self.sub(self.mul(a_lo, b_lo),
                     self.sub(self.sub(self.sub(p, self.mul(a_hi, b_hi)), self.mul(a_lo, b_hi)),
                              self.mul(a_hi, b_lo)))
        return p, e


def _exact_floor(ctx: Context, op: OpInfo) -> int:
    """q = floor(x / y) for float32 x and y as TFLite computes it (in double, exact for float32
    operands), bit for bit while |x / y| < 2^24. FLOOR of the float32 quotient is at most one
    too large, when the quotient rounds up to an integer (2.5% of one-decimal operands, e.g.
    7.8 // 0.6 = 12, not 13): the residual x - q * y, negative then (for y > 0), is computed
    exactly with Dekker's product (x - fl(q * y) is exact by Sterbenz's lemma) and q lowered
    by one there."""
    x, y = op.inputs[:2]
    dims = hal_dims(ctx.t(op.outputs[0]))
    y_dims = hal_dims(ctx.t(y))
    f = _Float(ctx, dims)
    xo, yo = ctx.x(x), ctx.x(y)
    q0 = f._op(O.DIV, xo, yo)
    floor = ctx.tmp(T.TENSOR_FLOAT32, dims)
    ctx.emit(O.FLOOR, [q0], [floor])
    p, e = f.two_product(floor, dims, yo, y_dims, ctx.value(y))
    d = f.sub(xo, p)
    lt, gt, y_pos, y_neg, over_pos, over_neg, fix = (
        _bools(ctx, k) for k in (dims, dims, y_dims, y_dims, dims, dims, dims))
    ctx.emit(O.LESS, [d, e], [lt])
    ctx.emit(O.GREATER, [d, e], [gt])
    ctx.emit(O.GREATER, [yo, f.const(0.0)], [y_pos])
    ctx.emit(O.LESS, [yo, f.const(0.0)], [y_neg])
    ctx.emit(O.LOGICAL_AND, [y_pos, lt], [over_pos])
    ctx.emit(O.LOGICAL_AND, [y_neg, gt], [over_neg])
    ctx.emit(O.LOGICAL_OR, [over_pos, over_neg], [fix])
    lower = f.sub(floor, f.const(1.0))
    q = ctx.tmp(T.TENSOR_FLOAT32, dims)
    ctx.emit(O.SELECT, [fix, lower, floor], [q])
    return q


@_register("FLOOR_DIV", "int32: the HAL's DIV (floor division on TENSOR_INT32); float32: DIV, "
                        "FLOOR, and one less where Dekker's exact product shows the float32 "
                        "quotient rounded up to an integer (TFLite divides in double); "
                        "constants folded")
def _floor_div(ctx: Context, op: OpInfo) -> None:
    x, y = op.inputs[:2]
    tt = ctx.t(x).ttype
    _no_zero_divisor(ctx, y, "FLOOR_DIV")
    if tt == TT.INT32 and not ctx.t(x).quantized:
        ctx.emit(O.DIV, [ctx.x(x), ctx.x(y), ctx.i32(0)], [ctx.y(op.outputs[0])])
    elif tt == TT.FLOAT32:
        q = _exact_floor(ctx, op)
        ctx.copy_into(q, ctx.y(op.outputs[0]))
    else:
        raise Unimportable(f"{ctx.t(x).type_name} FLOOR_DIV has no exact HAL form")


@_register("FLOOR_MOD", "int32: x - DIV(x, y) * y (the HAL's int32 DIV floors, so exact); "
                        "float32 of tensors refused (constants folded)")
def _floor_mod(ctx: Context, op: OpInfo) -> None:
    x, y = op.inputs[:2]
    out = op.outputs[0]
    tt = ctx.t(x).ttype
    if tt == TT.INT32 and not ctx.t(x).quantized:
        _no_zero_divisor(ctx, y, "FLOOR_MOD")
        q = ctx.like(out)
        ctx.emit(O.DIV, [ctx.x(x), ctx.x(y), ctx.i32(0)], [q])
        prod = ctx.like(out)
        ctx.emit(O.MUL, [q, ctx.x(y), ctx.i32(0)], [prod])
        ctx.emit(O.SUB, [ctx.x(x), prod, ctx.i32(0)], [ctx.y(out)])
        return
    if tt == TT.FLOAT32:
        # x - q * y with the exact floor quotient (as FLOOR_DIV) is TFLite's remainder only
        # while |x / y| < 2^24: past it the quotient has more bits than float32 holds and the
        # HAL has no remainder operation, so a lowering would be silently wrong there.
        raise Unimportable("float32 FLOOR_MOD of run-time tensors has no exact HAL form (the "
                           "HAL has no remainder; x - floor(x / y) * y is not TFLite's once "
                           "|x / y| >= 2^24)")
    raise Unimportable(f"{ctx.t(x).type_name} FLOOR_MOD has no exact HAL form")


# ---- broadcasting ----------------------------------------------------------------------------

def _small(shape: Sequence[int], what: str | None = None) -> bool:
    """Whether a constant of ``shape`` is small enough to make here: a hostile file's shapes
    (2^31-1 along several axes) must not allocate without bound at import. ``what`` given,
    a large one is Unimportable instead of False."""
    n = math.prod(shape)
    if n <= MAX_FOLD_ELEMENTS:
        return True
    if what is None:
        return False
    raise Unimportable(f"{what} needs a constant of {n} elements, more than the "
                       f"{MAX_FOLD_ELEMENTS} an import makes")


def _bool_reshape(ctx: Context, src: int, src_dims: Sequence[int], dst_dims: Sequence[int],
                  dst: int) -> None:
    """Bool operand ``src`` reshaped into ``dst`` (whose dims ``dst_dims`` may also broadcast
    it): the HAL's RESHAPE takes no TENSOR_BOOL8, so the bools become 1.0 / 0.0 (SELECT),
    are reshaped as float32 (exact), and compared with 0 again (NOT_EQUAL, which
    broadcasts)."""
    src_dims = list(src_dims)
    _small(src_dims, "a bool RESHAPE")
    ones = ctx.sb.constant(T.TENSOR_FLOAT32, np.ones(src_dims, np.float32), src_dims)
    zeros = ctx.sb.constant(T.TENSOR_FLOAT32, np.zeros(src_dims, np.float32), src_dims)
    real = ctx.tmp(T.TENSOR_FLOAT32, src_dims)
    ctx.emit(O.SELECT, [src, ones, zeros], [real])
    size = math.prod(src_dims)
    shape = list(dst_dims)
    if math.prod(shape) != size:  # dst broadcasts: reshape to the same rank first
        shape = [1] * (len(dst_dims) - len(src_dims)) + src_dims
    moved = ctx.tmp(T.TENSOR_FLOAT32, shape)
    ctx.emit(O.RESHAPE, [real, ctx.ints(shape)], [moved])
    zero = ctx.sb.constant(T.TENSOR_FLOAT32, np.zeros([1] * len(dst_dims), np.float32),
                           [1] * len(dst_dims))
    ctx.emit(O.NOT_EQUAL, [moved, zero], [dst])


def _broadcast(ctx: Context, i: int, shape: tuple[int, ...]) -> int:
    """Tensor ``i`` as an operand of ``shape`` (numpy broadcasting), exactly: a constant is
    materialised; a bool is OR-ed with false, an int32 gets 0 added and a float -0.0 added
    (x + -0.0 is x for every x, signed zeros and NaN included); quantized values are
    reshaped to the rank and TILEd."""
    t = ctx.t(i)
    have = tuple(t.shape)
    if have == shape:
        return ctx.x(i)
    broadcast_static(have, shape)  # ValueError (reported as malformed) if they do not
    if t.value is not None and _small(shape):
        return ctx.x(i, value=np.broadcast_to(t.value, shape).copy(), dims=shape or (1,))
    ht, sc, zp, _ = hal_type(t)
    dims = list(shape) or [1]
    padded = (1,) * (len(shape) - len(have)) + have
    # The smallest second operand that widens ``i`` to ``shape``.
    widen = [n if p == 1 else 1 for p, n in zip(padded, shape)] or [1]
    _small(widen, f"broadcasting {t.describe()} to {list(shape)}")
    out = ctx.tmp(ht, dims, sc, zp)
    if ht == T.TENSOR_BOOL8:
        ctx.emit(O.LOGICAL_OR, [ctx.x(i), ctx.sb.constant(T.TENSOR_BOOL8,
                                                          np.zeros(widen, np.uint8), widen)],
                 [out])
    elif ht == T.TENSOR_INT32 and sc == 0.0:
        ctx.emit(O.ADD, [ctx.x(i), ctx.sb.constant(ht, np.zeros(widen, np.int32), widen),
                         ctx.i32(0)], [out])
    elif ht in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        ctx.emit(O.ADD, [ctx.x(i), ctx.sb.constant(ht, np.full(widen, -0.0, ht.dtype), widen),
                         ctx.i32(0)], [out])
    elif ht in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED):
        src = ctx.x(i)
        if len(have) != len(shape):
            src = ctx.tmp(ht, list(padded), sc, zp)
            ctx.emit(O.RESHAPE, [ctx.x(i), ctx.ints(padded)], [src])
        ctx.emit(O.TILE, [src, ctx.ints([n // p for p, n in zip(padded, shape)])], [out])
    else:
        raise Unimportable(f"{t.describe()}: no exact HAL broadcast of {ht.name}")
    return out


@_register("SELECT_V2", "SELECT (operands broadcast to the output's shape exactly first: "
                        "constants materialised, bools OR-ed with false, ints + 0, floats + "
                        "-0.0, quantized RESHAPE + TILE)")
def _select_v2(ctx: Context, op: OpInfo) -> None:
    out = ctx.t(op.outputs[0])
    if out.ttype == TT.BOOL and op.name == "SELECT_V2":
        # The HAL's SELECT takes no bools: (c and x) or (not c and y), which broadcast.
        c, x, y = (ctx.x(i) for i in op.inputs[:3])
        dims = hal_dims(out)
        not_c, pick_x, pick_y = (_bools(ctx, d) for d in (hal_dims(ctx.t(op.inputs[0])), dims,
                                                          dims))
        ctx.emit(O.LOGICAL_NOT, [c], [not_c])
        ctx.emit(O.LOGICAL_AND, [c, x], [pick_x])
        ctx.emit(O.LOGICAL_AND, [not_c, y], [pick_y])
        ctx.emit(O.LOGICAL_OR, [pick_x, pick_y], [ctx.y(op.outputs[0])])
        return
    for i in op.inputs[1:3]:
        t = ctx.t(i)
        if t.quantized and out.quantized and (
                not np.array_equal(t.scales, out.scales) or
                not np.array_equal(t.zero_points, out.zero_points)):
            raise Unimportable(f"{t.describe()} is quantized unlike the output: TFLite's kernel "
                               f"copies its stored integers, the HAL's SELECT requantizes")
    shapes = {tuple(ctx.t(i).shape) for i in op.inputs[:3]}
    if shapes == {tuple(out.shape)}:
        ctx.emit(O.SELECT, [ctx.x(i) for i in op.inputs[:3]], [ctx.y(op.outputs[0])])
        return
    if not out.static or not all(ctx.t(i).static for i in op.inputs[:3]):
        raise Unimportable("broadcasting with an unknown shape")
    shape = tuple(out.shape)
    c = op.inputs[0]
    if op.name == "SELECT" and len(ctx.t(c).shape) == 1 and tuple(ctx.t(c).shape) != shape:
        cond = _rank_one_condition(ctx, c, shape)
    else:
        cond = _broadcast(ctx, c, shape)
    ctx.emit(O.SELECT, [cond, _broadcast(ctx, op.inputs[1], shape),
                        _broadcast(ctx, op.inputs[2], shape)], [ctx.y(op.outputs[0])])


def _rank_one_condition(ctx: Context, c: int, shape: tuple[int, ...]) -> int:
    """SELECT (version 1) takes a condition of one dimension that picks whole rows of x and
    y (not numpy broadcasting); as a bool operand of ``shape``."""
    t = ctx.t(c)
    if len(t.shape) != 1 or not shape or t.shape[0] != shape[0]:
        raise Unimportable("SELECT's condition is neither the shape of x nor one value per row")
    if t.value is not None and _small(shape):
        v = np.broadcast_to(t.value.reshape((-1,) + (1,) * (len(shape) - 1)), shape).copy()
        return ctx.x(c, value=v, dims=shape)
    rows = [shape[0]] + [1] * (len(shape) - 1)
    dst = _bools(ctx, rows)
    _bool_reshape(ctx, ctx.x(c), [t.shape[0]], rows, dst)
    if rows == list(shape):
        return dst
    _small(shape, "SELECT's row condition")
    wide = _bools(ctx, shape)
    ctx.emit(O.LOGICAL_OR, [dst, ctx.sb.constant(T.TENSOR_BOOL8,
                                                 np.zeros(shape, np.uint8), list(shape))],
             [wide])
    return wide


CONVERTERS["SELECT"] = _select_v2
MAPPED["SELECT"] = ("SELECT (a condition of one value per row, or operands of other shapes, "
                    "widened exactly first)")

_plain_prelu = CONVERTERS["PRELU"]


@_register("PRELU", "PRELU (alpha broadcast to the input; TFLite's output wider than the "
                    "input is refused)", lowered=False)
def _prelu(ctx: Context, op: OpInfo) -> None:
    x, out = ctx.t(op.inputs[0]), ctx.t(op.outputs[0])
    if x.static and out.static and tuple(out.shape) != tuple(x.shape):
        raise Unimportable(f"alpha widens the output to {list(out.shape)} beyond the input's "
                           f"{list(x.shape)} (the HAL's PRELU keeps the input's shape)")
    _plain_prelu(ctx, op)


# ---- bool RESHAPE ----------------------------------------------------------------------------

_plain_reshape = CONVERTERS["RESHAPE"]


@_register("RESHAPE", MAPPED["RESHAPE"] + "; bool as SELECT 1.0 / 0.0, RESHAPE, NOT_EQUAL 0",
           lowered=False)
def _reshape(ctx: Context, op: OpInfo) -> None:
    x, out = ctx.t(op.inputs[0]), ctx.t(op.outputs[0])
    if x.ttype != TT.BOOL or hal_dims(x) == hal_dims(out):
        _plain_reshape(ctx, op)
        return
    import_ops._check_new_shape(ctx, op)
    if not (x.static and out.static):
        raise Unimportable("a bool RESHAPE needs static shapes (the HAL's RESHAPE takes no "
                           "TENSOR_BOOL8)")
    _bool_reshape(ctx, ctx.x(op.inputs[0]), hal_dims(x), hal_dims(out), ctx.y(op.outputs[0]))


# ---- custom operators ------------------------------------------------------------------------

def _custom(code: str, note: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        CUSTOM_CONVERTERS[code] = fn
        CUSTOM_MAPPED[code] = note
        return fn
    return register


#: TfLitePadding: kTfLitePaddingUnknown, kTfLitePaddingSame, kTfLitePaddingValid.
_TFLITE_PADDINGS = {0: "unknown", 1: "SAME", 2: "VALID"}


@_custom("Convolution2DTransposeBias",
         "TRANSPOSE_CONV_2D with explicit padding (MediaPipe's transposed convolution with "
         "bias: inputs input, OHWI weights, bias; options padding, stride_width, "
         "stride_height as raw int32s; float32)")
def _transpose_conv_bias(ctx: Context, op: OpInfo) -> None:
    """MediaPipe's kernel pads SAME by max(0, filter - (in - 1) % stride - 1) in all, the
    first half (rounded down) before, and any other padding not at all; its output is
    stride * (in - 1) + filter - padding. The HAL's explicit-padding TRANSPOSE_CONV_2D
    computes exactly that sum with the same split."""
    if len(op.inputs) != 3 or len(op.outputs) != 1 or -1 in op.inputs:
        raise Unimportable(f"has {len(op.inputs)} inputs and {len(op.outputs)} outputs "
                           f"(MediaPipe's kernel takes input, weights, bias and one output)")
    raw = op.custom_options
    if len(raw) < 12:
        raise Unimportable(f"custom options of {len(raw)} bytes (the kernel reads padding, "
                           f"stride_width and stride_height: 12)")
    padding, stride_w, stride_h = struct.unpack_from("<iii", raw)
    if padding not in _TFLITE_PADDINGS:
        raise Unimportable(f"padding {padding} is not a TfLitePadding")
    if not (1 <= stride_w <= 1 << 16 and 1 <= stride_h <= 1 << 16):
        raise Unimportable(f"strides {stride_w} x {stride_h} are not positive")
    x, w, b = (ctx.t(i) for i in op.inputs)
    if any(t.ttype != TT.FLOAT32 for t in (x, w, b, ctx.t(op.outputs[0]))):
        raise Unimportable("MediaPipe's kernel takes float32 only")
    if len(x.shape) != 4 or len(w.shape) != 4 or len(b.shape) != 1 or not x.static or \
            not w.static or not b.static:
        raise Unimportable("needs a static 4-D input, 4-D weights and a 1-D bias")
    n, ih, iw, depth = x.shape
    out_c, fh, fw, w_depth = w.shape
    if w_depth != depth or b.shape[0] != out_c:
        raise Unimportable(f"weights {list(w.shape)} and bias {list(b.shape)} do not fit input "
                           f"{list(x.shape)}")
    ph = pw = 0
    if padding == 1:
        ph = max(0, fh - (ih - 1) % stride_h - 1)
        pw = max(0, fw - (iw - 1) % stride_w - 1)
    oh, ow = stride_h * (ih - 1) + fh - ph, stride_w * (iw - 1) + fw - pw
    if oh <= 0 or ow <= 0:
        raise Unimportable(f"output of {oh} x {ow}")
    out = ctx.y_as(op.outputs[0], T.TENSOR_FLOAT32, dims=[n, oh, ow, out_c])
    ins = [ctx.x(op.inputs[0]), ctx.x(op.inputs[1]), ctx.x(op.inputs[2]),
           ctx.i32(pw // 2), ctx.i32(pw - pw // 2), ctx.i32(ph // 2), ctx.i32(ph - ph // 2),
           ctx.i32(stride_w), ctx.i32(stride_h), ctx.i32(0), ctx.bool_(False)]
    ctx.emit(O.TRANSPOSE_CONV_2D, ins, [out])


@_register("BROADCAST_TO", "numpy broadcasting to a constant shape, exactly (as SELECT_V2's "
                           "operands); constants folded")
def _broadcast_to(ctx: Context, op: OpInfo) -> None:
    shape = tuple(int(d) for d in ctx.need_value(op.inputs[1], "shape").reshape(-1))
    if any(d <= 0 for d in shape) or not ctx.t(op.inputs[0]).static:
        raise Unimportable("broadcasting to or from an unknown or empty shape")
    ctx.copy_into(_broadcast(ctx, op.inputs[0], shape), ctx.y(op.outputs[0]))


# ---- repeats through a rank past the HAL's ---------------------------------------------------

#: The most dimensions the HAL's data movement takes.
_HAL_RANK = 4
#: The data movement a repeat is written with (Keras' UpSampling2D, tf.repeat, tf.tile).
_MOVES = ("RESHAPE", "EXPAND_DIMS", "TILE")
#: The most elements an index map is worked out for (a repeat's output: 32 MB of int32
#: indices, and about three times that at the peak).
_MAX_MAPPED = 1 << 23


def repeat_chains(sg: SubgraphInfo, folded: set[int]
                  ) -> tuple[set[int], dict[int, Converter]]:
    """Chains of RESHAPE / EXPAND_DIMS / TILE with constant parameters that go through a rank
    past the HAL's between a tensor and a result of at most 4 dimensions: Keras' UpSampling2D
    (nearest), tf.repeat and tf.tile of a 4-D tensor write them so. Worked out on the
    element indices, such a chain that keeps the elements in order is one RESHAPE, one that
    picks, along each axis of the source, elements by an index of that axis only is one
    GATHER per axis that is not kept as it is; any other stays refused. (operators left out:
    the chains' middles, every reader of which is in a chain; per chain end, its
    converter)."""
    producer = {o: op for op in sg.ops if op.index not in folded for o in op.outputs}
    readers: dict[int, list[OpInfo]] = {}
    for op in sg.ops:
        if op.index not in folded:
            for i in op.inputs:
                readers.setdefault(i, []).append(op)
    chains: dict[int, tuple[Converter, list[int]]] = {}
    for f in sg.ops:
        if f.index not in folded:
            found = _repeat_chain(sg, f, producer)
            if found is not None:
                chains[f.index] = found
    outputs = set(sg.outputs)
    by_index = {op.index: op for op in sg.ops}
    # A chain is kept while every reader of each of its middles is in a kept chain too (a
    # middle read by anything else stays, and so does every chain through it): to a fixpoint.
    while True:
        kept = set(chains) | {m for _, path in chains.values() for m in path}
        dropped = [f for f, (_, path) in chains.items() if any(
            by_index[m].outputs[0] in outputs or any(
                r.index not in kept for r in readers.get(by_index[m].outputs[0], []))
            for m in path)]
        if not dropped:
            break
        for f in dropped:
            del chains[f]
    left_out = {m for _, path in chains.values() for m in path}
    return left_out, {f: convert for f, (convert, _) in chains.items()}


def _move(sg: SubgraphInfo, op: OpInfo, ids: np.ndarray) -> np.ndarray | None:
    """``op`` (a RESHAPE, EXPAND_DIMS or TILE with constant parameters) applied to ``ids``."""
    out = sg.tensors[op.outputs[0]]
    if op.name == "TILE":
        m = sg.tensors[op.inputs[1]].value if len(op.inputs) > 1 and op.inputs[1] >= 0 \
            else None
        if m is None or np.size(m) != ids.ndim:
            return None
        ids = np.tile(ids, [int(v) for v in np.asarray(m).reshape(-1)])
    elif op.name == "EXPAND_DIMS":
        a = sg.tensors[op.inputs[1]].value if len(op.inputs) > 1 and op.inputs[1] >= 0 \
            else None
        if a is None or np.size(a) != 1:
            return None
        axis = int(np.asarray(a).reshape(-1)[0])
        ids = np.expand_dims(ids, axis + ids.ndim + 1 if axis < 0 else axis)
    elif not out.has_rank or not all(out.shape) or math.prod(out.shape) != ids.size:
        return None
    else:
        ids = ids.reshape(out.shape)
    return ids if tuple(ids.shape) == tuple(out.shape) else None


def _repeat_chain(sg: SubgraphInfo, f: OpInfo, producer: dict[int, OpInfo]
                  ) -> tuple[Converter, list[int]] | None:
    if f.name not in _MOVES or not f.inputs or f.inputs[0] < 0 or not f.outputs:
        return None
    y = sg.tensors[f.outputs[0]]
    if not y.has_rank or len(y.shape) > _HAL_RANK or not all(y.shape) or \
            len(sg.tensors[f.inputs[0]].shape) <= _HAL_RANK:
        return None
    path = [f]
    t = f.inputs[0]
    while len(sg.tensors[t].shape) > _HAL_RANK:
        p = producer.get(t)
        if p is None or p.name not in _MOVES or not p.inputs or p.inputs[0] < 0:
            return None
        path.append(p)
        t = p.inputs[0]
    x = sg.tensors[t]
    if not x.has_rank or not all(x.shape) or math.prod(y.shape) > _MAX_MAPPED or \
            hal_type(x)[:3] != hal_type(y)[:3] or hal_type(x)[3] is not None:
        return None
    ids: np.ndarray | None = np.arange(math.prod(x.shape), dtype=np.int32).reshape(x.shape)
    for op in reversed(path):
        ids = _move(sg, op, ids)  # type: ignore[arg-type]
        if ids is None:
            return None
    source = t
    if np.array_equal(ids.reshape(-1), np.arange(ids.size)):  # the elements in order: a reshape

        def reshape(ctx: Context, op: OpInfo) -> None:
            ctx.emit(O.RESHAPE, [ctx.x(source), ctx.ints(list(y.shape))],
                     [ctx.y(op.outputs[0])])
        return reshape, [p.index for p in path[1:]]
    if len(x.shape) != len(y.shape):
        return None
    # Per axis, the source coordinates along the output's first line on that axis; the
    # chain is one pick per axis exactly when every output element is the source element
    # those picks name (one pass over the map, not one per axis).
    rank = len(x.shape)
    picks: list[tuple[int, np.ndarray]] = []
    expected = np.zeros(ids.shape, np.int32)  # type: ignore[union-attr]
    for axis in range(rank):
        stride = math.prod(x.shape[axis + 1:])
        first = tuple(slice(None) if k == axis else 0 for k in range(rank))
        line = ids[first]  # type: ignore[index]
        index = (line // stride) % x.shape[axis]
        expected += (index * stride).astype(np.int32).reshape(
            [-1 if k == axis else 1 for k in range(rank)])
        if len(index) != x.shape[axis] or not np.array_equal(index, np.arange(x.shape[axis])):
            picks.append((axis, index.astype(np.int32)))
    if not np.array_equal(expected, ids):
        return None  # a pick depends on another axis: no GATHER per axis

    def convert(ctx: Context, op: OpInfo) -> None:
        cur = ctx.x(source)
        dims = list(hal_dims(x))
        for k, (axis, index) in enumerate(picks):
            dims[axis] = len(index)
            last = k == len(picks) - 1
            nxt = ctx.y(op.outputs[0]) if last else ctx.like(source, dims)
            ctx.emit(O.GATHER, [cur, ctx.i32(axis), ctx.ints(index)], [nxt])
            cur = nxt
        if not picks:
            ctx.copy_into(cur, ctx.y(op.outputs[0]))
    return convert, [p.index for p in path[1:]]
