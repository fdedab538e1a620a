"""Compilation caching: saving a prepared model to client cache files and restoring it.

The driver asks for one file of each kind. The *model cache* is security-sensitive: it holds
the plan image (every operand description with its declared and inferred shape, every
operation, every subgraph's inputs and outputs, the small constants), the prepared model's
priority, and the length and SHA-256 digest of the data cache, followed by an HMAC-SHA256 tag
over the cache token and every byte before the tag, keyed with a secret of this driver (random
per device object, or kept in a key file: see :func:`load_or_create_key`). The *data cache*
holds the constant tensors' bytes, ready to be used in place.

Restoring reads each file exactly once into memory, so a client rewriting the files
concurrently can only make the restore fail, never change what was verified. The tag is checked
before anything is decoded (a flipped byte anywhere, a wrong token, a truncated or extended
file all fail it). Then a background task decodes the image while the calling thread hashes the
data cache; kernels are bound only once the digest has matched. Since the tag proves that this
driver wrote the image after validating and planning the model, restoring runs neither
validation nor shape inference again. The decoder is nevertheless strict: every count, index,
type and location is checked before use, and nothing in the files can make it allocate more
than the files' own size.

While a plan built for a given cache is still alive in this process (its prepared model is still
held by a client), a restore of that exact cache (same tag) reuses the plan instead of
rebuilding it; plans are immutable and safe to share between prepared models.

Layout, little-endian. Model cache::

    magic "NNHALMC2" | u32 format | u32 reserved | u64 body length | body | tag (32 bytes)
    body: u8 priority, u8 relaxed, u64 data length, 32-byte data SHA-256, str driver version,
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

import hashlib
import hmac
import logging
import math
import operator
import os
import secrets
import stat
import struct
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nnhal.driver.prepared_model import ReferencePreparedModel
from nnhal.executor import ModelPlan
from nnhal.executor.plan import SubgraphPlan
from nnhal.hal.checks import InvalidArgument, check_deadline, check_token
from nnhal.hal.interfaces import IPreparedModel, IPreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    ExtensionNameAndPrefix,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Priority,
    Subgraph,
    SymmPerChannelQuantParams,
)
from nnhal.ops.registry import OperandInfo

if TYPE_CHECKING:
    from nnhal.driver.device import ReferenceDevice

log = logging.getLogger("nnhal.driver.cache")

#: getNumberOfCacheFilesNeeded: one security-sensitive model cache file, one data cache file.
NUM_MODEL_CACHE = 1
NUM_DATA_CACHE = 1
MAGIC = b"NNHALMC2"
FORMAT_VERSION = 2
TAG_SIZE = 32
#: The largest model cache accepted: it holds structure only, never constant data.
MAX_MODEL_CACHE_BYTES = 256 << 20
#: The largest data cache accepted (its exact length is also bound by the model cache).
MAX_DATA_CACHE_BYTES = 1 << 36
DATA_ALIGN = 16
_HMAC_DOMAIN = b"nnhal compilation cache v1\0"

_HEADER = struct.Struct("<8sIIQ")
_BODY_HEAD = struct.Struct("<BBQ32s")
_U32 = struct.Struct("<I")
_U32_DTYPE = np.dtype("<u4")
_F64_DTYPE = np.dtype("<f8")
#: One operand description of the plan image (packed, little-endian). Section 0: the
#: model cache's small constants, 1: the data cache. Inferred rank -1: unknown rank.
_OPERAND_REC = np.dtype([
    ("type", "<u4"), ("scale", "<f8"), ("zero_point", "<i4"), ("lifetime", "u1"),
    ("extra", "u1"), ("section", "u1"), ("rank", "<u4"), ("inferred_rank", "<i4"),
    ("offset", "<u8"), ("length", "<u8")])

_LIFETIMES = {int(v): v for v in OperandLifeTime}
_OPERAND_TYPES = {int(v): v for v in OperandType}
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


class CacheError(Exception):
    """A cache could not be written, or a cache file is not one this driver wrote."""


class CacheArgumentError(Exception):
    """Cache handles or token are malformed (INVALID_ARGUMENT for prepareModelFromCache)."""


# ---- handles and token ---------------------------------------------------------------------

def handle_fd(handle: Any) -> int:
    """The file descriptor of a cache handle: an int, an object with ``fileno()``, or a
    native-handle-like sequence holding exactly one of those."""
    if isinstance(handle, (list, tuple)):
        if len(handle) != 1:
            raise CacheArgumentError(f"a cache handle must hold exactly one fd, not {len(handle)}")
        handle = handle[0]
    if isinstance(handle, bool) or handle is None:
        raise CacheArgumentError(f"not a file descriptor: {handle!r}")
    try:
        fileno = getattr(handle, "fileno", None)
        fd = operator.index(fileno() if callable(fileno) else handle)
    except (TypeError, ValueError, OSError) as e:
        raise CacheArgumentError(f"not a usable file descriptor: {e}") from e
    if not 0 <= fd <= 0x7FFF_FFFF:  # a C int: anything else is no descriptor at all
        raise CacheArgumentError(f"file descriptor {fd} outside [0, INT_MAX]")
    return fd


def token_bytes(token: Any) -> bytes:
    """The cache token as bytes; it must be exactly BYTE_SIZE_OF_CACHE_TOKEN long."""
    try:
        return check_token(token)
    except InvalidArgument as e:
        raise CacheArgumentError(str(e)) from None


def _handle_fds(handles: Any, needed: int, what: str) -> list[int]:
    try:
        items = list(handles) if handles is not None else []
    except TypeError as e:
        raise CacheArgumentError(f"{what}: not a sequence of handles") from e
    if len(items) != needed:
        raise CacheArgumentError(f"{what}: {len(items)} handles, expected {needed}")
    return [handle_fd(h) for h in items]


# ---- file access ----------------------------------------------------------------------------

def write_file(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Truncate the file, then write ``data`` from offset 0 whatever the fd's own offset."""
    os.ftruncate(fd, 0)
    view = memoryview(data).cast("B")
    pos = 0
    while pos < len(view):
        n = os.pwrite(fd, view[pos:pos + (64 << 20)], pos)
        if n <= 0:
            raise CacheError("short write")
        pos += n


