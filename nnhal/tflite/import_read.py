"""Reading a loaded .tflite into plain Python records, so the importer never touches the
flatbuffer again: every count is bounded by the file size, every buffer is checked against its
tensor's shape, and whatever a corrupted file raises becomes a ModelFileError (through
:meth:`LoadedFile.guard`)."""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import flatbuffers
import numpy as np
import tflite
from tflite.BuiltinOptions import BuiltinOptions
from tflite.TensorType import TensorType as TT

from nnhal.errors import ModelFileError, UnsupportedModelError
from nnhal.ops.common import MAX_RANK, rank_refusal
from nnhal.tflite import schema
from nnhal.tflite.arity import ARITY
from nnhal.tflite.sparsity import densify


@dataclass
class TfliteTensor:
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
    #: A dimension of the file's shape is 0: an empty tensor to TFLite, where the HAL's 0
    #: means unknown.
    zero_sized: bool = False
    #: The file's shape_signature (-1 marks a dimension TFLite's Prepare computes), if any.
    signature: tuple[int, ...] | None = None
    #: Has a buffer of data (a constant, whether or not its type is one nnhal holds).
    has_data: bool = False
    #: :func:`~nnhal.tflite.import_ctx.hal_type`'s answer, with what it was computed from.
    hal_memo: tuple | None = field(default=None, repr=False, compare=False)
    #: Its :class:`~nnhal.tflite.kernel_rules.RuleTensor`, with what it was made from.
    rule_memo: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def type_name(self) -> str:
        return schema.TENSOR_TYPE_NAMES.get(self.ttype, f"type {self.ttype}")

    @property
    def static(self) -> bool:
        return self.has_rank and (not self.shape or min(self.shape) > 0)

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
    #: A custom operator's raw options (its kernel reads them as it likes).
    custom_options: bytes = b""
    #: The flatbuffer operator of a builtin the importer does not read options of itself.
    operator: Any = None
    #: Its operator code's version (TFLite's resolver registers a span per builtin).
    version: int = 1

    def options_as(self, table: str) -> Any:
        """The options as the schema table ``table`` (defaults when absent or another)."""
        if self.operator is not None:
            return _options(self.operator, table)
        if self.options is not None and type(self.options).__name__ == table:
            return self.options
        return default_options(table)

    def describe(self) -> str:
        return f"#{self.index} {self.name}"


@dataclass
class SubgraphInfo:
    index: int
    name: str
    tensors: list[TfliteTensor]
    ops: list[OpInfo]
    inputs: list[int]
    outputs: list[int]
    extra: dict[str, Any] = field(default_factory=dict)


def _bounded(n: int, limit: int, what: str, file: str) -> int:
    if n < 0 or n > limit:
        raise ModelFileError(file, f"corrupted: {n} {what} in a {limit}-byte file")
    return n


#: Field positions of the schema's tables (their order in schema.fbs).
_T_SHAPE, _T_TYPE, _T_BUFFER, _T_NAME, _T_QUANT, _T_VARIABLE, _T_SPARSITY, _T_SIGNATURE = \
    range(8)
_Q_SCALE, _Q_ZERO_POINT, _Q_DIM = 2, 3, 6
_B_DATA, _B_OFFSET, _B_SIZE = range(3)
_SG_TENSORS, _SG_INPUTS, _SG_OUTPUTS, _SG_OPERATORS, _SG_NAME = range(5)
_M_BUFFERS = 4
_O_OPCODE, _O_INPUTS, _O_OUTPUTS, _O_OPTIONS_TYPE, _O_OPTIONS, _O_CUSTOM_OPTIONS = range(6)
#: The union tag of each builtin options table.
_OPTION_KINDS: dict[str, int] = {k: v for k, v in vars(BuiltinOptions).items()
                                 if not k.startswith("_") and isinstance(v, int)}
#: Builtin options naming subgraphs, checked against the subgraph count when read.
_SUBGRAPH_FIELDS = {"IF": ("ThenSubgraphIndex", "ElseSubgraphIndex"),
                    "WHILE": ("CondSubgraphIndex", "BodySubgraphIndex"),
                    "CALL_ONCE": ("InitSubgraphIndex",)}

