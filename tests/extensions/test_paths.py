"""Extension models on every path of the runtime and the driver: compilation caching (each
step from its cache), bursts, reusable executions, fenced executions with dependencies, and a
driver-allocated memory (memory domain) holding an extension-typed output."""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np

from nnhal.runtime import ndk

from . import fibonacci_cases as cases
from .fibonacci_cases import ok

EXPECTED = [f / 0.5 + 10 for f in cases.FIB]


def _ext_model() -> cases.Case:
    c = cases.Case(ndk)
    c.build(c.ext_operand_type(cases.INT64), [], c.ext_operand_type(cases.TENSOR_QUANT64_ASYMM),
            [cases.N], params=struct.pack("=dq", 0.5, 10))
    return c


def _float_model() -> cases.Case:
    c = cases.Case(ndk)
    c.build(cases.TENSOR_FLOAT32, [1], cases.TENSOR_FLOAT32, [cases.N], nops=True)
    return c


def _execution(comp, x, out):
    e = ok(ndk.ANeuralNetworksExecution_create(comp))
    ok(ndk.ANeuralNetworksExecution_setInput(e, 0, None, x, x.nbytes))
    ok(ndk.ANeuralNetworksExecution_setOutput(e, 0, None, out, out.nbytes))
    return e


def test_caching_prepares_each_step_from_its_cache(fibonacci_device, tmp_path):
    for make, x, want in ((_ext_model, np.array(cases.N, np.int64), EXPECTED),
                          (_float_model, np.array([cases.N], np.float32), cases.FIB)):
        c = make()
        prepares = []
        hal = c.fib.hal
        local = hasattr(hal, "claimed")  # the device object itself, not a remote one
        if local:
            def counting(*a, real=hal.prepare_model, seen=prepares, **k):
                seen.append(1)
                return real(*a, **k)

            hal.prepare_model = counting
        token = bytes(range(32)) if make is _ext_model else bytes(range(1, 33))
        results = []
        for _ in range(2):
            comp = ok(ndk.ANeuralNetworksCompilation_createForDevices(c.model, c.devices))
            ok(ndk.ANeuralNetworksCompilation_setCaching(comp, str(tmp_path), token))
            ok(ndk.ANeuralNetworksCompilation_finish(comp))
            out = np.zeros(cases.N, np.int64 if make is _ext_model else np.float32)
            ok(ndk.ANeuralNetworksExecution_compute(_execution(comp, x, out)))
            results.append(out.tolist())
        assert results == [want, want]
        if local:
            del hal.prepare_model
            assert len(prepares) == 1  # the second compilation restored the Fibonacci step
        assert any(tmp_path.iterdir())


def test_burst_reusable_and_fenced(fibonacci_device):
    for make, x, dtype, want in (
            (_ext_model, np.array(cases.N, np.int64), np.int64, EXPECTED),
            (_float_model, np.array([cases.N], np.float32), np.float32, cases.FIB)):
        c = make()
        comp, code = c.compile()
        assert code == cases.OK
        burst = ok(ndk.ANeuralNetworksBurst_create(comp))
        for _ in range(3):
            out = np.zeros(cases.N, dtype)
            ok(ndk.ANeuralNetworksExecution_burstCompute(_execution(comp, x, out), burst))
            assert out.tolist() == want
        out = np.zeros(cases.N, dtype)
        e = _execution(comp, x, out)
        ok(ndk.ANeuralNetworksExecution_setReusable(e, True))
        for _ in range(2):
            out[:] = 0
            ok(ndk.ANeuralNetworksExecution_compute(e))
            assert out.tolist() == want
        out = np.zeros(cases.N, dtype)
        first = ok(ndk.ANeuralNetworksExecution_startComputeWithDependencies(
            _execution(comp, x, out), [], 0))
        out2 = np.zeros(cases.N, dtype)
        second = ok(ndk.ANeuralNetworksExecution_startComputeWithDependencies(
            _execution(comp, x, out2), [first], 0))
        ok(ndk.ANeuralNetworksEvent_wait(second))
        ok(ndk.ANeuralNetworksEvent_wait(first))  # a client buffer is filled at its own wait
        assert out.tolist() == want and out2.tolist() == want


