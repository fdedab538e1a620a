"""org.nnhal.tflite: TFLite builtins that real models use and the HAL has no operation for.

The TFLite importer turns these builtins into this extension's operations (each claims its
builtin through ``tflite``, :mod:`nnhal.tflite.import_ext`), so a model using them imports
instead of being refused; the reference driver offers the extension, and the runtime gives
these operations to it while other devices (LiteRT) run the rest of the model.

Operand type: TENSOR_COMPLEX64 (code 0), TFLite's COMPLEX64: pairs of float32 (real,
imaginary), numpy's complex64.

Operations (code: name, after the TFLite builtin of the same name):

* 0 RFFT2D: the 2-D real FFT of the last two dimensions of a float32 tensor, cropped or
  zero-padded to ``fft_length`` (a constant int32 [2], powers of two as TFLite requires);
  complex64 output ``[..., fft_length[0], fft_length[1] / 2 + 1]``.
* 1 COMPLEX_ABS, 2 REAL, 3 IMAG: complex64 -> float32.
* 4 CUMSUM: cumulative sum of float32 or int32 along a constant axis, with TFLite's
  ``exclusive`` and ``reverse`` options as BOOL scalars.
* 5 SIGN, 6 CEIL, 7 ROUND (half to even, as TFLite's), 8 COS: element-wise on float32
  (SIGN also int32; NaN's sign is NaN).
* 9 FLOOR_MOD: float32 floor modulo of run-time tensors with broadcasting, which the HAL
  cannot compute exactly (the importer uses this only when the HAL form is refused).
* 10 GELU: float32 and 8-bit (TFLite's table of each stored value), ``approximate`` (BOOL)
  as TFLite's option (erf form, or tanh form).
* 11 GATHER_ND: float32, int32 or 8-bit quantized params, int32 indices; an index out of
  bounds fails the execution, as TFLite's kernel does.
* 12 SQUEEZE, 13 RESHAPE, 14 EXPAND_DIMS, 15 TRANSPOSE, 16 SLICE: data movement of complex64
  tensors (the HAL's operations of these names take no extension operand), with the HAL
  operations' operands and rules (constant axes, shape, axis, permutation, begin and size;
  RESHAPE's shape has no -1: the importer writes TFLite's output shape).
* 17 CAST: complex64 -> float32, the real part, as TFLite's CAST.
* 18 EQUAL, 19 NOT_EQUAL, 20 LESS, 21 LESS_EQUAL, 22 GREATER, 23 GREATER_EQUAL: two 8-bit
  tensors (scales in (0, 1)) compared as TFLite compares them, each input's stored values
  rescaled in fixed point, where the HAL compares real values (the importer uses these only
  where the two differ: scales that differ, or one too fine to rank stored values apart).
* 24 SQUARED_DIFFERENCE: int8 (x - y)^2 as TFLite's kernel computes it in fixed point (the
  HAL's SUB then MUL rounds twice where TFLite rounds once), with broadcasting.

Export: every operation goes back to its TFLite builtin (``tflite_export``: the builtin's
code, the name of the HAL operation whose export the complex64 data movement shares, or a
converter writing the builtin's options), which ai-edge-litert runs, so the LiteRT driver offers
them, within its edge sweep's rules (tests/drivers/test_litert_edges.py: XNNPACK's COS is
wrong at the float32 limits, so a model with COS runs there with XNNPACK off, or not at all).

Kernels compute as TFLite's reference kernels do, in float32 except RFFT2D (float64 FFT then
rounded to complex64; TFLite computes in double too).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from tflite.BuiltinOperator import BuiltinOperator as B
from tflite.TensorType import TensorType as TT

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import ErrorStatus, OperationType
from nnhal.hal.types import OperandType as T
from nnhal.ops.common import (
    broadcast_static,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    tflite_compare_ranks,
)
from nnhal.ops.comparison import COMPARE_FUNCS
from nnhal.ops.extensions import ExtensionDef, ExtensionOperation, OperandTypeDef, operation
from nnhal.ops.resolver import OpContext, OperationDef, OpError
from nnhal.ops.signature import Slot, Variant

#: The extension's name.
NAME = "org.nnhal.tflite"

TENSOR_COMPLEX64 = OperandTypeDef(
    NAME, 0, "TENSOR_COMPLEX64", is_tensor=True, byte_size=8, dtype=np.complex64,
    tflite=TT.COMPLEX64, doc="Complex numbers as pairs of float32 (real, imaginary), as "
    "TFLite's COMPLEX64.")

F32, I32, BOOL, BOOL8 = T.TENSOR_FLOAT32, T.TENSOR_INT32, T.BOOL, T.TENSOR_BOOL8
_V = FeatureLevel.V1_2


def _broadcast(a: tuple[int, ...] | None, b: tuple[int, ...] | None
               ) -> tuple[int, ...] | None:
    if a is None or b is None or not all(a) or not all(b):
        return None
    try:
        return broadcast_static(a, b)
    except ValueError:
        return None


def _input_shape(ctx: OpContext) -> list[tuple[int, ...] | None] | None:
    """The output shape of an operation whose output is shaped as its first input."""
    shape = ctx.inputs[0].shape
    return [tuple(shape)] if shape is not None and all(shape) else None


class _Unary(OperationDef):
    """An element-wise operation of one input; the output's type is ``out`` (None: the
    input's)."""

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray], out: Any = None):
        self.fn, self.out = fn, out

    def validate(self, ctx: OpContext) -> None:
        if self.out is None:
            ctx.require(ctx.outputs[0].type == ctx.inputs[0].type,
                        "the output's type must be the input's")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        return _input_shape(ctx)

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        fn, dtype = self.fn, ctx.outputs[0].dtype

        def run(ins, rt):  # type: ignore[no-untyped-def]
            return [np.asarray(fn(np.asarray(ins[0])), dtype)]

        return run


