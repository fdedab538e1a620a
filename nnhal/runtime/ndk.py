"""The NDK's C API as Python functions: ``ANeuralNetworks*`` names, result codes as the C
library returns them, handles as opaque objects and NULL as None.

No function raises: a rule broken is its result code, and anything unexpected underneath is
OP_FAILED. A function that fills an out-parameter in C returns ``(code, value)`` here (value
None unless the code is NO_ERROR). Arrays and their counts are one Python sequence; a buffer
and its length stay two arguments, as the length is checked against the operand. The C
library of the NDK is meant to be a thin layer over these functions.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nnhal.errors import NdkError
from nnhal.runtime.codes import (
    DEFAULT_LOOP_TIMEOUT_NS,
    MAXIMUM_LOOP_TIMEOUT_NS,
    RUNTIME_FEATURE_LEVEL,
    ResultCode,
)
from nnhal.runtime.compilation import Compilation
from nnhal.runtime.devices import Device, devices
from nnhal.runtime.execution import Burst, Event, Execution
from nnhal.runtime.memory import Memory, MemoryDesc
from nnhal.runtime.model import ANeuralNetworksOperandType, NdkModel

__all__ = ["ANeuralNetworksOperandType", "ANeuralNetworksSymmPerChannelQuantParams"]

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("nnhal.runtime.ndk")
OK = int(ResultCode.NO_ERROR)


@dataclass
class ANeuralNetworksSymmPerChannelQuantParams:
    """The NDK's per-channel quantization struct (scaleCount is ``len(scales)``)."""

    channelDim: int
    scales: Sequence[float] = field(default_factory=list)


def _api(*handles: tuple[int, type], out: bool = False) -> Callable[[F], F]:
    """Wrap a core call: each (position, class) argument must be a handle of that class (None:
    UNEXPECTED_NULL, another object: BAD_DATA); NdkError becomes its code, anything else
    OP_FAILED. ``out``: the call returns (code, value)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            try:
                for pos, cls in handles:
                    h = args[pos] if pos < len(args) else None
                    if h is None:
                        raise NdkError(ResultCode.UNEXPECTED_NULL,
                                       f"{fn.__name__}: argument {pos} is NULL")
                    if not isinstance(h, cls):
                        raise NdkError(ResultCode.BAD_DATA, f"{fn.__name__}: argument {pos} "
                                       f"is not an {cls.__name__}")
                value = fn(*args)
                return (OK, value) if out else OK
            except NdkError as e:
                code = e.code
            except Exception as e:  # noqa: BLE001 - never raise through the C API
                log.error("%s: unexpected %s: %s", fn.__name__, type(e).__name__, e)
                code = int(ResultCode.OP_FAILED)
            return (code, None) if out else code

        __all__.append(fn.__name__)
        return call  # type: ignore[return-value]

    return wrap


# ---- runtime and devices ------------------------------------------------------------------

def ANeuralNetworks_getRuntimeFeatureLevel() -> int:
    return RUNTIME_FEATURE_LEVEL.ndk


def ANeuralNetworks_getDefaultLoopTimeout() -> int:
    return DEFAULT_LOOP_TIMEOUT_NS


def ANeuralNetworks_getMaximumLoopTimeout() -> int:
    return MAXIMUM_LOOP_TIMEOUT_NS


__all__ += ["ANeuralNetworks_getRuntimeFeatureLevel", "ANeuralNetworks_getDefaultLoopTimeout",
            "ANeuralNetworks_getMaximumLoopTimeout"]


@_api(out=True)
def ANeuralNetworks_getDeviceCount() -> int:
    return len(devices())


@_api(out=True)
def ANeuralNetworks_getDevice(index: int) -> Device:
    found = devices()
    if not isinstance(index, int) or not 0 <= index < len(found):
        raise NdkError(ResultCode.BAD_DATA, f"getDevice: index {index} out of range")
    return found[index]


@_api((0, Device), out=True)
def ANeuralNetworksDevice_getName(device: Device) -> str:
    return device.name


@_api((0, Device), out=True)
def ANeuralNetworksDevice_getType(device: Device) -> int:
    return device.type


@_api((0, Device), out=True)
def ANeuralNetworksDevice_getVersion(device: Device) -> str:
    return device.version


@_api((0, Device), out=True)
def ANeuralNetworksDevice_getFeatureLevel(device: Device) -> int:
    return device.feature_level.ndk


@_api((0, Device))
def ANeuralNetworksDevice_wait(device: Device) -> None:
    device.wait()


# ---- models -------------------------------------------------------------------------------

@_api(out=True)
def ANeuralNetworksModel_create() -> NdkModel:
    return NdkModel()


def ANeuralNetworksModel_free(model: NdkModel | None) -> None:
    if isinstance(model, NdkModel):
        model.free()


@_api((0, NdkModel))
def ANeuralNetworksModel_finish(model: NdkModel) -> None:
    model.finish()


@_api((0, NdkModel))
def ANeuralNetworksModel_addOperand(model: NdkModel, type: Any) -> None:
    model.add_operand(type)


@_api((0, NdkModel))
def ANeuralNetworksModel_setOperandValue(model: NdkModel, index: int, buffer: Any,
                                         length: int) -> None:
    model.set_operand_value(index, buffer, length)


@_api((0, NdkModel), (2, Memory))
def ANeuralNetworksModel_setOperandValueFromMemory(model: NdkModel, index: int, memory: Memory,
                                                   offset: int, length: int) -> None:
    model.set_operand_value_from_memory(index, memory, offset, length)


@_api((0, NdkModel), (2, NdkModel))
def ANeuralNetworksModel_setOperandValueFromModel(model: NdkModel, index: int,
                                                  value: NdkModel) -> None:
    model.set_operand_value_from_model(index, value)


@_api((0, NdkModel), (2, ANeuralNetworksSymmPerChannelQuantParams))
def ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(
        model: NdkModel, index: int, channelQuant: ANeuralNetworksSymmPerChannelQuantParams
) -> None:
    model.set_operand_symm_per_channel_quant_params(index, channelQuant.scales,
                                                    channelQuant.channelDim)


@_api((0, NdkModel))
def ANeuralNetworksModel_addOperation(model: NdkModel, type: int, inputs: Sequence[int],
                                      outputs: Sequence[int]) -> None:
    model.add_operation(type, inputs, outputs)


@_api((0, Device), out=True)
def ANeuralNetworksDevice_getExtensionSupport(device: Device, extensionName: str) -> bool:
    """NeuralNetworksExtensions.h: whether the device's driver reports the extension."""
    if extensionName is None:
        raise NdkError(ResultCode.UNEXPECTED_NULL, "getExtensionSupport: extensionName is NULL")
    return isinstance(extensionName, str) and extensionName in device.extensions


