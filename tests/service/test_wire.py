"""The wire format: every HAL structure survives a round trip; malformed input is a WireError."""

from __future__ import annotations

import os
import socket
import struct

import pytest
from helpers import add_model
from hypothesis import given, settings
from hypothesis import strategies as st

from nnhal.hal.types import (
    NO_TIMING,
    BufferDesc,
    BufferRole,
    Capabilities,
    DataLocation,
    ErrorStatus,
    Extension,
    ExtensionNameAndPrefix,
    ExtensionOperandTypeInformation,
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
    Request,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
    Timing,
)
from nnhal.memory import SharedMemory
from nnhal.service import wire as w
from nnhal.service.transport import Closed, TooLarge, recv_message, send_message
from nnhal.service.wire import Reader, WireError, Writer

u32 = st.integers(0, 0xFFFF_FFFF)
dims = st.lists(u32, max_size=5)
finite = st.floats(allow_nan=False, width=64)


def roundtrip(put, get, value, **reader_args):
    wr = Writer()
    put(wr, value)
    fds = [os.dup(fd) for fd in wr.fds]  # what the kernel does with SCM_RIGHTS
    r = Reader(wr.buf, fds, **reader_args)
    out = get(r)
    r.commit()
    return out


operands = st.builds(
    Operand, type=st.sampled_from(list(OperandType)) | u32, dimensions=dims,
    number_of_consumers=u32, scale=finite, zero_point=st.integers(-(1 << 31), (1 << 31) - 1),
    lifetime=st.sampled_from(list(OperandLifeTime)),
    location=st.builds(DataLocation, u32, u32, u32),
    extra_params=st.none() | st.binary(max_size=8) | st.builds(
        SymmPerChannelQuantParams, st.lists(finite, max_size=4), u32))
subgraphs = st.builds(Subgraph, st.lists(operands, max_size=4),
                      st.lists(st.builds(Operation, st.sampled_from(list(OperationType)),
                                         st.lists(u32, max_size=3), st.lists(u32, max_size=3)),
                               max_size=3),
                      st.lists(u32, max_size=3), st.lists(u32, max_size=3))


@settings(max_examples=60, deadline=None)
@given(main=subgraphs, referenced=st.lists(subgraphs, max_size=2),
       values=st.binary(max_size=64), relax=st.booleans(),
       ext=st.lists(st.builds(ExtensionNameAndPrefix, st.text(max_size=10),
                              st.integers(0, 0xFFFF)), max_size=2))
def test_model_round_trip(main, referenced, values, relax, ext):
    model = Model(main, referenced, values, [], relax, ext)
    assert roundtrip(w.put_model, w.get_model, model) == model


def test_model_pools_cross_as_descriptors():
    mem = SharedMemory.from_bytes(b"abcdefgh")
    model = add_model()
    model.pools = [mem]
    out = roundtrip(w.put_model, w.get_model, model)
    got = out.pools[0]
    assert got.fd != mem.fd and got.size == 8 and got.name == mem.name
    assert got.read(0, 8) == b"abcdefgh"
    got.close()
    mem.close()


@settings(max_examples=60, deadline=None)
@given(args=st.lists(st.builds(RequestArgument, st.booleans(),
                               st.builds(DataLocation, u32, u32, u32), dims), max_size=3),
       tokens=st.lists(st.integers(1, 0xFFFF_FFFF), max_size=3))
def test_request_round_trip(args, tokens):
    req = Request(args, list(reversed(args)), [MemoryPool.of_token(t) for t in tokens]
                  + [MemoryPool()])
    assert roundtrip(w.put_request, w.get_request, req) == req


@settings(max_examples=30, deadline=None)
@given(perf=st.builds(PerformanceInfo, finite, finite),
       ops=st.lists(st.builds(OperandPerformance, u32, st.builds(PerformanceInfo, finite,
                                                                 finite)), max_size=4))
def test_capabilities_round_trip(perf, ops):
    caps = Capabilities(perf, perf, ops, perf, perf)
    assert roundtrip(w.put_capabilities, w.get_capabilities, caps) == caps


@given(shapes=st.lists(st.builds(OutputShape, dims, st.booleans()), max_size=4),
       t=st.builds(Timing, st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1)))
