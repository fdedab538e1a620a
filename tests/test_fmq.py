"""FMQ packets (1.2 FmqRequestDatum / FmqResultDatum): round trips and strict decoding."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnhal.hal.types import (
    NO_TIMING,
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    OutputShape,
    Request,
    RequestArgument,
    Timing,
)
from nnhal.hidl import fmq
from nnhal.hidl.fmq import (
    DATUM_SIZE,
    FmqDecodeError,
    FmqEncodeError,
    FmqRequestDatum,
    FmqResultDatum,
    RequestDatumKind,
    RequestOperandInformation,
    RequestPacketInformation,
    ResultDatumKind,
)

U32 = st.integers(0, 2**32 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
K = RequestDatumKind
R = ResultDatumKind


@st.composite
def arguments(draw):
    if draw(st.booleans()):
        return RequestArgument(True)
    loc = DataLocation(draw(U32), draw(U32), draw(U32))
    return RequestArgument(False, loc, draw(st.lists(U32, max_size=5)))


@st.composite
def requests(draw):
    n_pools = draw(st.integers(0, 4))
    req = Request(draw(st.lists(arguments(), max_size=4)), draw(st.lists(arguments(), max_size=4)),
                  [object() for _ in range(n_pools)])
    slots = draw(st.lists(I32, min_size=n_pools, max_size=n_pools))
    return req, draw(st.sampled_from(MeasureTiming)), slots


@st.composite
def results(draw):
    shapes = draw(st.lists(st.builds(OutputShape, st.lists(U32, max_size=5), st.booleans()),
                           max_size=4))
    timing = draw(st.one_of(st.just(NO_TIMING),
                            st.builds(Timing, st.integers(0, 2**64 - 1),
                                      st.integers(0, 2**64 - 1))))
    return draw(st.sampled_from(ErrorStatus)), shapes, timing


def simple_request():
    req = Request([RequestArgument(False, DataLocation(0, 0, 16), [2, 2]), RequestArgument(True)],
                  [RequestArgument(False, DataLocation(1, 8, 16), [4])], [object(), object()])
    return req, MeasureTiming.YES, [11, 12]


# ---- round trips ------------------------------------------------------------------------------

@given(requests())
def test_request_round_trip(case):
    req, measure, slots = case
    datums = fmq.serialize_request(req, measure, slots)
    assert datums[0].value.packet_size == len(datums)
    assert datums[-1] == FmqRequestDatum(K.MEASURE_TIMING, measure)
    data = fmq.encode_request_datums(datums)
    assert len(data) == DATUM_SIZE * len(datums)
    assert fmq.decode_request_datums(data) == datums
    got, got_slots, got_measure = fmq.unpack_request(data)
    assert got.inputs == req.inputs and got.outputs == req.outputs and got.pools == []
    assert got_slots == slots and got_measure == measure


@given(results())
def test_result_round_trip(case):
    status, shapes, timing = case
    data = fmq.pack_result(status, shapes, timing)
    assert fmq.unpack_result(data) == (status, shapes, timing)
    assert fmq.deserialize_result(fmq.serialize_result(status, shapes, timing)) == case


def test_request_datum_order_follows_the_types_text():
    kinds = [d.kind for d in fmq.serialize_request(*simple_request())]
    assert kinds == [K.PACKET_INFORMATION,
                     K.INPUT_OPERAND_INFORMATION, K.INPUT_OPERAND_DIMENSION_VALUE,
                     K.INPUT_OPERAND_DIMENSION_VALUE, K.INPUT_OPERAND_INFORMATION,
                     K.OUTPUT_OPERAND_INFORMATION, K.OUTPUT_OPERAND_DIMENSION_VALUE,
                     K.POOL_IDENTIFIER, K.POOL_IDENTIFIER, K.MEASURE_TIMING]
    head = fmq.serialize_request(*simple_request())[0].value
    assert head == RequestPacketInformation(10, 2, 1, 2)


def test_result_datum_order_and_layout():
    datums = fmq.serialize_result(ErrorStatus.OUTPUT_INSUFFICIENT_SIZE,
                                  [OutputShape([3, 5], False)], Timing(7, 9))
    assert [d.kind for d in datums] == [R.PACKET_INFORMATION, R.OPERAND_INFORMATION,
                                        R.OPERAND_DIMENSION_VALUE, R.OPERAND_DIMENSION_VALUE,
                                        R.EXECUTION_TIMING]
    data = fmq.encode_result_datums(datums)
    assert struct.unpack_from("<I4xIiI4x", data, 0) == (0, 5, 3, 1)
    assert struct.unpack_from("<I4xQQ", data, 4 * DATUM_SIZE) == (3, 7, 9)


def test_omitted_argument_round_trips_with_zero_location():
    req = Request([RequestArgument(True, DataLocation(0, 0, 0), [])], [], [])
    got, _, _ = fmq.unpack_request(fmq.pack_request(req, MeasureTiming.NO, []))
    assert got.inputs == [RequestArgument(True, DataLocation(0, 0, 0), [])]


@pytest.mark.parametrize("loc,dims", [(DataLocation(1, 2, 3), []), (DataLocation(0, 0, 4), []),
                                      (DataLocation(0, 0, 0), [4])])
def test_invalid_omitted_argument_has_no_packet(loc, dims):
    # Writing it with a zero location would turn an invalid request into a valid one; the
    # sender must fall back to a path that carries it as it is (the driver then rejects it).
    req = Request([RequestArgument(True, loc, dims)], [], [])
    with pytest.raises(FmqEncodeError):
        fmq.pack_request(req, MeasureTiming.NO, [])
    with pytest.raises(FmqEncodeError):
        fmq.serialize_request(req, MeasureTiming.NO, [])


# ---- strict decoding ---------------------------------------------------------------------------

def test_every_truncation_is_rejected():
    data = fmq.pack_request(*simple_request())
    for n in range(len(data)):
        with pytest.raises(FmqDecodeError):
            fmq.unpack_request(data[:n])
    res = fmq.pack_result(ErrorStatus.NONE, [OutputShape([1, 2])], Timing(1, 2))
    for n in range(len(res)):
        with pytest.raises(FmqDecodeError):
            fmq.unpack_result(res[:n])


def test_truncated_datum_list_is_rejected():
    datums = fmq.serialize_request(*simple_request())
    for n in range(len(datums)):
        with pytest.raises(FmqDecodeError):
            fmq.deserialize_request(datums[:n])
    # Even with the packet size fixed up to match, the missing datums are noticed.
    for n in range(1, len(datums)):
        head = FmqRequestDatum(K.PACKET_INFORMATION, RequestPacketInformation(n, 2, 1, 2))
        with pytest.raises(FmqDecodeError):
            fmq.deserialize_request([head, *datums[1:n]])


def replace_head(datums, **changes):
    info = datums[0].value
    fields = {"packet_size": info.packet_size,
              "number_of_input_operands": info.number_of_input_operands,
              "number_of_output_operands": info.number_of_output_operands,
              "number_of_pools": info.number_of_pools, **changes}
    return [FmqRequestDatum(K.PACKET_INFORMATION, RequestPacketInformation(**fields)),
            *datums[1:]]


@pytest.mark.parametrize("changes", [
    {"packet_size": 9}, {"packet_size": 11}, {"packet_size": 2**32 - 1},
    {"number_of_input_operands": 1}, {"number_of_input_operands": 3},
    {"number_of_output_operands": 0}, {"number_of_output_operands": 2},
    {"number_of_pools": 1}, {"number_of_pools": 3}, {"number_of_pools": 2**32 - 1},
    {"number_of_input_operands": 2**32 - 1},
])
def test_counts_that_disagree_are_rejected(changes):
    datums = replace_head(fmq.serialize_request(*simple_request()), **changes)
    with pytest.raises(FmqDecodeError):
        fmq.deserialize_request(datums)
    with pytest.raises(FmqDecodeError):
        fmq.unpack_request(fmq.encode_request_datums(datums))


def test_dimension_count_that_disagrees_is_rejected():
    datums = fmq.serialize_request(*simple_request())
    for n_dims in (0, 1, 3, 2**32 - 1):
        op = datums[1].value
        bad = RequestOperandInformation(op.has_no_value, op.location, n_dims)
        with pytest.raises(FmqDecodeError):
            fmq.deserialize_request([datums[0], FmqRequestDatum(K.INPUT_OPERAND_INFORMATION, bad),
                                     *datums[2:]])


def test_out_of_order_and_trailing_datums_are_rejected():
    datums = fmq.serialize_request(*simple_request())
    swapped = list(datums)
    swapped[7], swapped[5] = swapped[5], swapped[7]  # a pool identifier before the outputs
    with pytest.raises(FmqDecodeError, match="expected"):
        fmq.deserialize_request(swapped)
    moved = [datums[0], *datums[2:4], datums[1], *datums[4:]]  # dimensions before their info
    with pytest.raises(FmqDecodeError):
        fmq.deserialize_request(moved)
    trailing = replace_head([*datums, datums[-1]], packet_size=len(datums) + 1)
    with pytest.raises(FmqDecodeError, match="after measureTiming"):
        fmq.deserialize_request(trailing)
    with pytest.raises(FmqDecodeError):
        fmq.unpack_request(fmq.pack_request(*simple_request()) + bytes(DATUM_SIZE))


def test_bad_discriminators_padding_and_flags_are_rejected():
    data = bytearray(fmq.pack_request(*simple_request()))
    for tag in (7, 0xFFFF_FFFF):
        bad = bytearray(data)
        struct.pack_into("<I", bad, DATUM_SIZE, tag)
        with pytest.raises(FmqDecodeError, match="discriminator"):
            fmq.unpack_request(bytes(bad))
    bad = bytearray(data)
    bad[DATUM_SIZE + 4] = 2  # hasNoValue is neither 0 nor 1
    with pytest.raises(FmqDecodeError, match="hasNoValue"):
        fmq.unpack_request(bytes(bad))
    bad = bytearray(data)
    bad[DATUM_SIZE + 5] = 1  # padding after hasNoValue
    with pytest.raises(FmqDecodeError, match="padding"):
        fmq.unpack_request(bytes(bad))
    bad = bytearray(data)
    struct.pack_into("<i", bad, len(data) - DATUM_SIZE + 4, 2)  # measureTiming 2
    with pytest.raises(FmqDecodeError, match="MeasureTiming"):
        fmq.unpack_request(bytes(bad))
    res = bytearray(fmq.pack_result(ErrorStatus.NONE, [], NO_TIMING))
    struct.pack_into("<i", res, 12, 99)  # no such ErrorStatus
    with pytest.raises(FmqDecodeError, match="ErrorStatus"):
        fmq.unpack_result(bytes(res))


def test_omitted_argument_with_location_is_rejected():
    datums = fmq.serialize_request(*simple_request())
    bad = RequestOperandInformation(True, DataLocation(0, 4, 0), 0)
    with pytest.raises(FmqDecodeError, match="omitted"):
        fmq.deserialize_request([*datums[:4], FmqRequestDatum(K.INPUT_OPERAND_INFORMATION, bad),
                                 *datums[5:]])


@pytest.mark.parametrize("data", [b"", b"\0" * 23, b"\0" * 25, "text", None, 42])
def test_garbage_is_rejected_with_the_decode_error(data):
    with pytest.raises(FmqDecodeError):
        fmq.unpack_request(data)
    with pytest.raises(FmqDecodeError):
        fmq.unpack_result(data)


@pytest.mark.parametrize("datums", [
    [], None, [object()], [FmqResultDatum(R.PACKET_INFORMATION, None)],
    [FmqRequestDatum(K.PACKET_INFORMATION, "x")],
    [FmqRequestDatum(K.PACKET_INFORMATION, RequestPacketInformation(2, 0, 0, 0)),
     FmqRequestDatum(K.MEASURE_TIMING, "yes")],
    [FmqRequestDatum(K.PACKET_INFORMATION, RequestPacketInformation(2, 0, 0, 0)),
     FmqRequestDatum(K.MEASURE_TIMING, True)],
    [FmqRequestDatum(K.PACKET_INFORMATION, RequestPacketInformation(-1, 0, 0, 0))],
])
def test_malformed_datum_lists_are_rejected(datums):
    with pytest.raises(FmqDecodeError):
        fmq.deserialize_request(datums)


def test_result_counts_that_disagree_are_rejected():
    datums = fmq.serialize_result(ErrorStatus.NONE, [OutputShape([2, 3])], Timing(1, 2))
    info = datums[0].value
    for n in (0, 2, 2**32 - 1):
        head = FmqResultDatum(R.PACKET_INFORMATION, type(info)(info.packet_size,
                                                               info.error_status, n))
        with pytest.raises(FmqDecodeError):
            fmq.deserialize_result([head, *datums[1:]])
    with pytest.raises(FmqDecodeError):
        fmq.deserialize_result([*datums[:-1]])  # executionTiming missing
    with pytest.raises(FmqDecodeError):
        fmq.deserialize_result([*datums, datums[-1]])


@settings(max_examples=300)
@given(requests(), st.data())
def test_mutated_request_bytes_decode_exactly_or_fail_cleanly(case, data):
    """Strictness: whatever a mutated packet decodes to must encode back to the same bytes;
    everything else is an FmqDecodeError, never another exception."""
    packet = bytearray(fmq.pack_request(*case))
    op = data.draw(st.sampled_from(["flip", "delete", "insert"]))
    i = data.draw(st.integers(0, len(packet) - 1))
    if op == "flip":
        packet[i] ^= data.draw(st.integers(1, 255))
    elif op == "delete":
        del packet[i:i + data.draw(st.integers(1, 2 * DATUM_SIZE))]
    else:
        packet[i:i] = data.draw(st.binary(min_size=1, max_size=2 * DATUM_SIZE))
    try:
        req, slots, measure = fmq.unpack_request(bytes(packet))
    except FmqDecodeError:
        return
    req.pools = [None] * len(slots)
    assert fmq.pack_request(req, measure, slots) == bytes(packet)


@settings(max_examples=300)
@given(results(), st.data())
def test_mutated_result_bytes_decode_exactly_or_fail_cleanly(case, data):
    packet = bytearray(fmq.pack_result(*case))
    i = data.draw(st.integers(0, len(packet) - 1))
    if data.draw(st.booleans()):
        packet[i] ^= data.draw(st.integers(1, 255))
    else:
        del packet[i:i + data.draw(st.integers(1, 2 * DATUM_SIZE))]
    try:
        decoded = fmq.unpack_result(bytes(packet))
    except FmqDecodeError:
        return
    assert fmq.pack_result(*decoded) == bytes(packet)


# ---- encoding errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("arg", [
    RequestArgument(False, DataLocation(0, -1, 4)),
    RequestArgument(False, DataLocation(0, 0, 2**32)),
    RequestArgument(False, DataLocation(0, 0, 4), [-1]),
    RequestArgument(False, DataLocation(0, 0, 4), ["2"]),
    RequestArgument("yes"),
    "not an argument",
])
def test_unrepresentable_requests_are_refused(arg):
    with pytest.raises(FmqEncodeError):
        fmq.pack_request(Request([arg], [], []), MeasureTiming.NO, [])


def test_encoder_checks_slots_measure_and_results():
    req, measure, slots = simple_request()
    with pytest.raises(FmqEncodeError):
        fmq.pack_request(req, measure, slots[:1])
    with pytest.raises(FmqEncodeError):
        fmq.pack_request(req, measure, [0, 2**31])
    with pytest.raises(FmqEncodeError):
        fmq.pack_request(req, 5, slots)
    with pytest.raises(FmqEncodeError):
        fmq.pack_result(ErrorStatus.NONE, [OutputShape([-1])], NO_TIMING)
    with pytest.raises(FmqEncodeError):
        fmq.pack_result(ErrorStatus.NONE, [], Timing(-1, 0))
    with pytest.raises(FmqEncodeError):
        fmq.pack_result(42, [], NO_TIMING)
    with pytest.raises(FmqEncodeError):
        fmq.encode_request_datums([FmqRequestDatum(K.INPUT_OPERAND_DIMENSION_VALUE, -3)])


# ---- the fast path equals the datum path ------------------------------------------------------
#
# pack_request & co. go straight between HAL objects and bytes, and fall back to the datum path
# (the reference) on anything unusual. These tests hold the fast forms to the reference: the
# same bytes, the same decoded values, and wherever the reference refuses, the fast form gives
# up too, so the error (type and message) is the reference's.

def outcome(f, *args):
    try:
        return "ok", f(*args)
    except (FmqDecodeError, FmqEncodeError) as e:
        return type(e), str(e)


@settings(max_examples=300, deadline=None)
@given(requests())
def test_fast_request_encoding_and_decoding_equal_the_datum_path(case):
    fast = fmq._pack_request_fast(*case)
    assert fast is not None  # plain values: the fast path itself answers
    assert fast == fmq._pack_request_reference(*case) == fmq.pack_request(*case)
    decoded = fmq._unpack_request_fast(fast)
    assert decoded is not None
    assert decoded == fmq._unpack_request_reference(fast) == fmq.unpack_request(fast)
    assert fmq._unpack_request_fast(bytearray(fast)) == decoded
    assert fmq._unpack_request_fast(memoryview(fast)) == decoded


@settings(max_examples=300, deadline=None)
@given(results())
def test_fast_result_encoding_and_decoding_equal_the_datum_path(case):
    fast = fmq._pack_result_fast(*case)
    assert fast is not None
    assert fast == fmq._pack_result_reference(*case) == fmq.pack_result(*case)
    decoded = fmq._unpack_result_fast(fast)
    assert decoded is not None
    assert decoded == fmq._unpack_result_reference(fast) == fmq.unpack_result(fast) == case


def mutate(packet, data):
    packet = bytearray(packet)
    op = data.draw(st.sampled_from(["flip", "word", "delete", "insert", "datum"]))
    i = data.draw(st.integers(0, len(packet) - 1))
    if op == "flip":
        packet[i] ^= data.draw(st.integers(1, 255))
    elif op == "word":  # a whole aligned word: counts, tags and paddings get large values
        j = i - i % 4
        packet[j:j + 4] = data.draw(st.binary(min_size=4, max_size=4))
    elif op == "delete":
        del packet[i:i + data.draw(st.integers(1, 2 * DATUM_SIZE))]
    elif op == "insert":
        packet[i:i] = data.draw(st.binary(min_size=1, max_size=2 * DATUM_SIZE))
    else:  # drop or duplicate a whole datum: the packet stays aligned
        j = i - i % DATUM_SIZE
        if data.draw(st.booleans()):
            del packet[j:j + DATUM_SIZE]
        else:
            packet[j:j] = packet[j:j + DATUM_SIZE]
    return bytes(packet)


@settings(max_examples=500, deadline=None)
@given(requests(), st.data())
def test_fast_request_decoding_of_mutations_equals_the_datum_path(case, data):
    packet = mutate(fmq.pack_request(*case), data)
    reference = outcome(fmq._unpack_request_reference, packet)
    assert outcome(fmq.unpack_request, packet) == reference
    # Never laxer (the fast form gives up and leaves the error to the reference), and no
    # stricter either: whatever the reference accepts, the fast form decodes itself.
    fast = fmq._unpack_request_fast(packet)
    assert fast is None if reference[0] != "ok" else fast == reference[1]


@settings(max_examples=500, deadline=None)
@given(results(), st.data())
def test_fast_result_decoding_of_mutations_equals_the_datum_path(case, data):
    packet = mutate(fmq.pack_result(*case), data)
    reference = outcome(fmq._unpack_result_reference, packet)
    assert outcome(fmq.unpack_result, packet) == reference
    fast = fmq._unpack_result_fast(packet)
    assert fast is None if reference[0] != "ok" else fast == reference[1]


class Dim(int):
    """An int subclass: not the fast path's plain int, still an integer to the reference."""