def test_a_driver_buffer_holds_an_extension_output(fibonacci_device):
    c = _ext_model()
    comp, code = c.compile()
    assert code == cases.OK
    desc = ok(ndk.ANeuralNetworksMemoryDesc_create())
    ok(ndk.ANeuralNetworksMemoryDesc_addOutputRole(desc, comp, 0, 1.0))
    ok(ndk.ANeuralNetworksMemoryDesc_finish(desc))
    mem = ok(ndk.ANeuralNetworksMemory_createFromDesc(desc))
    assert mem.buffer is not None  # the Fibonacci device's own buffer, not runtime memory
    e = ok(ndk.ANeuralNetworksExecution_create(comp))
    x = np.array(cases.N, np.int64)
    ok(ndk.ANeuralNetworksExecution_setInput(e, 0, None, x, 8))
    ok(ndk.ANeuralNetworksExecution_setOutputFromMemory(e, 0, None, mem, 0, 0))
    ok(ndk.ANeuralNetworksExecution_compute(e))
    fd = os.memfd_create("fib-out")
    try:
        os.ftruncate(fd, 8 * cases.N)
        dst = ok(ndk.ANeuralNetworksMemory_createFromFd(8 * cases.N,
                                                        mmap.PROT_READ | mmap.PROT_WRITE, fd, 0))
        ok(ndk.ANeuralNetworksMemory_copy(mem, dst))
        got = np.frombuffer(os.pread(fd, 8 * cases.N, 0), np.int64)
        assert got.tolist() == EXPECTED
    finally:
        os.close(fd)


def test_an_if_whose_branches_run_fibonacci(fibonacci_site):
    """No device claims the IF (the reference does not offer the extension its branches use),
    so the runtime runs it and gives each branch's Fibonacci operation to its device."""
    body = cases.Case(ndk)
    body.build(cases.TENSOR_FLOAT32, [1], cases.TENSOR_FLOAT32, [cases.N])
    c = cases.Case(ndk)
    cond = c.operand(9, [1])  # TENSOR_BOOL8
    x = c.operand(cases.TENSOR_FLOAT32, [1])
    branches = []
    for _ in range(2):
        k = c.operand(15)  # MODEL
        ok(ndk.ANeuralNetworksModel_setOperandValueFromModel(c.model, k, body.model))
        branches.append(k)
    out = c.operand(cases.TENSOR_FLOAT32, [cases.N])
    ok(ndk.ANeuralNetworksModel_addOperation(c.model, 96, [cond, *branches, x], [out]))  # IF (96)
    c.finish([cond, x], [out])
    assert c.supported([c.cpu]) == [False] and c.supported([c.fib]) == [False]
    comp = ok(ndk.ANeuralNetworksCompilation_createForDevices(c.model, c.devices))
    ok(ndk.ANeuralNetworksCompilation_finish(comp))
    e = ok(ndk.ANeuralNetworksExecution_create(comp))
    flag, n = np.array([True]), np.array([cases.N], np.float32)
    got = np.zeros(cases.N, np.float32)
    ok(ndk.ANeuralNetworksExecution_setInput(e, 0, None, flag, 1))
    ok(ndk.ANeuralNetworksExecution_setInput(e, 1, None, n, 4))
    ok(ndk.ANeuralNetworksExecution_setOutput(e, 0, None, got, got.nbytes))
    ok(ndk.ANeuralNetworksExecution_compute(e))
    assert got.tolist() == cases.FIB


def test_an_output_of_unknown_size_takes_the_size_n_gives(fibonacci_device):
    """The Fibonacci output declared [0]: its shape comes from the execution (n = 7)."""
    c = cases.Case(ndk)
    c.build(c.ext_operand_type(cases.INT64), [], c.ext_operand_type(cases.TENSOR_QUANT64_ASYMM),
            [0], params=struct.pack("=dq", 1.0, 0))
    comp, code = c.compile()
    assert code == cases.OK
    out = np.zeros(cases.N, np.int64)
    e = _execution(comp, np.array(7, np.int64), out)
    ok(ndk.ANeuralNetworksExecution_compute(e))
    assert list(ok(ndk.ANeuralNetworksExecution_getOutputOperandDimensions(e, 0))) == [7]
    assert out[:7].tolist() == cases.FIB[:7]
