"""Feature level 8: ANeuralNetworks{Compilation,Execution}_addExtensionAttribute. The
attributes reach the driver as TokenValuePairs (token = prefix << 16 | code) with the
runtime's ExtensionNameAndPrefix table, through prepareModelWithConfig and every
*WithConfig execution path; misuse gets the NDK's codes."""

from __future__ import annotations

import numpy as np
import pytest
from hint_device import EXTENSION, HintDevice
from ndk_helpers import add_model, compiled, execution

from nnhal.hal.types import ExtensionNameAndPrefix, MeasureTiming, TokenValuePair
from nnhal.runtime import Device
from nnhal.runtime import ndk as N
from nnhal.runtime.codes import ResultCode as R
from nnhal.runtime.extensions import MAX_ATTRIBUTE_BYTES, prefix_of

OK = 0
CA = N.ANeuralNetworksCompilation_addExtensionAttribute
EA = N.ANeuralNetworksExecution_addExtensionAttribute


@pytest.fixture(scope="module")
def hint() -> Device:
    return Device.of(HintDevice(), "hints")


def _prefix(hint: Device) -> int:
    p = prefix_of(EXTENSION, [hint])
    assert p is not None and 1 <= p < 1 << 15
    return p


def _open_compilation(device: Device):
    code, c = N.ANeuralNetworksCompilation_createForDevices(add_model(), [device])
    assert code == OK
    return c


def test_compilation_hints_reach_prepare_model_with_config(hint):
    drv = hint.hal
    c = _open_compilation(hint)
    assert CA(c, EXTENSION, 7, b"\x01\x02", 2) == OK
    assert CA(c, EXTENSION, 0xFFFF, b"vendor", 3) == OK  # the first `length` bytes
    assert CA(c, EXTENSION, 8, None, 0) == OK  # no data
    before = len(drv.prepared)
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    config = drv.prepared[before]
    p = _prefix(hint)
    assert list(config.compilation_hints) == [TokenValuePair(p << 16 | 7, b"\x01\x02"),
                                              TokenValuePair(p << 16 | 0xFFFF, b"ven"),
                                              TokenValuePair(p << 16 | 8, b"")]
    assert list(config.extension_name_to_prefix) == [ExtensionNameAndPrefix(EXTENSION, p)]
    # Without attributes the driver gets none, through the same call.
    compiled(hint)
    assert list(drv.prepared[-1].compilation_hints) == []
    assert list(drv.prepared[-1].extension_name_to_prefix) == []


def _hinted_execution(hint, c, value=b"\x2a"):
    e, x, y, out = execution(c)
    assert EA(e, EXTENSION, 3, value, len(value)) == OK
    return e, x, y, out


def _expect_hint(hint, seen, kind, value=b"\x2a"):
    got = [cfg for k, cfg in seen if k == kind]
    assert got, (kind, seen)
    cfg = got[-1]
    p = _prefix(hint)
    assert cfg.execution_hints == (TokenValuePair(p << 16 | 3, value),)
    assert cfg.extension_name_to_prefix == (ExtensionNameAndPrefix(EXTENSION, p),)
    return cfg


def test_execution_hints_reach_every_execution_path(hint):
    drv = hint.hal
    c = compiled(hint)
    # compute: executeSynchronouslyWithConfig, with the execution's measure and loop timeout.
    e, x, y, out = _hinted_execution(hint, c)
    assert N.ANeuralNetworksExecution_setMeasureTiming(e, True) == OK
    assert N.ANeuralNetworksExecution_setLoopTimeout(e, 5_000_000) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    np.testing.assert_array_equal(out, x + y)
    cfg = _expect_hint(hint, drv.executed, "sync")
    assert cfg.measure == MeasureTiming.YES and cfg.loop_timeout == 5_000_000
    # A reusable execution: createReusableExecution with the config, once for two runs.
    e, x, y, out = _hinted_execution(hint, c, b"r")
    assert N.ANeuralNetworksExecution_setReusable(e, True) == OK
    n = len(drv.executed)
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert [k for k, _ in drv.executed[n:]] == ["reusable"]
    _expect_hint(hint, drv.executed, "reusable", b"r")
    np.testing.assert_array_equal(out, x + y)
    # A burst: IBurst.execute_with_config.
    code, burst = N.ANeuralNetworksBurst_create(c)
    assert code == OK
    e, x, y, out = _hinted_execution(hint, c)
    assert N.ANeuralNetworksExecution_burstCompute(e, burst) == OK
    _expect_hint(hint, drv.executed, "burst")
    np.testing.assert_array_equal(out, x + y)
    # Fenced: executeFencedWithConfig.
    e, x, y, out = _hinted_execution(hint, c)
    code, ev = N.ANeuralNetworksExecution_startComputeWithDependencies(e, [], 0)
    assert code == OK and N.ANeuralNetworksEvent_wait(ev) == OK
    _expect_hint(hint, drv.executed, "fenced")
    np.testing.assert_array_equal(out, x + y)
    # startCompute with hints: the synchronous form with the config (AIDL has no async one).
    e, x, y, out = _hinted_execution(hint, c, b"async")
    n = len(drv.executed)
    code, ev = N.ANeuralNetworksExecution_startCompute(e)
    assert code == OK and N.ANeuralNetworksEvent_wait(ev) == OK
    assert [k for k, _ in drv.executed[n:]] == ["sync"]
    _expect_hint(hint, drv.executed, "sync", b"async")
    np.testing.assert_array_equal(out, x + y)
    # Without hints, startCompute keeps HAL 1.3's callback form (the HIDL face runs the plain
    # synchronous call), and compute sends an empty config.
    e, *_ = execution(c)
    n = len(drv.executed)
    code, ev = N.ANeuralNetworksExecution_startCompute(e)
    assert code == OK and N.ANeuralNetworksEvent_wait(ev) == OK
    assert [k for k, _ in drv.executed[n:]] == ["plain"]
    e, *_ = execution(c)
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert drv.executed[-1][1].execution_hints == ()


