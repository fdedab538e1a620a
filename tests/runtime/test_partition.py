"""Partitioning across devices: the choice by preference and capabilities, step boundaries,
values crossing steps, control flow, CPU fallback, createForDevices without fallback, and
Compilation.plan()."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from nnhal.drivers.reference import ReferenceDevice
from nnhal.errors import NdkError
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.interfaces import IDevice
from nnhal.hal.types import (
    Capabilities,
    ErrorStatus,
    OperandPerformance,
    OperandType,
    OperationType,
    PerformanceInfo,
    Timing,
)
from nnhal.runtime import Compilation, Device, Execution, PreferenceCode, ResultCode
from nnhal.runtime import NdkModel as RtModel
from nnhal.runtime import devices as runtime_devices
from nnhal.runtime.plan import FallbackPrepared, PlanPrepared

T, O = OperandType, OperationType
F32 = T.TENSOR_FLOAT32


class _FailingPrepared:
    """A prepared model whose every execution fails with a general failure."""

    def __init__(self, inner: Any, log: list[str]):
        self.inner, self.log = inner, log

    def execute_synchronously(self, *a: Any, **k: Any) -> Any:
        self.log.append("execute")
        return ErrorStatus.GENERAL_FAILURE, [], Timing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FakeDevice(IDevice):
    """A reference device that claims only ``types``, with the given performance; it can
    fail to prepare or to execute, and refuses to prepare a model with other types."""

    def __init__(self, types: set[int], exec_time: float = 0.5, power: float = 0.5, *,
                 fail_prepare: bool = False, fail_execute: bool = False):
        self.inner = ReferenceDevice()
        self.types, self.perf = {int(t) for t in types}, PerformanceInfo(exec_time, power)
        self.fail_prepare, self.fail_execute = fail_prepare, fail_execute
        self.prepared: list[Any] = []
        self.log: list[str] = []

    def get_capabilities(self) -> Any:
        p = self.perf
        return ErrorStatus.NONE, Capabilities(p, p, [OperandPerformance(int(t), p) for t in
                                                     (T.FLOAT32, T.INT32, F32, T.TENSOR_INT32,
                                                      T.TENSOR_BOOL8, T.BOOL)], p, p)

    def _all_types(self, model: Any) -> bool:
        return all(int(op.type) in self.types for sg in (model.main, *model.referenced)
                   for op in sg.operations)

    def get_supported_operations(self, model: Any) -> Any:
        sub = all(int(op.type) in self.types for sg in model.referenced
                  for op in sg.operations)
        return ErrorStatus.NONE, [int(op.type) in self.types and
                                  (sub or op.type not in (O.IF, O.WHILE))
                                  for op in model.main.operations]

    def get_type(self) -> Any:
        return self.inner.get_type()

    def get_version_string(self) -> Any:
        return ErrorStatus.NONE, "fake-1"

    def get_supported_extensions(self) -> Any:
        return ErrorStatus.NONE, []

    def get_number_of_cache_files_needed(self) -> Any:
        return ErrorStatus.NONE, 0, 0

    def prepare_model(self, model: Any, preference: Any, priority: Any, deadline: Any,
                      mc: Any, dc: Any, token: Any, callback: Any) -> Any:
        if self.fail_prepare or not self._all_types(model):
            callback.notify(ErrorStatus.GENERAL_FAILURE, None)
            return ErrorStatus.GENERAL_FAILURE
        self.prepared.append(model)
        if not self.fail_execute:
            return self.inner.prepare_model(model, preference, priority, deadline, mc, dc,
                                            token, callback)

        class Wrap:
            def notify(_s, status: Any, pm: Any) -> None:
                callback.notify(status, _FailingPrepared(pm, self.log) if pm else pm)

        return self.inner.prepare_model(model, preference, priority, deadline, mc, dc, token,
                                        Wrap())

    def prepare_model_from_cache(self, *a: Any) -> Any:
        a[-1].notify(ErrorStatus.GENERAL_FAILURE, None)
        return ErrorStatus.GENERAL_FAILURE

    def allocate(self, *a: Any) -> Any:
        return ErrorStatus.GENERAL_FAILURE, None, 0


def chain_model() -> Any:
    """x -> RELU -> ADD y -> TANH -> out: three operations, each [4] float."""
    b = ModelBuilder()
    x, y = b.input(F32, [4]), b.input(F32, [4])
    r, s = b.operand(F32, [4]), b.operand(F32, [4])
    out = b.output(F32, [4])
    b.operation(O.RELU, [x], [r])
    b.operation(O.ADD, [r, y, b.scalar(T.INT32, 0)], [s])
    b.operation(O.TANH, [s], [out])
    return RtModel.from_hal(b.build())


X = np.array([-1, 0.5, 2, -3], np.float32)
Y = np.array([1, 1, -1, 0.25], np.float32)
EXPECTED = np.tanh(np.maximum(X, 0) + Y)


def run(c: Compilation, x: np.ndarray = X, y: np.ndarray = Y) -> np.ndarray:
    out = np.zeros(4, np.float32)
    e = Execution(c)
    e.set_input(0, None, x)
    e.set_input(1, None, y)
    e.set_output(0, None, out)
    e.compute()
    return out


def ref() -> Device:
    return Device.of(ReferenceDevice(), "reference")


def compile_on(model: Any, devs: list[Device], preference: int | None = None) -> Compilation:
    c = Compilation.for_devices(model, devs)
    if preference is not None:
        c.set_preference(preference)
    c.finish()
    return c


def test_operations_go_to_the_faster_device_and_runs_form_steps():
    fake = Device.of(FakeDevice({O.RELU, O.TANH}), "fake")
    c = compile_on(chain_model(), [ref(), fake])
    plan = c.plan()
    assert [(s["device"], s["operations"]) for s in plan] == \
        [("fake", [0]), ("reference", [1]), ("fake", [2])]
    # Inputs/outputs: model operands crossing steps (x=0, y=1, r=2, s=3, out=4).
    assert [(s["inputs"], s["outputs"]) for s in plan] == [([0], [2]), ([2, 1], [3]),
                                                           ([3], [4])]
    assert isinstance(c.prepared, PlanPrepared)
    np.testing.assert_allclose(run(c), EXPECTED, rtol=1e-6)
    np.testing.assert_allclose(run(c, -X, Y), np.tanh(np.maximum(-X, 0) + Y), rtol=1e-6)


def test_repeated_runs_reuse_each_steps_request():
    """A step run again with alike arguments gets the very request of its last run (its driver
    recognises it: nothing checked or bound again, no memory taken), with this run's values."""
    fake = Device.of(FakeDevice({O.RELU, O.TANH}), "fake")
    c = compile_on(chain_model(), [ref(), fake])
    seen: list[list[int]] = [[] for _ in c.steps]
    for k, step in enumerate(c.steps):
        real = step.prepared.execute_synchronously

        def spy(request, *a, _real=real, _k=k, **kw):
            seen[_k].append(id(request))
            return _real(request, *a, **kw)

        step.prepared.execute_synchronously = spy
    rng = np.random.default_rng(0)
    for _ in range(4):
        x, y = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(
            np.float32)
        np.testing.assert_allclose(run(c, x, y), np.tanh(np.maximum(x, 0) + y), rtol=1e-6)
    assert all(len(ids) == 4 and len(set(ids)) == 1 for ids in seen), seen


