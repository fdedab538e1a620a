"""The exporter's flat description of a .tflite, and its serialisation with flatbuffers.Builder
through the ``tflite`` package's generated builder functions (no hand-written encoding).

Converters fill plain lists (tensors, operators, buffers); only :func:`serialise` touches the
builder, which must create every child (string, vector, table) before its parent.

Constant data is most of a model's bytes, so it is never handled element by element nor
copied on the way: a buffer is kept as the exporter's read-only array (a view of the
analysis' constant), and serialising copies it once, into a builder sized up front so that
it never grows (each doubling would copy everything written so far).
"""

from __future__ import annotations

import functools
import importlib
import struct
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np
import tflite

from nnhal.tflite.schema import FILE_IDENTIFIER, SCHEMA_VERSION

#: Builtin codes above this go in the 32-bit field; the 8-bit one holds this placeholder.
_PLACEHOLDER_FOR_GREATER_OP_CODES = 127
#: Constant buffers start on this boundary (what TFLite's own writer does for SIMD loads).
_BUFFER_ALIGN = 16


@dataclass
class TensorDef:
    name: str
    shape: list[int]
    type: int  # tflite TensorType
    buffer: int = 0  # 0: no data (buffer 0 is the empty sentinel)
    scales: list[float] | None = None
    zero_points: list[int] | None = None
    quantized_dimension: int = 0
    #: -1 where a dimension is unknown (``shape`` then holds 1 there).
    shape_signature: list[int] | None = None
    #: State a stateful kernel (RNN, SVDF...) updates in place.
    is_variable: bool = False


@dataclass
class OperatorDef:
    code: int  # BuiltinOperator
    inputs: list[int]
    outputs: list[int]
    options_name: str | None = None  # e.g. "Conv2DOptions"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class SubgraphDef:
    name: str
    tensors: list[TensorDef] = field(default_factory=list)
    operators: list[OperatorDef] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def add_tensor(self, t: TensorDef) -> int:
        self.tensors.append(t)
        return len(self.tensors) - 1


@dataclass
class ModelDef:
    subgraphs: list[SubgraphDef] = field(default_factory=list)
    #: Constant data: bytes, or a C-contiguous array nobody writes to (no copy is made).
    buffers: list[bytes | np.ndarray] = field(default_factory=lambda: [b""])
    description: str = "nnhal"
    #: (signature key, [(name, tensor index)] inputs, outputs) of subgraph 0.
    signature: tuple[str, list[tuple[str, int]], list[tuple[str, int]]] | None = None

    def add_buffer(self, data: bytes | np.ndarray) -> int:
        """A buffer holding ``data``: bytes, or an array that stays unchanged until the model
        is serialised (kept as it is, not copied)."""
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)
        else:
            data = bytes(data)
        self.buffers.append(data)
        return len(self.buffers) - 1


@functools.cache
def _fn(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"tflite.{module}"), f"{module}{name}")


def _offsets(b: flatbuffers.Builder, module: str, vec: str, items: list[int]) -> int:
    _fn(module, f"Start{vec}Vector")(b, len(items))
    for off in reversed(items):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _numbers(b: flatbuffers.Builder, values: Any, dtype: str) -> int:
    return b.CreateNumpyVector(np.asarray(values, dtype=dtype).reshape(-1))


def _table(b: flatbuffers.Builder, module: str, fields: dict[str, Any]) -> int:
    """A table whose children are already built: ``fields`` maps a field to its value."""
    _fn(module, "Start")(b)
    for key, value in fields.items():
        if value is not None:
            _fn(module, f"Add{key}")(b, value)
    return _fn(module, "End")(b)


def _options(b: flatbuffers.Builder, name: str, options: dict[str, Any]) -> int:
    """An options table: list values become int32 vectors first (ReshapeOptions.NewShape,
    SqueezeOptions.SqueezeDims...), the rest are scalars."""
    fields = {k: (_numbers(b, v, "<i4") if isinstance(v, (list, tuple)) else v)
              for k, v in options.items()}
    return _table(b, name, fields)


