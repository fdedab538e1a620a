"""The state of converting one TFLite subgraph into one HAL subgraph: which HAL operand holds
each tensor, how a tensor's type becomes an operand type, and the small helpers converters
use to add scalars, temporaries and operations."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np
from tflite.TensorType import TensorType as TT

from nnhal.hal.builder import SubgraphBuilder
from nnhal.hal.types import (
    ChannelScales,
    OperandLifeTime,
    OperandType,
    OperationType,
    SymmPerChannelQuantParams,
)
from nnhal.tflite import schema
from nnhal.tflite.import_read import OpInfo, SubgraphInfo, TfliteTensor, default_options

T = OperandType
O = OperationType
L = OperandLifeTime


class Unimportable(Exception):
    """An operator (or tensor) with no exact HAL equivalent; the message says why."""


#: (HAL type, scale, zero point, channel quantization) of a tensor.
HalType = tuple[OperandType, float, int, SymmPerChannelQuantParams | None]

#: The extension table of the model being imported (:class:`nnhal.tflite.import_ext.
#: ExtensionTable`): a tensor of a type the HAL lacks takes the extension type standing for it.
EXTENSION_TYPES: ContextVar[Any] = ContextVar("nnhal_tflite_extensions", default=None)


def hal_type(t: TfliteTensor) -> HalType:
    """The HAL operand type of a tensor, from its TFLite type and quantization.

    Asked several times per tensor (by the converter of each operator reading it, then for
    its operand), so the answer is kept on the tensor while its type and quantization stay
    the same objects; a per-channel one is checked and frozen (ChannelScales) once, each
    caller getting its own SymmPerChannelQuantParams around the shared frozen scales."""
    memo = t.hal_memo
    if memo is not None and memo[0] is t.scales and memo[1] is t.zero_points and \
            memo[2] == t.ttype and memo[3] == t.qdim:
        ht, sc, zp, cs = memo[4]
        return ht, sc, zp, None if cs is None else SymmPerChannelQuantParams(cs, t.qdim)
    got = _hal_type(t)
    if isinstance(got[0], T):  # not an extension's type (its table is the caller's context)
        cq = got[3]
        t.hal_memo = (t.scales, t.zero_points, t.ttype, t.qdim,
                      (*got[:3], None if cq is None else cq.scales))
    return got


def _hal_type(t: TfliteTensor) -> HalType:
    tt = t.ttype
    if tt == TT.FLOAT32:
        return T.TENSOR_FLOAT32, 0.0, 0, None
    if tt == TT.FLOAT16:
        return T.TENSOR_FLOAT16, 0.0, 0, None
    if tt == TT.BOOL:
        return T.TENSOR_BOOL8, 0.0, 0, None
    if tt == TT.INT32:
        scale = float(t.scales[0]) if t.quantized and t.scales.size == 1 else 0.0
        return T.TENSOR_INT32, scale, 0, None
    if tt in (TT.UINT8, TT.INT8, TT.INT16):
        if not t.quantized:
            raise Unimportable(f"{t.describe()} is {t.type_name} without quantization parameters")
        if t.scales.size == 1:  # per tensor (most): no array arithmetic
            one = float(t.scales[0])
            if not (one > 0 and math.isfinite(one)):
                raise Unimportable(f"{t.describe()} has a non-positive quantization scale")
        elif np.any(t.scales <= 0) or not np.all(np.isfinite(t.scales)):
            raise Unimportable(f"{t.describe()} has a non-positive quantization scale")
        if t.scales.size > 1:
            if tt != TT.INT8 or np.any(t.zero_points != 0):
                raise Unimportable(f"{t.describe()}: per-channel quantization is only for int8 "
                                   f"with zero points 0 in the HAL")
            return (T.TENSOR_QUANT8_SYMM_PER_CHANNEL, 0.0, 0,
                    SymmPerChannelQuantParams(ChannelScales(t.scales), t.qdim))
        scale, zp = float(t.scales[0]), int(t.zero_points[0])
        if tt == TT.UINT8:
            return T.TENSOR_QUANT8_ASYMM, scale, zp, None
        if tt == TT.INT8:
            return T.TENSOR_QUANT8_ASYMM_SIGNED, scale, zp, None
        if zp != 0:
            raise Unimportable(f"{t.describe()} is int16 with zero point {zp} (the HAL's "
                               f"TENSOR_QUANT16_SYMM has zero point 0)")
        return T.TENSOR_QUANT16_SYMM, scale, 0, None
    table = EXTENSION_TYPES.get()
    raw = table.tensor_type(t) if table is not None else None
    if raw is not None:
        return raw, 0.0, 0, None  # type: ignore[return-value]
    raise Unimportable(f"{t.describe()} has type {t.type_name}, which has no HAL operand type")


def hal_dims(t: TfliteTensor) -> list[int]:
    """A tensor's HAL dimensions: a TFLite scalar (rank 0) is [1], since a HAL tensor operand
    without dimensions means one of unknown rank."""
    return list(t.shape) or [1]


def operand_dtype(t: OperandType) -> np.dtype:
    if type(t) is OperandType:
        return _OPERAND_DTYPES[t]
    if int(t) >> 16:  # an extension operand type of the model being imported
        table = EXTENSION_TYPES.get()
        found = table.dtype(int(t)) if table is not None else None
        if found is None:
            raise Unimportable(f"no numpy type for extension operand type {int(t):#x}")
        return found
    return np.dtype(np.uint8) if t == T.TENSOR_BOOL8 else np.dtype(t.dtype)


#: :func:`operand_dtype` of each HAL operand type (looked up per constant).
_OPERAND_DTYPES: dict[OperandType, np.dtype] = {
    t: np.dtype(np.uint8) if t == T.TENSOR_BOOL8 else np.dtype(t.dtype) for t in OperandType}


class Context:
    """Converts one subgraph. ``operands`` maps tensor index -> HAL operand index once the
    tensor has one (inputs at the start, operator outputs as they are converted)."""

    def __init__(self, sg: SubgraphInfo, sb: SubgraphBuilder, outputs: Sequence[int],
                 subgraph_ref: Callable[[int, SubgraphBuilder], int] | None = None):
        self.sg, self.sb = sg, sb
        self.operands: dict[int, int] = {}
        #: The constant operands made by :meth:`x`: (override bytes or None, operand) per key.
        self._consts: dict[tuple, tuple[tuple[bytes | None, int], ...]] = {}
        #: Tensor indexes that are outputs of this HAL subgraph (first producer wins).
        self.wanted_outputs = set(outputs)
        self.output_operands: dict[int, int] = {}
        self.pending: list[tuple[int, list[int], list[int]]] = []
        self.op: OpInfo | None = None
        #: Tensors whose producer was refused (their readers are not reported again).
        self.poisoned: set[int] = set()
        #: The main subgraph's variables (resource variables and variable tensors).
        self.variables: Any = None
        self.subgraph_ref = subgraph_ref

    # ---- tensors ---------------------------------------------------------------------------

    def t(self, i: int) -> TfliteTensor:
        return self.sg.tensors[i]

    def value(self, i: int) -> np.ndarray | None:
        return None if i < 0 else self.sg.tensors[i].value

    def need_value(self, i: int, what: str) -> np.ndarray:
        v = self.value(i)
        if v is None:
            raise Unimportable(f"{what} must be a constant")
        return v

    def x(self, i: int, *, type_: OperandType | None = None, scale: float | None = None,
          zero_point: int | None = None, dims: Sequence[int] | None = None,
          value: np.ndarray | None = None) -> int:
        """The HAL operand holding tensor ``i`` as an input of an operation; constants are
        made here (one operand per distinct override)."""
        t = self.sg.tensors[i]
        if value is None and t.value is None and i in self.operands:
            return self.operands[i]
        v = value if value is not None else t.value
        if v is None:
            raise Unimportable(f"{t.describe()} is read before any operator writes it")
        ht, sc, zp, cq = hal_type(t) if type_ is None else (type_, 0.0, 0, None)
        sc = sc if scale is None else scale
        zp = zp if zero_point is None else zero_point
        shape = tuple(dims) if dims is not None else \
            v.shape if type(v) is np.ndarray else tuple(np.shape(v))
        if not shape:
            shape = (1,)
        override = None if value is None else np.asarray(value).tobytes()
        # An override's bytes are compared, not hashed: hashing a megabyte index constant
        # (BirdNET's framing GATHER) costs a millisecond; its length and ends tell most apart.
        key = (i, int(ht), sc, zp, shape, None if override is None else
               (len(override), override[:16], override[-16:]))
        made = self._consts.get(key, ())
        for seen, k in made:
            if seen == override:
                return k
        dtype = operand_dtype(ht)
        if override is not None and np.asarray(value).dtype == dtype:
            # The override's bytes are the constant's: kept as a view of them (immutable,
            # so the pool takes it as it is), not copied once more (a megabyte index).
            arr = np.frombuffer(override, dtype).reshape(shape)
        else:
            arr = np.asarray(v).astype(dtype, copy=False).reshape(shape)
        k = self.sb.constant(ht, arr, list(shape), sc, zp, cq)
        self._consts[key] = (*made, (override, k))  # a new tuple: _Saved keeps a shallow copy
        return k

    def y(self, i: int) -> int:
        """A new HAL operand for tensor ``i`` written by the operation being converted."""
        ht, sc, zp, cq = hal_type(self.sg.tensors[i])
        return self.y_as(i, ht, sc, zp, cq)

    def y_as(self, i: int, ht: OperandType, sc: float = 0.0, zp: int = 0,
             cq: SymmPerChannelQuantParams | None = None, dims: Sequence[int] | None = None
             ) -> int:
        t = self.sg.tensors[i]
        lifetime = L.TEMPORARY_VARIABLE
        if i in self.wanted_outputs and i not in self.output_operands:
            lifetime = L.SUBGRAPH_OUTPUT
        k = self.sb.operand(ht, hal_dims(t) if dims is None else list(dims), sc, zp, cq,
                            lifetime=lifetime)
        if lifetime == L.SUBGRAPH_OUTPUT:
            self.output_operands[i] = k
        self.operands[i] = k
        return k

    def like(self, i: int, dims: Sequence[int] | None = None) -> int:
        """A temporary with tensor ``i``'s type (and its dims unless given)."""
        ht, sc, zp, cq = hal_type(self.t(i))
        return self.sb.operand(ht, hal_dims(self.t(i)) if dims is None else list(dims), sc, zp,
                               cq)

    def tmp(self, ht: OperandType, dims: Sequence[int], scale: float = 0.0,
            zero_point: int = 0) -> int:
        return self.sb.operand(ht, list(dims), scale, zero_point)

    # ---- scalars and small constants -------------------------------------------------------

    def i32(self, v: int) -> int:
        return self.sb.scalar(T.INT32, int(v))

    def f32(self, v: float) -> int:
        return self.sb.scalar(T.FLOAT32, float(v))

    def f16(self, v: float) -> int:
        return self.sb.scalar(T.FLOAT16, float(v))

    def scalar_float(self, like: int, v: float) -> int:
        """A FLOAT16 scalar for a FLOAT16 tensor input, else FLOAT32."""
        return self.f16(v) if self.t(like).ttype == TT.FLOAT16 else self.f32(v)

    def bool_(self, v: bool) -> int:
        return self.sb.scalar(T.BOOL, bool(v))

    def ints(self, values: Sequence[int] | np.ndarray, dims: Sequence[int] | None = None
             ) -> int:
        arr = np.asarray(values, np.int32)
        return self.sb.constant(T.TENSOR_INT32, arr, list(arr.shape if dims is None else dims))

    def emit(self, op: OperationType, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        self.sb.operation(op, list(inputs), list(outputs))

    # ---- fused activations -----------------------------------------------------------------

    def fused(self, act: int, out: int) -> tuple[int, int]:
        """(HAL FuseCode, operand the operation writes) for a TFLite fused activation.
        TANH and SIGN_BIT have no FuseCode, and TFLite's kernels do not apply them either
        (their activation range is unbounded), so they are refused rather than guessed."""
        if act in schema.ACTIVATIONS:
            return schema.ACTIVATIONS[act], self.y(out)
        raise Unimportable(f"fused activation {act} (TANH / SIGN_BIT) has no HAL FuseCode and "
                           f"TFLite's kernels do not apply it")

    def activated(self, act: int, out: int) -> int:
        """The operand an operation without a fuse input writes, with a separate activation
        operation after it when ``act`` is not NONE."""
        if act == 0:
            return self.y(out)
        ops = {1: O.RELU, 2: O.RELU1, 3: O.RELU6}
        if act not in ops:
            raise Unimportable(f"fused activation {act} has no HAL equivalent")
        tmp = self.like(out)
        self.emit_after(ops[act], [tmp], [self.y(out)])
        return tmp

    def emit_after(self, op: OperationType, inputs: list[int], outputs: list[int]) -> None:
        self.pending.append((int(op), inputs, outputs))

    def flush(self) -> None:
        for op, ins, outs in self.pending:
            self.sb.operation(op, ins, outs)
        self.pending.clear()

    # ---- copies ----------------------------------------------------------------------------

    def copy_into(self, src: int, dst: int) -> None:
        """An exact operation writing operand ``src``'s value into ``dst`` (same type)."""
        raw = int(self.sb.operands[src].type)
        if raw >> 16:
            raise Unimportable(f"cannot copy an operand of extension type {raw:#x} exactly")
        ht = OperandType(raw)
        if ht == T.TENSOR_INT32:
            self.emit(O.ADD, [src, self.ints([0]), self.i32(0)], [dst])
        elif ht == T.TENSOR_BOOL8:
            self.emit(O.LOGICAL_OR, [src, src], [dst])
        elif ht in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM,
                    T.TENSOR_QUANT8_ASYMM_SIGNED):
            self.emit(O.CONCATENATION, [src, self.i32(0)], [dst])
        else:
            raise Unimportable(f"cannot copy a {ht.name} operand exactly")

    def options(self, table: str) -> Any:
        """The operator's options, or the schema's defaults (an empty ``table``) when the file
        has none, as TFLite's own reader does."""
        if self.op is not None and self.op.options is not None:
            return self.op.options
        return default_options(table)

    def state_in(self, i: int) -> int:
        """The operand holding variable tensor ``i`` (recurrent state) before this operator."""
        if self.variables is None:
            raise Unimportable("recurrent state is only carried in the main subgraph")
        if not self.t(i).is_variable:
            return self.x(i)
        return self.variables.tensor_state(i)

    def state_out(self, i: int) -> int:
        """A new operand for variable tensor ``i`` after this operator."""
        k = self.like(i)
        if self.t(i).is_variable and self.variables is not None:
            self.variables.set_tensor_state(i, k)
        return k

    def omitted_like(self, i: int, like: int) -> int:
        """Tensor ``i``, or an omitted operand of tensor ``like``'s type when ``i`` is -1."""
        if i >= 0:
            return self.x(i)
        ht = hal_type(self.t(like))[0]
        return self.sb.omitted(ht, [])

    def subgraph(self, k: int) -> int:
        """A SUBGRAPH operand naming TFLite subgraph ``k`` (converted on first use)."""
        if self.subgraph_ref is None:
            raise Unimportable("control flow is not available here")
        return self.subgraph_ref(k, self.sb)
