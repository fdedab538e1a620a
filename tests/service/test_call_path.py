"""The served call path: calls run on the thread that read them, callers read their own
replies, and repeated requests are neither encoded nor decoded again. Each shortcut must give
the same answers as the long way, from many threads, and forget what it remembered when a
memory or a buffer goes."""

from __future__ import annotations

import dataclasses
import gc
import socket
import threading
import time

import numpy as np
import pytest
from helpers import add_model, float_inputs, served

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    MemoryPool,
    OutputShape,
    Priority,
    Request,
    RequestArgument,
    Timing,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.service import client, server, transport
from nnhal.service import wire as w
from nnhal.service.client import RemoteDevice
from nnhal.service.server import HANDOFF_S, Service
from nnhal.service.transport import recv_message

E = ErrorStatus
DIMS = (4, 4)


@pytest.fixture
def service(tmp_path):
    with served(tmp_path / "s.sock") as svc:
        yield svc


def prepare(dev):
    cb = PreparedModelCallback()
    dev.prepare_model(add_model(DIMS), ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                      None, [], [], b"", cb)
    status, pm = cb.wait(10)
    assert status == E.NONE
    return pm


def session_of(service):
    (s,) = list(service.sessions)
    return s


def test_many_threads_on_one_connection_each_get_their_own_answers(remote):
    pm = prepare(remote)
    errors: list[str] = []

    def worker(k: int) -> None:
        a, b = float_inputs(k + 1, DIMS)
        rb = RequestBuilder([a, b], [a.nbytes])
        try:
            for i in range(40):
                if i % 7 == 3:
                    if remote.get_type()[0] != E.NONE:
                        errors.append("get_type")
                    continue
                if i % 5 == 0:  # an asynchronous one: its callback needs a reader too
                    cb = ExecutionCallback()
                    assert execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, cb) == E.NONE
                    status = cb.wait(10)[0]
                else:
                    status = pm.execute_synchronously(rb.request)[0]
                if status != E.NONE:
                    errors.append(f"thread {k}: {status!r}")
                elif not np.array_equal(rb.output(0, np.float32, DIMS), a + b):
                    errors.append(f"thread {k}: wrong sum")
                rb.output_memory.write(0, bytes(rb.output_memory.size))
        finally:
            rb.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_repeated_executions_read_other_calls_replies_on_the_way(remote):
    # The short way of a repeated synchronous execution reads the socket itself: the
    # notifications of another thread's asynchronous executions pass through it.
    pm = prepare(remote)
    a, b = float_inputs(10, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes])
    c, d = float_inputs(11, DIMS)
    other = RequestBuilder([c, d], [c.nbytes])
    stop = threading.Event()
    notified: list[object] = []

    def asynchronous() -> None:
        try:
            while not stop.is_set():
                cb = ExecutionCallback()
                assert execute_1_3(pm, other.request, MeasureTiming.NO, None, None, cb) == E.NONE
                notified.append(cb.wait(3)[0])
        except BaseException as e:  # noqa: BLE001 - reported below
            notified.append(e)

    t = threading.Thread(target=asynchronous)
    t.start()
    try:
        for _ in range(300):
            assert pm.execute_synchronously(rb.request)[0] == E.NONE
            np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + b)
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()  # no notification lost
    assert remote.conn.sent_again > 0
    assert notified and all(s == E.NONE for s in notified)
    np.testing.assert_array_equal(other.output(0, np.float32, DIMS), c + d)
    rb.close()
    other.close()


def test_a_callback_arrives_while_no_caller_waits(remote):
    pm = prepare(remote)
    a, b = float_inputs(2, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes])
    cb = ExecutionCallback()
    assert execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, cb) == E.NONE
    # Nobody calls meanwhile: the background thread reads the notification.
    assert cb.wait(10)[0] == E.NONE and cb.calls == 1
    np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + b)
    rb.close()


def test_a_long_call_passes_the_reading_on(service, remote):
    pm = prepare(remote)
    rb = RequestBuilder(list(float_inputs(3, DIMS)), [64])
    service.test_delay = 20 * HANDOFF_S + 0.5
    done = threading.Event()

    def slow() -> None:
        pm.execute_synchronously(rb.request)
        done.set()

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.1)
    service.test_delay = 0.0
    assert remote.get_type()[0] == E.NONE
    assert not done.is_set()  # answered while the long call still ran
    t.join(10)
    assert done.is_set()
    rb.close()


