"""One converter per TFLite builtin with a HAL equivalent: the operator's options become
HAL scalar operands, and what the HAL spells differently (FULLY_CONNECTED's keep_num_dims,
SPLIT_V, SQUARE, LEAKY_RELU...) becomes a short exact HAL subgraph. BATCH_MATMUL and PACK
become the operations of AIDL v2 (feature level 6), MIRROR_PAD and REVERSE_V2 those of AIDL v3
(feature level 7), and so does an int8 RSQRT; every other builtin maps to HAL 1.3."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from tflite.TensorType import TensorType as TT

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops.common import tflite_compare_ranks, tflite_ranks_exactly
from nnhal.ops.comparison import COMPARE_FUNCS, stored_for_rows
from nnhal.ops.conv import scale_product
from nnhal.tflite import schema
from nnhal.tflite.import_ctx import Context, Unimportable, hal_dims, hal_type, operand_dtype
from nnhal.tflite.import_fold import MAX_FOLD_ELEMENTS
from nnhal.tflite.import_read import OpInfo

T = OperandType
O = OperationType
Converter = Callable[[Context, OpInfo], None]

CONVERTERS: dict[str, Converter] = {}
#: Builtin name -> how it maps (the table `builtin_support` returns).
MAPPED: dict[str, str] = {}


def _conv(name: str, note: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        CONVERTERS[name] = fn
        MAPPED[name] = note
        return fn
    return register


def _padding(p: int) -> int:
    if p not in schema.PADDINGS:
        raise Unimportable(f"padding {p} is not SAME or VALID")
    return schema.PADDINGS[p]


def _rank(ctx: Context, i: int) -> int:
    return len(ctx.t(i).shape)


def _axis(ctx: Context, axis: int, i: int) -> int:
    r = _rank(ctx, i)
    return axis + r if axis < 0 else axis


def _ints_input(ctx: Context, i: int, what: str) -> int:
    """A TENSOR_INT32 operand for an index tensor (int64 constants are narrowed)."""
    t = ctx.t(i)
    if t.value is not None:
        if t.value.dtype == np.int32:
            # Fits as it is (no widening round trip: a folded GATHER index can be megabytes;
            # as an override, the constant holds a copy, placed as a part of the pool).
            return ctx.x(i, type_=T.TENSOR_INT32, value=t.value)
        v = t.value.astype(np.int64)
        if np.any(v != v.astype(np.int32)):
            raise Unimportable(f"{what} does not fit in int32")
        return ctx.x(i, type_=T.TENSOR_INT32, value=v.astype(np.int32))
    if t.ttype != TT.INT32:
        raise Unimportable(f"{what} is {t.type_name} and not constant")
    return ctx.x(i)


def _bias(ctx: Context, op: OpInfo, units: int) -> int:
    """The HAL bias operand: the tensor (with the scale the HAL requires of quantized ones)
    or zeros when the operator has none."""
    x, w = ctx.t(op.inputs[0]), ctx.t(op.inputs[1])
    b = op.inputs[2] if len(op.inputs) > 2 else -1
    quant = x.ttype in (TT.UINT8, TT.INT8)
    if quant:
        wt = hal_type(w)
        scale = 0.0 if wt[3] is not None else scale_product(float(x.scales[0]), wt[1])
        if b < 0:
            return ctx.sb.constant(T.TENSOR_INT32, np.zeros(units, np.int32), [units], scale)
        if ctx.t(b).ttype != TT.INT32:
            raise Unimportable(f"{ctx.t(b).describe()}: bias of a quantized operator must be int32")
        return ctx.x(b, type_=T.TENSOR_INT32, scale=scale, zero_point=0)
    if b < 0:
        ht = hal_type(x)[0]
        return ctx.sb.constant(ht, np.zeros(units, ht.dtype), [units])
    return ctx.x(b)


def _simple(name: str, hal: OperationType, note: str | None = None,
            n_inputs: int = 1) -> None:
    def convert(ctx: Context, op: OpInfo) -> None:
        ins = [ctx.x(i) for i in op.inputs[:n_inputs]]
        ctx.emit(hal, ins, [ctx.y(op.outputs[0])])
    _conv(name, note or hal.name)(convert)


# ---- convolutions and pools ------------------------------------------------------------------

@_conv("CONV_2D", "CONV_2D (padding, strides, dilation, fused activation; per-channel int8)")
def _conv2d(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("Conv2DOptions")
    w = ctx.t(op.inputs[1])
    ins = [ctx.x(op.inputs[0]), ctx.x(op.inputs[1]), _bias(ctx, op, w.shape[0]),
           ctx.i32(_padding(o.Padding())), ctx.i32(o.StrideW()), ctx.i32(o.StrideH())]
    code, out = ctx.fused(o.FusedActivationFunction(), op.outputs[0])
    ins.append(ctx.i32(code))
    if o.DilationWFactor() != 1 or o.DilationHFactor() != 1:
        ins += [ctx.bool_(False), ctx.i32(o.DilationWFactor()), ctx.i32(o.DilationHFactor())]
    ctx.emit(O.CONV_2D, ins, [out])


@_conv("DEPTHWISE_CONV_2D", "DEPTHWISE_CONV_2D (depth multiplier, dilation, fused activation)")
def _depthwise(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("DepthwiseConv2DOptions")
    x, w = ctx.t(op.inputs[0]), ctx.t(op.inputs[1])
    cin, cout = x.shape[-1], w.shape[-1]
    if cin <= 0 or cout % cin:
        raise Unimportable("depth multiplier needs a known input depth dividing the filter depth")
    ins = [ctx.x(op.inputs[0]), ctx.x(op.inputs[1]), _bias(ctx, op, cout),
           ctx.i32(_padding(o.Padding())), ctx.i32(o.StrideW()), ctx.i32(o.StrideH()),
           ctx.i32(cout // cin)]
    code, out = ctx.fused(o.FusedActivationFunction(), op.outputs[0])
    ins.append(ctx.i32(code))
    if o.DilationWFactor() != 1 or o.DilationHFactor() != 1:
        ins += [ctx.bool_(False), ctx.i32(o.DilationWFactor()), ctx.i32(o.DilationHFactor())]
    ctx.emit(O.DEPTHWISE_CONV_2D, ins, [out])


@_conv("TRANSPOSE_CONV", "TRANSPOSE_CONV_2D (output_shape input, padding, strides, bias)")
def _transpose_conv(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("TransposeConvOptions")
    shape_i, w_i, x_i = op.inputs[:3]
    w = ctx.t(w_i)
    fake = OpInfo(op.index, op.name, op.code, [x_i, w_i] + op.inputs[3:4], op.outputs)
    act = o.FusedActivationFunction() if hasattr(o, "FusedActivationFunction") else 0
    ins = [ctx.x(x_i), ctx.x(w_i), _bias(ctx, fake, w.shape[0]),
           _ints_input(ctx, shape_i, "output_shape"), ctx.i32(_padding(o.Padding())),
           ctx.i32(o.StrideW()), ctx.i32(o.StrideH())]
    code, out = ctx.fused(act, op.outputs[0])
    ctx.emit(O.TRANSPOSE_CONV_2D, ins + [ctx.i32(code), ctx.bool_(False)], [out])


def _pool(name: str, hal: OperationType) -> None:
    def convert(ctx: Context, op: OpInfo) -> None:
        o = ctx.options("Pool2DOptions")
        ins = [ctx.x(op.inputs[0]), ctx.i32(_padding(o.Padding())), ctx.i32(o.StrideW()),
               ctx.i32(o.StrideH()), ctx.i32(o.FilterWidth()), ctx.i32(o.FilterHeight())]
        code, out = ctx.fused(o.FusedActivationFunction(), op.outputs[0])
        ctx.emit(hal, ins + [ctx.i32(code)], [out])
    _conv(name, f"{hal.name} (padding, strides, filter, fused activation)")(convert)


_pool("AVERAGE_POOL_2D", O.AVERAGE_POOL_2D)
_pool("MAX_POOL_2D", O.MAX_POOL_2D)
_pool("L2_POOL_2D", O.L2_POOL_2D)


@_conv("FULLY_CONNECTED", "FULLY_CONNECTED (keep_num_dims as a RESHAPE after it; per-channel "
                         "int8 weights as RESHAPE + 1x1 CONV_2D + RESHAPE)")
def _fully_connected(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("FullyConnectedOptions")
    if o.WeightsFormat() != 0:
        raise Unimportable("shuffled weights format has no HAL equivalent")
    w = ctx.t(op.inputs[1])
    x = ctx.t(op.inputs[0])
    if w.ttype in (TT.INT8, TT.UINT8) and x.ttype == TT.FLOAT32:
        raise Unimportable("hybrid (float input, quantized weights) has no HAL equivalent")
    if w.quantized and w.scales.size > 1:
        _fully_connected_per_channel(ctx, op, o.FusedActivationFunction())
        return
    units = w.shape[0]
    ins = [ctx.x(op.inputs[0]), ctx.x(op.inputs[1]), _bias(ctx, op, units)]
    out_t = ctx.t(op.outputs[0])
    if len(out_t.shape) == 2 or not o.KeepNumDims():
        code, out = ctx.fused(o.FusedActivationFunction(), op.outputs[0])
        ctx.emit(O.FULLY_CONNECTED, ins + [ctx.i32(code)], [out])
        return
    if not out_t.static:
        raise Unimportable("keep_num_dims with an unknown output shape")
    batch = math.prod(map(int, out_t.shape[:-1]))
    flat = ctx.like(op.outputs[0], [batch, units])
    code = schema.ACTIVATIONS.get(o.FusedActivationFunction())
    if code is None:
        raise Unimportable("fused activation has no HAL FuseCode")
    ctx.emit(O.FULLY_CONNECTED, ins + [ctx.i32(code)], [flat])
    ctx.emit(O.RESHAPE, [flat, ctx.ints(out_t.shape)], [ctx.y(op.outputs[0])])


def _fully_connected_per_channel(ctx: Context, op: OpInfo, act: int) -> None:
    """Per-channel weights, which the HAL's FULLY_CONNECTED (per-tensor) cannot hold: the rows
    [N, K] as a 1x1 image [N, 1, 1, K], a 1x1 CONV_2D with the [O, 1, 1, K] filter quantized
    per output channel, and the result [N, 1, 1, O] reshaped to the output. The convolution
    requantizes each channel by input_scale * filter_scale[c] / output_scale, as TFLite's
    per-channel fully connected kernel does, so the integers are the same. The exporter
    writes the three back as one FULLY_CONNECTED (:mod:`nnhal.tflite.export_fuse`)."""
    x, w, out_t = ctx.t(op.inputs[0]), ctx.t(op.inputs[1]), ctx.t(op.outputs[0])
    if w.qdim != 0 or len(w.shape) != 2:
        raise Unimportable("per-channel weights quantized along a dimension other than the "
                           "output channels")
    units, depth = w.shape
    if not x.static or not out_t.static or depth <= 0 or units <= 0:
        raise Unimportable("per-channel weights with an unknown input or output shape")
    size = math.prod(map(int, x.shape))
    if size % depth:
        raise Unimportable(f"input of {size} values is not rows of the weights' depth {depth}")
    rows = size // depth
    if math.prod(map(int, out_t.shape)) != rows * units:
        raise Unimportable(f"output shape {list(out_t.shape)} is not {rows} rows of {units}")
    image = ctx.like(op.inputs[0], [rows, 1, 1, depth])
    ctx.emit(O.RESHAPE, [ctx.x(op.inputs[0]), ctx.ints([rows, 1, 1, depth])], [image])
    code = schema.ACTIVATIONS.get(act)
    if code is None:
        raise Unimportable("fused activation has no HAL FuseCode")
    conv = ctx.like(op.outputs[0], [rows, 1, 1, units])
    ins = [image, ctx.x(op.inputs[1], dims=[units, 1, 1, depth]), _bias(ctx, op, units)]
    ins += [ctx.i32(schema.PADDING_VALID), ctx.i32(1), ctx.i32(1), ctx.i32(code)]
    ctx.emit(O.CONV_2D, ins, [conv])
    ctx.emit(O.RESHAPE, [conv, ctx.ints(out_t.shape)], [ctx.y(op.outputs[0])])


# ---- elementwise -----------------------------------------------------------------------------

#: ai-edge-litert's 8-bit ADD with an input scale this many times the output's, and MUL with
#: the product of the input scales this many times the output's, give results 255 steps off
#: the exact ones (XNNPACK takes ratios below it, the builtin kernel past it overflows its
#: fixed point; measured: 2^7.9 agrees, 2^8 does not, int8 and uint8): no HAL form computes
#: that, so such an operator is refused, not computed right where TFLite's is wrong.
_OVERFLOWING_RATIO = 256.0


def _overflows(name: str, ctx: Context, op: OpInfo) -> str | None:
    a, b, out = (ctx.t(i) for i in (*op.inputs[:2], op.outputs[0]))
    if name not in ("ADD", "MUL") or out.ttype not in (TT.INT8, TT.UINT8):
        return None
    scales = [hal_type(t)[1] for t in (a, b, out)]
    f32 = np.float32
    ratio = float((max(f32(scales[0]), f32(scales[1])) if name == "ADD" else
                   f32(scales[0]) * f32(scales[1])) / f32(scales[2])) if scales[2] else math.inf
    if ratio < _OVERFLOWING_RATIO:
        return None
    what = "the larger input scale" if name == "ADD" else "the product of the input scales"
    return (f"8-bit {name} with {what} {ratio:.4g} times the output's (256 or more): "
            f"ai-edge-litert's kernel overflows its fixed point there (results off by up to "
            f"255 steps), which no HAL form reproduces")


def _binary_fused(name: str, hal: OperationType) -> None:
    def convert(ctx: Context, op: OpInfo) -> None:
        why = _overflows(name, ctx, op)
        if why is not None:
            raise Unimportable(why)
        o = op.options
        act = o.FusedActivationFunction() if o is not None else 0
        a, b = ctx.x(op.inputs[0]), ctx.x(op.inputs[1])
        code, out = ctx.fused(act, op.outputs[0])
        ctx.emit(hal, [a, b, ctx.i32(code)], [out])
    _conv(name, f"{hal.name} (broadcast, fused activation)")(convert)


_binary_fused("ADD", O.ADD)
_binary_fused("SUB", O.SUB)
_binary_fused("MUL", O.MUL)
_binary_fused("DIV", O.DIV)

for _n in ("POW", "LOGICAL_AND", "LOGICAL_OR", "PRELU"):
    _simple(_n, getattr(O, _n), n_inputs=2)


def _max_min(name: str, hal: OperationType) -> None:
    def convert(ctx: Context, op: OpInfo) -> None:
        """TFLite's 8-bit MAXIMUM / MINIMUM compare and keep stored values, whatever the
        inputs' quantization (none rescales); the HAL's rescales each input to the output's
        first. So an input of another quantization is first CAST (which keeps stored values)
        to the output's: then the HAL's operation keeps stored values too."""
        out = ctx.t(op.outputs[0])
        ins = [ctx.x(i) for i in op.inputs[:2]]
        if out.ttype in (TT.INT8, TT.UINT8):
            ht, so, zo, cq = hal_type(out)
            for k, i in enumerate(op.inputs[:2]):
                _, sc, zp, icq = hal_type(ctx.t(i))
                if cq is None and icq is None and (sc, zp) != (so, zo):
                    kept = ctx.tmp(ht, hal_dims(ctx.t(i)), so, zo)
                    ctx.emit(O.CAST, [ins[k]], [kept])
                    ins[k] = kept
        ctx.emit(hal, ins, [ctx.y(op.outputs[0])])
    _conv(name, f"{hal.name} (8-bit: of stored values, as TFLite's)")(convert)


_max_min("MAXIMUM", O.MAXIMUM)
_max_min("MINIMUM", O.MINIMUM)


def _tflite_tables(ctx: Context, op: OpInfo, fn: Callable[..., np.ndarray]
                   ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray] | None:
    """A quantized comparison of a tensor with a constant as TFLite computes it: (the
    constant's position, the other's stored values q, per distinct constant value the
    result for every q, each constant element's row), or None where neither input is a
    per-tensor 8-bit constant (or a scale is 1 or more)."""
    a, b = (ctx.t(i) for i in op.inputs[:2])
    if a.ttype not in (TT.INT8, TT.UINT8) or (a.value is None) == (b.value is None):
        return None
    c = 0 if a.value is not None else 1
    con, var = (a, b) if c == 0 else (b, a)
    quant = [hal_type(t) for t in (var, con)]
    if any(cq is not None for *_, cq in quant):
        return None
    (_, vs, vz, _), (_, cs, cz, _) = quant
    q = np.arange(-128, 128) if a.ttype == TT.INT8 else np.arange(256)
    values, where = np.unique(np.asarray(con.value), return_inverse=True)
    rq, rc = tflite_compare_ranks(q, vs, vz), tflite_compare_ranks(values, cs, cz)
    if rq is None or rc is None:
        return None
    rows = fn(rc[:, None], rq[None, :]) if c == 0 else fn(rq[None, :], rc[:, None])
    return c, q, rows, where.reshape(np.shape(con.value))


def _one_comparison(c: int, q: np.ndarray, rows: np.ndarray, first: OperationType
                    ) -> tuple[OperationType, np.ndarray] | None:
    """One HAL comparison (``first`` tried first) of the tensor with stored values in its
    own quantization (which the HAL compares as the stored values) giving each row."""
    for hal in (first, *(k for k in COMPARE_FUNCS if k != first)):
        candidates = stored_for_rows(COMPARE_FUNCS[hal], q, c == 0)
        found = [candidates.get(row.tobytes()) for row in rows]
        if all(k is not None for k in found):
            return hal, np.asarray(found, np.int64)
    return None


def _intervals(q: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row, the first and last stored values of a run of trues (the last then the
    first where there are none), or None where a row is no single run."""
    lo, hi = np.empty(len(rows), np.int64), np.empty(len(rows), np.int64)
    for n, row in enumerate(rows):
        idx = np.flatnonzero(row)
        if not len(idx):
            lo[n], hi[n] = q[-1], q[0]
        elif idx[-1] - idx[0] + 1 == len(idx):
            lo[n], hi[n] = q[idx[0]], q[idx[-1]]
        else:
            return None
    return lo, hi


def _tflite_only(ctx: Context, op: OpInfo) -> str | None:
    """Why the HAL's comparison of real values is not TFLite's comparison of two 8-bit
    tensors (None where it is: neither is quantized, or both share one quantization whose
    rescale ranks exactly, or a scale is 1 or more, which nobody can compute as TFLite
    does)."""
    a, b = (ctx.t(i) for i in op.inputs[:2])
    if a.ttype not in (TT.INT8, TT.UINT8):
        return None
    quant = [hal_type(t) for t in (a, b)]
    if any(cq is not None or not 0.0 < sc < 1.0 for _, sc, _, cq in quant):
        return None
    (_, sa, za, _), (_, sb, zb, _) = quant
    if (sa, za) == (sb, zb) and tflite_ranks_exactly(sa):
        return None
    return (f"TFLite compares the two tensors' stored values rescaled in fixed point "
            f"(scales {sa:.6g} and {sb:.6g}), more coarsely than the HAL's real values")


def _comparison(name: str, hal: OperationType) -> None:
    """TFLite compares 8-bit values rescaled in fixed point
    (:func:`~nnhal.ops.common.tflite_compare_ranks`), more coarsely than the HAL compares
    real values wherever a scale is below 2/256 or the two differ. Against a constant it is
    rewritten exactly: a comparison with stored values in the tensor's own quantization (the
    original operation first, so the converter's comparison with a threshold comes back as it
    was), else where each result is a run of stored values (EQUAL at a coarse scale),
    GREATER_EQUAL and LESS_EQUAL joined by LOGICAL_AND, or its complement by LOGICAL_OR. Two
    tensors whose comparison the HAL's would not reproduce go to the extension's operation of
    the same name, which computes as TFLite (Unimportable here)."""
    def convert(ctx: Context, op: OpInfo) -> None:
        found = _tflite_tables(ctx, op, COMPARE_FUNCS[hal])
        if found is None:
            why = _tflite_only(ctx, op)
            if why is not None:
                raise Unimportable(why)
            ctx.emit(hal, [ctx.x(i) for i in op.inputs[:2]], [ctx.y(op.outputs[0])])
            return
        c, q, rows, where = found
        x = ctx.x(op.inputs[1 - c])
        _, vs, vz, _ = hal_type(ctx.t(op.inputs[1 - c]))
        dtype = ctx.t(op.inputs[c]).value.dtype

        def k(values: np.ndarray) -> int:
            return ctx.x(op.inputs[c], scale=vs, zero_point=vz,
                         value=values[where].astype(dtype))

        one = _one_comparison(c, q, rows, hal)
        if one is not None:
            ins = [x, x]
            ins[c] = k(one[1])
            ctx.emit(one[0], ins, [ctx.y(op.outputs[0])])
            return
        runs, join, tests = _intervals(q, rows), O.LOGICAL_AND, (O.GREATER_EQUAL, O.LESS_EQUAL)
        if runs is None:
            runs, join, tests = _intervals(q, ~rows), O.LOGICAL_OR, (O.LESS, O.GREATER)
        if runs is None:  # (a fixed-point rescale is monotonic: unreachable)
            raise Unimportable(f"quantized {name} against a constant has no exact HAL form")
        dims = hal_dims(ctx.t(op.outputs[0]))
        parts = [ctx.tmp(T.TENSOR_BOOL8, dims) for _ in tests]
        for test, bound, part in zip(tests, runs, parts):
            ctx.emit(test, [x, k(bound)], [part])
        ctx.emit(join, parts, [ctx.y(op.outputs[0])])
    _conv(name, f"{hal.name} (8-bit against a constant: as TFLite's fixed point ranks)")(
        convert)


for _n in ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL"):
    _comparison(_n, getattr(O, _n))
for _n in ("ABS", "EXP", "LOG", "NEG", "SQRT", "RSQRT", "SIN", "FLOOR", "LOGICAL_NOT",
           "LOGISTIC", "TANH", "HARD_SWISH"):
    _simple(_n, getattr(O, _n))


def _clamp(name: str, hal: OperationType) -> None:
    def convert(ctx: Context, op: OpInfo) -> None:
        """RELU, RELU6, RELU_N1_TO_1. 8-bit with an output quantization other than the
        input's (which the HAL's must keep; TFLite's rescales, then clamps): the clamp in
        float32 between DEQUANTIZE and QUANTIZE, one rounding as TFLite's one rescale."""
        x, y = ctx.t(op.inputs[0]), ctx.t(op.outputs[0])
        if x.ttype in (TT.INT8, TT.UINT8) and hal_type(x)[1:] != hal_type(y)[1:]:
            real = ctx.tmp(T.TENSOR_FLOAT32, hal_dims(x))
            ctx.emit(O.DEQUANTIZE, [ctx.x(op.inputs[0])], [real])
            clamped = ctx.tmp(T.TENSOR_FLOAT32, hal_dims(x))
            ctx.emit(hal, [real], [clamped])
            ctx.emit(O.QUANTIZE, [clamped], [ctx.y(op.outputs[0])])
            return
        ctx.emit(hal, [ctx.x(op.inputs[0])], [ctx.y(op.outputs[0])])
    _conv(name, f"{hal.name} (8-bit requantizing: in float32)")(convert)


_clamp("RELU", O.RELU)
_clamp("RELU6", O.RELU6)
_clamp("RELU_N1_TO_1", O.RELU1)


@_conv("ADD_N", "a chain of ADDs, in TFLite's summation order")
def _add_n(ctx: Context, op: OpInfo) -> None:
    if ctx.t(op.inputs[0]).ttype not in (TT.FLOAT32, TT.FLOAT16, TT.INT32):
        raise Unimportable("quantized ADD_N has no exact HAL form")
    acc = ctx.x(op.inputs[0])
    for k, i in enumerate(op.inputs[1:], start=2):
        out = ctx.y(op.outputs[0]) if k == len(op.inputs) else ctx.like(op.outputs[0])
        ctx.emit(O.ADD, [acc, ctx.x(i), ctx.i32(0)], [out])
        acc = out
    if len(op.inputs) == 1:
        ctx.copy_into(acc, ctx.y(op.outputs[0]))


@_conv("SQUARED_DIFFERENCE", "SUB then MUL by itself (float only)")
def _squared_difference(ctx: Context, op: OpInfo) -> None:
    if ctx.t(op.inputs[0]).ttype not in (TT.FLOAT32, TT.FLOAT16):
        raise Unimportable("quantized SQUARED_DIFFERENCE has no exact HAL form")
    d = ctx.like(op.outputs[0])
    ctx.emit(O.SUB, [ctx.x(op.inputs[0]), ctx.x(op.inputs[1]), ctx.i32(0)], [d])
    ctx.emit(O.MUL, [d, d, ctx.i32(0)], [ctx.y(op.outputs[0])])


@_conv("ELU", "ELU (alpha 1)")
def _elu(ctx: Context, op: OpInfo) -> None:
    ctx.emit(O.ELU, [ctx.x(op.inputs[0]), ctx.scalar_float(op.inputs[0], 1.0)],
             [ctx.y(op.outputs[0])])


@_conv("SQUARE", "MUL x x")
def _square(ctx: Context, op: OpInfo) -> None:
    x = ctx.x(op.inputs[0])
    ctx.emit(O.MUL, [x, x, ctx.i32(0)], [ctx.y(op.outputs[0])])


@_conv("LEAKY_RELU", "PRELU with a constant alpha (8-bit: alpha as a one-step constant)")
def _leaky_relu(ctx: Context, op: OpInfo) -> None:
    """PRELU with alpha a constant [1]. 8-bit: TFLite rescales the negative values by alpha x
    input scale / output scale, the others by input scale / output scale; the HAL's PRELU
    rescales by input scale x alpha's scale / output scale times (alpha's stored value -
    its zero point): so alpha is one step of scale |alpha| (sign in the step; 0 steps for
    alpha 0), the same two multipliers up to the last bit of their float arithmetic."""
    x = ctx.t(op.inputs[0])
    alpha = float(np.float32(ctx.options("LeakyReluOptions").Alpha()))
    ht = hal_type(x)[0]
    if x.ttype in (TT.FLOAT32, TT.FLOAT16):
        value = np.asarray([alpha], schema.DTYPES[x.ttype])
        a = ctx.sb.constant(ht, value, [1])
    elif x.ttype in (TT.INT8, TT.UINT8) and math.isfinite(alpha):
        step = 0 if alpha == 0 else 1 if alpha > 0 else -1
        zero = 0 if step >= 0 else 1
        a = ctx.sb.constant(ht, np.asarray([zero + step], operand_dtype(ht)), [1],
                            abs(alpha) or 1.0, zero)
    else:
        raise Unimportable("quantized LEAKY_RELU with this type or alpha has no exact HAL form")
    ctx.emit(O.PRELU, [ctx.x(op.inputs[0]), a], [ctx.y(op.outputs[0])])


@_conv("SELECT", "SELECT (same shapes)")
def _select(ctx: Context, op: OpInfo) -> None:
    shapes = {ctx.t(i).shape for i in op.inputs}
    if len(shapes) != 1 and op.name == "SELECT_V2":
        raise Unimportable("SELECT_V2 broadcasting has no HAL equivalent")
    ctx.emit(O.SELECT, [ctx.x(i) for i in op.inputs[:3]], [ctx.y(op.outputs[0])])


CONVERTERS["SELECT_V2"] = _select
MAPPED["SELECT_V2"] = "SELECT (operands of equal shapes only)"


@_conv("CAST", "CAST (bool to numbers: SELECT of ones and zeros)")
def _cast(ctx: Context, op: OpInfo) -> None:
    """The HAL's CAST takes no bool: a bool to float or int32 (a mask, as tf.cast writes it)
    is a SELECT between ones and zeros of the output's type and (static) shape."""
    x, y = ctx.t(op.inputs[0]), ctx.t(op.outputs[0])
    if x.ttype != TT.BOOL:
        ctx.emit(O.CAST, [ctx.x(op.inputs[0])], [ctx.y(op.outputs[0])])
        return
    ht = hal_type(y)[0]
    dims = hal_dims(y)
    if ht not in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32) or y.quantized:
        raise Unimportable(f"CAST of bool to {ht.name} has no HAL form")
    if not dims or not all(dims) or tuple(dims) != tuple(hal_dims(x)):
        raise Unimportable("CAST of bool needs a static shape (a SELECT between constants)")
    dtype = operand_dtype(ht)
    ones, zeros = (ctx.sb.constant(ht, np.full(dims, v, dtype), list(dims)) for v in (1, 0))
    ctx.emit(O.SELECT, [ctx.x(op.inputs[0]), ones, zeros], [ctx.y(op.outputs[0])])