@pytest.mark.parametrize("value", [
    3, 0, 2**32 - 1, 2**32, -1, True, Dim(5), np.uint32(7), np.int64(-2), 2.0, "4", None,
])
def test_fast_encoding_of_odd_values_equals_the_datum_path(value):
    """Where the fast path gives up (other types, ranges), the answer is still the reference's."""
    args = [RequestArgument(False, DataLocation(value, 0, 4), [2]),
            RequestArgument(False, DataLocation(0, value, 4), [2]),
            RequestArgument(False, DataLocation(0, 0, 4), [value, 3]),
            RequestArgument(value)]
    for arg in args:
        case = (Request([arg], (arg,), [None]), MeasureTiming.YES, [1])
        assert outcome(fmq.pack_request, *case) == outcome(fmq._pack_request_reference, *case)
    for slots, measure in (([value], MeasureTiming.NO), ([0], value)):
        case = (Request([], [], [None]), measure, slots)
        assert outcome(fmq.pack_request, *case) == outcome(fmq._pack_request_reference, *case)
    for case in ((ErrorStatus.NONE, [OutputShape([value])], NO_TIMING),
                 (ErrorStatus.NONE, (OutputShape([1], value),), NO_TIMING),
                 (ErrorStatus.NONE, [], Timing(value, 0)),
                 (value, [], NO_TIMING)):
        assert outcome(fmq.pack_result, *case) == outcome(fmq._pack_result_reference, *case)