#: Bytes per element of the fixed-size types nnhal reads no value of (their buffers are still
#: checked as TFLite checks them).
_FIXED_SIZES = {TT.COMPLEX64: 8, TT.COMPLEX128: 16}

_I32 = struct.Struct("<i")


class _Reader:
    """One file's walk: the buffer table's positions found once, then each subgraph read
    through raw field positions (see :func:`schema.fields`), so a tensor costs a few struct
    reads and one no operator uses costs its checks only."""

    def __init__(self, lf: schema.LoadedFile, dynamic_shapes: bool):
        self.lf, self.data, self.name = lf, lf.data, lf.name
        self.dynamic_shapes = dynamic_shapes
        model_fields = schema.fields(self.data, lf.model._tab.Pos, _M_BUFFERS + 1)
        self.buffers = schema.tables(self.data, model_fields[_M_BUFFERS])
        #: Each buffer's fields (data, offset, size), read for all at once.
        at = schema.field_positions(self.data, self.buffers, _B_SIZE + 1)
        self.buffer_fields = at.tolist()
        #: Each buffer's offset and size (0 when absent), read for all at once too.
        self.buffer_places = list(zip(schema.scalars_at(self.data, at[:, _B_OFFSET], "<u8"),
                                      schema.scalars_at(self.data, at[:, _B_SIZE], "<u8")))
        self.n_subgraphs = lf.model.SubgraphsLength()
        self._opcodes: dict[int, tuple[int, bool, str]] = {}

    def fail(self, problem: str) -> ModelFileError:
        return ModelFileError(self.name, f"corrupted: {problem}")

    def buffer_bytes(self, k: int, where: str) -> np.ndarray | None:
        """Buffer ``k``'s data as TFLite's InterpreterBuilder takes it: none for buffer 0 (the
        schema's empty sentinel, whatever it holds); a data vector, when present, even empty
        (a constant of 0 bytes, which a tensor of any element is refused for); else bytes
        past the flatbuffer when ``offset`` > 1; else none (a tensor computed at run time).
        A read-only uint8 view of the file's bytes: weights are never copied here."""
        if k == 0:
            return None
        if not 0 <= k < self.buffers.size:
            raise self.fail(f"{where} names buffer {k} of {self.buffers.size}")
        data = self.data
        f = self.buffer_fields[k]
        if f[_B_DATA]:
            return schema.vector(data, f[_B_DATA], "u1")
        off, size = self.buffer_places[k]
        if off > 1:  # data past the flatbuffer (large models)
            if off + size > len(data):
                raise ModelFileError(self.name, f"truncated: buffer {k} ends at byte "
                                                f"{off + size} of {len(data)}")
            return np.frombuffer(data, np.uint8, size, off)
        return None

    def tensor(self, f: list[int], q: list[int] | None, i: int, where: str, used: bool,
               read: tuple[int, int, int, tuple[int, ...], tuple[int, ...]]) -> TfliteTensor:
        """Tensor ``i`` from its fields ``f``, those of its quantization table ``q``, and
        ``read``: its type, buffer, is_variable, shape and shape_signature, read for every
        tensor of the subgraph at once (see :meth:`subgraph`)."""
        data = self.data
        ttype, buffer, variable, shape, sig = read
        name = schema.string(data, f[_T_NAME])
        info = TfliteTensor(i, name, ttype, (), is_variable=variable != 0)
        what = f"{where} tensor {i} '{name}'"  # (info.describe(), for messages)
        if ttype not in schema.TENSOR_TYPE_NAMES:
            raise self.fail(f"{what} has type {ttype}, which is not a TFLite type")
        file_shape = shape
        if len(shape) > MAX_RANK and used:  # valid TFLite, but no array holds it
            raise UnsupportedModelError(self.name, [rank_refusal(shape, what)])  # type: ignore
        info.zero_sized = 0 in shape
        if shape and min(shape) < 0:
            raise self.fail(f"{what} has shape {list(shape)} (a negative dimension; unknown "
                            f"ones are -1 in shape_signature, not in shape)")
        if f[_T_SIGNATURE]:
            if sig != shape and not _signature_fits(sig, shape):
                raise self.fail(f"{what} has shape_signature {list(sig)} for shape "
                                f"{list(shape)} (each entry must equal the shape's or be -1)")
            info.signature = sig
            if self.dynamic_shapes:
                shape = tuple(0 if s < 0 else d for d, s in zip(shape, sig))
        info.shape = shape
        if q is not None:
            self.quantization(info, q, list(file_shape), what)
        content = self.buffer_bytes(buffer, what)
        if content is None:
            return info
        if info.is_variable:
            raise self.fail(f"{what} is a variable with a constant buffer")
        dtype = schema.DTYPES.get(info.ttype)
        info.has_data = dtype is not None or len(content) > 0
        if dtype is None:  # string and other types we cannot hold; reported when used
            size = _FIXED_SIZES.get(info.ttype)
            if size is not None and len(content) and not f[_T_SPARSITY] and \
                    len(content) < size * _count(shape):
                raise self.fail(f"{what} has {len(content)} bytes of data for shape "
                                f"{list(shape)}")
            return info
        if f[_T_SPARSITY]:
            if used:
                sparsity = tflite.SparsityParameters()
                sparsity.Init(data, schema.table(data, f[_T_SPARSITY]))
                info.sparse_value = densify(_typed(content, dtype), shape, sparsity,
                                            self.name, what)
            return info
        count = _count(shape)
        if len(content) != count * dtype.itemsize and (used or len(content) < count *
                                                       dtype.itemsize):
            # TFLite refuses a buffer shorter than its tensor, used or not
            raise self.fail(f"{what} has {len(content)} bytes of data for shape {list(shape)}")
        if used:
            info.value = _typed(content, dtype).reshape(shape)
        return info

    def quantization(self, info: TfliteTensor, f: list[int], dims: list[int], what: str
                     ) -> None:
        """TFLite's rules: a scale needs as many zero points; one scale is per-tensor, more
        are per-axis along ``quantized_dimension`` with one per index of that dimension."""
        if not f[_Q_SCALE]:  # (most float tensors have an empty table)
            return
        data = self.data
        scales = schema.vector(data, f[_Q_SCALE], "<f4")
        if scales.size == 0:
            return
        zero_points = schema.vector(data, f[_Q_ZERO_POINT], "<i8")
        qdim = schema.scalar(data, f[_Q_DIM], _I32)
        if zero_points.size != scales.size:
            raise self.fail(f"{what} has {scales.size} quantization scales and "
                            f"{zero_points.size} zero points")
        if qdim < 0 or (dims and qdim >= len(dims)):
            raise self.fail(f"{what} has quantized_dimension {qdim} for rank {len(dims)}")
        if scales.size != 1 and (not dims or scales.size != dims[qdim]):
            size = dims[qdim] if dims else 1
            raise self.fail(f"{what} has {scales.size} quantization scales (1, or {size} "
                            f"along dimension {qdim})")
        info.scales = scales.astype(np.float32)
        info.zero_points = zero_points.astype(np.int64)
        info.qdim = qdim

    def indexes(self, vec: tuple[int, ...], count: int, what: str) -> list[int]:
        out = list(vec)
        if out and (min(out) < -1 or max(out) >= count):
            for v in out:
                if v < -1 or v >= count:
                    raise self.fail(f"{what} refers to tensor {v} of {count}")
        return out

    def opcode(self, oc_index: int, k: int, where: str) -> tuple[int, bool, str, int]:
        """(code, custom, name, version) of operator code ``oc_index``, read once per code."""
        found = self._opcodes.get(oc_index)
        if found is None:
            model = self.lf.model
            n_codes = model.OperatorCodesLength()
            if not 0 <= oc_index < n_codes:
                raise self.fail(f"{where} operator {k} has opcode index {oc_index} of "
                                f"{n_codes}")
            oc = model.OperatorCodes(oc_index)
            code = schema.builtin_code(self.data, oc)
            custom = code == tflite.BuiltinOperator.CUSTOM
            name = ((oc.CustomCode() or b"?").decode("utf-8", "replace") if custom
                    else schema.builtin_name(code))
            found = self._opcodes[oc_index] = (code, custom, name, int(oc.Version()))
        return found

    def operator(self, pos: int, f: list[int], k: int, n_t: int, where: str,
                 read: tuple[int, tuple[int, ...], tuple[int, ...], int, int]) -> OpInfo:
        """Operator ``k`` at ``pos`` from its fields ``f`` and ``read``: its opcode index,
        inputs, outputs, options type and options table (0: none), read for every operator
        of the subgraph at once (see :meth:`subgraph`)."""
        data = self.data
        oc_index, inputs, outputs, options_type, options_at = read
        code, custom, name, version = self.opcode(oc_index, k, where)
        at = f"{where} operator {k} ({name})"
        ins = self.indexes(inputs, n_t, at)
        outs = self.indexes(outputs, n_t, at)
        arity = None if custom else ARITY.get(name)
        options = None
        if arity is not None and arity.options is not None:
            options = self.options(options_type, options_at, arity.options)
        info = OpInfo(k, name, code, ins, outs, options, custom, version=version)
        if custom and f[_O_CUSTOM_OPTIONS]:
            info.custom_options = schema.vector(data, f[_O_CUSTOM_OPTIONS], "u1").tobytes()
        if arity is None and not custom:
            op = tflite.Operator()
            op.Init(data, pos)
            info.operator = op  # an extension's converter reads its options (options_as)
        if arity is not None:
            problem = arity.problem(len(ins), len(outs))
            if problem is not None:
                raise self.fail(f"{at} {problem}")
            for p, i in enumerate(ins) if -1 in ins else ():
                if i == -1 and p not in arity.optional:
                    raise self.fail(f"{at} leaves out input {p}, which is not optional")
        if -1 in outs:
            raise self.fail(f"{at} lists tensor -1 as an output")
        if len(set(outs)) != len(outs):
            raise self.fail(f"{at} lists an output twice")
        both = set(ins) & set(outs)
        if both:
            raise self.fail(f"{at} has tensor {min(both)} as both an input and an output")
        for field_name in _SUBGRAPH_FIELDS.get(name, ()) if info.options is not None else ():
            s = int(getattr(info.options, field_name)())
            if not 0 <= s < self.n_subgraphs:
                raise self.fail(f"{at} names subgraph {s} of {self.n_subgraphs} "
                                f"({field_name})")
        return info

    def options(self, kind: int, at: int, table: str) -> Any:
        """The operator's options (of type ``kind``, the table at ``at``, 0 when absent) as
        ``table``, as :func:`_options` reads them."""
        if kind != _OPTION_KINDS[table] or not at:
            return default_options(table)
        opts = _read_once(table)()
        opts.Init(self.data, at)
        return opts

    def subgraph(self, s: int) -> SubgraphInfo:
        data, limit = self.data, len(self.data)
        sg = self.lf.model.Subgraphs(s)
        f = schema.fields(data, sg._tab.Pos, _SG_NAME + 1)
        where = f"subgraph {s}"
        positions = schema.tables(data, f[_SG_TENSORS])
        n_t = _bounded(positions.size, limit, "tensors", self.name)
        op_positions = schema.tables(data, f[_SG_OPERATORS])
        _bounded(op_positions.size, limit, "operators", self.name)
        at = schema.field_positions(data, op_positions, _O_CUSTOM_OPTIONS + 1)
        options = at[:, _O_OPTIONS]
        read = zip(schema.scalars_at(data, at[:, _O_OPCODE], "<u4"),
                   schema.int32s_at(data, at[:, _O_INPUTS]),
                   schema.int32s_at(data, at[:, _O_OUTPUTS]),
                   schema.scalars_at(data, at[:, _O_OPTIONS_TYPE], "u1"),
                   np.where(options != 0, schema.tables_at(data, options), 0).tolist())
        ops = [self.operator(p, f, k, n_t, where, r) for k, (p, f, r) in enumerate(zip(
            op_positions.tolist(), at.tolist(), read))]
        ins = self.indexes(schema.int32s(data, f[_SG_INPUTS]), n_t, f"{where} inputs")
        outs = self.indexes(schema.int32s(data, f[_SG_OUTPUTS]), n_t, f"{where} outputs")
        if -1 in ins or -1 in outs:
            raise self.fail(f"{where} lists tensor -1 as an input or output")
        used = set(ins) | set(outs)
        writer: dict[int, int] = {}
        for op in ops:
            used.update(op.inputs)
            for i in op.outputs:
                if i in writer:
                    raise self.fail(f"{where} tensor {i} is written by operators "
                                    f"{writer[i]} and {op.index}")
                writer[i] = op.index
        used.update(writer)
        at = schema.field_positions(data, positions, _T_SIGNATURE + 1)
        read = zip(schema.scalars_at(data, at[:, _T_TYPE], "i1"),
                   schema.scalars_at(data, at[:, _T_BUFFER], "<u4"),
                   schema.scalars_at(data, at[:, _T_VARIABLE], "u1"),
                   schema.int32s_at(data, at[:, _T_SHAPE]),
                   schema.int32s_at(data, at[:, _T_SIGNATURE]))
        rows = at.tolist()
        quant = np.flatnonzero(at[:, _T_QUANT])
        q_rows: list[list[int] | None] = [None] * len(rows)
        for i, q in zip(quant.tolist(), schema.fields_of(
                data, schema.tables_at(data, at[quant, _T_QUANT]), _Q_DIM + 1)):
            q_rows[i] = q
        tensors = [self.tensor(f, q, i, where, i in used, r) for i, (f, q, r) in
                   enumerate(zip(rows, q_rows, read))]
        graph_inputs = set(ins)
        for i, k in writer.items():
            if i in graph_inputs:
                raise self.fail(f"{where} operator {k} ({ops[k].name}) writes "
                                f"{tensors[i].describe()}, an input of the subgraph")
            if tensors[i].has_data:
                raise self.fail(f"{where} operator {k} ({ops[k].name}) writes "
                                f"{tensors[i].describe()}, a constant")
        return SubgraphInfo(s, schema.string(data, f[_SG_NAME]), tensors, ops, ins, outs)