def test_shapes_timing_status_round_trip(shapes, t):
    assert roundtrip(w.put_shapes, w.get_shapes, shapes) == shapes
    assert roundtrip(w.put_timing, w.get_timing, t) == t
    for s in ErrorStatus:
        assert roundtrip(w.put_status, w.get_status, s) is s


def test_small_structures_round_trip():
    assert roundtrip(w.put_role, w.get_role, BufferRole(1, 2, 0.5)) == BufferRole(1, 2, 0.5)
    assert roundtrip(w.put_buffer_desc, w.get_buffer_desc, BufferDesc([1, 0, 3])) == \
        BufferDesc([1, 0, 3])
    ext = Extension("com.example", [ExtensionOperandTypeInformation(3, True, 4)])
    assert roundtrip(w.put_extension, w.get_extension, ext) == ext
    assert roundtrip(w.put_token, w.get_token, b"t" * 32) == b"t" * 32
    assert roundtrip(w.put_token, w.get_token, 42) is None
    info = (ErrorStatus.NONE, Timing(1, 2), NO_TIMING)
    assert roundtrip(lambda wr, v: w.put_fence_state(wr, 7, w.FENCE_SIGNALED, v),
                     w.get_fence_state, info) == (7, w.FENCE_SIGNALED, info)


def test_cache_handles_cross_as_descriptors_or_invalid(tmp_path):
    with open(tmp_path / "f", "wb") as f:
        out = roundtrip(lambda wr, v: w.put_handles(wr, v, "h"),
                        lambda r: w.get_handles(r, "h"), [f, -1, [f.fileno()], "x"])
        assert out[1] == -1 and out[3] == -1 and out[0] >= 0 and out[2] >= 0
        for fd in (out[0], out[2]):
            assert os.fstat(fd).st_ino == os.fstat(f.fileno()).st_ino
        for fd in out:
            if fd >= 0:
                os.close(fd)


@pytest.mark.parametrize("value", [
    Operand(OperandType.TENSOR_FLOAT32, [-1]),          # negative dimension
    Operand(OperandType.TENSOR_FLOAT32, [1 << 32]),     # beyond uint32
    Operand(-3),                                        # negative type
    Operand(OperandType.FLOAT32, extra_params=3.5),     # not an extra-params kind
    "not an operand",
])
def test_unencodable_operand_is_wire_error(value):
    with pytest.raises(WireError):
        w.put_operand(Writer(), value)


def test_closed_memory_and_foreign_pool_are_wire_errors():
    mem = SharedMemory.ashmem(4)
    mem.close()
    with pytest.raises(WireError):
        w.put_request(Writer(), Request([], [], [mem]))
    with pytest.raises(WireError):
        w.put_request(Writer(), Request([], [], [object()]))


def encoded_request():
    mem = SharedMemory.ashmem(16)
    req = Request([RequestArgument(False, DataLocation(0, 0, 4), [1])], [], [mem])
    wr = Writer()
    w.put_request(wr, req)
    return wr, mem


def test_trailing_bytes_rejected_and_descriptors_closed():
    wr, mem = encoded_request()
    fds = [os.dup(fd) for fd in wr.fds]
    r = Reader(bytes(wr.buf) + b"\0", fds)
    w.get_request(r)
    with pytest.raises(WireError, match="trailing"):
        r.commit()
    r.discard()
    with pytest.raises(OSError):
        os.fstat(fds[0])
    mem.close()


def test_unnamed_descriptor_rejected():
    wr = Writer()
    w.put_request(wr, Request([], [], []))
    extra = os.dup(0)
    r = Reader(wr.buf, [extra])
    w.get_request(r)
    with pytest.raises(WireError, match="descriptors"):
        r.finish()
    r.discard()
    with pytest.raises(OSError):
        os.fstat(extra)


def test_every_truncation_and_bad_count_is_wire_error():
    wr, mem = encoded_request()
    body = bytes(wr.buf)
    for cut in range(len(body)):
        r = Reader(body[:cut], [os.dup(mem.fd)])
        with pytest.raises(WireError):
            w.get_request(r)
            r.finish()
        r.discard()
    huge = struct.pack("<I", 0xFFFF_FFFF) + body[4:]
    with pytest.raises(WireError, match="count"):
        w.get_request(Reader(huge, []))
    mem.close()


