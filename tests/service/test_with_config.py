"""AIDL v4 across the service: the calls with a config carry vendor hints and the extension
table to the served driver's own ``*_with_config`` methods, unchanged; the hint bounds hold on
both sides; the served driver's feature level crosses; a served driver answers the AIDL face
too (``nnhal.aidl.through_aidl``)."""

from __future__ import annotations

import itertools
import socket
import threading
import time

import numpy as np
import pytest
from helpers import add_model, float_inputs

from nnhal.core.version import FeatureLevel
from nnhal.drivers.common.burst import DriverBurst
from nnhal.drivers.reference import ReferenceDevice
from nnhal.drivers.reference.prepared_model import ReferencePreparedModel
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionConfig,
    ExecutionPreference,
    ExtensionNameAndPrefix,
    MeasureTiming,
    PrepareModelConfig,
    Priority,
    TokenValuePair,
)
from nnhal.runtime import ndk
from nnhal.runtime.devices import Device
from nnhal.service import wire as w
from nnhal.service.client import RemoteDevice
from nnhal.service.server import Service
from nnhal.service.transport import recv_message, send_message

E = ErrorStatus
DIMS = (4, 4)
HINTS = (TokenValuePair(0x7AAA000B, b"\x01\x02"), TokenValuePair(0x7AAA0001, b""),
         TokenValuePair(-5, bytes(range(256))))  # a bad token too: the driver judges it
TABLE = (ExtensionNameAndPrefix("vendor.test.ext", 0x7AAA),)


class RecordingBurst(DriverBurst):
    def execute_with_config(self, request, config, deadline=None):
        self._pm.device.seen.append(("burst", config))
        return super().execute_with_config(request, config, deadline)


class RecordingPrepared(ReferencePreparedModel):
    def execute_synchronously_with_config(self, request, config, deadline=None):
        self.device.seen.append(("sync", config))
        return super().execute_synchronously_with_config(request, config, deadline)

    def execute_fenced_with_config(self, request, wait_for, config, deadline=None,
                                   duration=None):
        self.device.seen.append(("fenced", config))
        return super().execute_fenced_with_config(request, wait_for, config, deadline,
                                                  duration)

    def create_reusable_execution_with_config(self, request, config):
        self.device.seen.append(("reusable", config))
        return super().create_reusable_execution_with_config(request, config)

    def configure_execution_burst(self):
        return E.NONE, RecordingBurst(self)


class RecordingDevice(ReferenceDevice):
    """The reference driver, recording every config its with_config methods receive."""

    def __init__(self, level: FeatureLevel = FeatureLevel.AIDL_V4):
        super().__init__()
        self.feature_level = level
        self.seen: list[tuple[str, object]] = []

    def prepare_model_with_config(self, model, config, callback):
        self.seen.append(("prepare", config))
        return super().prepare_model_with_config(model, config, callback)

    def build(self, graph, compiled, priority, deadline):
        status, pm = super().build(graph, compiled, priority, deadline)
        return status, (RecordingPrepared(self, pm.plan, priority) if pm is not None else None)


@pytest.fixture
def recording(tmp_path):
    device = RecordingDevice()
    svc = Service(device, tmp_path / "r.sock")
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    remote = RemoteDevice(svc.path)
    yield device, svc, remote
    remote.close()
    svc.stop()
    t.join(5)
    device.close()


def request():
    a, b = float_inputs(3, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes])
    rb.expected = a + b
    return rb


def check(rb):
    np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), rb.expected)
    rb.output_memory.write(0, bytes(rb.output_memory.size))


def prepare(remote, config):
    cb = PreparedModelCallback()
    assert remote.prepare_model_with_config(add_model(DIMS), config, cb) == E.NONE
    status, pm = cb.wait(10)
    assert status == E.NONE and cb.calls == 1
    return pm


