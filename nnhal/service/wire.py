"""The wire format between a driver service and its clients (docs/wire.md is the reference).

A message is a 24-byte header and a body; file descriptors travel beside it (SCM_RIGHTS) and
the body names them by index. Everything is little-endian and encoded field by field: no
pickle, nothing that carries code. Decoding is strict because the other side is not trusted:
every count and length is bounded and checked against the bytes left, every tag and enum is
known, every descriptor sent is consumed exactly once, nothing trails. Any failure is a
:class:`WireError`, never another exception.

Descriptors: a :class:`Reader` owns the descriptors of its message until :meth:`Reader.commit`;
shared memories decoded from it do not own their descriptors before that, so a message that
fails half-way is dropped by closing every descriptor once (:meth:`Reader.discard`).
"""

from __future__ import annotations

import enum
import operator
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

from nnhal.hal.types import (
    LIFETIMES,
    OPERAND_TYPES,
    BufferDesc,
    BufferRole,
    Capabilities,
    DataLocation,
    ErrorStatus,
    ExecutionConfig,
    ExecutionPreference,
    Extension,
    ExtensionNameAndPrefix,
    ExtensionOperandTypeInformation,
    MeasureTiming,
    MemoryPool,
    Model,
    Operand,
    OperandLifeTime,
    OperandPerformance,
    OperandType,
    Operation,
    OperationType,
    OutputShape,
    PerformanceInfo,
    PrepareModelConfig,
    Priority,
    Request,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
    Timing,
    TokenValuePair,
)
from nnhal.memory import SharedMemory

#: "NNHW" read as a little-endian u32.
MAGIC = 0x57484E4E
#: 2: AIDL v4's calls (the *_WITH_CONFIG kinds) and GET_FEATURE_LEVEL. Peers of another
#: version refuse each other's first message (docs/wire.md, Framing).
VERSION = 2
#: magic u32, version u16, kind u16, call id u64, body length u32, fd count u16, flags u16.
HEADER = struct.Struct("<IHHQIHH")
HEADER_SIZE = HEADER.size
#: SCM_MAX_FD of Linux: no message carries more descriptors.
MAX_FDS = 253
#: Default bound of a message body (a model's constants travel in the body).
MAX_BODY = 256 << 20
#: Bounds of counts inside a body (each also checked against the bytes left).
MAX_COUNT = 1 << 24
MAX_STRING = 4096
#: Bounds of AIDL v4's vendor hints, per config: hints, bytes of one hint's value, entries of
#: the config's extension-name-to-prefix table (docs/wire.md, "Configs"). Far above what a
#: vendor sends (a handful of small values), far below the body bound.
MAX_HINTS = 256
MAX_HINT_VALUE = 64 << 10
MAX_CONFIG_EXTENSIONS = 256


class WireError(Exception):
    """A message that cannot be encoded or does not decode."""


class Kind(enum.IntEnum):
    """Message kinds. Calls go client -> server and get one REPLY or ERROR with their call id;
    events (NOTIFY_*, FENCE_STATE, RELEASE, FORGET, BURST_UNCACHE) get no reply."""

    REPLY = 1
    ERROR = 2
    # IDevice (the service's one device)
    GET_CAPABILITIES = 16
    GET_SUPPORTED_OPERATIONS = 17
    GET_TYPE = 18
    GET_VERSION_STRING = 19
    GET_SUPPORTED_EXTENSIONS = 20
    GET_NUMBER_OF_CACHE_FILES = 21
    PREPARE_MODEL = 22
    PREPARE_MODEL_FROM_CACHE = 23
    ALLOCATE = 24
    GET_FEATURE_LEVEL = 25
    # IPreparedModel
    EXECUTE = 32
    EXECUTE_SYNCHRONOUSLY = 33
    EXECUTE_FENCED = 34
    CONFIGURE_BURST = 35
    CREATE_REUSABLE = 36
    #: CONFIGURE_BURST whose executions travel on shared-memory rings (docs/fmq.md)
    CONFIGURE_BURST_RINGS = 37
    # IBurst
    BURST_EXECUTE = 40
    BURST_CREATE_REUSABLE = 41
    BURST_CACHE = 42
    # IExecution
    COMPUTE = 48
    COMPUTE_FENCED = 49
    # IBuffer
    COPY_TO = 56
    COPY_FROM = 57
    # AIDL v4's calls with a config (vendor hints and their extension table)
    PREPARE_MODEL_WITH_CONFIG = 58
    EXECUTE_SYNCHRONOUSLY_WITH_CONFIG = 59
    EXECUTE_FENCED_WITH_CONFIG = 60
    CREATE_REUSABLE_WITH_CONFIG = 61
    BURST_EXECUTE_WITH_CONFIG = 62
    # events
    NOTIFY_PREPARED = 64
    NOTIFY_EXECUTION = 65
    FENCE_STATE = 66
    RELEASE = 67
    FORGET = 68
    BURST_UNCACHE = 69


CALLS = frozenset(k for k in Kind if 16 <= k < 64)

