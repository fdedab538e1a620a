"""Shape and layout operations: data movement without arithmetic (except CONCATENATION's
requantisation).

CONCATENATION, PACK, DEPTH_TO_SPACE, SPACE_TO_DEPTH, RESHAPE, BATCH_TO_SPACE_ND, SPACE_TO_BATCH_ND,
PAD, PAD_V2, SQUEEZE, TRANSPOSE, EXPAND_DIMS, TILE, CHANNEL_SHUFFLE, SPLIT, FILL, RANK;
MIRROR_PAD and REVERSE (AIDL v3).

Each output shape is computed by one function shared by ``validate`` (when the parameters are
constant), ``prepare`` (0 marks an unknown dimension) and the kernel (from runtime values), so
the three always agree. The helpers at the top are shared with ``indexing`` and ``reduce``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.resolver import OpContext, OperandInfo, OperationDef, OpError, Shape, register
from nnhal.ops.signature import V1_0, V1_1, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

#: The element types of the layout operations introduced in 1.0/1.1 (plus their 1.2/1.3 types).
BASIC_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM,
               T.TENSOR_QUANT8_ASYMM_SIGNED)
#: BASIC_TYPES plus TENSOR_INT32, for the operations introduced in 1.2.
WITH_INT32 = BASIC_TYPES + (T.TENSOR_INT32,)


# ---- helpers shared by the family ------------------------------------------------------------

def quant_unchanged(ctx: OpContext, outputs: Sequence[int] = (0,), index: int = 0) -> None:
    """Quantized ``outputs`` keep input ``index``'s scale and zero point (the spec requires
    both to be unchanged by these data movements). Types are the signature's business."""
    info = ctx.inputs[index]
    if info.type not in C.QUANT8_TYPES:
        return
    for o in outputs:
        out = ctx.outputs[o]
        ctx.require(np.float32(out.scale) == np.float32(info.scale)
                    and out.zero_point == info.zero_point,
                    f"output {o} must have the input's scale and zero point")


def rank_between(ctx: OpContext, index: int, min_rank: int | None = None,
                 max_rank: int | None = None) -> None:
    """Input ``index`` has between ``min_rank`` and ``max_rank`` dimensions, when known."""
    r = ctx.inputs[index].rank
    if r is None:
        return
    # The messages are worded only when needed.
    if max_rank is not None and r > max_rank:
        raise ctx.fail(f"input {index} rank {r} exceeds {max_rank}")
    if min_rank is not None and r < min_rank:
        raise ctx.fail(f"input {index} rank {r} is below {min_rank}")


def vector(ctx: OpContext, index: int, what: str, length: int | None = None) -> None:
    """Input ``index`` is 1-D (of ``length`` elements when both are known)."""
    r = ctx.inputs[index].rank
    if r is not None and r != 1:  # the messages are worded only when needed
        raise ctx.fail(f"{what} must be 1-D")
    if length is not None:
        d = ctx.dim(index, 0)
        if d is not None and d != length:
            raise ctx.fail(f"{what} must have {length} elements")


def const_bool(ctx: OpContext, index: int, default: bool = False) -> bool | None:
    """An optional BOOL scalar: ``default`` when absent or omitted, ``None`` when runtime-only."""
    if not ctx.has_value(index):
        return default
    v = ctx.const(index)
    return None if v is None else bool(np.asarray(v).reshape(-1)[0])


def scalar(value: object, default: int = 0) -> int:
    """A runtime INT32 scalar (0-d array) as int; ``default`` when omitted."""
    return default if value is None else int(np.asarray(value).reshape(-1)[0])


def flag(ins: Sequence[object], index: int) -> bool:
    """A runtime optional BOOL input (e.g. the NCHW layout flag); false when absent."""
    if len(ins) <= index or ins[index] is None:
        return False
    return bool(np.asarray(ins[index]).reshape(-1)[0])


def known(shape: Shape) -> bool:
    """A shape whose rank and every dimension are known (zero-sized dims are ambiguous with
    unknown ones at prepare time, so they count as unknown here)."""
    return shape is not None and all(d > 0 for d in shape)


def pad_value(info: OperandInfo) -> float | int:
    """The logical zero of an operand: its zero point when quantized."""
    return info.zero_point if info.type in C.QUANT8_TYPES else 0


def nchw_to_nhwc(x: np.ndarray) -> np.ndarray:
    return np.transpose(x, (0, 2, 3, 1))


def nhwc_to_nchw(x: np.ndarray) -> np.ndarray:
    return np.transpose(x, (0, 3, 1, 2))


def to_nhwc_shape(shape: Sequence[int], nchw: bool) -> tuple[int, ...]:
    s = tuple(shape)
    return (s[0], s[2], s[3], s[1]) if nchw else s


def from_nhwc_shape(shape: Sequence[int], nchw: bool) -> tuple[int, ...]:
    s = tuple(shape)
    return (s[0], s[3], s[1], s[2]) if nchw else s


# ---- signatures ----------------------------------------------------------------------------

def _t(*types: OperandType) -> list[dict[str, OperandType]]:
    return [{"T": t} for t in types]


_F32, _F16, _I32 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32
_Q8, _Q8S = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
#: F32 and Q8 from the operation's first version, F16 from 1.2, Q8 signed from 1.3.
_BASIC_1_0 = [*variants(V1_0, *_t(_F32, _Q8)), *variants(V1_2, *_t(_F16)),
              *variants(V1_3, *_t(_Q8S))]
_BASIC_1_1 = [*variants(V1_1, *_t(_F32, _Q8)), *variants(V1_2, *_t(_F16)),
              *variants(V1_3, *_t(_Q8S))]