def _data_len(data: bytes | np.ndarray) -> int:
    """A constant's byte length, bytes or array alike (not the operand size rule)."""
    return data.nbytes if isinstance(data, np.ndarray) else len(data)


def _buffer(b: flatbuffers.Builder, data: bytes | np.ndarray) -> int:
    n = _data_len(data)
    if not n:
        return _table(b, "Buffer", {})
    # A ubyte vector whose first byte lands on the boundary, its bytes copied once (what
    # the builder's CreateByteVector does, which takes bytes only).
    b.Prep(_BUFFER_ALIGN, n)
    b.StartVector(1, n, 1)
    b.head -= n
    raw = data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else data
    b.Bytes[b.head:b.head + n] = raw if isinstance(raw, bytes) else memoryview(raw)
    return _table(b, "Buffer", {"Data": b.EndVector()})


def _tensor(b: flatbuffers.Builder, t: TensorDef) -> int:
    name = b.CreateString(t.name)
    shape = _numbers(b, t.shape, "<i4")
    signature = _numbers(b, t.shape_signature, "<i4") if t.shape_signature else None
    quant = None
    if t.scales is not None:
        scale = _numbers(b, t.scales, "<f4")
        zp = _numbers(b, t.zero_points or [0] * len(t.scales), "<i8")
        quant = _table(b, "QuantizationParameters", {
            "Scale": scale, "ZeroPoint": zp, "QuantizedDimension": t.quantized_dimension})
    return _table(b, "Tensor", {"Shape": shape, "Type": t.type, "Buffer": t.buffer,
                                "Name": name, "Quantization": quant,
                                "ShapeSignature": signature,
                                "IsVariable": True if t.is_variable else None})


def _operator(b: flatbuffers.Builder, op: OperatorDef, opcode_index: int) -> int:
    inputs = _numbers(b, op.inputs, "<i4")
    outputs = _numbers(b, op.outputs, "<i4")
    options = options_type = None
    if op.options_name:
        options = _options(b, op.options_name, op.options)
        options_type = getattr(tflite.BuiltinOptions, op.options_name)
    return _table(b, "Operator", {"OpcodeIndex": opcode_index, "Inputs": inputs,
                                  "Outputs": outputs, "BuiltinOptionsType": options_type,
                                  "BuiltinOptions": options})


def _subgraph(b: flatbuffers.Builder, sg: SubgraphDef, opcodes: dict[int, int]) -> int:
    tensors = [_tensor(b, t) for t in sg.tensors]
    operators = [_operator(b, op, opcodes[op.code]) for op in sg.operators]
    name = b.CreateString(sg.name)
    return _table(b, "SubGraph", {
        "Tensors": _offsets(b, "SubGraph", "Tensors", tensors),
        "Inputs": _numbers(b, sg.inputs, "<i4"), "Outputs": _numbers(b, sg.outputs, "<i4"),
        "Operators": _offsets(b, "SubGraph", "Operators", operators), "Name": name})


def _signature(b: flatbuffers.Builder, key: str, inputs: list[tuple[str, int]],
               outputs: list[tuple[str, int]]) -> int:
    def maps(items: list[tuple[str, int]], vec: str) -> int:
        tables = [_table(b, "TensorMap", {"Name": b.CreateString(n), "TensorIndex": i})
                  for n, i in items]
        return _offsets(b, "SignatureDef", vec, tables)

    ins, outs = maps(inputs, "Inputs"), maps(outputs, "Outputs")
    return _table(b, "SignatureDef", {"Inputs": ins, "Outputs": outs,
                                      "SignatureKey": b.CreateString(key),
                                      "SubgraphIndex": 0})


def _outside(b: flatbuffers.Builder, size: int) -> tuple[int, int]:
    """A Buffer table whose data lies past the flatbuffer (``offset`` and ``size``, the
    schema's form for large models): the offset is written as a placeholder, patched once the
    flatbuffer's length is known. (The table, where the placeholder sits, counted from the
    end of the builder's bytes.)"""
    _fn("Buffer", "Start")(b)
    _fn("Buffer", "AddOffset")(b, _PLACEHOLDER_OFFSET)  # non-zero: always written
    at = b.Offset()
    _fn("Buffer", "AddSize")(b, size)
    return _fn("Buffer", "End")(b), at


