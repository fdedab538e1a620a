"""The AIDL HAL's parcelables where they differ from the canonical types.

AIDL carries times as nanoseconds with -1 for "not available" or "none" (timings, durations,
loop timeouts) and deadlines on the boot clock (``CLOCK_BOOTTIME``); data locations carry a
``padding``; operands carry no ``numberOfConsumers`` (the receiver counts them); a request pool
is a union of a memory or a driver buffer's token; results are parcelables, not status tuples.
Every other parcelable and enum has the canonical shape and the same numbers, so this module
re-exports the canonical one (``BufferRole.frequency`` is AIDL's ``probability``). A
``Memory`` is a :class:`nnhal.memory.SharedMemory`; a ``ParcelFileDescriptor`` is a file
descriptor (an int or an object with ``fileno()``), a sync fence one a
:class:`nnhal.hal.SyncFence`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    Capabilities,
    DeviceType,
    ErrorStatus,
    ExecutionPreference,
    Extension,
    ExtensionNameAndPrefix,
    ExtensionOperandTypeInformation,
    OperandLifeTime,
    OperandPerformance,
    OperandType,
    Operation,
    OperationType,
    OutputShape,
    PerformanceInfo,
    Priority,
    SymmPerChannelQuantParams,
    TokenValuePair,
)
from nnhal.memory import SharedMemory

__all__ = [
    "NOT_AVAILABLE", "NO_DEADLINE", "DEFAULT_LOOP_TIMEOUT", "BYTE_SIZE_OF_CACHE_TOKEN",
    "MAX_NUMBER_OF_CACHE_FILES", "DEFAULT_LOOP_TIMEOUT_DURATION_NS",
    "MAXIMUM_LOOP_TIMEOUT_DURATION_NS", "Timing", "NO_TIMING", "DataLocation", "Operand",
    "Subgraph", "Model", "RequestArgument", "RequestMemoryPool", "Request", "ExecutionConfig",
    "PrepareModelConfig", "ExecutionResult", "FencedExecutionResult", "DeviceBuffer",
    "NumberOfCacheFiles", "IPreparedModelParcel",
    # the canonical types AIDL shares, re-exported so that an AIDL driver needs nothing else
    "BufferDesc", "BufferRole", "Capabilities", "DeviceType", "ErrorStatus",
    "ExecutionPreference", "Extension", "ExtensionNameAndPrefix",
    "ExtensionOperandTypeInformation", "OperandLifeTime", "OperandPerformance", "OperandType",
    "Operation", "OperationType", "OutputShape", "PerformanceInfo", "Priority",
    "SymmPerChannelQuantParams", "TokenValuePair", "SharedMemory",
]

#: A time (Timing field, duration) that is not available or not given.
NOT_AVAILABLE = -1
#: A deadline that is not given.
NO_DEADLINE = -1
#: A loop timeout that is not given: the default applies.
DEFAULT_LOOP_TIMEOUT = -1
BYTE_SIZE_OF_CACHE_TOKEN = 32
MAX_NUMBER_OF_CACHE_FILES = 32
DEFAULT_LOOP_TIMEOUT_DURATION_NS = 2_000_000_000
MAXIMUM_LOOP_TIMEOUT_DURATION_NS = 15_000_000_000


@dataclass(frozen=True)
class Timing:
    """Timing: nanoseconds, -1 when not available."""

    time_on_device_ns: int = NOT_AVAILABLE
    time_in_driver_ns: int = NOT_AVAILABLE


NO_TIMING = Timing()


@dataclass(frozen=True)
class DataLocation:
    """DataLocation: ``padding`` extra bytes after ``length`` a driver may touch (requests
    only; 0 in operands)."""

    pool_index: int = 0
    offset: int = 0
    length: int = 0
    padding: int = 0


@dataclass
class Operand:
    """Operand: the canonical one without ``numberOfConsumers``."""

    type: int = OperandType.FLOAT32
    dimensions: list[int] = field(default_factory=list)
    scale: float = 0.0
    zero_point: int = 0
    lifetime: int = OperandLifeTime.TEMPORARY_VARIABLE
    location: DataLocation = field(default_factory=DataLocation)
    #: The OperandExtraParams union: channel quantization, extension bytes, or None.
    extra_params: SymmPerChannelQuantParams | bytes | None = None


@dataclass
class Subgraph:
    operands: list[Operand]
    operations: list[Operation]
    input_indexes: list[int]
    output_indexes: list[int]


@dataclass
class Model:
    main: Subgraph
    referenced: list[Subgraph] = field(default_factory=list)
    operand_values: bytes = b""
    pools: list[SharedMemory] = field(default_factory=list)
    relax_computation_float32_to_float16: bool = False
    extension_name_to_prefix: list[ExtensionNameAndPrefix] = field(default_factory=list)


@dataclass
class RequestArgument:
    has_no_value: bool = False
    location: DataLocation = field(default_factory=DataLocation)
    dimensions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RequestMemoryPool:
    """The RequestMemoryPool union: exactly one of ``pool`` (a Memory) and ``token`` (of a
    driver buffer) is set."""

    pool: SharedMemory | None = None
    token: int | None = None

    @staticmethod
    def of(memory: SharedMemory) -> RequestMemoryPool:
        return RequestMemoryPool(pool=memory)

    @staticmethod
    def of_token(token: int) -> RequestMemoryPool:
        return RequestMemoryPool(token=token)


@dataclass
class Request:
    inputs: list[RequestArgument]
    outputs: list[RequestArgument]
    pools: list[RequestMemoryPool] = field(default_factory=list)


@dataclass(frozen=True)
class ExecutionConfig:
    measure_timing: bool = False
    loop_timeout_duration_ns: int = DEFAULT_LOOP_TIMEOUT
    execution_hints: tuple[TokenValuePair, ...] = ()
    extension_name_to_prefix: tuple[ExtensionNameAndPrefix, ...] = ()


@dataclass
class PrepareModelConfig:
    preference: int = ExecutionPreference.FAST_SINGLE_ANSWER
    priority: int = Priority.MEDIUM
    deadline_ns: int = NO_DEADLINE
    model_cache: list[Any] = field(default_factory=list)
    data_cache: list[Any] = field(default_factory=list)
    cache_token: bytes = bytes(BYTE_SIZE_OF_CACHE_TOKEN)
    compilation_hints: list[TokenValuePair] = field(default_factory=list)
    extension_name_to_prefix: list[ExtensionNameAndPrefix] = field(default_factory=list)


@dataclass
class ExecutionResult:
    """A synchronous execution's result. ``output_sufficient_size`` False is AIDL's
    OUTPUT_INSUFFICIENT_SIZE: a result, not an error, with the shapes the outputs need."""

    output_sufficient_size: bool
    output_shapes: list[OutputShape]
    timing: Timing = NO_TIMING


@dataclass
class FencedExecutionResult:
    callback: Any  #: an IFencedExecutionCallback
    sync_fence: Any = None  #: a SyncFence, or None when the execution is already done


@dataclass
class DeviceBuffer:
    buffer: Any  #: an IBuffer
    token: int


@dataclass(frozen=True)
class NumberOfCacheFiles:
    num_model_cache: int
    num_data_cache: int


@dataclass(frozen=True)
class IPreparedModelParcel:
    prepared_model: Any  #: an IPreparedModel
