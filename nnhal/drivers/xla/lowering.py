"""What the XLA driver lowers, declared once: per operation type a :class:`Lowering` (a
``supports`` predicate over the analysed operation and a ``lower`` function emitting JAX
operations), in :data:`LOWERINGS`.

An operation is supported when every operand it computes with has a type the lowering
accepts and a shape the analysis knows fully at prepare (XLA compiles for static shapes: an
output whose shape only a run can tell is refused), every parameter XLA needs at compile time
is a constant, and the lowering's own predicate accepts it. Quantized 8-bit types compute
the reference driver's integer arithmetic exactly (:mod:`nnhal.drivers.xla.quantized` adds
those forms); the other quantized types are refused. float16 computes in float32 and
rounds each operation's result to float16, as the reference driver does; a relaxed model may
instead compute in a fast format (``build_function``'s ``compute``: float16 activations and
weights, the accumulating operations of :data:`WIDENED` still in float32).
:data:`REFUSED` words each refusal for the docs and ``nnhal info``.

Nothing here imports JAX at module level: the lowerings receive ``jnp`` and ``lax`` through
their :class:`Op`, so listing what the driver supports needs no JAX at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnhal.analysis import ModelGraph, SubgraphGraph
from nnhal.hal.types import OperandLifeTime, OperandType, OperationType
from nnhal.ops import conv as conv_rules
from nnhal.ops import pooling as pool_rules
from nnhal.ops import resize as resize_rules
from nnhal.ops.resolver import OperandInfo, OpError

O = OperationType
T = OperandType

FLOATS = frozenset({T.TENSOR_FLOAT32, T.TENSOR_FLOAT16})
FLOATS_INT = FLOATS | {T.TENSOR_INT32}
#: The types computed as they are stored (no quantization parameters).
PLAIN = FLOATS_INT | {T.TENSOR_BOOL8}
#: The quantized types some lowering computes with (see :mod:`nnhal.drivers.xla.quantized`).
QUANTIZED = frozenset({T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED,
                       T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT8_SYMM_PER_CHANNEL})
#: Every type an operand computed with may have (each lowering narrows its input 0).
RUNS = PLAIN | QUANTIZED
#: Constant tensors with more elements than this are passed to the compiled function as
#: arguments held in device memory (the weights); smaller ones are compiled in.
WEIGHT_MIN_ELEMENTS = 64

#: Per operation type or "*": (kind of case refused, why).
REFUSED: dict[str, list[tuple[str, str]]] = {
    "*": [("16-bit quantized types (TENSOR_QUANT16_SYMM / _ASYMM), and 8-bit quantized "
           "operands of operations without a quantized lowering (see nnhal.drivers.xla."
           "quantized: conv, depthwise, fully connected, pooling, elementwise tables, "
           "QUANTIZE, DEQUANTIZE, data movement)",
           "not lowered with the reference integer arithmetic (computing them in floating "
           "point would not agree)"),
          ("an operand whose shape is not fully known at prepare (unknown dimensions or "
           "rank, zero-sized tensors)", "XLA compiles for static shapes"),
          ("a parameter given at run time (strides, axes, paddings, shapes, flags...)",
           "XLA needs it when compiling"),
          ("operation types without a lowering (control flow, recurrent, detection, "
           "random...)", "not lowered yet")],
    "DIV": [("TENSOR_INT32", "not lowered: the HAL's flooring division by zero is defined")],
    "INSTANCE_NORMALIZATION": [("TENSOR_FLOAT16", "the reference computes it in float64; "
                                "float32 arithmetic was not shown to agree")],
    "GATHER": [("indices out of range", "XLA clamps them where the HAL fails the execution")],
    "STRIDED_SLICE": [("an empty selection", "zero-sized tensors are refused")],
    "SOFTMAX": [("beta not finite and positive", "not shown to agree")],
    "BATCH_MATMUL": [("TENSOR_INT32", "XLA's int32 products wrap; not shown to agree")],
    "CONCATENATION": [("inputs of different types", "not lowered")],
    "CONV_2D": [("quantized, when the int32 accumulator could overflow (kernel size x input "
                 "and filter ranges beyond 2**31)", "the reference sums exactly")],
    "DEPTHWISE_CONV_2D": [("quantized, when the int32 accumulator could overflow",
                           "the reference sums exactly")],
    "FULLY_CONNECTED": [("quantized, when the int32 accumulator could overflow",
                         "the reference sums exactly")],
    "DEQUANTIZE": [("TENSOR_QUANT8_SYMM_PER_CHANNEL input", "not lowered")],
    "ADD": [("quantized inputs of different widths (only 8-bit pairs)", "not lowered")],
}


#: Operations a relaxed model in a fast format still computes in float32 (their inputs
#: widened, their result rounded to the fast format): sums of squares and of exponentials,
#: products and powers leave float16's range (65504) on ordinary values, and these
#: operations are a small part of a model's work.
WIDENED = frozenset({O.SOFTMAX, O.LOG_SOFTMAX, O.L2_NORMALIZATION,
                     O.LOCAL_RESPONSE_NORMALIZATION, O.INSTANCE_NORMALIZATION, O.L2_POOL_2D,
                     O.MEAN, O.REDUCE_SUM, O.REDUCE_PROD, O.POW, O.EXP})


class Op:
    """One analysed operation as its lowering sees it: operand descriptions with inferred
    shapes, constant values, and (when lowering) the JAX values of its inputs. ``widen``: the
    dtypes :meth:`x` widens to float32 (float16 unless a relaxed model computes in a fast
    format)."""

    __slots__ = ("type", "graph", "ins", "outs", "env", "jnp", "lax", "precision", "widen")

    def __init__(self, graph: SubgraphGraph, op: tuple[int, tuple[int, ...], tuple[int, ...]],
                 env: dict[int, Any] | None = None, jnp: Any = None, lax: Any = None,
                 precision: Any = None, widen: tuple[Any, ...] = (np.float16,)):
        self.type, self.ins, self.outs = op
        self.graph = graph
        self.env = env
        self.jnp, self.lax, self.precision = jnp, lax, precision
        self.widen = widen

    # ---- reading operands ---------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.ins)

    def info(self, k: int) -> OperandInfo:
        return self.graph.shaped(self.ins[k])

    def out_info(self, j: int = 0) -> OperandInfo:
        return self.graph.shaped(self.outs[j])

    def out_shape(self, j: int = 0) -> tuple[int, ...]:
        return tuple(self.graph.shapes[self.outs[j]])  # type: ignore[arg-type]

    def present(self, k: int) -> bool:
        return k < self.n and not self.info(k).omitted

    def const(self, k: int) -> bool:
        return self.info(k).is_const

    def value(self, k: int, default: Any = None) -> Any:
        """Input k's constant value (``default`` when absent or omitted)."""
        if not self.present(k):
            return default
        return self.info(k).value

    def scalar(self, k: int, default: Any = None) -> Any:
        v = self.value(k, None)
        return default if v is None else np.asarray(v).item()

    def x(self, k: int) -> Any:
        """Input k as a JAX value to compute with (float16 widened to float32, unless the
        model computes in a fast format)."""
        v = self.env[self.ins[k]]  # type: ignore[index]
        return v.astype(self.jnp.float32) if v.dtype in self.widen else v

    # ---- results ----------------------------------------------------------------------------
    def act(self, y: Any, code: int) -> Any:
        if code == 1:
            return self.jnp.maximum(y, 0)
        if code == 2:
            return self.jnp.clip(y, -1, 1)
        if code == 3:
            return self.jnp.clip(y, 0, 6)
        return y