def test_each_step_is_its_own_sub_model_with_only_its_operations():
    dev = FakeDevice({O.RELU, O.TANH})
    c = compile_on(chain_model(), [ref(), Device.of(dev, "fake")])
    assert [[int(op.type) for op in m.main.operations] for m in dev.prepared] == \
        [[int(O.RELU)], [int(O.TANH)]]
    sub = c.steps[1].model.main
    assert [int(op.type) for op in sub.operations] == [int(O.ADD)]
    assert len(sub.input_indexes) == 2 and len(sub.output_indexes) == 1


def test_preference_decides_between_fast_and_low_power_devices():
    every = {O.RELU, O.ADD, O.TANH}
    fast = Device.of(FakeDevice(every, exec_time=0.1, power=2.0), "fast")
    frugal = Device.of(FakeDevice(every, exec_time=2.0, power=0.1), "frugal")
    for pref, want in ((PreferenceCode.FAST_SINGLE_ANSWER, "fast"),
                       (PreferenceCode.SUSTAINED_SPEED, "fast"),
                       (PreferenceCode.LOW_POWER, "frugal")):
        c = compile_on(chain_model(), [fast, frugal], int(pref))
        assert [s["device"] for s in c.plan()] == [want]
        np.testing.assert_allclose(run(c), EXPECTED, rtol=1e-6)


