"""Reductions: MEAN, REDUCE_ALL/ANY/MAX/MIN/PROD/SUM, ARGMAX, ARGMIN.

Float16 tensors are reduced in float32 and rounded once. Quantized MEAN follows the reference
kernel: the stored integers are summed in int32 and divided by the element count with C
truncation (input and output share scale and zero point). REDUCE_MAX/MIN over an empty range
give the reference kernel's initial values (the type's lowest/highest).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.resolver import OpContext, OperationDef, OpError, Shape, register
from nnhal.ops.signature import V1_1, V1_2, V1_3, Signature, Slot, Variant, sig, variants

T = OperandType
O = OperationType

_FLOAT16_MAX = 65504.0

_F32, _F16 = {"T": T.TENSOR_FLOAT32}, {"T": T.TENSOR_FLOAT16}
_Q8, _Q8S = {"T": T.TENSOR_QUANT8_ASYMM}, {"T": T.TENSOR_QUANT8_ASYMM_SIGNED}
_AXES = Slot("axes", T.TENSOR_INT32, doc="1-D, the dimensions to reduce")


def _reduce_sig(op: OperationType, keep_dims: OperandType, rows: list[Variant]) -> Signature:
    return sig(op, [Slot("input", "T", doc="rank up to 4"), _AXES,
                    Slot("keep_dims", keep_dims, doc="keep reduced dimensions as 1")],
               [Slot("output", "T", doc="[1] when every dimension goes")], rows)


def _arg_sig(op: OperationType) -> Signature:
    return sig(op, [Slot("input", "T", doc="rank 1 or more"),
                    Slot("axis", T.INT32, doc="in [-rank, rank)")],
               [Slot("output", T.TENSOR_INT32, doc="input shape without the axis")],
               [*variants(V1_2, _F16, _F32, {"T": T.TENSOR_INT32}, _Q8), *variants(V1_3, _Q8S)])


SIGNATURES = [
    _reduce_sig(O.MEAN, T.INT32, [*variants(V1_1, _F32, _Q8), *variants(V1_2, _F16),
                                  *variants(V1_3, _Q8S)]),
    _reduce_sig(O.REDUCE_MAX, T.BOOL, [*variants(V1_2, _F16, _F32, _Q8), *variants(V1_3, _Q8S)]),
    _reduce_sig(O.REDUCE_MIN, T.BOOL, [*variants(V1_2, _F16, _F32, _Q8), *variants(V1_3, _Q8S)]),
    _reduce_sig(O.REDUCE_SUM, T.BOOL, variants(V1_2, _F16, _F32)),
    _reduce_sig(O.REDUCE_PROD, T.BOOL, variants(V1_2, _F16, _F32)),
    _reduce_sig(O.REDUCE_ALL, T.BOOL, variants(V1_2, {"T": T.TENSOR_BOOL8})),
    _reduce_sig(O.REDUCE_ANY, T.BOOL, variants(V1_2, {"T": T.TENSOR_BOOL8})),
    _arg_sig(O.ARGMAX),
    _arg_sig(O.ARGMIN),
]


def _resolve_axes(axes: Sequence[int], rank: int, name: str) -> tuple[int, ...]:
    """Normalise (possibly repeated, possibly negative) axes into a sorted unique tuple."""
    out = set()
    for a in axes:
        if not -rank <= a < rank:
            raise OpError(f"{name}: axis {a} out of range for rank {rank}")
        out.add(a % rank)
    return tuple(sorted(out))


def _reduced_shape(shape: Sequence[int], axes: tuple[int, ...], keep: bool) -> tuple[int, ...]:
    if keep:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    # Reducing every dimension without keep_dims gives shape [1].
    return tuple(d for i, d in enumerate(shape) if i not in axes) or (1,)


class _Reduce(OperationDef):
    keep_type = T.BOOL

    def validate(self, ctx: OpContext) -> None:
        self._validated(ctx)

    def validate_and_prepare(self, ctx: OpContext) -> list[Shape] | None:
        return self._validated(ctx)

    def _validated(self, ctx: OpContext) -> list[Shape] | None:
        """Every rule checked; prepare's output shapes (validate infers them to check)."""
        info, out = ctx.inputs[0], ctx.outputs[0]
        if info.rank is not None and info.rank > 4:  # the message worded only when needed
            raise ctx.fail(f"input rank {info.rank} exceeds 4")
        if info.type in C.QUANT8_TYPES:
            ctx.require(np.float32(out.scale) == np.float32(info.scale)
                        and out.zero_point == info.zero_point,
                        "output must have the input's scale and zero point")
        ctx.expect_rank(1, 1)
        return self.prepare(ctx)

    def _keep(self, value: object) -> bool:
        v = np.asarray(value).reshape(-1)[0]
        return bool(v) if self.keep_type == T.BOOL else int(v) > 0

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        axes = ctx.const_ints(1)
        keep_v = ctx.const(2)
        if shape is None:
            return [None]
        if axes is None or keep_v is None:
            return [None]
        axes_t = _resolve_axes(axes, len(shape), self.op_type.name)
        return [_reduced_shape(shape, axes_t, self._keep(keep_v))]

    def reducer(self, ctx: OpContext):
        """``f(x, axes) -> reduced array with keepdims``, in the output's dtype."""
        raise NotImplementedError

    def kernel(self, ctx: OpContext):
        reduce = self.reducer(ctx)
        name = self.op_type.name
        dt = ctx.outputs[0].type.dtype

        def run(ins, rt):
            x = ins[0]
            axes = _resolve_axes([int(v) for v in np.ravel(ins[1])], x.ndim, name)
            keep = self._keep(ins[2])
            with np.errstate(all="ignore"):
                y = np.asarray(reduce(x, axes)).astype(dt, copy=False)
            return [y.reshape(_reduced_shape(x.shape, axes, keep))]

        return run


