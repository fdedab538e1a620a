"""What only HAL 1.x (HIDL) has, kept at the edge of the canonical core: HAL 1.3's
callback-style execution (``prepared_model``: ``execute_1_3`` with an IExecutionCallback, built
on the canonical synchronous call for every prepared model) and the 1.2 burst's FMQ packet
(``fmq``), which the burst rings of a served driver and the driver's burst still carry. The
canonical interfaces themselves are in :mod:`nnhal.hal`."""

from nnhal.hidl.prepared_model import (
    ExecutionCallback,
    IExecutionCallback,
    IHidlPreparedModel,
    execute,
    notify_execution,
)

__all__ = ["ExecutionCallback", "IExecutionCallback", "IHidlPreparedModel", "execute",
           "notify_execution"]
