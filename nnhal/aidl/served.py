"""Any canonical device served through the AIDL interfaces: :class:`AidlDevice`.

Each AIDL call converts its arguments (a bad one is INVALID_ARGUMENT before the driver is
asked), makes the canonical call and turns its status into AIDL's convention: a value, an
ExecutionResult with ``output_sufficient_size`` False for OUTPUT_INSUFFICIENT_SIZE, or a
ServiceSpecificError / DeadObjectError. No other exception leaves a method: a driver that
breaks its contract and raises is GENERAL_FAILURE.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from nnhal.aidl import convert as cv
from nnhal.aidl import interfaces as ai
from nnhal.aidl import types as A
from nnhal.aidl.errors import DeadObjectError, ServiceSpecificError, invalid, raise_status
from nnhal.hal import interfaces as ci
from nnhal.hal.types import ErrorStatus

F = TypeVar("F", bound=Callable[..., Any])


def _served(fn: F) -> F:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ServiceSpecificError, DeadObjectError):
            raise
        except Exception as e:  # noqa: BLE001 - the face's promise: only AIDL's errors
            raise ServiceSpecificError(ErrorStatus.GENERAL_FAILURE,
                                       f"{fn.__name__}: {type(e).__name__}: {e}"[:200]) \
                from None
    return call  # type: ignore[return-value]


def _aidl_status(status: ErrorStatus) -> ErrorStatus:
    """A status a callback or getExecutionInfo may carry (AIDL has no DEAD_OBJECT)."""
    return ErrorStatus.DEVICE_UNAVAILABLE if status == ErrorStatus.DEAD_OBJECT else status


class _PreparedModelCallback(ci.IPreparedModelCallback):
    """The canonical driver's callback, notifying the AIDL client's callback."""

    def __init__(self, callback: ai.IPreparedModelCallback):
        self.callback = callback

    def notify(self, status: ErrorStatus, prepared_model: ci.IPreparedModel | None) -> None:
        ok = status == ErrorStatus.NONE and prepared_model is not None
        try:
            self.callback.notify(_aidl_status(ErrorStatus(status)) if ok or status else
                                 ErrorStatus.GENERAL_FAILURE,
                                 AidlPreparedModel(prepared_model) if ok else None)
        except Exception:  # noqa: BLE001, S110 - a client's broken callback is its own affair
            pass


def _callback(callback: object) -> _PreparedModelCallback:
    return _PreparedModelCallback(cv.is_a(callback, ai.IPreparedModelCallback, "callback"))


class AidlFencedExecutionCallback(ai.IFencedExecutionCallback):
    def __init__(self, callback: ci.IFencedExecutionCallback):
        self.canonical = callback

    @_served
    def get_execution_info(self) -> tuple[ErrorStatus, A.Timing, A.Timing]:
        status, launched, fenced = self.canonical.get_execution_info()
        return (_aidl_status(ErrorStatus(status)), cv.timing_to_aidl(launched),
                cv.timing_to_aidl(fenced))


def _fenced(answer: tuple[ErrorStatus, Any, Any]) -> A.FencedExecutionResult:
    status, fence, callback = answer
    raise_status(status)
    if callback is None:
        raise ServiceSpecificError(ErrorStatus.GENERAL_FAILURE, "the driver gave no callback")
    return A.FencedExecutionResult(AidlFencedExecutionCallback(callback), fence)


class AidlBuffer(ai.IBuffer):
    def __init__(self, buffer: ci.IBuffer):
        self.canonical = buffer

    @_served
    def copy_from(self, src: A.SharedMemory, dimensions: Sequence[int]) -> None:
        raise_status(self.canonical.copy_from(cv.memory(src, "src"),
                                              cv.dims(dimensions, "dimensions")))

    @_served
    def copy_to(self, dst: A.SharedMemory) -> None:
        raise_status(self.canonical.copy_to(cv.memory(dst, "dst")))


class AidlExecution(ai.IExecution):
    def __init__(self, execution: ci.IExecution):
        self.canonical = execution

    @_served
    def execute_synchronously(self, deadline_ns: int) -> A.ExecutionResult:
        return cv.result_to_aidl(*self.canonical.compute(cv.deadline_from_aidl(deadline_ns)))

    @_served
    def execute_fenced(self, wait_for: Sequence[Any], deadline_ns: int, duration_ns: int
                       ) -> A.FencedExecutionResult:
        return _fenced(self.canonical.compute_fenced(cv.fences(wait_for),
                                                     cv.deadline_from_aidl(deadline_ns),
                                                     cv.duration_from_aidl(duration_ns)))


class AidlBurst(ai.IBurst):
    """A canonical burst; each memory identifier token keeps a canonical cache hold of its
    memory until ``release_memory_resource`` (or the burst) drops it."""

    def __init__(self, burst: ci.IBurst):
        self.canonical = burst
        self._holds: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def _hold(self, request: Any, tokens: object) -> None:
        tokens = cv.list_of(tokens, "memoryIdentifierTokens",
                            lambda v, w: cv.int64(v, w, -1))
        if len(tokens) != len(request.pools):
            raise invalid(f"memoryIdentifierTokens holds {len(tokens)} tokens for "
                          f"{len(request.pools)} pools")
        for token, pool in zip(tokens, request.pools, strict=True):
            memory = pool.hidl_memory
            if token == -1 or memory is None:
                continue
            with self._lock:
                held = self._holds.get(token)
                if held is None or held[0] is not memory:
                    self._holds[token] = (memory, self.canonical.cache_memory(memory))

    @_served
    def execute_synchronously(self, request: A.Request, memory_identifier_tokens: Sequence[int],
                              measure_timing: bool, deadline_ns: int,
                              loop_timeout_duration_ns: int) -> A.ExecutionResult:
        r = cv.request_from_aidl(request)
        self._hold(r, memory_identifier_tokens)
        return cv.result_to_aidl(*self.canonical.execute(
            r, cv.measure_from_aidl(measure_timing), cv.deadline_from_aidl(deadline_ns),
            cv.duration_from_aidl(loop_timeout_duration_ns, "loopTimeoutDurationNs")))

    @_served
    def execute_synchronously_with_config(self, request: A.Request,
                                          memory_identifier_tokens: Sequence[int],
                                          config: A.ExecutionConfig, deadline_ns: int
                                          ) -> A.ExecutionResult:
        r = cv.request_from_aidl(request)
        self._hold(r, memory_identifier_tokens)
        return cv.result_to_aidl(*self.canonical.execute_with_config(
            r, cv.execution_config_from_aidl(config), cv.deadline_from_aidl(deadline_ns)))

    @_served
    def release_memory_resource(self, memory_identifier_token: int) -> None:
        token = cv.int64(memory_identifier_token, "memoryIdentifierToken", 0)
        with self._lock:
            held = self._holds.pop(token, None)
        release = getattr(held[1], "release", None) if held else None
        if release is not None:
            release()

    @property
    def held_tokens(self) -> int:
        """How many memory identifier tokens hold a cached memory now."""
        return len(self._holds)


class AidlPreparedModel(ai.IPreparedModel):
    def __init__(self, prepared_model: ci.IPreparedModel):
        self.canonical = prepared_model

    @_served
    def execute_synchronously(self, request: A.Request, measure_timing: bool, deadline_ns: int,
                              loop_timeout_duration_ns: int) -> A.ExecutionResult:
        return cv.result_to_aidl(*self.canonical.execute_synchronously(
            cv.request_from_aidl(request), cv.measure_from_aidl(measure_timing),
            cv.deadline_from_aidl(deadline_ns),
            cv.duration_from_aidl(loop_timeout_duration_ns, "loopTimeoutDurationNs")))

    @_served
    def execute_fenced(self, request: A.Request, wait_for: Sequence[Any], measure_timing: bool,
                       deadline_ns: int, loop_timeout_duration_ns: int, duration_ns: int
                       ) -> A.FencedExecutionResult:
        return _fenced(self.canonical.execute_fenced(
            cv.request_from_aidl(request), cv.fences(wait_for),
            cv.measure_from_aidl(measure_timing), cv.deadline_from_aidl(deadline_ns),
            cv.duration_from_aidl(loop_timeout_duration_ns, "loopTimeoutDurationNs"),
            cv.duration_from_aidl(duration_ns)))

    @_served
    def configure_execution_burst(self) -> ai.IBurst:
        status, burst = self.canonical.configure_execution_burst()
        raise_status(status)
        return AidlBurst(burst)

    @_served
    def create_reusable_execution(self, request: A.Request, config: A.ExecutionConfig
                                  ) -> ai.IExecution:
        status, execution = self.canonical.create_reusable_execution_with_config(
            cv.request_from_aidl(request), cv.execution_config_from_aidl(config))
        raise_status(status)
        return AidlExecution(execution)

    @_served
    def execute_synchronously_with_config(self, request: A.Request, config: A.ExecutionConfig,
                                          deadline_ns: int) -> A.ExecutionResult:
        return cv.result_to_aidl(*self.canonical.execute_synchronously_with_config(
            cv.request_from_aidl(request), cv.execution_config_from_aidl(config),
            cv.deadline_from_aidl(deadline_ns)))

    @_served
    def execute_fenced_with_config(self, request: A.Request, wait_for: Sequence[Any],
                                   config: A.ExecutionConfig, deadline_ns: int,
                                   duration_ns: int) -> A.FencedExecutionResult:
        return _fenced(self.canonical.execute_fenced_with_config(
            cv.request_from_aidl(request), cv.fences(wait_for),
            cv.execution_config_from_aidl(config), cv.deadline_from_aidl(deadline_ns),
            cv.duration_from_aidl(duration_ns)))


def _prepared(parcel: object, what: str) -> ci.IPreparedModel:
    p = cv.is_a(parcel, A.IPreparedModelParcel, what)
    return cv.is_a(p.prepared_model, AidlPreparedModel,
                   f"{what}.preparedModel (one this service prepared)").canonical


class AidlDevice(ai.IDevice):
    """A canonical :class:`nnhal.hal.IDevice` behind the AIDL IDevice (AIDL v4)."""

    def __init__(self, device: ci.IDevice):
        if not isinstance(device, ci.IDevice):
            raise TypeError(f"AidlDevice serves an nnhal.hal.IDevice, not "
                            f"{type(device).__name__}")
        self.canonical = device

    @_served
    def allocate(self, desc: A.BufferDesc, prepared_models: Sequence[A.IPreparedModelParcel],
                 input_roles: Sequence[A.BufferRole], output_roles: Sequence[A.BufferRole]
                 ) -> A.DeviceBuffer:
        status, buffer, token = self.canonical.allocate(
            cv.buffer_desc(desc), cv.list_of(prepared_models, "preparedModels", _prepared),
            cv.roles(input_roles, "inputRoles"), cv.roles(output_roles, "outputRoles"))
        raise_status(status)
        return A.DeviceBuffer(AidlBuffer(buffer), token)

    @_served
    def get_capabilities(self) -> A.Capabilities:
        status, capabilities = self.canonical.get_capabilities()
        raise_status(status)
        return capabilities

    @_served
    def get_number_of_cache_files_needed(self) -> A.NumberOfCacheFiles:
        status, n_model, n_data = self.canonical.get_number_of_cache_files_needed()
        raise_status(status)
        return A.NumberOfCacheFiles(n_model, n_data)

    @_served
    def get_supported_extensions(self) -> list[A.Extension]:
        status, extensions = self.canonical.get_supported_extensions()
        raise_status(status)
        return list(extensions)

    @_served
    def get_supported_operations(self, model: A.Model) -> list[bool]:
        status, supported = self.canonical.get_supported_operations(cv.model_from_aidl(model))
        raise_status(status)
        return list(supported)

    @_served
    def get_type(self) -> A.DeviceType:
        status, kind = self.canonical.get_type()
        raise_status(status)
        return kind

    @_served
    def get_version_string(self) -> str:
        status, version = self.canonical.get_version_string()
        raise_status(status)
        return version

    @_served
    def prepare_model(self, model: A.Model, preference: int, priority: int, deadline_ns: int,
                      model_cache: Sequence[Any], data_cache: Sequence[Any], token: bytes,
                      callback: ai.IPreparedModelCallback) -> None:
        cb = _callback(callback)
        with _notifying(cb):
            args = (cv.model_from_aidl(model), cv.int32(preference, "preference"),
                    cv.int32(priority, "priority"), cv.deadline_from_aidl(deadline_ns),
                    cv.cache_files(model_cache, "modelCache"),
                    cv.cache_files(data_cache, "dataCache"), cv.token(token))
        raise_status(self.canonical.prepare_model(*args, cb))

    @_served
    def prepare_model_from_cache(self, deadline_ns: int, model_cache: Sequence[Any],
                                 data_cache: Sequence[Any], token: bytes,
                                 callback: ai.IPreparedModelCallback) -> None:
        cb = _callback(callback)
        with _notifying(cb):
            args = (cv.deadline_from_aidl(deadline_ns), cv.cache_files(model_cache, "modelCache"),
                    cv.cache_files(data_cache, "dataCache"), cv.token(token))
        raise_status(self.canonical.prepare_model_from_cache(*args, cb))

    @_served
    def prepare_model_with_config(self, model: A.Model, config: A.PrepareModelConfig,
                                  callback: ai.IPreparedModelCallback) -> None:
        cb = _callback(callback)
        with _notifying(cb):
            args = (cv.model_from_aidl(model), cv.prepare_config_from_aidl(config))
        raise_status(self.canonical.prepare_model_with_config(*args, cb))


class _notifying:
    """A bad argument of a prepare call notifies the callback too, as AIDL asks."""

    def __init__(self, callback: _PreparedModelCallback):
        self.callback = callback

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        if isinstance(error, ServiceSpecificError):
            self.callback.notify(error.status, None)