def read_file(fd: int, limit: int) -> bytes:
    """The whole file from offset 0 (never the fd's own offset), at most ``limit`` bytes."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise CacheError(f"cache file of {size} bytes exceeds {limit}")
    parts = []
    pos = 0
    # One byte more than the size: a file that grew meanwhile is detected, not truncated.
    while pos <= size:
        chunk = os.pread(fd, size + 1 - pos, pos)
        if not chunk:
            break
        parts.append(chunk)
        pos += len(chunk)
    if pos > size:
        raise CacheError("cache file changed while being read")
    return parts[0] if len(parts) == 1 else b"".join(parts)


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
    head = _BODY_HEAD.pack(int(Priority(priority)), int(bool(
        model.relax_computation_float32_to_float16)), len(data), hashlib.sha256(data).digest())
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
class BodyHead:
    priority: Priority
    relaxed: bool
    data_length: int
    data_digest: bytes


def decode_head(body: bytes | memoryview) -> BodyHead:
    r = _Reader(body)
    prio, relaxed, n, digest = r.take(_BODY_HEAD)
    if prio not in (0, 1, 2) or relaxed not in (0, 1):
        raise CacheError("bad priority or relaxed flag")
    return BodyHead(Priority(prio), bool(relaxed), n, digest)


@dataclass
class PlanImage:
    """A decoded model cache: subgraph plans (main first) ready for ModelPlan.restore, and
    the main subgraph's signature (its inputs then its outputs) for request checks."""

    relaxed: bool
    subgraphs: list[SubgraphPlan]
    signature: Subgraph
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
    r = _Reader(body, _BODY_HEAD.size)
    if r.str() != driver_version:
        raise CacheError("written by another driver version")
    exts = []
    for _ in range(r.count(8)):
        prefix = r.u32()
        exts.append(ExtensionNameAndPrefix(r.str(), prefix))
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
        kinds = _TYPE_KINDS.get(t)
        lifetime = _LIFETIMES.get(lt)
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
                                 lifetime, value))
        inferred.append(inf)
    if dpos != len(dims) or ipos != len(inf_dims):
        raise CacheError("dimension arrays do not match the operands")
    io_consumers = r.u32s()
    n_subgraphs = r.count(16)
    if n_subgraphs < 1:
        raise CacheError("no main subgraph")
    if any(rec[3] == _SUBGRAPH and rec[8] >= n_subgraphs - 1 for rec in recs):
        raise CacheError("bad subgraph reference")
    plans: list[SubgraphPlan] = []
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
            operations.append((t, tuple(flat[fpos:fpos + n_in]),
                               tuple(flat[fpos + n_in:end])))
            fpos = end
        if fpos != len(flat):
            raise CacheError("operation indexes do not match the operations")
        ins, outs = r.u32s(), r.u32s()
        if any(i >= n_operands for i in (*ins, *outs)):
            raise CacheError("subgraph input or output out of range")
        plan = SubgraphPlan(sg_index - 1, [infos[j] for j in idx], operations, ins, outs,
                            [inferred[j] for j in idx])
        plans.append(plan)
        if sg_index == 0:
            io = [idx[i] for i in (*ins, *outs)]
            if len(io_consumers) != len(io):
                raise CacheError("main inputs and outputs do not match")
            signature = Subgraph(
                [_operand(recs[j], declared_dims[j], extras[j], c)
                 for j, c in zip(io, io_consumers)], [],
                list(range(len(ins))), list(range(len(ins), len(io))))
    if r.pos != len(body):
        raise CacheError("trailing bytes in the model cache")
    assert signature is not None
    return PlanImage(head.relaxed, plans, signature, exts)