@_conv("QUANTIZE", "QUANTIZE (requantization as DEQUANTIZE + QUANTIZE)")
def _quantize(ctx: Context, op: OpInfo) -> None:
    x = ctx.t(op.inputs[0])
    if x.ttype in (TT.FLOAT32, TT.FLOAT16):
        ctx.emit(O.QUANTIZE, [ctx.x(op.inputs[0])], [ctx.y(op.outputs[0])])
        return
    real = ctx.tmp(T.TENSOR_FLOAT32, x.shape)
    ctx.emit(O.DEQUANTIZE, [ctx.x(op.inputs[0])], [real])
    ctx.emit(O.QUANTIZE, [real], [ctx.y(op.outputs[0])])


@_conv("DEQUANTIZE", "DEQUANTIZE (float16 -> float32 as CAST; constants folded)")
def _dequantize(ctx: Context, op: OpInfo) -> None:
    x = ctx.t(op.inputs[0])
    hal = O.CAST if x.ttype == TT.FLOAT16 else O.DEQUANTIZE
    ctx.emit(hal, [ctx.x(op.inputs[0])], [ctx.y(op.outputs[0])])


# ---- activations with parameters -------------------------------------------------------------

@_conv("SOFTMAX", "SOFTMAX (beta; a quantized input too finely scaled for the HAL's integer "
                 "kernel through float32)")
