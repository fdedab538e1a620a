"""FMQ packets of the 1.2 burst protocol: ``FmqRequestDatum`` and ``FmqResultDatum``.

A burst sends each execution across a fast message queue as a *packet*: a run of fixed-size
datums, each a safe union (a discriminator and one payload). The order of the datums is the one
the 1.2 types text prescribes:

request: packetInformation, then per input inputOperandInformation followed by one
inputOperandDimensionValue per dimension, then the same for outputs
(outputOperandInformation, outputOperandDimensionValue), one poolIdentifier per pool, and
measureTiming last;

result: packetInformation (which carries the status), then per output operand
operandInformation followed by its operandDimensionValue datums, and executionTiming last.

Datums are dataclasses (:class:`FmqRequestDatum`, :class:`FmqResultDatum`). Their byte form is
this module's own (it does not claim binary compatibility with HIDL's in-memory layout): every
datum is :data:`DATUM_SIZE` = 24 bytes, little-endian, a ``uint32`` discriminator first.

=====================================  ==================================================
request datum (discriminator)          bytes 4..24
=====================================  ==================================================
0 packetInformation                    4 x uint32: packetSize, numberOfInputOperands,
                                       numberOfOutputOperands, numberOfPools; 4 zero bytes
1/3 input/outputOperandInformation     uint8 hasNoValue (0 or 1), 3 zero bytes, uint32
                                       poolIndex, offset, length, numberOfDimensions
2/4 input/outputOperandDimensionValue  uint32; 16 zero bytes
5 poolIdentifier                       int32; 16 zero bytes
6 measureTiming                        int32 (0 NO, 1 YES); 16 zero bytes
=====================================  ==================================================

=====================================  ==================================================
result datum (discriminator)           bytes 4..24 (bytes 4..8 are always zero)
=====================================  ==================================================
0 packetInformation                    uint32 packetSize, int32 errorStatus, uint32
                                       numberOfOperands; 4 zero bytes
1 operandInformation                   uint8 isSufficient (0 or 1), 3 zero bytes, uint32
                                       numberOfDimensions; 8 zero bytes
2 operandDimensionValue                uint32; 12 zero bytes
3 executionTiming                      2 x uint64: timeOnDevice, timeInDriver (UINT64_MAX:
                                       not available)
=====================================  ==================================================

Decoding is strict, so that every accepted byte string is exactly the encoding of what it
decodes to: padding must be zero, booleans 0 or 1, enums known, counts must agree with the
datums that follow, datums must come in order and nothing may trail. Every rejection is a
:class:`FmqDecodeError` (a ValueError), never another exception. Semantic checks of the decoded
request (pool indexes, dimensions against the model) are left to request validation.

The one-call forms (:func:`pack_request`, :func:`unpack_request`, :func:`pack_result`,
:func:`unpack_result`) are a burst's per-execution cost, so they skip the datum objects: they
go between HAL objects and bytes directly, and hand anything unusual to the datum path, which
stays the definition of the format and of every error message.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nnhal.hal.types import (
    NO_TIME,
    NO_TIMING,
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    OutputShape,
    Request,
    RequestArgument,
    Timing,
)

__all__ = [
    "DATUM_SIZE", "MAX_PACKET_DATUMS", "FmqDecodeError", "FmqEncodeError", "FmqRequestDatum",
    "FmqResultDatum", "RequestDatumKind", "ResultDatumKind", "RequestPacketInformation",
    "RequestOperandInformation", "ResultPacketInformation", "ResultOperandInformation",
    "serialize_request", "deserialize_request", "serialize_result", "deserialize_result",
    "encode_request_datums", "decode_request_datums", "encode_result_datums",
    "decode_result_datums", "pack_request", "unpack_request", "pack_result", "unpack_result",
]

#: Bytes per datum, for requests and results alike.
DATUM_SIZE = 24
#: The largest packet accepted or produced, in datums (a bound on what a peer can make us
#: allocate; far beyond any real request).
MAX_PACKET_DATUMS = 1 << 20
_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF


class FmqDecodeError(ValueError):
    """A packet is malformed: truncated, out of order, inconsistent or trailing data."""


class FmqEncodeError(ValueError):
    """A value cannot be represented in a packet (out of range, wrong type, too many datums)."""


class RequestDatumKind(enum.IntEnum):
    """The discriminator of FmqRequestDatum: its fields in declaration order."""

    PACKET_INFORMATION = 0
    INPUT_OPERAND_INFORMATION = 1
    INPUT_OPERAND_DIMENSION_VALUE = 2
    OUTPUT_OPERAND_INFORMATION = 3
    OUTPUT_OPERAND_DIMENSION_VALUE = 4
    POOL_IDENTIFIER = 5
    MEASURE_TIMING = 6


class ResultDatumKind(enum.IntEnum):
    """The discriminator of FmqResultDatum: its fields in declaration order."""

    PACKET_INFORMATION = 0
    OPERAND_INFORMATION = 1
    OPERAND_DIMENSION_VALUE = 2
    EXECUTION_TIMING = 3


@dataclass(frozen=True)
class RequestPacketInformation:
    """FmqRequestDatum::PacketInformation; ``packet_size`` counts this datum too."""

    packet_size: int
    number_of_input_operands: int
    number_of_output_operands: int
    number_of_pools: int


@dataclass(frozen=True)
class RequestOperandInformation:
    """FmqRequestDatum::OperandInformation; an omitted argument has zero location and dims."""

    has_no_value: bool
    location: DataLocation
    number_of_dimensions: int


@dataclass(frozen=True)
class ResultPacketInformation:
    """FmqResultDatum::PacketInformation."""

    packet_size: int
    error_status: ErrorStatus
    number_of_operands: int


@dataclass(frozen=True)
class ResultOperandInformation:
    """FmqResultDatum::OperandInformation."""

    is_sufficient: bool
    number_of_dimensions: int


RequestPayload = RequestPacketInformation | RequestOperandInformation | int | MeasureTiming
ResultPayload = ResultPacketInformation | ResultOperandInformation | int | Timing


@dataclass(frozen=True)
class FmqRequestDatum:
    """One element of a request packet: which field of the union is set, and its value."""

    kind: RequestDatumKind
    value: RequestPayload


@dataclass(frozen=True)
class FmqResultDatum:
    """One element of a result packet: which field of the union is set, and its value."""

    kind: ResultDatumKind
    value: ResultPayload


# ---- checks shared by both directions -----------------------------------------------------

def _int(x: object, lo: int, hi: int, what: str, err: type[ValueError]) -> int:
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise err(f"{what}: {x!r} is not an integer")
    v = x.__index__()  # type: ignore[union-attr]
    if not lo <= v <= hi:
        raise err(f"{what}: {v} is outside [{lo}, {hi}]")
    return v


def _u32(x: object, what: str, err: type[ValueError]) -> int:
    return _int(x, 0, _U32, what, err)


def _bool(x: object, what: str, err: type[ValueError]) -> bool:
    if not isinstance(x, bool):
        raise err(f"{what}: {x!r} is not a bool")
    return x


def _enum(cls: type[enum.IntEnum], x: object, what: str, err: type[ValueError]) -> object:
    v = _int(x, -(1 << 31), (1 << 31) - 1, what, err)
    try:
        return cls(v)
    except ValueError:
        raise err(f"{what}: {v} is not a {cls.__name__}") from None


# ---- request: Request <-> datums ------------------------------------------------------------

def serialize_request(request: Request, measure: MeasureTiming,
                      slots: Sequence[int]) -> list[FmqRequestDatum]:
    """The datums of a request packet; ``slots[i]`` identifies ``request.pools[i]``.

    An omitted argument must have a zero location and no dimensions (the HAL's rule; the
    decoder insists on it): one that has either raises FmqEncodeError rather than being
    written as a valid omitted argument, so that a sender falls back to a path that carries
    the request as it is and the driver, not the packet, judges it. Raises FmqEncodeError
    when a value does not fit its field.
    """
    E = FmqEncodeError
    K = RequestDatumKind
    try:
        inputs, outputs, slots = list(request.inputs), list(request.outputs), list(slots)
    except (AttributeError, TypeError) as e:
        raise E(f"not a request: {e}") from None
    if len(slots) != len(request.pools):
        raise E(f"{len(slots)} pool identifiers for {len(request.pools)} pools")
    body: list[FmqRequestDatum] = []
    for kind, dim_kind, args, name in ((K.INPUT_OPERAND_INFORMATION,
                                        K.INPUT_OPERAND_DIMENSION_VALUE, inputs, "input"),
                                       (K.OUTPUT_OPERAND_INFORMATION,
                                        K.OUTPUT_OPERAND_DIMENSION_VALUE, outputs, "output")):
        for k, arg in enumerate(args):
            where = f"{name} {k}"
            if not isinstance(arg, RequestArgument):
                raise E(f"{where}: not a RequestArgument")
            if _bool(arg.has_no_value, f"{where} hasNoValue", E):
                if arg.location != DataLocation(0, 0, 0) or len(arg.dimensions):
                    raise E(f"{where}: an omitted argument with a location or dimensions "
                            f"has no packet form")
                body.append(FmqRequestDatum(kind, RequestOperandInformation(
                    True, DataLocation(0, 0, 0), 0)))
                continue
            loc = arg.location
            location = DataLocation(_u32(loc.pool_index, f"{where} poolIndex", E),
                                    _u32(loc.offset, f"{where} offset", E),
                                    _u32(loc.length, f"{where} length", E))
            dims = [_u32(d, f"{where} dimension", E) for d in arg.dimensions]
            body.append(FmqRequestDatum(kind, RequestOperandInformation(False, location,
                                                                        len(dims))))
            body.extend(FmqRequestDatum(dim_kind, d) for d in dims)
    for i, slot in enumerate(slots):
        body.append(FmqRequestDatum(K.POOL_IDENTIFIER,
                                    _int(slot, -(1 << 31), (1 << 31) - 1,
                                         f"pool identifier {i}", E)))
    body.append(FmqRequestDatum(K.MEASURE_TIMING,
                                _enum(MeasureTiming, measure, "measureTiming", E)))
    size = len(body) + 1
    if size > MAX_PACKET_DATUMS:
        raise E(f"packet of {size} datums exceeds {MAX_PACKET_DATUMS}")
    head = FmqRequestDatum(K.PACKET_INFORMATION, RequestPacketInformation(
        size, len(inputs), len(outputs), len(slots)))
    return [head, *body]


class _Reader:
    """Takes datums in order, rejecting a missing or unexpected one."""

    def __init__(self, datums: Sequence[FmqRequestDatum] | Sequence[FmqResultDatum],
                 kinds: type[enum.IntEnum]):
        self.datums = datums
        self.kinds = kinds
        self.pos = 0

    def take(self, kind: enum.IntEnum, payload: type | tuple[type, ...]) -> object:
        if self.pos >= len(self.datums):
            raise FmqDecodeError(f"packet truncated: datum {self.pos} ({kind.name}) missing")
        d = self.datums[self.pos]
        got = getattr(d, "kind", None)
        if got != kind or type(got) is not self.kinds:
            name = got.name if isinstance(got, self.kinds) else repr(got)
            raise FmqDecodeError(f"datum {self.pos}: expected {kind.name}, found {name}")
        if not isinstance(d.value, payload) or isinstance(d.value, bool) and payload is int:
            raise FmqDecodeError(f"datum {self.pos}: bad {kind.name} payload {d.value!r}")
        self.pos += 1
        return d.value

    def remaining(self) -> int:
        return len(self.datums) - self.pos

    def take_count(self, n: int, what: str) -> int:
        """A count read from the packet, checked against the datums left before any loop."""
        n = _u32(n, what, FmqDecodeError)
        if n > self.remaining():
            raise FmqDecodeError(f"{what} {n} exceeds the {self.remaining()} datums left")
        return n


def _head(datums: Sequence[object], kinds: type[enum.IntEnum]) -> _Reader:
    try:
        n = len(datums)  # type: ignore[arg-type]
    except TypeError:
        raise FmqDecodeError("not a sequence of datums") from None
    if n == 0:
        raise FmqDecodeError("empty packet")
    if n > MAX_PACKET_DATUMS:
        raise FmqDecodeError(f"packet of {n} datums exceeds {MAX_PACKET_DATUMS}")
    return _Reader(datums, kinds)  # type: ignore[arg-type]


def _check_packet_size(size: object, n: int) -> None:
    if _u32(size, "packetSize", FmqDecodeError) != n:
        raise FmqDecodeError(f"packetSize {size} but the packet has {n} datums")


def deserialize_request(datums: Sequence[FmqRequestDatum]
                        ) -> tuple[Request, list[int], MeasureTiming]:
    """(request without pools, pool identifiers, measure) of a request packet.

    The request's ``pools`` is empty: the caller binds ``slots`` to memories. Raises
    FmqDecodeError for any malformed packet.
    """
    K = RequestDatumKind
    D = FmqDecodeError
    r = _head(datums, K)
    info = r.take(K.PACKET_INFORMATION, RequestPacketInformation)
    _check_packet_size(info.packet_size, len(datums))  # type: ignore[attr-defined]
    n_in = r.take_count(info.number_of_input_operands, "numberOfInputOperands")  # type: ignore
    n_out = r.take_count(info.number_of_output_operands,  # type: ignore[attr-defined]
                         "numberOfOutputOperands")
    n_pools = r.take_count(info.number_of_pools, "numberOfPools")  # type: ignore[attr-defined]
    if n_in + n_out + n_pools + 1 > r.remaining():
        raise D(f"{n_in} inputs, {n_out} outputs and {n_pools} pools do not fit a packet of "
                f"{len(datums)} datums")
    args: dict[str, list[RequestArgument]] = {"input": [], "output": []}
    for name, n, kind, dim_kind in (("input", n_in, K.INPUT_OPERAND_INFORMATION,
                                     K.INPUT_OPERAND_DIMENSION_VALUE),
                                    ("output", n_out, K.OUTPUT_OPERAND_INFORMATION,
                                     K.OUTPUT_OPERAND_DIMENSION_VALUE)):
        for k in range(n):
            where = f"{name} {k}"
            op = r.take(kind, RequestOperandInformation)
            no_value = _bool(op.has_no_value, f"{where} hasNoValue", D)  # type: ignore
            loc = op.location  # type: ignore[attr-defined]
            if not isinstance(loc, DataLocation):
                raise D(f"{where}: location is not a DataLocation")
            location = DataLocation(_u32(loc.pool_index, f"{where} poolIndex", D),
                                    _u32(loc.offset, f"{where} offset", D),
                                    _u32(loc.length, f"{where} length", D))
            n_dims = r.take_count(op.number_of_dimensions,  # type: ignore[attr-defined]
                                  f"{where} numberOfDimensions")
            if no_value and (location != DataLocation(0, 0, 0) or n_dims):
                raise D(f"{where}: an omitted argument must have a zero location and no "
                        f"dimensions")
            dims = [_u32(r.take(dim_kind, int), f"{where} dimension", D)
                    for _ in range(n_dims)]
            args[name].append(RequestArgument(no_value, location, dims))
    slots = [_int(r.take(K.POOL_IDENTIFIER, int), -(1 << 31), (1 << 31) - 1,
                  "poolIdentifier", D) for _ in range(n_pools)]
    measure = _enum(MeasureTiming, r.take(K.MEASURE_TIMING, int), "measureTiming", D)
    if r.remaining():
        raise D(f"{r.remaining()} datums after measureTiming")
    return Request(args["input"], args["output"], []), slots, measure  # type: ignore[return-value]


# ---- result: (status, shapes, timing) <-> datums ----------------------------------------------

def serialize_result(status: ErrorStatus, output_shapes: Sequence[OutputShape],
                     timing: Timing) -> list[FmqResultDatum]:
    """The datums of a result packet. Raises FmqEncodeError when a value does not fit."""
    E = FmqEncodeError
    K = ResultDatumKind
    st = _enum(ErrorStatus, status, "errorStatus", E)
    body: list[FmqResultDatum] = []
    try:
        shapes = list(output_shapes)
    except TypeError:
        raise E("output shapes are not a sequence") from None
    for k, shape in enumerate(shapes):
        if not isinstance(shape, OutputShape):
            raise E(f"output shape {k}: not an OutputShape")
        dims = [_u32(d, f"output shape {k} dimension", E) for d in shape.dimensions]
        body.append(FmqResultDatum(K.OPERAND_INFORMATION, ResultOperandInformation(
            _bool(shape.is_sufficient, f"output shape {k} isSufficient", E), len(dims))))
        body.extend(FmqResultDatum(K.OPERAND_DIMENSION_VALUE, d) for d in dims)
    if not isinstance(timing, Timing):
        raise E("timing is not a Timing")
    body.append(FmqResultDatum(K.EXECUTION_TIMING, Timing(
        _int(timing.time_on_device, 0, _U64, "timeOnDevice", E),
        _int(timing.time_in_driver, 0, _U64, "timeInDriver", E))))
    size = len(body) + 1
    if size > MAX_PACKET_DATUMS:
        raise E(f"packet of {size} datums exceeds {MAX_PACKET_DATUMS}")
    return [FmqResultDatum(K.PACKET_INFORMATION, ResultPacketInformation(size, st, len(shapes))),
            *body]


def deserialize_result(datums: Sequence[FmqResultDatum]
                       ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
    """(status, output shapes, timing) of a result packet; FmqDecodeError if malformed."""
    K = ResultDatumKind
    D = FmqDecodeError
    r = _head(datums, K)
    info = r.take(K.PACKET_INFORMATION, ResultPacketInformation)
    _check_packet_size(info.packet_size, len(datums))  # type: ignore[attr-defined]
    status = _enum(ErrorStatus, info.error_status, "errorStatus", D)  # type: ignore
    n = r.take_count(info.number_of_operands, "numberOfOperands")  # type: ignore[attr-defined]
    if n + 1 > r.remaining():
        raise D(f"{n} operands do not fit a packet of {len(datums)} datums")
    shapes = []
    for k in range(n):
        op = r.take(K.OPERAND_INFORMATION, ResultOperandInformation)
        ok = _bool(op.is_sufficient, f"operand {k} isSufficient", D)  # type: ignore
        n_dims = r.take_count(op.number_of_dimensions,  # type: ignore[attr-defined]
                              f"operand {k} numberOfDimensions")
        dims = [_u32(r.take(K.OPERAND_DIMENSION_VALUE, int), f"operand {k} dimension", D)
                for _ in range(n_dims)]
        shapes.append(OutputShape(dims, ok))
    t = r.take(K.EXECUTION_TIMING, Timing)
    timing = Timing(_int(t.time_on_device, 0, _U64, "timeOnDevice", D),  # type: ignore
                    _int(t.time_in_driver, 0, _U64, "timeInDriver", D))  # type: ignore
    if r.remaining():
        raise D(f"{r.remaining()} datums after executionTiming")
    return status, shapes, timing  # type: ignore[return-value]


# ---- datums <-> bytes ---------------------------------------------------------------------------

_TAG = struct.Struct("<I")
_REQ_INFO = struct.Struct("<I4I4x")
_REQ_OPERAND = struct.Struct("<IB3x4I")
_REQ_U32 = struct.Struct("<II16x")
_REQ_I32 = struct.Struct("<Ii16x")
_RES_INFO = struct.Struct("<I4xIiI4x")
_RES_OPERAND = struct.Struct("<I4xB3xI8x")
_RES_U32 = struct.Struct("<I4xI12x")
_RES_TIMING = struct.Struct("<I4xQQ")
assert all(s.size == DATUM_SIZE for s in (_REQ_INFO, _REQ_OPERAND, _REQ_U32, _REQ_I32,
                                         _RES_INFO, _RES_OPERAND, _RES_U32, _RES_TIMING))


def encode_request_datums(datums: Iterable[FmqRequestDatum]) -> bytes:
    """Bytes of request datums (see the module text for the layout); FmqEncodeError if a
    datum does not fit its layout."""
    K = RequestDatumKind
    out = bytearray()
    try:
        for d in datums:
            kind, v = K(d.kind), d.value
            if kind is K.PACKET_INFORMATION:
                out += _REQ_INFO.pack(kind, v.packet_size, v.number_of_input_operands,
                                      v.number_of_output_operands, v.number_of_pools)
            elif kind in (K.INPUT_OPERAND_INFORMATION, K.OUTPUT_OPERAND_INFORMATION):
                loc = v.location
                out += _REQ_OPERAND.pack(kind, _bool(v.has_no_value, "hasNoValue",
                                                     FmqEncodeError),
                                         loc.pool_index, loc.offset, loc.length,
                                         v.number_of_dimensions)
            elif kind in (K.INPUT_OPERAND_DIMENSION_VALUE, K.OUTPUT_OPERAND_DIMENSION_VALUE):
                out += _REQ_U32.pack(kind, v)
            else:
                out += _REQ_I32.pack(kind, v)
    except (struct.error, AttributeError, TypeError, ValueError) as e:
        if isinstance(e, FmqEncodeError):
            raise
        raise FmqEncodeError(f"datum {len(out) // DATUM_SIZE}: {e}") from None
    return bytes(out)


def _split(data: bytes | bytearray | memoryview) -> memoryview:
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise FmqDecodeError("packet is not bytes") from None
    if len(view) == 0:
        raise FmqDecodeError("empty packet")
    if len(view) % DATUM_SIZE:
        raise FmqDecodeError(f"packet of {len(view)} bytes is not a whole number of "
                             f"{DATUM_SIZE}-byte datums")
    if len(view) // DATUM_SIZE > MAX_PACKET_DATUMS:
        raise FmqDecodeError(f"packet of {len(view) // DATUM_SIZE} datums exceeds "
                             f"{MAX_PACKET_DATUMS}")
    return view


def _zero_padding(view: memoryview, off: int, st: struct.Struct, packed_fields: tuple) -> None:
    """Reject a datum whose padding bytes are not zero (re-packing must give the same bytes)."""
    if st.pack(*packed_fields) != view[off:off + DATUM_SIZE]:
        raise FmqDecodeError(f"datum {off // DATUM_SIZE}: non-zero padding")


def decode_request_datums(data: bytes | bytearray | memoryview) -> list[FmqRequestDatum]:
    """Request datums of a byte string, each checked for its layout (not yet for order)."""
    K = RequestDatumKind
    view = _split(data)
    datums = []
    for off in range(0, len(view), DATUM_SIZE):
        (tag,) = _TAG.unpack_from(view, off)
        try:
            kind = K(tag)
        except ValueError:
            raise FmqDecodeError(f"datum {off // DATUM_SIZE}: bad discriminator {tag}") from None
        if kind is K.PACKET_INFORMATION:
            f = _REQ_INFO.unpack_from(view, off)
            value: RequestPayload = RequestPacketInformation(*f[1:])
            st = _REQ_INFO
        elif kind in (K.INPUT_OPERAND_INFORMATION, K.OUTPUT_OPERAND_INFORMATION):
            f = _REQ_OPERAND.unpack_from(view, off)
            if f[1] > 1:
                raise FmqDecodeError(f"datum {off // DATUM_SIZE}: hasNoValue byte {f[1]}")
            value = RequestOperandInformation(bool(f[1]), DataLocation(*f[2:5]), f[5])
            st = _REQ_OPERAND
        elif kind in (K.INPUT_OPERAND_DIMENSION_VALUE, K.OUTPUT_OPERAND_DIMENSION_VALUE):
            f = _REQ_U32.unpack_from(view, off)
            value, st = f[1], _REQ_U32
        else:
            f = _REQ_I32.unpack_from(view, off)
            value, st = f[1], _REQ_I32
            if kind is K.MEASURE_TIMING:
                value = _enum(MeasureTiming, value, f"datum {off // DATUM_SIZE} measureTiming",
                              FmqDecodeError)  # type: ignore[assignment]
        _zero_padding(view, off, st, f)
        datums.append(FmqRequestDatum(kind, value))
    return datums


def encode_result_datums(datums: Iterable[FmqResultDatum]) -> bytes:
    """Bytes of result datums (see the module text for the layout)."""
    K = ResultDatumKind
    out = bytearray()
    try:
        for d in datums:
            kind, v = K(d.kind), d.value
            if kind is K.PACKET_INFORMATION:
                out += _RES_INFO.pack(kind, v.packet_size, v.error_status, v.number_of_operands)
            elif kind is K.OPERAND_INFORMATION:
                out += _RES_OPERAND.pack(kind, _bool(v.is_sufficient, "isSufficient",
                                                     FmqEncodeError), v.number_of_dimensions)
            elif kind is K.OPERAND_DIMENSION_VALUE:
                out += _RES_U32.pack(kind, v)
            else:
                out += _RES_TIMING.pack(kind, v.time_on_device, v.time_in_driver)
    except (struct.error, AttributeError, TypeError, ValueError) as e:
        if isinstance(e, FmqEncodeError):
            raise
        raise FmqEncodeError(f"datum {len(out) // DATUM_SIZE}: {e}") from None
    return bytes(out)


def decode_result_datums(data: bytes | bytearray | memoryview) -> list[FmqResultDatum]:
    """Result datums of a byte string, each checked for its layout (not yet for order)."""
    K = ResultDatumKind
    view = _split(data)
    datums = []
    for off in range(0, len(view), DATUM_SIZE):
        (tag,) = _TAG.unpack_from(view, off)
        try:
            kind = K(tag)
        except ValueError:
            raise FmqDecodeError(f"datum {off // DATUM_SIZE}: bad discriminator {tag}") from None
        if kind is K.PACKET_INFORMATION:
            f = _RES_INFO.unpack_from(view, off)
            status = _enum(ErrorStatus, f[2], f"datum {off // DATUM_SIZE} errorStatus",
                           FmqDecodeError)
            value: ResultPayload = ResultPacketInformation(f[1], status, f[3])  # type: ignore
            st = _RES_INFO
        elif kind is K.OPERAND_INFORMATION:
            f = _RES_OPERAND.unpack_from(view, off)
            if f[1] > 1:
                raise FmqDecodeError(f"datum {off // DATUM_SIZE}: isSufficient byte {f[1]}")
            value, st = ResultOperandInformation(bool(f[1]), f[2]), _RES_OPERAND
        elif kind is K.OPERAND_DIMENSION_VALUE:
            f = _RES_U32.unpack_from(view, off)
            value, st = f[1], _RES_U32
        else:
            f = _RES_TIMING.unpack_from(view, off)
            value, st = Timing(f[1], f[2]), _RES_TIMING
        _zero_padding(view, off, st, f)
        datums.append(FmqResultDatum(kind, value))
    return datums


# ---- one-call forms ---------------------------------------------------------------------------
#
# The datum path above (objects per datum) is the reference: it defines what is accepted and
# says precisely why not. The burst's hot path uses the fast forms below, which go straight
# between HAL objects and bytes with one struct per packet shape. A fast form returns None as
# soon as anything is unusual (a value of an unexpected type, a range error, any deviation from
# the canonical byte layout); the caller then runs the reference path, which gives the same
# bytes or result, or the same error with its message. So a fast form can only be stricter than
# the reference, never laxer, and its figures apply to well-formed traffic.

_W6 = struct.Struct("<6I")  # any datum as six little-endian uint32 words
_MEASURES = (MeasureTiming.NO, MeasureTiming.YES)
_STATUSES = {int(s): s for s in ErrorStatus}
_STRUCTS: dict[str, struct.Struct] = {}
_STRUCTS_MAX = 256  # packet shapes kept; a burst sees a handful
_STRUCT_CACHED_CHARS = 4096  # a compiled format holds ~14 bytes per character of it
# Decoded locations, shared: DataLocation is frozen, and building one costs more than the rest
# of its datum's decoding. A burst reuses a few locations again and again.
_LOCATIONS: dict[tuple[int, int, int], DataLocation] = {}
_LOCATIONS_MAX = 1024
_NO_LOCATION = DataLocation(0, 0, 0)


def _packer(fmt: str) -> struct.Struct:
    st = _STRUCTS.get(fmt)
    if st is None:
        if len(fmt) > _STRUCT_CACHED_CHARS:  # a rare big packet: compiled, not kept
            return struct.Struct(fmt)
        if len(_STRUCTS) >= _STRUCTS_MAX:
            _STRUCTS.clear()
        st = _STRUCTS[fmt] = struct.Struct(fmt)
    return st


def _pack_request_fast(request: object, measure: object, slots: object) -> bytes | None:
    if type(request) is not Request or type(slots) not in (list, tuple):
        return None
    inputs, outputs = request.inputs, request.outputs  # type: ignore[attr-defined]
    if type(inputs) is not list or type(outputs) is not list:
        return None
    if len(slots) != len(request.pools):  # type: ignore[arg-type, attr-defined]
        return None
    if type(measure) not in (MeasureTiming, int) or measure not in (0, 1):
        return None
    fmt = ["<I4I4x"]
    vals: list[object] = [0, 0, len(inputs), len(outputs), len(slots)]
    count = 1
    for tag, dim_tag, args in ((1, 2, inputs), (3, 4, outputs)):
        for arg in args:
            if type(arg) is not RequestArgument:
                return None
            no_value = arg.has_no_value
            if no_value is True:
                if arg.location != _NO_LOCATION or arg.dimensions:
                    return None  # not a valid omitted argument: the datum path refuses it
                fmt.append("IB3x4I")
                vals += (tag, 1, 0, 0, 0, 0)
                count += 1
                continue
            loc, dims = arg.location, arg.dimensions
            if no_value is not False or type(loc) is not DataLocation \
                    or type(dims) not in (list, tuple):
                return None
            p, o, n = loc.pool_index, loc.offset, loc.length
            if type(p) is not int or type(o) is not int or type(n) is not int:
                return None
            nd = len(dims)
            fmt.append("IB3x4I" + "II16x" * nd)
            vals += (tag, 0, p, o, n, nd)
            for d in dims:
                if type(d) is not int:
                    return None
                vals.append(dim_tag)
                vals.append(d)
            count += 1 + nd
    for s in slots:  # type: ignore[union-attr]
        if type(s) is not int:
            return None
        vals.append(5)
        vals.append(s)
    count += len(slots) + 1  # type: ignore[arg-type]
    if count > MAX_PACKET_DATUMS:
        return None
    fmt.append("Ii16x" * (len(slots) + 1))  # type: ignore[arg-type]
    vals.append(6)
    vals.append(measure)
    vals[1] = count
    return _packer("".join(fmt)).pack(*vals)  # struct.error (a range) -> reference


def _view(data: object) -> bytes | memoryview | None:
    if type(data) is bytes:
        view: bytes | memoryview = data
    else:
        try:
            view = memoryview(data).cast("B")  # type: ignore[arg-type]
        except TypeError:
            return None
    size = len(view)
    if not size or size % DATUM_SIZE or size > DATUM_SIZE * MAX_PACKET_DATUMS:
        return None
    return view


def _unpack_request_fast(data: object) -> tuple[Request, list[int], MeasureTiming] | None:
    view = _view(data)
    if view is None:
        return None
    size = len(view)
    u = _W6.unpack_from
    tag, n, n_in, n_out, n_pools, pad = u(view, 0)
    if tag or pad or n * DATUM_SIZE != size or n_in + n_out + n_pools + 2 > n:
        return None
    off = DATUM_SIZE
    io: tuple[list[RequestArgument], list[RequestArgument]] = ([], [])
    for tag_info, dim_tag, count, args in ((1, 2, n_in, io[0]), (3, 4, n_out, io[1])):
        for _ in range(count):
            if off >= size:
                return None
            tag, no_value, p, o, length, nd = u(view, off)
            off += DATUM_SIZE
            if tag != tag_info or no_value > 1:
                return None
            if no_value:
                if p or o or length or nd:
                    return None
                args.append(RequestArgument(True, _NO_LOCATION, []))
                continue
            end = off + DATUM_SIZE * nd
            if end > size:
                return None
            dims = []
            while off < end:
                tag, d, a, b, c, e = u(view, off)
                if tag != dim_tag or a or b or c or e:
                    return None
                dims.append(d)
                off += DATUM_SIZE
            key = (p, o, length)
            loc = _LOCATIONS.get(key)
            if loc is None:
                if len(_LOCATIONS) >= _LOCATIONS_MAX:
                    _LOCATIONS.clear()
                loc = _LOCATIONS[key] = DataLocation(p, o, length)
            args.append(RequestArgument(False, loc, dims))
    if off + DATUM_SIZE * (n_pools + 1) != size:
        return None
    slots = []
    for _ in range(n_pools):
        tag, s, a, b, c, e = u(view, off)
        if tag != 5 or a or b or c or e:
            return None
        slots.append(s - 0x1_0000_0000 if s & 0x8000_0000 else s)
        off += DATUM_SIZE
    tag, m, a, b, c, e = u(view, off)
    if tag != 6 or m > 1 or a or b or c or e:
        return None
    return Request(io[0], io[1], []), slots, _MEASURES[m]


def _pack_result_fast(status: object, output_shapes: object, timing: object) -> bytes | None:
    if type(status) is not ErrorStatus or type(output_shapes) not in (list, tuple) \
            or type(timing) is not Timing:
        return None
    fmt = ["<I4xIiI4x"]
    vals: list[object] = [0, 0, status, len(output_shapes)]  # type: ignore[arg-type]
    count = 2
    for shape in output_shapes:  # type: ignore[union-attr]
        if type(shape) is not OutputShape:
            return None
        ok, dims = shape.is_sufficient, shape.dimensions
        if (ok is not True and ok is not False) or type(dims) not in (list, tuple):
            return None
        nd = len(dims)
        fmt.append("I4xB3xI8x" + "I4xI12x" * nd)
        vals += (1, ok, nd)
        for d in dims:
            if type(d) is not int:
                return None
            vals.append(2)
            vals.append(d)
        count += 1 + nd
    t_dev, t_drv = timing.time_on_device, timing.time_in_driver
    if type(t_dev) is not int or type(t_drv) is not int or count > MAX_PACKET_DATUMS:
        return None
    fmt.append("I4xQQ")
    vals += (3, t_dev, t_drv)
    vals[1] = count
    return _packer("".join(fmt)).pack(*vals)  # struct.error (a range) -> reference


def _unpack_result_fast(data: object) -> tuple[ErrorStatus, list[OutputShape], Timing] | None:
    view = _view(data)
    if view is None:
        return None
    size = len(view)
    u = _W6.unpack_from
    tag, pad0, n, status, n_ops, pad = u(view, 0)
    if tag or pad0 or pad or n * DATUM_SIZE != size or n_ops + 2 > n \
            or status not in _STATUSES:
        return None
    off = DATUM_SIZE
    shapes = []
    for _ in range(n_ops):
        if off >= size:
            return None
        tag, pad0, ok, nd, a, b = u(view, off)
        off += DATUM_SIZE
        end = off + DATUM_SIZE * nd
        if tag != 1 or pad0 or ok > 1 or a or b or end > size:
            return None
        dims = []
        while off < end:
            tag, pad0, d, a, b, c = u(view, off)
            if tag != 2 or pad0 or a or b or c:
                return None
            dims.append(d)
            off += DATUM_SIZE
        shapes.append(OutputShape(dims, ok == 1))
    if off + DATUM_SIZE != size:
        return None
    tag, pad0, dev_lo, dev_hi, drv_lo, drv_hi = u(view, off)
    if tag != 3 or pad0:
        return None
    dev, drv = dev_hi << 32 | dev_lo, drv_hi << 32 | drv_lo
    return (_STATUSES[status], shapes,
            NO_TIMING if dev == drv == NO_TIME else Timing(dev, drv))


def _pack_request_reference(request: Request, measure: MeasureTiming,
                            slots: Sequence[int]) -> bytes:
    return encode_request_datums(serialize_request(request, measure, slots))


def _unpack_request_reference(data: bytes | bytearray | memoryview
                              ) -> tuple[Request, list[int], MeasureTiming]:
    view = _split(data)
    head = decode_request_datums(view[:DATUM_SIZE])[0]
    if head.kind is not RequestDatumKind.PACKET_INFORMATION:
        raise FmqDecodeError(f"datum 0: expected PACKET_INFORMATION, found {head.kind.name}")
    _check_packet_size(head.value.packet_size, len(view) // DATUM_SIZE)  # type: ignore
    return deserialize_request(decode_request_datums(view))


def _pack_result_reference(status: ErrorStatus, output_shapes: Sequence[OutputShape],
                           timing: Timing) -> bytes:
    return encode_result_datums(serialize_result(status, output_shapes, timing))


def _unpack_result_reference(data: bytes | bytearray | memoryview
                             ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
    view = _split(data)
    head = decode_result_datums(view[:DATUM_SIZE])[0]
    if head.kind is not ResultDatumKind.PACKET_INFORMATION:
        raise FmqDecodeError(f"datum 0: expected PACKET_INFORMATION, found {head.kind.name}")
    _check_packet_size(head.value.packet_size, len(view) // DATUM_SIZE)  # type: ignore
    return deserialize_result(decode_result_datums(view))


def pack_request(request: Request, measure: MeasureTiming, slots: Sequence[int]) -> bytes:
    """Request + measure + pool identifiers -> packet bytes; FmqEncodeError if unrepresentable."""
    try:
        data = _pack_request_fast(request, measure, slots)
    except (struct.error, TypeError):
        data = None
    return _pack_request_reference(request, measure, slots) if data is None else data


def unpack_request(data: bytes | bytearray | memoryview
                   ) -> tuple[Request, list[int], MeasureTiming]:
    """Packet bytes -> (request without pools, pool identifiers, measure), strictly.

    The header is checked before the rest is decoded, so a lying packetSize costs nothing.
    """
    got = _unpack_request_fast(data)
    return _unpack_request_reference(data) if got is None else got


def pack_result(status: ErrorStatus, output_shapes: Sequence[OutputShape],
                timing: Timing) -> bytes:
    """(status, output shapes, timing) -> packet bytes; FmqEncodeError if unrepresentable."""
    try:
        data = _pack_result_fast(status, output_shapes, timing)
    except (struct.error, TypeError):
        data = None
    return _pack_result_reference(status, output_shapes, timing) if data is None else data


def unpack_result(data: bytes | bytearray | memoryview
                  ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
    """Packet bytes -> (status, output shapes, timing), strictly."""
    got = _unpack_result_fast(data)
    return _unpack_result_reference(data) if got is None else got
