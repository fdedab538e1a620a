"""The XLA driver's IPreparedModel: the shared execution paths
(:class:`~nnhal.drivers.common.prepared_model.PreparedModelBase`: synchronous, fenced, burst,
reusable, memory domains, deadlines, timing) over one compiled XLA executable.

Inputs go from views of the request's pools to the device (one copy, ``device_put``);
outputs come back as host arrays and are copied into the request's pools (one copy), or
reported with OUTPUT_INSUFFICIENT_SIZE. Every shape is static (the driver refuses models whose
shapes only a run can tell), so output shapes are the ones the analysis inferred, and a bound
request (a burst's, a reusable execution's) decides once where each output's bytes go.

A memory domain's buffer (:mod:`nnhal.drivers.xla.buffer`) holds a device array: an input
read from one is passed to the executable as it is, an output written to one stays on the
device; only outputs bound for shared memory come to the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nnhal.analysis import ModelGraph
from nnhal.drivers.common.prepared_model import PreparedModelBase, PreparingDevice
from nnhal.drivers.xla.cache import XlaPlan
from nnhal.executor import RunError, RunState
from nnhal.executor.run import write_outputs
from nnhal.hal.request_pool import RequestPool
from nnhal.hal.types import (
    ErrorStatus,
    MemoryPool,
    OperandType,
    OutputShape,
    Priority,
    Request,
    Subgraph,
)
from nnhal.memory import SharedMemory
from nnhal.memory.pool import watch_of

_BOOL8 = OperandType.TENSOR_BOOL8


class XlaRequest:
    """A validated request bound once (a reusable execution, a burst's repeated request):
    views of its inputs in shared memory, decided here."""

    __slots__ = ("request", "pools", "watch", "buffers", "inputs", "direct", "shapes")

    def __init__(self, pm: XlaPreparedModel, request: Request, pools: Sequence[RequestPool]):
        self.request = request
        self.pools = list(pools)
        mems = (p.hidl_memory if isinstance(p, MemoryPool) else p for p in request.pools)
        self.watch = watch_of([m for m in mems if isinstance(m, SharedMemory)])
        self.buffers = any(not isinstance(p, np.ndarray) for p in pools)
        self.inputs = pm.read_inputs(request, pools)
        #: Per output, the bytes of its pool it is written to (None: no value), when every
        #: output is in shared memory and fits; else None (write_outputs decides per run).
        self.direct: list[np.ndarray | None] | None = None
        #: The output shapes reported by a run written through ``direct``.
        self.shapes: list[OutputShape] = []
        direct: list[np.ndarray | None] = []
        shapes = []
        for arg, (t, shape) in zip(request.outputs, pm.outputs):
            shapes.append(OutputShape(dimensions=list(shape), is_sufficient=True))
            if arg.has_no_value:
                direct.append(None)
                continue
            pool = pools[arg.location.pool_index]
            nbytes = t.byte_size * math.prod(shape)
            if not isinstance(pool, np.ndarray) or nbytes > arg.location.length:
                return
            direct.append(pool[arg.location.offset:arg.location.offset + nbytes])
        self.direct, self.shapes = direct, shapes


class XlaPreparedModel(PreparedModelBase):
    """IPreparedModel of the XLA driver: one executable and its weights on the device."""

    def __init__(self, device: PreparingDevice, plan: XlaPlan, priority: Priority):
        super().__init__(device, priority)
        self.plan = plan
        self.graph: ModelGraph = plan.graph
        main = plan.graph.main
        #: Per main input: (operand index, type, shape, dtype).
        self._inputs = [(i, main.operands[i].type, tuple(main.shapes[i] or ()))
                        for i in main.inputs]
        #: Per main output: (type, shape).
        self.outputs = [(main.operands[i].type, tuple(main.shapes[i] or ()))
                        for i in main.outputs]

    @property
    def signature(self) -> Subgraph:
        return self.graph.signature

    def read_inputs(self, request: Request, pools: Sequence[RequestPool]) -> list[np.ndarray]:
        arrays = []
        for arg, (idx, t, shape) in zip(request.inputs, self._inputs):
            if arg.has_no_value:
                status = ErrorStatus.INVALID_ARGUMENT if idx in self.graph.required_inputs \
                    else ErrorStatus.GENERAL_FAILURE
                raise RunError(status, f"input operand {idx} has no value")
            pool = pools[arg.location.pool_index]
            if isinstance(pool, np.ndarray):
                loc = arg.location
                nbytes = t.byte_size * math.prod(shape)
                raw = pool[loc.offset:loc.offset + nbytes]
                arrays.append((raw != 0).reshape(shape) if t == _BOOL8 else
                              raw.view(t.dtype).reshape(shape))
            else:
                info = self.graph.main.operands[idx]
                arrays.append(pool.read_input(info, shape))
        return arrays

    def request_plan(self, request: Request, pools: Sequence[RequestPool]
                     ) -> XlaRequest | None:
        try:
            return XlaRequest(self, request, pools)
        except Exception as e:  # noqa: BLE001 - runs of it take the generic way, which reports
            self.device.log(f"request not bound: {type(e).__name__}: {e}")
            return None

    def execute_checked(self, request: Request, pools: Sequence[RequestPool], rt: RunState,
                        prepared: XlaRequest | None) -> tuple[ErrorStatus, list[OutputShape]]:
        exe = self.plan.executable
        if prepared is not None:  # every pool is shared memory
            if rt.deadline_ns is not None:
                rt.check_deadline()
            outs = exe.to_host(exe.run(prepared.inputs))
            direct = prepared.direct
            if direct is None:
                return write_outputs(request, pools, outs)
            for dst, out in zip(direct, outs):
                if dst is not None:
                    dst[:] = out.reshape(-1).view(np.uint8)
            return ErrorStatus.NONE, list(prepared.shapes)
        inputs = self.read_inputs(request, pools)
        if rt.deadline_ns is not None:
            rt.check_deadline()
        outs = exe.run(inputs)
        # Outputs bound for shared memory come to the host; those written to a buffer stay
        # on the device (waited for, so that the execution has finished when it returns).
        host, kept = [], []
        for k, arg in enumerate(request.outputs):
            if not arg.has_no_value:
                pool = pools[arg.location.pool_index]
                (host if isinstance(pool, np.ndarray) else kept).append(k)
        for k in kept:
            outs[k].block_until_ready()
        if host:
            for k, arr in zip(host, exe.to_host([outs[k] for k in host])):
                outs[k] = arr
        return write_outputs(request, pools, outs)
