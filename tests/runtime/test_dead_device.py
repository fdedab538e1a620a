"""A device that dies under the runtime, without a service: DEAD_OBJECT where the runtime
cannot recover (createForDevices, a partitioned plan included), fallback to the reference
where it can (plain create), and death is never guessed (a DEVICE_UNAVAILABLE from a device
that does not say it is dead stays UNAVAILABLE_DEVICE). The served driver's death is tested
in tests/service/test_death_runtime.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_partition import EXPECTED, FakeDevice, chain_model, compile_on, ref, run

from nnhal.errors import NdkError
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import ErrorStatus, OperationType, Timing
from nnhal.runtime import Compilation, Device, ResultCode
from nnhal.runtime import devices as runtime_devices
from nnhal.runtime.codes import code_of_status
from nnhal.runtime.devices import is_dead
from nnhal.runtime.plan import PlanPrepared

O = OperationType
EVERY = {O.RELU, O.ADD, O.TANH}  # the chain model's operations
GONE = ErrorStatus.DEVICE_UNAVAILABLE


class _Prepared:
    """A prepared model that answers DEVICE_UNAVAILABLE once its device is gone."""

    def __init__(self, inner: Any, device: Dying):
        self.inner, self.device = inner, device

    def execute_synchronously(self, *a: Any, **k: Any) -> Any:
        if self.device.gone:
            return GONE, [], Timing()
        return self.inner.execute_synchronously(*a, **k)

    # The runtime calls AIDL v4's form; the canonical default forwards it to the one above.
    execute_synchronously_with_config = IPreparedModel.execute_synchronously_with_config

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Dying(FakeDevice):
    """A fake device (claiming ``types``) that can be made to go away: every call then
    answers DEVICE_UNAVAILABLE; ``says_dead`` makes its ``alive`` attribute false then too."""

    def __init__(self, types: set[int], says_dead: bool = True):
        super().__init__(types, exec_time=0.1, power=0.1)
        self.gone = False
        self.says_dead = says_dead

    @property
    def alive(self) -> bool:
        return not (self.gone and self.says_dead)

    def get_supported_operations(self, model: Any) -> Any:
        return (GONE, []) if self.gone else super().get_supported_operations(model)

    def prepare_model(self, model: Any, preference: Any, priority: Any, deadline: Any,
                      mc: Any, dc: Any, token: Any, callback: Any) -> Any:
        if self.gone:
            callback.notify(GONE, None)
            return GONE
        outer = self

        class Wrap:
            def notify(self, status: Any, pm: Any) -> None:
                callback.notify(status, _Prepared(pm, outer) if pm is not None else pm)

        return super().prepare_model(model, preference, priority, deadline, mc, dc, token,
                                     Wrap())


def dead_object(fn: Any) -> None:
    with pytest.raises(NdkError) as e:
        fn()
    assert e.value.code == ResultCode.DEAD_OBJECT, str(e.value)


def test_is_dead_only_when_the_driver_says_so():
    class Broken:
        @property
        def alive(self) -> bool:
            raise RuntimeError("no answer")

    assert not is_dead(object()) and not is_dead(Broken())
    dev = Dying({O.RELU})
    assert not is_dead(dev)
    dev.gone = True
    assert is_dead(dev) and Device.of(dev, "d").dead
    assert code_of_status(GONE, dead=True) == ResultCode.DEAD_OBJECT
    assert code_of_status(GONE) == ResultCode.UNAVAILABLE_DEVICE
    assert code_of_status(ErrorStatus.GENERAL_FAILURE, dead=True) == ResultCode.OP_FAILED


def test_for_devices_on_a_dead_device_is_dead_object():
    dev = Dying(EVERY)
    d = Device.of(dev, "dying")
    c = compile_on(chain_model(), [d])
    np.testing.assert_allclose(run(c), EXPECTED, rtol=1e-6)
    dev.gone = True
    dead_object(lambda: run(c))
    dead_object(lambda: compile_on(chain_model(), [d]))  # it seems to support nothing
    dead_object(d.wait)
    dead_object(lambda: chain_model().supported_operations_for_devices([d]))


def test_a_partitioned_for_devices_plan_with_a_dead_step_is_dead_object():
    dev = Dying({O.RELU, O.TANH})
    c = compile_on(chain_model(), [ref(), Device.of(dev, "dying")])
    assert isinstance(c.prepared, PlanPrepared)
    assert [s["device"] for s in c.plan()] == ["dying", "reference", "dying"]
    dev.gone = True
    dead_object(lambda: run(c))
    assert c.fallbacks == 0  # createForDevices never falls back


def test_plain_create_falls_back_when_a_step_device_dies(monkeypatch):
    dev = Dying({O.RELU, O.TANH})
    reference = [d for d in runtime_devices() if d.name == "reference"]
    monkeypatch.setattr("nnhal.runtime.compilation.devices",
                        lambda: [*reference, Device.of(dev, "dying")])
    c = Compilation(chain_model())
    c.finish()
    assert isinstance(c.prepared, PlanPrepared)
    dev.gone = True
    np.testing.assert_allclose(run(c), EXPECTED, rtol=1e-6)
    assert c.fallbacks == 1
    later = Compilation(chain_model())  # the dead device supports nothing now
    later.finish()
    assert [s["device"] for s in later.plan()] == ["reference"]
    np.testing.assert_allclose(run(later), EXPECTED, rtol=1e-6)


def test_unavailable_but_not_dead_stays_unavailable_device():
    dev = Dying(EVERY, says_dead=False)
    d = Device.of(dev, "flaky")
    c = compile_on(chain_model(), [d])
    dev.gone = True
    with pytest.raises(NdkError) as e:
        run(c)
    assert e.value.code == ResultCode.UNAVAILABLE_DEVICE
    with pytest.raises(NdkError) as e:
        compile_on(chain_model(), [d])
    assert e.value.code == ResultCode.BAD_DATA