def test_a_long_call_keeps_its_thread_while_the_client_sends_nothing_more(service, remote,
                                                                        monkeypatch):
    # A synchronous client waits for its reply: a second reader would only fight the call
    # for the GIL. The reply's next call must not look like a message waiting either. Nor
    # does the watcher wake meanwhile (it took the GIL from the call every HANDOFF_S).
    pm = prepare(remote)
    rb = RequestBuilder(list(float_inputs(7, DIMS)), [64])
    s = session_of(service)
    passed: list[int] = []
    pass_reading = s._pass_reading
    monkeypatch.setattr(s, "_pass_reading", lambda: passed.append(1) or pass_reading())
    assert pm.execute_synchronously(rb.request)[0] == E.NONE
    wakes = service.watcher.wakes
    service.test_delay = 10 * HANDOFF_S
    try:
        for _ in range(3):
            assert pm.execute_synchronously(rb.request)[0] == E.NONE
    finally:
        service.test_delay = 0.0
    assert passed == []
    assert service.watcher.wakes == wakes
    assert remote.get_type()[0] == E.NONE
    rb.close()


def test_the_reading_thread_looks_for_a_next_call_only_after_a_quick_one(service, remote,
                                                                         monkeypatch):
    pm = prepare(remote)
    rb = RequestBuilder(list(float_inputs(9, DIMS)), [64])
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_MAX_S", 0.005)
    # In one process the other side's turn with the GIL would read as a busy core; a busy
    # machine running the tests must not make the service skip its looks either.
    monkeypatch.setattr(transport, "YIELD_GAVE_S", 10.0)
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    for _ in range(2):  # two pauses end the looking (one does not)
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
        time.sleep(0.05)
    before = service.looks
    for _ in range(4):  # a client that calls every 50 ms: never looked for
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
        time.sleep(0.05)
    assert service.looks == before
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_MAX_S", 0.5)
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_S", 0.5)
    for _ in range(5):  # back to back: found awake
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
    assert 1 <= service.found <= service.looks
    time.sleep(0.6)  # one pause in a series of quick calls: still looked for after it
    looks = service.looks  # (the look after the last quick call has ended by now)
    assert pm.execute_synchronously(rb.request)[0] == E.NONE
    deadline = time.monotonic() + 5
    while service.looks == looks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.looks == looks + 1
    rb.close()


def test_the_reading_threads_look_follows_the_clients_return(service, remote, monkeypatch):
    # Twice the longer of the client's last two returns, within NEXT_CALL_LOOK_S and
    # NEXT_CALL_LOOK_MAX_S: a client that works a while between calls still finds the thread
    # awake, one calling back to back is not waited for longer than it needs.
    pm = prepare(remote)
    rb = RequestBuilder(list(float_inputs(10, DIMS)), [64])
    monkeypatch.setattr(transport, "YIELD_GAVE_S", 10.0)
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_S", 0.1)
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_MAX_S", 0.4)
    assert pm.execute_synchronously(rb.request)[0] == E.NONE
    s = session_of(service)
    windows: list[float] = []

    class Recorded(transport.Looker):
        def until(self, poll, end):
            windows.append(end - time.perf_counter())
            return super().until(poll, end)
    monkeypatch.setattr(s, "looker", Recorded())
    for _ in range(4):  # back to back: the shortest look
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
    time.sleep(0.2)  # (the last look ends)
    assert windows and all(w <= 0.1 for w in windows), windows
    windows.clear()
    for _ in range(4):  # 30 ms of work between calls: looks of 60 ms or more
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
        time.sleep(0.03)
    assert len(windows) >= 3 and all(0.05 <= w <= 0.4 for w in windows[1:]), windows
    assert service.found >= 3
    rb.close()


def test_repeated_executions_found_by_looking_all_answer_right(service, monkeypatch):
    # Both sides awake for each other (the service looking for the next call, the client for
    # its reply, after sleeping towards it): new input values in the same memories every
    # time, each answer the right one.
    monkeypatch.setattr(transport, "YIELD_GAVE_S", 10.0)
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    monkeypatch.setattr(client, "REPLY_LOOK_S", 0.002)
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_S", 0.01)
    dev = RemoteDevice(service.path)
    pm = prepare(dev)
    a, b = float_inputs(14, DIMS)
    rb = RequestBuilder([a, b], [64])
    rng = np.random.default_rng(14)
    for i in range(200):
        x = rng.standard_normal(DIMS).astype(np.float32)
        rb.input_view(0)[:] = x.reshape(-1).view(np.uint8)
        status, shapes, _ = pm.execute_synchronously(rb.request)
        assert status == E.NONE and list(shapes[0].dimensions) == list(DIMS)
        np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), x + b, err_msg=str(i))
    conn = dev.conn
    assert conn.sent_again >= 197 and conn.looked >= 150 and conn.found >= 100
    assert service.looks >= 150 and service.found >= 100
    dev.close()
    rb.close()


