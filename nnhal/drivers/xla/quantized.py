"""The XLA driver's quantized lowerings: the reference driver's integer arithmetic, traced.

Two ways keep XLA's results equal to the reference's, bit for bit, rather than close:

* **Tables from the reference kernel itself.** An 8-bit result that depends only on one 8-bit
  value (RELU*, LOGISTIC, TANH, HARD_SWISH, DEQUANTIZE, the requantisation of a
  CONCATENATION input) or on a pair of them (quantized ADD, SUB, MUL, MAXIMUM, MINIMUM) is
  computed once at prepare by running the reference driver's own kernel over every possible
  input (256 values, or the 65,536 pairs); the compiled function looks each element up. No
  second copy of those formulas exists to drift from the first.
* **Accumulate, then requantise with the reference's formulas.** Convolutions and dense layers
  sum ``(x - zx) * (w - zw)`` exactly in int32 (``preferred_element_type``, in matrix products
  only: XLA's GPU backend has no integer convolution, see ``lowering._convolve``; refused where
  the sum could leave int32), add the int32 bias and requantise through
  :func:`nnhal.ops.common.requantize_int32_sum` itself (sum + bias wraps in int32, as the
  reference's accumulator does), called with ``jax.numpy`` as its array namespace. Its
  64-bit products need JAX's 64-bit types, which
  :func:`nnhal.drivers.xla.engine.compile_graph` enables only while tracing a model that has
  quantized operands (``jax.enable_x64`` is scoped to that thread and that block; the compiled
  executable takes and returns the model's own types and runs from any thread, fresh or
  restored from the cache). The multipliers, shifts and clamps are the reference's own
  (``nnhal.ops.conv.ConvRequant``, ``quant_activation_range``).

Pooling and QUANTIZE follow the reference's integer and float32 formulas directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nnhal.drivers.xla import lowering as L
from nnhal.hal.types import OperandLifeTime, OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops import conv as conv_ops
from nnhal.ops import elementwise, normalization
from nnhal.ops import softmax as softmax_ops
from nnhal.ops.resolver import OpContext, OperandInfo, definitions

O = OperationType
T = OperandType

#: The 8-bit activation types every quantized lowering here computes with.
Q8 = frozenset({T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED})
#: Input-0 types of the tables' unary operations (DEQUANTIZE also reads TENSOR_QUANT8_SYMM).
Q8_ANY = Q8 | {T.TENSOR_QUANT8_SYMM}
PER_CHANNEL = T.TENSOR_QUANT8_SYMM_PER_CHANNEL
_INT32_MAX = 2**31 - 1


# ---- the reference kernel over every input value ---------------------------------------------

class _Run:
    """The run context a reference kernel gets while a table is computed at prepare."""

    loop_timeout_ns = 0

    @staticmethod
    def check_deadline() -> None:
        return None


def _as_input(info: OperandInfo, shape: tuple[int, ...]) -> OperandInfo:
    return dataclasses.replace(info, shape=shape, value=None,
                               lifetime=OperandLifeTime.TEMPORARY_VARIABLE)


def reference_outputs(op_type: OperationType, inputs: Sequence[OperandInfo],
                      outputs: Sequence[OperandInfo], values: Sequence[Any]) -> list[np.ndarray]:
    """The reference driver's kernel for ``op_type`` bound to these operand descriptions and
    run once on ``values`` (arrays for the tensors, constants for the rest)."""
    ctx = OpContext(op_type, list(inputs), list(outputs))
    return definitions()[int(op_type)].kernel(ctx)(list(values), _Run())


def _grid(t: OperandType) -> np.ndarray:
    """Every stored value of an 8-bit type, ordered by its bit pattern (as uint8 0..255)."""
    return np.arange(256, dtype=np.uint8).view(t.dtype)


def _index(op: L.Op, x: Any) -> Any:
    """An 8-bit tensor's bit patterns as int32 indices 0..255."""
    if x.dtype != op.jnp.uint8:
        x = op.lax.bitcast_convert_type(x, op.jnp.uint8)
    return x.astype(op.jnp.int32)


