"""Load and faults: many threads on shared prepared models, and clients that walk away.

Every result of every execution is checked against numpy. Clients that drop callbacks,
prepared models or the device mid-execution must leave no thread, file descriptor or mapping
behind (counted from /proc/self before and after, with a collection and a short settle).
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from helpers import add_model
from test_mutations import conv_model

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import BufferDesc, BufferRole, ErrorStatus, MeasureTiming
from nnhal.hidl import ExecutionCallback, IExecutionCallback
from nnhal.hidl import execute as execute_1_3

THREADS = 16
PER_THREAD = 60


def _prepare(device, model):
    cb = PreparedModelCallback()
    assert device.prepare_model(model, callback=cb) == ErrorStatus.NONE
    status, pm = cb.wait(10)
    assert status == ErrorStatus.NONE
    return pm


def _conv_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """What conv_model computes: SAME 3x3 convolution (4 filters, zero bias) plus y."""
    w = np.arange(36, dtype=np.float32).reshape(4, 3, 3, 1) / 10
    xp = np.pad(x[0, :, :, 0], 1)
    out = np.zeros((1, 4, 4, 4), np.float32)
    for r in range(4):
        for c in range(4):
            patch = xp[r:r + 3, c:c + 3]
            out[0, r, c, :] = (w[:, :, :, 0] * patch).sum(axis=(1, 2))
    return out + y


Case = tuple[object, Callable[[np.random.Generator], tuple[list[np.ndarray], np.ndarray]]]


def _cases(device) -> list[tuple[str, object, Callable]]:
    def add_f(rng):
        a, b = rng.standard_normal((2, 2), np.float32), rng.standard_normal((2, 2), np.float32)
        return [a, b], a + b, 1e-6

    def add_big(rng):
        a = rng.standard_normal((64, 64), np.float32)
        b = rng.standard_normal((64, 64), np.float32)
        return [a, b], a + b, 1e-6

    def add_q(rng):
        a = rng.integers(0, 100, (2, 2), dtype=np.uint8)
        b = rng.integers(0, 100, (2, 2), dtype=np.uint8)
        real = (a.astype(np.float64) - 10) * 0.5 + (b.astype(np.float64) - 10) * 0.5
        return [a, b], np.clip(np.round(real), 0, 255).astype(np.uint8), 1

    def conv(rng):
        x = rng.standard_normal((1, 4, 4, 1), np.float32)
        y = rng.standard_normal((1, 4, 4, 4), np.float32)
        return [x, y], _conv_reference(x, y), 1e-4

    out = []
    for name, model, gen in (("add", add_model(), add_f), ("add64", add_model((64, 64)), add_big),
                             ("add_q", add_model(quant=True), add_q), ("conv", conv_model(), conv)):
        out.append((name, _prepare(device, model), gen, model))
    return out


def _run_one(pm, gen, rng, path: str) -> str | None:
    inputs, expected, tol = gen(rng)
    rb = RequestBuilder(inputs, [expected.nbytes])
    try:
        if path == "sync":
            status, shapes, _ = pm.execute_synchronously(rb.request, MeasureTiming.YES)
        else:
            cb = ExecutionCallback()
            launch = execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, cb)
            status, shapes, _ = cb.wait(30)
            if launch != ErrorStatus.NONE or cb.calls != 1:
                return f"launch {launch}, {cb.calls} callbacks"
        if status != ErrorStatus.NONE:
            return f"status {status.name}"
        got = rb.output(0, expected.dtype, expected.shape)
        if list(shapes[0].dimensions) != list(expected.shape):
            return f"shape {shapes[0].dimensions}"
        if not np.allclose(got.astype(np.float64), expected.astype(np.float64), atol=tol):
            return "wrong values"
        return None
    finally:
        rb.close()


def test_sixteen_threads_on_shared_prepared_models():
    device = ReferenceDevice(workers=4)
    try:
        cases = _cases(device)
        errors: list[str] = []
        done = [0]
        lock = threading.Lock()
        barrier = threading.Barrier(THREADS)

        def worker(t: int) -> None:
            rng = np.random.default_rng(t)
            pick = random.Random(t)
            barrier.wait()
            for _ in range(PER_THREAD):
                name, pm, gen, _ = pick.choice(cases)
                path = pick.choice(["sync", "async"])
                try:
                    err = _run_one(pm, gen, rng, path)
                except Exception as e:  # noqa: BLE001
                    err = f"raised {type(e).__name__}: {e}"
                with lock:
                    done[0] += 1
                    if err:
                        errors.append(f"thread {t} {name} {path}: {err}")

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert done[0] == THREADS * PER_THREAD
        assert errors == []
        for _, _, _, model in cases:
            for p in model.pools:
                p.close()
    finally:
        device.close()


def test_allocate_interleaved_with_executions():
    """Allocations and frees of driver buffers while executions run (when allocate works)."""
    device = ReferenceDevice()
    try:
        name, pm, gen, model = _cases(device)[0]
        status, buf, token = device.allocate(BufferDesc([2, 2]), [pm],
                                             [BufferRole(0, 0)], [])
        if status == ErrorStatus.GENERAL_FAILURE:
            pytest.skip("IDevice.allocate is not implemented yet")
        assert status == ErrorStatus.NONE and buf is not None
        del buf
        errors: list[str] = []

        def allocator() -> None:
            for _ in range(50):
                st, b, _tok = device.allocate(BufferDesc([2, 2]), [pm], [BufferRole(0, 0)], [])
                if st != ErrorStatus.NONE:
                    errors.append(f"allocate {st}")
                del b

        def executor(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(30):
                err = _run_one(pm, gen, rng, "sync")
                if err:
                    errors.append(err)

        threads = [threading.Thread(target=allocator) for _ in range(4)] + \
            [threading.Thread(target=executor, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        for p in model.pools:
            p.close()
    finally:
        device.close()


# ---- leaks ------------------------------------------------------------------------------------

def _resources() -> tuple[int, int, int, set[str]]:
    gc.collect()
    threads = len(os.listdir("/proc/self/task"))
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/maps") as f:
        maps = [line for line in f if "nnhal" in line or "memfd" in line]
    return threads, fds, len(maps), {t.name for t in threading.enumerate()}


def _settled(before: tuple, timeout: float = 5.0) -> tuple:
    deadline = time.monotonic() + timeout
    while True:
        now = _resources()
        if now[:3] <= before[:3] or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


class _Forgetful(IExecutionCallback):
    """A client that never waits and raises when notified."""

    def notify(self, status, output_shapes, timing) -> None:
        raise RuntimeError("client went away")


def test_abandoned_clients_leak_nothing():
    before = _resources()

    def session() -> None:
        device = ReferenceDevice()
        cases = _cases(device)
        rng = np.random.default_rng(0)
        for _name, pm, gen, model in cases:
            for _ in range(5):
                inputs, expected, _ = gen(rng)
                rb = RequestBuilder(inputs, [expected.nbytes])
                # Fire and forget: the callback object is dropped at once, or raises.
                execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, ExecutionCallback())
                execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, _Forgetful())
                pm.execute_synchronously(rb.request)
                del rb  # the request memories go away while executions may still run
            cb = PreparedModelCallback()
            device.prepare_model(model, callback=cb)
            del cb  # nobody will ever wait for this preparation
        # Drop prepared models mid-flight, then the device.
        del cases, pm
        device.close()
        del device

    session()
    after = _settled(before)
    assert after[0] <= before[0], f"threads {before[0]} -> {after[0]}: {after[3] - before[3]}"
    assert after[1] <= before[1], f"fds {before[1]} -> {after[1]}"
    assert after[2] <= before[2], f"shared mappings {before[2]} -> {after[2]}"


def test_leak_counter_sees_a_leak():
    """The counters themselves: an open memfd and a live thread must show up."""
    before = _resources()
    fd = os.memfd_create("nnhal-leak-probe")
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        now = _resources()
        assert now[0] > before[0] and now[1] > before[1]
    finally:
        stop.set()
        t.join()
        os.close(fd)
