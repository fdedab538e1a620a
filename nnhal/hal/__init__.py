"""HAL 1.3 types and interfaces."""

from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import (
    ExecutionCallback,
    IBuffer,
    IBurst,
    IDevice,
    IExecution,
    IExecutionCallback,
    IFencedExecutionCallback,
    IPreparedModel,
    IPreparedModelCallback,
    PreparedModelCallback,
)
from nnhal.hal.request_pool import RequestBuffer, RequestPool
from nnhal.hal.types import *  # noqa: F403
from nnhal.hal.types import __all__ as _types_all

__all__ = [*_types_all, "ExecutionCallback", "FenceState", "IBuffer", "IBurst", "IDevice",
           "IExecution", "IExecutionCallback", "IFencedExecutionCallback", "IPreparedModel",
           "IPreparedModelCallback", "PreparedModelCallback", "RequestBuffer", "RequestPool",
           "SyncFence"]