def _operand(rec: tuple[Any, ...], dims: list[int],
             extra: SymmPerChannelQuantParams | bytes | None, consumers: int) -> Operand:
    """The Operand of a main input or output, for request and memory-domain role checks."""
    t, scale, zp, lt = rec[:4]
    return Operand(type=_OPERAND_TYPES[t], dimensions=list(dims),
                   number_of_consumers=consumers, scale=scale, zero_point=zp,
                   lifetime=_LIFETIMES[lt], location=DataLocation(), extra_params=extra)


# ---- the driver's secret --------------------------------------------------------------------

KEY_BYTES = 32


def load_or_create_key(path: str | os.PathLike[str]) -> bytes:
    """The cache-authentication secret kept in ``path``, created (mode 0600) if absent.

    The file must be a regular file of exactly KEY_BYTES bytes that only its owner can read or
    write: a secret others can read would let them forge model caches. Raises ValueError
    otherwise, or OSError when the file cannot be read or created.
    """
    if not os.path.lexists(path):
        # Written to a private temporary file, then linked into place: a concurrent creator
        # (another process) either wins the link or reads the complete winner.
        key = secrets.token_bytes(KEY_BYTES)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                                   prefix=".nnhal-key-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(key)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            except OSError:  # no hard links here: create it in place
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o600)
                except FileExistsError:
                    pass
                else:
                    with os.fdopen(fd, "wb") as f:
                        f.write(key)
        finally:
            os.unlink(tmp)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise ValueError(f"cache key file {os.fspath(path)!r} must be a regular file "
                             "accessible to its owner only (mode 0600)")
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise ValueError(f"cache key file {os.fspath(path)!r} must hold {KEY_BYTES} bytes")
    return key


# ---- the driver's cache ---------------------------------------------------------------------

class SaveJob:
    """Duplicated descriptors of validated cache handles, owned until :meth:`close`."""

    def __init__(self, model_fds: list[int], data_fds: list[int], token: bytes):
        self.model_fds = model_fds
        self.data_fds = data_fds
        self.token = token

    def close(self) -> None:
        fds, self.model_fds, self.data_fds = self.model_fds + self.data_fds, [], []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        self.close()


class _Once:
    """Notifies an IPreparedModelCallback at most once, swallowing client exceptions."""

    def __init__(self, callback: IPreparedModelCallback):
        self.callback = callback
        self.done = False
        self.lock = threading.Lock()

    def __call__(self, status: ErrorStatus, prepared: IPreparedModel | None = None) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
        try:
            self.callback.notify(status, prepared)
        except Exception:  # noqa: BLE001 - a failing client callback must not kill the driver
            pass


@dataclass
class _Loaded:
    head: BodyHead
    tag: bytes
    plan: ModelPlan | None = None
    body: bytes | memoryview = b""
    data: bytes = b""

    def data_matches(self) -> bool:
        # One call: hashlib releases the GIL for all of it, so another thread can decode.
        return hmac.compare_digest(hashlib.sha256(self.data).digest(), self.head.data_digest)