def _softmax(ctx: Context, op: OpInfo) -> None:
    beta = ctx.options("SoftmaxOptions").Beta()
    x = ctx.t(op.inputs[0])
    if x.quantized and x.ttype in (TT.INT8, TT.UINT8) and \
            beta * float(x.scales[0]) * (1 << 26) <= 1.0:
        # The HAL's integer softmax (like TFLite's own reference kernel) scales input
        # differences by a multiplier that must exceed one, so it cannot run an input whose
        # whole range spans under ~4e-6 (a calibration of near-constant logits). TFLite's
        # int8 kernel computes exp in float; so does this: DEQUANTIZE, SOFTMAX, QUANTIZE
        # (which the exporter writes back as the 8-bit SOFTMAX).
        shape = hal_dims(x)
        real = ctx.tmp(T.TENSOR_FLOAT32, shape)
        prob = ctx.tmp(T.TENSOR_FLOAT32, shape)
        ctx.emit(O.DEQUANTIZE, [ctx.x(op.inputs[0])], [real])
        ctx.emit(O.SOFTMAX, [real, ctx.f32(beta)], [prob])
        ctx.emit(O.QUANTIZE, [prob], [ctx.y(op.outputs[0])])
        return
    ctx.emit(O.SOFTMAX, [ctx.x(op.inputs[0]), ctx.scalar_float(op.inputs[0], beta)],
             [ctx.y(op.outputs[0])])