def unary_table(op: L.Op) -> np.ndarray:
    """Output 0 of the operation for each of input 0's 256 values (the other inputs are the
    operation's constants)."""
    grid = _grid(op.info(0).type)
    ins = [_as_input(op.info(0), grid.shape), *(op.info(k) for k in range(1, op.n))]
    outs = [_as_input(op.out_info(), grid.shape)]
    values = [grid, *(op.value(k) for k in range(1, op.n))]
    return np.asarray(reference_outputs(O(op.type), ins, outs, values)[0]).reshape(256)


def _unary_lower(op: L.Op) -> Sequence[Any]:
    table = op.jnp.asarray(unary_table(op))
    return [op.jnp.take(table, _index(op, op.x(0)), axis=0)]


def _binary_table(op: L.Op) -> np.ndarray:
    """Output 0 for every pair of the two 8-bit inputs' values, as a [256 * 256] table indexed
    by ``(a << 8) | b`` of their bit patterns."""
    a, b = _grid(op.info(0).type), _grid(op.info(1).type)
    ins = [_as_input(op.info(0), (256, 1)), _as_input(op.info(1), (1, 256)),
           *(op.info(k) for k in range(2, op.n))]
    outs = [_as_input(op.out_info(), (256, 256))]
    values = [a.reshape(256, 1), b.reshape(1, 256), *(op.value(k) for k in range(2, op.n))]
    return np.asarray(reference_outputs(O(op.type), ins, outs, values)[0]).reshape(65536)


def _binary_lower(op: L.Op) -> Sequence[Any]:
    jnp = op.jnp
    table = jnp.asarray(_binary_table(op))
    idx = jnp.left_shift(_index(op, op.x(0)), 8) | _index(op, op.x(1))
    return [jnp.take(table, idx, axis=0)]


def _binary_supports(op: L.Op) -> str | None:
    if op.info(1).type not in Q8:
        return f"second input of type {op.info(1).type.name}"
    return None


# ---- requantisation ---------------------------------------------------------------------------

def _int64(op: L.Op) -> Any:
    int64 = op.jnp.int64
    if op.jnp.zeros((), int64).dtype != np.int64:
        raise RuntimeError("quantized lowering traced without JAX's 64-bit types")
    return int64


def requantize(op: L.Op, acc: Any, bias: Any, rq: Any, act: int) -> Any:
    """int32 ``acc`` plus the int32 ``bias`` (over the last axis) through the reference
    requantisation ``rq`` (a :class:`nnhal.ops.conv.ConvRequant`), the fused activation's clamp
    and the output type."""
    jnp = op.jnp
    total = acc.astype(_int64(op)) + bias.astype(jnp.int64)
    r = C.requantize_int32_sum(total, rq.multiplier, rq.shift, jnp)
    out = rq.out
    lo, hi = C.quant_activation_range(act, out.scale, out.zero_point, out.type)
    return jnp.clip(r + out.zero_point, lo, hi).astype(out.type.dtype)


def _centred(op: L.Op, k: int) -> Any:
    """Input k's stored values minus its zero point, as int32 (a per-channel filter's is 0)."""
    info = op.info(k)
    x = op.x(k).astype(op.jnp.int32)
    zp = 0 if info.type == PER_CHANNEL else info.zero_point
    return x - zp if zp else x


def _bound(op: L.Op, k: int) -> int:
    """The largest magnitude of input k's centred values (from its value when constant)."""
    info = op.info(k)
    zp = 0 if info.type == PER_CHANNEL else info.zero_point
    if info.is_const:
        v = np.asarray(info.value, dtype=np.int64)
        return int(np.abs(v - zp).max(initial=0))
    lo, hi = C.qrange(info.type)
    return max(zp - lo, hi - zp)


#: Per operation: (the filter's dimensions one output sums over, a per-channel filter's
#: channel dimension).
_TERMS: dict[OperationType, tuple[tuple[int, ...], int | None]] = {
    O.CONV_2D: ((1, 2, 3), 0), O.DEPTHWISE_CONV_2D: ((1, 2), 3),
    O.GROUPED_CONV_2D: ((1, 2, 3), 0), O.TRANSPOSE_CONV_2D: ((1, 2, 3), 0),
    O.FULLY_CONNECTED: ((1,), None)}


