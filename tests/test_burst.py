"""Bursts (canonical IBurst) and reusable executions (IExecution) of the reference driver."""

import gc
import threading
import time
import weakref

import numpy as np
import pytest
from helpers import add_model, float_inputs

from nnhal.drivers.common.burst import CacheHold
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
    RequestArgument,
)
from nnhal.hidl import fmq
from nnhal.memory import SharedMemory

E = ErrorStatus
DIMS = (16, 16)


def prepare(device, model):
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, pm = cb.wait(10)
    assert status == E.NONE
    return pm


@pytest.fixture
def pm(device):
    return prepare(device, add_model(DIMS))


@pytest.fixture
def burst(pm):
    status, burst = pm.configure_execution_burst()
    assert status == E.NONE and burst is not None
    return burst


@pytest.fixture
def rb():
    a, b = float_inputs(3, DIMS)
    builder = RequestBuilder([a, b], [a.nbytes])
    builder.expected = a + b
    yield builder
    builder.close()


def result_of(rb):
    return rb.output(0, np.float32, DIMS)


def count_concurrent_runs(pm, monkeypatch):
    """Wrap pm.run to record how many runs overlap; returns the record."""
    record = {"now": 0, "max": 0, "runs": 0}
    lock = threading.Lock()
    real = pm.run

    def run(*args):
        with lock:
            record["now"] += 1
            record["runs"] += 1
            record["max"] = max(record["max"], record["now"])
        try:
            time.sleep(0.001)  # widen the window in which an overlap would show
            return real(*args)
        finally:
            with lock:
                record["now"] -= 1

    monkeypatch.setattr(pm, "run", run)
    return record


# ---- burst execution ---------------------------------------------------------------------------

def test_burst_executes_and_measures(burst, rb):
    status, shapes, timing = burst.execute(rb.request, MeasureTiming.YES)
    assert status == E.NONE and shapes[0].dimensions == list(DIMS)
    assert timing.time_on_device != NO_TIME and timing.time_in_driver >= timing.time_on_device
    np.testing.assert_array_equal(result_of(rb), rb.expected)
    status, _, timing = burst.execute(rb.request, MeasureTiming.NO)
    assert status == E.NONE and timing.time_on_device == NO_TIME