@dataclass(frozen=True)
class Lowering:
    """How one operation type lowers. ``types``: the input-0 types accepted; ``consts``:
    inputs that must be constants (when present); ``supports``: further rules (None: accepted,
    else why not); ``lower``: the output values from an :class:`Op` with JAX values."""

    lower: Callable[[Op], Sequence[Any]]
    types: frozenset[OperandType] = FLOATS
    consts: Callable[[Op], Sequence[int]] = lambda op: range(1, op.n)
    supports: Callable[[Op], str | None] = lambda op: None
    #: The input whose type ``types`` checks (PACK's data starts after its axis).
    first: int = 0


LOWERINGS: dict[OperationType, Lowering] = {}


def _lowering(*types: OperationType, **kw: Any) -> Callable[[Callable], Callable]:
    def deco(fn: Callable[[Op], Sequence[Any]]) -> Callable:
        for t in types:
            LOWERINGS[t] = Lowering(fn, **kw)
        return fn
    return deco


# ---- elementwise ----------------------------------------------------------------------------

_BINARY = {O.ADD: "add", O.SUB: "subtract", O.MUL: "multiply", O.DIV: "divide"}


@_lowering(O.ADD, O.SUB, O.MUL, O.DIV, consts=lambda op: (2,))
def _binary(op: Op) -> Sequence[Any]:
    f = getattr(op.jnp, _BINARY[op.type])  # type: ignore[index]
    return [op.act(f(op.x(0), op.x(1)), int(op.scalar(2, 0)))]


@_lowering(O.MAXIMUM, O.MINIMUM, consts=lambda op: ())
def _minmax(op: Op) -> Sequence[Any]:
    f = op.jnp.maximum if op.type == O.MAXIMUM else op.jnp.minimum
    return [f(op.x(0), op.x(1))]


_UNARY: dict[OperationType, Callable[[Any, Any], Any]] = {
    O.RELU: lambda jnp, x: jnp.maximum(x, 0),
    O.RELU1: lambda jnp, x: jnp.clip(x, -1, 1),
    O.RELU6: lambda jnp, x: jnp.clip(x, 0, 6),
    O.LOGISTIC: lambda jnp, x: 1 / (1 + jnp.exp(-x)),
    O.TANH: lambda jnp, x: jnp.tanh(x),
    O.HARD_SWISH: lambda jnp, x: x * jnp.clip(x + 3, 0, 6) / 6,
    O.ABS: lambda jnp, x: jnp.abs(x),
    O.NEG: lambda jnp, x: -x,
    O.EXP: lambda jnp, x: jnp.exp(x),
    O.SQRT: lambda jnp, x: jnp.sqrt(x),
    O.RSQRT: lambda jnp, x: 1 / jnp.sqrt(x),
}


@_lowering(*_UNARY)
def _unary(op: Op) -> Sequence[Any]:
    return [_UNARY[op.type](op.jnp, op.x(0))]  # type: ignore[index]


@_lowering(O.PRELU, consts=lambda op: ())
def _prelu(op: Op) -> Sequence[Any]:
    x = op.x(0)
    return [op.jnp.where(x < 0, op.x(1) * x, x)]


# ---- shapes and data movement ----------------------------------------------------------------

@_lowering(O.RESHAPE, O.SQUEEZE, O.EXPAND_DIMS, types=FLOATS_INT, consts=lambda op: ())
def _reshape(op: Op) -> Sequence[Any]:
    # The analysis inferred the output shape: the shape operands' values add nothing.
    return [op.x(0).reshape(op.out_shape())]


@_lowering(O.TRANSPOSE, types=FLOATS_INT)
def _transpose(op: Op) -> Sequence[Any]:
    x = op.x(0)
    perm = op.value(1)
    axes = tuple(range(x.ndim))[::-1] if perm is None else \
        tuple(int(p) for p in np.asarray(perm).reshape(-1))
    return [op.jnp.transpose(x, axes)]


def _concat_consts(op: Op) -> Sequence[int]:
    return (op.n - 1,)


def _concat(op: Op) -> Sequence[Any]:
    axis = int(op.scalar(op.n - 1))
    return [op.jnp.concatenate([op.x(k) for k in range(op.n - 1)], axis=axis)]


def _concat_types(op: Op) -> str | None:
    t0 = op.info(0).type
    if any(op.info(k).type != t0 for k in range(op.n - 1)):
        return "inputs of different types"
    return None


LOWERINGS[O.CONCATENATION] = Lowering(_concat, FLOATS_INT, _concat_consts, _concat_types)


@_lowering(O.PAD, O.PAD_V2)
def _pad(op: Op) -> Sequence[Any]:
    pads = np.asarray(op.value(1)).reshape(-1, 2)
    x = op.x(0)
    # PAD fills with the logical zero: the zero point of a quantized tensor (0 for floats).
    value = op.scalar(2, 0.0) if op.type == O.PAD_V2 else op.info(0).zero_point
    return [op.jnp.pad(x, [(int(a), int(b)) for a, b in pads],
                       constant_values=np.asarray(value).astype(x.dtype))]


