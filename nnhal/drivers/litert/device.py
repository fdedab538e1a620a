"""The LiteRT driver's IDevice: models exported to a TFLite flatbuffer
(:func:`nnhal.tflite.write_tflite`) and run by ai-edge-litert interpreters with XNNPACK.

Validation is the reference driver's (the shared analysis, the same statuses for invalid
models); which operations run is :mod:`nnhal.drivers.litert.support`'s rule (a WHILE, for
one, is refused: LiteRT cannot stop a loop, so a loop timeout could not be honoured).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import nnhal.drivers.litert.support as support
from nnhal.analysis import MAX_TENSOR_BYTES, ModelGraph
from nnhal.drivers.common.device import DeviceBase, cache_key
from nnhal.drivers.common.private_store import PrivateStore, default_store_dir
from nnhal.drivers.litert.cache import LiteRTCache, LiteRTPlan
from nnhal.drivers.litert.engine import Engine, EnginePool, unavailable
from nnhal.drivers.litert.prepared_model import LiteRTPreparedModel
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import (
    Capabilities,
    ErrorStatus,
    Model,
    OperandPerformance,
    OperandType,
    PerformanceInfo,
    Priority,
)
from nnhal.tflite import write_tflite

log = logging.getLogger("nnhal.drivers.litert")

VERSION_STRING = "nnhal-litert-0.1"

# Performance relative to the reference driver (lower is better; the reference reports 1.0),
# measured by benchmarks/bench_litert.py --capability (interleaved rounds, 2 LiteRT threads,
# 2 cores with a load average of 2.8-3.0 from other work): MobileNetV2 float32 20.4 ms against
# 49.5 ms, int8 19.6 ms against 81.5 ms, one ADD [1,16] 14 us against 14 us.
#: float32 tensors: MobileNetV2 float32 took 0.425x the reference's time.
FLOAT32_TENSOR_PERF = 0.4
#: 8-bit quantized tensors: MobileNetV2 int8 took 0.246x the reference's time.
QUANT8_TENSOR_PERF = 0.25
#: Scalars (tiny work, where the per-run overhead dominates): one ADD [1,16] took 0.97x (1.79x
#: before a bound request ran the direct way).
SCALAR_PERF = 1.0
#: Everything else (float16 computed as float32, int32, bool, 16-bit quantized): not
#: measured separately; between the two figures above.
OTHER_PERF = 0.5

_FLOAT32 = (OperandType.TENSOR_FLOAT32,)
_QUANT8 = (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED,
           OperandType.TENSOR_QUANT8_SYMM, OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL)


def _perf(t: OperandType) -> float:
    if t in _FLOAT32:
        return FLOAT32_TENSOR_PERF
    if t in _QUANT8:
        return QUANT8_TENSOR_PERF
    if t.is_scalar:
        return SCALAR_PERF
    return OTHER_PERF


class LiteRTDevice(DeviceBase):
    """A CPU device that runs whole models with ai-edge-litert (TFLite kernels, XNNPACK).

    ``threads`` is each interpreter's thread count (default: every core); ``workers`` bounds
    the threads that run asynchronous preparations and executions. ``cache_key_file`` (default:
    ``NNHAL_CACHE_KEY_FILE``, if set) holds the secret that authenticates compilation caches,
    as for the reference driver. ``store_dir`` is the private store of the flatbuffers it
    caches (default: ``litert/`` in nnhal's per-user cache, ``$NNHAL_CACHE_DIR``, ...; see
    :mod:`nnhal.drivers.litert.cache`); ``private_store=False`` keeps none.
    """

    version_string = VERSION_STRING
    logger = log
    #: nnhal's TFLite builtins extension: its operations go back to their TFLite builtins
    #: (``tflite_export``) and run here.
    extensions: tuple[str, ...] = ("org.nnhal.tflite",)

    def __init__(self, name: str = "nnhal-litert", threads: int | None = None,
                 workers: int = 4, max_tensor_bytes: int = MAX_TENSOR_BYTES,
                 cache_key_file: str | os.PathLike[str] | None = None,
                 store_dir: str | os.PathLike[str] | None = None, private_store: bool = True,
                 max_work: int | None = None):
        self.threads = max(1, int(threads if threads is not None else (os.cpu_count() or 1)))
        #: None, or why ai-edge-litert cannot be loaded. Loading it is part of opening the
        #: device (tens of ms the first time in a process), as a driver service loads its
        #: engine at start-up, not inside the first prepareModel or prepareModelFromCache.
        self.engine_unavailable = unavailable()
        # The model cache authenticates inputs/outputs; the data cache is the flatbuffer.
        store = PrivateStore(store_dir if store_dir is not None else
                             default_store_dir("litert")) if private_store else None
        super().__init__(name, workers, max_tensor_bytes,
                         LiteRTCache(VERSION_STRING, cache_key(cache_key_file), self.threads,
                                     store), max_work)
        self._cache.max_work = self.max_work  # type: ignore[attr-defined]

    # ---- IDevice ----------------------------------------------------------------------------
    def get_capabilities(self) -> tuple[ErrorStatus, Capabilities]:
        types = sorted(t for t in OperandType if t not in (OperandType.OEM,
                                                             OperandType.TENSOR_OEM_BYTE))
        relaxed = PerformanceInfo(FLOAT32_TENSOR_PERF, FLOAT32_TENSOR_PERF)
        scalar = PerformanceInfo(SCALAR_PERF, SCALAR_PERF)
        loops = PerformanceInfo(OTHER_PERF, OTHER_PERF)
        return ErrorStatus.NONE, Capabilities(
            relaxed_float32_to_float16_performance_scalar=scalar,
            relaxed_float32_to_float16_performance_tensor=relaxed,
            operand_performance=[OperandPerformance(int(t), PerformanceInfo(_perf(t), _perf(t)))
                                 for t in types],
            if_performance=loops, while_performance=loops)

    # ---- DeviceBase -------------------------------------------------------------------------
    def supported(self, graph: ModelGraph) -> list[bool]:
        # What the analysis found this device cannot take (a temporary or a work estimate
        # past its bounds, an extension it does not offer) is not claimed either.
        ok = support.supported_operations(graph)
        return [a and b for a, b in zip(ok, self.claimed(graph))]

    def refusal(self, graph: ModelGraph) -> str | None:
        return support.refusal(graph)

    def operation_reasons(self, graph: ModelGraph) -> list[str | None]:
        reasons = support.operation_reasons(graph)
        return [why if why is not None or runnable else
                graph.reasons.get((-1, k)) or "not runnable here"
                for k, (why, runnable) in enumerate(zip(reasons, self.claimed(graph)))]

    def compile_now(self, model: Model, graph: ModelGraph) -> bytes:
        # Now, not in the task: the client may change its Model once prepareModel returns.
        # The graph prepare has (no second analysis); the weights outside the tables, which
        # ai-edge-litert reads: where they lie in the frame the file was read into (not
        # copied at all), else copied once, straight into the bytes it maps.
        return write_tflite(model, graph=graph, data_outside=True, exact_resize=True,
                            in_frame=True)

    def build(self, graph: ModelGraph, compiled: Any, priority: Priority,
              deadline: int | None) -> tuple[ErrorStatus, IPreparedModel | None]:
        xnnpack = not support.builtin_kernels(graph)
        try:
            first = Engine(compiled, self.threads, xnnpack)
        except Exception as e:  # noqa: BLE001 - the interpreter refused the flatbuffer
            self.log(f"prepare failed: {type(e).__name__}: {e}")
            return ErrorStatus.GENERAL_FAILURE, None
        if deadline is not None and time.monotonic_ns() > deadline:
            return ErrorStatus.MISSED_DEADLINE_TRANSIENT, None
        return ErrorStatus.NONE, LiteRTPreparedModel(
            self, LiteRTPlan(graph, EnginePool(compiled, self.threads, first, xnnpack,
                                               support.divides(graph))), priority)

    def restored(self, plan: LiteRTPlan, priority: Priority) -> LiteRTPreparedModel:
        return LiteRTPreparedModel(self, plan, priority)
