"""A served reference driver reached through RemoteDevice: every interface, the objects a
client holds released when it leaves, bounds, hostile input, permissions and registration."""

from __future__ import annotations

import gc
import itertools
import os
import socket
import stat
import threading
import time

import numpy as np
import pytest
from helpers import add_model, float_inputs, served, wait_for

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    NO_TIME,
    BufferDesc,
    BufferRole,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    MemoryPool,
    Priority,
    Request,
    RequestArgument,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.memory import SharedMemory
from nnhal.service import registration, server
from nnhal.service import wire as w
from nnhal.service.client import RemoteDevice
from nnhal.service.server import SEND_TIMEOUT_S, Limits, Service
from nnhal.service.transport import recv_message, send_message

E = ErrorStatus
DIMS = (4, 4)


@pytest.fixture
def service(tmp_path):
    with served(tmp_path / "s.sock", limits=Limits(max_prepared=3, max_mapped=1 << 20)) as svc:
        yield svc


def prepare(dev, model=None):
    cb = PreparedModelCallback()
    launch = dev.prepare_model(model or add_model(DIMS), ExecutionPreference.FAST_SINGLE_ANSWER,
                               Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(10)
    assert cb.calls == 1
    return launch, status, pm


def request():
    a, b = float_inputs(1, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes])
    rb.expected = a + b
    return rb


def check(rb):
    np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), rb.expected)


def test_device_queries_cross(remote):
    local = ReferenceDevice()
    try:
        assert remote.get_capabilities() == local.get_capabilities()
        assert remote.get_type() == local.get_type()
        assert remote.get_version_string() == local.get_version_string()
        assert remote.get_number_of_cache_files_needed() == \
            local.get_number_of_cache_files_needed()
        assert remote.get_supported_extensions() == local.get_supported_extensions()
        assert [e.name for e in remote.get_supported_extensions()[1]] == \
            list(ReferenceDevice.extensions)
        assert remote.get_supported_operations(add_model(DIMS)) == (E.NONE, [True])
    finally:
        local.close()


def test_every_execution_path(remote):
    launch, status, pm = prepare(remote)
    assert (launch, status) == (E.NONE, E.NONE)
    rb = request()
    status, shapes, timing = pm.execute_synchronously(rb.request, MeasureTiming.YES)
    assert status == E.NONE and shapes[0].dimensions == list(DIMS)
    assert timing.time_in_driver != NO_TIME
    check(rb)
    rb.output_memory.write(0, bytes(rb.output_memory.size))
    cb = ExecutionCallback()
    assert execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, cb) == E.NONE
    assert cb.wait(10)[0] == E.NONE and cb.calls == 1
    check(rb)
    status, burst = pm.configure_execution_burst()
    assert status == E.NONE
    holds = [burst.cache_memory(p) for p in rb.request.pools]
    assert burst.cache_memory(rb.request.pools[0]) is holds[0]
    for _ in range(3):
        rb.output_memory.write(0, bytes(rb.output_memory.size))
        assert burst.execute(rb.request)[0] == E.NONE
        check(rb)
    status, ex = pm.create_reusable_execution(rb.request)
    assert status == E.NONE
    for _ in range(2):
        rb.output_memory.write(0, bytes(rb.output_memory.size))
        assert ex.compute()[0] == E.NONE
        check(rb)
    rb.close()


def test_fenced_execution_waits_for_the_clients_fence(remote):
    _, _, pm = prepare(remote)
    rb = request()
    gate = SyncFence()
    status, fence, cb = pm.execute_fenced(rb.request, [gate], MeasureTiming.YES)
    assert status == E.NONE
    time.sleep(0.05)
    assert fence.state == FenceState.ACTIVE  # the service waits for our fence
    gate.signal()
    assert fence.wait(10) == FenceState.SIGNALED
    status, launched, fenced = cb.get_execution_info()
    assert status == E.NONE and launched.time_in_driver != NO_TIME
    check(rb)
    bad = SyncFence()
    status, fence2, cb2 = pm.execute_fenced(rb.request, [bad])
    bad.set_error()
    assert fence2.wait(10) == FenceState.ERROR
    assert cb2.get_execution_info()[0] != E.NONE
    rb.close()