@_api((0, NdkModel), out=True)
def ANeuralNetworksModel_getExtensionOperandType(model: NdkModel, extensionName: str,
                                                 operandCodeWithinExtension: int) -> int:
    """NeuralNetworksExtensions.h: the operand type of a code of an extension."""
    return model.extension_type(extensionName, operandCodeWithinExtension, devices(),
                                "getExtensionOperandType")


@_api((0, NdkModel), out=True)
def ANeuralNetworksModel_getExtensionOperationType(model: NdkModel, extensionName: str,
                                                   operationCodeWithinExtension: int) -> int:
    """NeuralNetworksExtensions.h: the operation type of a code of an extension."""
    return model.extension_type(extensionName, operationCodeWithinExtension, devices(),
                                "getExtensionOperationType")


@_api((0, NdkModel))
def ANeuralNetworksModel_setOperandExtensionData(model: NdkModel, index: int, data: Any,
                                                 length: int) -> None:
    """NeuralNetworksExtensions.h: the extension data (extraParams.extension) of an
    extension operand."""
    model.set_operand_extension_data(index, data, length)


@_api((0, NdkModel))
def ANeuralNetworksModel_identifyInputsAndOutputs(model: NdkModel, inputs: Sequence[int],
                                                  outputs: Sequence[int]) -> None:
    model.identify_inputs_and_outputs(inputs, outputs)


@_api((0, NdkModel))
def ANeuralNetworksModel_relaxComputationFloat32toFloat16(model: NdkModel, allow: bool) -> None:
    model.relax_computation_float32_to_float16(allow)


@_api((0, NdkModel), (1, Sequence), out=True)
def ANeuralNetworksModel_getSupportedOperationsForDevices(model: NdkModel,
                                                          devices_: Sequence[Device]
                                                          ) -> list[bool]:
    if any(not isinstance(d, Device) for d in devices_):
        raise NdkError(ResultCode.UNEXPECTED_NULL if any(d is None for d in devices_)
                       else ResultCode.BAD_DATA, "a device is NULL or not a device")
    return model.supported_operations_for_devices(devices_)


# ---- compilations -------------------------------------------------------------------------

@_api((0, NdkModel), out=True)
def ANeuralNetworksCompilation_create(model: NdkModel) -> Compilation:
    return Compilation(model)


@_api((0, NdkModel), (1, Sequence), out=True)
def ANeuralNetworksCompilation_createForDevices(model: NdkModel, devices_: Sequence[Device]
                                                ) -> Compilation:
    if any(d is None for d in devices_):
        raise NdkError(ResultCode.UNEXPECTED_NULL, "createForDevices: a device is NULL")
    if any(not isinstance(d, Device) for d in devices_):
        raise NdkError(ResultCode.BAD_DATA, "createForDevices: not a device")
    return Compilation.for_devices(model, devices_)