def test_a_client_gone_during_the_services_look_ends_its_session_at_once(service, monkeypatch):
    # The look polls the socket: the client's end is found there, not after the window.
    monkeypatch.setattr(transport, "YIELD_GAVE_S", 10.0)
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_S", 30.0)
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_MAX_S", 30.0)
    dev = RemoteDevice(service.path)
    pm = prepare(dev)
    rb = RequestBuilder(list(float_inputs(12, DIMS)), [64])
    for _ in range(3):  # quick calls: after each reply the service looks (up to 30 s)
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
    assert service.looks >= 1
    start = time.monotonic()
    dev.close()
    while service.sessions and time.monotonic() < start + 5:
        time.sleep(0.01)
    assert not service.sessions and time.monotonic() - start < 1.0
    assert service.objects() == 0
    rb.close()


def test_no_look_is_made_when_looking_is_turned_off(tmp_path, monkeypatch):
    # NNHAL_SERVICE_LOOK=0: neither side polls (every wait blocks at once), and the answers
    # are the same.
    monkeypatch.setenv(transport.LOOK_ENV, "0")
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_S", 0.5)
    monkeypatch.setattr(server, "NEXT_CALL_LOOK_MAX_S", 0.5)
    with served(tmp_path / "off.sock") as svc:
        dev = RemoteDevice(svc.path)
        pm = prepare(dev)
        a, b = float_inputs(13, DIMS)
        rb = RequestBuilder([a, b], [64])
        for _ in range(20):
            assert pm.execute_synchronously(rb.request)[0] == E.NONE
            np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + b)
        assert dev.conn.sent_again >= 17 and dev.conn.looked == 0
        assert svc.looks == 0
        dev.close()
        rb.close()


def test_a_repeated_execution_looks_for_its_reply_over_its_recent_round_trips(
        service, monkeypatch):
    monkeypatch.setattr(client, "REPLY_LOOK_S", 0.05)  # wide: the test's timing is loose
    monkeypatch.setattr(client, "REPLY_LOOK_MAX_S", 1.0)
    monkeypatch.setattr(client, "REPLY_TRIPS", 2)  # the window follows the last two
    monkeypatch.setattr(transport, "YIELD_GAVE_S", 10.0)  # a busy machine does not end it
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # nor skip it
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    remote = RemoteDevice(service.path)
    pm = prepare(remote)
    a, b = float_inputs(11, DIMS)
    rb = RequestBuilder([a, b], [64])
    conn = remote.conn
    for _ in range(4):  # quick calls look from the start (no sleep towards the reply)
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
    # The first two go the long way; the first repeated one has no round trip to go by.
    assert conn.sent_again == 2 and conn.looked == 1
    service.test_delay = 0.2
    try:
        for _ in range(4):  # after two long round trips, each sleeps, then looks from 50 ms
            status, shapes, _ = pm.execute_synchronously(rb.request)  # before the reply
            assert status == E.NONE and list(shapes[0].dimensions) == list(DIMS)
            np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + b)
    finally:
        service.test_delay = 0.0
    assert conn.looked == 5 and 1 <= conn.found <= 5
    # A reply that comes much earlier than the recent ones ends the sleep at once.
    start = time.monotonic()
    assert pm.execute_synchronously(rb.request)[0] == E.NONE
    assert time.monotonic() - start < 0.1 and conn.looked == 6
    # Another execution's message: the round trips of another message are not taken for its
    # own (its first repeat does not look).
    other = RequestBuilder([b, a], [64])
    for _ in range(3):
        assert pm.execute_synchronously(other.request)[0] == E.NONE
    assert conn.sent_again == 8 and conn.looked == 6
    assert pm.execute_synchronously(other.request)[0] == E.NONE  # now it has one
    assert conn.sent_again == 9 and conn.looked == 7
    other.close()
    rb.close()
    remote.close()


