"""Mode ``partitioned``: each case through the NNAPI runtime split across two devices.

The model is built through the NDK calls as in mode ``runtime`` and compiled with
createForDevices over the device under test and :class:`HalfDevice`, a second reference device
that claims only a seeded random half of the operation types and reports better capabilities,
so the partitioner gives it every operation it can and nearly every model with operations of
both halves is split. HalfDevice refuses to prepare a model containing any other type, so an
operation partitioned to the wrong device fails loudly; createForDevices never falls back.
The results must equal the reference's (the usual tolerances), through compute, startCompute,
burst and a reusable execution.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from nnhal.conformance.cases import Case
from nnhal.conformance.mode_runtime import (
    PATHS,
    _compile_and_run,
    build_case,
)
from nnhal.conformance.runner import CaseFailure, ExpectedFailureSeen, Options, Unsupported
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


def half_of_types(seed: int = DEFAULT_SEED) -> frozenset[int]:
    """A seeded random half of the operation types (control flow included)."""
    types = sorted(int(t) for t in OperationType if int(t) < 10000)
    return frozenset(random.Random(seed).sample(types, len(types) // 2))


def describe(seed: int = DEFAULT_SEED) -> str:
    """One line naming the seed and the types the test driver claims."""
    names = sorted(OperationType(t).name for t in half_of_types(seed))
    return f"partitioned: test driver 'half' (seed {seed}) claims {len(names)} operation " \
           f"types: {' '.join(names)}"


def _better(p: PerformanceInfo) -> PerformanceInfo:
    return PerformanceInfo(p.exec_time * 0.5, p.power_usage * 0.5)


class HalfDevice(IDevice):
    """A reference device claiming only some operation types (a test driver)."""

    def __init__(self, types: frozenset[int], inner: IDevice | None = None):
        self.types = types
        self.inner = inner or ReferenceDevice()
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
        status, caps = self.inner.get_capabilities()
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


_half: HalfDevice | None = None


def half_device(seed: int = DEFAULT_SEED) -> HalfDevice:
    """The process's test driver (one reference device object behind it)."""
    global _half
    if _half is None or _half.types != half_of_types(seed):
        _half = HalfDevice(half_of_types(seed))
    return _half


def run(device: IDevice, case: Case, opts: Options) -> str:
    model, built = build_case(case)
    try:
        dev = Device.of(device, getattr(device, "name", None) or "device")
        half = Device.of(half_device(), "half")
        code, supported = N.ANeuralNetworksModel_getSupportedOperationsForDevices(
            model, [dev, half])
        if code != int(ResultCode.NO_ERROR):
            if case.expect_failure:
                raise ExpectedFailureSeen("getSupportedOperationsForDevices failed")
            raise CaseFailure("getSupportedOperationsForDevices failed")
        if not all(supported):
            raise Unsupported(", ".join(sorted({case.data["model"]["main"]["operations"][i]["type"]
                                                for i, s in enumerate(supported) if not s})))
        _compile_and_run(case, model, [dev, half], opts, "partitioned")
    finally:
        for obj in built.keep:
            if hasattr(obj, "close"):
                obj.close()
        for mm in built.models:
            N.ANeuralNetworksModel_free(mm)
    return "partitioned: " + "+".join(PATHS)