def ANeuralNetworksCompilation_free(compilation: Compilation | None) -> None:
    if isinstance(compilation, Compilation):
        compilation.free()


@_api((0, Compilation))
def ANeuralNetworksCompilation_setPreference(compilation: Compilation, preference: int) -> None:
    compilation.set_preference(preference)


@_api((0, Compilation))
def ANeuralNetworksCompilation_setPriority(compilation: Compilation, priority: int) -> None:
    compilation.set_priority(priority)


@_api((0, Compilation))
def ANeuralNetworksCompilation_setTimeout(compilation: Compilation, duration: int) -> None:
    compilation.set_timeout(duration)


@_api((0, Compilation), (1, object), (2, object))
def ANeuralNetworksCompilation_setCaching(compilation: Compilation, cacheDir: str,
                                          token: bytes) -> None:
    compilation.set_caching(cacheDir, token)


@_api((0, Compilation))
def ANeuralNetworksCompilation_finish(compilation: Compilation) -> None:
    compilation.finish()


@_api((0, Compilation), out=True)
def ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(compilation: Compilation,
                                                                  index: int) -> int:
    return compilation.preferred_memory(index, False, "getPreferredMemoryAlignmentForInput")[0]


@_api((0, Compilation), out=True)
def ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput(compilation: Compilation,
                                                                index: int) -> int:
    return compilation.preferred_memory(index, False, "getPreferredMemoryPaddingForInput")[1]


@_api((0, Compilation), out=True)
def ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput(compilation: Compilation,
                                                                   index: int) -> int:
    return compilation.preferred_memory(index, True, "getPreferredMemoryAlignmentForOutput")[0]


@_api((0, Compilation), out=True)
def ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput(compilation: Compilation,
                                                                 index: int) -> int:
    return compilation.preferred_memory(index, True, "getPreferredMemoryPaddingForOutput")[1]


@_api((0, Compilation))
def ANeuralNetworksCompilation_addExtensionAttribute(compilation: Compilation,
                                                     extensionName: str,
                                                     attributeCodeWithinExtension: int,
                                                     data: Any, length: int) -> None:
    compilation.add_extension_attribute(extensionName, attributeCodeWithinExtension, data,
                                        length)


# ---- bursts -------------------------------------------------------------------------------

@_api((0, Compilation), out=True)
def ANeuralNetworksBurst_create(compilation: Compilation) -> Burst:
    return Burst(compilation)


def ANeuralNetworksBurst_free(burst: Burst | None) -> None:
    if isinstance(burst, Burst):
        burst.free()


# ---- executions ---------------------------------------------------------------------------

@_api((0, Compilation), out=True)
def ANeuralNetworksExecution_create(compilation: Compilation) -> Execution:
    return Execution(compilation)


def ANeuralNetworksExecution_free(execution: Execution | None) -> None:
    if isinstance(execution, Execution):
        execution.free()


@_api((0, Execution))
def ANeuralNetworksExecution_setInput(execution: Execution, index: int, type: Any,
                                      buffer: Any, length: int) -> None:
    execution.set_input(index, type, buffer, length)


@_api((0, Execution))
def ANeuralNetworksExecution_setOutput(execution: Execution, index: int, type: Any,
                                       buffer: Any, length: int) -> None:
    execution.set_output(index, type, buffer, length)


@_api((0, Execution), (3, Memory))
def ANeuralNetworksExecution_setInputFromMemory(execution: Execution, index: int, type: Any,
                                                memory: Memory, offset: int,
                                                length: int) -> None:
    execution.set_input_from_memory(index, type, memory, offset, length)


@_api((0, Execution), (3, Memory))
def ANeuralNetworksExecution_setOutputFromMemory(execution: Execution, index: int, type: Any,
                                                 memory: Memory, offset: int,
                                                 length: int) -> None:
    execution.set_output_from_memory(index, type, memory, offset, length)


@_api((0, Execution))
def ANeuralNetworksExecution_compute(execution: Execution) -> None:
    execution.compute()


@_api((0, Execution), out=True)
def ANeuralNetworksExecution_startCompute(execution: Execution) -> Event:
    return execution.start_compute()


@_api((0, Execution), (1, Sequence), out=True)
def ANeuralNetworksExecution_startComputeWithDependencies(execution: Execution,
                                                          dependencies: Sequence[Event],
                                                          duration: int) -> Event:
    if any(d is not None and not isinstance(d, Event) for d in dependencies):
        raise NdkError(ResultCode.BAD_DATA, "startComputeWithDependencies: not an event")
    return execution.start_compute_with_dependencies(dependencies, duration)