def test_one_device_for_everything_is_the_fast_path_without_runtime_memory():
    r = ref()
    slow = Device.of(FakeDevice({O.RELU, O.ADD, O.TANH}, exec_time=5, power=5), "slow")
    c = compile_on(chain_model(), [r, slow])
    assert c.plan() == [{"device": "reference", "operations": [0, 1, 2], "inputs": [0, 1],
                         "outputs": [4]}]
    assert not isinstance(c.prepared, (PlanPrepared, FallbackPrepared))
    assert c.device is r


def test_create_for_devices_that_cannot_run_an_operation_is_bad_data():
    fake = Device.of(FakeDevice({O.RELU}), "fake")
    with pytest.raises(NdkError) as e:
        compile_on(chain_model(), [fake])
    assert e.value.code == ResultCode.BAD_DATA


def test_create_for_devices_never_falls_back():
    fake = Device.of(FakeDevice({O.RELU, O.TANH}, fail_execute=True), "fake")
    c = compile_on(chain_model(), [ref(), fake])
    with pytest.raises(NdkError) as e:
        run(c)
    assert e.value.code == ResultCode.OP_FAILED
    assert c.fallbacks == 0
    bad = Device.of(FakeDevice({O.RELU, O.TANH}, fail_prepare=True), "bad")
    with pytest.raises(NdkError) as e:
        compile_on(chain_model(), [ref(), bad])
    assert e.value.code == ResultCode.OP_FAILED


def _plain(monkeypatch: pytest.MonkeyPatch, extra: Device) -> Compilation:
    """Plain create over the process's reference device plus ``extra``."""
    reference = [d for d in runtime_devices() if d.name == "reference"]
    monkeypatch.setattr("nnhal.runtime.compilation.devices", lambda: [*reference, extra])
    c = Compilation(chain_model())
    c.finish()
    return c


def test_plain_create_falls_back_to_the_reference_when_a_step_fails_at_execute(monkeypatch):
    dev = FakeDevice({O.RELU, O.TANH}, fail_execute=True)
    c = _plain(monkeypatch, Device.of(dev, "fake"))
    assert len(c.plan()) == 3
    np.testing.assert_allclose(run(c), EXPECTED, rtol=1e-6)
    assert dev.log == ["execute"] and c.fallbacks == 1
    np.testing.assert_allclose(run(c, -X), np.tanh(np.maximum(-X, 0) + Y), rtol=1e-6)
    assert c.fallbacks == 2


def test_plain_create_falls_back_when_the_whole_model_fails_at_execute(monkeypatch):
    dev = FakeDevice({O.RELU, O.ADD, O.TANH}, fail_execute=True)
    c = _plain(monkeypatch, Device.of(dev, "fake"))
    assert [s["device"] for s in c.plan()] == ["fake"]
    assert isinstance(c.prepared, FallbackPrepared)
    np.testing.assert_allclose(run(c), EXPECTED, rtol=1e-6)
    assert dev.log == ["execute"] and c.fallbacks == 1


def test_plain_create_falls_back_when_a_step_fails_to_prepare(monkeypatch):
    c = _plain(monkeypatch, Device.of(FakeDevice({O.RELU, O.TANH}, fail_prepare=True),
                                      "fake"))
    assert [s["device"] for s in c.plan()] == ["reference"] and c.fell_back
    np.testing.assert_allclose(run(c), EXPECTED, rtol=1e-6)


def test_plan_before_finish_is_bad_state():
    c = Compilation.for_devices(chain_model(), [ref()])
    with pytest.raises(NdkError) as e:
        c.plan()
    assert e.value.code == ResultCode.BAD_STATE


def dynamic_model() -> Any:
    """x [6] -> RESHAPE by a runtime shape input (unknown output) -> RELU -> out."""
    b = ModelBuilder()
    x = b.input(F32, [6])
    shape = b.input(T.TENSOR_INT32, [2])
    r = b.operand(F32, [0, 0])
    out = b.output(F32, [0, 0])
    b.operation(O.RESHAPE, [x, shape], [r])
    b.operation(O.RELU, [r], [out])
    return RtModel.from_hal(b.build())


def test_a_value_of_unknown_size_crosses_steps():
    fake = Device.of(FakeDevice({O.RELU}), "fake")
    c = compile_on(dynamic_model(), [ref(), fake])
    assert [s["device"] for s in c.plan()] == ["reference", "fake"]
    for shape in ([2, 3], [3, 2], [1, 6]):
        x = np.arange(-3, 3, dtype=np.float32)
        out = np.zeros(6, np.float32)
        e = Execution(c)
        e.set_input(0, None, x)
        e.set_input(1, None, np.array(shape, np.int32))
        e.set_output(0, None, out)
        e.compute()
        assert e.output_operand_dimensions(0) == shape
        np.testing.assert_array_equal(out, np.maximum(x, 0))