def _signature_fits(sig: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Each entry of a shape_signature equals the shape's or is -1."""
    if len(sig) != len(shape):
        return False
    for s, d in zip(sig, shape):
        if s != d and s != -1:
            return False
    return True


def _count(shape: tuple[int, ...]) -> int:
    """Elements of a shape of non-negative dimensions, as numpy's int64 product gives it
    (exact below 2^63, which ``math.prod`` reaches without an array)."""
    n = math.prod(shape)
    return n if n < 1 << 63 else int(np.prod(shape, dtype=np.int64))


def _typed(content: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A buffer's bytes as ``dtype``: a read-only view of the file (the file's bytes are
    immutable, so the view is as safe as a copy and costs nothing), copied only when the
    data is not aligned for its type."""
    if content.size % dtype.itemsize:
        raise ValueError(f"{content.size} bytes of data for {dtype} elements")
    arr = content.view(dtype)
    return arr if arr.flags.aligned else arr.copy()


def _options(op: tflite.Operator, table: str | None) -> Any:
    """The operator's options as ``table``: the schema's defaults when the file has none or
    has another table (TFLite reads those as absent); None when the builtin reads none."""
    if table is None:
        return None
    kind = int(op.BuiltinOptionsType())
    found = op.BuiltinOptions() if kind == getattr(BuiltinOptions, table) else None
    if found is None:
        return default_options(table)
    opts = getattr(tflite, table)()
    opts.Init(found.Bytes, found.Pos)
    return opts


@functools.cache
def _read_once(table: str) -> type:
    """The schema's class of options table ``table`` with its scalar fields (strides,
    padding, dilation...) all read from the file when it is initialised, each from one
    read of the vtable: the kernel rules and the converter read an operator's options a
    dozen times, each read through the generated accessor costing a handful of Python
    calls. Each field's accessor is then a C callable answering the value read (the
    object's own) or the default (the class's, for a field the table leaves out):
    ``itertools.repeat(value).__next__``, no Python frame per read. The values are
    those the accessors give (same struct, same default; the file's bytes do not change);
    the other accessors (vectors, tables) are the generated ones."""
    base = getattr(tflite, table)
    scalars = {name: found for name, fn in vars(base).items()
               if (found := _scalar_field(fn)) is not None}
    if not scalars:
        return base
    defaults = default_options(table)  # the generated accessors' answers when absent
    # An absent field's accessor is the class's, answering the default; a present one's the
    # object's own (no __slots__: each object holds the accessors of its present fields).
    ns: dict[str, Any] = {name: repeat(getattr(defaults, name)()).__next__
                          for name in scalars}
    #: (name, vtable entry, struct) of each field.
    fields = tuple((name, (voffset - 4) // 2, fmt) for name, (voffset, fmt) in scalars.items())
    last = max(voffset for voffset, _ in scalars.values())

    def init(self: Any, buf: Any, pos: int) -> None:
        self._tab = flatbuffers.table.Table(buf, pos)
        vt = pos - _I32.unpack_from(buf, pos)[0]
        vsize = _U16.unpack_from(buf, vt)[0]
        entries = _vtable(min(max(vsize - 4, 0), last - 2) // 2).unpack_from(buf, vt + 4) \
            if vsize > 4 else ()
        n = len(entries)
        vars(self).update({name: repeat(fmt.unpack_from(buf, pos + o)[0]).__next__
                           for name, k, fmt in fields if k < n and (o := entries[k])})

    ns["Init"] = init
    return type(table, (base,), ns)


def _scalar_field(fn: Any) -> tuple[int, struct.Struct] | None:
    """(vtable offset, struct) of a generated accessor of one scalar field, None for any
    other method. flatc writes each one alike: ``o = ...Offset(V)``, then
    ``self._tab.Get(number_types.<Type>Flags, o + self._tab.Pos)`` (inside ``bool()`` for a
    bool), else its default; a test holds every options table's accessors to that."""
    code = getattr(fn, "__code__", None)
    if code is None or code.co_argcount != 1 or len(code.co_consts) < 3 or \
            code.co_consts[0] is not None or type(code.co_consts[1]) is not int:
        return None
    names = [n for n in code.co_names if n != "bool"]
    if names[:7] != ["flatbuffers", "number_types", "UOffsetTFlags", "py_type", "_tab",
                     "Offset", "Get"] or names[8:] != ["Pos"] or len(names) != 9 or \
            not names[7].endswith("Flags") or \
            ("bool" in code.co_names and names[7] != "BoolFlags"):
        return None
    flags = getattr(flatbuffers.number_types, names[7], None)
    packer = getattr(flags, "packer_type", None)
    return None if packer is None else (code.co_consts[1], packer)


@functools.cache
def _vtable(k: int) -> struct.Struct:
    return struct.Struct(f"<{k}H")


_U16 = struct.Struct("<H")


@functools.cache
def default_options(table: str) -> Any:
    """An options table with every field at its schema default (one per table, shared: a
    reader that nobody writes to)."""
    obj = getattr(tflite, table)()
    obj.Init(*_empty_table())
    return obj


@functools.cache
def _empty_table() -> tuple[bytes, int]:
    """A flatbuffer holding one table without fields (any table's defaults), and where."""
    b = flatbuffers.Builder(16)
    b.StartObject(0)
    b.Finish(b.EndObject())
    data = bytes(b.Output())
    return data, flatbuffers.encode.Get(flatbuffers.packer.uoffset, data, 0)


def read_model(lf: schema.LoadedFile, dynamic_shapes: bool = False) -> list[SubgraphInfo]:
    """Every subgraph as records, after the structural rules TFLite's reader and interpreter
    apply (indices in range, one writer per tensor, shapes, quantization, buffer sizes,
    operand counts per builtin). Each tensor's shape is its ``shape`` field (the shape TFLite
    allocates when nobody resizes an input), or with ``dynamic_shapes`` its
    ``shape_signature`` where that marks a dimension -1, which becomes 0 (unknown)."""
    with lf.guard():
        n = _bounded(lf.model.SubgraphsLength(), len(lf.data), "subgraphs", lf.name)
        _bounded(lf.model.BuffersLength(), len(lf.data), "buffers", lf.name)
        _bounded(lf.model.OperatorCodesLength(), len(lf.data), "operator codes", lf.name)
        reader = _Reader(lf, dynamic_shapes)
        return [reader.subgraph(s) for s in range(n)]


#: TFLite tensor types that have no HAL operand type at all.
UNREPRESENTABLE = {TT.STRING, TT.INT64, TT.COMPLEX64, TT.COMPLEX128, TT.FLOAT64, TT.UINT64,
                   TT.UINT32, TT.UINT16, TT.RESOURCE, TT.VARIANT}
