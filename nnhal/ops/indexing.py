"""Indexing operations: STRIDED_SLICE, SLICE, GATHER, EMBEDDING_LOOKUP, HASHTABLE_LOOKUP,
TOPK_V2.

Index tensors come from runtime values, so every bound is checked in the kernel (raising
OpError) and, when the parameters are constant, already in ``validate``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.resolver import OpContext, OperationDef, OpError, Shape, register
from nnhal.ops.shape import known, quant_unchanged, rank_between, scalar, vector
from nnhal.ops.signature import V1_0, V1_1, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

_F32, _F16, _I32 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32
_Q8, _Q8S = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED


def _t(*types: OperandType) -> list[dict[str, OperandType]]:
    return [{"T": t} for t in types]


#: The operations of 1.2 take these five types (QUANT8_ASYMM_SIGNED from 1.3).
_INT_1_2 = [*variants(V1_2, *_t(_F16, _F32, _I32, _Q8)), *variants(V1_3, *_t(_Q8S))]
_IN = Slot("input", "T")
_OUT = [Slot("output", "T")]

SIGNATURES = [
    sig(O.STRIDED_SLICE,
        [_IN, Slot("begin", T.TENSOR_INT32, doc="1-D, one per dimension"),
         Slot("end", T.TENSOR_INT32, doc="1-D, one per dimension"),
         Slot("strides", T.TENSOR_INT32, doc="1-D, non-zero"),
         Slot("begin_mask", T.INT32, doc="bit i set: begin[i] ignored"),
         Slot("end_mask", T.INT32, doc="bit i set: end[i] ignored"),
         Slot("shrink_axis_mask", T.INT32, doc="bit i set: dimension i dropped")],
        _OUT, [*variants(V1_1, *_t(_F32, _Q8)), *variants(V1_2, *_t(_F16)),
               *variants(V1_3, *_t(_Q8S))]),
    sig(O.SLICE, [_IN, Slot("begin", T.TENSOR_INT32, doc="1-D, one per dimension"),
                  Slot("size", T.TENSOR_INT32, doc="1-D; -1: to the end")], _OUT, _INT_1_2),
    sig(O.GATHER, [_IN, Slot("axis", T.INT32),
                   Slot("indices", T.TENSOR_INT32, doc="into the axis dimension")],
        _OUT, _INT_1_2),
    sig(O.EMBEDDING_LOOKUP,
        [Slot("lookups", T.TENSOR_INT32, doc="1-D rows of values"),
         Slot("values", "T", doc="rank >= 2")], _OUT,
        [*variants(V1_0, *_t(_F32)), *variants(V1_2, *_t(_I32, _Q8)),
         *variants(V1_3, *_t(_F16, _Q8S))]),
    sig(O.HASHTABLE_LOOKUP,
        [Slot("lookups", T.TENSOR_INT32, doc="1-D keys to find"),
         Slot("keys", T.TENSOR_INT32, doc="1-D, sorted ascending"),
         Slot("values", "T", doc="one row per key")],
        [Slot("output", "T"), Slot("hits", T.TENSOR_QUANT8_ASYMM, doc="scale 1, zero point 0")],
        variants(V1_0, *_t(_F32, _I32, _Q8))),
    sig(O.TOPK_V2, [_IN, Slot("k", T.INT32, doc="1..last dimension")],
        [Slot("values", "T"), Slot("indices", T.TENSOR_INT32)], _INT_1_2),
]


# ---- STRIDED_SLICE --------------------------------------------------------------------------

def _clamped_index(index: int, dim: int, positive_stride: bool) -> int:
    """Clamp a begin/end index into the range the stride direction can reach (-1 = before
    the first element when walking backwards)."""
    if positive_stride:
        if index >= dim:
            return dim
        return min(max(index, -dim), dim) % dim
    if index < -dim:
        return -1
    return min(max(index, -dim), dim - 1) % dim


def _strided_plan(shape: Sequence[int], begin: Sequence[int], end: Sequence[int],
                  strides: Sequence[int], begin_mask: int, end_mask: int,
                  shrink_mask: int) -> tuple[list[tuple[int, int, int]], tuple[int, ...]]:
    """Per-dimension (start, count, stride) and the output shape; raises on invalid input."""
    rank = len(shape)
    if not (len(begin) == len(end) == len(strides) == rank):
        raise OpError("STRIDED_SLICE: begin, end and strides must have one value per dimension")
    plan = []
    out = []
    for i, dim in enumerate(shape):
        stride = strides[i]
        if stride == 0:
            raise OpError("STRIDED_SLICE: strides must be non-zero")
        pos = stride > 0
        if dim == 0:
            start, stop = 0, 0
        else:
            start = (0 if pos else dim - 1) if begin_mask & (1 << i) else \
                _clamped_index(begin[i], dim, pos)
            stop = (dim if pos else -1) if end_mask & (1 << i) else \
                _clamped_index(end[i], dim, pos)
        count = max(0, math.ceil((stop - start) / stride))
        if shrink_mask & (1 << i):
            if not pos:
                raise OpError("STRIDED_SLICE: a shrunk dimension needs a positive stride")
            if count != 1:
                raise OpError(f"STRIDED_SLICE: shrunk dimension {i} must select one element")
        else:
            out.append(count)
        plan.append((start, count, stride))
    # Shrinking every dimension leaves a 1-element vector.
    return plan, tuple(out) or (1,)


def _basic_index(plan: Sequence[tuple[int, int, int]]) -> tuple[slice, ...]:
    """Basic slices selecting what a (start, count, stride) plan selects, as a view."""
    index = []
    for start, count, stride in plan:
        if count == 0:
            index.append(slice(0, 0))
            continue
        last = start + stride * (count - 1)
        stop = last + (1 if stride > 0 else -1)
        index.append(slice(start, None if stop < 0 else stop, stride))
    return tuple(index)


@register(O.STRIDED_SLICE)
class StridedSlice(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, max_rank=4)
        r = ctx.inputs[0].rank
        for i, what in ((1, "begin"), (2, "end"), (3, "strides")):
            vector(ctx, i, what, r)
        strides = ctx.const_ints(3)
        ctx.require(strides is None or all(s != 0 for s in strides), "strides must be non-zero")
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        params = [ctx.const_ints(i) for i in (1, 2, 3)]
        masks = [ctx.const_int(i) for i in (4, 5, 6)]
        if shape is None:
            return [None]
        if not known(shape) or any(p is None for p in params) or any(m is None for m in masks):
            shrink = masks[2]
            if shrink is None:
                return [None]
            n = sum(1 for i in range(len(shape)) if not shrink & (1 << i))
            return [(0,) * n if n else (1,)]
        return [_strided_plan(shape, *params, *masks)[1]]

    @staticmethod
    def _bound(ctx: OpContext) -> tuple[tuple[int, ...], tuple, tuple[int, ...]] | None:
        """(input shape, basic-slice index, shape of the sliced view) when the input shape and
        every parameter are known at prepare, else None."""
        shape = ctx.inputs[0].shape
        params = [ctx.const_ints(i) for i in (1, 2, 3)]
        masks = [ctx.const_int(i) for i in (4, 5, 6)]
        if shape is None or not known(shape) or any(p is None for p in params) or \
                any(m is None for m in masks):
            return None
        try:
            plan, _ = _strided_plan(shape, *params, *masks)
        except OpError:
            return None
        return tuple(shape), _basic_index(plan), tuple(c for _, c, _ in plan)

    def kernel_into(self, ctx: OpContext):
        """Everything known at prepare: one basic-slice copy into the output."""
        bound = self._bound(ctx)
        if bound is None:
            return None
        shape, index, view = bound
        return _slice_into(shape, self.kernel(ctx),
                           lambda x, out: np.copyto(out.reshape(view), x[index]))

    def kernel(self, ctx: OpContext):
        bound = self._bound(ctx)
        bound_shape = None if bound is None else \
            _strided_plan(bound[0], *(ctx.const_ints(i) for i in (1, 2, 3)),
                          *(ctx.const_int(i) for i in (4, 5, 6)))[1]

        def run(ins, rt):
            x = ins[0]
            if bound is not None and x.shape == bound[0]:
                return [np.ascontiguousarray(x[bound[1]]).reshape(bound_shape)]
            vec = [[int(v) for v in np.ravel(ins[i])] for i in (1, 2, 3)]
            plan, out_shape = _strided_plan(x.shape, *vec, *(scalar(ins[i]) for i in (4, 5, 6)))
            index = [start + stride * np.arange(count) for start, count, stride in plan]
            y = x[np.ix_(*index)] if index else x
            return [np.ascontiguousarray(y).reshape(out_shape)]

        return run


# ---- SLICE ----------------------------------------------------------------------------------

def _slice_sizes(shape: Sequence[int], begin: Sequence[int],
                 size: Sequence[int]) -> tuple[int, ...]:
    if len(begin) != len(shape) or len(size) != len(shape):
        raise OpError("SLICE: begin and size must have one value per dimension")
    out = []
    for d, b, s in zip(shape, begin, size):
        if s == -1:
            s = d - b
        if b < 0 or s < 0 or b + s > d:
            raise OpError(f"SLICE: begin {b} and size {s} exceed dimension {d}")
        out.append(s)
    return tuple(out)


@register(O.SLICE)
class Slice(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, min_rank=1)
        r = ctx.inputs[0].rank
        vector(ctx, 1, "begin", r)
        vector(ctx, 2, "size", r)
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        begin, size = ctx.const_ints(1), ctx.const_ints(2)
        if shape is None:
            return [None]
        if begin is None or size is None:
            if size is not None and len(size) == len(shape):
                return [tuple(0 if s == -1 else s for s in size)]
            return [(0,) * len(shape)]
        if not known(shape):
            if any(b < 0 or s < -1 for b, s in zip(begin, size)):
                raise ctx.fail("begin must be >= 0 and size >= -1")
            return [tuple(0 if s == -1 else s for s in size)]
        return [_slice_sizes(shape, begin, size)]

    @staticmethod
    def _bound(ctx: OpContext) -> tuple[tuple[int, ...], tuple[slice, ...]] | None:
        """(input shape, slice index) when the input shape, begin and size are known."""
        shape = ctx.inputs[0].shape
        begin, size = ctx.const_ints(1), ctx.const_ints(2)
        if shape is None or not known(shape) or begin is None or size is None:
            return None
        try:
            sizes = _slice_sizes(shape, begin, size)
        except OpError:
            return None
        return tuple(shape), tuple(slice(b, b + n) for b, n in zip(begin, sizes))

    def kernel_into(self, ctx: OpContext):
        """Everything known at prepare: one slice copy into the output."""
        bound = self._bound(ctx)
        if bound is None:
            return None
        shape, index = bound
        return _slice_into(shape, self.kernel(ctx), lambda x, out: np.copyto(out, x[index]))

    def kernel(self, ctx: OpContext):
        bound = self._bound(ctx)

        def run(ins, rt):
            x = ins[0]
            if bound is not None and x.shape == bound[0]:
                return [np.ascontiguousarray(x[bound[1]])]
            begin = [int(v) for v in np.ravel(ins[1])]
            sizes = _slice_sizes(x.shape, begin, [int(v) for v in np.ravel(ins[2])])
            sl = tuple(slice(b, b + s) for b, s in zip(begin, sizes))
            return [np.ascontiguousarray(x[sl])]

        return run


# ---- GATHER ---------------------------------------------------------------------------------

@register(O.GATHER)
class Gather(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, min_rank=1)
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape, ishape = ctx.inputs[0].shape, ctx.inputs[2].shape
        axis = ctx.const_int(1)
        if shape is not None and axis is not None:
            ax = C.normalize_axis(axis, len(shape))
            idx = ctx.const(2)  # numpy: BirdNET's framing indices are half a million
            if idx is not None and shape[ax]:
                idx = np.asarray(idx)
                ctx.require(idx.size == 0 or (int(idx.min()) >= 0 and
                                              int(idx.max()) < shape[ax]),
                            "indices out of range")
        if shape is None or ishape is None:
            return [None]
        if axis is None:
            return [(0,) * (len(shape) + len(ishape) - 1)]
        return [tuple(shape[:ax]) + tuple(ishape) + tuple(shape[ax + 1:])]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            x, idx = ins[0], ins[2]
            ax = C.normalize_axis(scalar(ins[1]), x.ndim)
            if idx.size and (idx.min() < 0 or idx.max() >= x.shape[ax]):
                raise OpError("GATHER: indices out of range")
            return [np.take(x, idx.astype(np.intp), axis=ax)]

        return run


# ---- EMBEDDING_LOOKUP / HASHTABLE_LOOKUP ----------------------------------------------------

@register(O.EMBEDDING_LOOKUP)
class EmbeddingLookup(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        vector(ctx, 0, "lookups")
        quant_unchanged(ctx, index=1)
        rank_between(ctx, 1, min_rank=2)

    def prepare(self, ctx: OpContext):
        lshape, vshape = ctx.inputs[0].shape, ctx.inputs[1].shape
        if vshape is None:
            return [None]
        n = lshape[0] if lshape is not None and len(lshape) == 1 else 0
        return [(n,) + tuple(vshape[1:])]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            lookups, values = ins[0].reshape(-1), ins[1]
            if lookups.size and (lookups.min() < 0 or lookups.max() >= values.shape[0]):
                raise OpError("EMBEDDING_LOOKUP: lookup value out of range")
            return [np.take(values, lookups.astype(np.intp), axis=0)]

        return run


@register(O.HASHTABLE_LOOKUP)
class HashtableLookup(OperationDef):
    """Misses produce zero-filled rows (zero bytes for quant8) and a hit flag of 0. Hits are
    TENSOR_QUANT8_ASYMM bytes (scale 1, zero point 0) used as booleans."""

    def validate(self, ctx: OpContext) -> None:
        vector(ctx, 0, "lookups")
        vector(ctx, 1, "keys")
        quant_unchanged(ctx, index=2)
        rank_between(ctx, 2, min_rank=1)
        hits = ctx.outputs[1]
        ctx.require(hits.zero_point == 0 and hits.scale == 1.0,
                    "hits must have scale 1 and zero point 0")
        ctx.require_same(ctx.dim(1, 0), ctx.dim(2, 0), "keys and values rows")

    def prepare(self, ctx: OpContext):
        lshape, vshape = ctx.inputs[0].shape, ctx.inputs[2].shape
        n = lshape[0] if lshape is not None and len(lshape) == 1 else 0
        return [None if vshape is None else (n,) + tuple(vshape[1:]), (n,)]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            lookups = ins[0].reshape(-1).astype(np.int64)
            keys = ins[1].reshape(-1).astype(np.int64)
            values = ins[2]
            if keys.size != values.shape[0]:
                raise OpError("HASHTABLE_LOOKUP: keys and values must have the same rows")
            pos = np.searchsorted(keys, lookups)
            safe = np.minimum(pos, max(keys.size - 1, 0))
            hit = (pos < keys.size) & (keys[safe] == lookups) if keys.size else \
                np.zeros(lookups.shape, bool)
            out = np.zeros((lookups.size,) + values.shape[1:], dtype=values.dtype)
            if keys.size:
                out[hit] = values[safe[hit]]
            return [out, hit.astype(np.uint8)]

        return run


# ---- TOPK_V2 --------------------------------------------------------------------------------

@register(O.TOPK_V2)
class TopKV2(OperationDef):
    """Values sorted in descending order; equal values list the larger index first."""

    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, min_rank=1)
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        k = ctx.const_int(1)
        if k is not None:
            ctx.require(k > 0, "k must be positive")
            if shape is not None and shape and shape[-1]:
                ctx.require(k <= shape[-1], "k exceeds the last dimension")
        if shape is None:
            return [None, None]
        out = tuple(shape[:-1]) + (k or 0,)
        return [out, out]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            x = ins[0]
            k = scalar(ins[1])
            if k <= 0 or k > x.shape[-1]:
                raise OpError(f"TOPK_V2: k={k} out of range for last dimension {x.shape[-1]}")
            idx = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
            keys = x.astype(np.float64) if x.dtype == np.float16 else x
            order = np.lexsort((idx, keys), axis=-1)[..., ::-1][..., :k]
            values = np.take_along_axis(x, order, axis=-1)
            return [np.ascontiguousarray(values), np.ascontiguousarray(order).astype(np.int32)]

        return run


def _slice_into(shape: tuple[int, ...], general: Callable, copy: Callable) -> Callable:
    """An into-kernel for a slice bound at prepare: ``copy(x, out)`` when the input has the
    prepared shape; the general kernel's result copied in otherwise (not expected)."""

    def run_into(ins, outs, rt) -> None:
        x = ins[0]
        if x.shape != shape:
            np.copyto(outs[0], general(ins, rt)[0])
            return
        copy(x, outs[0])

    return run_into
