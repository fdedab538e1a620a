"""The reference driver's compilation caching: its plan image in the common cache container.

The container (:mod:`nnhal.drivers.common.compilation_cache`) handles the files, the key, the
HMAC tag, the header and the body head, and the table of live plans. What the reference driver
puts in it is the *plan image*: every operand description with its declared and inferred
shape, every operation, every subgraph's inputs and outputs, the small constants (in the
authenticated model cache), and the constant tensors' bytes in the data cache, ready to be used
in place.

A restore decodes the image while the data cache is being hashed and binds kernels only once
the digest has matched. Since the tag proves that this driver wrote the image after validating
and planning the model, restoring runs neither validation nor shape inference again. The
decoder is nevertheless strict: every count, index, type and location is checked before use,
and nothing in the files can make it allocate more than the files' own size.

Layout of the model cache body after the container's body head (u8 priority, u8 relaxed,
u64 data length, 32-byte data BLAKE3 digest), little-endian::

    str driver version,
    u32 n {u32 prefix, str extension name},
    u32 n, n bytes: small constants (each at most 128 bytes, 16-byte aligned),
    u32 n, n operand descriptions (_OPERAND_REC: type, scale, zero point, lifetime,
      extra kind, section, rank, inferred rank, offset, length),
    u32 n, n x u32: declared dims of all descriptions; u32 n, n x u32: inferred dims,
    per description with extra params: (u32 channel dim, u32 n, n x f64) or (u32 n, bytes),
    u32 n, n x u32: numberOfConsumers of the main inputs then outputs,
    u32 subgraph count (main first) {u32 n, n x u32 description per operand,
      u32 operation count, 3 x u32 (type, #inputs, #outputs) per operation,
      u32 n, n x u32 operand indexes of all operations, u32 n {input}, u32 n {output}}
    str: u32 length, UTF-8 bytes

Data cache: every constant larger than 128 bytes, each source region once, 16-byte aligned.
Boolean constants are stored as 0/1 so they can be viewed in place.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnhal.analysis import MAX_TENSOR_BYTES, ModelGraph, SubgraphGraph
from nnhal.analysis.analyser import required_inputs
from nnhal.drivers.common.compilation_cache import (
    BODY_HEAD_SIZE,
    BodyHead,
    CacheError,
    CompilationCache,
    Loaded,
    encode_head,
)
from nnhal.executor import ModelPlan
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import (
    LIFETIMES,
    DataLocation,
    ExtensionNameAndPrefix,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Priority,
    Subgraph,
    SymmPerChannelQuantParams,
    is_extension_type,
)
from nnhal.ops import extensions
from nnhal.ops.resolver import OperandInfo

DATA_ALIGN = 16
_U32 = struct.Struct("<I")
_U32_DTYPE = np.dtype("<u4")
_F64_DTYPE = np.dtype("<f8")
#: One operand description of the plan image (packed, little-endian). Section 0: the
#: model cache's small constants, 1: the data cache. Inferred rank -1: unknown rank.
_OPERAND_REC = np.dtype([
    ("type", "<u4"), ("scale", "<f8"), ("zero_point", "<i4"), ("lifetime", "u1"),
    ("extra", "u1"), ("section", "u1"), ("rank", "<u4"), ("inferred_rank", "<i4"),
    ("offset", "<u8"), ("length", "<u8")])

_NO_EXTRA, _CHANNEL_QUANT, _EXTENSION_BYTES = 0, 1, 2
_CONST_COPY = int(OperandLifeTime.CONSTANT_COPY)
_CONST_REF = int(OperandLifeTime.CONSTANT_REFERENCE)
_SUBGRAPH = int(OperandLifeTime.SUBGRAPH)
#: Per operand type code: (type, scalar-shaped, dtype of stored values, bytes per element).
_TYPE_KINDS: dict[int, tuple[OperandType, bool, np.dtype, int]] = {
    int(t): (t, t.is_scalar or t == OperandType.SUBGRAPH, t.dtype, t.byte_size)
    for t in OperandType}
#: Boolean types, whose constants the cache stores as 0/1 bytes so they can be viewed in place.
#: Constants up to this many bytes are kept in the (authenticated) model cache.
_SMALL_CONSTANT = 128
_BOOL_CODES = frozenset({int(OperandType.BOOL), int(OperandType.TENSOR_BOOL8)})


# ---- encoding -------------------------------------------------------------------------------

def _align(n: int) -> int:
    return (n + DATA_ALIGN - 1) // DATA_ALIGN * DATA_ALIGN


def _str(s: str) -> bytes:
    raw = s.encode("utf-8")
    return _U32.pack(len(raw)) + raw


def _u32s(values: Sequence[int]) -> bytes:
    return _U32.pack(len(values)) + np.asarray(values, dtype="<u4").tobytes()


def encode_model(model: Model, plan: ModelPlan, priority: Priority,
                 driver_version: str = "") -> tuple[bytes, bytes]:
    """(model cache body, data cache content) of a model this driver validated and planned.

    The body is the plan image: a table of distinct operand descriptions (type, quantization,
    lifetime, declared and inferred shape, where the constant's bytes are), each subgraph as
    indexes into that table plus its operations, inputs and outputs. Small constants travel in
    the body, deduplicated by content; tensors go to the data cache, each region once,
    aligned, ready to be used in place.
    """
    pools = [p.array() for p in model.pools]
    values = np.frombuffer(model.operand_values, dtype=np.uint8)
    sections = (bytearray(), bytearray())  # small constants (model cache), data cache
    regions: dict[tuple[Any, ...], int] = {}
    table: dict[tuple[Any, ...], int] = {}
    recs: list[tuple[Any, ...]] = []
    dims: list[int] = []
    inferred: list[int] = []
    extras: list[bytes] = []
    subgraph_parts: list[bytes] = []
    subgraphs = [model.main, *model.referenced]
    splans = [plan.main, *plan.referenced]
    if len(splans) != len(subgraphs):
        raise CacheError("plan does not match the model")
    for sg, splan in zip(subgraphs, splans):
        if len(splan.inferred) != len(sg.operands):
            raise CacheError("plan does not match the model")
        indexes: list[int] = []
        for k, op in enumerate(sg.operands):
            lt = int(op.lifetime)
            loc = op.location
            offset = length = in_data = 0
            if lt in (_CONST_COPY, _CONST_REF):
                src_pool = -1 if lt == _CONST_COPY else int(loc.pool_index)
                src = values if src_pool < 0 else pools[src_pool]
                raw = src[int(loc.offset):int(loc.offset) + int(loc.length)]
                if int(loc.offset) < 0 or raw.size != int(loc.length):
                    raise CacheError("constant outside its pool")
                if int(op.type) in _BOOL_CODES:  # stored as 0/1: viewable as np.bool_
                    raw = (raw != 0).astype(np.uint8)
                in_data = int(raw.size > _SMALL_CONSTANT)
                rkey = (1, src_pool, int(loc.offset), raw.size) if in_data else \
                    (0, raw.tobytes())
                where = regions.get(rkey)
                if where is None:
                    section = sections[in_data]
                    section.extend(b"\0" * (_align(len(section)) - len(section)))
                    where = regions[rkey] = len(section)
                    section.extend(memoryview(np.ascontiguousarray(raw)).cast("B"))
                offset, length = where, raw.size
            elif lt == _SUBGRAPH:
                offset = int(loc.offset)
            extra = op.extra_params
            if isinstance(extra, SymmPerChannelQuantParams):
                scales = [float(s) for s in extra.scales]
                kind = _CHANNEL_QUANT
                tail = struct.pack(f"<II{len(scales)}d", int(extra.channel_dim), len(scales),
                                   *scales)
            elif isinstance(extra, (bytes, bytearray)):
                kind, tail = _EXTENSION_BYTES, _U32.pack(len(extra)) + bytes(extra)
            elif extra is None:
                kind, tail = _NO_EXTRA, b""
            else:
                raise CacheError(f"unknown extra params {type(extra).__name__}")
            d = tuple(int(x) for x in op.dimensions)
            inf = splan.inferred[k]
            inf = None if inf is None else tuple(int(x) for x in inf)
            rec = (int(op.type), float(op.scale), int(op.zero_point), lt, kind, in_data,
                   len(d), -1 if inf is None else len(inf), offset, length)
            # Operands with equal descriptions share one entry (and one info on restore).
            key = (rec, d, inf, tail)
            j = table.get(key)
            if j is None:
                j = table[key] = len(recs)
                recs.append(rec)
                dims.extend(d)
                inferred.extend(inf or ())
                extras.append(tail)
            indexes.append(j)
        part = [_u32s(indexes)]
        heads: list[int] = []
        flat: list[int] = []
        for t, ins, outs in splan.operations:
            heads += [int(t), len(ins), len(outs)]
            flat += [*ins, *outs]
        part.append(_U32.pack(len(splan.operations)))
        part.append(np.asarray(heads, dtype="<u4").tobytes())
        part.append(_u32s(flat))
        part.append(_u32s(sg.input_indexes))
        part.append(_u32s(sg.output_indexes))
        subgraph_parts.append(b"".join(part))
    io = [*model.main.input_indexes, *model.main.output_indexes]
    out = [_str(driver_version), _U32.pack(len(model.extension_name_to_prefix))]
    for ext in model.extension_name_to_prefix:
        out.append(_U32.pack(int(ext.prefix)) + _str(str(ext.name)))
    out.append(_U32.pack(len(sections[0])) + bytes(sections[0]))
    out.append(_U32.pack(len(recs)) + np.array(recs, dtype=_OPERAND_REC).tobytes())
    out += [_u32s(dims), _u32s(inferred), *extras]
    out.append(_u32s([int(model.main.operands[i].number_of_consumers) for i in io]))
    out.append(_U32.pack(len(subgraphs)))
    out += subgraph_parts
    data = bytes(sections[1])
    head = encode_head(priority, model.relax_computation_float32_to_float16, data)
    return head + b"".join(out), data


# ---- decoding -------------------------------------------------------------------------------

class _Reader:
    """A bounds-checked cursor over verified bytes; every failure is a CacheError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def take(self, s: struct.Struct) -> tuple[Any, ...]:
        end = self.pos + s.size
        if end > len(self.buf):
            raise CacheError("model cache ends early")
        v = s.unpack_from(self.buf, self.pos)
        self.pos = end
        return v

    def u32(self) -> int:
        return self.take(_U32)[0]

    def count(self, item_size: int) -> int:
        """A count of items that must each still fit: no allocation beyond the file's size."""
        n = self.u32()
        if n * max(item_size, 1) > len(self.buf) - self.pos:
            raise CacheError(f"count {n} exceeds the model cache")
        return n

    def array(self, dtype: np.dtype, n: int) -> list[Any]:
        """``n`` items of ``dtype`` (n already checked by :meth:`count`), as Python values."""
        size = n * dtype.itemsize
        if self.pos + size > len(self.buf):
            raise CacheError("model cache ends early")
        v = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos).tolist()
        self.pos += size
        return v

    def u32s(self) -> list[int]:
        return self.array(_U32_DTYPE, self.count(4))

    def raw(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise CacheError("model cache ends early")
        v = bytes(self.buf[self.pos:end])
        self.pos = end
        return v

    def str(self) -> str:
        try:
            return self.raw(self.count(1)).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CacheError("bad string") from e



@dataclass
class PlanImage:
    """A decoded model cache: the analysed graph this driver wrote, ready to bind kernels."""

    graph: ModelGraph
    extensions: list[ExtensionNameAndPrefix]


def decode_image(body: bytes | memoryview, head: BodyHead, data: bytes | memoryview,
                 driver_version: str = "") -> PlanImage:
    """The plan image of a model cache body. Constants become read-only views into ``data``
    (nothing of ``data`` is read here: it may still be being verified). Every count, index,
    type and location is checked; anything wrong raises CacheError."""
    try:
        return _decode_image(body, head, data, driver_version)
    except CacheError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, struct.error) as e:
        raise CacheError(f"malformed model cache: {type(e).__name__}: {e}") from e


