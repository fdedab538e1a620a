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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import nnhal.drivers.litert.support as support
from nnhal.analysis import MAX_TENSOR_BYTES, ModelGraph, analyse
from nnhal.drivers.common.buffer import allocate
from nnhal.drivers.common.callbacks import notify_prepared as _notify_prepared
from nnhal.drivers.common.compilation_cache import (
    NUM_DATA_CACHE,
    NUM_MODEL_CACHE,
    load_or_create_key,
)
from nnhal.drivers.common.tokens import TokenRegistry
from nnhal.drivers.common.workers import WorkerPools
from nnhal.drivers.litert.cache import LiteRTCache, LiteRTPlan
from nnhal.drivers.litert.engine import Engine, EnginePool, unavailable
from nnhal.drivers.litert.prepared_model import LiteRTPreparedModel
from nnhal.hal import checks
from nnhal.hal.interfaces import IBuffer, IDevice, IPreparedModel, IPreparedModelCallback
from nnhal.hal.request_pool import RequestBuffer
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    Capabilities,
    DeviceType,
    ErrorStatus,
    ExecutionPreference,
    Extension,
    Model,
    OperandPerformance,
    OperandType,
    PerformanceInfo,
    Priority,
)
from nnhal.tflite import write_tflite
from nnhal.validation import validate_preference, validate_priority

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