@_lowering(O.SLICE, types=FLOATS_INT)
def _slice(op: Op) -> Sequence[Any]:
    x = op.x(0)
    begin = [int(b) for b in np.asarray(op.value(1)).reshape(-1)]
    size = [int(s) for s in np.asarray(op.value(2)).reshape(-1)]
    end = [d if s == -1 else b + s for b, s, d in zip(begin, size, x.shape)]
    return [op.lax.slice(x, begin, end)]


# ---- reductions -----------------------------------------------------------------------------

def _axes(op: Op, rank: int) -> tuple[int, ...]:
    raw = np.asarray(op.value(1)).reshape(-1)
    return tuple(sorted({int(a) % rank for a in raw}))


_REDUCE = {O.MEAN: "mean", O.REDUCE_SUM: "sum", O.REDUCE_PROD: "prod",
           O.REDUCE_MAX: "max", O.REDUCE_MIN: "min"}


@_lowering(*_REDUCE)
def _reduce(op: Op) -> Sequence[Any]:
    x = op.x(0)
    axes = _axes(op, x.ndim)
    f = getattr(op.jnp, _REDUCE[op.type])  # type: ignore[index]
    return [f(x, axis=axes).reshape(op.out_shape())]


@_lowering(O.ARGMAX, O.ARGMIN, types=FLOATS_INT)
def _arg(op: Op) -> Sequence[Any]:
    x = op.x(0)
    axis = int(op.scalar(1)) % x.ndim
    f = op.jnp.argmax if op.type == O.ARGMAX else op.jnp.argmin
    return [f(x, axis=axis).astype(op.jnp.int32)]


def _softmax_supports(op: Op) -> str | None:
    beta = op.scalar(1)
    return None if beta is not None and np.isfinite(beta) and beta > 0 else \
        "beta that is not a finite positive number"


@_lowering(O.SOFTMAX, supports=_softmax_supports)
def _softmax(op: Op) -> Sequence[Any]:
    x = op.x(0)
    axis = int(op.scalar(2, -1))
    beta = np.float32(op.scalar(1))
    z = (x - op.jnp.max(x, axis=axis, keepdims=True)) * beta
    e = op.jnp.exp(z)
    return [e / op.jnp.sum(e, axis=axis, keepdims=True)]


# ---- convolutions, pooling, fully connected -------------------------------------------------

class _Shim:
    """What nnhal.ops.conv's layout selection reads of an operation context."""

    def __init__(self, op: Op):
        self.inputs = [op.info(k) for k in range(op.n)]

    @staticmethod
    def fail(message: str) -> OpError:
        return OpError(message)


def _conv_args(op: Op) -> tuple[Any, Any]:
    shim = _Shim(op)
    if op.type == O.CONV_2D:
        layout = conv_rules._select(shim, 7, 10, has_extra=False)  # type: ignore[arg-type]
    else:
        layout = conv_rules._select(shim, 8, 11, has_extra=True)  # type: ignore[arg-type]
    return layout, conv_rules._resolve(layout, conv_rules._static_values(shim))  # type: ignore


def _conv_consts(op: Op) -> Sequence[int]:
    return range(3, op.n)  # every parameter; the filter and bias may come at run time


def _conv_kind_supports(args: Callable[[Op], Any]) -> Callable[[Op], str | None]:
    """The support check of a convolution whose parameters ``args`` resolves: filter and
    bias types, then the parameters, then an implicit padding scheme XLA knows."""

    def supports(op: Op) -> str | None:
        why = _types_agree(op)
        if why is not None:
            return why
        try:
            a = args(op)
        except OpError as e:
            return str(e)
        return f"padding scheme {a.code}" if a.code is not None and a.code not in (1, 2) \
            else None

    return supports


_conv_supports = _conv_kind_supports(lambda op: _conv_args(op)[1])


#: The quantized terms of the convolutions and dense layers (``conv_terms``,
#: ``weights_supports``), filled in by :func:`nnhal.drivers.xla.quantized.register`, which
#: the package runs on import: this module declares the float forms and never imports those.
QUANTIZED_TERMS: dict[str, Callable[[Op], Any]] = {}


def _terms(op: Op) -> tuple[Any, Any, Callable[[Any, int], Any], Any]:
    """What a convolution or dense layer multiplies and how it finishes: (input, filter,
    ``finish(sum, activation)``, the accumulator's dtype or None). Floats: the operands as
    they are, then the bias and the activation. Quantized: the stored values minus their zero
    points as int32, summed exactly in int32, then the reference requantisation
    (:func:`nnhal.drivers.xla.quantized.conv_terms`)."""
    if op.info(0).type in QUANTIZED:
        return QUANTIZED_TERMS["conv_terms"](op)
    return op.x(0), op.x(1), lambda y, act: op.act(y + op.x(2), act), None


def _types_agree(op: Op) -> str | None:
    """A convolution's or dense layer's filter and bias types (and, quantized, the rules of
    :func:`nnhal.drivers.xla.quantized.weights_supports`)."""
    if op.info(0).type in QUANTIZED:
        check = QUANTIZED_TERMS.get("weights_supports")
        return "quantized forms not registered" if check is None else check(op)
    if op.info(1).type != op.info(0).type or op.info(2).type != op.info(0).type:
        return "filter or bias of another type than the input"
    return None


def _to_nhwc(op: Op, x: Any, nchw: bool) -> Any:
    return op.jnp.transpose(x, (0, 2, 3, 1)) if nchw else x


def _from_nhwc(op: Op, y: Any, nchw: bool) -> Any:
    return op.jnp.transpose(y, (0, 3, 1, 2)) if nchw else y


def _pads(a: Any, h: int, w: int, kh: int, kw: int) -> list[tuple[int, int]]:
    if a.code is not None:
        top, bottom = conv_rules.explicit_padding(h, a.stride[0], a.dilation[0], kh, a.code)
        left, right = conv_rules.explicit_padding(w, a.stride[1], a.dilation[1], kw, a.code)
        return [(top, bottom), (left, right)]
    left, right, top, bottom = a.pads
    return [(int(top), int(bottom)), (int(left), int(right))]