def test_compilation_misuse_codes(hint, device):
    c = _open_compilation(hint)
    assert CA(None, EXTENSION, 1, b"x", 1) == R.UNEXPECTED_NULL
    assert CA(c, None, 1, b"x", 1) == R.UNEXPECTED_NULL
    assert CA(c, EXTENSION, 1, None, 4) == R.UNEXPECTED_NULL
    assert CA(c, "com.example.unknown", 1, b"x", 1) == R.BAD_DATA  # no device supports it
    for code in (-1, 1 << 16, 1.5, True, "1"):
        assert CA(c, EXTENSION, code, b"x", 1) == R.BAD_DATA
    for length in (-1, 2, MAX_ATTRIBUTE_BYTES + 1):
        assert CA(c, EXTENSION, 1, b"x", length) == R.BAD_DATA
    assert CA(c, EXTENSION, 1, "text", 4) == R.BAD_DATA
    assert CA(c, EXTENSION, 1, b"x", 1) == OK
    assert CA(c, EXTENSION, 1, b"y", 1) == R.BAD_DATA  # once per attribute
    assert CA(c, EXTENSION, 2, b"y", 1) == OK
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    assert CA(c, EXTENSION, 3, b"x", 1) == R.BAD_STATE  # finished
    # Only a createForDevices compilation with exactly one device.
    code, plain = N.ANeuralNetworksCompilation_create(add_model())
    assert code == OK and CA(plain, EXTENSION, 1, b"x", 1) == R.BAD_DATA
    code, two = N.ANeuralNetworksCompilation_createForDevices(add_model(), [hint, device])
    assert code == OK and CA(two, EXTENSION, 1, b"x", 1) == R.BAD_DATA
    # The reference driver supports no extension: nothing it could read.
    assert CA(_open_compilation(device), EXTENSION + ".other", 1, b"x", 1) == R.BAD_DATA


def test_execution_misuse_codes(hint, device):
    c = compiled(hint)
    e, *_ = execution(c)
    assert EA(None, EXTENSION, 1, b"x", 1) == R.UNEXPECTED_NULL
    assert EA(e, None, 1, b"x", 1) == R.UNEXPECTED_NULL
    assert EA(e, EXTENSION, 1, None, 1) == R.UNEXPECTED_NULL
    assert EA(e, "com.example.unknown", 1, b"x", 1) == R.BAD_DATA
    assert EA(e, EXTENSION, 1 << 16, b"x", 1) == R.BAD_DATA
    assert EA(e, EXTENSION, 1, b"x", 1) == OK
    assert EA(e, EXTENSION, 1, b"x", 1) == R.BAD_DATA  # once per attribute
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert EA(e, EXTENSION, 2, b"x", 1) == R.BAD_STATE  # started
    # An execution of a compilation that is not createForDevices with one device.
    code, plain = N.ANeuralNetworksCompilation_create(add_model())
    assert code == OK and N.ANeuralNetworksCompilation_finish(plain) == OK
    e2, *_ = execution(plain)
    assert EA(e2, EXTENSION, 1, b"x", 1) == R.BAD_DATA
    assert N.ANeuralNetworksExecution_compute(e2) == OK  # the execution is still usable


def test_one_prefix_per_name_for_the_process(hint):
    assert prefix_of(EXTENSION, []) == _prefix(hint)  # assigned once, kept
    assert prefix_of("com.example.never", [hint]) is None