#: Operations of 1.2 without INT32 tensors, and with them.
_BASIC_1_2 = [*variants(V1_2, *_t(_F16, _F32, _Q8)), *variants(V1_3, *_t(_Q8S))]
_INT_1_2 = [*variants(V1_2, *_t(_F16, _F32, _I32, _Q8)), *variants(V1_3, *_t(_Q8S))]
#: The AIDL v3 data movements: every type from their first version.
_INT_AIDL_V3 = variants(FeatureLevel.AIDL_V3, *_t(_F16, _F32, _Q8, _Q8S, _I32))

_IN = Slot("input", "T")
_OUT = [Slot("output", "T")]
_LAYOUT = Slot("layout", T.BOOL, optional=True, omittable=True, since=V1_2,
               doc="true: NCHW (default false: NHWC)")
_BLOCK_SIZE = Slot("block_size", T.INT32, doc=">= 1")

SIGNATURES = [
    sig(O.CONCATENATION, [Slot("inputs", "T", repeated=True, doc="same rank; equal but on axis"),
                          Slot("axis", T.INT32)], _OUT, _BASIC_1_0),
    sig(O.PACK, [Slot("axis", T.INT32, doc="in [0, rank + 1)"),
                 Slot("inputs", "T", repeated=True, doc="rank >= 1; identical shapes")], _OUT,
        variants(FeatureLevel.AIDL_V2, *_t(_F16, _F32, _Q8, _Q8S, _I32))),
    sig(O.DEPTH_TO_SPACE, [Slot("input", "T", doc="4-D"), _BLOCK_SIZE, _LAYOUT], _OUT,
        _BASIC_1_0),
    sig(O.SPACE_TO_DEPTH, [Slot("input", "T", doc="4-D"), _BLOCK_SIZE, _LAYOUT], _OUT,
        _BASIC_1_0),
    sig(O.RESHAPE, [_IN, Slot("shape", T.TENSOR_INT32, doc="1-D; at most one -1")], _OUT,
        [*_BASIC_1_0, *variants(FeatureLevel.AIDL_V2, *_t(_I32))]),
    sig(O.BATCH_TO_SPACE_ND, [Slot("input", "T", doc="4-D"),
                              Slot("block_shape", T.TENSOR_INT32, doc="[2], values >= 1"),
                              _LAYOUT], _OUT, _BASIC_1_1),
    sig(O.SPACE_TO_BATCH_ND, [Slot("input", "T", doc="4-D"),
                              Slot("block_shape", T.TENSOR_INT32, doc="[2], values >= 1"),
                              Slot("paddings", T.TENSOR_INT32, doc="[2, 2], values >= 0"),
                              _LAYOUT], _OUT, _BASIC_1_1),
    sig(O.PAD, [_IN, Slot("paddings", T.TENSOR_INT32, doc="[rank, 2]: before, after")], _OUT,
        _BASIC_1_1),
    sig(O.PAD_V2, [_IN, Slot("paddings", T.TENSOR_INT32, doc="[rank, 2]: before, after"),
                   Slot("pad_value", "S", doc="quantized: a stored value")], _OUT,
        [*variants(V1_2, {"T": _F16, "S": T.FLOAT16}, {"T": _F32, "S": T.FLOAT32},
                   {"T": _Q8, "S": T.INT32}),
         *variants(V1_3, {"T": _Q8S, "S": T.INT32})]),
    sig(O.MIRROR_PAD, [Slot("input", "T", doc="rank >= 1"),
                       Slot("paddings", T.TENSOR_INT32,
                            doc="[rank, 2]: before, after; >= 0, REFLECT < and SYMMETRIC <= "
                                "the dimension"),
                       Slot("mode", T.INT32, doc="0: REFLECT, 1: SYMMETRIC")], _OUT,
        _INT_AIDL_V3),
    sig(O.REVERSE, [Slot("input", "T", doc="rank 1 to 8"),
                    Slot("axis", T.TENSOR_INT32, doc="[1], in [0, rank)")], _OUT, _INT_AIDL_V3),
    sig(O.SQUEEZE, [_IN, Slot("axes", T.TENSOR_INT32, omittable=True,
                              doc="1-D; omitted: every size-1 dimension")], _OUT, _BASIC_1_1),
    sig(O.TRANSPOSE, [_IN, Slot("perm", T.TENSOR_INT32, omittable=True,
                                doc="1-D; omitted: reversed dimensions")], _OUT, _BASIC_1_1),
    sig(O.EXPAND_DIMS, [_IN, Slot("axis", T.INT32, doc="in [-(n + 1), n + 1)")], _OUT,
        _INT_1_2),
    sig(O.TILE, [_IN, Slot("multiples", T.TENSOR_INT32, doc="1-D, one per dimension")], _OUT,
        _INT_1_2),
    sig(O.CHANNEL_SHUFFLE, [_IN, Slot("num_groups", T.INT32, doc="divides the channels"),
                            Slot("axis", T.INT32, doc="the channel dimension")], _OUT,
        _BASIC_1_2),
    sig(O.SPLIT, [_IN, Slot("axis", T.INT32),
                  Slot("num_splits", T.INT32, doc="the number of outputs")],
        [Slot("outputs", "T", repeated=True)], _INT_1_2),
    sig(O.FILL, [Slot("dims", T.TENSOR_INT32, doc="1-D: the output shape"),
                 Slot("value", "S")], _OUT,
        variants(V1_3, {"T": _F16, "S": T.FLOAT16}, {"T": _F32, "S": T.FLOAT32},
                 {"T": _I32, "S": T.INT32})),
    sig(O.RANK, [_IN], [Slot("rank", T.INT32)],
        variants(V1_3, *_t(_F16, _F32, _I32, _Q8, T.TENSOR_QUANT16_SYMM, T.TENSOR_BOOL8,
                           T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.TENSOR_QUANT16_ASYMM,
                           T.TENSOR_QUANT8_SYMM, _Q8S))),
]


# ---- CONCATENATION --------------------------------------------------------------------------