#: A shape as the rules below read it: None for an unknown rank, None for an unknown size.
Shape = tuple[int | None, ...] | None


def _fft_problem(lengths: list[int]) -> str | None:
    """TFLite's RFFT2D: two lengths, each a power of two."""
    if len(lengths) != 2:
        return "fft_length must be a constant of two values"
    if not all(n > 0 and n & (n - 1) == 0 for n in lengths):
        return f"fft_length values must be powers of two, got {lengths}"
    return None


def _squeeze_problem(axes: list[int], shape: Shape) -> str | None:
    if len(set(axes)) != len(axes):
        return f"the axes {axes} repeat"
    if shape is None:
        return None
    rank = len(shape)
    for a in axes:
        if not -rank <= a < rank:
            return f"axis {a} is out of range for rank {rank}"
        if shape[a] is not None and shape[a] != 1:
            return f"axis {a} has size {shape[a]}, not 1"
    if len({a % rank for a in axes}) != len(axes):
        return f"the axes {axes} repeat"
    return None


def _expand_problem(axis: int, shape: Shape) -> str | None:
    rank = None if shape is None else len(shape)
    if rank is not None and not -(rank + 1) <= axis <= rank:
        return f"axis {axis} is out of range for rank {rank}"
    return None


def _perm_problem(perm: list[int], shape: Shape) -> str | None:
    rank = None if shape is None else len(shape)
    if rank is not None and sorted(perm) != list(range(rank)):
        return f"{perm} is not a permutation of the input's {rank} axes"
    return None


def _slice_problem(begin: list[int], size: list[int], shape: Shape) -> str | None:
    if len(begin) != len(size) or (shape is not None and len(begin) != len(shape)):
        return (f"begin {begin} and size {size} must have one value per input axis")
    for k, (b, n) in enumerate(zip(begin, size)):
        d = None if shape is None else shape[k]
        if not (b >= 0 and (n == -1 or n > 0)):
            return f"axis {k}: begin {b}, size {n}"
        if d is not None and b + (1 if n == -1 else n) > d:
            return f"axis {k}: begin {b} and size {n} leave the dimension {d}"
    return None


def _ctx_shape(ctx: OpContext) -> Shape:
    shape = ctx.inputs[0].shape
    return None if shape is None else tuple(int(d) if d else None for d in shape)