def test_hints_reach_the_served_drivers_with_config_methods(recording):
    device, _, remote = recording
    pconfig = PrepareModelConfig(ExecutionPreference.SUSTAINED_SPEED, Priority.HIGH,
                                 compilation_hints=HINTS, extension_name_to_prefix=TABLE)
    pm = prepare(remote, pconfig)
    what, got = device.seen[-1]
    assert what == "prepare" and tuple(got.compilation_hints) == HINTS
    assert tuple(got.extension_name_to_prefix) == TABLE
    assert (got.preference, got.priority) == (ExecutionPreference.SUSTAINED_SPEED,
                                              Priority.HIGH)
    config = ExecutionConfig(MeasureTiming.YES, 10**9, HINTS, TABLE)
    rb = request()
    status, shapes, timing = pm.execute_synchronously_with_config(rb.request, config)
    assert status == E.NONE and shapes[0].dimensions == list(DIMS)
    check(rb)
    gate = SyncFence()
    status, fence, fcb = pm.execute_fenced_with_config(rb.request, [gate], config)
    assert status == E.NONE
    gate.signal()  # the service waited for the client's fence
    assert fence.wait(10) == FenceState.SIGNALED
    assert fcb.get_execution_info(10)[0] == E.NONE
    check(rb)
    status, ex = pm.create_reusable_execution_with_config(rb.request, config)
    assert status == E.NONE and ex.compute()[0] == E.NONE
    check(rb)
    status, burst = pm.configure_execution_burst()
    assert status == E.NONE and burst.rings is not None
    assert burst.execute_with_config(rb.request, config)[0] == E.NONE
    check(rb)
    kinds = [k for k, _ in device.seen]
    assert kinds == ["prepare", "sync", "fenced", "reusable", "burst"]
    for _, got in device.seen[1:]:
        assert got == config  # every field, the hints' bytes and the table unchanged
    rb.close()


def test_a_config_without_hints_is_the_plain_call(recording):
    device, svc, remote = recording
    pm = prepare(remote, PrepareModelConfig())
    assert device.seen == []  # prepared with PREPARE_MODEL
    rb = request()
    status, burst = pm.configure_execution_burst()
    assert burst.execute_with_config(rb.request, ExecutionConfig())[0] == E.NONE
    check(rb)  # the first one caches the memories in the burst (BURST_CACHE)
    before = svc.messages
    for _ in range(3):  # then on the rings: no socket message
        assert burst.execute_with_config(rb.request, ExecutionConfig())[0] == E.NONE
        check(rb)
    assert svc.messages == before
    assert pm.execute_synchronously_with_config(rb.request, ExecutionConfig())[0] == E.NONE
    check(rb)
    assert device.seen == []
    rb.close()


def test_the_served_feature_level_crosses(tmp_path):
    for level in (FeatureLevel.V1_3, FeatureLevel.AIDL_V2, FeatureLevel.AIDL_V4):
        device = RecordingDevice(level)
        svc = Service(device, tmp_path / f"{level.name}.sock")
        t = threading.Thread(target=svc.serve_forever, daemon=True)
        t.start()
        remote = RemoteDevice(svc.path)
        try:
            assert remote.feature_level is level
            before = svc.messages
            assert remote.feature_level is level  # asked once
            assert svc.messages == before
            # the runtime's device over it answers getFeatureLevel with the served level
            assert ndk.ANeuralNetworksDevice_getFeatureLevel(Device.of(remote)) == \
                (0, level.ndk)
        finally:
            remote.close()
            svc.stop()
            t.join(5)
            device.close()
    # the reference driver, served, reports its own level
    device = ReferenceDevice()
    svc = Service(device, tmp_path / "ref.sock")
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    remote = RemoteDevice(svc.path)
    unasked = RemoteDevice(svc.path)
    try:
        assert remote.feature_level is device.feature_level
    finally:
        svc.stop()
        t.join(5)
        device.close()
    # once known, the level stays the device's; a service that died before it was asked: V1_3,
    # never an exception
    assert remote.feature_level is device.feature_level
    assert unasked.feature_level is FeatureLevel.V1_3
    remote.close()
    unasked.close()


def test_hint_bounds_are_refused_by_the_client(recording):
    device, svc, remote = recording
    pm = prepare(remote, PrepareModelConfig(compilation_hints=HINTS[:1]))
    rb = request()
    many = tuple(TokenValuePair(i, b"") for i in range(w.MAX_HINTS + 1))
    big = (TokenValuePair(1, bytes(w.MAX_HINT_VALUE + 1)),)
    table = tuple(ExtensionNameAndPrefix(f"e{i}", i) for i in range(w.MAX_CONFIG_EXTENSIONS + 1))
    before = svc.messages
    for config in (ExecutionConfig(execution_hints=many), ExecutionConfig(execution_hints=big),
                   ExecutionConfig(extension_name_to_prefix=table),
                   ExecutionConfig(execution_hints=(TokenValuePair(1 << 31, b""),)),
                   ExecutionConfig(execution_hints=("not a pair",))):
        assert pm.execute_synchronously_with_config(rb.request, config)[0] == \
            E.INVALID_ARGUMENT
        assert pm.create_reusable_execution_with_config(rb.request, config) == \
            (E.INVALID_ARGUMENT, None)
    cb = PreparedModelCallback()
    assert remote.prepare_model_with_config(
        add_model(DIMS), PrepareModelConfig(compilation_hints=many), cb) == E.INVALID_ARGUMENT
    assert cb.wait(1) == (E.INVALID_ARGUMENT, None) and cb.calls == 1
    assert pm.execute_synchronously_with_config(rb.request, "not a config")[0] == \
        E.INVALID_ARGUMENT
    assert svc.messages == before  # nothing was sent
    # the limits themselves pass
    ok = ExecutionConfig(execution_hints=tuple(TokenValuePair(i, bytes(w.MAX_HINT_VALUE))
                                               for i in range(4)))
    assert pm.execute_synchronously_with_config(rb.request, ok)[0] == E.NONE
    rb.close()