def _concat_shape(shapes: Sequence[Sequence[int]], axis: int, *,
                  strict: bool = False) -> tuple[int, ...]:
    """Output shape; unless ``strict`` (runtime shapes), 0 means unknown."""
    rank = len(shapes[0])
    ax = C.normalize_axis(axis, rank)
    out = list(shapes[0])
    total = 0
    unknown = False
    for s in shapes:
        if len(s) != rank:
            raise OpError("CONCATENATION: all inputs must have the same rank")
        for d in range(rank):
            if d == ax:
                continue
            if s[d] != out[d] and (strict or (s[d] and out[d])):
                raise OpError(f"CONCATENATION: dimension {d} differs between inputs")
            out[d] = out[d] or s[d]
        unknown |= s[ax] == 0 and not strict
        total += s[ax]
    out[ax] = 0 if unknown else total
    return tuple(out)


@register(O.CONCATENATION)
class Concatenation(OperationDef):
    """Quantized inputs whose scale or zero point differ from the output's are requantised
    with the float formula of the reference kernel (round half away from zero)."""

    def validate(self, ctx: OpContext) -> None:
        for i in range(len(ctx.inputs) - 1):
            rank_between(ctx, i, max_rank=4)
        self._shape(ctx)

    @staticmethod
    def _shape(ctx: OpContext) -> Shape:
        n = len(ctx.inputs) - 1
        shapes = [ctx.inputs[i].shape for i in range(n)]
        axis = ctx.const_int(n)
        if any(s is None for s in shapes):
            return None
        if axis is None:
            ranks = {len(s) for s in shapes}
            if len(ranks) != 1:
                raise ctx.fail("all inputs must have the same rank")
            return (0,) * ranks.pop()
        if not shapes[0]:
            raise ctx.fail("inputs must have rank at least 1")
        return _concat_shape(shapes, axis)

    def prepare(self, ctx: OpContext):
        return [self._shape(ctx)]

    def kernel(self, ctx: OpContext):
        n = len(ctx.inputs) - 1
        out = ctx.outputs[0]
        t = out.type
        # Per input: None to copy, else (scale, bias) of the float requantisation.
        plans: list[tuple[np.float32, np.float32] | None] = []
        for i in range(n):
            info = ctx.inputs[i]
            if t not in C.QUANT8_TYPES or (np.float32(info.scale) == np.float32(out.scale)
                                           and info.zero_point == out.zero_point):
                plans.append(None)
            else:
                scale = np.float32(info.scale) * (np.float32(1.0) / np.float32(out.scale))
                plans.append((np.float32(scale), np.float32(-info.zero_point * scale)))
        qmin, qmax = C.qrange(t) if t in C.QUANT8_TYPES else (0, 0)
        zo = out.zero_point
        axis_const = ctx.const_int(n)
        copies_only = all(p is None for p in plans)

        def run(ins, rt):
            if copies_only and axis_const is not None:
                try:
                    return [np.concatenate(ins[:n], axis=axis_const).astype(t.dtype, copy=False)]
                except (ValueError, np.exceptions.AxisError):
                    pass  # the checks below say why
            axis = scalar(ins[n])
            arrays = []
            for i in range(n):
                x = ins[i]
                if plans[i] is not None:
                    s, b = plans[i]
                    v = C.round_half_away(x.astype(np.float32) * s + b) + zo
                    x = np.clip(v, qmin, qmax).astype(t.dtype)
                arrays.append(x)
            shape = _concat_shape([a.shape for a in arrays], axis, strict=True)
            ax = C.normalize_axis(axis, len(shape))
            return [np.concatenate(arrays, axis=ax).astype(t.dtype, copy=False)]

        return run


    def kernel_into(self, ctx: OpContext):
        """Inputs' shapes and the axis known at prepare: each input copied (or requantised)
        into its own slice of the output."""
        n = len(ctx.inputs) - 1
        shapes = [ctx.inputs[i].shape for i in range(n)]
        axis = ctx.const_int(n)
        if axis is None or any(s is None or not known(s) for s in shapes) or not shapes[0]:
            return None
        try:
            out_shape = _concat_shape(shapes, axis, strict=True)
        except OpError:
            return None
        ax = C.normalize_axis(axis, len(out_shape))
        general = self.kernel(ctx)
        out = ctx.outputs[0]
        t = out.type
        qmin, qmax = C.qrange(t) if t in C.QUANT8_TYPES else (0, 0)
        zo = out.zero_point
        parts = []  # per input: (index of its slice in the output, requantisation or None)
        at = 0
        for i in range(n):
            info = ctx.inputs[i]
            width = shapes[i][ax]
            index = (slice(None),) * ax + (slice(at, at + width),)
            at += width
            if t not in C.QUANT8_TYPES or (np.float32(info.scale) == np.float32(out.scale)
                                           and info.zero_point == out.zero_point):
                parts.append((index, None))
            else:
                scale = np.float32(np.float32(info.scale) * (np.float32(1.0) /
                                                             np.float32(out.scale)))
                parts.append((index, (scale, np.float32(-info.zero_point * scale))))
        fixed = [tuple(s) for s in shapes]

        def run_into(ins, outs, rt) -> None:
            y = outs[0]
            for i in range(n):
                if ins[i].shape != fixed[i]:  # not expected: shapes were known at prepare
                    np.copyto(y, general(ins, rt)[0])
                    return
            for x, (index, requant) in zip(ins, parts):
                if requant is None:
                    y[index] = x
                else:
                    s, b = requant
                    v = C.round_half_away(x.astype(np.float32) * s + b) + zo
                    y[index] = np.clip(v, qmin, qmax).astype(t.dtype)

        return run_into


# ---- PACK -----------------------------------------------------------------------------------