@pytest.mark.parametrize("reusable", [False, True])
def test_a_fence_state_right_behind_its_fenced_call(remote, monkeypatch, reusable):
    """The client's FENCE_STATE for a waitFor fence may be read before the fenced call
    itself has started on its own thread (the reading is passed on first): the service
    knows the fence from the call's decoding, so its state is not lost. (It was, on a loaded
    machine: the call's thread came later than the next reader, and the execution waited
    for a state already dropped, until the client's 300 s bound closed the connection.)"""
    _, _, pm = prepare(remote)
    rb = request()
    kind = w.Kind.COMPUTE_FENCED if reusable else w.Kind.EXECUTE_FENCED
    real, started = server._HANDLERS[kind], threading.Event()

    def late(*args):  # the call's thread comes late, as on a loaded machine
        started.set()
        time.sleep(0.3)
        return real(*args)

    monkeypatch.setitem(server._HANDLERS, kind, late)
    gate = SyncFence()
    signal = threading.Thread(target=lambda: started.wait(10) and gate.signal())
    signal.start()
    if reusable:
        status, ex = pm.create_reusable_execution(rb.request)
        assert status == E.NONE
        status, fence, cb = ex.compute_fenced([gate])
    else:
        status, fence, cb = pm.execute_fenced(rb.request, [gate])
    signal.join(10)
    assert status == E.NONE and gate.state == FenceState.SIGNALED
    assert fence.wait(10) == FenceState.SIGNALED and cb.get_execution_info()[0] == E.NONE
    check(rb)
    rb.close()


def test_a_fence_id_given_twice_or_still_waiting_is_refused(service, remote, monkeypatch):
    """A waitFor fence id the service still waits on, or one given twice in a call, is
    INVALID_ARGUMENT, with nothing kept of that call: the fence registered before it still
    completes its execution, and the connection goes on."""
    _, _, pm = prepare(remote)
    rb = request()
    monkeypatch.setattr(remote.conn, "fence_ids", itertools.repeat(5))  # every fence: id 5
    assert pm.execute_fenced(rb.request, [SyncFence(), SyncFence()])[0] == E.INVALID_ARGUMENT
    gate = SyncFence()
    status, fence, _ = pm.execute_fenced(rb.request, [gate])
    assert status == E.NONE
    assert pm.execute_fenced(rb.request, [SyncFence()])[0] == E.INVALID_ARGUMENT
    (session,) = service.sessions
    assert list(session.fences) == [5] and session.outstanding == 0
    gate.signal()
    assert fence.wait(10) == FenceState.SIGNALED
    check(rb)
    assert remote.get_type()[0] == E.NONE
    rb.close()


def test_memory_domain_buffer(remote):
    _, _, pm = prepare(remote)
    status, buf, token = remote.allocate(BufferDesc([]), [pm], [], [BufferRole(0, 0)])
    assert status == E.NONE and token > 0
    rb = request()
    req = Request(rb.request.inputs, [RequestArgument(False, DataLocation(0, 0, 0), [])],
                  [*rb.request.pools[:1], MemoryPool.of_token(token)])
    req.pools[0:1] = [rb.request.pools[0]]
    req = Request(rb.request.inputs, [RequestArgument(False, DataLocation(1, 0, 0), [])],
                  [rb.request.pools[0], MemoryPool.of_token(token)])
    assert pm.execute_synchronously(req)[0] == E.NONE
    out = SharedMemory.ashmem(rb.output_memory.size)
    assert buf.copy_to(out) == E.NONE
    np.testing.assert_array_equal(np.frombuffer(out.read(0, out.size), np.float32)
                                  .reshape(DIMS), rb.expected)
    # Another client cannot name this client's buffer.
    other = RemoteDevice(remote.path)
    try:
        _, _, pm2 = prepare(other)
        assert pm2.execute_synchronously(req)[0] == E.INVALID_ARGUMENT
    finally:
        other.close()
    rb.close()
    out.close()


