"""The XLA driver's IDevice: the analysed main subgraph lowered to one JAX function
(:mod:`nnhal.drivers.xla.lowering`), compiled ahead of time by XLA for the device JAX finds (a
GPU when there is one, else the CPU), its weights kept in device memory.

Validation is the shared analysis's (the same statuses for invalid models as every driver);
which operations run is :func:`nnhal.drivers.xla.lowering.why_not`'s rule. Prepare does all of
the work (tracing, XLA's compilation, moving the weights to the device); an execution moves the
inputs in and the outputs out, except those in the device's own memory-domain buffers
(:mod:`nnhal.drivers.xla.buffer`), which stay in device memory between executions.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import nnhal.drivers.xla.lowering as lowering
from nnhal.analysis import MAX_TENSOR_BYTES, ModelGraph
from nnhal.drivers.common.buffer import allocate
from nnhal.drivers.common.device import DeviceBase, cache_key
from nnhal.drivers.xla.buffer import DeviceBufferCore
from nnhal.drivers.xla.cache import XlaCache, XlaPlan, relaxed_name
from nnhal.drivers.xla.engine import (
    compile_graph,
    default_device,
    putter,
    relaxed_dtype,
    unavailable,
)
from nnhal.drivers.xla.prepared_model import XlaPreparedModel
from nnhal.hal.interfaces import IBuffer, IPreparedModel
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    Capabilities,
    DeviceType,
    ErrorStatus,
    OperandPerformance,
    OperandType,
    PerformanceInfo,
    Priority,
)

log = logging.getLogger("nnhal.drivers.xla")

VERSION_STRING = "nnhal-xla-0.1"

# Performance relative to the reference driver (lower is better; the reference reports 1.0,
# LiteRT 0.4 for float32). On the CPU, benchmarks/bench_xla.py measured MobileNetV2 224
# float32 through Session in interleaved rounds on this project's 2 cores: xla 12.3 ms,
# LiteRT 4.4 ms, the reference 12.7 ms when quiet (load 0.5: 0.86x the reference's time);
# 13.1, 8.2 and 11.9 ms at load 2.8 (1.10x); 19.4, 9.5 and 15.2 ms at load 4.7 (1.28x). XLA's
# CPU code is 2-3x slower than LiteRT's XNNPACK and about as fast as the reference, while each
# preparation costs seconds of XLA compilation where the reference's takes milliseconds: the
# figure (1.2) says "no faster than the reference", so the runtime keeps float32 work on LiteRT
# or the reference when they can run it. On a GPU (an H200, JAX 0.11.2; bench_xla.py
# --parts compare,components) MobileNetV2 float32 took 1.0-1.5 ms per Session.run against the
# reference's 12.1 ms on the same machine's CPU (0.08-0.13x); relaxed, computed in float16,
# 0.82 ms (0.07x).
#: float32 / float16 tensors on the CPU backend.
CPU_FLOAT_PERF = 1.2
#: float32 / float16 tensors on a GPU.
GPU_FLOAT_PERF = 0.1
#: Relaxed float32 tensors on a GPU (computed in float16).
GPU_RELAXED_PERF = 0.07
#: 8-bit quantized tensors (the reference integer arithmetic: int32 sums, 64-bit
#: requantisation, table lookups). benchmarks/bench_xla.py measured pymicro-wakeword's four
#: int8 streaming models through Session in interleaved rounds (60, load 5.2-5.7): xla
#: 0.24-0.38 ms per call, the reference 0.17-0.30 ms (1.29-1.41x its time), LiteRT 0.04-0.23
#: ms. MobileNetV2 224 int8 (the converter's file, outputs equal to the reference's): xla
#: 59.6 ms, the reference 8.6 ms (6.9x; load 1.4-1.6): XLA's CPU integer convolutions are slow.
#: The figure is the convolutional model's, on the CPU backend.
QUANT_PERF = 7.0
#: 8-bit quantized tensors on a GPU: MobileNetV2 224 int8 took 1.85 ms per Session.run on an
#: H200 (JAX 0.11.2; bench_xla.py --parts compare, outputs equal to the reference's) against
#: the reference's 12.4 ms on the same machine's CPU (0.15x).
GPU_QUANT_PERF = 0.15
#: Scalars and tiny models: each execution pays JAX's dispatch and a device round trip.
SCALAR_PERF = 2.0
#: Types the driver never runs (16-bit quantized, bool, ...): a figure that loses every
#: comparison.
UNSUPPORTED_PERF = 100.0

_RUNS = (OperandType.TENSOR_FLOAT32, OperandType.TENSOR_FLOAT16, OperandType.TENSOR_INT32)
_QUANT = (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED,
          OperandType.TENSOR_QUANT8_SYMM, OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL)


class XlaDevice(DeviceBase):
    """A device that compiles whole models with XLA through JAX.

    ``workers`` bounds the threads that run asynchronous preparations and executions.
    ``cache_key_file`` (default: ``NNHAL_CACHE_KEY_FILE``, if set) holds the secret that
    authenticates compilation caches, as for the other drivers.
    """

    version_string = VERSION_STRING
    logger = log

    def __init__(self, name: str = "nnhal-xla", workers: int = 4,
                 max_tensor_bytes: int = MAX_TENSOR_BYTES,
                 cache_key_file: str | os.PathLike[str] | None = None,
                 max_work: int | None = None):
        #: None, or why JAX cannot be used. Loading it (and its backend) is part of opening
        #: the device, not of the first preparation.
        self.engine_unavailable = unavailable()
        self.device: Any = None if self.engine_unavailable else default_device()
        #: A host array to the device: what copyFrom of this device's buffers uses.
        self._put: Any = None if self.device is None else putter(self.device)
        super().__init__(name, workers, max_tensor_bytes,
                         XlaCache(VERSION_STRING, cache_key(cache_key_file), self.device),
                         max_work)
        self._cache.max_work = self.max_work  # type: ignore[attr-defined]

    @property
    def on_gpu(self) -> bool:
        return self.device is not None and self.device.platform in ("gpu", "cuda", "rocm")

    # ---- IDevice ----------------------------------------------------------------------------
    def get_type(self) -> tuple[ErrorStatus, DeviceType]:
        return ErrorStatus.NONE, DeviceType.GPU if self.on_gpu else DeviceType.CPU

    def get_capabilities(self) -> tuple[ErrorStatus, Capabilities]:
        fast = GPU_FLOAT_PERF if self.on_gpu else CPU_FLOAT_PERF
        relaxed = GPU_RELAXED_PERF if self.on_gpu else CPU_FLOAT_PERF
        types = sorted(t for t in OperandType if t not in (OperandType.OEM,
                                                             OperandType.TENSOR_OEM_BYTE))

        def perf(t: OperandType) -> float:
            if t in _RUNS:
                return fast
            if t in _QUANT:
                return GPU_QUANT_PERF if self.on_gpu else QUANT_PERF
            return SCALAR_PERF if t.is_scalar else UNSUPPORTED_PERF

        never = PerformanceInfo(UNSUPPORTED_PERF, UNSUPPORTED_PERF)
        return ErrorStatus.NONE, Capabilities(
            relaxed_float32_to_float16_performance_scalar=PerformanceInfo(SCALAR_PERF,
                                                                           SCALAR_PERF),
            relaxed_float32_to_float16_performance_tensor=PerformanceInfo(relaxed, relaxed),
            operand_performance=[OperandPerformance(int(t), PerformanceInfo(perf(t), perf(t)))
                                 for t in types],
            if_performance=never, while_performance=never)

    def allocate(self, desc: BufferDesc, prepared_models: Sequence[IPreparedModel],
                 input_roles: Sequence[BufferRole], output_roles: Sequence[BufferRole]
                 ) -> tuple[ErrorStatus, IBuffer | None, int]:
        """The common allocate's rules, the buffer's data in device memory
        (:mod:`nnhal.drivers.xla.buffer`)."""
        return allocate(self, self.buffers, desc, prepared_models, input_roles, output_roles,
                        core=functools.partial(DeviceBufferCore, put=self._put))

    # ---- DeviceBase -------------------------------------------------------------------------
    def supported(self, graph: ModelGraph) -> list[bool]:
        if self.engine_unavailable is not None:  # made directly, without JAX: runs nothing
            return [False] * len(graph.main.operations)
        return lowering.supported_operations(graph)

    def operation_reasons(self, graph: ModelGraph) -> list[str | None]:
        """Per main operation, None when it lowers, else why not (``nnhal info --plan``)."""
        main = graph.main
        return [None if ok and why is None else
                why or graph.reasons.get((-1, k)) or "not runnable here"
                for k, (ok, why) in enumerate(zip(main.supported,
                                                  (lowering.why_not(main, k) if ok else None
                                                   for k, ok in enumerate(main.supported))))]

    def refusal(self, graph: ModelGraph) -> str | None:
        if self.engine_unavailable is not None:
            return self.engine_unavailable
        if graph.relaxed and not lowering.uses_quantized(graph):
            try:  # the setting a relaxed model compiles under: a bad value refuses it here,
                relaxed_dtype(self.device)  # with its reason, not as a failed compilation
            except ValueError as e:
                return str(e)
        return lowering.refusal(graph)

    def build(self, graph: ModelGraph, compiled: Any, priority: Priority,
              deadline: int | None) -> tuple[ErrorStatus, IPreparedModel | None]:
        try:
            relaxed_in = relaxed_name(graph, self.device)
            exe = compile_graph(graph, self.device)
        except Exception as e:  # noqa: BLE001 - a lowering or XLA failure: not prepared
            self.log(f"prepare failed: {type(e).__name__}: {e}")
            return ErrorStatus.GENERAL_FAILURE, None
        if deadline is not None and time.monotonic_ns() > deadline:
            return ErrorStatus.MISSED_DEADLINE_TRANSIENT, None
        return ErrorStatus.NONE, XlaPreparedModel(self, XlaPlan(graph, exe, relaxed_in),
                                                  priority)

    def restored(self, plan: XlaPlan, priority: Priority) -> XlaPreparedModel:
        plan.check_relaxed(self.device)  # a live plan too: NNHAL_XLA_RELAXED may have changed
        return XlaPreparedModel(self, plan, priority)