def if_model() -> Any:
    """out = IF(c, then: t + t, else: t * t) of t = RELU(x), then TANH."""
    b = ModelBuilder()

    def branch(op: OperationType) -> Any:
        sb = b.subgraph()
        t = sb.input(F32, [4])
        o = sb.output(F32, [4])
        sb.operation(op, [t, t, sb.scalar(T.INT32, 0)], [o])
        return sb

    then, other = branch(O.ADD), branch(O.MUL)
    x, cond = b.input(F32, [4]), b.input(T.TENSOR_BOOL8, [1])
    t, v = b.operand(F32, [4]), b.operand(F32, [4])
    out = b.output(F32, [4])
    b.operation(O.RELU, [x], [t])
    b.operation(O.IF, [cond, b.reference(then), b.reference(other), t], [v])
    b.operation(O.TANH, [v], [out])
    return RtModel.from_hal(b.build())


@pytest.mark.parametrize("claims, want", [
    # The reference would run the IF whole: the runtime runs it instead (upstream's rule for
    # its CPU device), its bodies partitioned (here both on the reference).
    ({O.RELU, O.TANH}, ["fake", "runtime", "fake"]),
    ({O.RELU, O.TANH, O.ADD}, ["fake", "runtime", "fake"]),  # then on fake, else on reference
    ({O.IF, O.ADD, O.MUL}, ["reference", "fake", "reference"]),  # IF with bodies on fake
])
def test_control_flow_stays_in_a_step_with_its_bodies(claims, want):
    dev = FakeDevice(claims)
    c = compile_on(if_model(), [ref(), Device.of(dev, "fake")])
    assert [s["device"] for s in c.plan()] == want
    x = np.array([-1, 0.5, 2, 3], np.float32)
    for cond, body in ((True, lambda t: t + t), (False, lambda t: t * t)):
        out = np.zeros(4, np.float32)
        e = Execution(c)
        e.set_input(0, None, x)
        e.set_input(1, None, np.array([cond]))
        e.set_output(0, None, out)
        e.compute()
        np.testing.assert_allclose(out, np.tanh(body(np.maximum(x, 0))), rtol=1e-6)


def test_the_runtime_runs_an_if_no_device_supports_with_its_bodies():
    dev = FakeDevice({O.RELU, O.TANH, O.ADD, O.MUL})  # every body operation, not IF
    c = compile_on(if_model(), [Device.of(dev, "fake")])
    plan = c.plan()
    assert [s["device"] for s in plan] == ["fake", "runtime", "fake"]
    assert plan[1]["operations"] == [1]
    x = np.array([-1, 0.5, 2, 3], np.float32)
    for cond, body in ((True, lambda t: t + t), (False, lambda t: t * t)):
        out = np.zeros(4, np.float32)
        e = Execution(c)
        e.set_input(0, None, x)
        e.set_input(1, None, np.array([cond]))
        e.set_output(0, None, out)
        e.compute()
        np.testing.assert_allclose(out, np.tanh(body(np.maximum(x, 0))), rtol=1e-6)
    # Each body was prepared on the fake device as a model of its own.
    assert sorted(int(m.main.operations[0].type) for m in dev.prepared
                  if len(m.main.operations) == 1 and not m.referenced) == \
        sorted([int(O.RELU), int(O.ADD), int(O.MUL), int(O.TANH)])


def while_model() -> Any:
    """x = x + 1 while x < limit (x [1] loop-carried, limit [1] input-only)."""
    b = ModelBuilder()
    cond = b.subgraph()
    cx, cl = cond.input(F32, [1]), cond.input(F32, [1])
    co = cond.output(T.TENSOR_BOOL8, [1])
    cond.operation(O.LESS, [cx, cl], [co])
    body = b.subgraph()
    bx, _bl = body.input(F32, [1]), body.input(F32, [1])
    bo = body.output(F32, [1])
    body.operation(O.ADD, [bx, body.constant(F32, np.ones(1, np.float32)),
                           body.scalar(T.INT32, 0)], [bo])
    x, limit = b.input(F32, [1]), b.input(F32, [1])
    out = b.output(F32, [1])
    b.operation(O.WHILE, [b.reference(cond), b.reference(body), x, limit], [out])
    return RtModel.from_hal(b.build())