class LiteRTDevice(IDevice):
    """A CPU device that runs whole models with ai-edge-litert (TFLite kernels, XNNPACK).

    ``threads`` is each interpreter's thread count (default: every core); ``workers`` bounds
    the threads that run asynchronous preparations and executions. ``cache_key_file`` (default:
    ``NNHAL_CACHE_KEY_FILE``, if set) holds the secret that authenticates compilation caches,
    as for the reference driver.
    """

    def __init__(self, name: str = "nnhal-litert", threads: int | None = None,
                 workers: int = 4, max_tensor_bytes: int = MAX_TENSOR_BYTES,
                 cache_key_file: str | os.PathLike[str] | None = None):
        self.name = name
        self.threads = max(1, int(threads if threads is not None else (os.cpu_count() or 1)))
        self.max_tensor_bytes = max_tensor_bytes
        self.workers = WorkerPools(workers)
        #: The memory-domain buffers of this device, by token.
        self.buffers: TokenRegistry[RequestBuffer] = TokenRegistry()
        if cache_key_file is None:
            cache_key_file = os.environ.get("NNHAL_CACHE_KEY_FILE") or None
        key = None if cache_key_file is None else load_or_create_key(cache_key_file)
        #: The model cache authenticates inputs/outputs; the data cache is the flatbuffer.
        self._cache = LiteRTCache(VERSION_STRING, key, self.threads)
        #: None, or why ai-edge-litert cannot be loaded. Loading it is part of opening the
        #: device (tens of ms the first time in a process), as a driver service loads its
        #: engine at start-up, not inside the first prepareModel or prepareModelFromCache.
        self.engine_unavailable = unavailable()
        self.workers.start()

    # ---- plumbing ---------------------------------------------------------------------------
    def log(self, message: str) -> None:
        log.debug("%s: %s", self.name, message)

    def executor_for(self, priority: Priority) -> ThreadPoolExecutor:
        return self.workers.for_priority(priority)

    def close(self) -> None:
        self.workers.close()

    def analyse(self, model: Model, *, own_constants: bool = True) -> ModelGraph:
        """The model checked once (raises ValidationError or OpError when it is invalid)."""
        return analyse(model, own_constants=own_constants,
                       max_tensor_bytes=self.max_tensor_bytes)

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

    def get_supported_operations(self, model: Model) -> tuple[ErrorStatus, list[bool]]:
        try:
            graph = self.analyse(model, own_constants=False)
            theirs = support.supported_operations(graph)
        except Exception as e:  # noqa: BLE001 - any failure of analysis: an invalid model
            self.log(f"invalid model: {type(e).__name__}: {e}")
            return ErrorStatus.INVALID_ARGUMENT, []
        return ErrorStatus.NONE, theirs

    def get_type(self) -> tuple[ErrorStatus, DeviceType]:
        return ErrorStatus.NONE, DeviceType.CPU

    def get_version_string(self) -> tuple[ErrorStatus, str]:
        return ErrorStatus.NONE, VERSION_STRING

    def get_supported_extensions(self) -> tuple[ErrorStatus, list[Extension]]:
        return ErrorStatus.NONE, []

    def get_number_of_cache_files_needed(self) -> tuple[ErrorStatus, int, int]:
        return ErrorStatus.NONE, NUM_MODEL_CACHE, NUM_DATA_CACHE

    def prepare_model(self, model: Model, preference: ExecutionPreference = (
                          ExecutionPreference.FAST_SINGLE_ANSWER),
                      priority: Priority = Priority.MEDIUM, deadline: int | None = None,
                      model_cache: Sequence[object] = (), data_cache: Sequence[object] = (),
                      token: bytes = b"", callback: IPreparedModelCallback | None = None
                      ) -> ErrorStatus:
        if callback is None or not hasattr(callback, "notify"):
            return ErrorStatus.INVALID_ARGUMENT
        try:
            checks.check_preference(preference)
            checks.check_priority(priority)
            checks.check_deadline(deadline)
            validate_preference(preference)
            validate_priority(priority)
            graph = self.analyse(model)
        except Exception as e:  # noqa: BLE001 - every failure is a status
            return self._refuse(callback, ErrorStatus.INVALID_ARGUMENT, f"rejected: {e}")
        if graph.too_large:
            return self._refuse(callback, ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
                                f"refused: {graph.too_large[0]}")
        try:
            why = support.refusal(graph)
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {e}"
        if why is not None:
            return self._refuse(callback, ErrorStatus.INVALID_ARGUMENT, f"refused: {why}")
        try:
            # Now, not in the task: the client may change its Model once this call returns.
            flatbuffer = write_tflite(model)
        except Exception as e:  # noqa: BLE001 - UnsupportedModelError names each operation
            return self._refuse(callback, ErrorStatus.INVALID_ARGUMENT, f"refused: {e}")
        if deadline is not None and time.monotonic_ns() > deadline:
            _notify_prepared(callback, ErrorStatus.MISSED_DEADLINE_PERSISTENT, None)
            return ErrorStatus.NONE
        priority = Priority(priority)
        save = self._cache.open_save(model_cache, data_cache, token)  # None: do not save

        def task() -> None:
            status, prepared = self._prepare(graph, flatbuffer, priority, deadline)
            if save is not None:  # before notifying: the client may close its fds after
                self._cache.save(save, model, priority, prepared)
            _notify_prepared(callback, status, prepared)

        try:
            self.executor_for(priority).submit(task)
        except Exception:  # noqa: BLE001
            _notify_prepared(callback, ErrorStatus.GENERAL_FAILURE, None)
            return ErrorStatus.GENERAL_FAILURE
        return ErrorStatus.NONE

    def _refuse(self, callback: IPreparedModelCallback, status: ErrorStatus,
                why: str) -> ErrorStatus:
        self.log(f"prepareModel {why}")
        _notify_prepared(callback, status, None)
        return status

    def _prepare(self, graph: ModelGraph, flatbuffer: bytes, priority: Priority,
                 deadline: int | None) -> tuple[ErrorStatus, IPreparedModel | None]:
        try:
            first = Engine(flatbuffer, self.threads)
        except Exception as e:  # noqa: BLE001 - the interpreter refused the flatbuffer
            self.log(f"prepare failed: {type(e).__name__}: {e}")
            return ErrorStatus.GENERAL_FAILURE, None
        if deadline is not None and time.monotonic_ns() > deadline:
            return ErrorStatus.MISSED_DEADLINE_TRANSIENT, None
        return ErrorStatus.NONE, LiteRTPreparedModel(
            self, LiteRTPlan(graph, EnginePool(flatbuffer, self.threads, first)), priority)

    def prepare_model_from_cache(self, deadline: int | None, model_cache: Sequence[object],
                                 data_cache: Sequence[object], token: bytes,
                                 callback: IPreparedModelCallback) -> ErrorStatus:
        return self._cache.prepare_from_cache(deadline, model_cache, data_cache, token,
                                              callback, make_prepared_model=self._restored,
                                              workers=self.workers, driver_log=self.log)

    def _restored(self, plan: LiteRTPlan, priority: Priority) -> LiteRTPreparedModel:
        return LiteRTPreparedModel(self, plan, priority)

    def allocate(self, desc: BufferDesc, prepared_models: Sequence[IPreparedModel],
                 input_roles: Sequence[BufferRole], output_roles: Sequence[BufferRole]
                 ) -> tuple[ErrorStatus, IBuffer | None, int]:
        return allocate(self, self.buffers, desc, prepared_models, input_roles, output_roles)