def weights_supports(op: L.Op) -> str | None:
    """The quantization rules of a convolution or dense layer: filter and bias types, and an
    int32 accumulator that cannot overflow (the reference sums exactly)."""
    filt = op.info(1)
    if filt.type not in (op.info(0).type, PER_CHANNEL):
        return f"filter of type {filt.type.name}"
    if op.info(2).type != T.TENSOR_INT32:
        return f"bias of type {op.info(2).type.name}"
    dims, channel_dim = _TERMS[O(op.type)]
    if filt.type == PER_CHANNEL and filt.channel_dim != channel_dim:
        return f"per-channel filter along dimension {filt.channel_dim}"
    terms = int(np.prod([filt.shape[d] for d in dims]))  # type: ignore[index]
    if terms * _bound(op, 0) * _bound(op, 1) > _INT32_MAX:
        return "an int32 accumulator could overflow"
    return None


def _requant(op: L.Op) -> Any:
    return conv_ops.ConvRequant(op.info(0), op.info(1), op.out_info())


# ---- convolutions and dense layers ---------------------------------------------------------

def conv_terms(op: L.Op) -> tuple[Any, Any, Callable[[Any, int], Any], Any]:
    """A quantized convolution's or dense layer's terms for the float lowerings' shared code
    (see :func:`nnhal.drivers.xla.lowering._terms`)."""
    rq = _requant(op)
    return (_centred(op, 0), _centred(op, 1),
            lambda acc, act: requantize(op, acc, op.x(2), rq, act), op.jnp.int32)


# ---- pooling -------------------------------------------------------------------------------