@_api((0, Execution), (1, Burst))
def ANeuralNetworksExecution_burstCompute(execution: Execution, burst: Burst) -> None:
    execution.burst_compute(burst)


@_api((0, Execution))
def ANeuralNetworksExecution_setMeasureTiming(execution: Execution, measure: bool) -> None:
    execution.set_measure_timing(measure)


@_api((0, Execution), out=True)
def ANeuralNetworksExecution_getDuration(execution: Execution, durationCode: int) -> int:
    return execution.duration(durationCode)


@_api((0, Execution))
def ANeuralNetworksExecution_setTimeout(execution: Execution, duration: int) -> None:
    execution.set_timeout(duration)


@_api((0, Execution))
def ANeuralNetworksExecution_setLoopTimeout(execution: Execution, duration: int) -> None:
    execution.set_loop_timeout(duration)


@_api((0, Execution), out=True)
def ANeuralNetworksExecution_getOutputOperandRank(execution: Execution, index: int) -> int:
    return execution.output_operand_rank(index)


@_api((0, Execution), out=True)
def ANeuralNetworksExecution_getOutputOperandDimensions(execution: Execution,
                                                        index: int) -> list[int]:
    return execution.output_operand_dimensions(index)


@_api((0, Execution))
def ANeuralNetworksExecution_setReusable(execution: Execution, reusable: bool) -> None:
    execution.set_reusable(reusable)


@_api((0, Execution))
def ANeuralNetworksExecution_addExtensionAttribute(execution: Execution, extensionName: str,
                                                   attributeCodeWithinExtension: int,
                                                   data: Any, length: int) -> None:
    execution.add_extension_attribute(extensionName, attributeCodeWithinExtension, data, length)


@_api((0, Execution))
def ANeuralNetworksExecution_enableInputAndOutputPadding(execution: Execution,
                                                         enable: bool) -> None:
    execution.enable_input_and_output_padding(enable)


# ---- events -------------------------------------------------------------------------------

@_api((0, Event))
def ANeuralNetworksEvent_wait(event: Event) -> None:
    event.wait()


def ANeuralNetworksEvent_free(event: Event | None) -> None:
    if isinstance(event, Event):
        event.free()


@_api(out=True)
def ANeuralNetworksEvent_createFromSyncFenceFd(sync_fence_fd: int) -> Event:
    return Event.from_sync_fence_fd(sync_fence_fd)


@_api((0, Event), out=True)
def ANeuralNetworksEvent_getSyncFenceFd(event: Event) -> int:
    return event.sync_fence_fd()


# ---- memory -------------------------------------------------------------------------------

@_api(out=True)
def ANeuralNetworksMemory_createFromFd(size: int, protect: int, fd: int,
                                       offset: int) -> Memory:
    return Memory.from_fd(size, protect, fd, offset)


@_api((0, MemoryDesc), out=True)
def ANeuralNetworksMemory_createFromDesc(desc: MemoryDesc) -> Memory:
    return Memory.from_desc(desc)


@_api((0, Memory), (1, Memory))
def ANeuralNetworksMemory_copy(src: Memory, dst: Memory) -> None:
    src.copy_to(dst)


def ANeuralNetworksMemory_free(memory: Memory | None) -> None:
    if isinstance(memory, Memory):
        memory.close()


@_api(out=True)
def ANeuralNetworksMemoryDesc_create() -> MemoryDesc:
    return MemoryDesc()


def ANeuralNetworksMemoryDesc_free(desc: MemoryDesc | None) -> None:
    return None


@_api((0, MemoryDesc), (1, Compilation))
def ANeuralNetworksMemoryDesc_addInputRole(desc: MemoryDesc, compilation: Compilation,
                                           index: int, frequency: float) -> None:
    desc.add_input_role(compilation, index, frequency)


@_api((0, MemoryDesc), (1, Compilation))
def ANeuralNetworksMemoryDesc_addOutputRole(desc: MemoryDesc, compilation: Compilation,
                                            index: int, frequency: float) -> None:
    desc.add_output_role(compilation, index, frequency)


@_api((0, MemoryDesc), (1, Sequence))
def ANeuralNetworksMemoryDesc_setDimensions(desc: MemoryDesc, dimensions: Sequence[int]
                                            ) -> None:
    desc.set_dimensions(list(dimensions))


@_api((0, MemoryDesc))
def ANeuralNetworksMemoryDesc_finish(desc: MemoryDesc) -> None:
    desc.finish()


__all__ += ["ANeuralNetworksModel_free", "ANeuralNetworksCompilation_free",
            "ANeuralNetworksBurst_free", "ANeuralNetworksExecution_free",
            "ANeuralNetworksEvent_free", "ANeuralNetworksMemory_free",
            "ANeuralNetworksMemoryDesc_free"]