def _pack_shape(shapes: Sequence[Sequence[int]], axis: int | None, *,
                strict: bool = False) -> tuple[int, ...]:
    """The output shape: the inputs' common shape with their count inserted at ``axis``.
    Unless ``strict`` (run-time shapes), 0 means unknown, and so does an unknown axis."""
    rank = len(shapes[0])
    common = list(shapes[0])
    for s in shapes[1:]:
        if len(s) != rank:
            raise OpError("PACK: all inputs must have the same rank")
        for d in range(rank):
            if s[d] != common[d] and (strict or (s[d] and common[d])):
                raise OpError(f"PACK: dimension {d} differs between inputs")
            common[d] = common[d] or s[d]
    if rank < 1:
        raise OpError("PACK: inputs must have rank at least 1")
    if axis is None:
        return (0,) * (rank + 1)
    if not 0 <= axis <= rank:
        raise OpError(f"PACK: axis {axis} is outside [0, {rank + 1})")
    return (*common[:axis], len(shapes), *common[axis:])


@register(O.PACK)
class Pack(OperationDef):
    """Quantized inputs and the output share one scale and zero point (the HAL requires it),
    so packing is a copy of each input into its slice of the output."""

    def validate(self, ctx: OpContext) -> list[Shape] | None:
        for i in range(1, len(ctx.inputs)):
            rank_between(ctx, i, min_rank=1)
            quant_unchanged(ctx, index=i)
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shapes = [ctx.inputs[i].shape for i in range(1, len(ctx.inputs))]
        known_rank = next((s for s in shapes if s is not None), None)
        if known_rank is None:
            return [None]
        if any(s is None for s in shapes):
            return [(0,) * (len(known_rank) + 1)]
        return [_pack_shape(shapes, ctx.const_int(0))]

    def kernel(self, ctx: OpContext):
        dtype = ctx.outputs[0].type.dtype

        def run(ins, rt):
            axis = scalar(ins[0])
            _pack_shape([x.shape for x in ins[1:]], axis, strict=True)
            return [np.stack(ins[1:], axis=axis).astype(dtype, copy=False)]

        return run

    def kernel_into(self, ctx: OpContext):
        n = len(ctx.inputs) - 1
        const_axis = ctx.const_int(0)

        def run_into(ins, outs, rt) -> None:
            y = outs[0]
            axis = scalar(ins[0]) if const_axis is None else const_axis
            shape = _pack_shape([x.shape for x in ins[1:]], axis, strict=True)
            if y.shape != shape:
                raise OpError(f"PACK: output shape {y.shape}, computed {shape}")
            for i in range(n):
                y[(slice(None),) * axis + (i,)] = ins[1 + i]

        return run_into


# ---- DEPTH_TO_SPACE / SPACE_TO_DEPTH -------------------------------------------------------

