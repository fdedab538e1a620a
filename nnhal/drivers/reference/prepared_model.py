"""The reference driver's IPreparedModel: an immutable plan run by the shared execution paths
(:mod:`nnhal.drivers.common.prepared_model`).

A prepared model is never mutated after preparation; every execution gets its own slot list,
so any number of executions may run concurrently on one prepared model.
"""

from __future__ import annotations

from collections.abc import Sequence

from nnhal.drivers.common.prepared_model import PreparedModelBase, PreparingDevice
from nnhal.executor import ModelPlan, RunState, run_request
from nnhal.executor.run import RequestPlan
from nnhal.hal.request_pool import RequestPool
from nnhal.hal.types import ErrorStatus, MemoryPool, OutputShape, Priority, Request, Subgraph
from nnhal.memory import SharedMemory
from nnhal.ops import blas

__all__ = ["PreparingDevice", "ReferencePreparedModel"]


class ReferencePreparedModel(PreparedModelBase):
    """IPreparedModel of the reference CPU driver."""

    def __init__(self, device: PreparingDevice, plan: ModelPlan, priority: Priority):
        super().__init__(device, priority)
        self.plan = plan
        #: BLAS threads while this model runs (0: leave BLAS alone); only for plans with GEMMs.
        self._blas_threads = getattr(device, "blas_threads", 0) if plan.uses_blas else 0

    @property
    def signature(self) -> Subgraph:
        """The main inputs and outputs, as requests are checked against them."""
        return self.plan.signature

    def request_plan(self, request: Request, pools: Sequence[RequestPool]
                     ) -> RequestPlan | None:
        """A validated request bound to this model's plan, for runs of it again and again
        (``request`` must not change afterwards: pass a snapshot)."""
        mems = (p.hidl_memory if isinstance(p, MemoryPool) else p for p in request.pools)
        try:
            return RequestPlan(self.plan, request, pools,
                               [m for m in mems if isinstance(m, SharedMemory)])
        except Exception as e:  # noqa: BLE001 - runs of it take the generic way, which reports
            self.device.log(f"request not bound: {type(e).__name__}: {e}")
            return None

    def execute_checked(self, request: Request, pools: Sequence[RequestPool], rt: RunState,
                        prepared: RequestPlan | None) -> tuple[ErrorStatus, list[OutputShape]]:
        limit = self._blas_threads
        if limit:
            blas.limit_enter(limit)
        try:
            if prepared is None:
                return run_request(self.plan, request, pools, rt)
            return prepared.run(rt)
        finally:
            if limit:
                blas.limit_exit()
