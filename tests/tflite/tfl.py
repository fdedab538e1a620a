"""Writing small .tflite files in tests, with flatbuffers' Builder and the ``tflite``
package's generated builder functions: a graph of tensors (inputs, numpy constants,
temporaries) and operators with their options given as a table name and field values."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions
from tflite.TensorType import TensorType as TT

_TYPES = {np.dtype(np.float32): TT.FLOAT32, np.dtype(np.float16): TT.FLOAT16,
          np.dtype(np.int32): TT.INT32, np.dtype(np.uint8): TT.UINT8,
          np.dtype(np.int8): TT.INT8, np.dtype(np.int16): TT.INT16,
          np.dtype(np.int64): TT.INT64, np.dtype(np.bool_): TT.BOOL}


#: Builtins TFLite registers from a version above 1.
_VERSIONS = {"BROADCAST_TO": 2}


def _mod(name: str) -> Any:
    return importlib.import_module(f"tflite.{name}")


@dataclass
class Quant:
    scales: Sequence[float]
    zero_points: Sequence[int]
    dim: int = 0


@dataclass
class _Tensor:
    name: str
    shape: list[int]
    ttype: int
    value: np.ndarray | None = None
    quant: Quant | None = None
    signature: list[int] | None = None
    #: (traversal_order, block_map, [level: ("dense", size) | ("csr", segments, indices)])
    sparsity: tuple | None = None
    is_variable: bool = False


@dataclass
class _Op:
    name: str
    inputs: list[int]
    outputs: list[int]
    options: tuple[str, dict[str, Any]] | None = None
    #: A custom operator's raw options.
    custom_options: bytes | None = None


@dataclass
class Graph:
    """One subgraph; ``build`` writes the model with this as subgraph 0 (and ``extra``
    subgraphs after it)."""

    tensors: list[_Tensor] = field(default_factory=list)
    ops: list[_Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def tensor(self, shape: Sequence[int], dtype: Any, name: str | None = None,
               quant: Quant | None = None, signature: Sequence[int] | None = None) -> int:
        """``dtype`` is a numpy dtype or a TensorType code (e.g. TT.RESOURCE)."""
        ttype = dtype if isinstance(dtype, int) else _TYPES[np.dtype(dtype)]
        self.tensors.append(_Tensor(name or f"t{len(self.tensors)}", list(shape),
                                    ttype, None, quant,
                                    list(signature) if signature is not None else None))
        return len(self.tensors) - 1

    def variable(self, shape: Sequence[int], dtype: Any = np.float32, name: str | None = None
                 ) -> int:
        """A variable tensor (recurrent state TFLite keeps between invocations, zeros first)."""
        i = self.tensor(shape, dtype, name)
        self.tensors[i].is_variable = True
        return i

    def input(self, shape: Sequence[int], dtype: Any = np.float32, name: str | None = None,
              quant: Quant | None = None, signature: Sequence[int] | None = None) -> int:
        i = self.tensor(shape, dtype, name or f"in{len(self.inputs)}", quant, signature)
        self.inputs.append(i)
        return i

    def const(self, value: Any, dtype: Any = None, name: str | None = None,
              quant: Quant | None = None, sparsity: tuple | None = None,
              shape: Sequence[int] | None = None) -> int:
        arr = np.asarray(value, dtype=dtype)
        ttype = dtype if isinstance(dtype, int) else arr.dtype
        if isinstance(dtype, int):
            arr = np.asarray(value)
        i = self.tensor(arr.shape if shape is None else shape, ttype, name, quant)
        self.tensors[i].value = arr
        self.tensors[i].sparsity = sparsity
        return i

    def op(self, name: str, inputs: Sequence[int], outputs: Sequence[int],
           options: tuple[str, dict[str, Any]] | None = None,
           custom_options: bytes | None = None) -> None:
        """``name`` is a builtin name, or ``CUSTOM:code`` for a custom operator."""
        self.ops.append(_Op(name, list(inputs), list(outputs), options, custom_options))

    def output(self, *indexes: int) -> None:
        self.outputs.extend(indexes)


def _vec(b: flatbuffers.Builder, arr: Any, dtype: Any) -> int:
    return b.CreateNumpyVector(np.asarray(arr, dtype=dtype))


def _table_vector(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for o in reversed(offsets):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def _options(b: flatbuffers.Builder, table: str, fields: dict[str, Any]) -> int:
    m = _mod(table)
    prepared = {}
    for k, v in fields.items():
        if isinstance(v, (list, tuple, np.ndarray)):
            prepared[k] = _vec(b, v, np.int32)
        elif isinstance(v, bytes):
            prepared[k] = b.CreateString(v)
        else:
            prepared[k] = v
    getattr(m, f"{table}Start")(b)
    for k, v in prepared.items():
        getattr(m, f"{table}Add{k}")(b, v)
    return getattr(m, f"{table}End")(b)


def _sparsity(b: flatbuffers.Builder, spec: tuple) -> int:
    order, block_map, levels = spec
    dm = _mod("DimensionMetadata")
    iv = _mod("Int32Vector")
    metas = []
    for level in levels:
        if level[0] == "dense":
            dm.DimensionMetadataStart(b)
            dm.DimensionMetadataAddFormat(b, 0)
            dm.DimensionMetadataAddDenseSize(b, level[1])
            metas.append(dm.DimensionMetadataEnd(b))
            continue
        vecs = []
        for values in level[1:3]:
            v = _vec(b, values, np.int32)
            iv.Int32VectorStart(b)
            iv.Int32VectorAddValues(b, v)
            vecs.append(iv.Int32VectorEnd(b))
        dm.DimensionMetadataStart(b)
        dm.DimensionMetadataAddFormat(b, 1)
        dm.DimensionMetadataAddArraySegmentsType(b, 1)
        dm.DimensionMetadataAddArraySegments(b, vecs[0])
        dm.DimensionMetadataAddArrayIndicesType(b, 1)
        dm.DimensionMetadataAddArrayIndices(b, vecs[1])
        metas.append(dm.DimensionMetadataEnd(b))
    sp = _mod("SparsityParameters")
    order_v = _vec(b, order, np.int32)
    block_v = _vec(b, block_map, np.int32) if block_map else None
    metas_v = _table_vector(b, metas)
    sp.SparsityParametersStart(b)
    sp.SparsityParametersAddTraversalOrder(b, order_v)
    if block_v is not None:
        sp.SparsityParametersAddBlockMap(b, block_v)
    sp.SparsityParametersAddDimMetadata(b, metas_v)
    return sp.SparsityParametersEnd(b)


def _subgraph(b: flatbuffers.Builder, g: Graph, codes: dict[str, int],
              buffers: list[bytes]) -> int:
    tm, qm, om, sm = _mod("Tensor"), _mod("QuantizationParameters"), _mod("Operator"), \
        _mod("SubGraph")
    tensors = []
    for t in g.tensors:
        buf = 0
        if t.value is not None:
            buffers.append(np.ascontiguousarray(t.value).tobytes())
            buf = len(buffers) - 1
        name = b.CreateString(t.name)
        shape = _vec(b, t.shape, np.int32)
        sig = _vec(b, t.signature, np.int32) if t.signature is not None else None
        q = None
        if t.quant is not None:
            sc = _vec(b, t.quant.scales, np.float32)
            zp = _vec(b, t.quant.zero_points, np.int64)
            qm.QuantizationParametersStart(b)
            qm.QuantizationParametersAddScale(b, sc)
            qm.QuantizationParametersAddZeroPoint(b, zp)
            qm.QuantizationParametersAddQuantizedDimension(b, t.quant.dim)
            q = qm.QuantizationParametersEnd(b)
        sp = _sparsity(b, t.sparsity) if t.sparsity is not None else None
        tm.TensorStart(b)
        tm.TensorAddShape(b, shape)
        if sig is not None:
            tm.TensorAddShapeSignature(b, sig)
        tm.TensorAddType(b, t.ttype)
        tm.TensorAddBuffer(b, buf)
        tm.TensorAddName(b, name)
        if q is not None:
            tm.TensorAddQuantization(b, q)
        if sp is not None:
            tm.TensorAddSparsity(b, sp)
        if t.is_variable:
            tm.TensorAddIsVariable(b, True)
        tensors.append(tm.TensorEnd(b))
    ops = []
    for op in g.ops:
        ins, outs = _vec(b, op.inputs, np.int32), _vec(b, op.outputs, np.int32)
        opts = _options(b, op.options[0], op.options[1]) if op.options else None
        custom = (_vec(b, np.frombuffer(op.custom_options, np.uint8), np.uint8)
                  if op.custom_options is not None else None)
        om.OperatorStart(b)
        om.OperatorAddOpcodeIndex(b, codes.setdefault(op.name, len(codes)))
        om.OperatorAddInputs(b, ins)
        om.OperatorAddOutputs(b, outs)
        if opts is not None:
            om.OperatorAddBuiltinOptionsType(b, getattr(BuiltinOptions, op.options[0]))
            om.OperatorAddBuiltinOptions(b, opts)
        if custom is not None:
            om.OperatorAddCustomOptions(b, custom)
        ops.append(om.OperatorEnd(b))
    tv, ov = _table_vector(b, tensors), _table_vector(b, ops)
    iv, outv = _vec(b, g.inputs, np.int32), _vec(b, g.outputs, np.int32)
    sm.SubGraphStart(b)
    sm.SubGraphAddTensors(b, tv)
    sm.SubGraphAddOperators(b, ov)
    sm.SubGraphAddInputs(b, iv)
    sm.SubGraphAddOutputs(b, outv)
    return sm.SubGraphEnd(b)


def build(main: Graph, *extra: Graph, version: int = 3, external: bool = False,
          op_versions: dict[str, int] | None = None) -> bytes:
    """The .tflite bytes of a model whose subgraph 0 is ``main``; ``external`` puts constant
    data past the flatbuffer (Buffer.offset / size), as large models do; ``op_versions``
    gives builtins' operator code versions (else the lowest TFLite registers)."""
    versions = {**_VERSIONS, **(op_versions or {})}
    if not external:
        return _build(main, extra, version, None, versions)
    base = 1 << 12
    while True:
        data = _build(main, extra, version, base, versions)
        if data is not None:
            return data
        base *= 2