class _Rfft2d(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        ctx.expect_rank(1, 1)
        lengths = ctx.const_ints(1)
        ctx.require(lengths is not None, "fft_length must be a constant of two values")
        assert lengths is not None
        why = _fft_problem(lengths)
        ctx.require(why is None, why or "")
        rank = ctx.inputs[0].rank
        ctx.require(rank is None or rank >= 2, f"the input must have rank 2 or more, got {rank}")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        shape, lengths = ctx.inputs[0].shape, ctx.const_ints(1)
        if shape is None or lengths is None:
            return None
        return [(*shape[:-2], lengths[0], lengths[1] // 2 + 1)]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        lengths = tuple(ctx.const_ints(1) or ())

        def run(ins, rt):  # type: ignore[no-untyped-def]
            x = np.asarray(ins[0], np.float64)
            return [np.fft.rfft2(x, s=lengths, axes=(-2, -1)).astype(np.complex64)]

        return run


class _Cumsum(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        axis = ctx.const_ints(1)
        ctx.require(axis is not None and len(axis) == 1, "axis must be one constant value")
        assert axis is not None
        rank = ctx.inputs[0].rank
        ctx.require(rank is None or -rank <= axis[0] < rank,
                    f"axis {axis[0]} is out of range for rank {rank}")
        ctx.require(ctx.outputs[0].type == ctx.inputs[0].type,
                    "the output's type must be the input's")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        return _input_shape(ctx)

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        axis = (ctx.const_ints(1) or [0])[0]
        exclusive = bool(np.asarray(ctx.const(2)).reshape(-1)[0])
        reverse = bool(np.asarray(ctx.const(3)).reshape(-1)[0])
        dtype = ctx.outputs[0].dtype

        def run(ins, rt):  # type: ignore[no-untyped-def]
            x = np.asarray(ins[0])
            if reverse:
                x = np.flip(x, axis)
            with np.errstate(over="ignore"):
                out = np.cumsum(x, axis=axis, dtype=dtype)
            if exclusive:
                out = np.roll(out, 1, axis=axis)
                idx = [slice(None)] * out.ndim
                idx[axis] = slice(0, 1)
                out[tuple(idx)] = 0
            if reverse:
                out = np.flip(out, axis)
            return [np.ascontiguousarray(out, dtype)]

        return run


class _Broadcasting(OperationDef):
    """A binary operation whose two inputs broadcast (checked where both shapes are known)
    to its output's shape."""

    def validate(self, ctx: OpContext) -> None:
        a, b = ctx.inputs[0].shape, ctx.inputs[1].shape
        if a is not None and b is not None and all(a) and all(b):
            ctx.require(_broadcast(tuple(a), tuple(b)) is not None,
                        f"shapes {list(a)} and {list(b)} do not broadcast")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        shape = _broadcast(ctx.inputs[0].shape and tuple(ctx.inputs[0].shape),
                           ctx.inputs[1].shape and tuple(ctx.inputs[1].shape))
        return None if shape is None else [shape]


class _FloorMod(_Broadcasting):

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        def run(ins, rt):  # type: ignore[no-untyped-def]
            x, y = np.asarray(ins[0], np.float32), np.asarray(ins[1], np.float32)
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.fmod(x, y)
                fix = (r != 0) & ((y < 0) != (r < 0))
                return [np.where(fix, r + y, r).astype(np.float32)]

        return run


class _QuantCompare(_Broadcasting):
    """Two 8-bit tensors compared as TFLite compares them: the ranks of
    :func:`~nnhal.ops.common.tflite_compare_ranks` (each input's per stored value, a table
    of 256 made at prepare), with broadcasting."""

    def __init__(self, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
        self.fn = fn

    def validate(self, ctx: OpContext) -> None:
        a, b = ctx.inputs[0], ctx.inputs[1]
        ctx.require(b.type == a.type, "both inputs must be of one type")
        for k, x in enumerate((a, b)):
            ctx.require(0.0 < x.scale < 1.0, f"input {k}'s scale {x.scale} must lie in (0, 1) "
                        f"(TFLite's rescale of a larger one is undefined)")
        super().validate(ctx)

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        lo = -128 if ctx.inputs[0].type == Q8S else 0
        q = np.arange(lo, lo + 256)
        ra, rb = (tflite_compare_ranks(q, x.scale, x.zero_point) for x in ctx.inputs[:2])
        fn = self.fn

        def run(ins, rt):  # type: ignore[no-untyped-def]
            a, b = np.asarray(ins[0]), np.asarray(ins[1])
            return [fn(ra[a.astype(np.int64) - lo], rb[b.astype(np.int64) - lo])]

        return run


def _squared_difference_params(a: Any, b: Any, out: Any) -> tuple | None:
    """TFLite's int8 SQUARED_DIFFERENCE's fixed point: each input's (q - zero point) << 7
    times its scale over twice the larger one, their difference squared, times that doubled
    scale squared over 2^14 x the output's; (multiplier, shift) of each of the three, or None
    where a multiplier is not below 1 (TFLite's Prepare aborts the process there)."""
    twice = float(np.float32(2) * max(np.float32(a.scale), np.float32(b.scale)))
    reals = (float(np.float32(a.scale)) / twice, float(np.float32(b.scale)) / twice,
             twice * twice / float(np.float32(1 << 14) * np.float32(out.scale)))
    if not all(0.0 < r < 1.0 for r in reals):
        return None
    return tuple(quantize_multiplier(r) for r in reals)


class _QuantSquaredDifference(_Broadcasting):
    """int8 (x - y)^2 as TFLite's kernel computes it (:func:`_squared_difference_params`),
    with broadcasting."""

    def validate(self, ctx: OpContext) -> None:
        a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        ctx.require(b.type == a.type == out.type, "the inputs and the output must be of one type")
        ctx.require(_squared_difference_params(a, b, out) is not None,
                    "the scales give a multiplier of 1 or more (TFLite's kernel refuses them)")
        super().validate(ctx)

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        (ma, sa), (mb, sb), (mo, so) = _squared_difference_params(a, b, out)  # type: ignore[misc]
        q = np.arange(-128, 128, dtype=np.int64)
        ra = multiply_by_quantized_multiplier((q - a.zero_point) << 7, ma, sa)
        rb = multiply_by_quantized_multiplier((q - b.zero_point) << 7, mb, sb)
        zo = out.zero_point

        def run(ins, rt):  # type: ignore[no-untyped-def]
            d = ra[np.asarray(ins[0], np.int64) + 128] - rb[np.asarray(ins[1], np.int64) + 128]
            r = multiply_by_quantized_multiplier(d * d, mo, so) + zo
            return [np.clip(r, -128, 127).astype(np.int8)]

        return run


def _erf(x: np.ndarray) -> np.ndarray:
    """erf in float64 to within 1.5e-7 (Abramowitz and Stegun 7.1.26): numpy has none, and
    a per-element math.erf would make the kernel slow."""
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (
        -1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def _gelu_scalar(x: float, approximate: bool) -> float:
    """GELU of one value in double, rounded to float32 (an 8-bit table's entry)."""
    if approximate:
        return float(np.float32(0.5 * x * (1.0 + math.tanh(
            math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))))
    return float(np.float32(0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))))


class _Gelu(OperationDef):
    """x * P(X <= x) for a standard normal X, or TFLite's tanh approximation of it."""

    def validate(self, ctx: OpContext) -> None:
        ctx.require(ctx.outputs[0].type == ctx.inputs[0].type,
                    "the output's type must be the input's")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        return _input_shape(ctx)

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        approximate = bool(np.asarray(ctx.const(1)).reshape(-1)[0])
        x_info, y_info = ctx.inputs[0], ctx.outputs[0]
        if x_info.type in (Q8, Q8S):
            # TFLite's table: each stored value dequantized in float32, GELU, times the
            # inverse output scale in float32, rounded half away from zero, clamped.
            lo = -128 if x_info.type == Q8S else 0
            f32 = np.float32
            real = f32(x_info.scale) * (np.arange(lo, lo + 256) - x_info.zero_point
                                        ).astype(f32)
            g = np.array([_gelu_scalar(float(v), approximate) for v in real], f32)
            scaled = g * (f32(1) / f32(y_info.scale))
            q = np.trunc(scaled + np.copysign(f32(0.5), scaled)) + y_info.zero_point
            table = np.clip(q, lo, lo + 255).astype(x_info.type.dtype)

            def run_table(ins, rt):  # type: ignore[no-untyped-def]
                return [table[np.asarray(ins[0], np.int64) - lo]]

            return run_table

        def run(ins, rt):  # type: ignore[no-untyped-def]
            x = np.asarray(ins[0], np.float64)
            if approximate:
                y = 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
            else:
                y = 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
            return [y.astype(np.float32)]

        return run


class _GatherNd(OperationDef):
    """params[indices[..., :]]: slices of ``params`` named by the last axis of ``indices``."""

    def validate(self, ctx: OpContext) -> None:
        p, i, o = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        ctx.require(o.type == p.type, "the output's type must be params'")
        ctx.require((o.scale, o.zero_point) == (p.scale, p.zero_point),
                    "the output's scale and zero point must be params'")
        if i.shape is not None and p.shape is not None and i.shape and i.shape[-1]:
            ctx.require(1 <= i.shape[-1] <= len(p.shape),
                        f"indices' last dimension {i.shape[-1]} must be in [1, rank of params "
                        f"{len(p.shape)}]")
        ctx.require(i.shape is None or len(i.shape) >= 1, "indices must have rank 1 or more")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        p, i = ctx.inputs[0].shape, ctx.inputs[1].shape
        if p is None or i is None or not all(p) or not all(i):
            return None
        return [(*i[:-1], *p[i[-1]:])]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        def run(ins, rt):  # type: ignore[no-untyped-def]
            params, idx = np.asarray(ins[0]), np.asarray(ins[1], np.int64)
            k = idx.shape[-1]
            bound = np.asarray(params.shape[:k])
            if idx.size and (np.any(idx < 0) or np.any(idx >= bound)):
                raise _fail("GATHER_ND: an index is out of bounds")
            return [np.ascontiguousarray(params[tuple(np.moveaxis(idx, -1, 0))])]

        return run


def _require_c64(ctx: OpContext) -> None:
    ctx.require(ctx.outputs[0].type == ctx.inputs[0].type,
                "the output's type must be the input's")


def _known(shape: Any) -> bool:
    return shape is not None and all(shape)


class _Squeeze(OperationDef):
    """The HAL's SQUEEZE on complex64: the named size-1 axes dropped."""

    def validate(self, ctx: OpContext) -> None:
        _require_c64(ctx)
        axes = ctx.const_ints(1)
        ctx.require(axes is not None, "the axes must be a constant")
        assert axes is not None
        why = _squeeze_problem(axes, _ctx_shape(ctx))
        ctx.require(why is None, why or "")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        shape, axes = ctx.inputs[0].shape, ctx.const_ints(1) or []
        if shape is None:
            return None
        drop = {a % len(shape) for a in axes}
        return [tuple(d for k, d in enumerate(shape) if k not in drop)]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        axes = tuple(ctx.const_ints(1) or ())

        def run(ins, rt):  # type: ignore[no-untyped-def]
            return [np.squeeze(np.asarray(ins[0]), axis=axes)]

        return run


class _Reshape(OperationDef):
    """The HAL's RESHAPE on complex64, with a constant shape of positive sizes."""

    def validate(self, ctx: OpContext) -> None:
        _require_c64(ctx)
        shape = ctx.const_ints(1)
        ctx.require(shape is not None, "the shape must be a constant")
        assert shape is not None
        ctx.require(all(d > 0 for d in shape), f"the shape {shape} must have positive sizes")
        src = ctx.inputs[0].shape
        if _known(src):
            n_in, n_out = math.prod(map(int, src)), math.prod(map(int, shape))  # exact
            ctx.require(n_in == n_out, f"the shape {shape} holds {n_out} elements, the input "
                        f"{n_in}")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        shape = ctx.const_ints(1)
        return None if shape is None else [tuple(shape)]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        shape = tuple(ctx.const_ints(1) or ())

        def run(ins, rt):  # type: ignore[no-untyped-def]
            x = np.asarray(ins[0])
            if x.size != int(np.prod(shape, dtype=np.int64)):
                raise _fail(f"RESHAPE: {x.size} elements do not fill shape {list(shape)}")
            return [x.reshape(shape)]

        return run


class _ExpandDims(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        _require_c64(ctx)
        axis = ctx.const_int(1)
        ctx.require(axis is not None, "the axis must be a constant")
        assert axis is not None
        why = _expand_problem(axis, _ctx_shape(ctx))
        ctx.require(why is None, why or "")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        shape, axis = ctx.inputs[0].shape, ctx.const_int(1)
        if shape is None or axis is None:
            return None
        k = axis % (len(shape) + 1)
        return [(*shape[:k], 1, *shape[k:])]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        axis = int(ctx.const_int(1) or 0)

        def run(ins, rt):  # type: ignore[no-untyped-def]
            return [np.expand_dims(np.asarray(ins[0]), axis)]

        return run


class _Transpose(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        _require_c64(ctx)
        perm = ctx.const_ints(1)
        ctx.require(perm is not None, "the permutation must be a constant")
        assert perm is not None
        why = _perm_problem(perm, _ctx_shape(ctx))
        ctx.require(why is None, why or "")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        shape, perm = ctx.inputs[0].shape, ctx.const_ints(1)
        if shape is None or perm is None or sorted(perm) != list(range(len(shape))):
            return None
        return [tuple(shape[p] for p in perm)]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        perm = tuple(ctx.const_ints(1) or ())

        def run(ins, rt):  # type: ignore[no-untyped-def]
            return [np.ascontiguousarray(np.transpose(np.asarray(ins[0]), perm))]

        return run


class _Slice(OperationDef):
    """The HAL's SLICE on complex64: ``size`` -1 takes the rest of the axis."""

    def validate(self, ctx: OpContext) -> None:
        _require_c64(ctx)
        begin, size = ctx.const_ints(1), ctx.const_ints(2)
        ctx.require(begin is not None and size is not None, "begin and size must be constants")
        assert begin is not None and size is not None
        why = _slice_problem(begin, size, _ctx_shape(ctx))
        ctx.require(why is None, why or "")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        shape, begin, size = ctx.inputs[0].shape, ctx.const_ints(1), ctx.const_ints(2)
        if shape is None or begin is None or size is None or len(size) != len(shape):
            return None
        return [tuple((d - b if d else 0) if n == -1 else n
                      for d, b, n in zip(shape, begin, size))]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        begin, size = ctx.const_ints(1) or [], ctx.const_ints(2) or []

        def run(ins, rt):  # type: ignore[no-untyped-def]
            x = np.asarray(ins[0])
            idx = []
            for d, b, n in zip(x.shape, begin, size):
                end = d if n == -1 else b + n
                if end > d:
                    raise _fail(f"SLICE: {b} + {n} is past the dimension {d}")
                idx.append(slice(b, end))
            return [np.ascontiguousarray(x[tuple(idx)])]

        return run


def _sign(x: np.ndarray) -> np.ndarray:
    """TFLite's SIGN: NaN stays NaN (ai-edge-litert's kernel), -0.0 gives 0."""
    return np.sign(x) + np.zeros((), x.dtype)


# ---- converters from TFLite operators -------------------------------------------------------

def _cumsum_from_tflite(call: Any) -> tuple[list[int], list[int]]:
    call.expect(2)
    opts = call.options("CumsumOptions")
    if call.value(1) is None:
        raise call.refuse("the axis must be a constant")
    t, at = call.tensor(0), call.tensor(1)
    if at is None or at.ttype != TT.INT32 or np.size(call.value(1)) != 1:
        raise call.refuse("the axis must be one int32 value (TFLite's kernel refuses others)")
    if t is None or t.ttype not in (TT.FLOAT32, TT.INT32):
        raise call.refuse("the extension's CUMSUM takes float32 or int32")
    axis = np.asarray(call.value(1), np.int32).reshape(-1)
    ins = [call.input(0), call.constant(I32, axis), call.scalar(BOOL, bool(opts.Exclusive())),
           call.scalar(BOOL, bool(opts.Reverse()))]
    return ins, [call.output(0)]


def _rfft2d_from_tflite(call: Any) -> tuple[list[int], list[int]]:
    call.expect(2)
    if call.value(1) is None:
        raise call.refuse("fft_length must be a constant")
    _refuse_if(call, _fft_problem(_const_input(call, 1, "fft_length").tolist()))
    t = call.tensor(0)
    if t is None or t.ttype != TT.FLOAT32 or (t.has_rank and len(t.shape) < 2):
        raise call.refuse("the input must be float32 of rank 2 or more")
    out = call.tensor(0, output=True)
    if t.static and out is not None and out.static:
        n0, n1 = _const_input(call, 1, "fft_length").tolist()
        want = [*t.shape[:-2], n0, n1 // 2 + 1]  # TFLite's Prepare resizes the output so
        if list(out.shape) != want:
            raise call.refuse(f"the output's declared shape {list(out.shape)} is not the "
                              f"{want} fft_length {[n0, n1]} gives")
    return [call.input(0), call.input(1)], [call.output(0)]


def _from_complex(call: Any) -> tuple[list[int], list[int]]:
    """COMPLEX_ABS, REAL, IMAG: complex64 in, float32 out (TFLite's Prepare refuses others)."""
    call.expect(1)
    _complex_only(call)
    out = call.tensor(0, output=True)
    if out is None or out.ttype != TT.FLOAT32:
        raise call.refuse("the output must be float32")
    return [call.input(0)], [call.output(0)]


def _gelu_from_tflite(call: Any) -> tuple[list[int], list[int]]:
    call.expect(1)
    approximate = bool(call.options("GeluOptions").Approximate())
    return [call.input(0), call.scalar(BOOL, approximate)], [call.output(0)]


def _complex_only(call: Any) -> None:
    t = call.tensor(0)
    if t is None or t.ttype != TT.COMPLEX64:
        raise call.refuse("the extension's form takes complex64 only")


def _refuse_if(call: Any, why: str | None) -> None:
    """The operation's own rule checked at import: TFLite's Prepare refuses the file too."""
    if why is not None:
        raise call.refuse(why)


def _call_shape(call: Any) -> Shape:
    t = call.tensor(0)
    return None if t is None or not t.has_rank else tuple(
        int(d) if d > 0 else None for d in t.shape)


def _const_input(call: Any, k: int, what: str) -> np.ndarray:
    v = call.value(k)
    if v is None:
        raise call.refuse(f"the {what} must be a constant")
    return np.asarray(v, np.int64).reshape(-1)


def _squeeze_from_tflite(call: Any) -> tuple[list[int], list[int]]:
    call.expect(1)
    _complex_only(call)
    axes = [int(a) for a in call.options("SqueezeOptions").SqueezeDimsAsNumpy()
            ] if call.options("SqueezeOptions").SqueezeDimsLength() else []
    if not axes:  # every size-1 axis, as TFLite's kernel squeezes them
        t = call.tensor(0)
        if not t.static:
            raise call.refuse("squeezing every size-1 axis needs the input's shape")
        axes = [k for k, d in enumerate(t.shape) if d == 1]
        if not axes:
            raise call.refuse("the input has no size-1 axis to squeeze")
    _refuse_if(call, _squeeze_problem(axes, _call_shape(call)))
    return [call.input(0), call.constant(I32, np.asarray(axes, np.int32))], [call.output(0)]


def _reshape_from_tflite(call: Any) -> tuple[list[int], list[int]]:
    if call.n_inputs not in (1, 2) or call.n_outputs != 1:
        call.expect(2)
    _complex_only(call)
    out = call.tensor(0, output=True)
    if out is None or not out.static:
        raise call.refuse("the output's shape must be known")
    target = call.reshape_target()  # TFLite's, which the declared shape only hints at
    if target is None or target != list(out.shape):
        raise call.refuse(f"the new shape {target if target is not None else '(run time)'} "
                          f"is not the output's declared {list(out.shape)}")
    shape = np.asarray(out.shape, np.int32)
    return [call.input(0), call.constant(I32, shape)], [call.output(0)]


def _expand_dims_from_tflite(call: Any) -> tuple[list[int], list[int]]:
    call.expect(2)
    _complex_only(call)
    axis = _const_input(call, 1, "axis")
    if axis.size != 1:
        raise call.refuse(f"the axis must be one value, got {axis.tolist()}")
    _refuse_if(call, _expand_problem(int(axis[0]), _call_shape(call)))
    return [call.input(0), call.scalar(T.INT32, int(axis[0]))], [call.output(0)]


def _transpose_from_tflite(call: Any) -> tuple[list[int], list[int]]:
    call.expect(2)
    _complex_only(call)
    perm = _const_input(call, 1, "permutation")
    _refuse_if(call, _perm_problem(perm.tolist(), _call_shape(call)))
    return [call.input(0), call.constant(I32, perm.astype(np.int32))], [call.output(0)]


def _slice_from_tflite(call: Any) -> tuple[list[int], list[int]]:
    call.expect(3)
    _complex_only(call)
    begin, size = _const_input(call, 1, "begin"), _const_input(call, 2, "size")
    _refuse_if(call, _slice_problem(begin.tolist(), size.tolist(), _call_shape(call)))
    return [call.input(0), call.constant(I32, begin.astype(np.int32)),
            call.constant(I32, size.astype(np.int32))], [call.output(0)]


def _cast_from_tflite(call: Any) -> tuple[list[int], list[int]]:
    call.expect(1)
    _complex_only(call)
    out = call.tensor(0, output=True)
    if out is None or out.ttype != TT.FLOAT32:
        raise call.refuse("the extension's CAST gives float32 only (the real part)")
    return [call.input(0)], [call.output(0)]


def _cumsum_to_tflite(cx: Any) -> None:
    cx.emit(B.CUMSUM, [cx.t(0), cx.t(1)], [cx.o()], "CumsumOptions",
            Exclusive=bool(cx.scalar(2)), Reverse=bool(cx.scalar(3)))


def _gelu_to_tflite(cx: Any) -> None:
    cx.emit(B.GELU, [cx.t(0)], [cx.o()], "GeluOptions", Approximate=bool(cx.scalar(1)))


def _op(code: int, name: str, inputs: Any, outputs: Any, definition: OperationDef, doc: str,
        builtin: int, convert: Any = None, variants: Any = (), export: Any = None
        ) -> ExtensionOperation:
    return operation(NAME, code, name, inputs, outputs, definition, variants, doc,
                     tflite=(builtin,), tflite_convert=convert, tflite_export=export)


C64 = (TENSOR_COMPLEX64,)  # a slot takes a tuple of extension types
_FLOAT_OR_INT = [Variant({"T": F32}, _V), Variant({"T": I32}, _V)]

RFFT2D = _op(0, "RFFT2D", [Slot("input", F32), Slot("fft_length", I32, const=True)],
             [Slot("output", C64)], _Rfft2d(),
             "2-D real FFT of the last two dimensions (TFLite RFFT2D)", B.RFFT2D,
             _rfft2d_from_tflite, export=B.RFFT2D)
COMPLEX_ABS = _op(1, "COMPLEX_ABS", [Slot("input", C64)], [Slot("output", F32)],
                  _Unary(lambda z: np.abs(z), F32), "|z| of each element", B.COMPLEX_ABS,
                  _from_complex, export=B.COMPLEX_ABS)
REAL = _op(2, "REAL", [Slot("input", C64)], [Slot("output", F32)],
           _Unary(lambda z: z.real, F32), "the real part of each element", B.REAL,
           _from_complex, export=B.REAL)
IMAG = _op(3, "IMAG", [Slot("input", C64)], [Slot("output", F32)],
           _Unary(lambda z: z.imag, F32), "the imaginary part of each element", B.IMAG,
           _from_complex, export=B.IMAG)
CUMSUM = _op(4, "CUMSUM", [Slot("input", "T"), Slot("axis", I32, const=True),
                           Slot("exclusive", BOOL, const=True),
                           Slot("reverse", BOOL, const=True)],
             [Slot("output", "T")], _Cumsum(), "cumulative sum along an axis (TFLite CUMSUM)",
             B.CUMSUM, _cumsum_from_tflite, _FLOAT_OR_INT, _cumsum_to_tflite)
SIGN = _op(5, "SIGN", [Slot("input", "T")], [Slot("output", "T")], _Unary(_sign),
           "-1, 0 or 1 by the sign of each element (NaN for NaN)", B.SIGN,
           variants=_FLOAT_OR_INT, export=B.SIGN)
CEIL = _op(6, "CEIL", [Slot("input", F32)], [Slot("output", F32)], _Unary(np.ceil),
           "the ceiling of each element", B.CEIL, export=B.CEIL)
ROUND = _op(7, "ROUND", [Slot("input", F32)], [Slot("output", F32)], _Unary(np.rint),
            "each element rounded to the nearest integer, halves to even", B.ROUND,
            export=B.ROUND)
COS = _op(8, "COS", [Slot("input", F32)], [Slot("output", F32)], _Unary(np.cos),
          "the cosine of each element", B.COS, export=B.COS)
FLOOR_MOD = _op(9, "FLOOR_MOD", [Slot("x", F32), Slot("y", F32)], [Slot("output", F32)],
                _FloorMod(), "x - floor(x / y) * y as TFLite computes it (fmod, then the "
                "divisor added when the signs differ), with broadcasting", B.FLOOR_MOD,
                export=B.FLOOR_MOD)

Q8, Q8S = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
GELU = _op(10, "GELU", [Slot("input", "T"), Slot("approximate", BOOL, const=True)],
           [Slot("output", "T")], _Gelu(),
           "x * Phi(x), or its tanh approximation (TFLite GELU; 8-bit through TFLite's table of "
           "each stored value)", B.GELU, _gelu_from_tflite,
           [Variant({"T": t}, _V) for t in (F32, Q8, Q8S)], _gelu_to_tflite)
GATHER_ND = _op(11, "GATHER_ND", [Slot("params", "T"), Slot("indices", I32)],
                [Slot("output", "T")], _GatherNd(),
                "slices of params named by the last axis of indices (TFLite GATHER_ND)",
                B.GATHER_ND, variants=[Variant({"T": t}, _V) for t in (F32, I32, Q8, Q8S)],
                export=B.GATHER_ND)

_Q8_PAIR = [Slot("input0", "T"), Slot("input1", "T", doc="broadcast against input0")]
_Q8_VARIANTS = [Variant({"T": t}, _V) for t in (Q8, Q8S)]


def _compare_op(code: int, name: str) -> ExtensionOperation:
    builtin = getattr(B, name)
    return _op(code, name, _Q8_PAIR, [Slot("output", BOOL8)],
               _QuantCompare(COMPARE_FUNCS[OperationType[name]]),
               f"8-bit {name} as TFLite computes it: each input's stored values rescaled in "
               f"fixed point (scales in (0, 1)), compared; the importer uses it where the "
               f"HAL's comparison of real values differs", builtin, variants=_Q8_VARIANTS,
               export=builtin)


EQUAL = _compare_op(18, "EQUAL")
NOT_EQUAL = _compare_op(19, "NOT_EQUAL")
LESS = _compare_op(20, "LESS")
LESS_EQUAL = _compare_op(21, "LESS_EQUAL")
GREATER = _compare_op(22, "GREATER")
GREATER_EQUAL = _compare_op(23, "GREATER_EQUAL")

SQUARED_DIFFERENCE = _op(
    24, "SQUARED_DIFFERENCE", _Q8_PAIR, [Slot("output", "T")], _QuantSquaredDifference(),
    "int8 (x - y)^2 as TFLite's kernel computes it (each input rescaled to twice the larger "
    "scale in fixed point, the difference squared, rescaled to the output), with broadcasting",
    B.SQUARED_DIFFERENCE, variants=[Variant({"T": Q8S}, _V)], export=B.SQUARED_DIFFERENCE)

_AXES = Slot("axes", I32, const=True)
SQUEEZE = _op(12, "SQUEEZE", [Slot("input", C64), _AXES], [Slot("output", C64)], _Squeeze(),
              "the HAL's SQUEEZE of complex64 (constant axes)", B.SQUEEZE,
              _squeeze_from_tflite, export="SQUEEZE")
RESHAPE = _op(13, "RESHAPE", [Slot("input", C64), Slot("shape", I32, const=True)],
              [Slot("output", C64)], _Reshape(),
              "the HAL's RESHAPE of complex64 (a constant shape, no -1)", B.RESHAPE,
              _reshape_from_tflite, export="RESHAPE")
EXPAND_DIMS = _op(14, "EXPAND_DIMS", [Slot("input", C64), Slot("axis", T.INT32, const=True)],
                  [Slot("output", C64)], _ExpandDims(),
                  "the HAL's EXPAND_DIMS of complex64 (a constant axis)", B.EXPAND_DIMS,
                  _expand_dims_from_tflite, export="EXPAND_DIMS")
TRANSPOSE = _op(15, "TRANSPOSE", [Slot("input", C64), Slot("perm", I32, const=True)],
                [Slot("output", C64)], _Transpose(),
                "the HAL's TRANSPOSE of complex64 (a constant permutation)", B.TRANSPOSE,
                _transpose_from_tflite, export="TRANSPOSE")
SLICE = _op(16, "SLICE", [Slot("input", C64), Slot("begin", I32, const=True),
                          Slot("size", I32, const=True)], [Slot("output", C64)], _Slice(),
            "the HAL's SLICE of complex64 (constant begin and size)", B.SLICE,
            _slice_from_tflite, export="SLICE")
CAST = _op(17, "CAST", [Slot("input", C64)], [Slot("output", F32)],
           _Unary(lambda z: z.real, F32), "complex64 to float32: the real part (TFLite CAST)",
           B.CAST, _cast_from_tflite, export=B.CAST)

#: The extension (registered by :mod:`nnhal.ops.extensions` itself: see its ``SHIPPED``).
EXTENSION = ExtensionDef(
    NAME, (TENSOR_COMPLEX64,),
    (RFFT2D, COMPLEX_ABS, REAL, IMAG, CUMSUM, SIGN, CEIL, ROUND, COS, FLOOR_MOD, GELU,
     GATHER_ND, SQUEEZE, RESHAPE, EXPAND_DIMS, TRANSPOSE, SLICE, CAST, EQUAL, NOT_EQUAL, LESS,
     LESS_EQUAL, GREATER, GREATER_EQUAL, SQUARED_DIFFERENCE),
    doc="TFLite builtins with no HAL operation (nnhal's TFLite importer maps them here).")


def _fail(message: str) -> OpError:
    return OpError(f"{NAME}: {message}", ErrorStatus.GENERAL_FAILURE)


__all__ = ["EXTENSION", "NAME", "TENSOR_COMPLEX64"]