def test_burst_one_execution_at_a_time_under_four_threads(pm, burst, monkeypatch):
    record = count_concurrent_runs(pm, monkeypatch)
    errors = []

    def client(seed):
        a, b = float_inputs(seed, DIMS)
        builder = RequestBuilder([a, b], [a.nbytes])
        hold = burst.cache_memory(builder.input_memory) if seed % 2 else None
        try:
            for k in range(10):
                builder.input_memory.write(0, a + k)  # new input each time
                status, shapes, _ = burst.execute(builder.request)
                got = builder.output(0, np.float32, DIMS)
                if status != E.NONE or not np.array_equal(got, a + k + b):
                    errors.append((seed, k, status))
        finally:
            del hold
            builder.close()

    threads = [threading.Thread(target=client, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert record["runs"] == 40 and record["max"] == 1


def test_a_second_execution_waits_for_the_first(burst, rb):
    done = []
    with burst.execution_lock:  # as if another execution were running
        t = threading.Thread(target=lambda: done.append(burst.execute(rb.request)[0]))
        t.start()
        t.join(0.1)
        assert t.is_alive() and not done  # waiting, not failed, not run alongside
    t.join(10)
    assert done == [E.NONE]
    np.testing.assert_array_equal(result_of(rb), rb.expected)


def test_waiting_past_the_deadline_is_a_missed_deadline(burst, rb):
    with burst.execution_lock:
        status, shapes, _ = burst.execute(rb.request, deadline=time.monotonic_ns() + 20_000_000)
    assert status == E.MISSED_DEADLINE_TRANSIENT and shapes == []
    assert not result_of(rb).any()  # nothing was written


def test_bad_requests_fail_at_once_even_while_busy(burst, rb):
    bad = RequestBuilder([np.zeros(3, np.float32)], [4])
    try:
        with burst.execution_lock:
            assert burst.execute(bad.request)[0] == E.INVALID_ARGUMENT
            assert burst.execute(rb.request, MeasureTiming(1), None, -1)[0] == E.INVALID_ARGUMENT
            assert burst.execute(rb.request, 7)[0] == E.INVALID_ARGUMENT
            assert burst.execute("not a request")[0] == E.INVALID_ARGUMENT
    finally:
        bad.close()
    assert burst.execute(rb.request, deadline=time.monotonic_ns() - 1)[0] == \
        E.MISSED_DEADLINE_PERSISTENT


# ---- the memory cache ---------------------------------------------------------------------------

def test_cache_hold_keeps_memory_cached_until_dropped(burst, rb):
    hold_in = burst.cache_memory(rb.input_memory)
    hold_out = burst.cache_memory(MemoryPool.of(rb.output_memory))
    assert isinstance(hold_in, CacheHold) and burst.cached_count == 2
    assert burst.cache_memory(rb.input_memory) is hold_in  # one entry per memory
    assert burst.execute(rb.request)[0] == E.NONE
    np.testing.assert_array_equal(result_of(rb), rb.expected)
    del hold_in
    gc.collect()
    assert burst.cached_count == 1
    hold_out.release()
    assert hold_out.released and burst.cached_count == 0
    hold_out.release()  # idempotent
    assert burst.execute(rb.request)[0] == E.NONE  # uncached memories still work


def test_cached_pools_skip_resolving(pm, burst, rb, monkeypatch):
    holds = [burst.cache_memory(m) for m in rb.request.pools]
    calls = []
    real = pm.resolve_pools
    monkeypatch.setattr(pm, "resolve_pools", lambda req: calls.append(1) or real(req))
    assert burst.execute(rb.request)[0] == E.NONE
    assert calls == []
    holds[0].release()
    # The request run last, with the same memories: the prepared model recognises it and
    # maps nothing again, cached or not.
    assert burst.execute(rb.request)[0] == E.NONE
    assert calls == []
    # A request it has not run last (the model's dimensions spelled out), one memory no
    # longer cached: its pools are resolved by the prepared model.
    rb.request.inputs[0].dimensions = list(DIMS)
    assert burst.execute(rb.request)[0] == E.NONE
    assert calls == [1]
    np.testing.assert_array_equal(result_of(rb), rb.expected)


def test_cache_does_not_keep_memory_or_burst_alive(pm, rb):
    mem = SharedMemory.ashmem(64)
    _, burst = pm.configure_execution_burst()
    hold = burst.cache_memory(mem)
    mem_ref, burst_ref = weakref.ref(mem), weakref.ref(burst)
    hold.release()
    del mem
    gc.collect()
    assert mem_ref() is None  # the burst let go of the memory
    hold2 = burst.cache_memory(rb.input_memory)
    del burst
    gc.collect()
    assert burst_ref() is None  # a hold does not keep its burst alive
    hold2.release()  # and releasing it afterwards is harmless


def test_cache_refuses_what_it_cannot_map(burst):
    assert burst.cache_memory("not memory") is None
    assert burst.cache_memory(MemoryPool.of_token(3)) is None
    closed = SharedMemory.ashmem(16)
    closed.close()
    assert burst.cache_memory(closed) is None
    assert burst.cached_count == 0


def test_closed_cached_memory_is_refused(burst, rb):
    hold = burst.cache_memory(rb.output_memory)
    rb.output_memory.close()
    assert burst.execute(rb.request)[0] == E.INVALID_ARGUMENT
    hold.release()


# ---- reusable executions ------------------------------------------------------------------------

def test_reusable_execution_validates_once_and_runs_many_times(pm, rb, monkeypatch):
    checks = []
    real = pm.check_request
    monkeypatch.setattr(pm, "check_request", lambda *a, **k: checks.append(1) or real(*a, **k))
    status, execution = pm.create_reusable_execution(rb.request, MeasureTiming.YES)
    assert status == E.NONE and checks == [1]
    a, b = float_inputs(3, DIMS)
    for k in range(20):
        rb.input_memory.write(0, a * k)
        status, shapes, timing = execution.compute()
        assert status == E.NONE and shapes[0].dimensions == list(DIMS)
        assert timing.time_on_device != NO_TIME
        np.testing.assert_array_equal(result_of(rb), a * k + b)
    assert checks == [1]


@pytest.mark.parametrize("maker", ["pm", "burst"])
def test_invalid_requests_are_rejected_at_creation(pm, burst, rb, maker):
    target = pm if maker == "pm" else burst
    bad = RequestBuilder([np.zeros(DIMS, np.float32)], [4])  # one input short
    try:
        assert target.create_reusable_execution(bad.request) == (E.INVALID_ARGUMENT, None)
    finally:
        bad.close()
    rb.request.outputs[0].location = DataLocation(1, 0, 1 << 20)  # beyond the pool
    assert target.create_reusable_execution(rb.request) == (E.INVALID_ARGUMENT, None)
    assert target.create_reusable_execution("nope") == (E.INVALID_ARGUMENT, None)
    assert target.create_reusable_execution(rb.request, 2) == (E.INVALID_ARGUMENT, None)


def test_reusable_execution_ignores_later_changes_to_the_request(pm, rb):
    status, execution = pm.create_reusable_execution(rb.request)
    assert status == E.NONE
    rb.request.outputs[0].location = DataLocation(5, 0, 4)  # would be invalid
    rb.request.inputs.append(RequestArgument())
    assert execution.compute()[0] == E.NONE
    np.testing.assert_array_equal(result_of(rb), rb.expected)


def test_reusable_execution_refuses_closed_memory_and_past_deadlines(pm, rb):
    _, execution = pm.create_reusable_execution(rb.request)
    assert execution.compute(time.monotonic_ns() - 1)[0] == E.MISSED_DEADLINE_PERSISTENT
    assert execution.compute("soon")[0] == E.INVALID_ARGUMENT
    rb.input_memory.close()
    assert execution.compute()[0] == E.INVALID_ARGUMENT


def test_reusable_execution_computes_one_at_a_time(pm, rb, monkeypatch):
    record = count_concurrent_runs(pm, monkeypatch)
    _, execution = pm.create_reusable_execution(rb.request)
    statuses = []
    threads = [threading.Thread(target=lambda: statuses.extend(
        execution.compute()[0] for _ in range(5))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert statuses == [E.NONE] * 20 and record["max"] == 1
    np.testing.assert_array_equal(result_of(rb), rb.expected)


def test_burst_execution_keeps_its_memories_cached(burst, rb):
    hold = burst.cache_memory(rb.input_memory)
    status, execution = burst.create_reusable_execution(rb.request)
    assert status == E.NONE
    del hold
    gc.collect()
    assert burst.cached_count == 1  # the execution holds it
    assert execution.compute()[0] == E.NONE
    np.testing.assert_array_equal(result_of(rb), rb.expected)
    del execution
    gc.collect()
    assert burst.cached_count == 0


def test_burst_execution_shares_the_burst_rule_and_refuses_fences(burst, rb):
    _, execution = burst.create_reusable_execution(rb.request)
    with burst.execution_lock:
        status, _, _ = execution.compute(time.monotonic_ns() + 20_000_000)
    assert status == E.MISSED_DEADLINE_TRANSIENT
    assert execution.compute_fenced([])[0] == E.GENERAL_FAILURE


def test_compute_fenced_waits_for_fences(pm, rb):
    _, execution = pm.create_reusable_execution(rb.request, MeasureTiming.YES)
    for _ in range(3):
        rb.output_memory.array()[:] = 0
        gate = SyncFence()
        status, fence, callback = execution.compute_fenced([gate])
        assert status == E.NONE
        assert fence.wait(0.05) == FenceState.ACTIVE  # not before the gate opens
        assert not result_of(rb).any()
        gate.signal()
        assert fence.wait(10) == FenceState.SIGNALED
        assert callback.get_execution_info()[0] == E.NONE
        np.testing.assert_array_equal(result_of(rb), rb.expected)
        fence.close()
        gate.close()


def test_compute_fenced_rejects_bad_arguments(device, pm, rb):
    _, execution = pm.create_reusable_execution(rb.request)
    assert execution.compute_fenced(["not a fence"])[0] == E.INVALID_ARGUMENT
    assert execution.compute_fenced([], None, -5)[0] == E.INVALID_ARGUMENT
    assert execution.compute_fenced([], time.monotonic_ns() - 1)[0] == \
        E.MISSED_DEADLINE_PERSISTENT
    dyn = prepare(device, add_model(DIMS, out_dims=(0, 0)))
    status, execution = dyn.create_reusable_execution(rb.request)
    assert status == E.NONE and execution.compute()[0] == E.NONE  # fine unfenced
    assert execution.compute_fenced([])[0] == E.INVALID_ARGUMENT  # outputs not specified


def test_reusable_execution_rechecks_driver_buffers(device, pm):
    status, buf, token = device.allocate(BufferDesc([]), [pm], [BufferRole(0, 0)], [])
    assert status == E.NONE
    a, b = float_inputs(5, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes])
    try:
        rb.request.pools.append(MemoryPool.of_token(token))
        rb.request.inputs[0] = RequestArgument(False, DataLocation(2, 0, 0))
        src = SharedMemory.from_bytes(a.tobytes())
        assert buf.copy_from(src, list(DIMS)) == E.NONE
        src.close()
        status, execution = pm.create_reusable_execution(rb.request)
        assert status == E.NONE and execution.compute()[0] == E.NONE
        np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + b)
        buf.close()  # the token no longer names a buffer
        assert execution.compute()[0] == E.INVALID_ARGUMENT
    finally:
        rb.close()


# ---- FMQ packets through a burst ---------------------------------------------------------------

def test_burst_runs_fmq_packets(burst, rb):
    packet = fmq.pack_request(rb.request, MeasureTiming.YES, [4, 9])
    memories = {4: rb.input_memory, 9: rb.output_memory}
    status, shapes, timing = fmq.unpack_result(burst.execute_packet(packet, memories))
    assert status == E.NONE and shapes[0].dimensions == list(DIMS)
    assert timing.time_on_device != NO_TIME
    np.testing.assert_array_equal(result_of(rb), rb.expected)
    for bad, mems in ((packet[:-1], memories), (packet + b"\0" * 24, memories),
                      (packet, {4: rb.input_memory})):
        assert fmq.unpack_result(burst.execute_packet(bad, mems))[0] == E.INVALID_ARGUMENT