def _build(main: Graph, extra: tuple, version: int, base: int | None,
           versions: dict[str, int]) -> bytes | None:
    b = flatbuffers.Builder(1024)
    codes: dict[str, int] = {}
    buffers: list[bytes] = [b""]
    subgraphs = [_subgraph(b, g, codes, buffers) for g in (main, *extra)]
    cm, bm, mm = _mod("OperatorCode"), _mod("Buffer"), _mod("Model")
    code_offsets = []
    for name in sorted(codes, key=codes.get):
        custom = b.CreateString(name[7:]) if name.startswith("CUSTOM:") else None
        code = BuiltinOperator.CUSTOM if custom is not None else getattr(BuiltinOperator, name)
        cm.OperatorCodeStart(b)
        if custom is not None:
            cm.OperatorCodeAddCustomCode(b, custom)
        cm.OperatorCodeAddBuiltinCode(b, code)
        cm.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
        cm.OperatorCodeAddVersion(b, versions.get(name, 1))
        code_offsets.append(cm.OperatorCodeEnd(b))
    buffer_offsets, tail, places = [], bytearray(), []
    for data in buffers:
        if base is not None and data:
            while len(tail) % 16:
                tail.append(0)
            places.append((base + len(tail), len(data)))
            tail.extend(data)
            d = None
        else:
            places.append(None)
            d = b.CreateNumpyVector(np.frombuffer(data, np.uint8)) if data else None
        bm.BufferStart(b)
        if d is not None:
            bm.BufferAddData(b, d)
        if places[-1] is not None:
            bm.BufferAddOffset(b, places[-1][0])
            bm.BufferAddSize(b, places[-1][1])
        buffer_offsets.append(bm.BufferEnd(b))
    sv, cv, bv = (_table_vector(b, subgraphs), _table_vector(b, code_offsets),
                  _table_vector(b, buffer_offsets))
    desc = b.CreateString("nnhal test")
    mm.ModelStart(b)
    mm.ModelAddVersion(b, version)
    mm.ModelAddOperatorCodes(b, cv)
    mm.ModelAddSubgraphs(b, sv)
    mm.ModelAddDescription(b, desc)
    mm.ModelAddBuffers(b, bv)
    b.Finish(mm.ModelEnd(b), file_identifier=b"TFL3")
    out = bytes(b.Output())
    if base is None:
        return out
    if len(out) > base:
        return None  # the caller retries with a larger base
    return out + b"\0" * (base - len(out)) + bytes(tail)


def one_op(name: str, inputs: Sequence[Any], out_shape: Sequence[int], out_dtype: Any = None,
           options: tuple[str, dict[str, Any]] | None = None, out_quant: Quant | None = None,
           n_outputs: int = 1) -> bytes:
    """A model of one operator. Each input is a numpy array (a constant), or a tuple
    ``(shape, dtype[, Quant])`` (a model input)."""
    g = Graph()
    ins = []
    first_dtype = None
    for spec in inputs:
        if spec is None:
            ins.append(-1)
        elif isinstance(spec, tuple):
            ins.append(g.input(spec[0], spec[1], quant=spec[2] if len(spec) > 2 else None))
            first_dtype = first_dtype or spec[1]
        else:
            ins.append(g.const(spec))
            first_dtype = first_dtype or np.asarray(spec).dtype
    shapes = out_shape if n_outputs > 1 else [out_shape]
    outs = [g.tensor(s, out_dtype or first_dtype, f"out{k}", out_quant)
            for k, s in enumerate(shapes)]
    g.op(name, ins, outs, options)
    g.output(*outs)
    return build(g)