def _pool_lower(op: L.Op) -> Sequence[Any]:
    """MAX_POOL_2D: the largest stored value (padding never wins); AVERAGE_POOL_2D: the sum of
    the stored values over each window's real positions, divided by their count rounding half
    away from zero; then the fused activation's clamp (the reference's integer arithmetic)."""
    jnp, lax = op.jnp, op.lax
    p = L._pool_params(op)
    out = op.out_info()
    x = L._to_nhwc(op, op.x(0), p.nchw)
    _, h, w, _ = x.shape
    dims, strides = (1, p.filter_h, p.filter_w, 1), (1, p.stride_h, p.stride_w, 1)
    pads = ((0, 0), (p.pad_top, p.pad_bottom), (p.pad_left, p.pad_right), (0, 0))
    lo, hi = C.quant_activation_range(p.activation, out.scale, out.zero_point, out.type)
    if op.type == O.MAX_POOL_2D:
        qmin = C.qrange(op.info(0).type)[0]
        y = lax.reduce_window(x.astype(jnp.int32), np.int32(qmin), lax.max, dims, strides,
                              pads)
    else:
        s = lax.reduce_window(x.astype(jnp.int32), np.int32(0), lax.add, dims, strides, pads)
        rows = L.pool_rules._window_counts(h, s.shape[1], p.stride_h, p.pad_top, p.filter_h)
        cols = L.pool_rules._window_counts(w, s.shape[2], p.stride_w, p.pad_left, p.filter_w)
        cnt = np.maximum(np.outer(rows, cols), 1).astype(np.int32)[None, :, :, None]
        y = jnp.sign(s) * ((jnp.abs(s) + cnt // 2) // cnt)
    y = jnp.clip(y, lo, hi).astype(out.type.dtype)
    return [L._from_nhwc(op, y, p.nchw)]


def _pool_supports(op: L.Op) -> str | None:
    why = L._pool_supports(op)
    if why is None and op.type == O.AVERAGE_POOL_2D:
        p = L._pool_params(op)
        if p.filter_h * p.filter_w * 256 > _INT32_MAX:
            return "a window whose int32 sum could overflow"
    return why


# ---- conversions and requantising data movement -----------------------------------------

def _quantize_lower(op: L.Op) -> Sequence[Any]:
    """QUANTIZE: the reference's float32 formula (divide by the scale, round half away from
    zero, add the zero point, NaN to 0, saturate)."""
    jnp = op.jnp
    out = op.out_info()
    qmin, qmax = C.qrange(out.type)
    v = op.x(0).astype(jnp.float32) / np.float32(out.scale)
    q = np.float32(out.zero_point) + jnp.sign(v) * jnp.floor(jnp.abs(v) + np.float32(0.5))
    return [jnp.clip(jnp.nan_to_num(q), qmin, qmax).astype(out.type.dtype)]


def _concat_lower(op: L.Op) -> Sequence[Any]:
    """Each input whose scale or zero point differs from the output's goes through its
    requantisation table: the reference CONCATENATION of that input alone over its 256
    values."""
    jnp = op.jnp
    out = op.out_info()
    axis_info = op.info(op.n - 1)
    parts = []
    for k in range(op.n - 1):
        info, x = op.info(k), op.x(k)
        if np.float32(info.scale) != np.float32(out.scale) or \
                info.zero_point != out.zero_point:
            grid = _grid(info.type)
            table = reference_outputs(
                O.CONCATENATION, [_as_input(info, grid.shape), axis_info],
                [_as_input(out, grid.shape)], [grid, np.int32(0)])[0]
            x = jnp.take(jnp.asarray(np.asarray(table).reshape(256)), _index(op, x), axis=0)
        parts.append(x)
    return [jnp.concatenate(parts, axis=int(op.scalar(op.n - 1)))]


def _mean_lower(op: L.Op) -> Sequence[Any]:
    """The reference's quantized MEAN: the stored values summed in int32, divided by the
    count truncating toward zero, saturated."""
    jnp = op.jnp
    x = op.x(0)
    axes = L._axes(op, x.ndim)
    count = int(np.prod([x.shape[a] for a in axes]))
    total = jnp.sum(x.astype(jnp.int32), axis=axes, dtype=jnp.int32)
    lo, hi = C.qrange(op.info(0).type)
    q = jnp.abs(total) // count * jnp.sign(total)
    return [jnp.clip(q, lo, hi).astype(x.dtype).reshape(op.out_shape())]


def _mean_supports(op: L.Op) -> str | None:
    shape = op.info(0).shape
    axes = L._axes(op, len(shape))  # type: ignore[arg-type]
    if int(np.prod([shape[a] for a in axes])) * 256 > _INT32_MAX:  # type: ignore[index]
        return "a sum that could overflow int32"
    return None


def _softmax_lower(op: L.Op) -> Sequence[Any]:
    """The reference's fixed-point softmax, the very function, traced with ``jax.numpy``."""
    jnp = op.jnp
    x = op.x(0)
    axis = int(op.scalar(2, -1)) % x.ndim
    info = op.info(0)
    r = softmax_ops.quant_softmax_last_axis(jnp.moveaxis(x, axis, -1), float(op.scalar(1)),
                                            info.scale, info.type, jnp)
    return [jnp.moveaxis(r, -1, axis)]


def _softmax_supports(op: L.Op) -> str | None:
    why = L._softmax_supports(op)
    if why is None:
        real = float(op.scalar(1)) * op.info(0).scale * (1 << 26)
        if not real > 1.0:
            return "an input multiplier not above one (the reference fails the execution)"
    return why


def _l2_norm_lower(op: L.Op) -> Sequence[Any]:
    """The reference's integer L2 normalization, the very function, traced."""
    x = op.x(0)
    axis = int(op.scalar(1, -1)) % x.ndim
    return [normalization.quant_l2_normalize(x, op.info(0), axis, op.jnp)]


def _select_lower(op: L.Op) -> Sequence[Any]:
    """Each value input through the reference's requantisation table into the output's
    parameters, then the choice."""
    jnp = op.jnp
    out = op.out_info()
    picked = []
    for k in (1, 2):
        info = op.info(k)
        table = jnp.asarray(elementwise.requantize_table(info, out))
        idx = op.x(k).astype(jnp.int32) - C.qrange(info.type)[0]
        picked.append(jnp.take(table, idx, axis=0))
    return [jnp.where(op.x(0), picked[0], picked[1])]


def _select_supports(op: L.Op) -> str | None:
    t = op.info(1).type
    if t not in Q8 or op.info(2).type != t:
        return f"values of types {t.name} and {op.info(2).type.name}"
    return None


# ---- registration: each operation type keeps its float lowering for other types -----------

#: Shape and data movement: stored values moved unchanged (the HAL keeps the quantization;
#: PAD and SPACE_TO_BATCH_ND fill with the zero point, PAD_V2 with its stored value).
_MOVES = (O.RESHAPE, O.SQUEEZE, O.EXPAND_DIMS, O.TRANSPOSE, O.SLICE, O.STRIDED_SLICE,
          O.GATHER, O.TILE, O.SPLIT, O.DEPTH_TO_SPACE, O.SPACE_TO_DEPTH, O.BATCH_TO_SPACE_ND,
          O.SPACE_TO_BATCH_ND, O.CHANNEL_SHUFFLE, O.REVERSE, O.PACK, O.MIRROR_PAD, O.PAD,
          O.PAD_V2)
_TABLE_UNARY = (O.RELU, O.RELU1, O.RELU6, O.LOGISTIC, O.TANH, O.HARD_SWISH, O.DEQUANTIZE)
_TABLE_BINARY = (O.ADD, O.SUB, O.MUL, O.MAXIMUM, O.MINIMUM, O.PRELU, O.EQUAL, O.NOT_EQUAL,
                 O.GREATER, O.GREATER_EQUAL, O.LESS, O.LESS_EQUAL)
#: Operations on the stored values whose float lowering computes the reference's result for
#: 8-bit integers as well (the HAL keeps the input's quantization, or the result is an index).
_SAME_LOWERING = (O.ARGMAX, O.ARGMIN, O.REDUCE_MAX, O.REDUCE_MIN, O.RESIZE_NEAREST_NEIGHBOR,
                  O.RESIZE_BILINEAR)


def _with_quantized(op_type: OperationType, lower: Callable[[L.Op], Sequence[Any]],
                    types: frozenset[OperandType] = Q8,
                    consts: Callable[[L.Op], Sequence[int]] | None = None,
                    supports: Callable[[L.Op], str | None] = lambda op: None) -> None:
    """Add a quantized form to ``op_type``'s lowering: input-0 types in ``types`` use
    ``lower``, ``consts`` (default: the float form's) and ``supports``; others the float
    form."""
    base = L.LOWERINGS.get(op_type)
    first = base.first if base is not None else 0

    def quant(op: L.Op) -> bool:
        return op.info(first).type in types

    def pick_consts(op: L.Op) -> Sequence[int]:
        if quant(op) and consts is not None:
            return consts(op)
        return base.consts(op) if base is not None else range(1, op.n)

    def pick_supports(op: L.Op) -> str | None:
        if quant(op):
            return supports(op)
        return base.supports(op) if base is not None else None

    def pick_lower(op: L.Op) -> Sequence[Any]:
        return lower(op) if quant(op) else base.lower(op)  # type: ignore[union-attr]

    L.LOWERINGS[op_type] = L.Lowering(pick_lower, (base.types if base else frozenset()) | types,
                                      pick_consts, pick_supports, first)


def register() -> None:
    """Add every quantized lowering to :data:`nnhal.drivers.xla.lowering.LOWERINGS` (and
    the convolutions' terms to its ``QUANTIZED_TERMS``); the package runs it once, on import."""
    L.QUANTIZED_TERMS.update(conv_terms=conv_terms, weights_supports=weights_supports)
    for t in (*_MOVES, *_SAME_LOWERING):
        base = L.LOWERINGS[t]
        L.LOWERINGS[t] = dataclasses.replace(base, types=base.types | Q8)
    _with_quantized(O.CONCATENATION, _concat_lower, supports=L._concat_types)
    for t in _TABLE_UNARY:
        _with_quantized(t, _unary_lower, Q8_ANY if t == O.DEQUANTIZE else Q8,
                        lambda op: range(1, op.n))
    for t in _TABLE_BINARY:
        _with_quantized(t, _binary_lower, consts=lambda op: range(2, op.n),
                        supports=_binary_supports)
    for t in _TERMS:  # the float lowerings, through lowering._terms and _types_agree
        base = L.LOWERINGS[t]
        L.LOWERINGS[t] = dataclasses.replace(base, types=base.types | Q8)
    for t in (O.AVERAGE_POOL_2D, O.MAX_POOL_2D):
        _with_quantized(t, _pool_lower, supports=_pool_supports)
    _with_quantized(O.QUANTIZE, _quantize_lower, L.FLOATS)
    _with_quantized(O.MEAN, _mean_lower, supports=_mean_supports)
    _with_quantized(O.SOFTMAX, _softmax_lower, supports=_softmax_supports)
    _with_quantized(O.L2_NORMALIZATION, _l2_norm_lower)
    base = L.LOWERINGS[O.SELECT]

    def select(op: L.Op) -> Sequence[Any]:
        return (_select_lower if op.info(1).type in Q8 else base.lower)(op)

    def select_supports(op: L.Op) -> str | None:
        return (_select_supports if op.info(1).type in Q8 else base.supports)(op)

    L.LOWERINGS[O.SELECT] = dataclasses.replace(base, lower=select, supports=select_supports)