def test_unknown_tags_and_ids_rejected():
    with pytest.raises(WireError, match="tag"):
        w.get_request(Reader(struct.pack("<IIIB", 0, 0, 1, 9)))
    with pytest.raises(WireError, match="unknown memory"):
        w.get_request(Reader(struct.pack("<IIIBBQ", 0, 0, 1, 0, w.MEM_KNOWN, 5)))
    with pytest.raises(WireError, match="ErrorStatus"):
        w.get_status(Reader(struct.pack("<I", 99)))
    with pytest.raises(WireError, match="boolean"):
        Reader(b"\2").bool()


def test_header_checks():
    good = w.pack_header(w.Kind.GET_TYPE, 5, 0, 0)
    assert w.unpack_header(good)[:2] == (w.Kind.GET_TYPE, 5)
    with pytest.raises(WireError, match="magic"):
        w.unpack_header(b"X" + good[1:])
    for version in (1, w.VERSION + 1):  # an older peer (1: before AIDL v4) or a newer one
        with pytest.raises(WireError, match="version"):
            w.unpack_header(w.HEADER.pack(w.MAGIC, version, 16, 0, 0, 0, 0))
    with pytest.raises(WireError, match="kind"):
        w.unpack_header(w.HEADER.pack(w.MAGIC, w.VERSION, 999, 0, 0, 0, 0))
    with pytest.raises(WireError, match="descriptors"):
        w.unpack_header(w.HEADER.pack(w.MAGIC, w.VERSION, 16, 0, 0, 300, 0))
    with pytest.raises(WireError, match="flags"):
        w.unpack_header(w.HEADER.pack(w.MAGIC, w.VERSION, 16, 0, 0, 0, 1))


def test_transport_carries_descriptors_and_checks_the_count():
    a, b = socket.socketpair()
    mem = SharedMemory.from_bytes(b"xy")
    send_message(a, w.Kind.GET_TYPE, 9, b"body", [mem.fd])
    kind, cid, body, fds = recv_message(b)
    assert (kind, cid, bytes(body)) == (w.Kind.GET_TYPE, 9, b"body") and len(fds) == 1
    assert os.pread(fds[0], 2, 0) == b"xy"
    os.close(fds[0])
    # A header that announces no descriptor but carries one: rejected, descriptor closed.
    import array
    hdr = w.pack_header(w.Kind.GET_TYPE, 1, 0, 0)
    a.sendmsg([hdr], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [mem.fd]))])
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(WireError, match="descriptors"):
        recv_message(b)
    assert len(os.listdir("/proc/self/fd")) == before  # received, then closed
    # A body past the bound is drained: the connection goes on.
    send_message(a, w.Kind.GET_TYPE, 3, b"z" * 100)
    send_message(a, w.Kind.GET_TYPE, 4, b"")
    with pytest.raises(TooLarge) as e:
        recv_message(b, max_body=10)
    assert e.value.call_id == 3
    assert recv_message(b)[1] == 4
    a.close()
    with pytest.raises(Closed):
        recv_message(b)
    b.close()
    mem.close()


# ---- the execution result's fast path ---------------------------------------------------------

_dims = st.lists(st.integers(0, 2**32 - 1), max_size=5)
_shapes = st.lists(st.builds(OutputShape, _dims, st.booleans()), max_size=4)
_timings = st.builds(Timing, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))


def _checked_bytes(status, shapes, timing) -> bytes:
    wr = w.Writer()
    w.put_status(wr, status)
    w.put_shapes(wr, shapes)
    w.put_timing(wr, timing)
    return bytes(wr.buf)


def _decode(decode, data: bytes):
    r = w.Reader(memoryview(data), [])
    try:
        out = decode(r)
        r.finish()
        return "ok", out
    except w.WireError:
        return ("error",)


def _checked_decode(r):
    return w.get_status(r), w.get_shapes(r), w.get_timing(r)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(ErrorStatus)), _shapes, _timings)
def test_fast_result_encoding_is_the_checked_one(status, shapes, timing):
    data = w.pack_shapes_result(status, shapes, timing)
    assert data == _checked_bytes(status, shapes, timing)
    assert _decode(w.get_shapes_result, data) == ("ok", (status, shapes, timing))