def _convolve(op: Op, x: Any, w: Any, stride: Sequence[int], pads: Sequence[tuple[int, int]],
              acc: Any, rhs_dilation: Sequence[int] = (1, 1),
              lhs_dilation: Sequence[int] = (1, 1), groups: int = 1) -> Any:
    """An NHWC input convolved with an OHWI filter. Floats: XLA's convolution. Integer sums
    (the quantized forms): the input's kh * kw strided windows side by side and one int32
    matrix product with the filter, because XLA's GPU backend has no integer convolution
    (its matrix products take int32); the sum is the same exact int32 sum on every backend."""
    stride, rhs_dilation, lhs_dilation = (tuple(int(v) for v in t)
                                          for t in (stride, rhs_dilation, lhs_dilation))
    if acc is None:
        return op.lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[tuple(p) for p in pads],
            lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
            dimension_numbers=("NHWC", "OHWI", "NHWC"), feature_group_count=groups,
            precision=op.precision, preferred_element_type=acc)
    jnp, lax = op.jnp, op.lax
    (top, bottom), (left, right) = pads
    x = lax.pad(x, np.zeros((), x.dtype), ((0, 0, 0), (top, bottom, lhs_dilation[0] - 1),
                                           (left, right, lhs_dilation[1] - 1), (0, 0, 0)))
    n, hp, wp, c = x.shape
    o, kh, kw, cg = w.shape
    (sh, sw), (dh, dw) = stride, rhs_dilation
    oh = (hp - ((kh - 1) * dh + 1)) // sh + 1
    ow = (wp - ((kw - 1) * dw + 1)) // sw + 1
    taps = [lax.slice(x, (0, i * dh, j * dw, 0),
                      (n, i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1, c),
                      (1, sh, sw, 1)) for i in range(kh) for j in range(kw)]
    patches = jnp.stack(taps, axis=3).reshape(n, oh, ow, kh * kw, groups, cg)
    filt = w.reshape(groups, o // groups, kh * kw, cg)
    y = jnp.einsum("nhwkgc,gokc->nhwgo", patches, filt, preferred_element_type=acc)
    return y.reshape(n, oh, ow, o)


@_lowering(O.CONV_2D, O.DEPTHWISE_CONV_2D, consts=_conv_consts, supports=_conv_supports)
def _conv(op: Op) -> Sequence[Any]:
    _, a = _conv_args(op)
    nchw = bool(a.nchw)
    x, w, finish, acc = _terms(op)
    x = _to_nhwc(op, x, nchw)
    _, h, wd, c = x.shape
    _, kh, kw, _ = w.shape
    pads = _pads(a, h, wd, kh, kw)
    if op.type == O.DEPTHWISE_CONV_2D:
        y = _depthwise(op, x, w[0], a, pads)
    elif kh == kw == 1 and tuple(a.stride) == (1, 1) and not any(map(any, pads)):
        # A pointwise convolution is one matrix product (the channels of every pixel).
        y = op.jnp.matmul(x.reshape(-1, c), w.reshape(w.shape[0], c).T, precision=op.precision,
                          preferred_element_type=acc).reshape(*x.shape[:3], w.shape[0])
    else:
        y = _convolve(op, x, w, a.stride, pads, acc, rhs_dilation=a.dilation)
    return [_from_nhwc(op, finish(y, int(a.act)), nchw)]


def _depthwise(op: Op, x: Any, w: Any, a: Any, pads: list[tuple[int, int]]) -> Any:
    """A depthwise convolution as a sum of kh * kw shifted, strided slices times one filter
    tap each: XLA fuses it into one loop over the output (its grouped convolution with one
    group per channel ran several times slower on the CPU)."""
    jnp, lax = op.jnp, op.lax
    kh, kw, cm = w.shape
    c = x.shape[3]
    if cm != c:
        x = jnp.repeat(x, cm // c, axis=3)  # output channel c * multiplier + m reads channel c
    x = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    sh, sw = (int(s) for s in a.stride)
    dh, dw = (int(d) for d in a.dilation)
    n, hp, wp, _ = x.shape
    oh = (hp - ((kh - 1) * dh + 1)) // sh + 1
    ow = (wp - ((kw - 1) * dw + 1)) // sw + 1
    y = None
    for i in range(kh):
        for j in range(kw):
            tap = lax.slice(x, (0, i * dh, j * dw, 0),
                            (n, i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1, cm),
                            (1, sh, sw, 1)) * w[i, j]
            y = tap if y is None else y + tap
    return y


def _pool_params(op: Op) -> Any:
    values = [op.value(k) for k in range(1, op.n)]
    nchw = op.n in (8, 11) and bool(op.scalar(op.n - 1))
    shape = op.info(0).shape
    h, w = (shape[2], shape[3]) if nchw else (shape[1], shape[2])  # type: ignore[index]
    return pool_rules.resolve_params(values, op.n, h, w)


def _pool_supports(op: Op) -> str | None:
    try:
        _pool_params(op)
    except (OpError, TypeError, ValueError) as e:
        return str(e)
    return None


@_lowering(O.AVERAGE_POOL_2D, O.MAX_POOL_2D, O.L2_POOL_2D, supports=_pool_supports)
def _pool(op: Op) -> Sequence[Any]:
    p = _pool_params(op)
    jnp, lax = op.jnp, op.lax
    x = _to_nhwc(op, op.x(0), p.nchw)
    _, h, w, _ = x.shape
    dims, strides = (1, p.filter_h, p.filter_w, 1), (1, p.stride_h, p.stride_w, 1)
    pads = ((0, 0), (p.pad_top, p.pad_bottom), (p.pad_left, p.pad_right), (0, 0))
    if op.type == O.MAX_POOL_2D:
        y = lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, pads)
    else:
        src = x * x if op.type == O.L2_POOL_2D else x
        s = lax.reduce_window(src, 0.0, lax.add, dims, strides, pads)
        oh, ow = s.shape[1], s.shape[2]
        rows = pool_rules._window_counts(h, oh, p.stride_h, p.pad_top, p.filter_h)
        cols = pool_rules._window_counts(w, ow, p.stride_w, p.pad_left, p.filter_w)
        counts = np.maximum(np.outer(rows, cols), 1).astype(np.float32)[None, :, :, None]
        y = s / counts
        if op.type == O.L2_POOL_2D:
            y = jnp.sqrt(y)
    return [_from_nhwc(op, op.act(y, p.activation), p.nchw)]


def _fc_supports(op: Op) -> str | None:
    return _types_agree(op)


@_lowering(O.FULLY_CONNECTED, consts=lambda op: (3,), supports=_fc_supports)
def _fully_connected(op: Op) -> Sequence[Any]:
    x, w, finish, acc = _terms(op)
    y = op.jnp.matmul(x.reshape(-1, w.shape[1]), w.T, precision=op.precision,
                      preferred_element_type=acc)
    return [finish(y, int(op.scalar(3)))]


# ---- resize ---------------------------------------------------------------------------------

def _resize_params(op: Op) -> tuple[bool, bool, bool]:
    nchw = bool(op.scalar(3, False))
    align, half = bool(op.scalar(4, False)), bool(op.scalar(5, False))
    return nchw, align, half


def _resize_supports(op: Op) -> str | None:
    _, align, half = _resize_params(op)
    return "align_corners with half_pixel_centers" if align and half else None


@_lowering(O.RESIZE_BILINEAR, O.RESIZE_NEAREST_NEIGHBOR, supports=_resize_supports)
def _resize(op: Op) -> Sequence[Any]:
    nchw, align, half = _resize_params(op)
    x = _to_nhwc(op, op.x(0), nchw)
    _, h, w, _ = x.shape
    out = op.out_shape()
    oh, ow = (out[2], out[3]) if nchw else (out[1], out[2])
    if op.type == O.RESIZE_NEAREST_NEIGHBOR:
        ys = resize_rules._nearest_axis(h, oh, align, half)
        xs = resize_rules._nearest_axis(w, ow, align, half)
        y = x[:, ys][:, :, xs]
    else:  # the reference driver's arithmetic (TFLite's), index tables made here
        y0, y1, dy = resize_rules._bilinear_axis(h, oh, align, half)
        x0, x1, dx = resize_rules._bilinear_axis(w, ow, align, half)
        dy = dy[None, :, None, None]
        dx = dx[None, None, :, None]
        stored = x.dtype
        r0, r1 = x[:, y0].astype(np.float32), x[:, y1].astype(np.float32)
        y = (r0[:, :, x0] * (1 - dy) * (1 - dx) + r1[:, :, x0] * dy * (1 - dx)
             + r0[:, :, x1] * (1 - dy) * dx + r1[:, :, x1] * dy * dx)
        if op.info(0).type in QUANTIZED:  # the stored integers interpolated, rounded half up
            lo, hi = np.iinfo(stored).min, np.iinfo(stored).max
            y = op.jnp.clip(op.jnp.floor(y + np.float32(0.5)), lo, hi).astype(stored)
    return [_from_nhwc(op, y, nchw)]


# ---- more elementwise, normalization, layout ----------------------------------------------

_UNARY.update({
    O.LOG: lambda jnp, x: jnp.log(x),
    O.SIN: lambda jnp, x: jnp.sin(x),
    O.FLOOR: lambda jnp, x: jnp.floor(x),
})
for _t in (O.LOG, O.SIN, O.FLOOR):
    LOWERINGS[_t] = LOWERINGS[O.RELU]


@_lowering(O.POW, consts=lambda op: ())
def _pow(op: Op) -> Sequence[Any]:
    return [op.jnp.power(op.x(0), op.x(1))]


@_lowering(O.ELU)
def _elu(op: Op) -> Sequence[Any]:
    x, alpha = op.x(0), np.float32(op.scalar(1))
    return [op.jnp.where(x < 0, alpha * op.jnp.expm1(x), x)]


@_lowering(O.LOG_SOFTMAX)
def _log_softmax(op: Op) -> Sequence[Any]:
    jnp = op.jnp
    x = op.x(0) * np.float32(op.scalar(1))
    axis = int(op.scalar(2))
    z = x - jnp.max(x, axis=axis, keepdims=True)
    return [z - jnp.log(jnp.sum(jnp.exp(z), axis=axis, keepdims=True))]


@_lowering(O.L2_NORMALIZATION)
def _l2_norm(op: Op) -> Sequence[Any]:
    jnp = op.jnp
    x = op.x(0)
    axis = int(op.scalar(1, -1))
    norm = jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=True))
    return [x / jnp.maximum(norm, np.float32(1e-6))]