@register(O.MEAN)
class Mean(_Reduce):
    keep_type = T.INT32

    def reducer(self, ctx: OpContext):
        t = ctx.inputs[0].type
        if t in C.QUANT8_TYPES:
            def quant(x, axes):
                count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
                total = np.sum(x.astype(np.int64), axis=axes, keepdims=True)
                if count == 0:
                    raise OpError("MEAN: cannot average an empty range")
                # C++ integer division truncates toward zero.
                q = np.abs(total) // count * np.sign(total)
                lo, hi = C.qrange(t)
                return np.clip(q, lo, hi)

            return quant

        def flt(x, axes):
            count = np.float32(np.prod([x.shape[a] for a in axes], dtype=np.int64))
            with np.errstate(all="ignore"):
                total = np.sum(x.astype(np.float32), axis=axes, keepdims=True)
                return total / count

        return flt


class _MinMax(_Reduce):
    ufunc = np.maximum

    def reducer(self, ctx: OpContext):
        t = ctx.inputs[0].type
        is_max = self.ufunc is np.maximum
        if t == T.TENSOR_FLOAT16:
            init = -_FLOAT16_MAX if is_max else _FLOAT16_MAX
        elif t == T.TENSOR_FLOAT32:
            fi = np.finfo(np.float32)
            init = float(fi.min if is_max else fi.max)
        else:
            lo, hi = C.qrange(t)
            init = lo if is_max else hi
        ufunc = self.ufunc

        def run(x, axes):
            return ufunc.reduce(x, axis=axes, keepdims=True, initial=init)

        return run


@register(O.REDUCE_MAX)
class ReduceMax(_MinMax):
    ufunc = np.maximum


@register(O.REDUCE_MIN)
class ReduceMin(_MinMax):
    ufunc = np.minimum


class _FloatReduce(_Reduce):
    """Float reductions computed in float32 (float16 inputs included)."""

    fn = staticmethod(np.sum)

    def reducer(self, ctx: OpContext):
        fn = self.fn

        def run(x, axes):
            with np.errstate(all="ignore"):
                return fn(x.astype(np.float32), axis=axes, keepdims=True)

        return run


@register(O.REDUCE_SUM)
class ReduceSum(_FloatReduce):
    fn = staticmethod(np.sum)


@register(O.REDUCE_PROD)
class ReduceProd(_FloatReduce):
    fn = staticmethod(np.prod)


@register(O.REDUCE_ALL)
class ReduceAll(_Reduce):
    def reducer(self, ctx: OpContext):
        return lambda x, axes: np.all(x, axis=axes, keepdims=True)


@register(O.REDUCE_ANY)
class ReduceAny(_Reduce):
    def reducer(self, ctx: OpContext):
        return lambda x, axes: np.any(x, axis=axes, keepdims=True)


# ---- ARGMAX / ARGMIN ------------------------------------------------------------------------

class _ArgMinMax(OperationDef):
    """The first index of the extreme value along the axis; 1-D inputs give shape [1]."""

    pick = staticmethod(np.argmax)

    def validate(self, ctx: OpContext) -> list[Shape] | None:
        rank = ctx.inputs[0].rank
        ctx.require(rank is None or rank >= 1, "input must have rank 1 or more")
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        axis = ctx.const_int(1)
        if shape is None:
            return [None]
        if axis is None:
            return [(0,) * max(len(shape) - 1, 1)]
        ax = C.normalize_axis(axis, len(shape))
        return [tuple(d for i, d in enumerate(shape) if i != ax) or (1,)]

    def kernel(self, ctx: OpContext):
        pick = self.pick
        name = self.op_type.name

        def run(ins, rt):
            x = ins[0]
            ax = C.normalize_axis(int(np.asarray(ins[1])), x.ndim)
            if x.shape[ax] == 0:
                raise OpError(f"{name}: the reduced dimension must be non-empty")
            out_shape = tuple(d for i, d in enumerate(x.shape) if i != ax) or (1,)
            return [pick(x, axis=ax).astype(np.int32).reshape(out_shape)]

        return run


@register(O.ARGMAX)
class ArgMax(_ArgMinMax):
    pick = staticmethod(np.argmax)


@register(O.ARGMIN)
class ArgMin(_ArgMinMax):
    pick = staticmethod(np.argmin)