def _mutated(data_bytes: bytes, data) -> bytes:
    """``data_bytes`` truncated, extended, or with a few bytes changed (hypothesis draws)."""
    good = bytearray(data_bytes)
    kind = data.draw(st.sampled_from(["truncate", "extend", "flip"]))
    if kind == "truncate":
        bad = bytes(good[:data.draw(st.integers(0, len(good) - 1))])
    elif kind == "extend":
        bad = bytes(good) + data.draw(st.binary(min_size=1, max_size=8))
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            good[data.draw(st.integers(0, len(good) - 1))] = data.draw(st.integers(0, 255))
        bad = bytes(good)
    return bad


@settings(max_examples=300, deadline=None)
@given(_shapes, _timings, st.data())
def test_fast_result_decoding_of_mutations_is_the_checked_one(shapes, timing, data):
    bad = _mutated(w.pack_shapes_result(ErrorStatus.NONE, shapes, timing), data)
    assert _decode(w.get_shapes_result, bad) == _decode(_checked_decode, bad)


def test_fast_result_encoding_refuses_what_the_checked_one_refuses():
    for shapes in ([OutputShape([-1], True)], [OutputShape([2**32], True)], [object()]):
        with pytest.raises(w.WireError):
            w.pack_shapes_result(ErrorStatus.NONE, shapes, NO_TIMING)
    with pytest.raises(w.WireError):
        w.pack_shapes_result(ErrorStatus.NONE, [], Timing(-1, 0))


# ---- the one-struct operand paths give what the field-by-field ones give ----------------------

class _FieldByField(Operand):
    """An Operand subclass: put_operand takes the field-by-field path for it."""


def _slow_operand_bytes(o):
    wr = Writer()
    w.put_operand(wr, _FieldByField(o.type, o.dimensions, o.number_of_consumers, o.scale,
                                    o.zero_point, o.lifetime, o.location, o.extra_params))
    return bytes(wr.buf)


def _decode_operand(data, fast):
    saved = w._get_operand_fast
    if not fast:
        w._get_operand_fast = lambda r: None
    try:
        r = Reader(data)
        out = w.get_operand(r)
        return "ok", out, r.pos
    except WireError:
        return ("error",)
    finally:
        w._get_operand_fast = saved


@settings(max_examples=300, deadline=None)
@given(operands | st.builds(Operand, type=u32, dimensions=dims, scale=st.integers(0, 9),
                            zero_point=st.integers(-5, 5)))
def test_fast_operand_encoding_is_the_field_by_field_one(o):
    wr = Writer()
    w.put_operand(wr, o)
    assert bytes(wr.buf) == _slow_operand_bytes(o)
    assert _decode_operand(bytes(wr.buf), True) == _decode_operand(bytes(wr.buf), False)
    assert _decode_operand(bytes(wr.buf), True)[1] == Operand(
        o.type, o.dimensions, o.number_of_consumers, float(o.scale), o.zero_point, o.lifetime,
        o.location, o.extra_params)


@settings(max_examples=300, deadline=None)
@given(operands, st.data())
def test_fast_operand_decoding_of_mutations_is_the_field_by_field_one(o, data):
    bad = _mutated(_slow_operand_bytes(o), data)
    # by repr: a mutated float may decode to NaN on both paths, and NaN != NaN
    assert repr(_decode_operand(bad, True)) == repr(_decode_operand(bad, False))


@pytest.mark.parametrize("o", [
    Operand(OperandType.TENSOR_FLOAT32, [-1]), Operand(OperandType.TENSOR_FLOAT32, [1 << 32]),
    Operand(-3), Operand(OperandType.FLOAT32, scale=True), Operand(OperandType.FLOAT32,
                                                                   zero_point=1 << 31),
    Operand(OperandType.FLOAT32, dimensions=[1.5]), Operand(OperandType.FLOAT32, location=None),
])
def test_fast_operand_encoding_refuses_what_the_field_by_field_one_refuses(o):
    with pytest.raises(WireError):
        w.put_operand(Writer(), o)
    with pytest.raises(WireError):
        w.put_operand(Writer(), _FieldByField(o.type, o.dimensions, o.number_of_consumers,
                                              o.scale, o.zero_point, o.lifetime, o.location))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-2, 0x1_0000_0001) | st.booleans(), max_size=6))
def test_u32_list_encoding_is_the_per_item_one(items):
    def encode(value):
        wr = Writer()
        try:
            wr.u32s(value, "list")
        except WireError:
            return None
        return bytes(wr.buf)
    assert encode(items) == encode(tuple(items))  # a tuple takes the per-item path