@_lowering(O.LOCAL_RESPONSE_NORMALIZATION)
def _lrn(op: Op) -> Sequence[Any]:
    jnp, lax = op.jnp, op.lax
    x = op.x(0)
    radius = int(op.scalar(1))
    bias, alpha, beta = (np.float32(op.scalar(k)) for k in (2, 3, 4))
    axis = int(op.scalar(5, -1)) % x.ndim
    dims = [1] * x.ndim
    dims[axis] = 2 * radius + 1
    pads = [(0, 0)] * x.ndim
    pads[axis] = (radius, radius)
    window = lax.reduce_window(x * x, 0.0, lax.add, tuple(dims), (1,) * x.ndim, tuple(pads))
    return [x * jnp.power(bias + alpha * window, -beta)]


def _instance_norm_supports(op: Op) -> str | None:
    return None if op.info(0).type == T.TENSOR_FLOAT32 else \
        "float16: the reference computes it in float64"


@_lowering(O.INSTANCE_NORMALIZATION, supports=_instance_norm_supports)
def _instance_norm(op: Op) -> Sequence[Any]:
    jnp = op.jnp
    x = op.x(0)
    gamma, beta, eps = (np.float32(op.scalar(k)) for k in (1, 2, 3))
    spatial = (2, 3) if bool(op.scalar(4)) else (1, 2)
    mean = jnp.mean(x, axis=spatial, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=spatial, keepdims=True)
    return [(x - mean) * gamma / jnp.sqrt(var + eps) + beta]