def test_everything_released_when_the_client_leaves(service):
    dev = RemoteDevice(service.path)
    _, _, pm = prepare(dev)
    rb = request()
    burst = pm.configure_execution_burst()[1]
    hold = burst.cache_memory(rb.request.pools[0])  # noqa: F841 - kept while counting
    ex = pm.create_reusable_execution(rb.request)[1]
    assert ex.compute()[0] == E.NONE
    remote_buf = dev.allocate(BufferDesc([]), [pm], [], [BufferRole(0, 0)])[1]
    assert remote_buf is not None
    gate = SyncFence()
    status, fence, _ = pm.execute_fenced(rb.request, [gate])
    assert wait_for(lambda: service.objects() >= 7)
    dev.close()
    assert wait_for(lambda: service.objects() == 0)
    assert wait_for(lambda: service.sessions == set())
    assert fence.wait(5) == FenceState.ERROR  # the dead connection fails its fences
    rb.close()


def test_dropped_proxies_and_memories_are_released(service, remote):
    _, _, pm = prepare(remote)
    rb = request()
    assert pm.execute_synchronously(rb.request)[0] == E.NONE
    assert wait_for(lambda: service.objects() == 3)  # model, 2 memories
    rb.close()
    del rb, pm
    gc.collect()
    remote.get_type()  # releases travel with the next message
    assert wait_for(lambda: service.objects() == 0)


def test_bounds_give_clear_statuses(service, remote):
    pms = [prepare(remote)[2] for _ in range(3)]
    launch, status, pm = prepare(remote)
    assert status == E.RESOURCE_EXHAUSTED_PERSISTENT and pm is None
    del pms
    big = SharedMemory.ashmem(2 << 20)  # past the 1 MiB mapped bound
    rb = request()
    req = Request(rb.request.inputs, rb.request.outputs, [rb.request.pools[0], big])
    gc.collect()
    remote.get_type()
    launch, status, pm = prepare(remote)
    assert status == E.NONE
    assert pm.execute_synchronously(req)[0] == E.RESOURCE_EXHAUSTED_PERSISTENT
    assert pm.execute_synchronously(rb.request)[0] == E.NONE  # the client goes on
    rb.close()
    big.close()


def test_bad_arguments_are_statuses_not_crashes(remote):
    _, _, pm = prepare(remote)
    rb = request()
    bad = Request([RequestArgument(False, DataLocation(0, 0, 4), [-1])], [], rb.request.pools)
    assert pm.execute_synchronously(bad)[0] == E.INVALID_ARGUMENT
    cb = ExecutionCallback()
    assert execute_1_3(pm, bad, MeasureTiming.NO, None, None, cb) == E.INVALID_ARGUMENT
    assert cb.wait(5)[0] == E.INVALID_ARGUMENT and cb.calls == 1
    oob = Request(rb.request.inputs, [RequestArgument(False, DataLocation(1, 10**6, 64), [])],
                  rb.request.pools)
    assert pm.execute_synchronously(oob)[0] == E.INVALID_ARGUMENT
    launch, status, pm2 = prepare(remote, add_model(DIMS, out_dims=(3, 3)))
    assert status == E.INVALID_ARGUMENT and pm2 is None
    assert pm.execute_synchronously(rb.request)[0] == E.NONE
    rb.close()


