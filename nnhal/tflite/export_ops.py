"""One converter per HAL operation: its operands become TFLite tensors, its scalar parameters
builtin options. A converter raises :class:`Unexportable` (with the reason) for any variant TFLite
cannot compute exactly as the HAL defines it; the exporter names each such operation.

This module has the elementwise, shape, indexing and control-flow operations and gathers the
image (:mod:`export_nn`) and recurrent (:mod:`export_rnn`) ones into :data:`CONVERTERS`.
Operand positions follow the HAL 1.3 signatures (``nnhal ops NAME``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import tflite
from tflite.TensorType import TensorType as TT

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops.common import qrange, tflite_ranks_exactly
from nnhal.ops.comparison import COMPARE_FUNCS, real_table, real_values, stored_for_rows
from nnhal.ops.resolver import OperandInfo
from nnhal.tflite.export_context import (
    QUANTIZED,
    Converter,
    ExportOpContext,
    Unexportable,
    fused_act,
)
from nnhal.tflite.export_nn import NN_CONVERTERS
from nnhal.tflite.export_rnn import RNN_CONVERTERS

T = OperandType
BO = tflite.BuiltinOperator
CONVERTERS: dict[str, Converter] = {}


def _simple(code: int) -> Converter:
    def convert(cx: ExportOpContext) -> None:
        cx.emit(code, [cx.t(j) for j in range(cx.n)], [cx.o(k) for k in range(len(cx.outs))])
    return convert


for _name, _code in {
        "ABS": BO.ABS, "EXP": BO.EXP, "LOG": BO.LOG, "NEG": BO.NEG, "SQRT": BO.SQRT,
        "SIN": BO.SIN, "FLOOR": BO.FLOOR, "LOGISTIC": BO.LOGISTIC,
        "TANH": BO.TANH, "RELU": BO.RELU, "RELU1": BO.RELU_N1_TO_1, "RELU6": BO.RELU6,
        "HARD_SWISH": BO.HARD_SWISH, "LOGICAL_NOT": BO.LOGICAL_NOT,
        "DEQUANTIZE": BO.DEQUANTIZE, "QUANTIZE": BO.QUANTIZE, "CAST": BO.CAST,
        "POW": BO.POW, "LOGICAL_AND": BO.LOGICAL_AND, "LOGICAL_OR": BO.LOGICAL_OR,
        "TILE": BO.TILE, "SLICE": BO.SLICE, "PAD": BO.PAD, "RANK": BO.RANK,
        "EMBEDDING_LOOKUP": BO.EMBEDDING_LOOKUP, "HASHTABLE_LOOKUP": BO.HASHTABLE_LOOKUP,
        "FILL": BO.FILL}.items():
    CONVERTERS[_name] = _simple(_code)


def _rsqrt(cx: ExportOpContext) -> None:
    """Float RSQRT as it is. Quantized: TFLite's int8 kernel computes the HAL's values (zero
    gives the largest stored value) but fails the invocation on a value below the zero
    point, where the HAL gives the largest stored value too: a MAXIMUM with the zero point
    first turns those into zero. uint8, which TFLite's kernel lacks, goes through int8 by
    QUANTIZE of the same scale (the zero point moved by 128: exact) there and back.

    TFLite's fixed point holds only while its multiplier 1 / (sqrt(input scale) x output
    scale) lies in [2^-12, 2^30) (outside, its shifts overflow and the results are garbage;
    measured); the converter keeps a step of margin on each side and refuses the rest."""
    info = cx.info(0)
    if info.type not in QUANTIZED:
        cx.emit(BO.RSQRT, [cx.t(0)], [cx.o()])
        return
    f32 = np.float32
    with np.errstate(all="ignore"):
        multiplier = 1.0 / float(np.sqrt(f32(info.scale)) * f32(cx.out_info().scale))
    exponent = math.frexp(multiplier)[1] if math.isfinite(multiplier) else 999
    if not -10 <= exponent <= 29:
        raise Unexportable(f"TFLite's quantized RSQRT overflows its fixed point for the "
                           f"multiplier 1 / (sqrt(input scale) x output scale) = "
                           f"{multiplier:.3g} (it holds within [2^-11, 2^29])")
    shape = cx.shape(0)
    x, y = cx.t(0), cx.o()
    if info.type == T.TENSOR_QUANT8_ASYMM:
        xs = cx.w.new(f"x{len(cx.w.sg.tensors)}", shape, TT.INT8)
        xs_t = cx.w.sg.tensors[xs]
        xs_t.scales, xs_t.zero_points = [float(info.scale)], [int(info.zero_point) - 128]
        cx.emit(BO.QUANTIZE, [x], [xs])
        out = cx.out_info()
        ys = cx.w.new(f"x{len(cx.w.sg.tensors)}", shape, TT.INT8)
        ys_t = cx.w.sg.tensors[ys]
        ys_t.scales, ys_t.zero_points = [float(out.scale)], [int(out.zero_point) - 128]
        _rsqrt_int8(cx, xs, ys, shape)
        cx.emit(BO.QUANTIZE, [ys], [y])
        return
    _rsqrt_int8(cx, x, y, shape)


def _rsqrt_int8(cx: ExportOpContext, x: int, y: int, shape: list[int]) -> None:
    src = cx.w.sg.tensors[x]
    if src.zero_points[0] == -128:  # no stored value lies below the zero point
        cx.emit(BO.RSQRT, [x], [y])
        return
    zero = cx.w.new(f"zp{len(cx.w.sg.tensors)}", [], TT.INT8,
                    buffer=cx.w.ex.model.add_buffer(np.int8(src.zero_points[0]).tobytes()))
    cz = cx.w.sg.tensors[zero]
    cz.scales, cz.zero_points = list(src.scales), list(src.zero_points)
    clamped = cx.temp(shape, x)
    cx.emit(BO.MAXIMUM, [x, zero], [clamped])
    cx.emit(BO.RSQRT, [clamped], [y])


CONVERTERS["RSQRT"] = _rsqrt


def _dequantized(cx: ExportOpContext, j: int) -> int:
    """Input ``j`` as float32 real values: a DEQUANTIZE, or for a constant its real values
    (TFLite's DEQUANTIZE rounds (q - zero point) x scale once to float32, as this does)."""
    info = cx.info(j)
    if info.is_const and info.channel_scales is None:
        return cx.w.constant(real_values(info), None, f"r{len(cx.w.sg.tensors)}", TT.FLOAT32)
    y = cx.w.new(f"x{len(cx.w.sg.tensors)}", cx.shape(j), TT.FLOAT32)
    cx.emit(BO.DEQUANTIZE, [cx.t(j)], [y])
    return y


def _requantized(cx: ExportOpContext, j: int) -> int:
    """Input ``j`` in the output's quantization (TFLite's QUANTIZE requantizes integers)."""
    info, out = cx.info(j), cx.out_info()
    if (info.scale, info.zero_point) == (out.scale, out.zero_point):
        return cx.t(j)
    y = cx.temp(cx.shape(j), cx.o())
    cx.emit(BO.QUANTIZE, [cx.t(j)], [y])
    return y


def _ranks_exactly(info: OperandInfo) -> bool:
    """Whether TFLite's quantized comparison ranks two stored values of this quantization as
    their real values rank (:func:`~nnhal.ops.common.tflite_ranks_exactly`)."""
    return info.type in QUANTIZED and info.channel_scales is None and \
        tflite_ranks_exactly(info.scale)


def _thresholds(var: OperandInfo, con: OperandInfo, fn: Callable[..., Any],
                var_first: bool) -> np.ndarray | None:
    """Stored values in ``var``'s quantization that compare with each of ``var``'s stored
    values as the constant ``con``'s real values do (tried against all of them), or None
    where one has no such value (a comparison true for every stored value, say)."""
    lo, hi = qrange(var.type)
    q = np.arange(lo, hi + 1, dtype=np.int32)
    real = real_table(var)
    stored = np.asarray(con.value)
    values, where = np.unique(real_values(con), return_inverse=True)
    candidates = stored_for_rows(fn, q, not var_first)
    found = np.empty(len(values), np.int32)
    for n, v in enumerate(values):
        want = fn(real, v) if var_first else fn(v, real)
        k = candidates.get(want.tobytes())
        if k is None:
            return None
        found[n] = k
    return found[where].reshape(stored.shape).astype(stored.dtype)


def _prelu(cx: ExportOpContext) -> None:
    """PRELU; with one constant alpha (the importer's form of TFLite's LEAKY_RELU, which
    XNNPACK runs as such) LEAKY_RELU of alpha's real value, within the conformance rules'
    step of the HAL's integer product (TFLite multiplies by the one real multiplier)."""
    alpha = cx.info(1)
    if alpha.is_const and alpha.channel_scales is None and np.asarray(alpha.value).size == 1 \
            and cx.out_shape() == cx.shape(0):
        v = np.asarray(alpha.value).reshape(-1)
        real = v.astype(np.float32) if cx.info(0).type not in QUANTIZED else \
            real_values(alpha).reshape(-1)
        if np.isfinite(real[0]):
            cx.emit(BO.LEAKY_RELU, [cx.t(0)], [cx.o()], "LeakyReluOptions",
                    Alpha=float(real[0]))
            return
    cx.emit(BO.PRELU, [cx.t(0), cx.t(1)], [cx.o()])


def _select(cx: ExportOpContext) -> None:
    """SELECT; between constant ones and zeros (the importer's form of a bool CAST) CAST."""
    a, b, out = cx.info(1), cx.info(2), cx.out_info()
    if out.type in (T.TENSOR_FLOAT32, T.TENSOR_INT32) and a.is_const and b.is_const and \
            np.all(np.asarray(a.value) == 1) and np.all(np.asarray(b.value) == 0) and \
            cx.shape(0) == cx.out_shape():
        cx.emit(BO.CAST, [cx.t(0)], [cx.o()])
        return
    _same_quant_select(cx)


def _compare(name: str) -> Converter:
    code, fn = getattr(BO, name), COMPARE_FUNCS[OperationType[name]]

    def convert(cx: ExportOpContext) -> None:
        a, b = cx.t(0), cx.t(1)
        if cx.info(0).type in QUANTIZED:
            a, b = _quantized_operands(cx, fn)
        elif cx.info(0).type == T.TENSOR_BOOL8 and code not in (BO.EQUAL, BO.NOT_EQUAL):
            # TFLite orders numbers only: compare the booleans as 0 / 1.
            a, b = (_cast(cx, x, TT.INT32) for x in (a, b))
        cx.emit(code, [a, b], [cx.o()])
    return convert


def _quantized_operands(cx: ExportOpContext, fn: Callable[..., Any]) -> tuple[int, int]:
    """A quantized comparison's two TFLite inputs. The HAL compares real values, TFLite
    rescaled stored ones (:func:`_ranks_exactly`): so the inputs as they are where both
    share a quantization that ranks exactly; a constant input against one that does, as the
    stored values that compare as its real values do (the original's quantized comparison
    against a constant, which the converter writes, comes back as it was); else both in
    float32."""
    ia, ib = cx.info(0), cx.info(1)
    if _ranks_exactly(ia) and (ia.scale, ia.zero_point) == (ib.scale, ib.zero_point):
        return cx.t(0), cx.t(1)
    for v, c in ((0, 1), (1, 0)):
        var, con = cx.info(v), cx.info(c)
        if con.is_const and con.channel_scales is None and not var.is_const \
                and _ranks_exactly(var):
            k = _thresholds(var, con, fn, v == 0)
            if k is not None:
                kt = cx.w.constant(k, var, f"k{len(cx.w.sg.tensors)}")
                return (cx.t(0), kt) if v == 0 else (kt, cx.t(1))
    return _dequantized(cx, 0), _dequantized(cx, 1)


def _cast(cx: ExportOpContext, x: int, tt: int) -> int:
    src = cx.w.sg.tensors[x]
    y = cx.w.new(f"x{len(cx.w.sg.tensors)}", src.shape, tt)
    cx.emit(BO.CAST, [x], [y])
    return y


def _same_quant_op(code: int, inputs: list[int]) -> Converter:
    """MAXIMUM, MINIMUM, SELECT: TFLite reads the stored integers, the HAL requantizes each
    input to the output's scale first; so do that with QUANTIZE (within one step)."""
    def convert(cx: ExportOpContext) -> None:
        cx.emit(code, [_requantized(cx, j) if j in inputs else cx.t(j) for j in range(cx.n)],
                [cx.o()])
    return convert


CONVERTERS.update(
    **{n: _compare(n) for n in ("EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS",
                                 "LESS_EQUAL")},
    MAXIMUM=_same_quant_op(BO.MAXIMUM, [0, 1]),
    MINIMUM=_same_quant_op(BO.MINIMUM, [0, 1]), PRELU=_prelu, SELECT=_select)
_same_quant_select = _same_quant_op(BO.SELECT, [1, 2])


def _arith(code: int, options: str) -> Converter:
    def convert(cx: ExportOpContext) -> None:
        cx.emit(code, [cx.t(0), cx.t(1)], [cx.o()], options,
                FusedActivationFunction=fused_act(cx, 2))
    return convert


CONVERTERS.update(ADD=_arith(BO.ADD, "AddOptions"), SUB=_arith(BO.SUB, "SubOptions"),
                  MUL=_arith(BO.MUL, "MulOptions"), DIV=_arith(BO.DIV, "DivOptions"))
_real_div = CONVERTERS["DIV"]


def _div(cx: ExportOpContext) -> None:
    """The HAL's int32 DIV floors (its fuse code must be NONE) where TFLite's DIV truncates:
    TFLite's FLOOR_DIV is the same operation, but for a zero divisor, where the HAL gives 0
    and TFLite fails the invocation; guarded (``guard_division``), where the divisor may be 0
    at run time: FLOOR_DIV by 1 there, and 0 selected."""
    if cx.info(0).type != OperandType.TENSOR_INT32:
        _real_div(cx)
        return
    y = cx.info(1)
    if not cx.w.ex.guard_division or (y.is_const and np.all(np.asarray(y.value) != 0)):
        cx.emit(BO.FLOOR_DIV, [cx.t(0), cx.t(1)], [cx.o()])
        return
    shape = cx.shape(1)
    zero = cx.w.new(f"zero{len(cx.w.sg.tensors)}", shape, TT.BOOL)
    cx.emit(BO.EQUAL, [cx.t(1), cx.ints([0])], [zero])
    divisor = cx.temp(shape, cx.t(1))
    cx.emit(BO.SELECT_V2, [zero, cx.ints([1]), cx.t(1)], [divisor])
    quotient = cx.temp(cx.out_shape(), cx.o())
    cx.emit(BO.FLOOR_DIV, [cx.t(0), divisor], [quotient])
    cx.emit(BO.SELECT_V2, [zero, cx.ints([0]), quotient], [cx.o()])


CONVERTERS["DIV"] = _div


# ---- along one axis -------------------------------------------------------------------------

def _along_last(cx: ExportOpContext, axis: int, emit: Callable[[int, int], None]) -> None:
    """Runs ``emit(x, y)`` with ``axis`` moved last (a TRANSPOSE swapping it with the last
    axis before and after), for operations TFLite only has along the last axis."""
    shape = cx.shape(0)
    rank = len(shape)
    axis = axis + rank if axis < 0 else axis
    x, y = cx.t(0), cx.o()
    if axis == rank - 1:
        emit(x, y)
        return
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    swapped = [shape[p] for p in perm]
    xt, yt = cx.temp(swapped, x), cx.temp(swapped, y)
    cx.emit(BO.TRANSPOSE, [x, cx.ints(perm)], [xt])
    emit(xt, yt)
    cx.emit(BO.TRANSPOSE, [yt, cx.ints(perm)], [y])


def _softmax(cx: ExportOpContext) -> None:
    beta = float(cx.scalar(1))
    _along_last(cx, cx.scalar(2, -1), lambda x, y: cx.emit(BO.SOFTMAX, [x], [y],
                                                            "SoftmaxOptions", Beta=beta))


def _log_softmax(cx: ExportOpContext) -> None:
    beta = float(cx.scalar(1))

    def emit(x: int, y: int) -> None:
        if beta != 1.0:  # TFLite's LOG_SOFTMAX has no beta: scale the logits first
            scaled = cx.temp(cx.w.sg.tensors[x].shape, x)
            b = cx.w.constant(np.float32(beta), None, f"beta{len(cx.w.sg.tensors)}",
                              TT.FLOAT32)
            cx.emit(BO.MUL, [x, b], [scaled], "MulOptions", FusedActivationFunction=0)
            x = scaled
        cx.emit(BO.LOG_SOFTMAX, [x], [y])

    _along_last(cx, cx.scalar(2, -1), emit)


def _l2_norm(cx: ExportOpContext) -> None:
    _along_last(cx, cx.scalar(1, -1), lambda x, y: cx.emit(
        BO.L2_NORMALIZATION, [x], [y], "L2NormOptions", FusedActivationFunction=0))


def _lrn(cx: ExportOpContext) -> None:
    opts = dict(Radius=int(cx.scalar(1)), Bias=float(cx.scalar(2)),
                Alpha=float(cx.scalar(3)), Beta=float(cx.scalar(4)))

    def emit(x: int, y: int) -> None:
        shape = cx.w.sg.tensors[x].shape
        if len(shape) == 4:
            cx.emit(BO.LOCAL_RESPONSE_NORMALIZATION, [x], [y],
                    "LocalResponseNormalizationOptions", **opts)
            return
        # TFLite's kernel is 4-D only; it normalises along the last axis, so any rank folds.
        flat = [1, 1, math.prod(map(int, shape[:-1])), shape[-1]]
        xt, yt = cx.temp(flat, x), cx.temp(flat, y)
        cx.emit(BO.RESHAPE, [x, cx.ints(flat)], [xt], "ReshapeOptions", NewShape=flat)
        cx.emit(BO.LOCAL_RESPONSE_NORMALIZATION, [xt], [yt],
                "LocalResponseNormalizationOptions", **opts)
        cx.emit(BO.RESHAPE, [yt, cx.ints(shape)], [y], "ReshapeOptions", NewShape=shape)

    _along_last(cx, cx.scalar(5, -1), emit)


CONVERTERS.update(SOFTMAX=_softmax, LOG_SOFTMAX=_log_softmax, L2_NORMALIZATION=_l2_norm,
                  LOCAL_RESPONSE_NORMALIZATION=_lrn)


# ---- shapes and indexing -------------------------------------------------------------------

def _reshape(cx: ExportOpContext) -> None:
    shape = cx.out_shape()
    cx.emit(BO.RESHAPE, [cx.t(0), cx.ints(shape)], [cx.o()], "ReshapeOptions", NewShape=shape)


def _emit_rank_kept(cx: ExportOpContext, code: int, inputs: list[int],
                    options_name: str | None = None, **options: Any) -> None:
    """Emits an operation that may drop every axis: where the HAL gives shape [1], TFLite's
    result can have rank 0 (all axes reduced or squeezed), so it goes through a temporary
    and a RESHAPE to [1] (a no-op when TFLite kept the axis). An output whose shape is
    not known at export time is left as TFLite gives it."""
    if tuple(cx.w.g.shapes[cx.outs[0]] or ()) != (1,):
        cx.emit(code, inputs, [cx.o()], options_name, **options)
        return
    t = cx.temp([], cx.o())
    cx.emit(code, inputs, [t], options_name, **options)
    cx.emit(BO.RESHAPE, [t, cx.ints([1])], [cx.o()], "ReshapeOptions", NewShape=[1])


def _squeeze(cx: ExportOpContext) -> None:
    if cx.present(1) and not cx.info(1).is_const:
        _reshape(cx)  # the dimensions are a runtime tensor, but the output shape is known
        return
    dims = cx.scalar(1, [])
    _emit_rank_kept(cx, BO.SQUEEZE, [cx.t(0)], "SqueezeOptions", SqueezeDims=list(dims))


def _concatenation(cx: ExportOpContext) -> None:
    out = cx.out_info()
    inputs = []
    for j in range(cx.n - 1):
        x, info = cx.t(j), cx.info(j)
        if info.type == T.TENSOR_QUANT8_ASYMM_SIGNED and \
                (info.scale, info.zero_point) != (out.scale, out.zero_point):
            # XNNPACK refuses int8 inputs quantized unlike the output: requantize first.
            xt = cx.temp(cx.shape(j), cx.o())
            cx.emit(BO.QUANTIZE, [x], [xt])
            x = xt
        inputs.append(x)
    cx.emit(BO.CONCATENATION, inputs, [cx.o()],
            "ConcatenationOptions", Axis=cx.scalar(cx.n - 1), FusedActivationFunction=0)


def _expand_dims(cx: ExportOpContext) -> None:
    cx.emit(BO.EXPAND_DIMS, [cx.t(0), cx.ints(cx.scalar(1))], [cx.o()])


def _transpose(cx: ExportOpContext) -> None:
    perm = cx.t(1) if cx.present(1) else cx.ints(list(range(len(cx.shape(0))))[::-1])
    cx.emit(BO.TRANSPOSE, [cx.t(0), perm], [cx.o()])


def _pad_v2(cx: ExportOpContext) -> None:
    value = cx.w.constant(np.asarray(cx.scalar(2)), cx.info(0), f"pad{len(cx.w.sg.tensors)}")
    cx.emit(BO.PADV2, [cx.t(0), cx.t(1), value], [cx.o()])


def _strided_slice(cx: ExportOpContext) -> None:
    _emit_rank_kept(cx, BO.STRIDED_SLICE, [cx.t(k) for k in range(4)], "StridedSliceOptions",
                    BeginMask=cx.scalar(4), EndMask=cx.scalar(5), ShrinkAxisMask=cx.scalar(6))


def _gather(cx: ExportOpContext) -> None:
    cx.emit(BO.GATHER, [cx.t(0), cx.t(2)], [cx.o()], "GatherOptions", Axis=cx.scalar(1))


def _split(cx: ExportOpContext) -> None:
    cx.emit(BO.SPLIT, [cx.ints(cx.scalar(1)), cx.t(0)], [cx.o(k) for k in range(len(cx.outs))],
            "SplitOptions", NumSplits=cx.scalar(2))


def _reduce(code: int) -> Converter:
    def convert(cx: ExportOpContext) -> None:
        _emit_rank_kept(cx, code, [cx.t(0), cx.t(1)], "ReducerOptions",
                        KeepDims=bool(cx.scalar(2)))
    return convert


def _arg(code: int, options: str) -> Converter:
    def convert(cx: ExportOpContext) -> None:
        _emit_rank_kept(cx, code, [cx.t(0), cx.ints([cx.scalar(1)])], options,
                        OutputType=TT.INT32)
    return convert


def _topk(cx: ExportOpContext) -> None:
    cx.emit(BO.TOPK_V2, [cx.t(0), cx.ints(cx.scalar(1))], [cx.o(0), cx.o(1)])


CONVERTERS.update(
    CONCATENATION=_concatenation, RESHAPE=_reshape, SQUEEZE=_squeeze,
    EXPAND_DIMS=_expand_dims, TRANSPOSE=_transpose,
    PAD_V2=_pad_v2, STRIDED_SLICE=_strided_slice, GATHER=_gather, SPLIT=_split,
    MEAN=_reduce(BO.MEAN), REDUCE_SUM=_reduce(BO.SUM), REDUCE_PROD=_reduce(BO.REDUCE_PROD),
    REDUCE_MAX=_reduce(BO.REDUCE_MAX), REDUCE_MIN=_reduce(BO.REDUCE_MIN),
    REDUCE_ANY=_reduce(BO.REDUCE_ANY), REDUCE_ALL=_reduce(BO.REDUCE_ALL),
    ARGMAX=_arg(BO.ARG_MAX, "ArgMaxOptions"), ARGMIN=_arg(BO.ARG_MIN, "ArgMinOptions"),
    TOPK_V2=_topk)


# ---- the rest ------------------------------------------------------------------------------------

def _elu(cx: ExportOpContext) -> None:
    alpha = float(cx.scalar(1))
    if alpha == 1.0:
        cx.emit(BO.ELU, [cx.t(0)], [cx.o()])
        return
    # TFLite's ELU has alpha 1: max(x, 0) + alpha * min(ELU(x), 0) is the HAL's formula.
    x, shape = cx.t(0), cx.shape(0)
    elu, neg, scaled, pos = (cx.temp(shape, x) for _ in range(4))
    zero = cx.w.constant(np.float32(0), None, f"z{len(cx.w.sg.tensors)}", TT.FLOAT32)
    cx.emit(BO.ELU, [x], [elu])
    cx.emit(BO.MINIMUM, [elu, zero], [neg])
    cx.emit(BO.MUL, [neg, cx.w.constant(np.float32(alpha), None, f"a{len(cx.w.sg.tensors)}",
                                        TT.FLOAT32)], [scaled], "MulOptions",
            FusedActivationFunction=0)
    cx.emit(BO.RELU, [x], [pos])
    cx.emit(BO.ADD, [pos, scaled], [cx.o()], "AddOptions", FusedActivationFunction=0)


#: HAL LSH_PROJECTION type -> TFLite LSHProjectionType (1 is the deprecated sparse hashing).
_LSH = {2: tflite.LSHProjectionType.DENSE, 3: tflite.LSHProjectionType.SPARSE}


def _lsh(cx: ExportOpContext) -> None:
    kind = cx.scalar(3)
    if kind not in _LSH:
        raise Unexportable(f"projection type {kind} has no TFLite equivalent")
    inputs = [cx.t(0), cx.t(1)] + ([cx.t(2)] if cx.present(2) else [])
    cx.emit(BO.LSH_PROJECTION, inputs, [cx.o()], "LSHProjectionOptions", Type=_LSH[kind])


def _if(cx: ExportOpContext) -> None:
    then_, else_ = cx.subgraph(1), cx.subgraph(2)
    cx.emit(BO.IF, [cx.t(0)] + [cx.t(j) for j in range(3, cx.n)],
            [cx.o(k) for k in range(len(cx.outs))], "IfOptions",
            ThenSubgraphIndex=then_, ElseSubgraphIndex=else_)


def _while(cx: ExportOpContext) -> None:
    # The HAL body outputs the m outputs and k state-only values; input-only operands follow.
    body_ref = int(np.asarray(cx.info(1).value).reshape(-1)[0])
    carried = len(cx.w.ex.referenced[body_ref].outputs)
    extra = cx.n - 2 - carried  # input-only operands: TFLite's WHILE carries them too
    cond, body = cx.subgraph(0), cx.subgraph(1, extra)
    outs = [cx.o(k) for k in range(len(cx.outs))]
    outs += [cx.temp(cx.shape(j), cx.t(j)) for j in range(2 + len(cx.outs), cx.n)]
    cx.emit(BO.WHILE, [cx.t(j) for j in range(2, cx.n)], outs, "WhileOptions",
            CondSubgraphIndex=cond, BodySubgraphIndex=body)


CONVERTERS.update(ELU=_elu, LSH_PROJECTION=_lsh, IF=_if, WHILE=_while)
CONVERTERS.update(NN_CONVERTERS)
CONVERTERS.update(RNN_CONVERTERS)


# ---- the operations of AIDL v2 and v3 ---------------------------------------------------------

def _batch_matmul(cx: ExportOpContext) -> None:
    """BATCH_MATMUL: the HAL's equal batch dimensions are a case of TFLite's broadcasting."""
    if cx.info(0).type == T.TENSOR_INT32:
        raise Unexportable("TFLite's BATCH_MATMUL has no int32 kernel")
    if cx.info(0).type in QUANTIZED:
        _check_int8_matmul_multiplier(cx)
    cx.emit(BO.BATCH_MATMUL, [cx.t(0), cx.t(1)], [cx.o()], "BatchMatMulOptions",
            AdjX=bool(cx.scalar(2, False)), AdjY=bool(cx.scalar(3, False)),
            AsymmetricQuantizeInputs=False)


def _check_int8_matmul_multiplier(cx: ExportOpContext) -> None:
    """TFLite's int8 kernel multiplies the int32 sum by 2^shift before its fixed-point
    multiplier (lhs scale x rhs scale / output scale = f x 2^shift, f in [0.5, 1)), and that
    product may leave int32. TFLite's own kernels wrap it, as the HAL's reference arithmetic
    does (:func:`nnhal.ops.common.requantize_int32_sum`; tests/ops/test_conv_bias_limits.py),
    but XNNPACK, which ai-edge-litert runs by default, does not: it crashed ai-edge-litert 2.3
    (a segmentation fault) on a multiplier of 2^13 with 256-deep sums. A sum of ``depth``
    products is at most depth x 255 x 255 in magnitude, so a multiplier of at least 1 is
    refused unless that bound times 2^shift stays within int32."""
    lhs, rhs, out = cx.info(0), cx.info(1), cx.out_info()
    f32 = np.float32
    real = float(f32(lhs.scale)) * float(f32(rhs.scale)) / float(f32(out.scale))
    shift = math.frexp(real)[1] if math.isfinite(real) and real > 0 else 999
    if shift <= 0:
        return
    adj_x = bool(cx.scalar(2, False))
    depth = cx.shape(0)[-2 if adj_x else -1] if cx.w.g.shapes[cx.ins[0]] else 0
    known = depth > 0 and 0 not in (cx.w.g.shapes[cx.ins[0]] or (0,))
    if not known or depth * 255 * 255 * 2 ** shift >= 2 ** 31:
        raise Unexportable(f"its int32 sum times 2^{shift} (multiplier lhs x rhs / output "
                           f"scale = {real:.3g}) may leave int32 for an inner dimension of "
                           f"{depth or 'unknown size'}, which XNNPACK does not wrap as TFLite's "
                           f"kernels and the HAL do (it crashed ai-edge-litert 2.3)")


def _pack(cx: ExportOpContext) -> None:
    """PACK: the HAL's axis is input 0, TFLite's an option."""
    axis = int(cx.scalar(0))
    cx.emit(BO.PACK, [cx.t(j) for j in range(1, cx.n)], [cx.o()], "PackOptions",
            ValuesCount=cx.n - 1, Axis=axis)


def _mirror_pad(cx: ExportOpContext) -> None:
    """MIRROR_PAD: the mode an option. Paddings given at run time are bounded by TFLite's
    kernel as the HAL bounds them in recent TFLite (ai-edge-litert 2.3 fails the invocation
    on a negative one or one past the mode's limit); older kernels did not check them, which
    is why the LiteRT driver claims those only on a runtime it has measured."""
    mode = int(cx.scalar(2))
    if mode not in (0, 1):
        raise Unexportable(f"mode {mode} is neither REFLECT (0) nor SYMMETRIC (1)")
    cx.emit(BO.MIRROR_PAD, [cx.t(0), cx.t(1)], [cx.o()], "MirrorPadOptions",
            Mode=(tflite.MirrorPadMode.REFLECT, tflite.MirrorPadMode.SYMMETRIC)[mode])


def _reverse(cx: ExportOpContext) -> None:
    """REVERSE as REVERSE_V2 along the one axis the HAL allows. The axis must be a constant:
    TFLite counts a negative run-time axis from the end, where the HAL fails the execution."""
    if not cx.info(1).is_const:
        raise Unexportable("axis given at run time: TFLite takes a negative axis (counted "
                           "from the end) that the HAL refuses")
    cx.emit(BO.REVERSE_V2, [cx.t(0), cx.t(1)], [cx.o()], "ReverseV2Options")


CONVERTERS.update(BATCH_MATMUL=_batch_matmul, PACK=_pack, MIRROR_PAD=_mirror_pad,
                  REVERSE=_reverse)