def test_the_ring_s_packet_shapes_take_the_fast_path():
    """The burst's ADD packet (2 inputs, 1 output, 3 pools) and its result, and a big packet."""
    arg = RequestArgument(False, DataLocation(0, 0, 64), [1, 16])
    case = (Request([arg, arg], [arg], [None] * 3), MeasureTiming.NO, [0, 1, 2])
    data = fmq._pack_request_fast(*case)
    assert data is not None and len(data) == 336
    assert fmq._unpack_request_fast(data) == fmq._unpack_request_reference(data)
    res = fmq._pack_result_fast(ErrorStatus.NONE, [OutputShape([1, 16])], Timing(5, 6))
    assert res is not None and len(res) == 120
    assert fmq._unpack_result_fast(res) == (ErrorStatus.NONE, [OutputShape([1, 16])], Timing(5, 6))
    big = RequestArgument(False, DataLocation(0, 0, 4), list(range(2000)))
    case = (Request([big] * 3, [big], [None] * 300), MeasureTiming.YES, list(range(300)))
    data = fmq._pack_request_fast(*case)
    assert data == fmq._pack_request_reference(*case)
    assert fmq._unpack_request_fast(data) == fmq._unpack_request_reference(data)
    # its format is compiled for the call, not kept: big packets do not pile up in the cache
    assert all(len(fmt) <= fmq._STRUCT_CACHED_CHARS for fmt in fmq._STRUCTS)
    assert fmq._STRUCTS and len(fmq._STRUCTS) <= fmq._STRUCTS_MAX