@_conv("LOG_SOFTMAX", "LOG_SOFTMAX (beta 1, last axis)")
def _log_softmax(ctx: Context, op: OpInfo) -> None:
    ctx.emit(O.LOG_SOFTMAX, [ctx.x(op.inputs[0]), ctx.scalar_float(op.inputs[0], 1.0),
                             ctx.i32(-1)], [ctx.y(op.outputs[0])])


@_conv("L2_NORMALIZATION", "L2_NORMALIZATION (last axis)")
def _l2norm(ctx: Context, op: OpInfo) -> None:
    act = ctx.options("L2NormOptions").FusedActivationFunction()
    out = ctx.activated(act, op.outputs[0])
    ctx.emit(O.L2_NORMALIZATION, [ctx.x(op.inputs[0])], [out])


@_conv("LOCAL_RESPONSE_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION (radius, bias, alpha, "
       "beta)")
def _lrn(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("LocalResponseNormalizationOptions")
    i = op.inputs[0]
    ctx.emit(O.LOCAL_RESPONSE_NORMALIZATION,
             [ctx.x(i), ctx.i32(o.Radius()), ctx.scalar_float(i, o.Bias()),
              ctx.scalar_float(i, o.Alpha()), ctx.scalar_float(i, o.Beta())],
             [ctx.y(op.outputs[0])])


# ---- shapes and data movement ----------------------------------------------------------------

#: Operand types the HAL's RESHAPE takes.
_RESHAPABLE = {T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM,
               T.TENSOR_QUANT8_ASYMM_SIGNED}


def _reshape_exact(ctx: Context, src: int, dst: int) -> None:
    """Operand ``src`` written into ``dst`` (same type and element count, static ``dst``
    dimensions) by RESHAPE, or for the types the HAL's RESHAPE does not take (the int32
    counters a Keras loop reshapes between a scalar and [1]) by an exact copy when the HAL
    dimensions are equal or a GATHER of every element when ``src`` is one-dimensional."""
    src_o, dst_o = ctx.sb.operands[src], ctx.sb.operands[dst]
    ht = T(src_o.type)
    dims = list(dst_o.dimensions)
    if ht in _RESHAPABLE:
        ctx.emit(O.RESHAPE, [src, ctx.ints(dims)], [dst])
    elif list(src_o.dimensions) == dims:
        ctx.copy_into(src, dst)
    elif len(src_o.dimensions) == 1 and dims and all(d > 0 for d in dims) and \
            math.prod(dims) == src_o.dimensions[0] <= MAX_FOLD_ELEMENTS:
        ctx.emit(O.GATHER, [src, ctx.i32(0), ctx.ints(np.arange(math.prod(dims)), dims)],
                 [dst])
    else:
        raise Unimportable(f"the HAL's RESHAPE does not take {ht.name} and no exact copy or GATHER "
                           f"gives {list(src_o.dimensions)} -> {dims}")


#: TfLiteReshapeParams holds at most this many dimensions of the options' new_shape.
_RESHAPE_MAX_DIMS = 8


def _reshape_target(ctx: Context, op: OpInfo) -> list[int] | None:
    """The shape TFLite's RESHAPE asks for: the shape input's value when it is a 1-D int32
    tensor (None when that is only known at run time), else the options' new_shape ([0]
    is the legacy scalar, no options is the scalar [])."""
    opts = op.options.NewShapeAsNumpy().tolist() if op.options.NewShapeLength() else []
    if len(opts) > _RESHAPE_MAX_DIMS:  # TFLite's parser refuses the options themselves
        raise Unimportable(f"new_shape has {len(opts)} dimensions (TFLite holds at most "
                           f"{_RESHAPE_MAX_DIMS})")
    if len(op.inputs) == 2 and op.inputs[1] >= 0:
        shape = ctx.t(op.inputs[1])
        if shape.value is None and not shape.has_data and op.inputs[1] not in ctx.operands \
                and shape.has_rank and len(shape.shape) == 1 and not shape.zero_sized:
            # Even one that is then ignored: TFLite's Invoke refuses an input without data
            # (only a shape input of another rank is spared).
            raise Unimportable(f"{shape.describe()} is read before any operator writes it")
        if shape.ttype == TT.INT32 and shape.has_rank and len(shape.shape) == 1:
            value = ctx.value(op.inputs[1])
            return None if value is None else [int(d) for d in value]
    # Any other shape input (another type or rank, constant or not) is ignored, in Prepare
    # and in Eval alike.
    return [] if opts == [0] else [int(d) for d in opts]


def _check_new_shape(ctx: Context, op: OpInfo) -> None:
    """TFLite's RESHAPE resolves its target shape against the input in Prepare (at most one
    -1, inferred from the non-zero dimensions; no other negative; the element counts equal)
    and refuses the model otherwise; the declared output shape is only a hint it
    overwrites, so one that disagrees would silently give another result here."""
    new = reshape_target(ctx, op)
    out = ctx.t(op.outputs[0])
    if new is not None and out.static and list(out.shape) != new:
        raise Unimportable(f"new shape {new} is not the output's declared {list(out.shape)}")


def reshape_target(ctx: Context, op: OpInfo) -> list[int] | None:
    """The output shape TFLite's RESHAPE gives (its -1 resolved), refused as its Prepare
    refuses it; None when only known at run time (a computed shape input, an input of
    unknown dimensions with a -1 to infer)."""
    new = _reshape_target(ctx, op)
    if new is None:
        return None
    if sum(d == -1 for d in new) > 1 or any(d < -1 for d in new):
        raise Unimportable(f"new shape {new} is not a shape (one -1 at most, no other negative)")
    x = ctx.t(op.inputs[0])
    if not (x.has_rank and (x.static or x.zero_sized)):
        return None if -1 in new else new
    count = math.prod(x.shape) if x.static else 0
    if -1 in new:
        rest = math.prod([d for d in new if d not in (-1, 0)])
        if count == 0 and 0 not in new:
            inferred = 0
        else:
            inferred = math.prod([d for d in x.shape if d]) // rest
        if inferred >= 1 << 31:
            raise Unimportable(f"new shape {new} infers a dimension of {inferred}")
        new = [inferred if d == -1 else d for d in new]
    if math.prod(new) != count:
        raise Unimportable(f"new shape {new} does not hold the input's {count} elements")
    return new


@_conv("RESHAPE", "RESHAPE (new shape from the output, the shape input or the options; "
                  "int32 between equal HAL shapes as a copy, from one dimension as GATHER)")
def _reshape(ctx: Context, op: OpInfo) -> None:
    _check_new_shape(ctx, op)
    out = ctx.t(op.outputs[0])
    if hal_type(ctx.t(op.inputs[0]))[0] not in _RESHAPABLE and out.static:
        _reshape_exact(ctx, ctx.x(op.inputs[0]), ctx.y(op.outputs[0]))
        return
    if out.static:
        shape = ctx.ints(out.shape)
    elif len(op.inputs) > 1 and op.inputs[1] >= 0:
        shape = _ints_input(ctx, op.inputs[1], "new shape")
    elif op.options is not None and op.options.NewShapeLength():
        shape = ctx.ints([int(d) for d in op.options.NewShapeAsNumpy()])
    else:
        raise Unimportable("no new shape")
    ctx.emit(O.RESHAPE, [ctx.x(op.inputs[0]), shape], [ctx.y(op.outputs[0])])


@_conv("SQUEEZE", "SQUEEZE (squeeze_dims)")
def _squeeze(ctx: Context, op: OpInfo) -> None:
    o = op.options
    ins = [ctx.x(op.inputs[0])]
    if o is not None and o.SqueezeDimsLength():
        ins.append(ctx.ints([_axis(ctx, int(d), op.inputs[0]) for d in
                             o.SqueezeDimsAsNumpy()]))
    ctx.emit(O.SQUEEZE, ins, [ctx.y(op.outputs[0])])


@_conv("EXPAND_DIMS", "EXPAND_DIMS (constant axis)")
def _expand_dims(ctx: Context, op: OpInfo) -> None:
    axis = int(ctx.need_value(op.inputs[1], "axis").reshape(-1)[0])
    ctx.emit(O.EXPAND_DIMS, [ctx.x(op.inputs[0]), ctx.i32(axis)], [ctx.y(op.outputs[0])])


@_conv("TRANSPOSE", "TRANSPOSE")
def _transpose(ctx: Context, op: OpInfo) -> None:
    ctx.emit(O.TRANSPOSE, [ctx.x(op.inputs[0]), _ints_input(ctx, op.inputs[1], "perm")],
             [ctx.y(op.outputs[0])])


@_conv("CONCATENATION", "CONCATENATION (no fused activation)")
def _concat(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("ConcatenationOptions")
    if o.FusedActivationFunction() != 0:
        # TFLite's own kernel rejects it and its XNNPACK delegate ignores it: no meaning to keep.
        raise Unimportable("a fused activation on CONCATENATION is rejected by TFLite's kernel")
    ins = [ctx.x(i) for i in op.inputs]
    out = ctx.y(op.outputs[0])
    ctx.emit(O.CONCATENATION, ins + [ctx.i32(_axis(ctx, o.Axis(), op.outputs[0]))], [out])


@_conv("PAD", "PAD")
def _pad(ctx: Context, op: OpInfo) -> None:
    ctx.emit(O.PAD, [ctx.x(op.inputs[0]), _ints_input(ctx, op.inputs[1], "paddings")],
             [ctx.y(op.outputs[0])])


@_conv("PADV2", "PAD_V2 (constant pad value)")
def _padv2(ctx: Context, op: OpInfo) -> None:
    x = ctx.t(op.inputs[0])
    v = ctx.need_value(op.inputs[2], "pad value").reshape(-1)[0]
    if x.ttype == TT.FLOAT32:
        pad = ctx.f32(float(v))
    elif x.ttype == TT.FLOAT16:
        pad = ctx.f16(float(v))
    else:
        pad = ctx.i32(int(v))
    ctx.emit(O.PAD_V2, [ctx.x(op.inputs[0]), _ints_input(ctx, op.inputs[1], "paddings"), pad],
             [ctx.y(op.outputs[0])])


@_conv("SLICE", "SLICE")
def _slice(ctx: Context, op: OpInfo) -> None:
    ctx.emit(O.SLICE, [ctx.x(op.inputs[0]), _ints_input(ctx, op.inputs[1], "begin"),
                       _ints_input(ctx, op.inputs[2], "size")], [ctx.y(op.outputs[0])])


@_conv("STRIDED_SLICE", "STRIDED_SLICE (begin/end/shrink masks; offset with constants; "
       "ellipsis and new-axis masks refused)")
def _strided_slice(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("StridedSliceOptions")
    if o.EllipsisMask() or o.NewAxisMask():
        raise Unimportable("ellipsis / new-axis masks have no HAL equivalent")
    rank = _rank(ctx, op.inputs[0])
    begin_m, end_m, shrink = o.BeginMask(), o.EndMask(), o.ShrinkAxisMask()
    values = [ctx.value(i) for i in op.inputs[1:4]]
    offset = bool(o.Offset()) if hasattr(o, "Offset") else False
    if all(v is not None for v in values):
        b, e, s = (np.asarray(v, np.int64).reshape(-1) for v in values)
        if offset:
            e = b + e
        n = len(b)
        if n < rank:  # the HAL wants one entry per dimension
            b = np.concatenate([b, np.zeros(rank - n, np.int64)])
            e = np.concatenate([e, np.zeros(rank - n, np.int64)])
            s = np.concatenate([s, np.ones(rank - n, np.int64)])
            full = ((1 << rank) - 1) & ~((1 << n) - 1)
            begin_m, end_m = begin_m | full, end_m | full
        shape = ctx.t(op.inputs[0]).shape
        for d in range(rank):
            if shrink >> d & 1:  # TFLite ignores end here; the HAL wants end = begin + 1
                k = int(b[d])
                if k < 0:
                    if shape[d] <= 0:
                        raise Unimportable("negative shrunk index along a dimension of unknown "
                                           "size")
                    k += shape[d]
                b[d], e[d], s[d] = k, k + 1, 1
                begin_m &= ~(1 << d)
                end_m &= ~(1 << d)
        ins = [ctx.ints(b), ctx.ints(e), ctx.ints(s)]
    else:
        if offset:
            raise Unimportable("offset with non-constant begin/end")
        ins = [_ints_input(ctx, i, "begin/end/strides") for i in op.inputs[1:4]]
    ctx.emit(O.STRIDED_SLICE, [ctx.x(op.inputs[0])] + ins +
             [ctx.i32(begin_m), ctx.i32(end_m), ctx.i32(shrink)], [ctx.y(op.outputs[0])])


@_conv("GATHER", "GATHER (axis; batch_dims 0; a scalar index as [1] then a reshape)")
def _gather(ctx: Context, op: OpInfo) -> None:
    o = op.options
    if o is not None and o.BatchDims():
        raise Unimportable("batch_dims has no HAL equivalent")
    axis = _axis(ctx, o.Axis() if o is not None else 0, op.inputs[0])
    ins = [ctx.x(op.inputs[0]), ctx.i32(axis), _ints_input(ctx, op.inputs[1], "indices")]
    if ctx.t(op.inputs[1]).shape:
        ctx.emit(O.GATHER, ins, [ctx.y(op.outputs[0])])
        return
    # A scalar index drops the axis; the HAL has no scalar tensors (a TFLite scalar is a
    # HAL [1]), so its GATHER keeps a dimension of 1 there, which a reshape removes.
    params, out = ctx.t(op.inputs[0]), ctx.t(op.outputs[0])
    if not out.static:
        raise Unimportable("a scalar index with an unknown output shape")
    kept = ctx.like(op.outputs[0], [*params.shape[:axis], 1, *params.shape[axis + 1:]])
    ctx.emit(O.GATHER, ins, [kept])
    _reshape_exact(ctx, kept, ctx.y(op.outputs[0]))


@_conv("SPLIT", "SPLIT (constant axis)")
def _split(ctx: Context, op: OpInfo) -> None:
    axis = int(ctx.need_value(op.inputs[0], "axis").reshape(-1)[0])
    axis = _axis(ctx, axis, op.inputs[1])
    ctx.emit(O.SPLIT, [ctx.x(op.inputs[1]), ctx.i32(axis), ctx.i32(len(op.outputs))],
             [ctx.y(o) for o in op.outputs])


@_conv("SPLIT_V", "one SLICE per output (constant sizes and axis)")
def _split_v(ctx: Context, op: OpInfo) -> None:
    x = ctx.t(op.inputs[0])
    sizes = [int(s) for s in ctx.need_value(op.inputs[1], "size_splits").reshape(-1)]
    axis = _axis(ctx, int(ctx.need_value(op.inputs[2], "axis").reshape(-1)[0]), op.inputs[0])
    if -1 in sizes:
        if x.shape[axis] <= 0:
            raise Unimportable("size -1 along a dimension of unknown size")
        k = sizes.index(-1)
        sizes[k] = x.shape[axis] - (sum(sizes) + 1)
    src = ctx.x(op.inputs[0])
    start = 0
    for out, size in zip(op.outputs, sizes):
        begin = [0] * len(x.shape)
        begin[axis] = start
        extent = [-1] * len(x.shape)
        extent[axis] = size
        ctx.emit(O.SLICE, [src, ctx.ints(begin), ctx.ints(extent)], [ctx.y(out)])
        start += size


@_conv("PACK", "PACK (AIDL v2; scalars: RESHAPE of each to [1] + CONCATENATION)")
def _pack(ctx: Context, op: OpInfo) -> None:
    axis = _axis(ctx, ctx.options("PackOptions").Axis(), op.outputs[0])
    if any(len(ctx.t(i).shape) > 0 for i in op.inputs):
        ctx.emit(O.PACK, [ctx.i32(axis)] + [ctx.x(i) for i in op.inputs],
                 [ctx.y(op.outputs[0])])
        return
    # TFLite scalars are [1] operands in the HAL, which PACK would make [N, 1]: concatenate.
    out = ctx.t(op.outputs[0])
    if not out.static:
        raise Unimportable("PACK of scalars needs a known output shape")
    parts = []
    for i in op.inputs:
        p = ctx.like(op.outputs[0], [1])
        ctx.emit(O.RESHAPE, [ctx.x(i), ctx.ints([1])], [p])
        parts.append(p)
    ctx.emit(O.CONCATENATION, parts + [ctx.i32(0)], [ctx.y(op.outputs[0])])


@_conv("UNPACK", "SPLIT + RESHAPE of each output")
def _unpack(ctx: Context, op: OpInfo) -> None:
    x = ctx.t(op.inputs[0])
    if not x.static:
        raise Unimportable("UNPACK needs a known input shape")
    axis = _axis(ctx, ctx.options("UnpackOptions").Axis(), op.inputs[0])
    piece = list(x.shape)
    piece[axis] = 1
    parts = [ctx.like(op.inputs[0], piece) for _ in op.outputs]
    ctx.emit(O.SPLIT, [ctx.x(op.inputs[0]), ctx.i32(axis), ctx.i32(len(op.outputs))], parts)
    for p, o in zip(parts, op.outputs):
        ctx.emit(O.RESHAPE, [p, ctx.ints(ctx.t(o).shape or [1])], [ctx.y(o)])


@_conv("TILE", "TILE")
def _tile(ctx: Context, op: OpInfo) -> None:
    ctx.emit(O.TILE, [ctx.x(op.inputs[0]), _ints_input(ctx, op.inputs[1], "multiples")],
             [ctx.y(op.outputs[0])])


def _reduce(name: str, hal: OperationType) -> None:
    def convert(ctx: Context, op: OpInfo) -> None:
        keep = bool(op.options.KeepDims()) if op.options is not None else False
        flag = ctx.i32(int(keep)) if hal == O.MEAN else ctx.bool_(keep)
        ctx.emit(hal, [ctx.x(op.inputs[0]), _ints_input(ctx, op.inputs[1], "axes"), flag],
                 [ctx.y(op.outputs[0])])
    _conv(name, f"{hal.name} (keep_dims)")(convert)


@_conv("MEAN", "MEAN (keep_dims; a quantized spatial mean that changes the quantization as "
              "a DEPTHWISE_CONV_2D of ones)")
def _mean(ctx: Context, op: OpInfo) -> None:
    x, y = ctx.t(op.inputs[0]), ctx.t(op.outputs[0])
    keep = bool(op.options.KeepDims()) if op.options is not None else False
    requantizes = (x.ttype in (TT.INT8, TT.UINT8) and x.quantized and y.quantized
                   and (x.scales[0] != y.scales[0] or x.zero_points[0] != y.zero_points[0]))
    axes = ctx.value(op.inputs[1])
    if requantizes and axes is not None and len(x.shape) == 4 and x.static and \
            sorted({int(a) % 4 for a in np.ravel(axes)}) == [1, 2]:
        _spatial_mean(ctx, op, keep)
        return
    if requantizes and axes is not None and x.static and 2 <= len(x.shape) <= 4:
        rank = len(x.shape)
        _rows_mean(ctx, op, sorted({int(a) % rank for a in np.ravel(axes)}))
        return
    ctx.emit(O.MEAN, [ctx.x(op.inputs[0]), _ints_input(ctx, op.inputs[1], "axes"),
                      ctx.i32(int(keep))], [ctx.y(op.outputs[0])])


def _spatial_mean(ctx: Context, op: OpInfo, keep: bool) -> None:
    """The global average pool Keras writes (MEAN over height and width) with an output
    quantization other than the input's, which the HAL's MEAN must keep: a depthwise
    convolution whose filter is all ones at scale 1/(H*W) sums each channel and requantizes
    it once by input_scale / (H*W * output_scale), TFLite's real multiplier. TFLite divides
    the count into its integer multiplier (sometimes leaving it with one bit less) where the
    HAL quantizes the float32 product, so an output can differ by one step (measured: none
    in Keras MobileNet V1/V2, up to 15% of a layer's values in EfficientNet-B0). The exporter
    writes this convolution back as a MEAN (:mod:`nnhal.tflite.export_fuse`)."""
    x = ctx.t(op.inputs[0])
    n, h, w, c = x.shape
    ht, scale, _, _ = hal_type(x)
    f_scale = 1.0 / (h * w)
    filt = ctx.sb.constant(ht, np.ones((1, h, w, c), ht.dtype), [1, h, w, c], f_scale, 0)
    bias = ctx.sb.constant(T.TENSOR_INT32, np.zeros(c, np.int32), [c],
                           scale_product(scale, f_scale))
    ins = [ctx.x(op.inputs[0]), filt, bias, ctx.i32(schema.PADDING_VALID), ctx.i32(1),
           ctx.i32(1), ctx.i32(1), ctx.i32(schema.FUSED_NONE)]
    if keep:
        ctx.emit(O.DEPTHWISE_CONV_2D, ins, [ctx.y(op.outputs[0])])
        return
    pooled = ctx.like(op.outputs[0], [n, 1, 1, c])
    ctx.emit(O.DEPTHWISE_CONV_2D, ins, [pooled])
    ctx.emit(O.RESHAPE, [pooled, ctx.ints(ctx.t(op.outputs[0]).shape)],
             [ctx.y(op.outputs[0])])


def _rows_mean(ctx: Context, op: OpInfo, reduced: list[int]) -> None:
    """A quantized MEAN (LayerNorm's over the features, a 1-D global pool over time) with an
    output quantization other than the input's, which the HAL's MEAN must keep: the reduced
    axes TRANSPOSEd last (where they are not), the rows as a FULLY_CONNECTED with one unit
    whose weights are all ones at scale 1/n, which sums each row and requantizes it once by
    input_scale / (n * output_scale), TFLite's real multiplier (within a step of its
    kernel's arithmetic, as the spatial mean's)."""
    x, y = ctx.t(op.inputs[0]), ctx.t(op.outputs[0])
    dims = list(x.shape)
    kept = [k for k in range(len(dims)) if k not in reduced]
    n = math.prod(dims[k] for k in reduced)
    rows = math.prod(dims[k] for k in kept)
    ht, scale, zp, _ = hal_type(x)
    src = ctx.x(op.inputs[0])
    if kept + reduced != list(range(len(dims))):
        moved = ctx.tmp(ht, [dims[k] for k in kept + reduced], scale, zp)
        ctx.emit(O.TRANSPOSE, [src, ctx.ints(kept + reduced)], [moved])
        src = moved
    flat = ctx.tmp(ht, [rows, n], scale, zp)
    ctx.emit(O.RESHAPE, [src, ctx.ints([rows, n])], [flat])
    w_scale = 1.0 / n
    weights = ctx.sb.constant(ht, np.ones((1, n), ht.dtype), [1, n], w_scale, 0)
    bias = ctx.sb.constant(T.TENSOR_INT32, np.zeros(1, np.int32), [1],
                           scale_product(scale, w_scale))
    yt, ys, yz, _ = hal_type(y)
    summed = ctx.tmp(yt, [rows, 1], ys, yz)
    ctx.emit(O.FULLY_CONNECTED, [flat, weights, bias, ctx.i32(schema.FUSED_NONE)], [summed])
    ctx.emit(O.RESHAPE, [summed, ctx.ints(hal_dims(y))], [ctx.y(op.outputs[0])])


_reduce("SUM", O.REDUCE_SUM)
_reduce("REDUCE_PROD", O.REDUCE_PROD)
_reduce("REDUCE_MAX", O.REDUCE_MAX)
_reduce("REDUCE_MIN", O.REDUCE_MIN)
_reduce("REDUCE_ANY", O.REDUCE_ANY)
_reduce("REDUCE_ALL", O.REDUCE_ALL)


def _arg(name: str, hal: OperationType) -> None:
    def convert(ctx: Context, op: OpInfo) -> None:
        if ctx.t(op.outputs[0]).ttype != TT.INT32:
            raise Unimportable("int64 output (the HAL's is int32)")
        axis = int(ctx.need_value(op.inputs[1], "axis").reshape(-1)[0])
        ctx.emit(hal, [ctx.x(op.inputs[0]), ctx.i32(_axis(ctx, axis, op.inputs[0]))],
                 [ctx.y(op.outputs[0])])
    _conv(name, f"{hal.name} (int32 output)")(convert)


_arg("ARG_MAX", O.ARGMAX)
_arg("ARG_MIN", O.ARGMIN)


@_conv("TOPK_V2", "TOPK_V2 (constant k)")
def _topk(ctx: Context, op: OpInfo) -> None:
    k = int(ctx.need_value(op.inputs[1], "k").reshape(-1)[0])
    ctx.emit(O.TOPK_V2, [ctx.x(op.inputs[0]), ctx.i32(k)], [ctx.y(o) for o in op.outputs])


def _resize(name: str, hal: OperationType) -> None:
    def convert(ctx: Context, op: OpInfo) -> None:
        o = op.options
        size = ctx.need_value(op.inputs[1], "size").reshape(-1)
        align = bool(o.AlignCorners()) if o is not None else False
        half = bool(o.HalfPixelCenters()) if o is not None else False
        ctx.emit(hal, [ctx.x(op.inputs[0]), ctx.i32(size[1]), ctx.i32(size[0]),
                       ctx.bool_(False), ctx.bool_(align), ctx.bool_(half)],
                 [ctx.y(op.outputs[0])])
    _conv(name, f"{hal.name} (constant size, align_corners, half_pixel_centers)")(convert)


_resize("RESIZE_BILINEAR", O.RESIZE_BILINEAR)
_resize("RESIZE_NEAREST_NEIGHBOR", O.RESIZE_NEAREST_NEIGHBOR)


def _block(name: str, hal: OperationType) -> None:
    def convert(ctx: Context, op: OpInfo) -> None:
        block = ctx.options("DepthToSpaceOptions").BlockSize()  # same field in both tables
        ctx.emit(hal, [ctx.x(op.inputs[0]), ctx.i32(block)], [ctx.y(op.outputs[0])])
    _conv(name, f"{hal.name} (block size)")(convert)


_block("DEPTH_TO_SPACE", O.DEPTH_TO_SPACE)
_block("SPACE_TO_DEPTH", O.SPACE_TO_DEPTH)


@_conv("BATCH_TO_SPACE_ND", "BATCH_TO_SPACE_ND (zero crops only)")
def _batch_to_space(ctx: Context, op: OpInfo) -> None:
    crops = ctx.need_value(op.inputs[2], "crops")
    if np.any(crops != 0):
        raise Unimportable("non-zero crops have no HAL equivalent")
    ctx.emit(O.BATCH_TO_SPACE_ND, [ctx.x(op.inputs[0]),
                                   _ints_input(ctx, op.inputs[1], "block shape")],
             [ctx.y(op.outputs[0])])


@_conv("SPACE_TO_BATCH_ND", "SPACE_TO_BATCH_ND")
def _space_to_batch(ctx: Context, op: OpInfo) -> None:
    ctx.emit(O.SPACE_TO_BATCH_ND, [ctx.x(op.inputs[0]),
                                   _ints_input(ctx, op.inputs[1], "block shape"),
                                   _ints_input(ctx, op.inputs[2], "paddings")],
             [ctx.y(op.outputs[0])])


@_conv("EMBEDDING_LOOKUP", "EMBEDDING_LOOKUP")
def _embedding(ctx: Context, op: OpInfo) -> None:
    ctx.emit(O.EMBEDDING_LOOKUP, [ctx.x(op.inputs[0]), ctx.x(op.inputs[1])],
             [ctx.y(op.outputs[0])])


@_conv("HASHTABLE_LOOKUP", "HASHTABLE_LOOKUP (hits as TENSOR_QUANT8_ASYMM scale 1)")
def _hashtable(ctx: Context, op: OpInfo) -> None:
    hits = op.outputs[1]
    # TFLite's hits tensor is plain uint8; the HAL's is quantized with scale 1, zero point 0.
    hit_operand = (ctx.y(hits) if ctx.t(hits).quantized
                   else ctx.y_as(hits, T.TENSOR_QUANT8_ASYMM, 1.0, 0))
    ctx.emit(O.HASHTABLE_LOOKUP, [ctx.x(i) for i in op.inputs[:3]],
             [ctx.y(op.outputs[0]), hit_operand])


#: TFLite LSH projection type -> HAL type: TFLite's SPARSE offsets each hash function's bucket
#: (the HAL's SPARSE, 3; its 1 is the deprecated form without the offset); DENSE is 2 in both.
_LSH_TYPES = {1: 3, 2: 2}


@_conv("LSH_PROJECTION", "LSH_PROJECTION (sparse / dense)")
def _lsh(ctx: Context, op: OpInfo) -> None:
    kind = _LSH_TYPES.get(ctx.options("LSHProjectionOptions").Type())
    if kind is None:
        raise Unimportable("unknown projection type")
    h, x = op.inputs[:2]
    weight = op.inputs[2] if len(op.inputs) > 2 else -1
    ctx.emit(O.LSH_PROJECTION, [ctx.x(h), ctx.x(x), ctx.omitted_like(weight, h),
                                ctx.i32(kind)], [ctx.y(op.outputs[0])])


# ---- control flow ----------------------------------------------------------------------------

@_conv("IF", "IF (then / else subgraphs become referenced subgraphs)")
def _if(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("IfOptions")
    then_, else_ = ctx.subgraph(o.ThenSubgraphIndex()), ctx.subgraph(o.ElseSubgraphIndex())
    ctx.emit(O.IF, [ctx.x(op.inputs[0]), then_, else_] + [ctx.x(i) for i in op.inputs[1:]],
             [ctx.y(i) for i in op.outputs])


@_conv("WHILE", "WHILE (every loop variable loop-carried)")
def _while(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("WhileOptions")
    cond, body = ctx.subgraph(o.CondSubgraphIndex()), ctx.subgraph(o.BodySubgraphIndex())
    ctx.emit(O.WHILE, [cond, body] + [ctx.x(i) for i in op.inputs],
             [ctx.y(i) for i in op.outputs])


# ---- the operations of AIDL v2 and v3 ---------------------------------------------------------

@_conv("BATCH_MATMUL", "BATCH_MATMUL (AIDL v2; adj_x / adj_y; float32, float16, int8; inputs "
                       "of one type and rank 2 to 4 with equal batch dimensions, a smaller "
                       "rank padded with leading 1s)")
def _batch_matmul(ctx: Context, op: OpInfo) -> None:
    a, b = ctx.t(op.inputs[0]), ctx.t(op.inputs[1])
    if a.ttype != b.ttype:
        raise Unimportable(f"a hybrid BATCH_MATMUL ({a.type_name} x {b.type_name}): the HAL "
                           f"multiplies two tensors of one type")
    if a.ttype not in (TT.FLOAT32, TT.FLOAT16, TT.INT8):
        raise Unimportable(f"BATCH_MATMUL of {a.type_name}: the HAL's has float16, float32 "
                           f"and int8 (and int32, which TFLite's has not)")
    if not (a.has_rank and b.has_rank) or not 2 <= min(len(a.shape), len(b.shape)) or \
            not max(len(a.shape), len(b.shape)) <= 4:
        raise Unimportable(f"inputs of shapes {list(a.shape)} and {list(b.shape)}: the HAL "
                           f"needs ranks 2 to 4")
    # TFLite broadcasts a smaller rank: leading 1s, which the HAL's equal batch dimensions
    # then need the other's to be (openWakeWord's [1, 1, 1, 257] x [257, 32]).
    rank = max(len(a.shape), len(b.shape))
    sa, sb = ((1,) * (rank - len(t.shape)) + tuple(t.shape) for t in (a, b))
    if any(x != y or x <= 0 for x, y in zip(sa[:-2], sb[:-2])):
        raise Unimportable(f"batch dimensions {list(a.shape[:-2])} and {list(b.shape[:-2])}: "
                           f"the HAL needs them known and equal (TFLite broadcasts them)")
    o = ctx.options("BatchMatMulOptions")
    ctx.emit(O.BATCH_MATMUL, [_with_shape(ctx, op.inputs[0], sa),
                              _with_shape(ctx, op.inputs[1], sb),
                              ctx.bool_(bool(o.AdjX())), ctx.bool_(bool(o.AdjY()))],
             [ctx.y(op.outputs[0])])


def _with_shape(ctx: Context, i: int, shape: tuple[int, ...]) -> int:
    """Tensor ``i`` as an operand of ``shape`` (its own with leading 1s): a constant made so,
    else a RESHAPE."""
    t = ctx.t(i)
    if tuple(t.shape) == shape:
        return ctx.x(i)
    if t.value is not None:
        return ctx.x(i, dims=shape)
    ht, sc, zp, _ = hal_type(t)
    out = ctx.tmp(ht, list(shape), sc, zp)
    ctx.emit(O.RESHAPE, [ctx.x(i), ctx.ints(list(shape))], [out])
    return out


#: TFLite's MirrorPadMode -> the HAL's mode scalar (the same numbers, named here).
_MIRROR_MODES = {0: 0, 1: 1}  # REFLECT, SYMMETRIC


@_conv("MIRROR_PAD", "MIRROR_PAD (AIDL v3; REFLECT / SYMMETRIC)")
def _mirror_pad(ctx: Context, op: OpInfo) -> None:
    mode = ctx.options("MirrorPadOptions").Mode()
    if mode not in _MIRROR_MODES:
        raise Unimportable(f"mirror pad mode {mode} is neither REFLECT nor SYMMETRIC")
    ctx.emit(O.MIRROR_PAD, [ctx.x(op.inputs[0]), _ints_input(ctx, op.inputs[1], "paddings"),
                            ctx.i32(_MIRROR_MODES[mode])], [ctx.y(op.outputs[0])])


@_conv("REVERSE_V2", "REVERSE (AIDL v3), one per constant axis (negative axes counted "
                     "from the end)")
def _reverse_v2(ctx: Context, op: OpInfo) -> None:
    x = ctx.t(op.inputs[0])
    if ctx.value(op.inputs[1]) is None:
        raise Unimportable("an axis given at run time: TFLite counts a negative one from the "
                           "end, the HAL refuses it")
    rank = len(x.shape)
    axes = [int(a) for a in ctx.need_value(op.inputs[1], "axis").reshape(-1)]
    if not axes:
        raise Unimportable("REVERSE_V2 with no axis")
    if rank == 0 or any(not -rank <= a < rank for a in axes):
        raise Unimportable(f"axes {axes} out of range for rank {rank}")
    axes = [a % rank for a in axes]
    if len(set(axes)) != len(axes):
        raise Unimportable(f"axes {axes} repeat one")
    src = ctx.x(op.inputs[0])
    for k, a in enumerate(axes):
        last = k == len(axes) - 1
        dst = ctx.y(op.outputs[0]) if last else ctx.like(op.inputs[0])
        ctx.emit(O.REVERSE, [src, ctx.ints([a])], [dst])
        src = dst


#: Builtins refused on purpose, with the reason (every other unmapped builtin is refused as
#: having no HAL equivalent).
REFUSED: dict[str, str] = {
    "CUSTOM": "custom operators have no HAL equivalent",
    "FLEX": "TensorFlow (Flex) operators have no HAL equivalent",
    "GELU": "no HAL operation",
    "CUMSUM": "no HAL operation",
    "ONE_HOT": "no HAL operation",
    "SCATTER_ND": "no HAL operation",
    "GATHER_ND": "no HAL operation",
    "BIDIRECTIONAL_SEQUENCE_LSTM": "not mapped: its 48 inputs and two state pairs are not "
                                   "converted yet (UNIDIRECTIONAL_SEQUENCE_LSTM is)",
    "BROADCAST_TO": "no HAL operation",
    "SHAPE": "folded when the input shape is static, else no HAL equivalent",
    "RANK": "folded when the input shape is static, else no HAL equivalent",
    "DENSIFY": "folded when its input is a sparse constant, else no HAL equivalent",
}