# ---- burst ring records (docs/fmq.md, "Burst records") ------------------------------------------
#: Before each FMQ request packet in a burst's request ring: tag, flags, sequence, deadline,
#: loop timeout (the 1.3 arguments that the 1.2 packet has no datum for).
BURST_REQUEST = struct.Struct("<IIQqq")
#: Before each FMQ result packet in a burst's result ring: tag, flags, sequence.
BURST_RESULT = struct.Struct("<IIQ")
BURST_REQUEST_TAG = 0x51424E4E  # b"NNBQ"
BURST_RESULT_TAG = 0x52424E4E   # b"NNBR"
#: Request flags: which optional arguments the header carries.
BURST_HAS_DEADLINE, BURST_HAS_LOOP_TIMEOUT = 1, 2
#: Result flag: the service reads no more requests from these rings (the client falls back to
#: BURST_EXECUTE on the socket).
BURST_CLOSING = 1
#: Events a client may send (the server sends NOTIFY_* and FENCE_STATE).
CLIENT_EVENTS = frozenset({Kind.FENCE_STATE, Kind.RELEASE, Kind.FORGET, Kind.BURST_UNCACHE})
SERVER_EVENTS = frozenset({Kind.NOTIFY_PREPARED, Kind.NOTIFY_EXECUTION, Kind.FENCE_STATE})

# memory reference tags
MEM_NEW, MEM_KNOWN = 0, 1
# request pool tags
POOL_MEMORY, POOL_TOKEN, POOL_EMPTY = 0, 1, 2
# operand extra-params tags
EXTRA_NONE, EXTRA_CHANNEL_QUANT, EXTRA_EXTENSION = 0, 1, 2
# cache handle tags
HANDLE_FD, HANDLE_INVALID = 0, 1

_U8, _U16, _U32, _I32 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<I"), \
    struct.Struct("<i")
_U64, _I64, _F64 = struct.Struct("<Q"), struct.Struct("<q"), struct.Struct("<d")
_TIMING = struct.Struct("<QQ")
#: The last bytes of every execution reply (pack_shapes_result): time on device, time in driver.
TIMING = _TIMING
_TWO_U32 = struct.Struct("<II")
_STATUSES = {int(s): s for s in ErrorStatus}


_KINDS = {k.value: k for k in Kind}


def pack_header(kind: int, call_id: int, body_len: int, nfds: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, call_id, body_len, nfds, 0)


def unpack_header(data: bytes | bytearray | memoryview, max_body: int = MAX_BODY,
                  at: int | None = None) -> tuple[Kind, int, int, int]:
    """(kind, call id, body length, fd count) of a header (``data`` whole, or the header at
    offset ``at`` of it, which the caller knows holds one); WireError when it is not one."""
    if at is not None:
        magic, version, kind, call_id, body_len, nfds, flags = HEADER.unpack_from(data, at)
    elif len(data) != HEADER_SIZE:
        raise WireError(f"header of {len(data)} bytes, expected {HEADER_SIZE}")
    else:
        magic, version, kind, call_id, body_len, nfds, flags = HEADER.unpack(data)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic:#x}")
    if version != VERSION:
        raise WireError(f"wire version {version}, this side speaks {VERSION}")
    if flags != 0:
        raise WireError(f"unknown flags {flags:#x}")
    if nfds > MAX_FDS:
        raise WireError(f"{nfds} descriptors, at most {MAX_FDS}")
    if body_len > max_body:
        raise WireError(f"body of {body_len} bytes exceeds {max_body}")
    member = _KINDS.get(kind)
    if member is None:
        raise WireError(f"unknown message kind {kind}")
    return member, call_id, body_len, nfds


# ---- writing ----------------------------------------------------------------------------------

