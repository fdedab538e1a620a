"""NDK compilation rules, with exact result codes."""

from __future__ import annotations

import os

from ndk_helpers import OK, add_model, compiled, execution

from nnhal.runtime import ndk as N
from nnhal.runtime.codes import ResultCode as R


def test_create_on_unfinished_model_is_bad_state():
    assert N.ANeuralNetworksCompilation_create(add_model(finish=False))[0] == R.BAD_STATE


def test_create_null_model_is_unexpected_null():
    assert N.ANeuralNetworksCompilation_create(None) == (R.UNEXPECTED_NULL, None)


def test_create_for_devices_rules(device):
    f = N.ANeuralNetworksCompilation_createForDevices
    assert f(add_model(), [])[0] == R.BAD_DATA
    assert f(add_model(), [device, device])[0] == R.BAD_DATA
    assert f(add_model(), [None])[0] == R.UNEXPECTED_NULL
    assert f(add_model(), None)[0] == R.UNEXPECTED_NULL
    assert f(add_model(finish=False), [device])[0] == R.BAD_STATE


def test_set_preference_rules(device):
    code, c = N.ANeuralNetworksCompilation_createForDevices(add_model(), [device])
    assert N.ANeuralNetworksCompilation_setPreference(c, 3) == R.BAD_DATA
    assert N.ANeuralNetworksCompilation_setPreference(c, 0) == OK
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    assert N.ANeuralNetworksCompilation_setPreference(c, 1) == R.BAD_STATE


def test_set_priority_rules(device):
    code, c = N.ANeuralNetworksCompilation_createForDevices(add_model(), [device])
    assert N.ANeuralNetworksCompilation_setPriority(c, 1) == R.BAD_DATA  # HAL value, not NDK
    assert N.ANeuralNetworksCompilation_setPriority(c, 110) == OK
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    assert N.ANeuralNetworksCompilation_setPriority(c, 90) == R.BAD_STATE


def test_set_timeout_only_for_one_explicit_device(device):
    code, c = N.ANeuralNetworksCompilation_create(add_model())
    assert N.ANeuralNetworksCompilation_setTimeout(c, 10**9) == R.BAD_DATA
    code, c = N.ANeuralNetworksCompilation_createForDevices(add_model(), [device])
    assert N.ANeuralNetworksCompilation_setTimeout(c, 10**9) == OK
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    assert N.ANeuralNetworksCompilation_setTimeout(c, 10**9) == R.BAD_STATE


def test_set_caching_rules(device, tmp_path):
    code, c = N.ANeuralNetworksCompilation_createForDevices(add_model(), [device])
    f = N.ANeuralNetworksCompilation_setCaching
    assert f(c, str(tmp_path), b"\1" * 31) == R.BAD_DATA
    assert f(c, None, b"\1" * 32) == R.UNEXPECTED_NULL
    assert f(c, str(tmp_path), None) == R.UNEXPECTED_NULL
    assert f(c, str(tmp_path), b"\1" * 32) == OK


def test_caching_writes_files_and_a_second_compilation_reads_them(device, tmp_path,
                                                                  monkeypatch):
    calls = []
    real = device.hal.prepare_model_from_cache

    def spy(*args):
        status = real(*args)
        calls.append(status)
        return status

    monkeypatch.setattr(device.hal, "prepare_model_from_cache", spy)
    for _ in range(2):
        code, c = N.ANeuralNetworksCompilation_createForDevices(add_model(), [device])
        assert N.ANeuralNetworksCompilation_setCaching(c, str(tmp_path), b"\7" * 32) == OK
        assert N.ANeuralNetworksCompilation_finish(c) == OK
    files = sorted(os.listdir(tmp_path))
    assert any(f.endswith("_m0") and os.path.getsize(tmp_path / f) > 0 for f in files)
    assert calls == [0]  # the second compilation came from the cache
    e, *_, out = execution(c)
    assert N.ANeuralNetworksExecution_compute(e) == OK and out[0, 2] == 3.0


def test_finish_twice_is_bad_state(device):
    c = compiled(device)
    assert N.ANeuralNetworksCompilation_finish(c) == R.BAD_STATE


def test_plain_create_picks_an_available_device():
    code, c = N.ANeuralNetworksCompilation_create(add_model())
    assert code == OK and N.ANeuralNetworksCompilation_finish(c) == OK
    assert c.device is not None


def test_devices_are_listed_with_their_properties():
    code, n = N.ANeuralNetworks_getDeviceCount()
    assert code == OK and n >= 1
    code, d = N.ANeuralNetworks_getDevice(0)
    assert code == OK
    assert N.ANeuralNetworksDevice_getName(d) == (OK, "reference")
    assert N.ANeuralNetworksDevice_getType(d) == (OK, 2)  # CPU
    assert N.ANeuralNetworksDevice_getFeatureLevel(d) == (OK, 1000008)  # AIDL v4
    assert N.ANeuralNetworksDevice_getVersion(d)[0] == OK
    assert N.ANeuralNetworksDevice_wait(d) == OK
    assert N.ANeuralNetworks_getDevice(n)[0] == R.BAD_DATA
    assert N.ANeuralNetworksDevice_getName(None)[0] == R.UNEXPECTED_NULL


def test_loop_timeouts():
    assert N.ANeuralNetworks_getDefaultLoopTimeout() == 2 * 10**9
    assert N.ANeuralNetworks_getMaximumLoopTimeout() == 15 * 10**9
    assert N.ANeuralNetworks_getRuntimeFeatureLevel() == 1000008


def _device_with(exec_time: float, power: float, name: str):
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.hal.types import ErrorStatus, PerformanceInfo
    from nnhal.runtime import Device

    class Tuned(ReferenceDevice):
        def get_capabilities(self):
            status, caps = super().get_capabilities()
            perf = PerformanceInfo(exec_time, power)
            caps.operand_performance = [type(p)(p.type, perf) for p in caps.operand_performance]
            return ErrorStatus.NONE, caps

    return Device.of(Tuned(), name)


def test_plain_create_prefers_by_capabilities_and_preference(monkeypatch):
    import nnhal.runtime.compilation as comp

    fast = _device_with(0.5, 2.0, "fast")
    frugal = _device_with(2.0, 0.5, "frugal")
    monkeypatch.setattr(comp, "devices", lambda: [frugal, fast])
    code, c = N.ANeuralNetworksCompilation_create(add_model())
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    assert c.device is fast  # FAST_SINGLE_ANSWER by default
    code, c = N.ANeuralNetworksCompilation_create(add_model())
    assert N.ANeuralNetworksCompilation_setPreference(c, 0) == OK  # LOW_POWER
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    assert c.device is frugal


def test_explicit_devices_that_do_not_support_the_model_are_bad_data(device, monkeypatch):
    from nnhal.hal.types import ErrorStatus

    monkeypatch.setattr(device.hal, "get_supported_operations",
                        lambda model: (ErrorStatus.NONE, [False] * len(model.main.operations)))
    code, c = N.ANeuralNetworksCompilation_createForDevices(add_model(), [device])
    assert N.ANeuralNetworksCompilation_finish(c) == R.BAD_DATA
    assert N.ANeuralNetworksExecution_create(c)[0] == R.BAD_STATE
