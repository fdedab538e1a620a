"""Mode ``partitioned``: each case through the NNAPI runtime split across two devices.

The model is built through the NDK calls as in mode ``runtime`` and compiled with
createForDevices over the device under test and :class:`HalfDevice`, a second reference device
that claims only a random half of the operation types and reports better capabilities than the
device under test (half its times), so the
partitioner gives it every operation it can. The half is drawn per case, from the printed base
seed and the case's name (so any case is reproducible), and drawn again (up to
:data:`MAX_DRAWS` times) until the model's operations fall on both devices, IF/WHILE bodies
included (the runtime runs a control-flow operation the reference would run whole, and
partitions its bodies). HalfDevice refuses to prepare a model containing a type it does not
claim, so an operation partitioned to the wrong device fails loudly; createForDevices never
falls back. The results must equal the reference's (the usual tolerances), through compute,
startCompute, burst and a reusable execution; the case's message says whether the compiled
plan really used both devices ("split") and the summary counts them. Both devices are
reached through the run's face (``--hal``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from nnhal.conformance.cases import Case
from nnhal.conformance.faces import through
from nnhal.conformance.mode_runtime import (
    PATHS,
    _compile_and_run,
    build_case,
)
from nnhal.conformance.runner import (
    SPLIT_MESSAGE,
    CaseFailure,
    ExpectedFailureSeen,
    Options,
    Unsupported,
)
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.interfaces import IDevice
from nnhal.hal.types import (
    Capabilities,
    ErrorStatus,
    Model,
    OperandLifeTime,
    OperandPerformance,
    OperationType,
    PerformanceInfo,
)
from nnhal.runtime import ndk as N
from nnhal.runtime.codes import ResultCode
from nnhal.runtime.devices import Device

#: The seed of the half of the operation types the test driver claims (printed at start).
DEFAULT_SEED = 14


#: How many halves are drawn for a case before settling for one that does not split it.
MAX_DRAWS = 16


def half_of_types(seed: int = DEFAULT_SEED, case: str | None = None,
                  draw: int = 0) -> frozenset[int]:
    """A random half of the operation types (control flow included): the base seed's own half,
    or draw ``draw`` of a case's (seeded by the base seed, the case's name and the draw)."""
    types = sorted(int(t) for t in OperationType if int(t) < 10000)
    rng = random.Random(seed if case is None else f"{seed}/{case}/{draw}")
    return frozenset(rng.sample(types, len(types) // 2))


def describe(seed: int = DEFAULT_SEED) -> str:
    """One line naming the base seed and how each case's half is drawn."""
    n = len([t for t in OperationType if int(t) < 10000]) // 2
    return (f"partitioned: test driver 'half' claims {n} operation types, drawn per case "
            f"from base seed {seed} and the case name (up to {MAX_DRAWS} draws until the "
            f"model is split)")


def _devices_used(half: HalfDevice, model: Model, sg_index: int, seen: set[int]) -> set[str]:
    """Which devices the partitioner puts a subgraph's operations on, the reference under test
    claiming every operation: "half" for those HalfDevice claims (bodies included), an
    unclaimed IF/WHILE run by the runtime with its bodies partitioned alike."""
    sg = model.main if sg_index < 0 else model.referenced[sg_index]
    used: set[str] = set()
    for op in sg.operations:
        bodies = [int(sg.operands[i].location.offset) for i in op.inputs
                  if sg.operands[i].lifetime == OperandLifeTime.SUBGRAPH]
        bodies = [k for k in bodies if 0 <= k < len(model.referenced)]
        if int(op.type) in half.types and all(half._types_ok(model, k, {k}) for k in bodies):
            used.add("half")
        elif int(op.type) in (int(OperationType.IF), int(OperationType.WHILE)):
            for k in bodies:
                if k not in seen:
                    used |= _devices_used(half, model, k, seen | {k})
        else:
            used.add("reference")
    return used


def half_for(case: str, model: Model, seed: int = DEFAULT_SEED) -> tuple[frozenset[int], int]:
    """The case's half and its draw: the first draw that splits the model, else the last."""
    types = frozenset()
    for draw in range(MAX_DRAWS):
        types = half_of_types(seed, case, draw)
        if len(_devices_used(HalfDevice(types, _inner()), model, -1, set())) > 1:
            return types, draw
    return types, MAX_DRAWS - 1


def plan_devices(steps: Sequence[Any]) -> set[str]:
    """The devices a compiled plan runs on, through the plans of runtime-run IF/WHILE bodies."""
    used: set[str] = set()
    for step in steps:
        if step.device is not None:
            used.add(step.device.name)
        for branch in step.branches.values():
            used |= plan_devices(branch.steps)
    return used


def _better(p: PerformanceInfo) -> PerformanceInfo:
    return PerformanceInfo(p.exec_time * 0.5, p.power_usage * 0.5)


