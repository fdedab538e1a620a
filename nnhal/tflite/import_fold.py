"""Constant folding at import: what converters leave for the runtime (float16 weights behind
DEQUANTIZE, sparse weights behind DENSIFY, SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE chains)
becomes constants, so the HAL model holds plain weights and static shapes.

Only operators whose numpy evaluation is exact are folded: data movement, integer
arithmetic, casts, and dequantization (float32 products, as TFLite's kernel computes them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided
from tflite.Padding import Padding
from tflite.TensorType import TensorType as TT

from nnhal.ops.common import broadcast_static
from nnhal.tflite import schema
from nnhal.tflite.import_read import OpInfo, SubgraphInfo, TfliteTensor
from nnhal.tflite.kernel_rules import RuleOp, RuleTensor, kernel_refusal, rule_tensor


class _NoFold(Exception):
    pass


#: The most elements a folded constant may have (a corrupted FILL / TILE / RANGE must not
#: allocate without bound; real folds are shapes and weights).
MAX_FOLD_ELEMENTS = 1 << 24


def _bounded(count: float) -> None:
    if not 0 <= count <= MAX_FOLD_ELEMENTS:
        raise _NoFold


def _bounded_dims(dims: np.ndarray | Sequence[int], times: int = 1) -> None:
    """_bounded for the element count of ``dims`` (a file's values) times ``times``, exact
    and stopping once past the bound: a float product of 40 dimensions of 2^31-1 overflows
    (numpy's RuntimeWarning on the user's console), an int64 one wraps."""
    dims = [int(d) for d in np.asarray(dims).reshape(-1)]
    if any(d < 0 for d in dims):
        raise _NoFold
    if times == 0 or 0 in dims:
        return
    n = times
    for d in dims:
        n *= d
        if n > MAX_FOLD_ELEMENTS:
            raise _NoFold


def _vals(sg: SubgraphInfo, op: OpInfo) -> list[np.ndarray | None]:
    return [None if i < 0 else sg.tensors[i].value for i in op.inputs]


def _same_quant(a: TfliteTensor, b: TfliteTensor) -> bool:
    if a.quantized != b.quantized:
        return False
    if not a.quantized:
        return True
    return (np.array_equal(a.scales, b.scales) and np.array_equal(a.zero_points, b.zero_points))


def _moves(sg: SubgraphInfo, op: OpInfo) -> None:
    """Data movement keeps values as they are only when quantization does not change."""
    src = [sg.tensors[i] for i in op.inputs[:1] if i >= 0]
    for o in op.outputs:
        if src and not _same_quant(src[0], sg.tensors[o]):
            raise _NoFold


def _arith_ok(sg: SubgraphInfo, op: OpInfo) -> None:
    for i in list(op.inputs) + list(op.outputs):
        if i >= 0 and sg.tensors[i].quantized and sg.tensors[i].ttype != TT.INT32:
            raise _NoFold
    if op.options is not None and hasattr(op.options, "FusedActivationFunction"):
        if op.options.FusedActivationFunction() != 0:
            raise _NoFold


def strided_slice_index(shape: tuple[int, ...], begin: np.ndarray, end: np.ndarray,
                        strides: np.ndarray, begin_mask: int, end_mask: int,
                        shrink_mask: int, offset: bool = False) -> tuple[tuple, list[int]]:
    """(numpy index, axes removed) of TFLite's STRIDED_SLICE without ellipsis / new axes."""
    index: list[object] = []
    shrunk = []
    for d in range(len(shape)):
        if d >= len(begin):
            index.append(slice(None))
            continue
        b, e, s = int(begin[d]), int(end[d]), int(strides[d])
        if s == 0:
            raise ValueError("stride 0")
        if offset:
            e = b + e
        if shrink_mask >> d & 1:
            k = b + shape[d] if b < 0 else b
            if not 0 <= k < shape[d]:
                raise ValueError("shrunk index out of range")
            index.append(slice(k, k + 1))
            shrunk.append(d)
            continue
        index.append(slice(None if begin_mask >> d & 1 else b,
                           None if end_mask >> d & 1 else e, s))
    return tuple(index), shrunk


def _strided_slice(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    x, b, e, s = v[:4]
    o = op.options
    if o is None or o.EllipsisMask() or o.NewAxisMask():
        raise _NoFold
    offset = bool(o.Offset()) if hasattr(o, "Offset") else False
    idx, shrunk = strided_slice_index(x.shape, b, e, s, o.BeginMask(), o.EndMask(),
                                      o.ShrinkAxisMask(), offset)
    r = x[idx]
    return r.reshape([n for d, n in enumerate(r.shape) if d not in shrunk])


def _dequantize(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    t = sg.tensors[op.inputs[0]]
    x = v[0]
    if x.dtype == np.float16:
        return x.astype(np.float32)
    if not t.quantized:
        raise _NoFold
    scales, zps = t.scales.astype(np.float32), t.zero_points
    if scales.size > 1:
        shape = [1] * x.ndim
        shape[t.qdim] = scales.size
        scales, zps = scales.reshape(shape), zps.reshape(shape)
    return ((x.astype(np.int32) - zps.astype(np.int32)).astype(np.float32) * scales[()]
            ).astype(np.float32)


def _reshape_to(sg: SubgraphInfo, op: OpInfo, x: np.ndarray, shape: list[int]) -> np.ndarray:
    return x.reshape(shape)


def _reshape(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    """TFLite's target: the shape input when it is a 1-D int32 tensor, else the options'
    new_shape ([0], or none, is the scalar []); the declared output shape is only a hint its
    Prepare overwrites, so one that disagrees is refused, not folded to (unless its
    shape_signature marks it a placeholder, which the folded value replaces)."""
    out = sg.tensors[op.outputs[0]]
    target: list[int] | None = None
    if len(op.inputs) > 1 and op.inputs[1] >= 0:
        st = sg.tensors[op.inputs[1]]
        if st.ttype == TT.INT32 and st.has_rank and len(st.shape) == 1 and v[1] is not None:
            target = [int(d) for d in np.asarray(v[1]).reshape(-1)]
    if target is None:
        opts = [int(d) for d in op.options.NewShapeAsNumpy()] if op.options is not None and \
            op.options.NewShapeLength() else []
        target = [] if opts == [0] else opts
    result = v[0].reshape(target)  # ValueError (not folded) where the counts differ
    placeholder = out.signature is not None and -1 in out.signature  # a converter's guess
    if out.has_rank and (out.static or out.zero_sized) and not placeholder and \
            list(result.shape) != list(out.shape):
        raise FoldRefusal(f"new shape {list(result.shape)} is not the output's declared "
                          f"{list(out.shape)}")
    return result


def _concat(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    return np.concatenate(v, axis=op.options.Axis())


def _pack(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    return np.stack(v, axis=op.options.Axis())


def _gather(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    axis = op.options.Axis() if op.options is not None else 0
    if op.options is not None and op.options.BatchDims():
        raise _NoFold
    return np.take(v[0], v[1].astype(np.int64), axis=axis)


def _slice(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    x, b, s = v
    idx = tuple(slice(int(bb), None if int(ss) == -1 else int(bb) + int(ss))
                for bb, ss in zip(b, s))
    return x[idx]


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    def fold(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
        _arith_ok(sg, op)
        a, b = v
        _bounded(float(np.prod(broadcast_static(a.shape, b.shape), dtype=np.float64)))
        if a.dtype.kind == "f" and fn is np.floor_divide:
            raise _NoFold
        return fn(a, b)
    return fold


def _reduce(fn: Callable) -> Callable:
    def fold(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
        _arith_ok(sg, op)
        if v[0].dtype.kind == "f":
            raise _NoFold  # float sums depend on the order of accumulation
        axes = tuple(int(a) % max(v[0].ndim, 1) for a in np.asarray(v[1]).reshape(-1))
        keep = bool(op.options.KeepDims()) if op.options is not None else False
        return fn(v[0], axis=axes, keepdims=keep)
    return fold


def _cast(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    src, dst = sg.tensors[op.inputs[0]], sg.tensors[op.outputs[0]]
    if src.quantized and src.ttype != TT.INT32 or dst.quantized and dst.ttype != TT.INT32:
        raise _NoFold
    dtype = schema.DTYPES.get(dst.ttype)
    if dtype is None:
        raise _NoFold
    return v[0].astype(dtype)


def _transpose(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    return np.transpose(v[0], [int(p) for p in v[1]])


def _squeeze(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    dims = list(op.options.SqueezeDimsAsNumpy()) if (op.options is not None and
                                                     op.options.SqueezeDimsLength()) else None
    return np.squeeze(v[0], axis=tuple(int(d) for d in dims) if dims else None)


def _expand_dims(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    return np.expand_dims(v[0], int(np.asarray(v[1]).reshape(-1)[0]))


def _fill(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    _bounded_dims(v[0])
    return np.full([int(d) for d in v[0]], v[1].reshape(()))


def _range(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    start, limit, delta = (float(a.reshape(())) for a in v[:3])
    _bounded((limit - start) / delta if delta else -1)
    return np.arange(v[0].reshape(()), v[1].reshape(()), v[2].reshape(()))


def _tile(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    _bounded_dims(v[1], v[0].size)
    return np.tile(v[0], [int(m) for m in v[1]])


def _unpack(sg: SubgraphInfo, op: OpInfo, v: list) -> list[np.ndarray]:
    axis = op.options.Axis()
    return [np.take(v[0], k, axis=axis) for k in range(v[0].shape[axis])]


# ---- shape arithmetic (issue 27): splits, integer division, comparisons ---------------------

class FoldRefusal(Exception):
    """A constant operator TFLite's kernel fails on (a division by zero): the operator is
    refused with this reason rather than folded or left to a HAL operation that answers."""


def _split(sg: SubgraphInfo, op: OpInfo, v: list) -> list[np.ndarray]:
    axis, x = v
    n = op.options.NumSplits() if op.options is not None else len(op.outputs)
    if n != len(op.outputs):
        raise _NoFold
    return np.split(x, n, axis=int(np.asarray(axis).reshape(-1)[0]))


def _split_v(sg: SubgraphInfo, op: OpInfo, v: list) -> list[np.ndarray]:
    x, sizes, axis = v
    a = int(np.asarray(axis).reshape(-1)[0])
    a = a + x.ndim if a < 0 else a
    sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
    if sizes.count(-1) == 1:
        sizes[sizes.index(-1)] = x.shape[a] - (sum(sizes) + 1)
    if any(s < 0 for s in sizes) or sum(sizes) != x.shape[a]:
        raise _NoFold
    return np.split(x, np.cumsum(sizes)[:-1], axis=a)


def _divisor(b: np.ndarray, what: str) -> None:
    if np.any(b == 0):
        raise FoldRefusal(f"{what} of constants divides by zero (TFLite's kernel fails with "
                          f"'Division by 0')")


def _floor_div(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    """TFLite's FLOOR_DIV: floor of the quotient computed in double, for every type."""
    _arith_ok(sg, op)
    a, b = v
    _bounded(float(np.prod(broadcast_static(a.shape, b.shape), dtype=np.float64)))
    _divisor(b, "FLOOR_DIV")
    with np.errstate(all="ignore"):
        q = np.floor(a.astype(np.float64) / b.astype(np.float64))
    if a.dtype.kind in "iu" and np.any((q < np.iinfo(a.dtype).min) |
                                       (q > np.iinfo(a.dtype).max)):
        raise FoldRefusal(f"FLOOR_DIV of constants overflows {a.dtype} (TFLite's result is "
                          f"undefined)")
    return q.astype(a.dtype)


def _floor_mod(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    """TFLite's FLOOR_MOD: the truncated remainder moved to the divisor's sign."""
    _arith_ok(sg, op)
    a, b = v
    _bounded(float(np.prod(broadcast_static(a.shape, b.shape), dtype=np.float64)))
    if a.dtype.kind in "iu":
        _divisor(b, "FLOOR_MOD")
    with np.errstate(all="ignore"):
        t = np.fmod(a, b)
        return np.where((t != 0) & ((b < 0) != (t < 0)), t + b, t).astype(a.dtype)


def _div(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    """TFLite's DIV: IEEE division for floats, truncation towards zero for integers."""
    _arith_ok(sg, op)
    a, b = v
    _bounded(float(np.prod(broadcast_static(a.shape, b.shape), dtype=np.float64)))
    if a.dtype.kind == "f":
        with np.errstate(all="ignore"):
            return np.divide(a, b).astype(a.dtype)
    _divisor(b, "DIV")
    q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
    q = np.where((a < 0) != (b < 0), -q, q)
    if np.any((q < np.iinfo(a.dtype).min) | (q > np.iinfo(a.dtype).max)):
        raise FoldRefusal(f"DIV of constants overflows {a.dtype} (TFLite's result is undefined)")
    return q.astype(a.dtype)


def _compare(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    def fold(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
        _arith_ok(sg, op)
        a, b = v
        _bounded(float(np.prod(broadcast_static(a.shape, b.shape), dtype=np.float64)))
        return fn(a, b)
    return fold


def _unary(fn: Callable[[np.ndarray], np.ndarray], ints_only: bool = False) -> Callable:
    def fold(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
        _arith_ok(sg, op)
        if ints_only and v[0].dtype.kind == "f":
            raise _NoFold
        return fn(v[0])
    return fold


def _select(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    c, x, y = v
    if not _same_quant(sg.tensors[op.inputs[1]], sg.tensors[op.outputs[0]]) or \
            not _same_quant(sg.tensors[op.inputs[2]], sg.tensors[op.outputs[0]]):
        raise _NoFold
    if op.name == "SELECT" and c.ndim == 1 and x.ndim > 1 and c.shape[0] == x.shape[0]:
        c = c.reshape((-1,) + (1,) * (x.ndim - 1))  # SELECT's rank-one condition picks rows
    _bounded(float(np.prod(broadcast_static(c.shape, x.shape, y.shape), dtype=np.float64)))
    return np.where(c.astype(bool), x, y)


def _broadcast_to(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    shape = [int(d) for d in np.asarray(v[1]).reshape(-1)]
    _bounded_dims(shape)
    return np.broadcast_to(v[0], shape).copy()


def _broadcast_args(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    a, b = (tuple(int(d) for d in np.asarray(x).reshape(-1)) for x in v)
    return np.asarray(broadcast_static(a, b), v[0].dtype)


def _zeros_like(sg: SubgraphInfo, op: OpInfo, v: list) -> np.ndarray:
    return np.zeros_like(v[0])


#: The folds issue 27 added for shape computations (SHAPE -> SPLIT_V -> ... -> FLOOR_DIV):
#: name -> (fold, moves data only).
REACH_FOLDERS: dict[str, tuple[Callable, bool]] = {
    "SPLIT": (_split, False),
    "SPLIT_V": (_split_v, True),
    "FLOOR_DIV": (_floor_div, False),
    "FLOOR_MOD": (_floor_mod, False),
    "DIV": (_div, False),
    "EQUAL": (_compare(np.equal), False),
    "NOT_EQUAL": (_compare(np.not_equal), False),
    "LESS": (_compare(np.less), False),
    "LESS_EQUAL": (_compare(np.less_equal), False),
    "GREATER": (_compare(np.greater), False),
    "GREATER_EQUAL": (_compare(np.greater_equal), False),
    "LOGICAL_AND": (_compare(np.logical_and), False),
    "LOGICAL_OR": (_compare(np.logical_or), False),
    "LOGICAL_NOT": (_unary(np.logical_not), False),
    "NEG": (_unary(np.negative, ints_only=True), False),
    "ABS": (_unary(np.abs, ints_only=True), False),
    "SQUARE": (_unary(np.square, ints_only=True), False),
    "SELECT": (_select, False),
    "SELECT_V2": (_select, False),
    "BROADCAST_TO": (_broadcast_to, True),
    "BROADCAST_ARGS": (_broadcast_args, False),
    "ZEROS_LIKE": (_zeros_like, False),
    "REDUCE_ANY": (_reduce(np.any), False),
    "REDUCE_ALL": (_reduce(np.all), False),
}


#: Operators folded when all their inputs are constants: name -> (fold, moves data only).
FOLDERS: dict[str, tuple[Callable, bool]] = {
    "DEQUANTIZE": (_dequantize, False),
    "STRIDED_SLICE": (_strided_slice, True),
    "SLICE": (_slice, True),
    "RESHAPE": (_reshape, True),
    "SQUEEZE": (_squeeze, True),
    "EXPAND_DIMS": (_expand_dims, True),
    "TRANSPOSE": (_transpose, True),
    "CONCATENATION": (_concat, True),
    "PACK": (_pack, True),
    "UNPACK": (_unpack, True),
    "GATHER": (_gather, True),
    "TILE": (_tile, True),
    "CAST": (_cast, False),
    "ADD": (_binary(np.add), False),
    "SUB": (_binary(np.subtract), False),
    "MUL": (_binary(np.multiply), False),
    "MAXIMUM": (_binary(np.maximum), False),
    "MINIMUM": (_binary(np.minimum), False),
    "REDUCE_PROD": (_reduce(np.prod), False),
    "SUM": (_reduce(np.sum), False),
    "REDUCE_MAX": (_reduce(np.max), False),
    "REDUCE_MIN": (_reduce(np.min), False),
    "FILL": (_fill, False),
    "RANGE": (_range, False),
}

FOLDERS.update(REACH_FOLDERS)

#: What folding understood, for the support table.
FOLDED_NOTE = "folded to a constant when its inputs are constants"


def _set(t: TfliteTensor, value: np.ndarray) -> None:
    dtype = schema.DTYPES.get(t.ttype)
    if dtype is None:
        raise _NoFold
    # Kept as a view of its bytes (read-only, like the file's constants): a constant made of
    # it is then placed as it is, not copied again (a folded index can be megabytes).
    value = np.asarray(value).astype(dtype, copy=False)
    t.value = np.frombuffer(value.tobytes(), dtype).reshape(value.shape)
    t.shape = tuple(t.value.shape)


def rule_op(tensors: list[TfliteTensor], op: OpInfo, *, version_checked: bool = False
            ) -> RuleOp:
    """The operator as :mod:`nnhal.tflite.kernel_rules` reads it (``version_checked``: the
    caller has applied :func:`~nnhal.tflite.op_versions.version_refusal` already, so the
    rules do not again)."""
    options = op.options

    def option(name: str, default: Any) -> Any:
        get = getattr(options, name, None)
        return default if get is None else get()

    return RuleOp(op.name, [None if i < 0 else _rule_view(tensors[i]) for i in op.inputs],
                  [None if i < 0 else _rule_view(tensors[i]) for i in op.outputs],
                  option, None if op.custom or version_checked else op.version)


def _rule_view(t: TfliteTensor) -> RuleTensor:
    """A tensor as the rules read it: made once per tensor (each is read by its writer and
    its readers) and again only when folding gave it another shape."""
    memo = t.rule_memo
    if memo is not None and memo[0] is t.scales and memo[1] is t.zero_points and \
            memo[2] == t.ttype and memo[3] == t.shape and memo[4] == t.has_rank:
        return memo[5]
    view = rule_tensor(t.ttype, t.scales, t.zero_points, t.describe(),
                       t.shape if t.has_rank else None)
    t.rule_memo = (t.scales, t.zero_points, t.ttype, t.shape, t.has_rank, view)
    return view


def _refused(sg: SubgraphInfo, op: OpInfo) -> None:
    """What TFLite's Prepare refuses is not folded (nor converted): FoldRefusal."""
    why = kernel_refusal(rule_op(sg.tensors, op))
    if why is not None:
        raise FoldRefusal(why)


def fold(sg: SubgraphInfo, skip: set[int]) -> set[int]:
    """Fold what can be folded, in operator order; the indexes of the folded operators.
    Operators in ``skip`` (resource variables) are left alone."""
    folded: set[int] = set()
    for op in sg.ops:
        if op.index in skip or op.custom or not op.outputs:
            continue
        outs = [sg.tensors[o] for o in op.outputs if o >= 0]
        try:
            if op.name == "DENSIFY":
                src = sg.tensors[op.inputs[0]]
                if src.sparse_value is None:
                    continue
                _set(outs[0], src.sparse_value)
            elif op.name == "ZEROS_LIKE" and sg.tensors[op.inputs[0]].static and \
                    schema.DTYPES.get(sg.tensors[op.inputs[0]].ttype) is not None and \
                    not sg.tensors[op.inputs[0]].quantized:
                # Only the shape matters: zeros of a static shape, whatever the values.
                src = sg.tensors[op.inputs[0]]
                _bounded(float(np.prod(src.shape, dtype=np.float64)))
                _set(outs[0], np.zeros(src.shape, schema.DTYPES[src.ttype]))
            elif op.name in ("SHAPE", "RANK"):
                src = sg.tensors[op.inputs[0]]
                if not src.static:
                    continue
                _refused(sg, op)
                _set(outs[0], np.asarray(src.shape if op.name == "SHAPE" else len(src.shape)))
            elif op.name in FOLDERS:
                values = _vals(sg, op)
                if not values or any(v is None for v, i in zip(values, op.inputs) if i >= 0):
                    _infer_shapes(sg, op)
                    continue
                _refused(sg, op)
                fn, moves = FOLDERS[op.name]
                if moves:
                    _moves(sg, op)
                result = fn(sg, op, values)
                results = result if isinstance(result, list) else [result]
                if len(results) != len(outs):
                    continue
                for t, r in zip(outs, results):
                    _set(t, r)
            else:
                _infer_shapes(sg, op)
                continue
        except FoldRefusal as e:
            sg.extra.setdefault("fold_refused", {})[op.index] = str(e)
            for t in outs:
                t.value = None
            continue
        except (_NoFold, ValueError, IndexError, TypeError, AttributeError):
            for t in outs:
                if op.name not in ("DENSIFY",):
                    t.value = None
            _infer_shapes(sg, op)
            continue
        folded.add(op.index)
    return folded


# ---- shapes TFLite's Prepare computes ------------------------------------------------------

#: Operators whose output has their (broadcast) inputs' shape.
_ELEMENTWISE = {
    "ADD", "SUB", "MUL", "DIV", "FLOOR_DIV", "FLOOR_MOD", "MAXIMUM", "MINIMUM", "POW",
    "SQUARED_DIFFERENCE", "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER",
    "GREATER_EQUAL", "LOGICAL_AND", "LOGICAL_OR", "SELECT_V2", "ABS", "EXP", "LOG", "NEG",
    "SQRT", "RSQRT", "SIN", "COS", "FLOOR", "CEIL", "ROUND", "LOGICAL_NOT", "RELU", "RELU6",
    "RELU_N1_TO_1", "LOGISTIC", "TANH", "HARD_SWISH", "CAST", "QUANTIZE", "DEQUANTIZE",
    "SQUARE", "ELU", "LEAKY_RELU", "GELU", "SIGN", "ZEROS_LIKE",
}


def _infer_shapes(sg: SubgraphInfo, op: OpInfo) -> None:
    """The output shape TFLite's Prepare gives an operator that is not folded, where the file
    marks it as computed (-1 in shape_signature) and the converter's ``shape`` is only a
    placeholder: for element-wise operators, slices and reshapes of static inputs with
    constant parameters, and GATHERs of static inputs and indices, which is what shape
    arithmetic folded upstream feeds (x[:, :n] then a RESHAPE to frames; BirdNET's framing
    GATHER), and what follows such frames (:func:`_infer_more`). An output this cannot
    infer keeps the file's shape, unless an input's shape was inferred unlike the file's:
    its computed dimensions are then unknown (0), for the analysis to infer, not the
    placeholder the converter wrote."""
    tensors = sg.tensors
    outs = [t for o in op.outputs if o >= 0 and (t := tensors[o]).signature is not None and
            -1 in t.signature]
    if not outs:
        return
    ins = [tensors[i] if i >= 0 else None for i in op.inputs]
    changed: set[int] = sg.extra.setdefault("shape_changed", set())
    shape = _inferred(op, ins, sg) if len(op.outputs) == 1 and ins and ins[0] is not None \
        and ins[0].static else None
    if shape is not None and len(shape) == len(outs[0].signature):
        for s, d in zip(outs[0].signature, shape):
            if s != -1 and s != d:
                break
        else:
            if shape != tuple(outs[0].shape):
                outs[0].shape = shape
                changed.add(outs[0].index)
            return
    if changed and any(t is not None and t.index in changed for t in ins):
        # Downstream of a shape the file's placeholder got wrong, the placeholder of every
        # computed dimension is suspect: unknown (0) instead, for the analysis to infer.
        for t in outs:
            unknown = tuple(0 if s == -1 else d for s, d in zip(t.signature, t.shape))
            if len(unknown) == len(t.shape) and unknown != tuple(t.shape):
                t.shape = unknown
                changed.add(t.index)


def _probe(shape: Sequence[int]) -> np.ndarray:
    """An array of ``shape`` whose elements all share one byte: slicing and reshaping it give
    the result's shape without allocating (np.empty of a hostile file's [2^31-1, 2^20] asked
    for 2 PiB, a MemoryError). ValueError past 2^63 bytes or 64 dimensions."""
    return as_strided(np.zeros(1, np.bool_), tuple(shape), (0,) * len(shape), writeable=False)


def _inferred(op: OpInfo, ins: list[Any], sg: SubgraphInfo) -> tuple[int, ...] | None:
    shape: tuple[int, ...] | None = None
    try:
        if op.name in _ELEMENTWISE:
            if all(t is not None and t.static for t in ins):
                shape = broadcast_static(*[t.shape for t in ins])
        elif op.name == "STRIDED_SLICE":
            v = _vals(sg, op)
            if all(x is not None for x in v[1:4]):
                probe = _probe(ins[0].shape)
                shape = _strided_slice(sg, op, [probe] + v[1:4]).shape
        elif op.name == "SLICE":
            v = _vals(sg, op)
            if all(x is not None for x in v[1:3]):
                shape = _slice(sg, op, [_probe(ins[0].shape)] + v[1:3]).shape
        elif op.name == "GATHER" and len(ins) > 1 and ins[1] is not None and ins[1].static:
            # TFLite's Prepare: params' dims before the axis, the indices' dims, the rest.
            if op.options is not None and op.options.BatchDims():
                return
            axis = op.options.Axis() if op.options is not None else 0
            dims = tuple(ins[0].shape)
            axis += len(dims) if axis < 0 else 0
            if 0 <= axis < len(dims):
                shape = dims[:axis] + tuple(ins[1].shape) + dims[axis + 1:]
        elif op.name == "RESHAPE" and len(op.inputs) > 1 and ins[1] is not None and \
                ins[1].value is not None:
            shape = _probe(ins[0].shape).reshape(
                [int(d) for d in ins[1].value.reshape(-1)]).shape
        else:
            shape = _infer_more(op, ins)
    except (_NoFold, ValueError, IndexError, TypeError, AttributeError):
        return None
    return None if shape is None else tuple(map(int, shape))


#: Operators whose output has their first input's shape (besides :data:`_ELEMENTWISE`).
_SAME_SHAPE = {"COMPLEX_ABS", "REAL", "IMAG", "REVERSE_V2", "SOFTMAX", "LOG_SOFTMAX",
               "L2_NORMALIZATION", "CUMSUM"}


def _infer_more(op: OpInfo, ins: list[Any]) -> tuple[int, ...] | None:
    """:func:`_infer_shapes` for what follows a framing (BirdNET's STFT: EXPAND_DIMS, RFFT2D,
    SQUEEZE, the complex parts, then FULLY_CONNECTED and TRANSPOSE of the frames); None
    where the operator or its parameters give nothing certain."""
    dims = tuple(ins[0].shape)

    def const(k: int) -> list[int] | None:
        t = ins[k] if len(ins) > k else None
        return None if t is None or t.value is None else [int(v) for v in
                                                          np.asarray(t.value).reshape(-1)]

    if op.name in _SAME_SHAPE:
        return dims
    if op.name == "EXPAND_DIMS":
        axis = const(1)
        if axis is None or len(axis) != 1 or not -len(dims) - 1 <= axis[0] <= len(dims):
            return None
        k = axis[0] % (len(dims) + 1)
        return (*dims[:k], 1, *dims[k:])
    if op.name == "SQUEEZE":
        axes = list(op.options.SqueezeDimsAsNumpy()) if op.options is not None and \
            op.options.SqueezeDimsLength() else [k for k, d in enumerate(dims) if d == 1]
        if any(not -len(dims) <= a < len(dims) or dims[a] != 1 for a in axes):
            return None
        drop = {a % len(dims) for a in axes}
        return tuple(d for k, d in enumerate(dims) if k not in drop)
    if op.name == "RFFT2D":
        n = const(1)
        if n is None or len(n) != 2 or len(dims) < 2:
            return None
        return (*dims[:-2], n[0], n[1] // 2 + 1)
    if op.name == "TRANSPOSE":
        perm = const(1)
        if perm is None or sorted(perm) != list(range(len(dims))):
            return None
        return tuple(dims[p] for p in perm)
    if op.name == "CONCATENATION" and all(t is not None and t.static for t in ins):
        axis = op.options.Axis() if op.options is not None else 0
        axis += len(dims) if axis < 0 else 0
        if not 0 <= axis < len(dims) or any(len(t.shape) != len(dims) for t in ins):
            return None
        return (*dims[:axis], sum(int(t.shape[axis]) for t in ins), *dims[axis + 1:])
    if op.name in ("PAD", "PADV2", "MIRROR_PAD"):
        pads = const(1)
        if pads is None or len(pads) != 2 * len(dims):
            return None
        return tuple(d + pads[2 * k] + pads[2 * k + 1] for k, d in enumerate(dims))
    if op.name in ("SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND") and len(dims) == 4:
        # (the converter's dilated convolutions: the batch it writes is a placeholder)
        block, pads = const(1), const(2)
        if block is None or pads is None or len(block) != 2 or len(pads) != 4 or \
                min(block) < 1:
            return None
        if op.name == "SPACE_TO_BATCH_ND":
            padded = [dims[1] + pads[0] + pads[1], dims[2] + pads[2] + pads[3]]
            if padded[0] % block[0] or padded[1] % block[1]:
                return None
            return (dims[0] * block[0] * block[1], padded[0] // block[0],
                    padded[1] // block[1], dims[3])
        if dims[0] % (block[0] * block[1]):
            return None
        return (dims[0] // (block[0] * block[1]), dims[1] * block[0] - pads[0] - pads[1],
                dims[2] * block[1] - pads[2] - pads[3], dims[3])
    if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D") and len(dims) == 4 and len(ins) > 1 and \
            ins[1] is not None and ins[1].static and len(ins[1].shape) == 4 and \
            op.options is not None:
        o = op.options
        kh, kw = int(ins[1].shape[1]), int(ins[1].shape[2])
        out_c = int(ins[1].shape[0] if op.name == "CONV_2D" else ins[1].shape[3])
        sizes = []
        for size, k, stride, dilation in ((dims[1], kh, o.StrideH(), o.DilationHFactor()),
                                          (dims[2], kw, o.StrideW(), o.DilationWFactor())):
            if stride < 1 or dilation < 1:
                return None
            span = (k - 1) * dilation + 1
            sizes.append(-(-size // stride) if o.Padding() == Padding.SAME
                         else (size - span) // stride + 1)
        if min(sizes) < 1:
            return None
        return (dims[0], sizes[0], sizes[1], out_c)
    if op.name in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY",
                   "REDUCE_ALL"):
        axes = const(1)
        if axes is None or any(not -len(dims) <= a < len(dims) for a in axes):
            return None
        drop = {a % len(dims) for a in axes}
        keep = op.options is not None and bool(op.options.KeepDims())
        return tuple(1 if k in drop else d for k, d in enumerate(dims)) if keep else \
            tuple(d for k, d in enumerate(dims) if k not in drop)
    if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D",
                   "L2_POOL_2D") and len(dims) == 4 and op.options is not None:
        o = op.options
        if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            f = ins[1] if len(ins) > 1 else None
            if f is None or not f.static or len(f.shape) != 4:
                return None
            kh, kw = int(f.shape[1]), int(f.shape[2])
            channels = int(f.shape[0] if op.name == "CONV_2D" else f.shape[3])
            dh, dw = int(o.DilationHFactor()), int(o.DilationWFactor())
        else:
            kh, kw, channels, dh, dw = int(o.FilterHeight()), int(o.FilterWidth()), dims[3], 1, 1
        sh, sw = int(o.StrideH()), int(o.StrideW())
        if min(kh, kw, sh, sw, dh, dw) <= 0:
            return None

        def side(n: int, k: int, s: int, d: int) -> int:
            # TFLite's padding: SAME (0) ceil(n / s), VALID (1) ceil((n - effective k + 1) / s)
            return (n + s - 1) // s if o.Padding() == 0 else (n - (k - 1) * d - 1) // s + 1

        oh, ow = side(dims[1], kh, sh, dh), side(dims[2], kw, sw, dw)
        return None if oh <= 0 or ow <= 0 else (dims[0], oh, ow, channels)
    if op.name == "FULLY_CONNECTED" and len(ins) > 1 and ins[1] is not None and \
            ins[1].static and len(ins[1].shape) == 2:
        units, depth = ins[1].shape
        total = math.prod(map(int, dims))
        keep = op.options is not None and bool(op.options.KeepNumDims())
        if not dims or depth <= 0 or total % depth or (keep and dims[-1] != depth):
            return None
        return (*dims[:-1], units) if keep else (total // depth, units)
    return None
