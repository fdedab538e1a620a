"""Reading a loaded .tflite into plain Python records, so the importer never touches the
flatbuffer again: every count is bounded by the file size, every buffer is checked against its
tensor's shape, and whatever a corrupted file raises becomes a ModelFileError (through
:meth:`LoadedFile.guard`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tflite
from tflite.BuiltinOptions import BuiltinOptions
from tflite.TensorType import TensorType as TT

from nnhal.errors import ModelFileError
from nnhal.tflite import schema
from nnhal.tflite.sparsity import densify

_OPTION_NAMES = {v: k for k, v in vars(BuiltinOptions).items()
                 if not k.startswith("_") and isinstance(v, int)}


@dataclass
class TensorInfo:
    """One TFLite tensor: its type, HAL-style shape (0 = unknown), quantization, and the
    constant value when it has one (possibly produced by folding)."""

    index: int
    name: str
    ttype: int
    shape: tuple[int, ...]
    #: False when the rank itself is unknown (no shape in the file).
    has_rank: bool = True
    scales: np.ndarray | None = None
    zero_points: np.ndarray | None = None
    qdim: int = 0
    value: np.ndarray | None = None
    #: Holds sparse data that DENSIFY makes dense.
    sparse_value: np.ndarray | None = None
    is_variable: bool = False

    @property
    def type_name(self) -> str:
        return schema.TENSOR_TYPE_NAMES.get(self.ttype, f"type {self.ttype}")

    @property
    def static(self) -> bool:
        return self.has_rank and all(d > 0 for d in self.shape)

    @property
    def quantized(self) -> bool:
        return self.scales is not None and self.scales.size > 0

    def describe(self) -> str:
        return f"tensor {self.index} '{self.name}'"


@dataclass
class OpInfo:
    index: int
    #: Builtin name, or the custom code of a custom operator.
    name: str
    code: int
    inputs: list[int]
    outputs: list[int]
    options: Any = None
    custom: bool = False

    def describe(self) -> str:
        return f"#{self.index} {self.name}"


@dataclass
class SubgraphInfo:
    index: int
    name: str
    tensors: list[TensorInfo]
    ops: list[OpInfo]
    inputs: list[int]
    outputs: list[int]
    extra: dict[str, Any] = field(default_factory=dict)


def _bounded(n: int, limit: int, what: str, file: str) -> int:
    if n < 0 or n > limit:
        raise ModelFileError(file, f"corrupted: {n} {what} in a {limit}-byte file")
    return n


def _indexes(vec: np.ndarray | int, count: int, what: str, file: str) -> list[int]:
    if isinstance(vec, int):  # the binding returns 0 for an absent vector
        return []
    out = [int(v) for v in vec]
    for v in out:
        if v < -1 or v >= count:
            raise ModelFileError(file, f"corrupted: {what} refers to tensor {v} of {count}")
    return out


def _buffer_bytes(lf: schema.LoadedFile, k: int) -> bytes | None:
    model = lf.model
    if not 0 <= k < model.BuffersLength():
        raise ModelFileError(lf.name, f"corrupted: buffer {k} of {model.BuffersLength()}")
    buf = model.Buffers(k)
    off, size = int(buf.Offset()), int(buf.Size())
    if off > 1:  # data past the flatbuffer (large models)
        if off + size > len(lf.data):
            raise ModelFileError(lf.name, f"truncated: buffer {k} ends at byte {off + size} "
                                          f"of {len(lf.data)}")
        return lf.data[off:off + size] if size else None
    n = buf.DataLength()
    if n == 0:
        return None
    _bounded(n, len(lf.data), "buffer bytes", lf.name)
    return buf.DataAsNumpy().tobytes()


def _tensor(lf: schema.LoadedFile, sg: tflite.SubGraph, i: int, where: str,
            dynamic_shapes: bool = False) -> TensorInfo:
    t = sg.Tensors(i)
    name = (t.Name() or b"").decode("utf-8", "replace")
    has_rank = True
    shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
    if dynamic_shapes and t.ShapeSignatureLength() == len(shape) and shape:
        sig = tuple(int(d) for d in t.ShapeSignatureAsNumpy())
        shape = tuple(0 if s < 0 else d for d, s in zip(shape, sig))
    if any(d < 0 for d in shape):
        shape = tuple(max(d, 0) for d in shape)
    info = TensorInfo(i, name, int(t.Type()), shape, has_rank=has_rank,
                      is_variable=bool(t.IsVariable()))
    q = t.Quantization()
    if q is not None and q.ScaleLength():
        _bounded(q.ScaleLength(), len(lf.data), "scales", lf.name)
        info.scales = np.asarray(q.ScaleAsNumpy(), np.float32)
        zps = (np.asarray(q.ZeroPointAsNumpy(), np.int64) if q.ZeroPointLength()
               else np.zeros(info.scales.size, np.int64))
        info.zero_points = zps
        info.qdim = int(q.QuantizedDimension())
    data = _buffer_bytes(lf, int(t.Buffer()))
    if data is not None:
        dtype = schema.DTYPES.get(info.ttype)
        if dtype is None:  # string and other types we cannot hold; reported when used
            return info
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        arr = np.frombuffer(data, dtype=dtype)
        sparsity = t.Sparsity()
        if sparsity is not None:
            info.sparse_value = densify(arr, shape, sparsity, lf.name,
                                        f"{where} {info.describe()}")
        elif arr.size != count or len(data) != count * dtype.itemsize:
            raise ModelFileError(lf.name, f"corrupted: {where} {info.describe()} has "
                                          f"{len(data)} bytes of data for shape {list(shape)}")
        else:
            info.value = arr.reshape(shape).copy()
    return info


def _options(op: tflite.Operator) -> Any:
    kind = int(op.BuiltinOptionsType())
    if kind == 0:
        return None
    table = op.BuiltinOptions()
    name = _OPTION_NAMES.get(kind)
    cls = getattr(tflite, name, None) if name else None
    if table is None or cls is None:
        return None
    opts = cls()
    opts.Init(table.Bytes, table.Pos)
    return opts


def read_subgraph(lf: schema.LoadedFile, s: int, dynamic_shapes: bool = False) -> SubgraphInfo:
    """One subgraph as records; called inside ``lf.guard()``. ``dynamic_shapes``: see
    :func:`read_model`."""
    model, limit = lf.model, len(lf.data)
    sg = model.Subgraphs(s)
    where = f"subgraph {s}"
    n_t = _bounded(sg.TensorsLength(), limit, "tensors", lf.name)
    tensors = [_tensor(lf, sg, i, where, dynamic_shapes) for i in range(n_t)]
    n_codes = model.OperatorCodesLength()
    ops = []
    for k in range(_bounded(sg.OperatorsLength(), limit, "operators", lf.name)):
        op = sg.Operators(k)
        oc_index = int(op.OpcodeIndex())
        if not 0 <= oc_index < n_codes:
            raise ModelFileError(lf.name, f"corrupted: {where} operator {k} has opcode index "
                                          f"{oc_index} of {n_codes}")
        oc = model.OperatorCodes(oc_index)
        code = schema.builtin_code(oc)
        custom = code == tflite.BuiltinOperator.CUSTOM
        name = ((oc.CustomCode() or b"?").decode("utf-8", "replace") if custom
                else schema.builtin_name(code))
        ops.append(OpInfo(k, name, code,
                          _indexes(op.InputsAsNumpy(), n_t, f"{where} operator {k}", lf.name),
                          _indexes(op.OutputsAsNumpy(), n_t, f"{where} operator {k}",
                                   lf.name),
                          _options(op), custom))
    ins = _indexes(sg.InputsAsNumpy(), n_t, f"{where} inputs", lf.name)
    outs = _indexes(sg.OutputsAsNumpy(), n_t, f"{where} outputs", lf.name)
    if -1 in ins or -1 in outs:
        raise ModelFileError(lf.name, f"corrupted: {where} lists tensor -1 as an input or "
                                      f"output")
    return SubgraphInfo(s, (sg.Name() or b"").decode("utf-8", "replace"), tensors, ops,
                        ins, outs)


def read_model(lf: schema.LoadedFile, dynamic_shapes: bool = False) -> list[SubgraphInfo]:
    """Every subgraph as records. Each tensor's shape is its ``shape`` field (the shape TFLite
    allocates when nobody resizes an input), or with ``dynamic_shapes`` its
    ``shape_signature`` where that marks a dimension -1, which becomes 0 (unknown)."""
    with lf.guard():
        n = _bounded(lf.model.SubgraphsLength(), len(lf.data), "subgraphs", lf.name)
        _bounded(lf.model.BuffersLength(), len(lf.data), "buffers", lf.name)
        _bounded(lf.model.OperatorCodesLength(), len(lf.data), "operator codes", lf.name)
        return [read_subgraph(lf, s, dynamic_shapes) for s in range(n)]


#: TFLite tensor types that have no HAL operand type at all.
UNREPRESENTABLE = {TT.STRING, TT.INT64, TT.COMPLEX64, TT.COMPLEX128, TT.FLOAT64, TT.UINT64,
                   TT.UINT32, TT.UINT16, TT.RESOURCE, TT.VARIANT}
