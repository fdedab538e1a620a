"""Compilation caching: saving a prepared model to client cache files and restoring it.

The driver asks for one file of each kind. The *model cache* is security-sensitive: it holds
the model's structure, the prepared model's priority, and the length and SHA-256 digest of the
data cache, followed by an HMAC-SHA256 tag over the cache token and every byte before the tag,
keyed with a secret that only this driver instance knows. The *data cache* holds the constants'
bytes, ready to use (no unpacking on restore).

Restoring reads each file exactly once into memory, so a client rewriting the files
concurrently can only make the restore fail, never change what was verified. The tag is checked
first (a flipped byte anywhere, a wrong token, a truncated or extended file all fail it), then
the data digest, and only then is anything decoded. Since the tag proves that this driver wrote
the structure after validating the model, the restored model is not validated again; the
decoder is nevertheless strict: every count and location is bounds-checked before use, and
nothing in the files can make it allocate more than the files' own size.

While a plan built for a given cache is still alive in this process (its prepared model is still
held by a client), a restore of that exact cache (same tag) reuses the plan instead of
rebuilding it; plans are immutable and safe to share between prepared models.

Layout, little-endian. Model cache::

    magic "NNHALMC1" | u32 format | u32 reserved | u64 body length | body | tag (32 bytes)
    body: u8 priority, u8 relaxed, u64 data length, 32-byte data SHA-256,
          u64 values length, u64 pool offset, u64 pool length, str driver version,
          u32 extension count {u32 prefix, str name}, u32 subgraph count (main first)
          {u32 operand count {operand}, u32 operation count {operation}, u32 n {u32 input},
           u32 n {u32 output}}
    operand: u32 type, u32 consumers, f64 scale, i32 zero point, u8 lifetime, u32 pool,
             u64 offset, u64 length, u8 extra kind, u32 rank, rank x u32 dims, extra
             (kind 1: u32 channel dim, u32 n, n x f64 scales; kind 2: u32 n, n bytes)
    operation: u32 type, u32 inputs, u32 outputs, then the input and output indexes (u32)
    str: u32 length, UTF-8 bytes

Data cache: the model's ``operandValues``, then, at ``pool offset``, every CONSTANT_REFERENCE
region (deduplicated, 16-byte aligned); restored constants reference that region as pool 0.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import operator
import os
import secrets
import struct
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nnhal.driver.prepared_model import ReferencePreparedModel
from nnhal.executor import ModelPlan
from nnhal.hal.interfaces import IPreparedModel, IPreparedModelCallback
from nnhal.hal.types import (
    BYTE_SIZE_OF_CACHE_TOKEN,
    DataLocation,
    ErrorStatus,
    ExtensionNameAndPrefix,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    Priority,
    Subgraph,
    SymmPerChannelQuantParams,
)
from nnhal.memory import SharedMemory

if TYPE_CHECKING:
    from nnhal.driver.device import ReferenceDevice

log = logging.getLogger("nnhal.driver.cache")

#: getNumberOfCacheFilesNeeded: one security-sensitive model cache file, one data cache file.
NUM_MODEL_CACHE = 1
NUM_DATA_CACHE = 1
MAGIC = b"NNHALMC1"
FORMAT_VERSION = 1
TAG_SIZE = 32
#: The largest model cache accepted: it holds structure only, never constant data.
MAX_MODEL_CACHE_BYTES = 256 << 20
#: The largest data cache accepted (its exact length is also bound by the model cache).
MAX_DATA_CACHE_BYTES = 1 << 36
DATA_ALIGN = 16
_HMAC_DOMAIN = b"nnhal compilation cache v1\0"

_HEADER = struct.Struct("<8sIIQ")
_BODY_HEAD = struct.Struct("<BBQ32sQQQ")
_OPERAND = struct.Struct("<IIdiBIQQBI")
_OPERATION = struct.Struct("<III")
_U32 = struct.Struct("<I")
_U32_FORMATS: dict[int, struct.Struct] = {}

_LIFETIMES = {int(v): v for v in OperandLifeTime}
_OPERAND_TYPES = {int(v): v for v in OperandType}
_NO_EXTRA, _CHANNEL_QUANT, _EXTENSION_BYTES = 0, 1, 2


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
    if fd < 0:
        raise CacheArgumentError(f"negative file descriptor {fd}")
    return fd


def token_bytes(token: Any) -> bytes:
    """The cache token as bytes; it must be exactly BYTE_SIZE_OF_CACHE_TOKEN long."""
    if token is None or isinstance(token, (str, int, float)):
        raise CacheArgumentError(f"cache token must be bytes, not {type(token).__name__}")
    try:
        raw = bytes(token)
    except (TypeError, ValueError) as e:
        raise CacheArgumentError(f"bad cache token: {e}") from e
    if len(raw) != BYTE_SIZE_OF_CACHE_TOKEN:
        raise CacheArgumentError(
            f"cache token has {len(raw)} bytes, expected {BYTE_SIZE_OF_CACHE_TOKEN}")
    return raw


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


def encode_model(model: Model, pool_arrays: Sequence[np.ndarray], priority: Priority,
                 driver_version: str = "") -> tuple[bytes, bytes]:
    """(model cache body, data cache content) of a validated model; raises on anything odd."""
    values = bytes(model.operand_values)
    pool = bytearray()
    regions: dict[tuple[int, int, int], int] = {}
    out: list[bytes] = []
    subgraphs = [model.main, *model.referenced]
    out.append(_str(driver_version))
    out.append(_U32.pack(len(model.extension_name_to_prefix)))
    for ext in model.extension_name_to_prefix:
        out.append(_U32.pack(int(ext.prefix)) + _str(str(ext.name)))
    out.append(_U32.pack(len(subgraphs)))
    for sg in subgraphs:
        out.append(_U32.pack(len(sg.operands)))
        for op in sg.operands:
            lt = OperandLifeTime(op.lifetime)
            loc = op.location
            pool_index, offset, length = int(loc.pool_index), int(loc.offset), int(loc.length)
            if lt == OperandLifeTime.CONSTANT_REFERENCE:
                key = (pool_index, offset, length)
                where = regions.get(key)
                if where is None:
                    src = pool_arrays[pool_index][offset:offset + length]
                    if offset < 0 or src.size != length:
                        raise CacheError("constant outside its pool")
                    pool.extend(b"\0" * (_align(len(pool)) - len(pool)))
                    where = len(pool)
                    pool.extend(memoryview(np.ascontiguousarray(src)).cast("B"))
                    regions[key] = where
                pool_index, offset = 0, where
            elif lt == OperandLifeTime.CONSTANT_COPY:
                pool_index = 0  # unused by the HAL for operand values
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
            dims = [int(d) for d in op.dimensions]
            out.append(_OPERAND.pack(int(op.type), int(op.number_of_consumers), float(op.scale),
                                     int(op.zero_point), int(lt), pool_index, offset, length,
                                     kind, len(dims)))
            out.append(struct.pack(f"<{len(dims)}I", *dims))
            out.append(tail)
        out.append(_U32.pack(len(sg.operations)))
        for operation in sg.operations:
            ins, outs = list(operation.inputs), list(operation.outputs)
            out.append(_OPERATION.pack(int(operation.type), len(ins), len(outs)))
            out.append(struct.pack(f"<{len(ins) + len(outs)}I", *ins, *outs))
        for indexes in (sg.input_indexes, sg.output_indexes):
            out.append(struct.pack(f"<I{len(indexes)}I", len(indexes), *indexes))
    pool_offset = _align(len(values))
    data = values + b"\0" * (pool_offset - len(values)) + bytes(pool)
    head = _BODY_HEAD.pack(int(Priority(priority)), int(bool(
        model.relax_computation_float32_to_float16)), len(data), hashlib.sha256(data).digest(),
        len(values), pool_offset, len(pool))
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

    def u32s(self, n: int) -> list[int]:
        s = _U32_FORMATS.get(n)
        if s is None:
            s = struct.Struct(f"<{n}I")
            if n < 64:
                _U32_FORMATS[n] = s
        return list(self.take(s))

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
    values_length: int
    pool_offset: int
    pool_length: int


def decode_head(body: bytes | memoryview) -> BodyHead:
    r = _Reader(body)
    prio, relaxed, n, digest, nv, poff, npool = r.take(_BODY_HEAD)
    if prio not in (0, 1, 2) or relaxed not in (0, 1):
        raise CacheError("bad priority or relaxed flag")
    if not (nv <= poff and poff + npool == n and poff - nv < DATA_ALIGN):
        raise CacheError("inconsistent data regions")
    return BodyHead(Priority(prio), bool(relaxed), n, digest, nv, poff, npool)


def decode_structure(body: bytes | memoryview, head: BodyHead, driver_version: str = ""
                     ) -> tuple[list[Subgraph], list[ExtensionNameAndPrefix]]:
    """Subgraphs (main first) and extension prefixes; every index and location checked."""
    r = _Reader(body, _BODY_HEAD.size)
    if r.str() != driver_version:
        raise CacheError("written by another driver version")
    exts = []
    for _ in range(r.count(8)):
        prefix = r.u32()
        exts.append(ExtensionNameAndPrefix(r.str(), prefix))
    n_subgraphs = r.count(16)
    if n_subgraphs < 1:
        raise CacheError("no main subgraph")
    subgraphs = []
    for _ in range(n_subgraphs):
        operands = []
        for _ in range(r.count(_OPERAND.size)):
            (t, consumers, scale, zp, lt, pool_index, offset, length, kind,
             rank) = r.take(_OPERAND)
            dims = r.u32s(_check_rank(r, rank))
            lifetime = _LIFETIMES.get(lt)
            if lifetime is None:
                raise CacheError(f"bad lifetime {lt}")
            if lifetime == OperandLifeTime.CONSTANT_COPY:
                if pool_index != 0 or offset + length > head.values_length:
                    raise CacheError("constant outside operand values")
            elif lifetime == OperandLifeTime.CONSTANT_REFERENCE:
                if pool_index != 0 or offset + length > head.pool_length:
                    raise CacheError("constant outside the data cache")
            elif lifetime == OperandLifeTime.SUBGRAPH:
                if offset >= n_subgraphs - 1:
                    raise CacheError("bad subgraph reference")
            extra: SymmPerChannelQuantParams | bytes | None = None
            if kind == _CHANNEL_QUANT:
                channel_dim = r.u32()
                n = r.count(8)
                extra = SymmPerChannelQuantParams(
                    list(r.take(struct.Struct(f"<{n}d"))), channel_dim)
            elif kind == _EXTENSION_BYTES:
                extra = r.raw(r.count(1))
            elif kind != _NO_EXTRA:
                raise CacheError(f"bad extra params kind {kind}")
            operands.append(Operand(
                type=_OPERAND_TYPES.get(t, t), dimensions=dims, number_of_consumers=consumers,
                scale=scale, zero_point=zp, lifetime=lifetime,
                location=DataLocation(pool_index, offset, length), extra_params=extra))
        n_operands = len(operands)
        operations = []
        for _ in range(r.count(_OPERATION.size)):
            t, n_in, n_out = r.take(_OPERATION)
            if (n_in + n_out) * 4 > len(r.buf) - r.pos:
                raise CacheError("operation exceeds the model cache")
            idx = r.u32s(n_in + n_out)
            if idx and max(idx) >= n_operands:
                raise CacheError("operand index out of range")
            operations.append(Operation(t, idx[:n_in], idx[n_in:]))
        io = []
        for _ in range(2):
            idx = r.u32s(r.count(4))
            if idx and max(idx) >= n_operands:
                raise CacheError("subgraph input or output out of range")
            io.append(idx)
        subgraphs.append(Subgraph(operands, operations, io[0], io[1]))
    if r.pos != len(body):
        raise CacheError("trailing bytes in the model cache")
    return subgraphs, exts


def _check_rank(r: _Reader, rank: int) -> int:
    if rank * 4 > len(r.buf) - r.pos:
        raise CacheError(f"rank {rank} exceeds the model cache")
    return rank


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
    model: Model | None = None
    pool_array: np.ndarray | None = None


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
            pools = [p.array() for p in model.pools]
            body, data = encode_model(model, pools, priority, self.driver_version)
            head = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body))
            content = head + body
            tag = self._tag(job.token, content)
            # The model cache is the commit point: invalidate it first, write it last.
            os.ftruncate(job.model_fds[0], 0)
            write_file(job.data_fds[0], data)
            write_file(job.model_fds[0], content + tag)
            plan = getattr(prepared, "plan", None)
            if isinstance(plan, ModelPlan):
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
        """Read and verify both files; decode them unless a live plan has the same tag."""
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
        if not hmac.compare_digest(hashlib.sha256(data).digest(), head.data_digest):
            raise CacheError("data cache was modified")
        subgraphs, exts = decode_structure(body, head, self.driver_version)
        dv = memoryview(data)
        pools: list[SharedMemory] = []
        pool_array = None
        if any(op.lifetime == OperandLifeTime.CONSTANT_REFERENCE
               for sg in subgraphs for op in sg.operands):
            mem = SharedMemory.from_bytes(dv[head.pool_offset:head.pool_offset +
                                             head.pool_length])
            pools.append(mem)
            pool_array = mem.array()
        model = Model(main=subgraphs[0], referenced=subgraphs[1:],
                      operand_values=bytes(dv[:head.values_length]), pools=pools,
                      relax_computation_float32_to_float16=head.relaxed,
                      extension_name_to_prefix=exts)
        return _Loaded(head, tag, model=model, pool_array=pool_array)

    def prepare_from_cache(self, device: ReferenceDevice, deadline: int | None,
                           model_cache: Any, data_cache: Any, token: Any,
                           callback: IPreparedModelCallback) -> ErrorStatus:
        """prepareModelFromCache_1_3 for ``device``: the callback is notified exactly once."""
        if callback is None or not hasattr(callback, "notify"):
            return ErrorStatus.INVALID_ARGUMENT
        notify = _Once(callback)
        try:
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
                pm = ReferencePreparedModel(device, loaded.plan, priority,
                                            [])
            except Exception as e:  # noqa: BLE001
                device.log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
                notify(ErrorStatus.GENERAL_FAILURE)
                return ErrorStatus.GENERAL_FAILURE
            notify(ErrorStatus.NONE, pm)
            return ErrorStatus.NONE

        def task() -> None:
            try:
                model = loaded.model
                assert model is not None
                pools = [] if loaded.pool_array is None else [loaded.pool_array]
                # The tag proves this driver validated exactly this model before saving it.
                plan = ModelPlan(model, pools, validate=False)
                if deadline is not None and time.monotonic_ns() > deadline:
                    notify(ErrorStatus.MISSED_DEADLINE_TRANSIENT)
                    return
                self._remember(loaded.tag, plan)
                notify(ErrorStatus.NONE, ReferencePreparedModel(device, plan, priority,
                                                                model.pools))
            except Exception as e:  # noqa: BLE001
                device.log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
                notify(ErrorStatus.GENERAL_FAILURE)

        try:
            device.executor_for(priority).submit(task)
        except Exception:  # noqa: BLE001 - e.g. the pool was shut down
            notify(ErrorStatus.GENERAL_FAILURE)
            return ErrorStatus.GENERAL_FAILURE
        return ErrorStatus.NONE
