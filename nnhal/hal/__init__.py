"""The canonical types and interfaces (HAL 1.3's types, AIDL v4's configs)."""

from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import (
    IBuffer,
    IBurst,
    IDevice,
    IExecution,
    IFencedExecutionCallback,
    IPreparedModel,
    IPreparedModelCallback,
    PreparedModelCallback,
)
from nnhal.hal.request_pool import RequestBuffer, RequestPool
from nnhal.hal.types import *  # noqa: F403
from nnhal.hal.types import __all__ as _types_all

__all__ = [*_types_all, "FenceState", "IBuffer", "IBurst", "IDevice", "IExecution",
           "IFencedExecutionCallback", "IPreparedModel", "IPreparedModelCallback",
           "PreparedModelCallback", "RequestBuffer", "RequestPool", "SyncFence"]