def _int(x: Any, lo: int, hi: int, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        try:
            x = operator.index(x)
        except TypeError:
            raise WireError(f"{what}: not an integer: {x!r}") from None
    if not lo <= x <= hi:
        raise WireError(f"{what}: {x} outside [{lo}, {hi}]")
    return int(x)


class Writer:
    """A message body under construction, with the descriptors it names.

    ``memory_ref(memory) -> (id, new)`` decides whether a shared memory is sent with its
    descriptor (first time on this connection) or by identifier; ``new_ids`` lists the
    identifiers first sent here, so a sender can forget them if the message is never sent.
    """

    __slots__ = ("buf", "fds", "memory_ref", "new_ids")

    def __init__(self, memory_ref: Callable[[SharedMemory], tuple[int, bool]] | None = None):
        self.buf = bytearray()
        self.fds: list[int] = []
        self.memory_ref = memory_ref
        self.new_ids: list[int] = []

    def u8(self, x: Any, what: str = "u8") -> None:
        self.buf += _U8.pack(_int(x, 0, 0xFF, what))

    def u16(self, x: Any, what: str = "u16") -> None:
        self.buf += _U16.pack(_int(x, 0, 0xFFFF, what))

    def u32(self, x: Any, what: str = "u32") -> None:
        self.buf += _U32.pack(_int(x, 0, 0xFFFF_FFFF, what))

    def i32(self, x: Any, what: str = "i32") -> None:
        self.buf += _I32.pack(_int(x, -(1 << 31), (1 << 31) - 1, what))

    def u64(self, x: Any, what: str = "u64") -> None:
        self.buf += _U64.pack(_int(x, 0, (1 << 64) - 1, what))

    def i64(self, x: Any, what: str = "i64") -> None:
        self.buf += _I64.pack(_int(x, -(1 << 63), (1 << 63) - 1, what))

    def f64(self, x: Any, what: str = "f64") -> None:
        if isinstance(x, bool) or not isinstance(x, (int, float)) and \
                not hasattr(x, "__float__"):
            raise WireError(f"{what}: not a number: {x!r}")
        self.buf += _F64.pack(float(x))

    def bool(self, x: Any, what: str = "bool") -> None:
        self.buf += b"\1" if x else b"\0"

    def bytes(self, x: Any, what: str = "bytes") -> None:
        if not isinstance(x, (bytes, bytearray, memoryview)):
            raise WireError(f"{what}: not bytes: {type(x).__name__}")
        data = memoryview(x).cast("B")
        self.u32(len(data), what)
        self.buf += data

    def str(self, x: Any, what: str = "string") -> None:
        if not isinstance(x, str):
            raise WireError(f"{what}: not a string")
        data = x.encode("utf-8", "surrogatepass")
        if len(data) > MAX_STRING:
            raise WireError(f"{what}: longer than {MAX_STRING} bytes")
        self.bytes(data, what)

    def count(self, items: Any, what: str, limit: int = MAX_COUNT) -> list[Any]:
        try:
            seq = list(items)
        except TypeError:
            raise WireError(f"{what}: not a sequence") from None
        if len(seq) > limit:
            raise WireError(f"{what}: {len(seq)} items, at most {limit}")
        self.u32(len(seq), what)
        return seq

    def u32s(self, items: Any, what: str) -> None:
        if type(items) is list and len(items) <= MAX_COUNT:
            try:  # one struct for the list: the same bytes, much less Python per item
                self.buf += _u32_list(len(items)).pack(len(items), *items)
                return
            except struct.error:
                pass  # a bad item: the per-item path says which
        for x in self.count(items, what):
            self.u32(x, what)

    def opt_i64(self, x: Any, what: str) -> None:
        if x is None:
            self.u8(0)
        else:
            self.u8(1)
            self.i64(x, what)

    def fd(self, fd: int, what: str = "fd") -> None:
        if len(self.fds) >= MAX_FDS:
            raise WireError(f"more than {MAX_FDS} descriptors in one message")
        fd = _int(fd, 0, 0x7FFF_FFFF, what)
        try:
            os.fstat(fd)
        except OSError as e:
            raise WireError(f"{what}: descriptor {fd} is not open: {e.strerror}") from None
        self.u32(len(self.fds))
        self.fds.append(fd)

    def memory(self, mem: Any, what: str = "memory") -> None:
        if not isinstance(mem, SharedMemory):
            raise WireError(f"{what}: not a shared memory: {type(mem).__name__}")
        if mem.closed or mem.fd < 0:
            raise WireError(f"{what}: the memory is closed")
        if self.memory_ref is None:
            ident, new = 0, True
        else:
            ident, new = self.memory_ref(mem)
        if new:
            self.u8(MEM_NEW)
            self.u64(ident)
            self.new_ids.append(ident)
            self.str(mem.name, what)
            self.u64(mem.size, what)
            self.u64(mem.offset, what)
            self.fd(mem.fd, what)
        else:
            self.u8(MEM_KNOWN)
            self.u64(ident)


# ---- reading ----------------------------------------------------------------------------------

class Reader:
    """One received body and its descriptors (see the module docstring for ownership).

    ``memories(id) -> SharedMemory | None`` resolves memories sent earlier on the connection;
    memories first sent in this message are in ``defined`` until the caller commits them.
    """

    def __init__(self, body: bytes | bytearray | memoryview, fds: Sequence[int] = (),
                 memories: Callable[[int], SharedMemory | None] | None = None,
                 max_new_bytes: int | None = None):
        self.view = memoryview(body).cast("B")
        self.pos = 0
        self.fds = list(fds)
        self.used = [False] * len(self.fds)
        self.memories = memories
        self.defined: dict[int, SharedMemory] = {}
        self.new_bytes = 0
        self.max_new_bytes = max_new_bytes
        self._done = False

    # -- primitives
    def _take(self, st: struct.Struct, what: str) -> Any:
        end = self.pos + st.size
        if end > len(self.view):
            raise WireError(f"truncated at {what}")
        (v,) = st.unpack_from(self.view, self.pos)
        self.pos = end
        return v

    def u8(self, what: str = "u8") -> int:
        return self._take(_U8, what)

    def u16(self, what: str = "u16") -> int:
        return self._take(_U16, what)

    def u32(self, what: str = "u32") -> int:
        return self._take(_U32, what)

    def i32(self, what: str = "i32") -> int:
        return self._take(_I32, what)

    def u64(self, what: str = "u64") -> int:
        return self._take(_U64, what)

    def i64(self, what: str = "i64") -> int:
        return self._take(_I64, what)

    def f64(self, what: str = "f64") -> float:
        return self._take(_F64, what)

    def bool(self, what: str = "bool") -> bool:
        v = self.u8(what)
        if v > 1:
            raise WireError(f"{what}: boolean {v}")
        return v == 1

    def tag(self, limit: int, what: str) -> int:
        v = self.u8(what)
        if v > limit:
            raise WireError(f"{what}: unknown tag {v}")
        return v

    def bytes(self, what: str = "bytes", limit: int | None = None) -> bytes:
        n = self.u32(what)
        if limit is not None and n > limit:
            raise WireError(f"{what}: {n} bytes, at most {limit}")
        if n > len(self.view) - self.pos:
            raise WireError(f"{what}: {n} bytes, {len(self.view) - self.pos} left")
        data = bytes(self.view[self.pos:self.pos + n])
        self.pos += n
        return data

    def str(self, what: str = "string") -> str:
        data = self.bytes(what, MAX_STRING)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise WireError(f"{what}: not UTF-8") from None

    def count(self, what: str, item_size: int, limit: int = MAX_COUNT) -> int:
        """A count of items each at least ``item_size`` bytes: bounded by what is left."""
        n = self.u32(what)
        if n > limit or n * item_size > len(self.view) - self.pos:
            raise WireError(f"{what}: count {n}, at most {limit}" if n > limit else
                            f"{what}: count {n} exceeds the message")
        return n

    def u32s(self, what: str) -> list[int]:
        n = self.count(what, 4)
        out = list(struct.unpack_from(f"<{n}I", self.view, self.pos))
        self.pos += 4 * n
        return out

    def opt_i64(self, what: str) -> int | None:
        return self.i64(what) if self.bool(what) else None

    def fd(self, what: str = "fd") -> int:
        i = self.u32(what)
        if i >= len(self.fds):
            raise WireError(f"{what}: descriptor index {i} of {len(self.fds)}")
        if self.used[i]:
            raise WireError(f"{what}: descriptor {i} used twice")
        self.used[i] = True
        return self.fds[i]

    def memory(self, what: str = "memory") -> SharedMemory:
        if self.tag(MEM_KNOWN, what) == MEM_KNOWN:
            ident = self.u64(what)
            mem = self.defined.get(ident)
            if mem is None and self.memories is not None:
                mem = self.memories(ident)
            if mem is None:
                raise WireError(f"{what}: unknown memory id {ident}")
            return mem
        ident = self.u64(what)
        name = self.str(what)
        size = self.u64(what)
        offset = self.u64(what)
        fd = self.fd(what)
        if ident in self.defined or (self.memories is not None and
                                     self.memories(ident) is not None):
            raise WireError(f"{what}: memory id {ident} defined twice")
        if size > (1 << 62) or offset > (1 << 62):
            raise WireError(f"{what}: size or offset out of range")
        self.new_bytes += size
        if self.max_new_bytes is not None and self.new_bytes > self.max_new_bytes:
            raise ResourceLimit(f"{what}: mapped bytes past the client's bound")
        mem = SharedMemory(name, fd, size, offset, owns_fd=False)
        self.defined[ident] = mem
        return mem

    # -- ownership
    def finish(self) -> None:
        """Check that the body and the descriptors were consumed exactly."""
        if self.pos != len(self.view):
            raise WireError(f"{len(self.view) - self.pos} trailing bytes")
        if not all(self.used):
            raise WireError(f"{self.used.count(False)} descriptors sent but not named")

    def commit(self) -> None:
        """The message is accepted: its memories own their descriptors from now on."""
        self.finish()
        for mem in self.defined.values():
            mem._owns_fd = True
        self._done = True

    def close_unused(self) -> None:
        """Close the descriptors the decoding did not take (a client keeps none it did not
        decode into something)."""
        for i, fd in enumerate(self.fds):
            if not self.used[i]:
                self.used[i] = True
                try:
                    os.close(fd)
                except OSError:
                    pass

    def discard(self) -> None:
        """The message is dropped: close every descriptor it carried, once."""
        if self._done:
            return
        self._done = True
        for mem in self.defined.values():
            mem._closed = True  # never maps, never closes the (closed below) descriptor
        close_fds(self.fds)


class ResourceLimit(WireError):
    """A message that is well formed but past a per-client bound."""


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# ---- HAL structures ---------------------------------------------------------------------------

def _enum_or_int(cls: type[enum.IntEnum], v: int) -> int:
    try:
        return cls(v)
    except ValueError:
        return v


def put_location(w: Writer, loc: Any) -> None:
    if not isinstance(loc, DataLocation):
        raise WireError("location: not a DataLocation")
    w.u32(loc.pool_index, "location.poolIndex")
    w.u32(loc.offset, "location.offset")
    w.u32(loc.length, "location.length")


def get_location(r: Reader) -> DataLocation:
    return DataLocation(r.u32(), r.u32(), r.u32())


def _cached_struct(cache: dict[int, struct.Struct], fmt: str, n: int) -> struct.Struct:
    st = cache.get(n)
    if st is None:
        st = struct.Struct(fmt.format(n))
        if n <= 64:  # the usual ranks and list lengths; a longer one is compiled per call
            cache[n] = st
    return st


_U32_LISTS: dict[int, struct.Struct] = {}
_OPERANDS_OUT: dict[int, struct.Struct] = {}
_OPERANDS_IN: dict[int, struct.Struct] = {}
_TYPE_AND_RANK = struct.Struct("<II")


def _u32_list(n: int) -> struct.Struct:
    return _cached_struct(_U32_LISTS, "<I{}I", n)


def _put_operand_fast(w: Writer, o: Operand) -> bool:
    """One struct for a plain operand (no extra parameters): the bytes of the field-by-field
    path, which handles everything else and says what is wrong with a bad value."""
    loc, dims, scale = o.location, o.dimensions, o.scale
    if o.extra_params is not None or type(loc) is not DataLocation \
            or type(dims) is not list or len(dims) > MAX_COUNT \
            or (type(scale) is not float and type(scale) is not int):
        return False
    n = len(dims)
    try:
        w.buf += _cached_struct(_OPERANDS_OUT, "<II{}IIdiIIIIB", n).pack(
            o.type, n, *dims, o.number_of_consumers, scale, o.zero_point, o.lifetime,
            loc.pool_index, loc.offset, loc.length, EXTRA_NONE)
    except struct.error:
        return False
    return True


def put_operand(w: Writer, o: Any) -> None:
    if not isinstance(o, Operand):
        raise WireError("operand: not an Operand")
    if type(o) is Operand and _put_operand_fast(w, o):
        return
    w.u32(o.type, "operand.type")
    w.u32s(o.dimensions, "operand.dimensions")
    w.u32(o.number_of_consumers, "operand.numberOfConsumers")
    w.f64(o.scale, "operand.scale")
    w.i32(o.zero_point, "operand.zeroPoint")
    w.u32(o.lifetime, "operand.lifetime")
    put_location(w, o.location)
    extra = o.extra_params
    if extra is None:
        w.u8(EXTRA_NONE)
    elif isinstance(extra, SymmPerChannelQuantParams):
        w.u8(EXTRA_CHANNEL_QUANT)
        for s in w.count(extra.scales, "channelQuant.scales"):
            w.f64(s, "channelQuant.scales")
        w.u32(extra.channel_dim, "channelQuant.channelDim")
    elif isinstance(extra, (bytes, bytearray)):
        w.u8(EXTRA_EXTENSION)
        w.bytes(extra, "extension params")
    else:
        raise WireError(f"operand.extraParams: {type(extra).__name__}")


def _get_operand_fast(r: Reader) -> Operand | None:
    """A plain operand (no extra parameters) with one struct, when the message holds all of
    it; None leaves the reader where it was for the field-by-field path (which also gives
    the errors)."""
    view, pos = r.view, r.pos
    size = len(view)
    if pos + 8 > size:
        return None
    t, n = _TYPE_AND_RANK.unpack_from(view, pos)
    if n > MAX_COUNT or pos + 8 + 4 * n + 33 > size:
        return None
    st = _cached_struct(_OPERANDS_IN, "<{}IIdiIIIIB", n)
    vals = st.unpack_from(view, pos + 8)
    if vals[-1] != EXTRA_NONE:
        return None
    r.pos = pos + 8 + st.size
    consumers, scale, zero_point, lifetime, p, off, length = vals[n:n + 7]
    ot = OPERAND_TYPES.get(t)
    lt = LIFETIMES.get(lifetime)
    return Operand(_enum_or_int(OperandType, t) if ot is None else ot, list(vals[:n]),
                   consumers, scale, zero_point,
                   _enum_or_int(OperandLifeTime, lifetime) if lt is None else lt,
                   DataLocation(p, off, length), None)


def get_operand(r: Reader) -> Operand:
    fast = _get_operand_fast(r)
    if fast is not None:
        return fast
    t = _enum_or_int(OperandType, r.u32())
    dims = r.u32s("operand.dimensions")
    consumers = r.u32()
    scale = r.f64()
    zero_point = r.i32()
    lifetime = _enum_or_int(OperandLifeTime, r.u32())
    loc = get_location(r)
    tag = r.tag(EXTRA_EXTENSION, "operand.extraParams")
    extra: SymmPerChannelQuantParams | bytes | None = None
    if tag == EXTRA_CHANNEL_QUANT:
        n = r.count("channelQuant.scales", 8)
        scales = [r.f64() for _ in range(n)]
        extra = SymmPerChannelQuantParams(scales, r.u32())
    elif tag == EXTRA_EXTENSION:
        extra = r.bytes("extension params")
    return Operand(t, dims, consumers, scale, zero_point, lifetime, loc, extra)  # type: ignore


def put_subgraph(w: Writer, g: Any) -> None:
    if not isinstance(g, Subgraph):
        raise WireError("subgraph: not a Subgraph")
    for o in w.count(g.operands, "operands"):
        put_operand(w, o)
    for op in w.count(g.operations, "operations"):
        if not isinstance(op, Operation):
            raise WireError("operation: not an Operation")
        w.u32(op.type, "operation.type")
        w.u32s(op.inputs, "operation.inputs")
        w.u32s(op.outputs, "operation.outputs")
    w.u32s(g.input_indexes, "inputIndexes")
    w.u32s(g.output_indexes, "outputIndexes")


# smallest encodings: an operand is 4+4+4+8+4+4+12+1 bytes, an operation 12.
_OPERAND_MIN, _OPERATION_MIN, _SUBGRAPH_MIN = 41, 12, 16


def get_subgraph(r: Reader) -> Subgraph:
    operands = [get_operand(r) for _ in range(r.count("operands", _OPERAND_MIN))]
    operations = []
    for _ in range(r.count("operations", _OPERATION_MIN)):
        t = _enum_or_int(OperationType, r.u32())
        operations.append(Operation(t, r.u32s("operation.inputs"), r.u32s("operation.outputs")))
    return Subgraph(operands, operations, r.u32s("inputIndexes"), r.u32s("outputIndexes"))


def put_model(w: Writer, m: Any) -> None:
    if not isinstance(m, Model):
        raise WireError("model: not a Model")
    put_subgraph(w, m.main)
    for g in w.count(m.referenced, "referenced"):
        put_subgraph(w, g)
    w.bytes(m.operand_values, "operandValues")
    for p in w.count(m.pools, "pools"):
        w.memory(p, "model pool")
    w.bool(m.relax_computation_float32_to_float16)
    put_prefixes(w, m.extension_name_to_prefix)


def put_prefixes(w: Writer, table: Any, limit: int = MAX_COUNT) -> None:
    """An extensionNameToPrefix table (a model's, or a config's)."""
    for e in w.count(table, "extensionNameToPrefix", limit):
        if not isinstance(e, ExtensionNameAndPrefix):
            raise WireError("extensionNameToPrefix: not an ExtensionNameAndPrefix")
        w.str(e.name, "extension name")
        w.u16(e.prefix, "extension prefix")


def get_prefixes(r: Reader, limit: int = MAX_COUNT) -> list[ExtensionNameAndPrefix]:
    return [ExtensionNameAndPrefix(r.str(), r.u16())
            for _ in range(r.count("extensionNameToPrefix", 6, limit))]


def get_model(r: Reader) -> Model:
    main = get_subgraph(r)
    referenced = [get_subgraph(r) for _ in range(r.count("referenced", _SUBGRAPH_MIN))]
    values = r.bytes("operandValues")
    pools = [r.memory("model pool") for _ in range(r.count("pools", 9))]
    relax = r.bool()
    return Model(main, referenced, values, pools, relax, get_prefixes(r))


def put_argument(w: Writer, a: Any) -> None:
    if not isinstance(a, RequestArgument):
        raise WireError("request argument: not a RequestArgument")
    w.bool(a.has_no_value)
    put_location(w, a.location)
    w.u32s(a.dimensions, "argument.dimensions")


def get_argument(r: Reader) -> RequestArgument:
    return RequestArgument(r.bool(), get_location(r), r.u32s("argument.dimensions"))


def put_request(w: Writer, req: Any) -> None:
    if not isinstance(req, Request):
        raise WireError("request: not a Request")
    for a in w.count(req.inputs, "request.inputs"):
        put_argument(w, a)
    for a in w.count(req.outputs, "request.outputs"):
        put_argument(w, a)
    for p in w.count(req.pools, "request.pools"):
        if isinstance(p, MemoryPool):
            if p.hidl_memory is not None and p.token is None:
                w.u8(POOL_MEMORY)
                w.memory(p.hidl_memory, "request pool")
            elif p.token is not None and p.hidl_memory is None:
                w.u8(POOL_TOKEN)
                w.u32(p.token, "request pool token")
            elif p.token is None:
                w.u8(POOL_EMPTY)
            else:
                raise WireError("request pool: both a memory and a token")
        else:
            w.u8(POOL_MEMORY)
            w.memory(p, "request pool")


def get_request(r: Reader, token_filter: Callable[[int], int] | None = None) -> Request:
    inputs = [get_argument(r) for _ in range(r.count("request.inputs", 17))]
    outputs = [get_argument(r) for _ in range(r.count("request.outputs", 17))]
    pools: list[Any] = []
    for _ in range(r.count("request.pools", 1)):
        tag = r.tag(POOL_EMPTY, "request pool")
        if tag == POOL_MEMORY:
            pools.append(r.memory("request pool"))
        elif tag == POOL_TOKEN:
            token = r.u32()
            pools.append(MemoryPool.of_token(token_filter(token) if token_filter else token))
        else:
            pools.append(MemoryPool())
    return Request(inputs, outputs, pools)


def put_perf(w: Writer, p: Any) -> None:
    if not isinstance(p, PerformanceInfo):
        raise WireError("performance: not a PerformanceInfo")
    w.f64(p.exec_time)
    w.f64(p.power_usage)


def get_perf(r: Reader) -> PerformanceInfo:
    return PerformanceInfo(r.f64(), r.f64())


def put_capabilities(w: Writer, c: Any) -> None:
    if not isinstance(c, Capabilities):
        raise WireError("capabilities: not a Capabilities")
    put_perf(w, c.relaxed_float32_to_float16_performance_scalar)
    put_perf(w, c.relaxed_float32_to_float16_performance_tensor)
    for op in w.count(c.operand_performance, "operandPerformance"):
        w.u32(op.type, "operandPerformance.type")
        put_perf(w, op.info)
    put_perf(w, c.if_performance)
    put_perf(w, c.while_performance)


def get_capabilities(r: Reader) -> Capabilities:
    scalar, tensor = get_perf(r), get_perf(r)
    ops = [OperandPerformance(_enum_or_int(OperandType, r.u32()), get_perf(r))
           for _ in range(r.count("operandPerformance", 20))]
    return Capabilities(scalar, tensor, ops, get_perf(r), get_perf(r))


def put_extension(w: Writer, e: Any) -> None:
    if not isinstance(e, Extension):
        raise WireError("extension: not an Extension")
    w.str(e.name, "extension.name")
    for t in w.count(e.operand_types, "extension.operandTypes"):
        w.u16(t.type, "extension operand type")
        w.bool(t.is_tensor)
        w.u32(t.byte_size, "extension operand byteSize")


def get_extension(r: Reader) -> Extension:
    name = r.str()
    types = [ExtensionOperandTypeInformation(r.u16(), r.bool(), r.u32())
             for _ in range(r.count("extension.operandTypes", 7))]
    return Extension(name, types)


def put_timing(w: Writer, t: Any) -> None:
    if not isinstance(t, Timing):
        raise WireError("timing: not a Timing")
    w.u64(t.time_on_device, "timeOnDevice")
    w.u64(t.time_in_driver, "timeInDriver")


def get_timing(r: Reader) -> Timing:
    return Timing(r.u64(), r.u64())


def put_shapes(w: Writer, shapes: Any) -> None:
    for s in w.count(shapes, "outputShapes"):
        if not isinstance(s, OutputShape):
            raise WireError("outputShape: not an OutputShape")
        w.u32s(s.dimensions, "outputShape.dimensions")
        w.bool(s.is_sufficient)


def get_shapes(r: Reader) -> list[OutputShape]:
    return [OutputShape(r.u32s("outputShape.dimensions"), r.bool())
            for _ in range(r.count("outputShapes", 5))]


def pack_shapes_result(status: ErrorStatus, shapes: list[OutputShape], timing: Timing
                       ) -> bytes:
    """status, outputShapes, timing: the bytes put_status, put_shapes and put_timing write, for
    a driver's own result (a list of OutputShape with lists of ints), built in one go; anything
    else takes the checked way."""
    try:
        if type(shapes) is list and len(shapes) <= MAX_COUNT:
            parts = [_U32.pack(ErrorStatus(status)), _U32.pack(len(shapes))]
            for s in shapes:
                if type(s) is not OutputShape or type(s.dimensions) is not list:
                    break
                dims = s.dimensions
                parts.append(struct.pack(f"<I{len(dims)}IB", len(dims), *dims,
                                         1 if s.is_sufficient else 0))
            else:
                if type(timing) is Timing:
                    parts.append(_TIMING.pack(timing.time_on_device, timing.time_in_driver))
                    return b"".join(parts)
    except (struct.error, ValueError, TypeError):
        pass
    wr = Writer()
    put_status(wr, status)
    put_shapes(wr, shapes)
    put_timing(wr, timing)
    return bytes(wr.buf)


def get_shapes_result(r: Reader) -> tuple[ErrorStatus, list[OutputShape], Timing]:
    """What pack_shapes_result wrote, with every check of get_status, get_shapes and
    get_timing, in fewer steps (the reply of every execution)."""
    view, pos = r.view, r.pos
    end = len(view)
    if end - pos < 8:
        raise WireError("truncated at status")
    v, n = _TWO_U32.unpack_from(view, pos)
    status = _STATUSES.get(v)
    if status is None:
        raise WireError(f"unknown ErrorStatus {v}")
    pos += 8
    if n > MAX_COUNT or n * 5 > end - pos:
        raise WireError(f"outputShapes: count {n} exceeds the message")
    shapes = []
    for _ in range(n):
        if end - pos < 4:
            raise WireError("truncated at outputShape.dimensions")
        (k,) = _U32.unpack_from(view, pos)
        pos += 4
        if k > MAX_COUNT or 4 * k + 1 > end - pos:
            raise WireError(f"outputShape.dimensions: count {k} exceeds the message")
        dims = list(struct.unpack_from(f"<{k}I", view, pos))
        pos += 4 * k
        flag = view[pos]
        pos += 1
        if flag > 1:
            raise WireError(f"outputShape.is_sufficient: boolean {flag}")
        shapes.append(OutputShape(dims, flag == 1))
    if end - pos < 16:
        raise WireError("truncated at timing")
    on_device, in_driver = _TIMING.unpack_from(view, pos)
    r.pos = pos + 16
    return status, shapes, Timing(on_device, in_driver)


def put_status(w: Writer, s: Any) -> None:
    w.u32(ErrorStatus(s), "status")


def get_status(r: Reader) -> ErrorStatus:
    v = r.u32("status")
    try:
        return ErrorStatus(v)
    except ValueError:
        raise WireError(f"unknown ErrorStatus {v}") from None


def put_role(w: Writer, role: Any) -> None:
    if not isinstance(role, BufferRole):
        raise WireError("role: not a BufferRole")
    w.u32(role.model_index, "role.modelIndex")
    w.u32(role.io_index, "role.ioIndex")
    w.f64(role.frequency, "role.frequency")


def get_role(r: Reader) -> BufferRole:
    return BufferRole(r.u32(), r.u32(), r.f64())


def put_buffer_desc(w: Writer, d: Any) -> None:
    if not isinstance(d, BufferDesc):
        raise WireError("desc: not a BufferDesc")
    w.u32s(d.dimensions, "desc.dimensions")


def get_buffer_desc(r: Reader) -> BufferDesc:
    return BufferDesc(r.u32s("desc.dimensions"))


def put_handles(w: Writer, handles: Any, what: str) -> None:
    """Cache handles: each a descriptor, or marked invalid (the driver then sees -1)."""
    items = [] if handles is None else handles
    for h in w.count(items, what):
        fd = _handle_fd(h)
        if fd is None:
            w.u8(HANDLE_INVALID)
        else:
            w.u8(HANDLE_FD)
            w.fd(fd, what)


def _handle_fd(h: Any) -> int | None:
    if isinstance(h, (list, tuple)):
        if len(h) != 1:
            return None
        h = h[0]
    if isinstance(h, bool) or h is None:
        return None
    try:
        fileno = getattr(h, "fileno", None)
        fd = fileno() if callable(fileno) else h
        if not isinstance(fd, int) or not 0 <= fd <= 0x7FFF_FFFF:
            return None
        os.fstat(fd)
        return fd
    except (OSError, ValueError, TypeError):
        return None


def get_handles(r: Reader, what: str) -> list[int]:
    out = []
    for _ in range(r.count(what, 1)):
        out.append(r.fd(what) if r.tag(HANDLE_INVALID, what) == HANDLE_FD else -1)
    return out


def put_token(w: Writer, token: Any) -> None:
    """A cache token: bytes of any length (the driver checks it), or tag 1 for "not bytes"."""
    if isinstance(token, (bytes, bytearray)) and len(token) <= 1024:
        w.u8(0)
        w.bytes(token, "token")
    else:
        w.u8(1)


def get_token(r: Reader) -> bytes | None:
    return r.bytes("token", 1024) if r.tag(1, "token") == 0 else None


# ---- AIDL v4 configs ------------------------------------------------------------------------

def put_hints(w: Writer, hints: Any, what: str) -> None:
    """Vendor hints (TokenValuePair): i32 token as given (the driver judges it), bytes value;
    past MAX_HINTS or MAX_HINT_VALUE is a WireError naming the bound."""
    for h in w.count(hints, what, MAX_HINTS):
        if not isinstance(h, TokenValuePair):
            raise WireError(f"{what}: not a TokenValuePair: {type(h).__name__}")
        w.i32(h.token, f"{what} token")
        if isinstance(h.value, (bytes, bytearray, memoryview)) and \
                memoryview(h.value).nbytes > MAX_HINT_VALUE:
            raise WireError(f"{what}: a value of {memoryview(h.value).nbytes} bytes, "
                            f"at most {MAX_HINT_VALUE}")
        w.bytes(h.value, f"{what} value")


def get_hints(r: Reader, what: str) -> tuple[TokenValuePair, ...]:
    return tuple(TokenValuePair(r.i32(f"{what} token"), r.bytes(f"{what} value", MAX_HINT_VALUE))
                 for _ in range(r.count(what, 8, MAX_HINTS)))


def has_hints(config: Any, hints: str) -> bool:
    """Whether a config carries more than the plain call does: hints or an extension table
    (or is not a config at all, which the *_WITH_CONFIG encoding then refuses)."""
    try:
        return bool(getattr(config, hints)) or bool(config.extension_name_to_prefix)
    except Exception:  # noqa: BLE001 - a foreign object: the encoder says what is wrong
        return True


def put_execution_config(w: Writer, c: Any) -> None:
    """ExecutionConfig: i32 measure, opt loopTimeout, hints, extension table."""
    if not isinstance(c, ExecutionConfig):
        raise WireError(f"config: not an ExecutionConfig: {type(c).__name__}")
    w.i32(c.measure, "measureTiming")
    w.opt_i64(c.loop_timeout, "loopTimeoutDuration")
    put_hints(w, c.execution_hints, "executionHints")
    put_prefixes(w, c.extension_name_to_prefix, MAX_CONFIG_EXTENSIONS)


def get_execution_config(r: Reader) -> ExecutionConfig:
    return ExecutionConfig(_enum_or_int(MeasureTiming, r.i32("measureTiming")),  # type: ignore[arg-type]
                           r.opt_i64("loopTimeoutDuration"), get_hints(r, "executionHints"),
                           tuple(get_prefixes(r, MAX_CONFIG_EXTENSIONS)))


def put_prepare_config(w: Writer, c: Any) -> None:
    """PrepareModelConfig: i32 preference, i32 priority, opt deadline, Handles modelCache,
    Handles dataCache, Token, hints, extension table."""
    if not isinstance(c, PrepareModelConfig):
        raise WireError(f"config: not a PrepareModelConfig: {type(c).__name__}")
    w.i32(c.preference, "preference")
    w.i32(c.priority, "priority")
    w.opt_i64(c.deadline, "deadline")
    put_handles(w, c.model_cache, "modelCache")
    put_handles(w, c.data_cache, "dataCache")
    put_token(w, c.cache_token)
    put_hints(w, c.compilation_hints, "compilationHints")
    put_prefixes(w, c.extension_name_to_prefix, MAX_CONFIG_EXTENSIONS)


def get_prepare_config(r: Reader) -> PrepareModelConfig:
    """The config as decoded: cache handles are descriptors (-1: invalid), the token None when
    the client's was not bytes, so the driver refuses them as it would in process."""
    return PrepareModelConfig(
        _enum_or_int(ExecutionPreference, r.i32("preference")),  # type: ignore[arg-type]
        _enum_or_int(Priority, r.i32("priority")),  # type: ignore[arg-type]
        r.opt_i64("deadline"), get_handles(r, "modelCache"), get_handles(r, "dataCache"),
        get_token(r), get_hints(r, "compilationHints"),  # type: ignore[arg-type]
        tuple(get_prefixes(r, MAX_CONFIG_EXTENSIONS)))


# ---- fences -----------------------------------------------------------------------------------

FENCE_ACTIVE, FENCE_SIGNALED, FENCE_ERROR = 0, 1, 2


def put_fence_state(w: Writer, fence_id: int, state: int,
                    info: tuple[Any, Timing, Timing] | None) -> None:
    """FENCE_STATE: a fence of ``fence_id`` completed (and, for a fence a fenced execution
    returned, that execution's getExecutionInfo)."""
    w.u64(fence_id)
    w.u8(state)
    if info is None:
        w.u8(0)
    else:
        w.u8(1)
        put_status(w, info[0])
        put_timing(w, info[1])
        put_timing(w, info[2])


def get_fence_state(r: Reader) -> tuple[int, int, tuple[ErrorStatus, Timing, Timing] | None]:
    fence_id = r.u64()
    state = r.u8()
    if state not in (FENCE_SIGNALED, FENCE_ERROR):
        raise WireError(f"fence state {state}")
    info = None
    if r.bool():
        info = (get_status(r), get_timing(r), get_timing(r))
    return fence_id, state, info
