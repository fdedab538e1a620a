"""The AIDL HAL's interfaces (android.hardware.neuralnetworks, v1-v4) under Pythonic names.

A method returns its AIDL return value (``void`` is None; out-parameters come after it in a
tuple) or raises :class:`~nnhal.aidl.errors.ServiceSpecificError` /
:class:`~nnhal.aidl.errors.DeadObjectError` (see :mod:`nnhal.aidl.errors`). Times are ns,
-1 for none; deadlines are on the boot clock. ``get_interface_version()`` answers the version
the implementation was written for (1-4) as AIDL's generated ``getInterfaceVersion`` does;
the calls v4 added have defaults that fail, so a v1-v3 driver need not write them (callers
ask the version before using them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from nnhal.aidl.errors import ServiceSpecificError
from nnhal.aidl.types import (
    BufferDesc,
    BufferRole,
    Capabilities,
    DeviceBuffer,
    DeviceType,
    ErrorStatus,
    ExecutionConfig,
    ExecutionResult,
    Extension,
    FencedExecutionResult,
    IPreparedModelParcel,
    Model,
    NumberOfCacheFiles,
    PrepareModelConfig,
    Request,
    SharedMemory,
    Timing,
)

#: The version of these definitions (AIDL v4 = feature level 8).
VERSION = 4


def _added_in_v4(interface: Any, method: str) -> ServiceSpecificError:
    return ServiceSpecificError(ErrorStatus.GENERAL_FAILURE,
                                f"{method} came with AIDL v4; this {type(interface).__name__} "
                                f"is at v{interface.get_interface_version()}")


class _Versioned:
    def get_interface_version(self) -> int:
        """getInterfaceVersion(): the AIDL version this object implements."""
        return VERSION


class IPreparedModelCallback(ABC):
    @abstractmethod
    def notify(self, status: ErrorStatus, prepared_model: IPreparedModel | None) -> None:
        """notify(status, preparedModel)."""


class IFencedExecutionCallback(_Versioned, ABC):
    @abstractmethod
    def get_execution_info(self) -> tuple[ErrorStatus, Timing, Timing]:
        """getExecutionInfo(out timingLaunched, out timingFenced) -> the execution's status,
        then the two out-parameters."""


class IBuffer(_Versioned, ABC):
    @abstractmethod
    def copy_from(self, src: SharedMemory, dimensions: Sequence[int]) -> None:
        """copyFrom(src, dimensions)."""

    @abstractmethod
    def copy_to(self, dst: SharedMemory) -> None:
        """copyTo(dst)."""


class IExecution(_Versioned, ABC):
    """IExecution (v4): a request bound once, run many times."""

    @abstractmethod
    def execute_synchronously(self, deadline_ns: int) -> ExecutionResult:
        """executeSynchronously(deadlineNs)."""

    @abstractmethod
    def execute_fenced(self, wait_for: Sequence[Any], deadline_ns: int, duration_ns: int
                       ) -> FencedExecutionResult:
        """executeFenced(waitFor, deadlineNs, durationNs)."""


class IBurst(_Versioned, ABC):
    @abstractmethod
    def execute_synchronously(self, request: Request, memory_identifier_tokens: Sequence[int],
                              measure_timing: bool, deadline_ns: int,
                              loop_timeout_duration_ns: int) -> ExecutionResult:
        """executeSynchronously(request, memoryIdentifierTokens, measureTiming, deadlineNs,
        loopTimeoutDurationNs): one token per request pool, -1 for none."""

    @abstractmethod
    def release_memory_resource(self, memory_identifier_token: int) -> None:
        """releaseMemoryResource(memoryIdentifierToken)."""

    def execute_synchronously_with_config(self, request: Request,
                                          memory_identifier_tokens: Sequence[int],
                                          config: ExecutionConfig, deadline_ns: int
                                          ) -> ExecutionResult:
        """executeSynchronouslyWithConfig(request, memoryIdentifierTokens, config, deadlineNs)
        (v4)."""
        raise _added_in_v4(self, "executeSynchronouslyWithConfig")


class IPreparedModel(_Versioned, ABC):
    @abstractmethod
    def execute_synchronously(self, request: Request, measure_timing: bool, deadline_ns: int,
                              loop_timeout_duration_ns: int) -> ExecutionResult:
        """executeSynchronously(request, measureTiming, deadlineNs, loopTimeoutDurationNs)."""

    @abstractmethod
    def execute_fenced(self, request: Request, wait_for: Sequence[Any], measure_timing: bool,
                       deadline_ns: int, loop_timeout_duration_ns: int, duration_ns: int
                       ) -> FencedExecutionResult:
        """executeFenced(request, waitFor, measureTiming, deadlineNs, loopTimeoutDurationNs,
        durationNs)."""

    @abstractmethod
    def configure_execution_burst(self) -> IBurst:
        """configureExecutionBurst()."""

    def create_reusable_execution(self, request: Request, config: ExecutionConfig
                                  ) -> IExecution:
        """createReusableExecution(request, config) (v4)."""
        raise _added_in_v4(self, "createReusableExecution")

    def execute_synchronously_with_config(self, request: Request, config: ExecutionConfig,
                                          deadline_ns: int) -> ExecutionResult:
        """executeSynchronouslyWithConfig(request, config, deadlineNs) (v4)."""
        raise _added_in_v4(self, "executeSynchronouslyWithConfig")

    def execute_fenced_with_config(self, request: Request, wait_for: Sequence[Any],
                                   config: ExecutionConfig, deadline_ns: int, duration_ns: int
                                   ) -> FencedExecutionResult:
        """executeFencedWithConfig(request, waitFor, config, deadlineNs, durationNs) (v4)."""
        raise _added_in_v4(self, "executeFencedWithConfig")


class IDevice(_Versioned, ABC):
    @abstractmethod
    def allocate(self, desc: BufferDesc, prepared_models: Sequence[IPreparedModelParcel],
                 input_roles: Sequence[BufferRole], output_roles: Sequence[BufferRole]
                 ) -> DeviceBuffer:
        """allocate(desc, preparedModels, inputRoles, outputRoles)."""

    @abstractmethod
    def get_capabilities(self) -> Capabilities:
        """getCapabilities()."""

    @abstractmethod
    def get_number_of_cache_files_needed(self) -> NumberOfCacheFiles:
        """getNumberOfCacheFilesNeeded()."""

    @abstractmethod
    def get_supported_extensions(self) -> list[Extension]:
        """getSupportedExtensions()."""

    @abstractmethod
    def get_supported_operations(self, model: Model) -> list[bool]:
        """getSupportedOperations(model)."""

    @abstractmethod
    def get_type(self) -> DeviceType:
        """getType()."""

    @abstractmethod
    def get_version_string(self) -> str:
        """getVersionString()."""

    @abstractmethod
    def prepare_model(self, model: Model, preference: int, priority: int, deadline_ns: int,
                      model_cache: Sequence[Any], data_cache: Sequence[Any], token: bytes,
                      callback: IPreparedModelCallback) -> None:
        """prepareModel(model, preference, priority, deadlineNs, modelCache, dataCache, token,
        callback): the result comes through ``callback``; a failure is also raised."""

    @abstractmethod
    def prepare_model_from_cache(self, deadline_ns: int, model_cache: Sequence[Any],
                                 data_cache: Sequence[Any], token: bytes,
                                 callback: IPreparedModelCallback) -> None:
        """prepareModelFromCache(deadlineNs, modelCache, dataCache, token, callback)."""

    def prepare_model_with_config(self, model: Model, config: PrepareModelConfig,
                                  callback: IPreparedModelCallback) -> None:
        """prepareModelWithConfig(model, config, callback) (v4)."""
        raise _added_in_v4(self, "prepareModelWithConfig")