def test_a_message_that_comes_back_finds_its_round_trips_again(service, monkeypatch):
    # A client alternating between two requests (two models, say) looks for the reply of
    # the first again at its first repeat: its round trips were kept, by its bytes.
    monkeypatch.setattr(transport, "YIELD_GAVE_S", 10.0)
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    remote = RemoteDevice(service.path)
    pm = prepare(remote)
    a, b = float_inputs(16, DIMS)
    first, second = RequestBuilder([a, b], [64]), RequestBuilder([b, a], [64])
    conn = remote.conn
    for _ in range(4):
        assert pm.execute_synchronously(first.request)[0] == E.NONE
    assert conn.looked == 1
    for _ in range(2):  # another message: no round trip of its own yet, so no look
        assert pm.execute_synchronously(second.request)[0] == E.NONE
    assert conn.looked == 1
    for _ in range(2):  # the first again: encoded again, then its first repeat looks
        assert pm.execute_synchronously(first.request)[0] == E.NONE
        np.testing.assert_array_equal(first.output(0, np.float32, DIMS), a + b)
    assert conn.looked == 2
    # Only the last REPLY_MESSAGES messages are remembered.
    assert len(conn._trips) <= client.REPLY_MESSAGES
    first.close()
    second.close()
    remote.close()


def test_a_look_for_a_reply_is_bounded_however_wide_the_round_trips_spread(service,
                                                                          monkeypatch):
    monkeypatch.setattr(client, "REPLY_LOOK_S", 0.01)
    monkeypatch.setattr(client, "REPLY_SPREAD", 10.0)  # the window would span 0.09-0.3 s
    monkeypatch.setattr(client, "REPLY_LOOK_MAX_S", 0.02)
    monkeypatch.setattr(transport, "YIELD_GAVE_S", 10.0)
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    remote = RemoteDevice(service.path)
    pm = prepare(remote)
    rb = RequestBuilder(list(float_inputs(15, DIMS)), [64])
    windows: list[float] = []

    class Recorded(transport.Looker):
        def until(self, poll, end):
            windows.append(end - time.perf_counter())
            return super().until(poll, end)
    remote.conn.looker = Recorded()
    try:
        for delay in (0.0, 0.0, 0.1, 0.3, 0.3, 0.1, 0.3):  # (the third measures the first)
            service.test_delay = delay
            assert pm.execute_synchronously(rb.request)[0] == E.NONE
    finally:
        service.test_delay = 0.0
    assert len(windows) >= 3 and all(w <= 0.02 for w in windows), windows
    # Every look counted is one of these, or a sleep towards its reply that a late timer (a
    # loaded machine) ended only after the reply had come: that one looks no more.
    assert len(windows) <= remote.conn.looked <= len(windows) + 1
    rb.close()
    remote.close()


def test_a_message_read_ahead_with_a_long_call_is_answered_during_it(service, monkeypatch):
    # Both messages arrive in one read: no socket event will announce the second, so the
    # call's start must tell the watcher itself.
    get_type = server._HANDLERS[w.Kind.GET_TYPE]

    def slow_first(s, call_id):
        if call_id == 1:
            time.sleep(20 * HANDOFF_S + 0.5)
        return get_type(s, call_id)

    monkeypatch.setitem(server._HANDLERS, w.Kind.GET_TYPE, slow_first)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(service.path)
        s.settimeout(10)
        s.sendall(w.pack_header(w.Kind.GET_TYPE, 1, 0, 0) + w.pack_header(w.Kind.GET_TYPE, 2, 0, 0))
        assert [recv_message(s)[1] for _ in range(2)] == [2, 1]


def test_a_changed_request_is_encoded_again(remote):
    pm = prepare(remote)
    a, b = float_inputs(4, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes])
    req = rb.request
    assert pm.execute_synchronously(req)[0] == E.NONE
    np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + b)
    # The same object, changed in place: the second input now reads the first one's bytes.
    req.inputs[1] = RequestArgument(False, req.inputs[0].location, [])
    assert pm.execute_synchronously(req)[0] == E.NONE
    np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + a)
    req.inputs[1] = RequestArgument(False, DataLocation(0, a.nbytes, 4), [])  # too short
    assert pm.execute_synchronously(req)[0] == E.INVALID_ARGUMENT
    rb.close()


def test_forgotten_memories_clear_what_the_service_remembered(service, remote):
    pm = prepare(remote)
    rb = RequestBuilder(list(float_inputs(5, DIMS)), [64])
    for _ in range(2):
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
    s = session_of(service)
    assert len(s.decoded) == 1
    before = len(s.memories)
    rb.close()
    del rb
    gc.collect()
    remote.get_type()  # carries the FORGET
    assert len(s.memories) < before and s.decoded == {}