def raw(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(5)
    return s


def test_hostile_messages_get_errors_or_drop_the_client(service, remote):
    s = raw(service.path)
    # A call whose body does not decode: INVALID_ARGUMENT, the connection goes on.
    send_message(s, w.Kind.EXECUTE_SYNCHRONOUSLY, 7, b"\xff" * 9)
    kind, cid, body, fds = recv_message(s)
    assert (kind, cid) == (w.Kind.ERROR, 7)
    assert w.get_status(w.Reader(body)) == E.INVALID_ARGUMENT
    # A handle that is not one: INVALID_ARGUMENT.
    send_message(s, w.Kind.CONFIGURE_BURST, 8, (12345).to_bytes(4, "little"))
    kind, cid, body, _ = recv_message(s)
    assert (kind, cid, w.get_status(w.Reader(body))) == (w.Kind.ERROR, 8, E.INVALID_ARGUMENT)
    # A message kind only a service sends: refused.
    send_message(s, w.Kind.NOTIFY_PREPARED, 9, b"")
    send_message(s, w.Kind.GET_TYPE, 10, b"")
    kind, cid, _, _ = recv_message(s)
    assert (kind, cid) == (w.Kind.REPLY, 10)
    # Garbage framing drops this client only.
    s.sendall(b"garbage!" * 8)
    try:
        assert s.recv(10) == b""
    except ConnectionResetError:
        pass  # dropped with unread bytes pending: a reset, also an end
    s.close()
    assert remote.get_type() == (E.NONE, remote.get_type()[1])
    assert wait_for(lambda: len(service.sessions) == 1)


def test_client_vanishing_mid_message_leaks_nothing(service):
    s = raw(service.path)
    mem = SharedMemory.ashmem(64)
    wr = w.Writer()
    w.put_request(wr, Request([], [], [mem]))
    import array
    hdr = w.pack_header(w.Kind.EXECUTE_SYNCHRONOUSLY, 1, 4 + len(wr.buf) + 100, 1)
    s.sendmsg([hdr + (1).to_bytes(4, "little")],
              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [mem.fd]))])
    s.close()
    assert wait_for(lambda: not service.sessions and service.objects() == 0)
    mem.close()


def test_socket_is_private_and_registration_round_trips(service, tmp_path):
    assert stat.S_IMODE(os.stat(service.path).st_mode) == 0o600
    entry = registration.register(tmp_path / "rt", "ref", service.path, "reference")
    assert [e.name for e in registration.services(tmp_path / "rt")] == ["ref"]
    assert registration.find("ref", tmp_path / "rt").alive()
    registration.unregister(entry)
    assert registration.services(tmp_path / "rt") == []


def test_calls_do_not_block_each_other(service, remote, monkeypatch):
    monkeypatch.setattr(service, "test_delay", 0.5)
    _, _, pm = prepare(remote)
    monkeypatch.setattr(service, "test_delay", 0.0)
    rb = request()
    slow_done = threading.Event()

    def slow():
        service.test_delay = 2.0
        pm.execute_synchronously(rb.request)
        slow_done.set()

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.1)
    service.test_delay = 0.0
    assert remote.get_type()[0] == E.NONE
    # Answered while the slow call still runs (a guard, not a timing goal: it runs 2 s).
    assert not slow_done.is_set()
    t.join()
    rb.close()


def test_registered_services_are_devices_of_the_registry_and_runtime(service, tmp_path,
                                                                     monkeypatch):
    from nnhal.drivers import registry

    rt = tmp_path / "rt"
    registration.register(rt, "svc", service.path, "reference")
    monkeypatch.setenv("NNHAL_RUNTIME_DIR", str(rt))
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    monkeypatch.setattr(registry, "_discovered", registry._discovered)
    registry.discover(force=True)
    assert "remote:svc" in registry.device_names()
    assert registry.available()["remote:svc"] is None
    assert registry.lookup(f"remote:{service.path}")
    assert registry.reason("remote:nothing") is not None
    assert "no service answers" in registry.reason(f"remote:{tmp_path}/none.sock")
    dev = registry.open_device("remote:svc")
    try:
        assert isinstance(dev, RemoteDevice) and dev.get_type()[0] == E.NONE
    finally:
        dev.close()