#: Any value above 1 (TFLite's sign of data outside the flatbuffer) holds the offset's place.
_PLACEHOLDER_OFFSET = 1 << 40
_U64 = struct.Struct("<Q")


def serialise(model: ModelDef, *, data_outside: bool = False) -> bytes:
    """The .tflite bytes (schema version 3, identifier TFL3) of ``model``.

    ``data_outside``: constant data goes after the flatbuffer (each Buffer's ``offset`` and
    ``size``, which TFLite reads since 2.14, for models past 2 GB), so the weights are
    copied once, straight into the result, and the builder holds only the small tables;
    otherwise inside (each Buffer's ``data``), which every TFLite reader takes."""
    codes = sorted({op.code for sg in model.subgraphs for op in sg.operators})
    opcodes = {code: k for k, code in enumerate(codes)}
    # Room for everything, so the builder never grows: the data (when inside), and a
    # generous bound on the tables, vectors and strings around it.
    names = sum(len(t.name) for sg in model.subgraphs for t in sg.tensors)
    items = sum(len(sg.tensors) + len(sg.operators) for sg in model.subgraphs)
    scales = sum(len(t.scales or ()) for sg in model.subgraphs for t in sg.tensors)
    size = sum((0 if data_outside else _data_len(d)) + 2 * _BUFFER_ALIGN + 32
               for d in model.buffers) + 4 * names + 512 * items + 16 * scales + 65536
    b = flatbuffers.Builder(size)
    # Buffers first: the largest children, at the end of the file.
    outside: list[tuple[int, int, bytes | np.ndarray]] = []  # (placeholder, offset, data)
    buffers = []
    end = 0  # where the next outside buffer starts, counted from the first one's start
    for data in model.buffers:
        n = _data_len(data)
        if data_outside and n:
            table, at = _outside(b, n)
            outside.append((at, end, data))
            end = _align(end + n)
            buffers.append(table)
        else:
            buffers.append(_buffer(b, data))
    subgraphs = [_subgraph(b, sg, opcodes) for sg in model.subgraphs]
    codes_tables = [_table(b, "OperatorCode", {
        "DeprecatedBuiltinCode": min(code, _PLACEHOLDER_FOR_GREATER_OP_CODES),
        "BuiltinCode": code, "Version": 1}) for code in codes]
    signatures = None
    if model.signature is not None:
        signatures = _offsets(b, "Model", "SignatureDefs", [_signature(b, *model.signature)])
    description = b.CreateString(model.description)
    root = _table(b, "Model", {
        "Version": SCHEMA_VERSION,
        "OperatorCodes": _offsets(b, "Model", "OperatorCodes", codes_tables),
        "Subgraphs": _offsets(b, "Model", "Subgraphs", subgraphs),
        "Description": description,
        "Buffers": _offsets(b, "Model", "Buffers", buffers),
        "SignatureDefs": signatures})
    b.Finish(root, file_identifier=FILE_IDENTIFIER)
    if not outside:
        return bytes(memoryview(b.Bytes)[b.Head():])  # one copy (Output() slices, then bytes())
    flat = bytearray(memoryview(b.Bytes)[b.Head():])
    base = _align(len(flat))
    pieces: list[Any] = [flat, bytes(base - len(flat))]
    for at, offset, data in outside:
        _U64.pack_into(flat, len(flat) - at, base + offset)
        pieces.append(data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else data)
        pad = _align(_data_len(data)) - _data_len(data)
        if pad:
            pieces.append(bytes(pad))
    return b"".join(pieces)  # the one copy of the weights


def _align(n: int) -> int:
    return (n + _BUFFER_ALIGN - 1) // _BUFFER_ALIGN * _BUFFER_ALIGN
