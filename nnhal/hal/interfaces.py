"""The canonical HAL interfaces (IDevice, IPreparedModel, IBurst, IExecution, IBuffer) and the
callbacks, with the seeds' method sets under Pythonic names.

One interface serves every version: the calls HAL 1.3 and AIDL share, plus AIDL v4's
``*_with_config`` calls, whose defaults forward to the plain calls and drop the hints (AIDL lets
a driver ignore any hint), so a driver of the plain calls is a feature-level-8 driver without
more code. What only one interface family has lives in its face, at the edge: HAL 1.3's
callback-style execution (``execute_1_3`` with an IExecutionCallback) and the 1.2 FMQ packet in
:mod:`nnhal.hidl`, built on the synchronous call for every prepared model; AIDL's own shapes in
:mod:`nnhal.aidl`.

Methods return HAL-style tuples ``(status, ...)`` instead of raising, because that is the
contract a driver must keep: every failure is a status, never an exception across the boundary.
Times are steady-clock nanoseconds (``time.monotonic_ns()``); ``None`` means "not provided".
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

from nnhal.core.version import FeatureLevel
from nnhal.hal.fence import SyncFence
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    Capabilities,
    DeviceType,
    ErrorStatus,
    ExecutionConfig,
    ExecutionPreference,
    Extension,
    MeasureTiming,
    Model,
    OutputShape,
    PrepareModelConfig,
    Priority,
    Request,
    Timing,
)

CacheHandle = Any  # a file descriptor (int) or an object with fileno()


class IPreparedModelCallback(ABC):
    """IPreparedModelCallback (1.3): ``notify_1_3``."""

    @abstractmethod
    def notify(self, status: ErrorStatus, prepared_model: IPreparedModel | None) -> None:
        """notify_1_3(status, preparedModel)."""


class IFencedExecutionCallback(ABC):
    """IFencedExecutionCallback (1.3)."""

    @abstractmethod
    def get_execution_info(self) -> tuple[ErrorStatus, Timing, Timing]:
        """getExecutionInfo() -> (status, timingLaunched, timingFenced)."""


class IBuffer(ABC):
    """IBuffer (1.3): a driver-managed buffer of a memory domain."""

    @abstractmethod
    def copy_to(self, dst: Any) -> ErrorStatus:
        """copyTo(hidl_memory dst)."""

    @abstractmethod
    def copy_from(self, src: Any, dimensions: Sequence[int]) -> ErrorStatus:
        """copyFrom(hidl_memory src, vec<uint32_t> dimensions)."""


class IExecution(ABC):
    """Canonical IExecution: a reusable execution with its request validated once."""

    @abstractmethod
    def compute(self, deadline: int | None = None
                ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """compute(deadline)."""

    @abstractmethod
    def compute_fenced(self, wait_for: Sequence[SyncFence], deadline: int | None = None,
                       timeout_after_fence: int | None = None
                       ) -> tuple[ErrorStatus, SyncFence | None, IFencedExecutionCallback | None]:
        """computeFenced(waitFor, deadline, timeoutDurationAfterFence)."""


class IBurst(ABC):
    """Canonical IBurst: rapid executions of one prepared model, at most one at a time."""

    @abstractmethod
    def cache_memory(self, memory: Any) -> Any:
        """cacheMemory(memory): a hold that releases the cached mapping when dropped."""

    @abstractmethod
    def execute(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                deadline: int | None = None, loop_timeout: int | None = None
                ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """execute(request, measure, deadline, loopTimeoutDuration)."""

    @abstractmethod
    def create_reusable_execution(self, request: Request,
                                  measure: MeasureTiming = MeasureTiming.NO,
                                  loop_timeout: int | None = None
                                  ) -> tuple[ErrorStatus, IExecution | None]:
        """createReusableExecution(request, measure, loopTimeoutDuration)."""

    def execute_with_config(self, request: Request, config: ExecutionConfig,
                            deadline: int | None = None
                            ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """executeSynchronouslyWithConfig (AIDL v4); the default ignores the hints."""
        return self.execute(request, config.measure, deadline, config.loop_timeout)


class IPreparedModel(ABC):
    """The canonical IPreparedModel: synchronous, fenced, burst and reusable executions (HAL
    1.3's callback-style ``execute_1_3`` is the HIDL face's, :func:`nnhal.hidl.execute`)."""

    @abstractmethod
    def execute_synchronously(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                              deadline: int | None = None, loop_timeout: int | None = None
                              ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """executeSynchronously_1_3(request, measure, deadline, loopTimeoutDuration)."""

    def execute_fenced(self, request: Request, wait_for: Sequence[SyncFence],
                       measure: MeasureTiming = MeasureTiming.NO, deadline: int | None = None,
                       loop_timeout: int | None = None, duration: int | None = None
                       ) -> tuple[ErrorStatus, SyncFence | None, IFencedExecutionCallback | None]:
        """executeFenced(request, waitFor, measure, deadline, loopTimeoutDuration, duration)."""
        return ErrorStatus.GENERAL_FAILURE, None, None

    def configure_execution_burst(self) -> tuple[ErrorStatus, IBurst | None]:
        """configureExecutionBurst (canonical: IPreparedModel::configureExecutionBurst)."""
        return ErrorStatus.GENERAL_FAILURE, None

    def create_reusable_execution(self, request: Request,
                                  measure: MeasureTiming = MeasureTiming.NO,
                                  loop_timeout: int | None = None
                                  ) -> tuple[ErrorStatus, IExecution | None]:
        """createReusableExecution(request, measure, loopTimeoutDuration) (canonical)."""
        return ErrorStatus.GENERAL_FAILURE, None

    def execute_synchronously_with_config(self, request: Request, config: ExecutionConfig,
                                          deadline: int | None = None
                                          ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """executeSynchronouslyWithConfig (AIDL v4); the default ignores the hints."""
        return self.execute_synchronously(request, config.measure, deadline,
                                          config.loop_timeout)

    def execute_fenced_with_config(self, request: Request, wait_for: Sequence[SyncFence],
                                   config: ExecutionConfig, deadline: int | None = None,
                                   duration: int | None = None
                                   ) -> tuple[ErrorStatus, SyncFence | None,
                                              IFencedExecutionCallback | None]:
        """executeFencedWithConfig (AIDL v4); the default ignores the hints."""
        return self.execute_fenced(request, wait_for, config.measure, deadline,
                                   config.loop_timeout, duration)

    def create_reusable_execution_with_config(self, request: Request, config: ExecutionConfig
                                              ) -> tuple[ErrorStatus, IExecution | None]:
        """createReusableExecution as AIDL v4 has it; the default ignores the hints."""
        return self.create_reusable_execution(request, config.measure, config.loop_timeout)

    # ---- what a face asks to build an asynchronous call on the synchronous one ---------------
    def validate_request(self, request: Request, measure: MeasureTiming,
                         deadline: int | None, loop_timeout: int | None
                         ) -> ErrorStatus | None:
        """Whether this model takes the request, checked without running it: NONE, or
        INVALID_ARGUMENT. A face whose asynchronous call refuses a bad request at launch
        (HAL 1.3's) asks this first. The default, None, says the model cannot tell without
        running the request (an AIDL driver has no such call): the face then runs it at
        launch, on the caller's thread."""
        return None

    def executor(self) -> Executor | None:
        """Where asynchronous work on this model runs (the worker pool of its priority);
        None: a face runs it on a thread of its own."""
        return None

    # ---- nnhal's in-process shortcut (no HAL counterpart) ------------------------------------
    def bind_arrays(self, shapes: Sequence[tuple[int, ...]]) -> ArrayRun | None:
        """Runs of this model, in this process, with every main input given as a numpy array
        of these ``shapes`` (in the model's input order) and of its operand's numpy dtype,
        skipping request memory: what a :class:`~nnhal.session.Session` uses for its first
        run of a model without state and for repeated runs of one input layout. None (the
        default): not offered; the caller keeps using requests."""
        return None

    def bind_arrays_with_state(self, shapes: Sequence[tuple[int, ...]],
                               state: Sequence[tuple[int, int]]) -> StateArrayRun | None:
        """As :meth:`bind_arrays`, for a streaming model whose ``state`` pairs (main input
        index, main output index) carry each output to that input of the next run: the
        prepared model keeps those values itself between runs (a TFLite interpreter's resource
        variables), so runs take and give only the other inputs and outputs. ``shapes`` are
        every main input's, the state inputs' included. None (the default): not offered; the
        caller carries the state through :meth:`bind_arrays` or requests."""
        return None


class ArrayRun(ABC):
    """What :meth:`IPreparedModel.bind_arrays` returns: one input layout bound once."""

    @abstractmethod
    def run(self, inputs: Sequence[Any]) -> list[Any] | None:
        """Run once: ``inputs`` match the bound shapes and dtypes (the caller checked them; the
        arrays are only read); fresh arrays for every main output, in the model's declared
        shapes, or None when this run did not succeed here (nothing the caller sees has
        changed: the caller then runs the same inputs by request, which reports the failure
        or falls back). Never raises."""

    def direct(self) -> Any:
        """A callable doing :meth:`run` (same arguments and answers), which a binding may make
        in fewer steps (a closure over its engine's calls) for a caller that runs the same
        layout many times."""
        return self.run


class StateArrayRun(ArrayRun):
    """What :meth:`IPreparedModel.bind_arrays_with_state` returns: :meth:`run` takes the
    main inputs that are not state inputs and gives the main outputs that are not state
    outputs (each in the model's order), the state staying in the binding from one run to the
    next. :meth:`load` the state before the first run."""

    @abstractmethod
    def load(self, values: Sequence[Any]) -> bool:
        """Make ``values`` (one per state pair, in the pairs' order, of the state inputs'
        shapes and dtypes) the state the next run reads; False when it could not (the
        binding is not used again). Never raises."""

    @abstractmethod
    def read(self) -> list[Any] | None:
        """The state the next run would read (fresh arrays, in the pairs' order, of the state
        inputs' shapes), or None when it cannot be read. After a run answered None: the state
        before that run, or None when that run may have changed it. Never raises."""

    def one_call(self) -> Any:
        """For a model with one input and one output besides the state: a callable taking
        the input array and giving the output (or None, as :meth:`run`), which a binding may
        make in fewer steps than :meth:`run` (a closure over its engine's calls)."""
        def one(x: Any) -> Any | None:
            outs = self.run((x,))
            return None if outs is None else outs[0]
        return one


class IDevice(ABC):
    """The canonical IDevice: HAL 1.3's methods and AIDL v4's ``prepare_model_with_config``."""

    #: The feature level of the interface this device speaks (what the NDK's
    #: ``ANeuralNetworksDevice_getFeatureLevel`` reports). A device that implements only the
    #: 1.3 methods still answers the ``*_with_config`` calls through the defaults here.
    feature_level: FeatureLevel = FeatureLevel.V1_3

    @abstractmethod
    def get_capabilities(self) -> tuple[ErrorStatus, Capabilities | None]:
        """getCapabilities_1_3()."""

    @abstractmethod
    def get_supported_operations(self, model: Model) -> tuple[ErrorStatus, list[bool]]:
        """getSupportedOperations_1_3(model)."""

    @abstractmethod
    def get_type(self) -> tuple[ErrorStatus, DeviceType]:
        """getType()."""

    @abstractmethod
    def get_version_string(self) -> tuple[ErrorStatus, str]:
        """getVersionString()."""

    @abstractmethod
    def get_supported_extensions(self) -> tuple[ErrorStatus, list[Extension]]:
        """getSupportedExtensions()."""

    @abstractmethod
    def get_number_of_cache_files_needed(self) -> tuple[ErrorStatus, int, int]:
        """getNumberOfCacheFilesNeeded() -> (status, numModelCache, numDataCache)."""

    @abstractmethod
    def prepare_model(self, model: Model, preference: ExecutionPreference,
                      priority: Priority, deadline: int | None,
                      model_cache: Sequence[CacheHandle], data_cache: Sequence[CacheHandle],
                      token: bytes, callback: IPreparedModelCallback) -> ErrorStatus:
        """prepareModel_1_3(model, preference, priority, deadline, modelCache, dataCache,
        token, callback)."""

    def prepare_model_with_config(self, model: Model, config: PrepareModelConfig,
                                  callback: IPreparedModelCallback) -> ErrorStatus:
        """prepareModelWithConfig (AIDL v4); the default ignores the hints."""
        return self.prepare_model(model, config.preference, config.priority, config.deadline,
                                  config.model_cache, config.data_cache, config.cache_token,
                                  callback)

    @abstractmethod
    def prepare_model_from_cache(self, deadline: int | None,
                                 model_cache: Sequence[CacheHandle],
                                 data_cache: Sequence[CacheHandle], token: bytes,
                                 callback: IPreparedModelCallback) -> ErrorStatus:
        """prepareModelFromCache_1_3(deadline, modelCache, dataCache, token, callback)."""

    @abstractmethod
    def allocate(self, desc: BufferDesc, prepared_models: Sequence[IPreparedModel],
                 input_roles: Sequence[BufferRole], output_roles: Sequence[BufferRole]
                 ) -> tuple[ErrorStatus, IBuffer | None, int]:
        """allocate(desc, preparedModels, inputRoles, outputRoles) -> (status, buffer, token)."""


# ---- ready-made callbacks -------------------------------------------------------------------

class PreparedModelCallback(IPreparedModelCallback):
    """A waitable IPreparedModelCallback that records how often it was notified."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self.calls = 0
        self.status = ErrorStatus.GENERAL_FAILURE
        self.prepared_model: IPreparedModel | None = None

    def notify(self, status: ErrorStatus, prepared_model: IPreparedModel | None) -> None:
        with self._lock:
            self.calls += 1
            if self.calls == 1:
                self.status, self.prepared_model = ErrorStatus(status), prepared_model
        self._event.set()

    def wait(self, timeout: float | None = None) -> tuple[ErrorStatus, IPreparedModel | None]:
        if not self._event.wait(timeout):
            raise TimeoutError("prepared-model callback was not notified")
        return self.status, self.prepared_model