def test_a_released_buffer_s_token_is_not_remembered_as_valid(service, remote):
    pm = prepare(remote)
    status, buf, token = remote.allocate(BufferDesc([]), [pm], [], [BufferRole(0, 0)])
    assert status == E.NONE
    a, b = float_inputs(6, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes])
    req = Request(rb.request.inputs, [RequestArgument(False, DataLocation(1, 0, 0), [])],
                  [rb.request.pools[0], MemoryPool.of_token(token)])
    for _ in range(3):  # the third runs the short way: its bytes are compared as they come
        assert pm.execute_synchronously(req)[0] == E.NONE
    assert session_of(service)._again is not None
    buf.close()
    del buf
    gc.collect()
    remote.get_type()  # carries the RELEASE
    # The same bytes again: recognised as they come, but no longer known to decode alike.
    assert pm.execute_synchronously(req)[0] == E.INVALID_ARGUMENT
    assert remote.get_type()[0] == E.NONE
    rb.close()


def test_alive_notices_a_service_gone_while_idle(tmp_path):
    svc = Service(ReferenceDevice(), tmp_path / "s.sock")
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    dev = RemoteDevice(svc.path)
    try:
        assert dev.get_type()[0] == E.NONE and dev.alive
        svc.stop()  # closes every client's socket; nobody is reading on our side
        t.join(5)
        end = time.monotonic() + 10
        while dev.alive and time.monotonic() < end:
            time.sleep(0.01)
        assert not dev.alive
        assert dev.get_type()[0] == E.DEVICE_UNAVAILABLE
    finally:
        dev.close()
        svc.device.close()


def test_a_repeated_result_is_packed_once_and_its_timing_each_time(monkeypatch):
    # A measured execution's timing changes every time while its status and shapes repeat:
    # the service packs those once and the timing afresh.
    packs = []
    pack = w.pack_shapes_result
    monkeypatch.setattr(w, "pack_shapes_result", lambda *a: packs.append(a) or pack(*a))
    monkeypatch.setattr(server, "_last_reply", None)
    shapes = [OutputShape([4, 4], True)]
    for i in range(3):
        body = bytes(server._shapes_reply((E.NONE, shapes, Timing(i, 2 * i))).buf)
        assert w.get_shapes_result(w.Reader(body)) == (E.NONE, shapes, Timing(i, 2 * i))
    assert len(packs) == 1
    other = [OutputShape([2, 2], False)]
    body = bytes(server._shapes_reply((E.OUTPUT_INSUFFICIENT_SIZE, other, Timing(1, 1))).buf)
    assert w.get_shapes_result(w.Reader(body)) == (E.OUTPUT_INSUFFICIENT_SIZE, other,
                                                   Timing(1, 1))
    assert len(packs) == 2
    with pytest.raises(w.WireError):  # a timing past u64: refused as before, not sent
        server._shapes_reply((E.OUTPUT_INSUFFICIENT_SIZE, other, Timing(-1, 1)))


def test_a_repeated_execution_the_service_runs_the_short_way_keeps_its_checks(
        service, remote, monkeypatch):
    # The same message again is run by ClientSession._sync_again: the bound on outstanding
    # calls, the handle's check and a driver's failure answer as on the long way, and the
    # connection goes on after each.
    pm = prepare(remote)
    a, b = float_inputs(12, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes])
    s = session_of(service)
    short: list[int] = []
    sync_again = s._sync_again
    monkeypatch.setattr(s, "_sync_again", lambda *args: short.append(1) or sync_again(*args))

    def run() -> E:
        return pm.execute_synchronously(rb.request, MeasureTiming.YES)[0]

    # The first message defines the memories, the second is decoded (and remembered).
    assert run() == E.NONE and run() == E.NONE and short == []
    assert run() == E.NONE and short == [1]
    np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + b)
    limits = s.limits
    monkeypatch.setattr(s, "limits", dataclasses.replace(limits, max_outstanding=0))
    assert run() == E.RESOURCE_EXHAUSTED_TRANSIENT
    monkeypatch.setattr(s, "limits", limits)
    assert s.outstanding == 0 and run() == E.NONE
    (handle,) = [h for h, (kind, _) in s.handles.items() if kind == server._PM]
    served_pm = s.handles[handle][1]
    monkeypatch.setattr(served_pm, "execute_synchronously",
                        lambda *args: 1 // 0)  # a driver that raises
    assert run() == E.GENERAL_FAILURE
    monkeypatch.delattr(served_pm, "execute_synchronously")
    assert run() == E.NONE
    s.release(handle)  # as if released: the same bytes name no prepared model now
    assert run() == E.INVALID_ARGUMENT
    assert s.outstanding == 0 and len(short) == 6
    assert remote.get_type()[0] == E.NONE
    rb.close()