class CompilationCache:
    """A driver instance's compilation cache: its secret key and its live restorable plans.

    ``key`` defaults to a fresh random secret, so caches are valid for this driver instance
    only; pass a persistent key (e.g. read from a driver-owned file) for caches that survive
    restarts. ``driver_version`` is bound into every cache.
    """

    def __init__(self, driver_version: str = "", key: bytes | None = None):
        self._key = bytes(key) if key is not None else secrets.token_bytes(32)
        if len(self._key) < 16:
            raise ValueError("cache key too short")
        self.driver_version = driver_version
        self._live: weakref.WeakValueDictionary[bytes, ModelPlan] = \
            weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    # ---- keyed integrity ------------------------------------------------------------------
    def _tag(self, token: bytes, content: bytes | memoryview) -> bytes:
        mac = hmac.new(self._key, _HMAC_DOMAIN, hashlib.sha256)
        mac.update(token)
        mac.update(content)
        return mac.digest()

    def forget_live_plans(self) -> None:
        """Drop the table of live plans, so the next restores rebuild (tests, benchmarks)."""
        with self._lock:
            self._live.clear()

    def _remember(self, tag: bytes, plan: ModelPlan) -> None:
        try:
            with self._lock:
                self._live[tag] = plan
        except TypeError:  # not weak-referenceable: just do not remember it
            pass

    # ---- saving ---------------------------------------------------------------------------
    def open_save(self, model_cache: Any, data_cache: Any, token: Any) -> SaveJob | None:
        """A SaveJob when the cache arguments of prepareModel are usable, else None.

        Cache arguments never fail prepareModel: with both vectors empty the token is ignored;
        with wrong counts, a bad token or a bad handle, the model is prepared but not saved.
        """
        try:
            if not model_cache and not data_cache:
                return None
            model_fds = _handle_fds(model_cache, NUM_MODEL_CACHE, "model cache")
            data_fds = _handle_fds(data_cache, NUM_DATA_CACHE, "data cache")
            tok = token_bytes(token)
            for fd in (*model_fds, *data_fds):  # all open, before a dup takes a closed number
                os.fstat(fd)
        except Exception as e:  # noqa: BLE001 - CacheArgumentError, or a handle that raised
            log.debug("not saving to cache: %s: %s", type(e).__name__, e)
            return None
        job = SaveJob([], [], tok)
        try:
            for fd in model_fds:
                job.model_fds.append(os.dup(fd))
            for fd in data_fds:
                job.data_fds.append(os.dup(fd))
        except OSError as e:
            log.debug("not saving to cache: %s", e)
            job.close()
            return None
        return job

    def save(self, job: SaveJob, model: Model, priority: Priority,
             prepared: IPreparedModel | None) -> bool:
        """Write the caches of a successfully prepared model; never raises, closes ``job``."""
        try:
            if prepared is None:
                return False
            plan = getattr(prepared, "plan", None)
            if not isinstance(plan, ModelPlan):
                return False
            body, data = encode_model(model, plan, priority, self.driver_version)
            head = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body))
            content = head + body
            tag = self._tag(job.token, content)
            # The model cache is the commit point: invalidate it first, write it last.
            os.ftruncate(job.model_fds[0], 0)
            write_file(job.data_fds[0], data)
            write_file(job.model_fds[0], content + tag)
            self._remember(tag, plan)
            return True
        except Exception as e:  # noqa: BLE001 - saving must never fail the preparation
            log.info("saving to cache failed: %s: %s", type(e).__name__, e)
            for fd in job.model_fds:
                try:
                    os.ftruncate(fd, 0)
                except OSError:
                    pass
            return False
        finally:
            job.close()

    # ---- restoring ------------------------------------------------------------------------
    def load(self, model_fd: int, data_fd: int, token: bytes) -> _Loaded:
        """Read both files and verify the model cache. The data cache is verified by its
        digest later, unless a live plan has the same tag: then it is not needed at all."""
        blob = read_file(model_fd, MAX_MODEL_CACHE_BYTES)
        if len(blob) < _HEADER.size + _BODY_HEAD.size + TAG_SIZE:
            raise CacheError("model cache too short")
        content = memoryview(blob)[:-TAG_SIZE]
        tag = self._tag(token, content)
        if not hmac.compare_digest(tag, blob[-TAG_SIZE:]):
            raise CacheError("model cache or token does not match (integrity check failed)")
        magic, version, _reserved, body_len = _HEADER.unpack_from(blob, 0)
        if magic != MAGIC or version != FORMAT_VERSION or \
                body_len != len(blob) - _HEADER.size - TAG_SIZE:
            raise CacheError("unknown model cache format")
        body = content[_HEADER.size:]
        head = decode_head(body)
        if head.data_length > MAX_DATA_CACHE_BYTES:
            raise CacheError("data cache too large")
        with self._lock:
            plan = self._live.get(tag)
        if plan is not None:
            # The live plan already holds the constants: the data cache is not needed, so
            # only its length is checked; whatever it holds cannot change any result.
            if os.fstat(data_fd).st_size != head.data_length:
                raise CacheError("data cache has the wrong length")
            os.pread(data_fd, 1, 0)  # as on the cold path, it must be readable
            return _Loaded(head, tag, plan=plan)
        data = read_file(data_fd, head.data_length)
        if len(data) != head.data_length:
            raise CacheError("data cache has the wrong length")
        return _Loaded(head, tag, body=body, data=data)

    def prepare_from_cache(self, device: ReferenceDevice, deadline: int | None,
                           model_cache: Any, data_cache: Any, token: Any,
                           callback: IPreparedModelCallback) -> ErrorStatus:
        """prepareModelFromCache_1_3 for ``device``: the callback is notified exactly once."""
        if callback is None or not hasattr(callback, "notify"):
            return ErrorStatus.INVALID_ARGUMENT
        notify = _Once(callback)
        try:
            check_deadline(deadline)
            model_fds = _handle_fds(model_cache, NUM_MODEL_CACHE, "model cache")
            data_fds = _handle_fds(data_cache, NUM_DATA_CACHE, "data cache")
            tok = token_bytes(token)
        except Exception as e:  # noqa: BLE001 - CacheArgumentError, or a handle that raised
            device.log(f"prepareModelFromCache rejected: {type(e).__name__}: {e}")
            notify(ErrorStatus.INVALID_ARGUMENT)
            return ErrorStatus.INVALID_ARGUMENT
        if deadline is not None and time.monotonic_ns() > deadline:
            notify(ErrorStatus.MISSED_DEADLINE_PERSISTENT)
            return ErrorStatus.MISSED_DEADLINE_PERSISTENT
        try:
            loaded = self.load(model_fds[0], data_fds[0], tok)
        except Exception as e:  # noqa: BLE001 - OSError, CacheError, anything: a clean failure
            device.log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
            notify(ErrorStatus.GENERAL_FAILURE)
            return ErrorStatus.GENERAL_FAILURE
        priority = loaded.head.priority
        if loaded.plan is not None:
            try:
                pm = ReferencePreparedModel(device, loaded.plan, priority)
            except Exception as e:  # noqa: BLE001
                device.log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
                notify(ErrorStatus.GENERAL_FAILURE)
                return ErrorStatus.GENERAL_FAILURE
            notify(ErrorStatus.NONE, pm)
            return ErrorStatus.NONE

        # The background task decodes the verified structure while this thread hashes the
        # data cache (hashlib releases the GIL); the task binds no kernel before the digest
        # has matched. Both take about as long, so the restore costs about one of them.
        hashed = threading.Event()
        data_ok: list[bool] = []

        def task() -> None:
            try:
                image = decode_image(loaded.body, loaded.head, loaded.data,
                                     self.driver_version)
                hashed.wait()
                if data_ok != [True]:
                    raise CacheError("data cache was modified")
                # The tag proves this driver validated and planned exactly this model.
                plan = ModelPlan.restore(image.relaxed, image.subgraphs, image.signature)
                if deadline is not None and time.monotonic_ns() > deadline:
                    notify(ErrorStatus.MISSED_DEADLINE_TRANSIENT)
                    return
                self._remember(loaded.tag, plan)
                notify(ErrorStatus.NONE, ReferencePreparedModel(device, plan, priority))
            except Exception as e:  # noqa: BLE001
                device.log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
                notify(ErrorStatus.GENERAL_FAILURE)

        try:
            device.executor_for(priority).submit(task)
        except Exception:  # noqa: BLE001 - e.g. the pool was shut down
            notify(ErrorStatus.GENERAL_FAILURE)
            return ErrorStatus.GENERAL_FAILURE
        ok = False
        try:
            ok = loaded.data_matches()
        except Exception as e:  # noqa: BLE001 - the task then reports the failure
            device.log(f"prepareModelFromCache: hashing the data cache failed: {e}")
        finally:
            data_ok.append(ok)
            hashed.set()
        return ErrorStatus.NONE