def _raw_call(path, kind, body):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.settimeout(10)
        send_message(s, kind, 7, body)
        return recv_message(s)


def test_hint_bounds_are_refused_by_the_service(recording):
    device, svc, _ = recording

    def body(count, size, entries=0):
        wr = w.Writer()
        w.put_model(wr, add_model(DIMS))
        for x in (1, 1):
            wr.i32(x)
        wr.opt_i64(None, "deadline")
        wr.u32(0)
        wr.u32(0)
        w.put_token(wr, b"")
        wr.u32(count)
        for i in range(count):
            wr.i32(i)
            wr.bytes(bytes(size))
        wr.u32(entries)
        for i in range(entries):
            wr.str(f"e{i}")
            wr.u16(i)
        return bytes(wr.buf)

    for args in ((w.MAX_HINTS + 1, 0), (1, w.MAX_HINT_VALUE + 1),
                 (0, 0, w.MAX_CONFIG_EXTENSIONS + 1)):
        kind, call_id, reply, fds = _raw_call(svc.path, w.Kind.PREPARE_MODEL_WITH_CONFIG,
                                              body(*args))
        assert (kind, call_id) == (w.Kind.ERROR, 7)
        assert w.get_status(w.Reader(reply)) == E.INVALID_ARGUMENT
    assert device.seen == []
    kind, _, reply, _ = _raw_call(svc.path, w.Kind.PREPARE_MODEL_WITH_CONFIG, body(2, 10, 1))
    assert kind == w.Kind.REPLY and w.get_status(w.Reader(reply)) == E.NONE
    assert [k for k, _ in device.seen] == ["prepare"]


def test_configs_round_trip_the_wire():
    pc = PrepareModelConfig(ExecutionPreference.LOW_POWER, Priority.LOW, 123, [], [],
                            bytes(range(32)), HINTS, TABLE)
    wr = w.Writer()
    w.put_prepare_config(wr, pc)
    r = w.Reader(bytes(wr.buf))
    got = w.get_prepare_config(r)
    r.finish()
    assert (got.preference, got.priority, got.deadline, got.cache_token) == \
        (pc.preference, pc.priority, 123, pc.cache_token)
    assert got.compilation_hints == HINTS and tuple(got.extension_name_to_prefix) == TABLE
    ec = ExecutionConfig(MeasureTiming.YES, None, HINTS, TABLE)
    wr = w.Writer()
    w.put_execution_config(wr, ec)
    r = w.Reader(bytes(wr.buf))
    assert w.get_execution_config(r) == ec
    r.finish()
    with pytest.raises(w.WireError, match="at most"):
        w.get_execution_config(w.Reader(bytes(wr.buf[:5]) + (w.MAX_HINTS + 1).to_bytes(4,
                                                                                    "little")))


def test_a_served_driver_answers_the_aidl_face(tmp_path):
    """Every call of the conformance runner crosses the AIDL face, then the socket."""
    aidl = pytest.importorskip("nnhal.aidl")
    from nnhal.conformance import default_specs_dir, iter_cases
    from nnhal.conformance.runner import PASSED, Options, run_case

    specs = default_specs_dir()
    if not specs.exists():
        pytest.skip(f"conformance data not found at {specs}")
    device = RecordingDevice()
    svc = Service(device, tmp_path / "a.sock")
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    remote = RemoteDevice(svc.path)
    try:
        face = aidl.through_aidl(remote)
        cases = [c for p in ("add_v1_2*", "conv2d_v1_2*", "if_simple*", "while_sum*")
                 for c in itertools.islice(iter_cases(specs, p), 3)]
        assert len(cases) >= 8
        before = svc.messages
        t0 = time.monotonic()
        results = [(c.name, mode, *run_case(face, c, mode, Options()))
                   for c in cases for mode in ("general", "fenced", "memory_domain")]
        assert [r for r in results if r[2] != PASSED] == []
        assert svc.messages > before + len(cases)  # the served driver ran them
        assert time.monotonic() - t0 < 60
    finally:
        remote.close()
        svc.stop()
        t.join(5)
        device.close()