class HalfDevice(IDevice):
    """A reference device claiming only some operation types (a test driver)."""

    def __init__(self, types: frozenset[int], inner: IDevice | None = None,
                 rival: IDevice | None = None):
        self.types = types
        self.inner = inner or ReferenceDevice()
        #: The device under test: the claimed half must look faster than it, else a fast
        #: driver (LiteRT) would take every operation and nothing would be split.
        self.rival = rival or self.inner
        self.name = "half"

    def _types_ok(self, model: Model, sg_index: int, seen: set[int]) -> bool:
        """Whether every operation of a subgraph (and what it references) is claimed."""
        sg = model.main if sg_index < 0 else model.referenced[sg_index]
        for op in sg.operations:
            if int(op.type) not in self.types:
                return False
            for i in op.inputs:
                o = sg.operands[i]
                if o.lifetime == OperandLifeTime.SUBGRAPH:
                    k = int(o.location.offset)
                    if k in seen or not 0 <= k < len(model.referenced):
                        continue
                    seen.add(k)
                    if not self._types_ok(model, k, seen):
                        return False
        return True

    def _op_ok(self, model: Model, op: Any) -> bool:
        if int(op.type) not in self.types:
            return False
        for i in op.inputs:
            o = model.main.operands[i]
            if o.lifetime == OperandLifeTime.SUBGRAPH:
                k = int(o.location.offset)
                if not 0 <= k < len(model.referenced) or not self._types_ok(model, k, {k}):
                    return False
        return True

    def get_capabilities(self) -> tuple[ErrorStatus, Capabilities | None]:
        status, caps = self.rival.get_capabilities()
        if status != ErrorStatus.NONE or caps is None:
            return status, caps
        return status, Capabilities(
            _better(caps.relaxed_float32_to_float16_performance_scalar),
            _better(caps.relaxed_float32_to_float16_performance_tensor),
            [OperandPerformance(p.type, _better(p.info)) for p in caps.operand_performance],
            _better(caps.if_performance), _better(caps.while_performance))

    def get_supported_operations(self, model: Model) -> tuple[ErrorStatus, list[bool]]:
        status, flags = self.inner.get_supported_operations(model)
        if status != ErrorStatus.NONE:
            return status, flags
        return status, [bool(f) and self._op_ok(model, op)
                        for f, op in zip(flags, model.main.operations)]

    def get_type(self) -> Any:
        return self.inner.get_type()

    def get_version_string(self) -> tuple[ErrorStatus, str]:
        return ErrorStatus.NONE, "nnhal-half-1"

    def get_supported_extensions(self) -> Any:
        return self.inner.get_supported_extensions()

    def get_number_of_cache_files_needed(self) -> tuple[ErrorStatus, int, int]:
        return ErrorStatus.NONE, 0, 0

    def prepare_model(self, model: Model, preference: Any, priority: Any,
                      deadline: int | None, model_cache: Sequence[int],
                      data_cache: Sequence[int], token: bytes, callback: Any) -> ErrorStatus:
        if not self._types_ok(model, -1, set()):
            callback.notify(ErrorStatus.INVALID_ARGUMENT, None)
            return ErrorStatus.INVALID_ARGUMENT
        return self.inner.prepare_model(model, preference, priority, deadline, model_cache,
                                        data_cache, token, callback)

    def prepare_model_from_cache(self, deadline: int | None, model_cache: Sequence[int],
                                 data_cache: Sequence[int], token: bytes,
                                 callback: Any) -> ErrorStatus:
        callback.notify(ErrorStatus.GENERAL_FAILURE, None)
        return ErrorStatus.GENERAL_FAILURE

    def allocate(self, desc: Any, prepared_models: Any, input_roles: Any,
                 output_roles: Any) -> Any:
        return ErrorStatus.GENERAL_FAILURE, None, 0

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


_reference: ReferenceDevice | None = None


def _inner() -> ReferenceDevice:
    """The one reference device behind every case's HalfDevice in this process."""
    global _reference
    if _reference is None:
        _reference = ReferenceDevice()
    return _reference


def half_device(seed: int = DEFAULT_SEED) -> HalfDevice:
    """A test driver claiming the base seed's own half."""
    return HalfDevice(half_of_types(seed), _inner())


def run(device: IDevice, case: Case, opts: Options) -> str:
    model, built = build_case(case)
    used: set[str] = set()
    compiled: list[Any] = []

    def look(comp: Any) -> None:
        used.update(plan_devices(comp.steps))
        compiled.append(comp.prepared)

    try:
        hal = model.hal
        types, _draw = half_for(case.name, hal) if hal is not None else (half_of_types(), 0)
        dev = Device.of(device, getattr(device, "name", None) or "device")
        half = Device.of(through(opts.face, HalfDevice(types, _inner(), device)), "half")
        code, supported = N.ANeuralNetworksModel_getSupportedOperationsForDevices(
            model, [dev, half])
        if code != int(ResultCode.NO_ERROR):
            if case.expect_failure:
                raise ExpectedFailureSeen("getSupportedOperationsForDevices failed")
            raise CaseFailure("getSupportedOperationsForDevices failed")
        if not all(supported):
            raise Unsupported(", ".join(sorted({case.data["model"]["main"]["operations"][i]["type"]
                                                for i, s in enumerate(supported) if not s})))
        try:
            _compile_and_run(case, model, [dev, half], opts, "partitioned", look)
        except CaseFailure:
            if compiled and getattr(compiled[0], "zero_sized_unrunnable", 0):
                # As upstream: a zero-sized value cannot cross devices (a HAL input's 0
                # dimension means unknown), and createForDevices never falls back.
                raise Unsupported("a zero-sized value crosses devices and neither runs the "
                                  "whole model (createForDevices does not fall back)") from None
            raise
    finally:
        for obj in built.keep:
            if hasattr(obj, "close"):
                obj.close()
        for mm in built.models:
            N.ANeuralNetworksModel_free(mm)
    head = SPLIT_MESSAGE if len(used) > 1 else "partitioned (one device)"
    return f"{head}: " + "+".join(PATHS)