def test_outstanding_calls_and_message_size_are_bounded(tmp_path):
    svc = Service(ReferenceDevice(), tmp_path / "b.sock",
                  limits=Limits(max_outstanding=1, max_body=4096))
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    dev = RemoteDevice(svc.path)
    try:
        big = add_model(DIMS)
        big.operand_values = bytes(8192)  # past the 4 KiB message bound
        assert dev.get_supported_operations(big) == (E.RESOURCE_EXHAUSTED_PERSISTENT, [])
        # ... and the connection is closed: its body is never read, so nothing follows it
        assert wait_for(lambda: not dev.alive)
        assert dev.get_type()[0] == E.DEVICE_UNAVAILABLE
        dev.close()
        dev = RemoteDevice(svc.path)
        assert dev.get_supported_operations(add_model(DIMS)) == (E.NONE, [True])
        svc.test_delay = 0.5
        out = []
        busy = threading.Thread(target=lambda: out.append(dev.get_type()[0]))
        _, _, pm = prepare(dev)
        rb = request()
        sync = threading.Thread(target=lambda: out.append(
            pm.execute_synchronously(rb.request)[0]))
        sync.start()
        assert wait_for(lambda: any(s.outstanding == 1 for s in list(svc.sessions)))
        busy.start()
        busy.join()
        sync.join()
        assert sorted(out) == sorted([E.NONE, E.RESOURCE_EXHAUSTED_TRANSIENT])
        rb.close()
    finally:
        svc.test_delay = 0.0
        dev.close()
        svc.stop()
        t.join(5)
        svc.device.close()


def test_group_flag_makes_the_socket_0660_of_that_group(tmp_path):
    svc = Service(ReferenceDevice(), tmp_path / "g.sock", group=str(os.getgid()))
    try:
        st = os.stat(svc.path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
    finally:
        svc.sock.close()
        svc.device.close()


def test_a_client_that_stops_reading_is_dropped(service, remote):
    s = raw(service.path)
    # Accepted first: a connection still in the backlog is not a session yet.
    assert wait_for(lambda: len(service.sessions) == 2, timeout=30)
    s.setblocking(False)
    msg = w.pack_header(w.Kind.GET_VERSION_STRING, 1, 0, 0)
    pending = b""
    start = time.monotonic()
    while time.monotonic() < start + 20:  # whole messages only, until the service stops
        pending = pending or msg * 64
        try:
            pending = pending[s.send(pending):]
        except BlockingIOError:
            if wait_for(lambda: len(service.sessions) == 1, timeout=8):
                break
    # Dropped after the send timeout, not for bad framing: only the good client is left.
    assert len(service.sessions) == 1
    assert time.monotonic() - start >= SEND_TIMEOUT_S - 0.5
    assert remote.get_type()[0] == E.NONE
    s.close()


def test_reusable_execution_fenced_and_buffer_copy_from(remote):
    _, _, pm = prepare(remote)
    rb = request()
    status, ex = pm.create_reusable_execution(rb.request)
    assert status == E.NONE
    gate = SyncFence()
    status, fence, cb = ex.compute_fenced([gate, SyncFence.signaled()])
    assert status == E.NONE and fence.state == FenceState.ACTIVE
    gate.signal()
    assert fence.wait(10) == FenceState.SIGNALED and cb.get_execution_info()[0] == E.NONE
    check(rb)
    status, buf, token = remote.allocate(BufferDesc(list(DIMS)), [pm], [BufferRole(0, 0)], [])
    assert status == E.NONE
    src = SharedMemory.from_bytes(np.arange(16, dtype=np.float32).tobytes())
    assert buf.copy_from(src, [3, 3]) == E.INVALID_ARGUMENT
    assert buf.copy_to(SharedMemory.ashmem(64)) == E.GENERAL_FAILURE  # never initialized
    assert buf.copy_from(src, list(DIMS)) == E.NONE
    dst = SharedMemory.ashmem(64)
    assert buf.copy_to(dst) == E.NONE and dst.read(0, 64) == src.read(0, 64)
    rb.close()
    src.close()
    dst.close()
