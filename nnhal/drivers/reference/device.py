"""The reference CPU driver's IDevice."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from nnhal.analysis import MAX_TENSOR_BYTES, ModelGraph
from nnhal.drivers.common.device import DeviceBase, cache_key
from nnhal.drivers.reference.cache import PlanCache
from nnhal.drivers.reference.prepared_model import ReferencePreparedModel
from nnhal.executor import ModelPlan
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import (
    Capabilities,
    ErrorStatus,
    OperandPerformance,
    OperandType,
    PerformanceInfo,
    Priority,
)
from nnhal.ops import native
from nnhal.ops.resolver import OpError

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


class ReferenceDevice(DeviceBase):
    """A CPU device that runs every supported operation with numpy.

    ``name`` is the device name a runtime would show; ``workers`` bounds the threads that run
    asynchronous preparations and executions. ``cache_key_file`` (default: the environment
    variable ``NNHAL_CACHE_KEY_FILE``, if set) holds the secret that authenticates compilation
    caches, created on first use, so that caches outlive the process; without one, a fresh
    secret per device means caches are valid for this device object only. ``extensions``
    names the installed vendor extensions it offers (by default those nnhal ships:
    ``org.nnhal.tflite``, TFLite builtins the HAL lacks, :mod:`nnhal.extensions.
    tflite_builtins`; ``com.google.mediapipe``, MediaPipe's custom operators,
    :mod:`nnhal.extensions.mediapipe`; ``()`` offers none; see :mod:`nnhal.ops.extensions`).
    ``max_work`` bounds one execution's estimated work (default ``$NNHAL_MAX_WORK``, else
    :data:`nnhal.analysis.MAX_WORK`): a model beyond it is refused at prepare.
    """

    version_string = VERSION_STRING
    logger = log
    extensions: tuple[str, ...] = ("org.nnhal.tflite", "com.google.mediapipe")

    def __init__(self, name: str = "nnhal-reference", workers: int = 4,
                 cache_key_file: str | os.PathLike[str] | None = None,
                 max_tensor_bytes: int = MAX_TENSOR_BYTES, blas_threads: int | None = None,
                 extensions: tuple[str, ...] | None = None, max_work: int | None = None):
        #: BLAS threads while a model with GEMMs executes (0: leave BLAS alone). One by
        #: default: the driver's own worker and a second BLAS thread fight over the cores of a
        #: small machine (2 threads measured up to 8x slower under load, never faster by more
        #: than a few percent when idle). ``NNHAL_BLAS_THREADS`` overrides the default.
        self.blas_threads = _blas_threads(blas_threads)
        self._native_logged = False
        if extensions is not None:
            self.extensions = tuple(extensions)
        # compilation caching: reference/cache.py (the plan image), common/compilation_cache.py
        super().__init__(name, workers, max_tensor_bytes,
                         PlanCache(VERSION_STRING, cache_key(cache_key_file), max_tensor_bytes),
                         max_work)
        self._cache.max_work = self.max_work  # type: ignore[attr-defined]

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

    # ---- DeviceBase -------------------------------------------------------------------------
    def supported(self, graph: ModelGraph) -> list[bool]:
        return self.claimed(graph)

    def build(self, graph: ModelGraph, compiled: Any, priority: Priority,
              deadline: int | None) -> tuple[ErrorStatus, IPreparedModel | None]:
        try:
            plan = ModelPlan(graph, self.max_tensor_bytes, self.max_work)
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

    def restored(self, plan: ModelPlan, priority: Priority) -> ReferencePreparedModel:
        return ReferencePreparedModel(self, plan, priority)
