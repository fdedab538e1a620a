"""The NDK's numbers: result codes, feature levels, duration codes, priorities and limits.

These are the values of ``NeuralNetworks.h`` (facts of the interface, not code); operand and
operation type codes are the HAL's (:mod:`nnhal.hal.types`), which the NDK shares.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from nnhal.core.version import FeatureLevel
from nnhal.errors import NdkError
from nnhal.hal.types import ErrorStatus


class ResultCode(enum.IntEnum):
    """ResultCode of the NDK."""

    NO_ERROR = 0
    OUT_OF_MEMORY = 1
    INCOMPLETE = 2
    UNEXPECTED_NULL = 3
    BAD_DATA = 4
    OP_FAILED = 5
    BAD_STATE = 6
    UNMAPPABLE = 7
    OUTPUT_INSUFFICIENT_SIZE = 8
    UNAVAILABLE_DEVICE = 9
    MISSED_DEADLINE_TRANSIENT = 10
    MISSED_DEADLINE_PERSISTENT = 11
    RESOURCE_EXHAUSTED_TRANSIENT = 12
    RESOURCE_EXHAUSTED_PERSISTENT = 13
    DEAD_OBJECT = 14


class DurationCode(enum.IntEnum):
    """DurationCode of ANeuralNetworksExecution_getDuration."""

    ON_HARDWARE = 0
    IN_DRIVER = 1
    FENCED_ON_HARDWARE = 2
    FENCED_IN_DRIVER = 3


class PreferenceCode(enum.IntEnum):
    """PreferenceCode (the HAL's ExecutionPreference values)."""

    LOW_POWER = 0
    FAST_SINGLE_ANSWER = 1
    SUSTAINED_SPEED = 2


class PriorityCode(enum.IntEnum):
    """PriorityCode: the NDK's values differ from the HAL's (LOW/MEDIUM/HIGH = 0/1/2)."""

    LOW = 90
    MEDIUM = 100
    HIGH = 110
    DEFAULT = 100


class DeviceTypeCode(enum.IntEnum):
    """DeviceTypeCode."""

    UNKNOWN = 0
    OTHER = 1
    CPU = 2
    GPU = 3
    ACCELERATOR = 4


#: The feature level this runtime implements (the NDK's FeatureLevelCode values are the scale's
#: ``FeatureLevel.ndk``): 8, whose functions are the extension attributes (levels 6 and 7
#: added operations only).
RUNTIME_FEATURE_LEVEL = FeatureLevel.AIDL_V4
#: ANEURALNETWORKS_MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES: values up to this many bytes are
#: copied by setOperandValue; larger ones are referenced (the caller keeps the buffer).
MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES = 128
#: ANEURALNETWORKS_BYTE_SIZE_OF_CACHE_TOKEN
BYTE_SIZE_OF_CACHE_TOKEN = 32
#: Loop timeouts (ns): ANeuralNetworks_getDefaultLoopTimeout / getMaximumLoopTimeout.
DEFAULT_LOOP_TIMEOUT_NS = 2_000_000_000
MAXIMUM_LOOP_TIMEOUT_NS = 15_000_000_000
#: A duration that is not available.
NO_DURATION = 0xFFFF_FFFF_FFFF_FFFF
#: PROT_READ / PROT_WRITE of ANeuralNetworksMemory_createFromFd.
PROT_READ, PROT_WRITE = 0x1, 0x2

_FROM_STATUS = {
    ErrorStatus.NONE: ResultCode.NO_ERROR,
    ErrorStatus.DEVICE_UNAVAILABLE: ResultCode.UNAVAILABLE_DEVICE,
    ErrorStatus.GENERAL_FAILURE: ResultCode.OP_FAILED,
    ErrorStatus.OUTPUT_INSUFFICIENT_SIZE: ResultCode.OUTPUT_INSUFFICIENT_SIZE,
    ErrorStatus.INVALID_ARGUMENT: ResultCode.BAD_DATA,
    ErrorStatus.MISSED_DEADLINE_TRANSIENT: ResultCode.MISSED_DEADLINE_TRANSIENT,
    ErrorStatus.MISSED_DEADLINE_PERSISTENT: ResultCode.MISSED_DEADLINE_PERSISTENT,
    ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT: ResultCode.RESOURCE_EXHAUSTED_TRANSIENT,
    ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT: ResultCode.RESOURCE_EXHAUSTED_PERSISTENT,
    ErrorStatus.DEAD_OBJECT: ResultCode.DEAD_OBJECT,
}


def code_of_status(status: object, dead: bool = False) -> ResultCode:
    """The NDK result code of a HAL ErrorStatus, as the runtime converts it (an unknown status
    is a general failure). ``dead``: the device that answered is known dead, so its
    DEVICE_UNAVAILABLE is DEAD_OBJECT (the HAL 1.3 status set has no dead object; NNAPI's
    runtime reports a driver that died as ANEURALNETWORKS_DEAD_OBJECT)."""
    if dead and status == ErrorStatus.DEVICE_UNAVAILABLE:
        return ResultCode.DEAD_OBJECT
    try:
        return _FROM_STATUS[ErrorStatus(status)]
    except (ValueError, KeyError, TypeError):
        return ResultCode.OP_FAILED


def fail(code: ResultCode, message: str) -> NdkError:
    """The error the core raises for a call the C API would answer with ``code``."""
    return NdkError(code, f"{ResultCode(code).name}: {message}")


def as_bytes(buffer: Any) -> memoryview:
    """A caller's buffer (bytes, bytearray, memoryview, numpy array...) as a byte view."""
    if isinstance(buffer, np.ndarray):
        return memoryview(np.ascontiguousarray(buffer).reshape(-1).view(np.uint8))
    return memoryview(buffer).cast("B")
