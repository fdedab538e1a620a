"""Served bursts on shared-memory rings: executions cross with no socket message, give what the
driver gives in process, survive a hostile ring peer, and end with the burst, the client or the
service."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import add_model, float_inputs, served, wait_for

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    NO_TIME,
    NO_TIMING,
    BufferDesc,
    BufferRole,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    MemoryPool,
    OperationType,
    Priority,
    Request,
    RequestArgument,
)
from nnhal.hal.types import OperandType as T
from nnhal.hidl import fmq
from nnhal.service import server
from nnhal.service import wire as w
from nnhal.service.client import RemoteDevice

E = ErrorStatus
DIMS = (4, 4)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def service(tmp_path):
    # the serving threads of an earlier test's service end within about 50 ms of its stop
    assert wait_for(lambda: not burst_threads(), 10)
    with served(tmp_path / "s.sock") as svc:
        yield svc


@pytest.fixture
def local():
    dev = ReferenceDevice()
    yield dev
    dev.close()


def prepare(dev, model=None):
    cb = PreparedModelCallback()
    dev.prepare_model(model or add_model(DIMS), ExecutionPreference.FAST_SINGLE_ANSWER,
                      Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(30)
    assert status == E.NONE
    return pm


def ring_burst(pm):
    status, burst = pm.configure_execution_burst()
    assert status == E.NONE and burst.rings is not None
    return burst


def request(seed=1, out_bytes=None):
    a, b = float_inputs(seed, DIMS)
    rb = RequestBuilder([a, b], [out_bytes if out_bytes is not None else a.nbytes])
    rb.expected = a + b
    return rb


def burst_threads():
    return [t for t in threading.enumerate() if t.name.startswith("nnhal-burst")]


def test_results_equal_in_process_and_no_socket_traffic(service, remote, local):
    served, here = ring_burst(prepare(remote)), prepare(local).configure_execution_burst()[1]
    rb = request()
    assert served.execute(rb.request)[0] == E.NONE  # caches the pools (socket, once)
    before = service.messages
    for measure in (MeasureTiming.NO, MeasureTiming.NO, MeasureTiming.YES):
        rb.output_memory.write(0, bytes(rb.output_memory.size))
        status, shapes, timing = served.execute(rb.request, measure)
        got = rb.output(0, np.float32, DIMS).copy()
        l_status, l_shapes, l_timing = here.execute(rb.request, measure)
        assert (status, shapes) == (l_status, l_shapes) == (E.NONE, l_shapes)
        np.testing.assert_array_equal(got, rb.expected)
        if measure == MeasureTiming.YES:
            assert timing.time_in_driver != NO_TIME and timing.time_on_device != NO_TIME
        else:
            assert timing == NO_TIMING
    assert service.messages == before  # every execution crossed on the rings
    rb.close()


def test_output_insufficient_size_gives_the_shapes(remote, local):
    served, here = ring_burst(prepare(remote)), prepare(local).configure_execution_burst()[1]
    rb = request(out_bytes=8)
    result = served.execute(rb.request)
    assert result[0] == E.OUTPUT_INSUFFICIENT_SIZE
    assert result[:2] == here.execute(rb.request)[:2]
    assert result[1][0].dimensions == list(DIMS) and result[1][0].is_sufficient is False
    rb.close()


def lsh_model():
    """LSH_PROJECTION, whose weight input (input 2) may be omitted."""
    b = ModelBuilder()
    ins = [b.input(T.TENSOR_FLOAT32, (4, 2)), b.input(T.TENSOR_FLOAT32, (3, 2)),
           b.input(T.TENSOR_FLOAT32, (3,))]
    out = b.output(T.TENSOR_INT32, (4,))
    b.operation(OperationType.LSH_PROJECTION, [*ins, b.scalar(T.INT32, 1)], [out])
    return b.build()


def test_omitted_input_with_a_location_is_judged_by_the_driver(remote, local):
    # The packet cannot carry it (it would go as a valid omitted input, zero location): the
    # client sends it over the socket and the served driver rejects it as the local one does.
    model = lsh_model()
    served = ring_burst(prepare(remote, model))
    here = prepare(local, model).configure_execution_burst()[1]
    rng = np.random.default_rng(0)
    rb = RequestBuilder([rng.standard_normal(d).astype(np.float32) for d in ((4, 2), (3, 2))]
                        + [np.ones(3, np.float32)], [16])
    ins, outs, pools = rb.request.inputs, rb.request.outputs, rb.request.pools
    valid = Request([*ins[:2], RequestArgument(True)], outs, pools)
    assert served.execute(valid)[0] == here.execute(valid)[0] == E.NONE
    for arg in (RequestArgument(True, DataLocation(0, 0, 4), []),
                RequestArgument(True, DataLocation(), [1])):
        bad = Request([*ins[:2], arg], outs, pools)
        assert here.execute(bad)[0] == E.INVALID_ARGUMENT
        assert served.execute(bad)[0] == E.INVALID_ARGUMENT
    rb.close()


def test_deadline_and_loop_timeout_cross(remote, local):
    served, here = ring_burst(prepare(remote)), prepare(local).configure_execution_burst()[1]
    rb = request()
    past = time.monotonic_ns() - 10**9
    assert served.execute(rb.request, deadline=past)[0] == here.execute(rb.request,
                                                                       deadline=past)[0]
    assert served.execute(rb.request, deadline=past)[0] in (E.MISSED_DEADLINE_PERSISTENT,
                                                            E.MISSED_DEADLINE_TRANSIENT)
    future = time.monotonic_ns() + 60 * 10**9
    assert served.execute(rb.request, deadline=future)[0] == E.NONE
    for loop in (10**9, 0, -1, 10**12):
        assert served.execute(rb.request, loop_timeout=loop)[0] == \
            here.execute(rb.request, loop_timeout=loop)[0]
    rb.close()


def test_many_executions_with_changing_inputs(remote):
    burst = ring_burst(prepare(remote))
    rb = request()
    for i in range(300):
        a, b = float_inputs(i, DIMS)
        rb.input_memory.write(0, a.tobytes() + b.tobytes())
        assert burst.execute(rb.request)[0] == E.NONE
        np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + b)
    rb.close()


def test_new_requests_and_memories_on_one_burst(service, remote):
    pm = prepare(remote)
    burst = ring_burst(pm)
    for seed in range(20):  # each a new request object on new memories
        rb = request(seed)
        assert burst.execute(rb.request)[0] == E.NONE
        np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), rb.expected)
        rb.close()
    del rb
    gc.collect()
    remote.get_type()  # the forgets and uncaches travel
    # the model, the burst, and the last request's two memories, cached in the burst: the
    # burst keeps its last request (to recognise it again) until it is released
    assert wait_for(lambda: service.objects() == 6)
    del burst
    gc.collect()
    remote.get_type()
    assert wait_for(lambda: service.objects() == 1)


def test_two_bursts_concurrently(remote):
    pm = prepare(remote)
    failures: list[str] = []

    def run(seed):
        burst = ring_burst(pm)
        rb = request(seed)
        for i in range(150):
            a, b = float_inputs(seed * 1000 + i, DIMS)
            rb.input_memory.write(0, a.tobytes() + b.tobytes())
            if burst.execute(rb.request)[0] != E.NONE or \
                    not np.array_equal(rb.output(0, np.float32, DIMS), a + b):
                failures.append(f"burst {seed} execution {i}")
        rb.close()

    threads = [threading.Thread(target=run, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == []


def test_concurrent_calls_on_one_burst_are_serialised(remote):
    burst = ring_burst(prepare(remote))
    rbs = [request(s) for s in (3, 4)]
    results: list[ErrorStatus] = []

    def run(rb):
        for _ in range(100):
            results.append(burst.execute(rb.request)[0])

    threads = [threading.Thread(target=run, args=(rb,)) for rb in rbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [E.NONE] * 200
    for rb in rbs:
        np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), rb.expected)
        rb.close()


def test_token_pools_fall_back_to_the_socket(service, remote):
    pm = prepare(remote)
    burst = ring_burst(pm)
    status, buf, token = remote.allocate(BufferDesc([]), [pm], [], [BufferRole(0, 0)])
    assert status == E.NONE
    rb = request()
    req = Request(rb.request.inputs, [RequestArgument(False, DataLocation(1, 0, 0), [])],
                  [rb.request.pools[0], MemoryPool.of_token(token)])
    before = service.messages
    assert burst.execute(req)[0] == E.NONE
    assert service.messages > before  # BURST_EXECUTE
    assert burst.execute(rb.request)[0] == E.NONE  # the rings still serve the others
    rb.close()


def test_declined_rings_use_the_socket(service, remote, monkeypatch):
    monkeypatch.setattr(server, "MAX_RING_BURSTS", 0)
    status, burst = prepare(remote).configure_execution_burst()
    assert status == E.NONE and burst.rings is None
    rb = request()
    assert burst.execute(rb.request)[0] == E.NONE
    np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), rb.expected)
    rb.close()


def _closing_answer(burst):
    """The result record the service writes after a bad request record."""
    record = burst.rings.results.read(timeout=10)
    tag, flags, _ = w.BURST_RESULT.unpack_from(record)
    return tag, flags, fmq.unpack_result(record[w.BURST_RESULT.size:])[0]


@pytest.mark.parametrize("bad", ["short record", "bad header", "bad packet", "bad ring"])
def test_hostile_ring_records_end_the_burst_not_the_service(service, remote, bad):
    pm = prepare(remote)
    burst = ring_burst(pm)
    rb = request()
    assert burst.execute(rb.request)[0] == E.NONE
    requests = burst.rings.requests
    head = w.BURST_REQUEST.pack(w.BURST_REQUEST_TAG, 0, 99, 0, 0)
    if bad == "short record":
        requests.write(b"garbage")
    elif bad == "bad header":
        requests.write(w.BURST_REQUEST.pack(w.BURST_REQUEST_TAG, 0x80, 99, 0, 0) +
                       fmq.pack_request(rb.request, MeasureTiming.NO, [1, 2]))
    elif bad == "bad packet":
        requests.write(head + os.urandom(48))
    else:  # bytes that are not a record, published by the write index
        requests._mm[256:256 + 32] = os.urandom(32)
        requests._q[8] = requests._w + 32
    assert _closing_answer(burst) == (w.BURST_RESULT_TAG, w.BURST_CLOSING,
                                      E.INVALID_ARGUMENT)
    assert wait_for(lambda: not burst_threads())  # the serving thread ended
    burst.rings.close()  # as the client does when it reads a CLOSING result
    assert burst.execute(rb.request)[0] == E.NONE  # over the socket now
    np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), rb.expected)
    assert ring_burst(pm).execute(rb.request)[0] == E.NONE  # the service goes on
    rb.close()


def test_a_closing_answer_to_someone_elses_record_fails_one_execution(remote):
    burst = ring_burst(prepare(remote))
    rb = request()
    burst.rings.requests.write(b"not a request")
    assert burst.execute(rb.request)[0] == E.GENERAL_FAILURE  # the answer is not ours
    assert burst.rings.broken
    assert burst.execute(rb.request)[0] == E.NONE  # then the socket
    rb.close()


def test_an_unknown_pool_identifier_is_refused_and_the_burst_goes_on(remote):
    burst = ring_burst(prepare(remote))
    rb = request()
    assert burst.execute(rb.request)[0] == E.NONE
    burst.rings.requests.write(w.BURST_REQUEST.pack(w.BURST_REQUEST_TAG, 0, 7, 0, 0) +
                               fmq.pack_request(rb.request, MeasureTiming.NO, [1, 12345]))
    record = burst.rings.results.read(timeout=10)
    assert w.BURST_RESULT.unpack_from(record) == (w.BURST_RESULT_TAG, 0, 7)
    assert fmq.unpack_result(record[w.BURST_RESULT.size:])[0] == E.INVALID_ARGUMENT
    assert burst.execute(rb.request)[0] == E.NONE and not burst.rings.broken
    rb.close()


def test_descriptors_that_are_not_rings_are_refused(service, remote):
    pm = prepare(remote)
    r, wfd = os.pipe()
    mem = RequestBuilder([np.ones(4, np.float32)], [16])
    try:
        def enc(wr):
            wr.u32(pm.handle)
            for fd in (r, wfd, mem.input_memory.fd, r):
                wr.fd(fd)
        status = remote.conn.call(w.Kind.CONFIGURE_BURST_RINGS, enc,
                                  lambda rd: w.get_status(rd), lambda s: s)
        assert status == E.INVALID_ARGUMENT
        assert remote.get_type()[0] == E.NONE
        assert service.objects() == 1  # the model: no burst was made
    finally:
        os.close(r)
        os.close(wfd)
        mem.close()


def test_rings_past_the_capacity_bound_are_refused(service, remote):
    from nnhal.service.ring import ChannelPair

    pm = prepare(remote)
    pair = ChannelPair.create(server.MAX_RING_CAPACITY * 2)
    try:
        def enc(wr):
            wr.u32(pm.handle)
            for fd in pair.fds():
                wr.fd(fd)
        status = remote.conn.call(w.Kind.CONFIGURE_BURST_RINGS, enc,
                                  lambda rd: w.get_status(rd), lambda s: s)
        assert status == E.INVALID_ARGUMENT
        assert service.objects() == 1 and not burst_threads()
    finally:
        pair.close()


def test_closing_a_burst_during_an_execution_ends_the_wait(service, remote):
    burst = ring_burst(prepare(remote))
    rb = request()
    assert burst.execute(rb.request)[0] == E.NONE
    service.test_delay = 3.0  # the next execution takes 3 s
    got: list[ErrorStatus] = []
    t = threading.Thread(target=lambda: got.append(burst.execute(rb.request)[0]))
    t.start()
    time.sleep(0.3)
    service.test_delay = 0.0
    burst.close()
    t.join(10)
    assert not t.is_alive() and got == [E.GENERAL_FAILURE]  # not the execution's NONE
    assert wait_for(lambda: not burst_threads(), 10)  # after the driver's execution
    rb.close()


def test_released_burst_ends_its_thread(service, remote):
    pm = prepare(remote)
    burst = ring_burst(pm)
    rb = request()
    assert burst.execute(rb.request)[0] == E.NONE
    assert wait_for(lambda: len(burst_threads()) == 1)
    del burst
    gc.collect()
    remote.get_type()  # the release travels
    assert wait_for(lambda: not burst_threads())
    assert wait_for(lambda: service.objects() == 3)  # the model, the two memories
    rb.close()


def test_client_leaving_ends_every_burst(service):
    dev = RemoteDevice(service.path)
    pm = prepare(dev)
    rb = request()
    bursts = [ring_burst(pm) for _ in range(3)]
    for b in bursts:
        assert b.execute(rb.request)[0] == E.NONE
    assert wait_for(lambda: len(burst_threads()) == 3)
    dev.close()
    assert wait_for(lambda: not burst_threads())
    assert wait_for(lambda: service.objects() == 0)
    rb.close()


def test_service_killed_during_a_ring_execution(tmp_path):
    sock = tmp_path / "slow.sock"
    env = dict(os.environ, NNHAL_SERVICE_TEST_DELAY_S="3", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "reference",
                             "--socket", str(sock)], cwd=ROOT, env=env,
                            stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while True:
            try:
                dev = RemoteDevice(sock)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < end
                time.sleep(0.05)
        try:
            burst = ring_burst(prepare(dev))  # the prepare takes the delay
            rb = request()
            killed: list[float] = []

            def killer():
                time.sleep(0.5)
                killed.append(time.monotonic())
                proc.send_signal(signal.SIGKILL)

            t = threading.Thread(target=killer)
            t.start()
            status, shapes, _ = burst.execute(rb.request)
            after = time.monotonic() - killed[0]
            t.join()
            assert status == E.DEVICE_UNAVAILABLE and shapes == [] and after < 1.0
            assert burst.execute(rb.request)[0] == E.DEVICE_UNAVAILABLE
            rb.close()
        finally:
            dev.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