@_lowering(O.DEPTH_TO_SPACE, O.SPACE_TO_DEPTH, types=FLOATS_INT)
def _depth_space(op: Op) -> Sequence[Any]:
    bs = int(op.scalar(1))
    nchw = bool(op.scalar(2, False))
    x = _to_nhwc(op, op.x(0), nchw)
    n, h, w, c = x.shape
    if op.type == O.DEPTH_TO_SPACE:
        co = c // (bs * bs)
        y = x.reshape(n, h, w, bs, bs, co).transpose(0, 1, 3, 2, 4, 5)
        y = y.reshape(n, h * bs, w * bs, co)
    else:
        y = x.reshape(n, h // bs, bs, w // bs, bs, c).transpose(0, 1, 3, 2, 4, 5)
        y = y.reshape(n, h // bs, w // bs, bs * bs * c)
    return [_from_nhwc(op, y, nchw)]


@_lowering(O.CHANNEL_SHUFFLE, types=FLOATS_INT)
def _channel_shuffle(op: Op) -> Sequence[Any]:
    x = op.x(0)
    groups = int(op.scalar(1))
    axis = int(op.scalar(2)) % x.ndim
    c = x.shape[axis]
    shape = (*x.shape[:axis], groups, c // groups, *x.shape[axis + 1:])
    y = op.jnp.swapaxes(x.reshape(shape), axis, axis + 1)
    return [y.reshape(x.shape)]


@_lowering(O.TILE, types=FLOATS_INT)
def _tile(op: Op) -> Sequence[Any]:
    reps = tuple(int(m) for m in np.asarray(op.value(1)).reshape(-1))
    return [op.jnp.tile(op.x(0), reps)]


@_lowering(O.SPLIT, types=FLOATS_INT)
def _split(op: Op) -> Sequence[Any]:
    x = op.x(0)
    axis = int(op.scalar(1)) % x.ndim
    return op.jnp.split(x, int(op.scalar(2)), axis=axis)


def _gather_supports(op: Op) -> str | None:
    shape = op.info(0).shape
    axis = int(op.scalar(1)) % len(shape)  # type: ignore[arg-type]
    idx = np.asarray(op.value(2))
    if idx.size and (idx.min() < 0 or idx.max() >= shape[axis]):  # type: ignore[index]
        return "indices out of range"
    return None


@_lowering(O.GATHER, types=FLOATS_INT, supports=_gather_supports)
def _gather(op: Op) -> Sequence[Any]:
    x = op.x(0)
    axis = int(op.scalar(1)) % x.ndim
    return [op.jnp.take(x, np.asarray(op.value(2)).astype(np.int32), axis=axis)]


def _strided_plan(op: Op) -> Any:
    from nnhal.ops import indexing

    ints = [[int(v) for v in np.asarray(op.value(k)).reshape(-1)] for k in (1, 2, 3)]
    masks = [int(op.scalar(k)) for k in (4, 5, 6)]
    return indexing._strided_plan(op.info(0).shape, *ints, *masks)


def _strided_supports(op: Op) -> str | None:
    try:
        plan, _ = _strided_plan(op)
    except OpError as e:
        return str(e)
    return "an empty selection" if any(count == 0 for _, count, _ in plan) else None


@_lowering(O.STRIDED_SLICE, types=FLOATS_INT, supports=_strided_supports)
def _strided_slice(op: Op) -> Sequence[Any]:
    plan, _ = _strided_plan(op)
    x = op.x(0)
    index = []
    for start, count, stride in plan:
        last = start + stride * (count - 1)
        stop = last + (1 if stride > 0 else -1)
        index.append(slice(start, None if stop < 0 else stop, stride))
    return [x[tuple(index)].reshape(op.out_shape())]


def _grouped_args(op: Op) -> Any:
    shim = _Shim(op)
    layout = conv_rules._select(shim, 9, 12, has_extra=True)  # type: ignore[arg-type]
    return conv_rules._resolve(layout, conv_rules._static_values(shim))  # type: ignore


@_lowering(O.GROUPED_CONV_2D, consts=_conv_consts, supports=_conv_kind_supports(_grouped_args))
def _grouped_conv(op: Op) -> Sequence[Any]:
    a = _grouped_args(op)
    nchw = bool(a.nchw)
    x, w, finish, acc = _terms(op)
    x = _to_nhwc(op, x, nchw)
    _, h, wd, _ = x.shape
    _, kh, kw, _ = w.shape
    y = _convolve(op, x, w, a.stride, _pads(a, h, wd, kh, kw), acc, rhs_dilation=a.dilation,
                  groups=int(a.extra))
    return [_from_nhwc(op, finish(y, int(a.act)), nchw)]


def _tconv_args(op: Op) -> Any:
    if op.n == 9:
        layout = conv_rules._make_layout(op.n, True, False, out_shape=True)
    elif op.n == 11:
        layout = conv_rules._make_layout(op.n, False, False)
    else:
        raise OpError(f"unsupported number of inputs {op.n}")
    return conv_rules._resolve(layout, conv_rules._static_values(_Shim(op)))  # type: ignore


def _tconv_pads(op: Op, a: Any, kh: int, kw: int) -> list[tuple[int, int]]:
    if a.pads is not None:
        left, right, top, bottom = (int(p) for p in a.pads)
        return [(top, bottom), (left, right)]
    shape = [int(v) for v in np.asarray(a.out_shape).reshape(-1)]
    oh, ow = (shape[2], shape[3]) if a.nchw else (shape[1], shape[2])
    top, bottom = conv_rules.explicit_padding(oh, a.stride[0], 1, kh, a.code, transpose=True)
    left, right = conv_rules.explicit_padding(ow, a.stride[1], 1, kw, a.code, transpose=True)
    return [(top, bottom), (left, right)]


def _tconv_consts(op: Op) -> Sequence[int]:
    return range(3, op.n)


@_lowering(O.TRANSPOSE_CONV_2D, consts=_tconv_consts, supports=_conv_kind_supports(_tconv_args))
def _transpose_conv(op: Op) -> Sequence[Any]:
    a = _tconv_args(op)
    nchw = bool(a.nchw)
    x, w, finish, acc = _terms(op)  # w: [out, kh, kw, in]
    x = _to_nhwc(op, x, nchw)
    _, kh, kw, _ = w.shape
    sh, sw = (int(s) for s in a.stride)
    (top, bottom), (left, right) = _tconv_pads(op, a, kh, kw)
    # out[o] = sum over i*s + k - head = o: the input dilated by the stride, padded by k - 1
    # on both sides, convolved with the flipped filter; the paddings then cut from the result.
    y = _convolve(op, x, w[:, ::-1, ::-1, :], (1, 1), [(kh - 1, kh - 1), (kw - 1, kw - 1)],
                  acc, lhs_dilation=(sh, sw))
    out = op.out_shape()
    oh, ow = (out[2], out[3]) if nchw else (out[1], out[2])
    # Output positions past the last one a filter tap reaches (a filter smaller than the
    # stride) get no term: zeros, then the bias.
    y = op.jnp.pad(y, ((0, 0), (0, max(0, top + oh - y.shape[1])),
                       (0, max(0, left + ow - y.shape[2])), (0, 0)))
    y = y[:, top:top + oh, left:left + ow, :]
    return [_from_nhwc(op, finish(y, int(a.act)), nchw)]


# ---- booleans and batches ------------------------------------------------------------------

_COMPARE = {O.EQUAL: "equal", O.NOT_EQUAL: "not_equal", O.GREATER: "greater",
            O.GREATER_EQUAL: "greater_equal", O.LESS: "less", O.LESS_EQUAL: "less_equal"}


@_lowering(*_COMPARE, types=PLAIN, consts=lambda op: ())
def _compare(op: Op) -> Sequence[Any]:
    return [getattr(op.jnp, _COMPARE[op.type])(op.x(0), op.x(1))]  # type: ignore[index]


_LOGICAL = {O.LOGICAL_AND: "logical_and", O.LOGICAL_OR: "logical_or"}


@_lowering(*_LOGICAL, types=frozenset({T.TENSOR_BOOL8}), consts=lambda op: ())
def _logical(op: Op) -> Sequence[Any]:
    return [getattr(op.jnp, _LOGICAL[op.type])(op.x(0), op.x(1))]  # type: ignore[index]


@_lowering(O.LOGICAL_NOT, types=frozenset({T.TENSOR_BOOL8}))
def _logical_not(op: Op) -> Sequence[Any]:
    return [op.jnp.logical_not(op.x(0))]


def _select_values(op: Op) -> Sequence[Any]:
    return [op.jnp.where(op.x(0), op.x(1), op.x(2))]


def _select_supports(op: Op) -> str | None:
    return None if op.info(1).type in PLAIN else f"values of type {op.info(1).type.name}"


LOWERINGS[O.SELECT] = Lowering(_select_values, frozenset({T.TENSOR_BOOL8}), lambda op: (),
                               _select_supports)


@_lowering(O.REDUCE_ANY, O.REDUCE_ALL, types=frozenset({T.TENSOR_BOOL8}))
def _reduce_bool(op: Op) -> Sequence[Any]:
    x = op.x(0)
    f = op.jnp.any if op.type == O.REDUCE_ANY else op.jnp.all
    return [f(x, axis=_axes(op, x.ndim)).reshape(op.out_shape())]


@_lowering(O.SPACE_TO_BATCH_ND, O.BATCH_TO_SPACE_ND, types=FLOATS_INT)
def _space_batch(op: Op) -> Sequence[Any]:
    jnp = op.jnp
    bh, bw = (int(b) for b in np.asarray(op.value(1)).reshape(-1))
    to_batch = op.type == O.SPACE_TO_BATCH_ND
    layout = 3 if to_batch else 2
    nchw = bool(op.scalar(layout, False))
    x = _to_nhwc(op, op.x(0), nchw)
    if to_batch:
        pads = np.asarray(op.value(2)).reshape(2, 2)
        x = jnp.pad(x, ((0, 0), (int(pads[0, 0]), int(pads[0, 1])),
                        (int(pads[1, 0]), int(pads[1, 1])), (0, 0)),
                    constant_values=np.asarray(op.info(0).zero_point).astype(x.dtype))
        n, h, w, c = x.shape
        y = x.reshape(n, h // bh, bh, w // bw, bw, c).transpose(2, 4, 0, 1, 3, 5)
        y = y.reshape(bh * bw * n, h // bh, w // bw, c)
    else:
        nb, h, w, c = x.shape
        n = nb // (bh * bw)
        y = x.reshape(bh, bw, n, h, w, c).transpose(2, 3, 0, 4, 1, 5)
        y = y.reshape(n, h * bh, w * bw, c)
    return [_from_nhwc(op, y, nchw)]


# ---- feature levels 6 and 7 (AIDL v2, v3) -------------------------------------------------

@_lowering(O.BATCH_MATMUL, consts=lambda op: (2, 3))
def _batch_matmul(op: Op) -> Sequence[Any]:
    jnp = op.jnp
    x, y = op.x(0), op.x(1)
    if op.scalar(2, False):
        x = jnp.swapaxes(x, -1, -2)
    if op.scalar(3, False):
        y = jnp.swapaxes(y, -1, -2)
    return [jnp.matmul(x, y, precision=op.precision)]


def _pack(op: Op) -> Sequence[Any]:
    return [op.jnp.stack([op.x(k) for k in range(1, op.n)], axis=int(op.scalar(0)))]


LOWERINGS[O.PACK] = Lowering(_pack, FLOATS_INT, lambda op: (0,), first=1)


@_lowering(O.MIRROR_PAD, types=FLOATS_INT)
def _mirror_pad(op: Op) -> Sequence[Any]:
    pads = np.asarray(op.value(1)).reshape(-1, 2)
    mode = "reflect" if int(op.scalar(2)) == 0 else "symmetric"
    return [op.jnp.pad(op.x(0), [(int(a), int(b)) for a, b in pads], mode=mode)]


@_lowering(O.REVERSE, types=FLOATS_INT)
def _reverse(op: Op) -> Sequence[Any]:
    x = op.x(0)
    axes = tuple(int(a) % x.ndim for a in np.asarray(op.value(1)).reshape(-1))
    return [op.jnp.flip(x, axis=axes)]


# ---- support ------------------------------------------------------------------------------

def _known(info: OperandInfo, shape: Any) -> bool:
    return not info.type.is_tensor or (shape is not None and all(d > 0 for d in shape))


def why_not(graph: SubgraphGraph, k: int) -> str | None:
    """None when main operation ``k`` lowers, else why not (one line)."""
    t, ins, outs = graph.operations[k]
    try:
        lowering = LOWERINGS.get(OperationType(t))
    except ValueError:
        return "extension operation"
    if lowering is None:
        return f"{OperationType(t).name} is not lowered"
    op = Op(graph, graph.operations[k])
    if op.info(lowering.first).type not in lowering.types:
        return f"input type {op.info(lowering.first).type.name}"
    for o in outs:
        info = graph.operands[o]
        if info.type not in RUNS:
            return f"output type {info.type.name}"
        if not _known(info, graph.shapes[o]):
            return "output shape not known at prepare"
    must = set(lowering.consts(op))
    for j, i in enumerate(ins):
        info = graph.operands[i]
        if info.omitted:
            continue
        if j in must:
            if not info.is_const:
                return f"input {j} is given at run time"
            continue
        if info.type.is_tensor and (info.type not in RUNS
                                    or not _known(info, graph.shapes[i])):
            return f"input {j}: type {info.type.name} or shape not known at prepare"
    try:
        return lowering.supports(op)
    except Exception as e:  # noqa: BLE001 - a parameter the rules cannot read: refused
        return f"{type(e).__name__}: {e}"


def uses_quantized(graph: ModelGraph) -> bool:
    """Whether the main subgraph has a quantized operand (its lowering needs 64-bit types)."""
    return any(info.type in QUANTIZED for info in graph.main.operands)


def supported_operations(graph: ModelGraph) -> list[bool]:
    main = graph.main
    return [ok and why_not(main, k) is None for k, ok in enumerate(main.supported)]


def refusal(graph: ModelGraph) -> str | None:
    """None when the whole model compiles, else why not."""
    main = graph.main
    for k, ok in enumerate(main.supported):
        if not ok:
            return "unsupported operations: " + ", ".join(graph.unsupported_names())
        why = why_not(main, k)
        if why is not None:
            name = OperationType(main.operations[k][0]).name if \
                main.operations[k][0] in OperationType._value2member_map_ else "operation"
            return f"operation {k} ({name}): {why}"
    for i in (*main.inputs, *main.outputs):
        info = main.operands[i]
        if info.type not in RUNS or not _known(info, main.shapes[i]):
            return f"model operand {i}: type {info.type.name} or shape not known at prepare"
    return None


# ---- the whole main subgraph as one function -----------------------------------------------

@dataclass(frozen=True)
class Weight:
    """A constant tensor passed to the compiled function (operand index, dtype, shape)."""

    index: int
    dtype: str
    shape: tuple[int, ...]


def weights_of(graph: ModelGraph) -> list[Weight]:
    """The constant tensors the function takes as arguments, in argument order."""
    main = graph.main
    used = {i for _, ins, _ in main.operations for i in ins}
    out = []
    for i in sorted(used | set(main.outputs)):
        info = main.operands[i]
        if info.is_const and info.type.is_tensor and info.type in RUNS and \
                math.prod(main.shapes[i] or (0,)) > WEIGHT_MIN_ELEMENTS:
            out.append(Weight(i, np.dtype(info.type.dtype).str, tuple(main.shapes[i])))
    return out


def build_function(graph: ModelGraph, weights: Sequence[Weight], precision: Any,
                   compute: Any = None) -> Callable[..., tuple[Any, ...]]:
    """The main subgraph as one function of (weights..., inputs...) returning the outputs.

    ``compute`` (a relaxed model only; None: the stored types): the fast float dtype
    (float16) every float operand is computed and kept in. The float inputs are cast to
    it on entry, the float weights must be given in it (:func:`fast_weights`), the outputs
    are cast back to their stored types; the operations of :data:`WIDENED` compute in
    float32."""
    import jax.numpy as jnp
    from jax import lax

    main = graph.main
    n_w = len(weights)
    fast = None if compute is None else np.dtype(compute)
    plain_widen: tuple[Any, ...] = (np.float16,) if fast is None else ()
    wide = (np.float16,) if fast is None else (fast,)

    def stored(i: int) -> Any:
        """The dtype operand i is computed and kept in."""
        t = main.operands[i].type
        return fast if fast is not None and t in FLOATS else t.dtype

    def fn(*args: Any) -> tuple[Any, ...]:
        env: dict[int, Any] = {}
        for w, a in zip(weights, args[:n_w]):
            env[w.index] = a
        for i, a in zip(main.inputs, args[n_w:]):
            env[i] = a.astype(fast) if fast is not None and \
                main.operands[i].type in FLOATS else a

        def constant(i: int) -> Any:
            info = main.operands[i]
            if info.lifetime in (OperandLifeTime.CONSTANT_COPY,
                                 OperandLifeTime.CONSTANT_REFERENCE) and info.value is not None:
                v = np.asarray(info.value, dtype=stored(i)) if info.type.is_tensor \
                    else np.asarray(info.value)
                env[i] = jnp.asarray(v.reshape(main.shapes[i] or v.shape))
                return env[i]
            return None

        for op in main.operations:
            kind, ins, outs = op
            for i in ins:
                if i not in env and not main.operands[i].omitted:
                    constant(i)
            results = LOWERINGS[OperationType(kind)].lower(
                Op(main, op, env, jnp, lax, precision,
                   wide if kind in WIDENED else plain_widen))
            for o, r in zip(outs, results):
                env[o] = jnp.asarray(r).astype(stored(o)).reshape(main.shapes[o])
        outs = []
        for i in main.outputs:
            v = env[i] if i in env else constant(i)
            outs.append(v.astype(main.operands[i].type.dtype))
        return tuple(outs)

    return fn


def fast_weights(graph: ModelGraph, weights: Sequence[Weight], compute: Any) -> list[Weight]:
    """The weight table of a model computed in the fast dtype ``compute``: its float weights
    stored in that dtype (cast once, at prepare)."""
    main = graph.main
    return [Weight(w.index, np.dtype(compute).str, w.shape)
            if main.operands[w.index].type in FLOATS else w for w in weights]