def _decode_image(body: bytes | memoryview, head: BodyHead, data: bytes | memoryview,
                  driver_version: str) -> PlanImage:
    r = _Reader(body, BODY_HEAD_SIZE)
    if r.str() != driver_version:
        raise CacheError("written by another driver version")
    exts = []
    for _ in range(r.count(8)):
        prefix = r.u32()
        exts.append(ExtensionNameAndPrefix(r.str(), prefix))
    resolved = extensions.resolve(exts)
    values = r.raw(r.count(1))  # small constants: verified with the model cache
    n_desc = r.count(_OPERAND_REC.itemsize)
    recs = r.array(_OPERAND_REC, n_desc)
    dims = r.u32s()
    inf_dims = r.u32s()
    sizes = {0: len(values), 1: len(data)}
    infos: list[OperandInfo] = []
    inferred: list[tuple[int, ...] | None] = []
    declared_dims: list[list[int]] = []
    extras: list[SymmPerChannelQuantParams | bytes | None] = []
    dpos = ipos = 0
    for k, (t, scale, zp, lt, kind, in_data, rank, irank, offset, length) in enumerate(recs):
        kinds = _TYPE_KINDS.get(t) or _extension_kinds(t, resolved)
        lifetime = LIFETIMES.get(lt)
        size = sizes.get(in_data)
        if kinds is None or lifetime is None or size is None:
            raise CacheError(f"operand {k}: bad type {t}, lifetime {lt} or section {in_data}")
        otype, scalar, dtype, itemsize = kinds
        if dpos + rank > len(dims) or irank < -1 or ipos + max(irank, 0) > len(inf_dims):
            raise CacheError(f"operand {k}: dimensions exceed the model cache")
        declared = dims[dpos:dpos + rank]
        declared_dims.append(declared)
        dpos += rank
        shape = () if scalar else (tuple(declared) if rank else None)
        if irank < 0:
            inf = None
        else:
            inf = tuple(inf_dims[ipos:ipos + irank])
            ipos += irank
            if inf == shape:
                inf = shape
        value: object = None
        if lt == _CONST_COPY or lt == _CONST_REF:
            # Views only: ``data`` may still be being verified; nothing of it is looked at
            # here, and kernels are bound only once its digest has matched.
            if shape is None or offset + length > size or \
                    length != itemsize * math.prod(shape):
                raise CacheError(f"operand {k}: constant does not fit its section")
            value = np.frombuffer(data if in_data else values, dtype, length // itemsize,
                                  offset)
            if len(shape) != 1:
                value = value.reshape(shape)
        elif lt == _SUBGRAPH:
            value = offset  # checked against the subgraph count below
        channel_scales = None
        channel_dim = 0
        extra: SymmPerChannelQuantParams | bytes | None = None
        if kind == _CHANNEL_QUANT:
            channel_dim = r.u32()
            scales = r.array(_F64_DTYPE, r.count(8))
            extra = SymmPerChannelQuantParams(scales, channel_dim)
            with np.errstate(over="ignore"):
                channel_scales = np.asarray(scales, dtype=np.float32)
        elif kind == _EXTENSION_BYTES:
            extra = r.raw(r.count(1))
        elif kind != _NO_EXTRA:
            raise CacheError(f"bad extra params kind {kind}")
        extras.append(extra)
        infos.append(OperandInfo(otype, shape, scale, zp, channel_scales, channel_dim,
                                 lifetime, value,
                                 extra if isinstance(extra, bytes) else None))
        inferred.append(inf)
    if dpos != len(dims) or ipos != len(inf_dims):
        raise CacheError("dimension arrays do not match the operands")
    io_consumers = r.u32s()
    n_subgraphs = r.count(16)
    if n_subgraphs < 1:
        raise CacheError("no main subgraph")
    if any(rec[3] == _SUBGRAPH and rec[8] >= n_subgraphs - 1 for rec in recs):
        raise CacheError("bad subgraph reference")
    plans: list[SubgraphGraph] = []
    ext_ops: dict[int, tuple[Any, Any]] = {}
    signature: Subgraph | None = None
    for sg_index in range(n_subgraphs):
        idx = r.u32s()
        if idx and max(idx) >= n_desc:
            raise CacheError("operand description index out of range")
        n_operands = len(idx)
        n_ops = r.count(12)
        heads = r.array(_U32_DTYPE, 3 * n_ops)
        flat = r.u32s()
        if flat and max(flat) >= n_operands:
            raise CacheError("operand index out of range")
        operations = []
        fpos = 0
        for j in range(n_ops):
            t, n_in, n_out = heads[3 * j:3 * j + 3]
            end = fpos + n_in + n_out
            if end > len(flat):
                raise CacheError("operation exceeds the model cache")
            operations.append((int(t), tuple(flat[fpos:fpos + n_in]),
                               tuple(flat[fpos + n_in:end])))
            if is_extension_type(t) and int(t) not in ext_ops:
                found = extensions.resolve_operation(int(t), resolved)
                if found is None:
                    raise CacheError(f"extension operation {int(t):#x} is unknown here")
                ext_ops[int(t)] = (found.id, found.definition)
            fpos = end
        if fpos != len(flat):
            raise CacheError("operation indexes do not match the operations")
        ins, outs = r.u32s(), r.u32s()
        if any(i >= n_operands for i in (*ins, *outs)):
            raise CacheError("subgraph input or output out of range")
        plans.append(SubgraphGraph(sg_index - 1, tuple(infos[j] for j in idx),
                                   tuple(inferred[j] for j in idx), tuple(operations),
                                   tuple(ins), tuple(outs), (True,) * len(operations)))
        if sg_index == 0:
            io = [idx[i] for i in (*ins, *outs)]
            if len(io_consumers) != len(io):
                raise CacheError("main inputs and outputs do not match")
            signature = Subgraph(
                [_operand(recs[j], infos[j].type, declared_dims[j], extras[j], c)
                 for j, c in zip(io, io_consumers)], [],
                list(range(len(ins))), list(range(len(ins), len(io))))
    if r.pos != len(body):
        raise CacheError("trailing bytes in the model cache")
    assert signature is not None
    graph = ModelGraph(plans[0], tuple(plans[1:]), head.relaxed, signature,
                       required_inputs(plans[0]), extension_ops=ext_ops)
    return PlanImage(graph, exts)


