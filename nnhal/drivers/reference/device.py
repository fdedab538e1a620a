"""The reference CPU driver's IDevice."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

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
from nnhal.drivers.reference.cache import PlanCache
from nnhal.drivers.reference.prepared_model import ReferencePreparedModel
from nnhal.executor import ModelPlan
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
from nnhal.ops import native
from nnhal.ops.registry import OpError
from nnhal.validation import (
    ValidationError,
    validate_preference,
    validate_priority,
)

log = logging.getLogger("nnhal.drivers.reference")

VERSION_STRING = "nnhal-reference-0.1"


def _blas_threads(given: int | None) -> int:
    if given is None:
        text = os.environ.get("NNHAL_BLAS_THREADS", "1")
        try:
            given = int(text)
        except ValueError:
            log.warning("NNHAL_BLAS_THREADS=%r is not a number; using 1", text)
            given = 1
    return max(0, int(given))


class ReferenceDevice(IDevice):
    """A CPU device that runs every supported operation with numpy.

    ``name`` is the device name a runtime would show; ``workers`` bounds the threads that run
    asynchronous preparations and executions. ``cache_key_file`` (default: the environment
    variable ``NNHAL_CACHE_KEY_FILE``, if set) holds the secret that authenticates compilation
    caches, created on first use, so that caches outlive the process; without one, a fresh
    secret per device means caches are valid for this device object only.
    """

    def __init__(self, name: str = "nnhal-reference", workers: int = 4,
                 cache_key_file: str | os.PathLike[str] | None = None,
                 max_tensor_bytes: int = MAX_TENSOR_BYTES, blas_threads: int | None = None):
        self.name = name
        self.max_tensor_bytes = max_tensor_bytes
        #: BLAS threads while a model with GEMMs executes (0: leave BLAS alone). One by
        #: default: the driver's own worker and a second BLAS thread fight over the cores of a
        #: small machine (2 threads measured up to 8x slower under load, never faster by more
        #: than a few percent when idle). ``NNHAL_BLAS_THREADS`` overrides the default.
        self.blas_threads = _blas_threads(blas_threads)
        self.workers = WorkerPools(workers)
        self._native_logged = False
        #: The memory-domain buffers of this device, by token.
        self.buffers: TokenRegistry[RequestBuffer] = TokenRegistry()
        if cache_key_file is None:
            cache_key_file = os.environ.get("NNHAL_CACHE_KEY_FILE") or None
        key = None if cache_key_file is None else load_or_create_key(cache_key_file)
        # compilation caching: reference/cache.py (the plan image), common/compilation_cache.py
        self._cache = PlanCache(VERSION_STRING, key, max_tensor_bytes)
        # A service starts its workers with itself: the first preparation or execution of each
        # priority then does not pay for creating a thread (about 0.5 ms here).
        self.workers.start()

    # ---- plumbing ---------------------------------------------------------------------------
    def log(self, message: str) -> None:
        log.debug("%s: %s", self.name, message)

    def executor_for(self, priority: Priority) -> ThreadPoolExecutor:
        """One worker pool per priority, so high-priority work never queues behind low."""
        return self.workers.for_priority(priority)

    def close(self) -> None:
        self.workers.close()

    def _prepared_model(self, plan: ModelPlan, priority: Priority) -> ReferencePreparedModel:
        return ReferencePreparedModel(self, plan, priority)

    # ---- model analysis ---------------------------------------------------------------------
    def analyse(self, model: Model, *, own_constants: bool = True) -> ModelGraph:
        """The model checked once (raises ValidationError or OpError when it is invalid)."""
        return analyse(model, own_constants=own_constants,
                       max_tensor_bytes=self.max_tensor_bytes)

    # ---- IDevice ----------------------------------------------------------------------------
    def get_capabilities(self) -> tuple[ErrorStatus, Capabilities]:
        perf = PerformanceInfo(1.0, 1.0)
        types = sorted(t for t in OperandType if t not in (OperandType.OEM,
                                                             OperandType.TENSOR_OEM_BYTE))
        return ErrorStatus.NONE, Capabilities(
            relaxed_float32_to_float16_performance_scalar=perf,
            relaxed_float32_to_float16_performance_tensor=perf,
            operand_performance=[OperandPerformance(int(t), perf) for t in types],
            if_performance=perf, while_performance=perf)

    def get_supported_operations(self, model: Model) -> tuple[ErrorStatus, list[bool]]:
        try:
            return ErrorStatus.NONE, self.analyse(model, own_constants=False).supported_operations()
        except (ValidationError, OpError) as e:
            self.log(f"invalid model: {e}")
            return ErrorStatus.INVALID_ARGUMENT, []
        except Exception as e:  # noqa: BLE001
            self.log(f"invalid model: {type(e).__name__}: {e}")
            return ErrorStatus.INVALID_ARGUMENT, []

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
            self.log(f"prepareModel rejected: {e}")
            _notify_prepared(callback, ErrorStatus.INVALID_ARGUMENT, None)
            return ErrorStatus.INVALID_ARGUMENT
        if graph.too_large:
            self.log(f"prepareModel refused: {graph.too_large[0]}")
            _notify_prepared(callback, ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT, None)
            return ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT
        if not all(graph.main.supported):
            self.log(f"prepareModel rejected: unsupported operations: "
                     f"{', '.join(graph.unsupported_names())}")
            _notify_prepared(callback, ErrorStatus.INVALID_ARGUMENT, None)
            return ErrorStatus.INVALID_ARGUMENT
        if deadline is not None and time.monotonic_ns() > deadline:
            # As upstream's QoS tests expect: the launch succeeds, the callback carries the miss.
            _notify_prepared(callback, ErrorStatus.MISSED_DEADLINE_PERSISTENT, None)
            return ErrorStatus.NONE
        priority = Priority(priority)
        save = self._cache.open_save(model_cache, data_cache, token)  # None: do not save

        def task() -> None:
            status, prepared = self._prepare(graph, priority, deadline)
            if save is not None:  # before notifying: the client may close its fds after
                self._cache.save(save, model, priority, prepared)
            _notify_prepared(callback, status, prepared)

        try:
            self.executor_for(priority).submit(task)
        except Exception:  # noqa: BLE001
            _notify_prepared(callback, ErrorStatus.GENERAL_FAILURE, None)
            return ErrorStatus.GENERAL_FAILURE
        return ErrorStatus.NONE

    def _prepare(self, graph: ModelGraph, priority: Priority, deadline: int | None
                 ) -> tuple[ErrorStatus, IPreparedModel | None]:
        try:
            plan = ModelPlan(graph, self.max_tensor_bytes)
        except OpError as e:
            self.log(f"prepare failed: {e}")
            return ErrorStatus.INVALID_ARGUMENT, None
        except Exception as e:  # noqa: BLE001
            self.log(f"prepare failed: {type(e).__name__}: {e}")
            return ErrorStatus.GENERAL_FAILURE, None
        why = native.status_if_tried()  # tried when a bound kernel asked for it
        if why is not None and not self._native_logged:
            self._native_logged = True
            log.info("%s: native kernels: %s", self.name, why)
        if deadline is not None and time.monotonic_ns() > deadline:
            return ErrorStatus.MISSED_DEADLINE_TRANSIENT, None
        return ErrorStatus.NONE, ReferencePreparedModel(self, plan, priority)

    def prepare_model_from_cache(self, deadline: int | None, model_cache: Sequence[object],
                                 data_cache: Sequence[object], token: bytes,
                                 callback: IPreparedModelCallback) -> ErrorStatus:
        return self._cache.prepare_from_cache(deadline, model_cache, data_cache, token,
                                              callback, make_prepared_model=self._prepared_model,
                                              workers=self.workers, driver_log=self.log)

    def allocate(self, desc: BufferDesc, prepared_models: Sequence[IPreparedModel],
                 input_roles: Sequence[BufferRole], output_roles: Sequence[BufferRole]
                 ) -> tuple[ErrorStatus, IBuffer | None, int]:
        return allocate(self, self.buffers, desc, prepared_models, input_roles, output_roles)