def _d2s_shape(nhwc: Sequence[int], bs: int) -> tuple[int, ...]:
    if bs < 1:
        raise OpError("DEPTH_TO_SPACE: block_size must be >= 1")
    b, h, w, c = nhwc
    if c and c % (bs * bs):
        raise OpError("DEPTH_TO_SPACE: depth must be divisible by block_size^2")
    return (b, h * bs, w * bs, c // (bs * bs))


def _s2d_shape(nhwc: Sequence[int], bs: int) -> tuple[int, ...]:
    if bs < 1:
        raise OpError("SPACE_TO_DEPTH: block_size must be >= 1")
    b, h, w, c = nhwc
    if (h and h % bs) or (w and w % bs):
        raise OpError("SPACE_TO_DEPTH: height and width must be divisible by block_size")
    return (b, h // bs, w // bs, c * bs * bs)


def _depth_to_space(x: np.ndarray, bs: int) -> np.ndarray:
    b, h, w, c = x.shape
    oc = c // (bs * bs)
    y = x.reshape(b, h, w, bs, bs, oc).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(b, h * bs, w * bs, oc)


def _space_to_depth(x: np.ndarray, bs: int) -> np.ndarray:
    b, h, w, c = x.shape
    y = x.reshape(b, h // bs, bs, w // bs, bs, c).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(b, h // bs, w // bs, c * bs * bs)


class _BlockLayout(OperationDef):
    """DEPTH_TO_SPACE and SPACE_TO_DEPTH: a block size and an optional NCHW flag."""

    shape_fn = staticmethod(_d2s_shape)
    move = staticmethod(_depth_to_space)

    def validate(self, ctx: OpContext) -> None:
        quant_unchanged(ctx)
        ctx.expect_rank(0, 4)
        self._shape(ctx)

    def _shape(self, ctx: OpContext) -> Shape:
        shape = ctx.inputs[0].shape
        bs = ctx.const_int(1)
        nchw = const_bool(ctx, 2)
        if bs is not None and bs < 1:
            raise ctx.fail("block_size must be >= 1")
        if shape is None or len(shape) != 4:
            return None if shape is None else (0,) * 4
        if bs is None or nchw is None:
            return (0, 0, 0, 0)
        return from_nhwc_shape(self.shape_fn(to_nhwc_shape(shape, nchw), bs), nchw)

    def prepare(self, ctx: OpContext):
        return [self._shape(ctx)]

    def kernel(self, ctx: OpContext):
        shape_fn, move = self.shape_fn, self.move

        def run(ins, rt):
            bs = scalar(ins[1])
            nchw = flag(ins, 2)
            x = ins[0]
            if x.ndim != 4:
                raise OpError(f"{self.op_type.name}: input must be 4-D")
            if nchw:
                x = nchw_to_nhwc(x)
            shape_fn(x.shape, bs)
            y = move(x, bs)
            if nchw:
                y = nhwc_to_nchw(y)
            return [np.ascontiguousarray(y)]

        return run


@register(O.DEPTH_TO_SPACE)
class DepthToSpace(_BlockLayout):
    shape_fn = staticmethod(_d2s_shape)
    move = staticmethod(_depth_to_space)


@register(O.SPACE_TO_DEPTH)
class SpaceToDepth(_BlockLayout):
    shape_fn = staticmethod(_s2d_shape)
    move = staticmethod(_space_to_depth)


# ---- RESHAPE --------------------------------------------------------------------------------

def _reshape_shape(in_shape: Sequence[int] | None, target: Sequence[int], *,
                   strict: bool = False) -> tuple[int, ...]:
    """Resolve a target shape with at most one -1; ``in_shape`` None (or, unless ``strict``,
    with a 0 dimension) means an unknown input shape."""
    if sum(1 for d in target if d == -1) > 1:
        raise OpError("RESHAPE: at most one component of shape may be -1")
    if any(d < -1 for d in target):
        raise OpError("RESHAPE: shape components must be >= -1")
    if len(target) > 4:
        raise OpError("RESHAPE: output rank must be at most 4")
    prod = math.prod(int(d) for d in target if d != -1)  # exact: int64 wraps past 2^63
    if in_shape is None or (not strict and any(d == 0 for d in in_shape)):
        return tuple(0 if d == -1 else d for d in target)
    n = math.prod(map(int, in_shape))
    out = list(target)
    if -1 in out:
        if prod == 0:
            raise OpError("RESHAPE: cannot infer -1 with a zero-sized shape")
        out[out.index(-1)] = n // prod
        prod *= n // prod
    if prod != n:
        raise OpError(f"RESHAPE: cannot reshape {tuple(in_shape)} into {tuple(target)}")
    return tuple(out)


@register(O.RESHAPE)
class Reshape(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        self._validated(ctx)

    def validate_and_prepare(self, ctx: OpContext) -> list[Shape] | None:
        return self._validated(ctx)

    def _validated(self, ctx: OpContext) -> list[Shape] | None:
        """Every rule checked; prepare's output shapes (validate infers them to check)."""
        quant_unchanged(ctx)
        rank_between(ctx, 0, max_rank=4)
        vector(ctx, 1, "shape")
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        target = ctx.const_ints(1)
        if target is None:
            s = ctx.inputs[1].shape
            if s is not None and len(s) == 1 and s[0]:
                ctx.require(s[0] <= 4, "output rank must be at most 4")
                return [(0,) * s[0]]
            return [None]
        shape = ctx.inputs[0].shape
        return [_reshape_shape(shape if known(shape) else None, target)]

    def kernel(self, ctx: OpContext):
        target_const = ctx.const_ints(1)
        in_shape = ctx.inputs[0].shape
        bound = None  # (input shape, output shape) when both are known at prepare
        if target_const is not None and in_shape is not None and known(in_shape):
            try:
                bound = (tuple(in_shape),
                         _reshape_shape(in_shape, target_const, strict=True))
            except OpError:
                bound = None

        def run(ins, rt):
            x = ins[0]
            if bound is not None and x.shape == bound[0]:
                return [x.reshape(bound[1])]
            target = [int(v) for v in np.ravel(ins[1])]
            return [ins[0].reshape(_reshape_shape(ins[0].shape, target, strict=True))]

        return run


# ---- BATCH_TO_SPACE_ND / SPACE_TO_BATCH_ND --------------------------------------------------

def _b2s_shape(nhwc: Sequence[int], block: Sequence[int]) -> tuple[int, ...]:
    if len(block) != 2 or any(b < 1 for b in block):
        raise OpError("BATCH_TO_SPACE_ND: block sizes must be two values >= 1")
    n, h, w, c = nhwc
    bb = block[0] * block[1]
    if n and n % bb:
        raise OpError("BATCH_TO_SPACE_ND: batch must be divisible by the block sizes' product")
    return (n // bb, h * block[0], w * block[1], c)


def _s2b_shape(nhwc: Sequence[int], block: Sequence[int], pads: Sequence[int], *,
               strict: bool = False) -> tuple[int, ...]:
    if len(block) != 2 or any(b < 1 for b in block):
        raise OpError("SPACE_TO_BATCH_ND: block sizes must be two values >= 1")
    if len(pads) != 4 or any(p < 0 for p in pads):
        raise OpError("SPACE_TO_BATCH_ND: paddings must be a 2x2 tensor of values >= 0")
    n, h, w, c = nhwc
    ph = pads[0] + h + pads[1] if h or strict else 0
    pw = pads[2] + w + pads[3] if w or strict else 0
    if (ph and ph % block[0]) or (pw and pw % block[1]):
        raise OpError("SPACE_TO_BATCH_ND: padded size must be divisible by the block size")
    return (n * block[0] * block[1], ph // block[0], pw // block[1], c)


@register(O.BATCH_TO_SPACE_ND)
class BatchToSpace(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        ctx.expect_rank(0, 4)
        vector(ctx, 1, "block_shape", 2)
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        block = ctx.const_ints(1)
        if block is not None and (len(block) != 2 or any(b < 1 for b in block)):
            raise ctx.fail("block sizes must be two values >= 1")
        nchw = const_bool(ctx, 2)
        if shape is None:
            return [None]
        if block is None or nchw is None:
            return [(0, 0, 0, 0)]
        return [from_nhwc_shape(_b2s_shape(to_nhwc_shape(shape, nchw), block), nchw)]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            block = [int(v) for v in np.ravel(ins[1])]
            nchw = flag(ins, 2)
            if ins[0].ndim != 4:
                raise OpError("BATCH_TO_SPACE_ND: input must be 4-D")
            x = nchw_to_nhwc(ins[0]) if nchw else ins[0]
            on, oh, ow, c = _b2s_shape(x.shape, block)
            _, h, w, _ = x.shape
            b0, b1 = block
            y = x.reshape(b0, b1, on, h, w, c).transpose(2, 3, 0, 4, 1, 5)
            y = y.reshape(on, oh, ow, c)
            return [np.ascontiguousarray(nhwc_to_nchw(y) if nchw else y)]

        return run


@register(O.SPACE_TO_BATCH_ND)
class SpaceToBatch(OperationDef):
    """Padding uses the logical zero (the zero point for quantized tensors, since 1.2)."""

    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        ctx.expect_rank(0, 4)
        vector(ctx, 1, "block_shape", 2)
        ps = ctx.inputs[2].shape
        ctx.require(ps is None or (len(ps) == 2 and ps[0] in (0, 2) and ps[1] in (0, 2)),
                    "paddings must have shape [2, 2]")
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        block = ctx.const_ints(1)
        pads = ctx.const_ints(2)
        if block is not None and (len(block) != 2 or any(b < 1 for b in block)):
            raise ctx.fail("block sizes must be two values >= 1")
        if pads is not None and (len(pads) != 4 or any(p < 0 for p in pads)):
            raise ctx.fail("paddings must be a 2x2 tensor of values >= 0")
        nchw = const_bool(ctx, 3)
        if shape is None:
            return [None]
        if block is None or pads is None or nchw is None:
            return [(0, 0, 0, 0)]
        return [from_nhwc_shape(_s2b_shape(to_nhwc_shape(shape, nchw), block, pads), nchw)]

    def kernel(self, ctx: OpContext):
        fill = pad_value(ctx.inputs[0])

        def run(ins, rt):
            block = [int(v) for v in np.ravel(ins[1])]
            pads = [int(v) for v in np.ravel(ins[2])]
            nchw = flag(ins, 3)
            if ins[0].ndim != 4:
                raise OpError("SPACE_TO_BATCH_ND: input must be 4-D")
            x = nchw_to_nhwc(ins[0]) if nchw else ins[0]
            on, oh, ow, c = _s2b_shape(x.shape, block, pads, strict=True)
            n = x.shape[0]
            x = np.pad(x, ((0, 0), (pads[0], pads[1]), (pads[2], pads[3]), (0, 0)),
                       constant_values=np.asarray(fill, dtype=x.dtype))
            b0, b1 = block
            y = x.reshape(n, oh, b0, ow, b1, c).transpose(2, 4, 0, 1, 3, 5)
            y = y.reshape(on, oh, ow, c)
            return [np.ascontiguousarray(nhwc_to_nchw(y) if nchw else y)]

        return run


# ---- PAD / PAD_V2 ---------------------------------------------------------------------------

def _pad_shape(shape: Sequence[int], pads: Sequence[int], *, strict: bool = False,
               op: str = "PAD") -> tuple[int, ...]:
    if len(pads) != 2 * len(shape):
        raise OpError(f"{op}: paddings must have shape [rank, 2]")
    if any(p < 0 for p in pads):
        raise OpError(f"{op}: paddings must be >= 0")
    return tuple(pads[2 * i] + d + pads[2 * i + 1] if d or strict else 0
                 for i, d in enumerate(shape))


class _PadBase(OperationDef):
    n_inputs = 2

    def validate(self, ctx: OpContext) -> list[Shape] | None:
        t = ctx.inputs[0].type
        quant_unchanged(ctx)
        rank_between(ctx, 0, 1, 4)
        ps, r = ctx.inputs[1].shape, ctx.inputs[0].rank
        if ps is not None:
            ctx.require(len(ps) == 2 and ps[1] in (0, 2), "paddings must have shape [rank, 2]")
            ctx.require(r is None or ps[0] in (0, r), "paddings must have shape [rank, 2]")
        if self.n_inputs == 3 and t in C.QUANT8_TYPES:
            v = ctx.const_int(2)
            if v is not None:
                lo, hi = C.qrange(t)
                ctx.require(lo <= v <= hi, f"pad value {v} is outside the range of {t.name}")
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        pads = ctx.const_ints(1)
        if pads is not None and any(p < 0 for p in pads):
            raise ctx.fail("paddings must be >= 0")
        if shape is None:
            return [None]
        if pads is None:
            return [(0,) * len(shape)]
        return [_pad_shape(shape, pads)]

    def kernel(self, ctx: OpContext):
        info = ctx.inputs[0]
        dt = info.type.dtype
        has_value = self.n_inputs == 3
        default = pad_value(info)
        lo, hi = C.qrange(info.type) if info.type in C.QUANT8_TYPES else (None, None)

        def run(ins, rt):
            x = ins[0]
            pads = [int(v) for v in np.ravel(ins[1])]
            _pad_shape(x.shape, pads, strict=True)
            value = default
            if has_value:
                value = ins[2]
                if lo is not None and not lo <= int(value) <= hi:
                    raise OpError(f"PAD_V2: pad value {int(value)} out of range")
            widths = [(pads[2 * i], pads[2 * i + 1]) for i in range(x.ndim)]
            return [np.pad(x, widths, constant_values=np.asarray(value).astype(dt))]

        return run


@register(O.PAD)
class Pad(_PadBase):
    """Quantized padding is the logical zero (the zero point), as required since 1.2."""

    n_inputs = 2


@register(O.PAD_V2)
class PadV2(_PadBase):
    n_inputs = 3


# ---- MIRROR_PAD / REVERSE -------------------------------------------------------------------

#: numpy's names of the HAL's modes 0 (REFLECT) and 1 (SYMMETRIC).
_MIRROR_MODES = ("reflect", "symmetric")


def _mirror_pad_shape(shape: Sequence[int], pads: Sequence[int], mode: int | None, *,
                      strict: bool = False) -> tuple[int, ...]:
    """PAD's output shape, once each padding fits the dimension it mirrors: REFLECT leaves the
    border element out, so it mirrors at most dimension - 1 elements, SYMMETRIC at most the
    dimension. A zero padding mirrors nothing and always fits. ``mode`` None (known only at
    run time) checks SYMMETRIC's bound, which both modes need; unless ``strict``, a 0
    dimension is unknown."""
    if mode is not None and mode not in (0, 1):
        raise OpError(f"MIRROR_PAD: mode {mode} is neither 0 (REFLECT) nor 1 (SYMMETRIC)")
    out = _pad_shape(shape, pads, strict=strict, op="MIRROR_PAD")
    for i, d in enumerate(shape):
        if not (d or strict):
            continue
        limit = max(d - 1, 0) if mode == 0 else d
        for p in pads[2 * i:2 * i + 2]:
            if p > limit:
                name = _MIRROR_MODES[0 if mode == 0 else 1].upper()
                raise OpError(f"MIRROR_PAD: padding {p} of dimension {i} (size {d}) exceeds "
                              f"{limit}, the most {name} mirrors")
    return out


@register(O.MIRROR_PAD)
class MirrorPad(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, min_rank=1)
        ps, r = ctx.inputs[1].shape, ctx.inputs[0].rank
        if ps is not None:
            ctx.require(len(ps) == 2 and ps[1] in (0, 2), "paddings must have shape [rank, 2]")
            ctx.require(r is None or ps[0] in (0, r), "paddings must have shape [rank, 2]")
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape, pads, mode = ctx.inputs[0].shape, ctx.const_ints(1), ctx.const_int(2)
        if mode is not None and mode not in (0, 1):
            raise ctx.fail(f"mode {mode} is neither 0 (REFLECT) nor 1 (SYMMETRIC)")
        if shape is None:
            return [None]
        if pads is None:
            return [(0,) * len(shape)]
        return [_mirror_pad_shape(shape, pads, mode)]

    def kernel(self, ctx: OpContext):
        shape, const_pads, const_mode = ctx.inputs[0].shape, ctx.const_ints(1), ctx.const_int(2)
        # Constant paddings and mode on a shape known at prepare were checked there.
        checked = tuple(shape) if known(shape) and const_pads is not None and \
            const_mode is not None else None

        def run(ins, rt):
            x = ins[0]
            if checked is not None and x.shape == checked:
                pads, mode = const_pads, const_mode
            else:
                pads, mode = [int(v) for v in np.ravel(ins[1])], int(ins[2])
                _mirror_pad_shape(x.shape, pads, mode, strict=True)
            if x.size == 0:  # nothing to mirror (every padding of an empty axis is 0)
                return [np.zeros(_pad_shape(x.shape, pads, strict=True), x.dtype)]
            widths = [(pads[2 * i], pads[2 * i + 1]) for i in range(x.ndim)]
            return [np.pad(x, widths, mode=_MIRROR_MODES[mode])]

        return run


def _reverse_axis(axis: Sequence[int], rank: int) -> int:
    if len(axis) != 1:
        raise OpError(f"REVERSE: axis must hold one value, got {len(axis)}")
    if not 0 <= axis[0] < rank:
        raise OpError(f"REVERSE: axis {axis[0]} is not in [0, {rank})")
    return axis[0]


@register(O.REVERSE)
class Reverse(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, 1, 8)
        vector(ctx, 1, "axis", 1)
        axis, r = ctx.const_ints(1), ctx.inputs[0].rank
        if axis is not None and r is not None:
            _reverse_axis(axis, r)

    def prepare(self, ctx: OpContext):
        return [ctx.inputs[0].shape]

    def kernel(self, ctx: OpContext):
        const_axis, rank = ctx.const_ints(1), ctx.inputs[0].rank
        # A constant axis of an input of known rank was checked at validate.
        checked = const_axis[0] if const_axis is not None and rank is not None else None

        def run(ins, rt):
            x = ins[0]
            if checked is not None and x.ndim == rank:
                axis = checked
            else:
                axis = _reverse_axis([int(v) for v in np.ravel(ins[1])], x.ndim)
            return [np.flip(x, axis).copy()]

        return run


# ---- SQUEEZE / EXPAND_DIMS ------------------------------------------------------------------

def _squeeze_shape(shape: Sequence[int], axes: Sequence[int] | None, *,
                   strict: bool = False) -> tuple[int, ...]:
    rank = len(shape)
    if not axes:
        drop = {i for i, d in enumerate(shape) if d == 1}
    else:
        drop = set()
        for a in axes:
            if not -rank <= a < rank:
                raise OpError(f"SQUEEZE: axis {a} out of range for rank {rank}")
            a %= rank
            if shape[a] != 1 and (strict or shape[a] != 0):
                raise OpError(f"SQUEEZE: dimension {a} is {shape[a]}, not 1")
            drop.add(a)
    # Squeezing every dimension leaves a 1-element vector, not a scalar.
    return tuple(d for i, d in enumerate(shape) if i not in drop) or (1,)


@register(O.SQUEEZE)
class Squeeze(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, max_rank=4)
        if ctx.has_value(1):
            vector(ctx, 1, "squeeze dims")
        return self.prepare(ctx)

    @staticmethod
    def _axes_const(ctx: OpContext) -> tuple[bool, list[int] | None]:
        if not ctx.has_value(1):
            return True, None
        v = ctx.const_ints(1)
        return v is not None, v

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        is_const, axes = self._axes_const(ctx)
        if shape is None or not is_const:
            return [None]
        if not axes and any(d == 0 for d in shape):
            return [None]
        return [_squeeze_shape(shape, axes)]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            axes = None
            if len(ins) > 1 and ins[1] is not None:
                axes = [int(v) for v in np.ravel(ins[1])]
            x = ins[0]
            return [x.reshape(_squeeze_shape(x.shape, axes, strict=True))]

        return run


@register(O.EXPAND_DIMS)
class ExpandDims(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, min_rank=1)
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        axis = ctx.const_int(1)
        if shape is None:
            return [None]
        if axis is None:
            return [(0,) * (len(shape) + 1)]
        ax = C.normalize_axis(axis, len(shape) + 1)
        return [tuple(shape[:ax]) + (1,) + tuple(shape[ax:])]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            x = ins[0]
            ax = C.normalize_axis(scalar(ins[1]), x.ndim + 1)
            return [np.expand_dims(x, ax)]

        return run


# ---- TRANSPOSE ------------------------------------------------------------------------------

def _check_perm(perm: Sequence[int], rank: int) -> list[int]:
    """Validate a permutation; an empty one (like an omitted one) reverses the dimensions."""
    if not perm:
        return list(range(rank))[::-1]
    if len(perm) != rank or sorted(perm) != list(range(rank)):
        raise OpError(f"TRANSPOSE: {list(perm)} is not a permutation of rank {rank}")
    return list(perm)


@register(O.TRANSPOSE)
class Transpose(OperationDef):
    """An omitted permutation reverses the dimensions."""

    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, max_rank=4)
        if ctx.has_value(1):
            vector(ctx, 1, "perm", ctx.inputs[0].rank)
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        if shape is None:
            return [None]
        rank = len(shape)
        if not ctx.has_value(1):
            perm = _check_perm([], rank)
        else:
            perm = ctx.const_ints(1)
            if perm is None:
                return [(0,) * rank]
            perm = _check_perm(perm, rank)
        return [tuple(shape[p] for p in perm)]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            x = ins[0]
            perm = [] if len(ins) < 2 or ins[1] is None else [int(v) for v in np.ravel(ins[1])]
            perm = _check_perm(perm, x.ndim)
            return [np.ascontiguousarray(np.transpose(x, perm))]

        return run


# ---- TILE -----------------------------------------------------------------------------------

def _tile_shape(shape: Sequence[int], mult: Sequence[int]) -> tuple[int, ...]:
    if len(mult) != len(shape):
        raise OpError("TILE: multiples must have one value per input dimension")
    if any(m < 0 for m in mult):
        raise OpError("TILE: multiples must be non-negative")
    return tuple(d * m for d, m in zip(shape, mult))


@register(O.TILE)
class Tile(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, min_rank=1)
        vector(ctx, 1, "multiples", ctx.inputs[0].rank)
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        mult = ctx.const_ints(1)
        if shape is None:
            return [None]
        if mult is None:
            return [(0,) * len(shape)]
        return [_tile_shape(shape, mult)]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            mult = [int(v) for v in np.ravel(ins[1])]
            _tile_shape(ins[0].shape, mult)
            return [np.tile(ins[0], mult)]

        return run


# ---- CHANNEL_SHUFFLE ------------------------------------------------------------------------

@register(O.CHANNEL_SHUFFLE)
class ChannelShuffle(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        quant_unchanged(ctx)
        rank_between(ctx, 0, 1, 4)
        groups = ctx.const_int(1)
        ctx.require(groups is None or groups > 0, "num_groups must be positive")
        shape = ctx.inputs[0].shape
        axis = ctx.const_int(2)
        if shape is not None and axis is not None:
            ax = C.normalize_axis(axis, len(shape))
            if groups is not None and shape[ax]:
                ctx.require(shape[ax] % groups == 0, "channels must be divisible by num_groups")

    def prepare(self, ctx: OpContext):
        return [ctx.inputs[0].shape]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            x = ins[0]
            groups = scalar(ins[1])
            ax = C.normalize_axis(scalar(ins[2]), x.ndim)
            c = x.shape[ax]
            if groups <= 0 or c % groups:
                raise OpError("CHANNEL_SHUFFLE: channels must be divisible by num_groups")
            pre, post = x.shape[:ax], x.shape[ax + 1:]
            y = x.reshape(pre + (groups, c // groups) + post)
            y = np.swapaxes(y, ax, ax + 1)
            return [np.ascontiguousarray(y).reshape(x.shape)]

        return run


# ---- SPLIT ----------------------------------------------------------------------------------

@register(O.SPLIT)
class Split(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        quant_unchanged(ctx, range(len(ctx.outputs)))
        rank_between(ctx, 0, min_rank=1)
        n = ctx.const_int(2)
        if n is not None:
            ctx.require(n > 0, "num_splits must be positive")
            ctx.require(n == len(ctx.outputs), "num_splits must equal the number of outputs")
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext):
        shape = ctx.inputs[0].shape
        n = len(ctx.outputs)
        if shape is None:
            return [None] * n
        axis = ctx.const_int(1)
        if axis is None:
            return [(0,) * len(shape)] * n
        ax = C.normalize_axis(axis, len(shape))
        d = shape[ax]
        if d and d % n:
            raise ctx.fail(f"dimension {d} is not divisible by {n} splits")
        out = list(shape)
        out[ax] = d // n
        return [tuple(out)] * n

    def kernel(self, ctx: OpContext):
        n_out = len(ctx.outputs)

        def run(ins, rt):
            x = ins[0]
            ax = C.normalize_axis(scalar(ins[1]), x.ndim)
            n = scalar(ins[2])
            if n != n_out or n <= 0 or x.shape[ax] % n:
                raise OpError("SPLIT: the axis size must be divisible by num_splits")
            return [np.ascontiguousarray(p) for p in np.split(x, n, axis=ax)]

        return run


# ---- FILL / RANK ----------------------------------------------------------------------------

@register(O.FILL)
class Fill(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        vector(ctx, 0, "dims")
        dims = ctx.const_ints(0)
        ctx.require(dims is None or all(d >= 0 for d in dims), "dims must be non-negative")

    def prepare(self, ctx: OpContext):
        dims = ctx.const_ints(0)
        if dims is not None:
            return [tuple(dims)]
        s = ctx.inputs[0].shape
        return [(0,) * s[0] if s is not None and len(s) == 1 and s[0] else None]

    def kernel(self, ctx: OpContext):
        dt = ctx.outputs[0].type.dtype

        def run(ins, rt):
            dims = [int(v) for v in np.ravel(ins[0])]
            if any(d < 0 for d in dims):
                raise OpError("FILL: dims must be non-negative")
            return [np.full(dims, np.asarray(ins[1]).astype(dt), dtype=dt)]

        return run


@register(O.RANK)
class Rank(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        rank_between(ctx, 0, min_rank=1)

    def prepare(self, ctx: OpContext):
        return [()]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            return [np.asarray(np.ndim(ins[0]), dtype=np.int32)]

        return run