def _run_while(c: Compilation, x: float, limit: float, loop_timeout: int | None = None
               ) -> np.ndarray:
    out = np.zeros(1, np.float32)
    e = Execution(c)
    if loop_timeout is not None:
        e.set_loop_timeout(loop_timeout)
    e.set_input(0, None, np.array([x], np.float32))
    e.set_input(1, None, np.array([limit], np.float32))
    e.set_output(0, None, out)
    e.compute()
    return out


def test_the_runtime_runs_a_while_no_device_supports_and_enforces_the_loop_timeout():
    c = compile_on(while_model(), [Device.of(FakeDevice({O.LESS, O.ADD}), "fake")])
    assert [s["device"] for s in c.plan()] == ["runtime"]
    assert _run_while(c, 0.5, 4)[0] == 4.5
    assert _run_while(c, 7, 4)[0] == 7  # the body never runs
    with pytest.raises(NdkError) as e:
        _run_while(c, 0, 1e9, loop_timeout=1_000_000)  # 1 ms: far too short
    assert e.value.code == ResultCode.MISSED_DEADLINE_TRANSIENT


def test_a_body_no_device_supports_fails_the_compilation():
    with pytest.raises(NdkError) as e:
        compile_on(while_model(), [Device.of(FakeDevice({O.LESS}), "fake")])
    assert e.value.code == ResultCode.BAD_DATA


class CachingFake(FakeDevice):
    """A FakeDevice that caches like the reference driver and counts cache hits."""

    def __init__(self, types: set[int]):
        super().__init__(types)
        self.hits = 0

    def get_number_of_cache_files_needed(self) -> Any:
        return self.inner.get_number_of_cache_files_needed()

    def prepare_model_from_cache(self, *a: Any) -> Any:
        status = self.inner.prepare_model_from_cache(*a)
        self.hits += status == ErrorStatus.NONE
        return status


def test_each_step_is_cached_under_its_own_token(tmp_path):
    """setCaching on a split compilation caches every step; a second compilation of the same
    model over the same devices prepares every step from the cache, and still computes."""
    fake, reference = CachingFake({O.RELU, O.TANH}), ReferenceDevice()
    hits: list[int] = []
    real = reference.prepare_model_from_cache

    def spy(*a: Any) -> Any:
        status = real(*a)
        hits.append(int(status))
        return status

    reference.prepare_model_from_cache = spy  # type: ignore[method-assign]
    devs = [Device.of(reference, "reference"), Device.of(fake, "fake")]
    for _ in range(2):
        c = Compilation.for_devices(chain_model(), devs)
        c.set_caching(str(tmp_path), b"\3" * 32)
        c.finish()
        assert [s["device"] for s in c.plan()] == ["fake", "reference", "fake"]
        np.testing.assert_allclose(run(c), EXPECTED, rtol=1e-6)
    assert fake.hits == 2 and hits == [0]  # both fake steps and the reference step
    # Another split (other devices' preference) does not find those steps.
    c = Compilation.for_devices(chain_model(), devs)
    c.set_preference(PreferenceCode.LOW_POWER)
    c.set_caching(str(tmp_path), b"\3" * 32)
    c.finish()
    assert fake.hits == 2 and hits == [0]


def test_a_step_reading_only_constants_is_fed_one_of_them():
    """A HAL model needs an input: the step of ADD(c1, c2) gets c1 as its input, which the
    runtime feeds from the model's value (it was refused before)."""
    b = ModelBuilder()
    x = b.input(F32, [4])
    c1 = b.constant(F32, np.array([1, 2, 3, 4], np.float32))
    c2 = b.constant(F32, np.array([10, 20, 30, 40], np.float32))
    t, out = b.operand(F32, [4]), b.output(F32, [4])
    b.operation(O.ADD, [c1, c2, b.scalar(T.INT32, 0)], [t])
    b.operation(O.MUL, [t, x, b.scalar(T.INT32, 0)], [out])
    c = compile_on(RtModel.from_hal(b.build()), [ref(), Device.of(FakeDevice({O.MUL}), "fake")])
    plan = c.plan()
    assert [s["device"] for s in plan] == ["reference", "fake"]
    assert len(plan[0]["inputs"]) == 1  # the constant c1, fed by the runtime
    out_v = np.zeros(4, np.float32)
    e = Execution(c)
    e.set_input(0, None, np.full(4, 2, np.float32))
    e.set_output(0, None, out_v)
    e.compute()
    np.testing.assert_array_equal(out_v, [22, 44, 66, 88])