def _extension_kinds(t: int, resolved: Any) -> tuple[Any, bool, np.dtype, int] | None:
    """What :data:`_TYPE_KINDS` holds, for an extension operand type of the image's table
    (None when it is not one, or its extension or code is unknown here)."""
    if not is_extension_type(t):
        return None
    try:
        et = extensions.resolve_operand_type(int(t), resolved)
    except extensions.ExtensionError:
        return None
    return None if et is None else (et, et.is_scalar, et.dtype, et.byte_size)


def _operand(rec: tuple[Any, ...], otype: Any, dims: list[int],
             extra: SymmPerChannelQuantParams | bytes | None, consumers: int) -> Operand:
    """The Operand of a main input or output, for request and memory-domain role checks."""
    _, scale, zp, lt = rec[:4]
    return Operand(type=otype, dimensions=list(dims),
                   number_of_consumers=consumers, scale=scale, zero_point=zp,
                   lifetime=LIFETIMES[lt], location=DataLocation(), extra_params=extra)



# ---- the reference driver's cache ---------------------------------------------------------

class PlanCache(CompilationCache):
    """The reference driver's compilation cache: plan images in the common container.

    ``max_tensor_bytes`` bounds the temporaries of restored plans, and ``max_work`` the
    run-time work of their steps of shapes unknown at prepare, as for prepared ones.
    """

    def __init__(self, driver_version: str = "", key: bytes | None = None,
                 max_tensor_bytes: int = MAX_TENSOR_BYTES, max_work: int | None = None):
        super().__init__(driver_version, key)
        self.max_tensor_bytes = max_tensor_bytes
        self.max_work = max_work

    def encode(self, model: Model, priority: Priority, prepared: IPreparedModel
               ) -> tuple[bytes, bytes, ModelPlan] | None:
        plan = getattr(prepared, "plan", None)
        if not isinstance(plan, ModelPlan):
            return None
        body, data = encode_model(model, plan, priority, self.driver_version)
        return body, data, plan

    def decode(self, loaded: Loaded) -> PlanImage:
        return decode_image(loaded.body, loaded.head, loaded.data, self.driver_version)

    def bind(self, image: PlanImage) -> ModelPlan:
        return ModelPlan(image.graph, self.max_tensor_bytes, self.max_work)
