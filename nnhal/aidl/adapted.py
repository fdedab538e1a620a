"""An AIDL driver as a canonical device: :func:`from_aidl`, and :func:`through_aidl`.

The canonical calls AIDL lacks are built on the AIDL ones: a burst's ``cache_memory`` hold is
a memory identifier token, released with ``releaseMemoryResource`` once the hold is dropped; on
a driver below v4, the ``*_with_config`` calls drop the hints and a reusable execution sends
its request each time. Every AIDL failure becomes a status (DeadObjectError is DEAD_OBJECT,
anything else a driver raises GENERAL_FAILURE), and a driver's answer that cannot be right (a
wrong type, a negative time, a count that does not match) is GENERAL_FAILURE. (HAL 1.3's
callback-style execution is no canonical call: the HIDL face builds it on
``execute_synchronously``.)
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from nnhal.aidl import convert as cv
from nnhal.aidl import interfaces as ai
from nnhal.aidl import types as A
from nnhal.aidl.errors import DeadObjectError, ServiceSpecificError
from nnhal.aidl.served import AidlDevice
from nnhal.core.version import FeatureLevel
from nnhal.hal import interfaces as ci
from nnhal.hal import types as C
from nnhal.hal.fence import FenceState, SyncFence

_NONE = C.ErrorStatus.NONE
_FAILED = C.ErrorStatus.GENERAL_FAILURE
#: How long a reusable execution emulated below v4 waits for its fences without a deadline.
FENCE_WAIT_S = 300.0

Result = tuple[C.ErrorStatus, list[C.OutputShape], C.Timing]


def _call(fn: Callable[..., Any], *args: Any) -> tuple[C.ErrorStatus, Any]:
    """(NONE, value) or the failure's status: AIDL's errors as the core's statuses."""
    try:
        return _NONE, fn(*args)
    except ServiceSpecificError as e:
        return (e.status if e.status not in (_NONE, C.ErrorStatus.DEAD_OBJECT) else _FAILED), \
            None
    except DeadObjectError:
        return C.ErrorStatus.DEAD_OBJECT, None
    except Exception:  # noqa: BLE001 - a driver that breaks AIDL's contract
        return _FAILED, None


def _answer(check: Callable[[], Any]) -> tuple[C.ErrorStatus, Any]:
    """A driver's answer, checked: one that cannot be converted is GENERAL_FAILURE."""
    try:
        return _NONE, check()
    except ServiceSpecificError:
        return _FAILED, None


def _measure(measure: object) -> bool:
    if measure in (C.MeasureTiming.NO, C.MeasureTiming.YES) and not isinstance(measure, bool):
        return measure == C.MeasureTiming.YES
    raise cv.invalid(f"measure must be a MeasureTiming, not {measure!r}"[:80])


def _run(fn: Callable[..., Any], *args: Any) -> Result:
    status, result = _call(fn, *args)
    if status != _NONE:
        return status, [], C.NO_TIMING
    status, answer = _answer(lambda: cv.result_from_aidl(result))
    return answer if status == _NONE else (status, [], C.NO_TIMING)


def _fenced(fn: Callable[..., Any], *args: Any
            ) -> tuple[C.ErrorStatus, SyncFence | None, ci.IFencedExecutionCallback | None]:
    status, result = _call(fn, *args)
    if status != _NONE:
        return status, None, None
    if not isinstance(result, A.FencedExecutionResult) or \
            not isinstance(result.callback, ai.IFencedExecutionCallback) or \
            not (result.sync_fence is None or isinstance(result.sync_fence, SyncFence)):
        return _FAILED, None, None
    return _NONE, result.sync_fence, _FencedExecutionCallback(result.callback)


class _FencedExecutionCallback(ci.IFencedExecutionCallback):
    def __init__(self, callback: ai.IFencedExecutionCallback):
        self.aidl = callback

    def get_execution_info(self) -> tuple[C.ErrorStatus, C.Timing, C.Timing]:
        status, info = _call(self.aidl.get_execution_info)
        if status != _NONE:
            return status, C.NO_TIMING, C.NO_TIMING

        def check() -> tuple[C.ErrorStatus, C.Timing, C.Timing]:
            s, launched, fenced = cv.is_a(info, tuple, "getExecutionInfo's answer")
            return (C.ErrorStatus(cv.int32(s, "status", 0)), cv.timing_from_aidl(launched),
                    cv.timing_from_aidl(fenced))
        try:
            return check()
        except (ServiceSpecificError, ValueError):
            return _FAILED, C.NO_TIMING, C.NO_TIMING


class _Done(ci.IFencedExecutionCallback):
    def __init__(self, status: C.ErrorStatus, timing: C.Timing):
        self.status, self.timing = status, timing

    def get_execution_info(self) -> tuple[C.ErrorStatus, C.Timing, C.Timing]:
        return self.status, self.timing, self.timing


class _Rerun(ci.IExecution):
    """A reusable execution over a plain execute call (AIDL below v4, and bursts)."""

    def __init__(self, run: Callable[[int | None], Result]):
        self._run = run

    def compute(self, deadline: int | None = None) -> Result:
        return self._run(deadline)

    def compute_fenced(self, wait_for: Sequence[SyncFence], deadline: int | None = None,
                       timeout_after_fence: int | None = None
                       ) -> tuple[C.ErrorStatus, SyncFence | None,
                                  ci.IFencedExecutionCallback | None]:
        try:
            fences = cv.fences(wait_for)
        except ServiceSpecificError as e:
            return e.status, None, None
        for fence in fences:
            left = FENCE_WAIT_S if deadline is None else \
                max(0.0, (deadline - time.monotonic_ns()) / 1e9)
            state = fence.wait(left)
            if state == FenceState.ACTIVE:
                return C.ErrorStatus.MISSED_DEADLINE_TRANSIENT, None, None
            if state == FenceState.ERROR:
                return _FAILED, None, None
        status, _, timing = self._run(deadline)
        if status != _NONE:
            return status, None, None
        return _NONE, None, _Done(status, timing)


class _Execution(ci.IExecution):
    def __init__(self, execution: ai.IExecution):
        self.aidl = execution

    def compute(self, deadline: int | None = None) -> Result:
        try:
            dl = cv.deadline_to_aidl(deadline)
        except ServiceSpecificError as e:
            return e.status, [], C.NO_TIMING
        return _run(self.aidl.execute_synchronously, dl)

    def compute_fenced(self, wait_for: Sequence[SyncFence], deadline: int | None = None,
                       timeout_after_fence: int | None = None
                       ) -> tuple[C.ErrorStatus, SyncFence | None,
                                  ci.IFencedExecutionCallback | None]:
        try:
            args = (cv.fences(wait_for), cv.deadline_to_aidl(deadline),
                    cv.duration_to_aidl(timeout_after_fence))
        except ServiceSpecificError as e:
            return e.status, None, None
        return _fenced(self.aidl.execute_fenced, *args)


class _Token:
    __slots__ = ("memory", "token", "hold")

    def __init__(self, memory: Any, token: int):
        self.memory, self.token = memory, token
        self.hold: weakref.ref[_Hold] | None = None


class _Hold:
    """Keeps a memory's identifier token alive in the driver's burst while referenced."""

    __slots__ = ("_finalizer", "__weakref__")

    def __init__(self, burst: _Burst, entry: _Token):
        self._finalizer = weakref.finalize(self, _dropped, weakref.ref(burst), entry)

    def release(self) -> None:
        self._finalizer()


def _dropped(burst_ref: weakref.ref[_Burst], entry: _Token) -> None:
    # May run from the garbage collector anywhere: only queue; the burst's next call (or
    # this one, if the lock is free) tells the driver.
    burst = burst_ref()
    if burst is not None:
        burst._released.append(entry)
        burst._flush(blocking=False)


class _Burst(ci.IBurst):
    """An AIDL burst as the canonical one: each cached memory gets a memory identifier token."""

    _tokens = itertools.count(1)

    def __init__(self, burst: ai.IBurst, version: int):
        self.aidl = burst
        self.version = version
        self._by_memory: dict[int, _Token] = {}
        self._released: deque[_Token] = deque()
        self._lock = threading.Lock()

    def _flush(self, blocking: bool = True) -> None:
        if not self._lock.acquire(blocking=blocking):
            return
        try:
            while self._released:
                entry = self._released.popleft()
                if self._by_memory.get(id(entry.memory)) is entry:
                    del self._by_memory[id(entry.memory)]
                entry.memory = None
                _call(self.aidl.release_memory_resource, entry.token)
        finally:
            self._lock.release()

    def cache_memory(self, memory: Any) -> Any:
        mem = memory.hidl_memory if isinstance(memory, C.MemoryPool) else memory
        if not isinstance(mem, A.SharedMemory):
            return None
        self._flush()
        with self._lock:
            entry = self._by_memory.get(id(mem))
            if entry is not None and entry.memory is mem and entry.hold is not None:
                hold = entry.hold()
                if hold is not None:
                    return hold
            entry = _Token(mem, next(self._tokens))
            hold = _Hold(self, entry)
            entry.hold = weakref.ref(hold)
            self._by_memory[id(mem)] = entry
            return hold

    def _ids(self, request: A.Request) -> list[int]:
        self._flush()
        with self._lock:
            ids = []
            for pool in request.pools:
                entry = self._by_memory.get(id(pool.pool)) if pool.pool is not None else None
                ids.append(entry.token if entry is not None and entry.memory is pool.pool
                           else -1)
            return ids

    def execute(self, request: C.Request, measure: C.MeasureTiming = C.MeasureTiming.NO,
                deadline: int | None = None, loop_timeout: int | None = None) -> Result:
        try:
            r = cv.request_to_aidl(request)
            args = (r, self._ids(r), _measure(measure), cv.deadline_to_aidl(deadline),
                    cv.duration_to_aidl(loop_timeout, "loop timeout"))
        except ServiceSpecificError as e:
            return e.status, [], C.NO_TIMING
        return _run(self.aidl.execute_synchronously, *args)

    def execute_with_config(self, request: C.Request, config: C.ExecutionConfig,
                            deadline: int | None = None) -> Result:
        if self.version < 4:
            return super().execute_with_config(request, config, deadline)
        try:
            r = cv.request_to_aidl(request)
            args = (r, self._ids(r), cv.execution_config_to_aidl(config),
                    cv.deadline_to_aidl(deadline))
        except ServiceSpecificError as e:
            return e.status, [], C.NO_TIMING
        return _run(self.aidl.execute_synchronously_with_config, *args)

    def create_reusable_execution(self, request: C.Request,
                                  measure: C.MeasureTiming = C.MeasureTiming.NO,
                                  loop_timeout: int | None = None
                                  ) -> tuple[C.ErrorStatus, ci.IExecution | None]:
        try:
            cv.request_to_aidl(request)
            _measure(measure)
            cv.duration_to_aidl(loop_timeout, "loop timeout")
        except ServiceSpecificError as e:
            return e.status, None
        return _NONE, _Rerun(lambda deadline: self.execute(request, measure, deadline,
                                                           loop_timeout))


class _PreparedModel(ci.IPreparedModel):
    def __init__(self, prepared_model: ai.IPreparedModel, version: int):
        self.aidl = prepared_model
        self.version = version

    def execute_synchronously(self, request: C.Request,
                              measure: C.MeasureTiming = C.MeasureTiming.NO,
                              deadline: int | None = None, loop_timeout: int | None = None
                              ) -> Result:
        try:
            args = (cv.request_to_aidl(request), _measure(measure),
                    cv.deadline_to_aidl(deadline), cv.duration_to_aidl(loop_timeout,
                                                                       "loop timeout"))
        except ServiceSpecificError as e:
            return e.status, [], C.NO_TIMING
        return _run(self.aidl.execute_synchronously, *args)

    def execute_fenced(self, request: C.Request, wait_for: Sequence[SyncFence],
                       measure: C.MeasureTiming = C.MeasureTiming.NO,
                       deadline: int | None = None, loop_timeout: int | None = None,
                       duration: int | None = None
                       ) -> tuple[C.ErrorStatus, SyncFence | None,
                                  ci.IFencedExecutionCallback | None]:
        try:
            args = (cv.request_to_aidl(request), cv.fences(wait_for), _measure(measure),
                    cv.deadline_to_aidl(deadline),
                    cv.duration_to_aidl(loop_timeout, "loop timeout"),
                    cv.duration_to_aidl(duration))
        except ServiceSpecificError as e:
            return e.status, None, None
        return _fenced(self.aidl.execute_fenced, *args)

    def configure_execution_burst(self) -> tuple[C.ErrorStatus, ci.IBurst | None]:
        status, burst = _call(self.aidl.configure_execution_burst)
        if status != _NONE:
            return status, None
        if not isinstance(burst, ai.IBurst):
            return _FAILED, None
        return _NONE, _Burst(burst, self.version)

    def create_reusable_execution(self, request: C.Request,
                                  measure: C.MeasureTiming = C.MeasureTiming.NO,
                                  loop_timeout: int | None = None
                                  ) -> tuple[C.ErrorStatus, ci.IExecution | None]:
        try:
            config = C.ExecutionConfig(C.MeasureTiming(_measure(measure)), loop_timeout)
        except ServiceSpecificError as e:
            return e.status, None
        return self.create_reusable_execution_with_config(request, config)

    def create_reusable_execution_with_config(self, request: C.Request,
                                              config: C.ExecutionConfig
                                              ) -> tuple[C.ErrorStatus, ci.IExecution | None]:
        try:
            r = cv.request_to_aidl(request)
            cfg = cv.execution_config_to_aidl(config)
        except ServiceSpecificError as e:
            return e.status, None
        if self.version < 4:
            return _NONE, _Rerun(lambda deadline: self._send(r, cfg, deadline))
        status, execution = _call(self.aidl.create_reusable_execution, r, cfg)
        if status != _NONE:
            return status, None
        if not isinstance(execution, ai.IExecution):
            return _FAILED, None
        return _NONE, _Execution(execution)

    def _send(self, r: A.Request, cfg: A.ExecutionConfig, deadline: int | None) -> Result:
        try:
            dl = cv.deadline_to_aidl(deadline)
        except ServiceSpecificError as e:
            return e.status, [], C.NO_TIMING
        return _run(self.aidl.execute_synchronously, r, cfg.measure_timing, dl,
                    cfg.loop_timeout_duration_ns)

    def execute_synchronously_with_config(self, request: C.Request, config: C.ExecutionConfig,
                                          deadline: int | None = None) -> Result:
        if self.version < 4:
            return super().execute_synchronously_with_config(request, config, deadline)
        try:
            args = (cv.request_to_aidl(request), cv.execution_config_to_aidl(config),
                    cv.deadline_to_aidl(deadline))
        except ServiceSpecificError as e:
            return e.status, [], C.NO_TIMING
        return _run(self.aidl.execute_synchronously_with_config, *args)

    def execute_fenced_with_config(self, request: C.Request, wait_for: Sequence[SyncFence],
                                   config: C.ExecutionConfig, deadline: int | None = None,
                                   duration: int | None = None
                                   ) -> tuple[C.ErrorStatus, SyncFence | None,
                                              ci.IFencedExecutionCallback | None]:
        if self.version < 4:
            return super().execute_fenced_with_config(request, wait_for, config, deadline,
                                                      duration)
        try:
            args = (cv.request_to_aidl(request), cv.fences(wait_for),
                    cv.execution_config_to_aidl(config), cv.deadline_to_aidl(deadline),
                    cv.duration_to_aidl(duration))
        except ServiceSpecificError as e:
            return e.status, None, None
        return _fenced(self.aidl.execute_fenced_with_config, *args)


class _PreparedModelCallback(ai.IPreparedModelCallback):
    """The AIDL driver's callback, notifying the canonical one exactly once (also when the
    driver raised without notifying)."""

    def __init__(self, callback: ci.IPreparedModelCallback, version: int):
        self.callback = callback
        self.version = version
        self._done = False
        self._lock = threading.Lock()

    def notify(self, status: C.ErrorStatus, prepared_model: ai.IPreparedModel | None) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            status = C.ErrorStatus(cv.int32(status, "status", 0))
        except (ServiceSpecificError, ValueError):
            status = _FAILED
        if status == _NONE and not isinstance(prepared_model, ai.IPreparedModel):
            status = _FAILED
        self.callback.notify(status, _PreparedModel(prepared_model, self.version)  # type: ignore[arg-type]
                             if status == _NONE else None)


class _Buffer(ci.IBuffer):
    def __init__(self, buffer: ai.IBuffer):
        self.aidl = buffer

    def copy_to(self, dst: Any) -> C.ErrorStatus:
        return _call(self.aidl.copy_to, dst)[0]

    def copy_from(self, src: Any, dimensions: Sequence[int]) -> C.ErrorStatus:
        try:
            d = cv.dims(dimensions, "dimensions")
        except ServiceSpecificError as e:
            return e.status
        return _call(self.aidl.copy_from, src, d)[0]


class _Device(ci.IDevice):
    """An AIDL :class:`nnhal.aidl.IDevice` as a canonical :class:`nnhal.hal.IDevice`."""

    def __init__(self, device: ai.IDevice):
        if not isinstance(device, ai.IDevice):
            raise TypeError(f"from_aidl adapts an nnhal.aidl.IDevice, not {type(device).__name__}")
        version = device.get_interface_version()
        if not isinstance(version, int) or not 1 <= version <= ai.VERSION:
            raise ValueError(f"AIDL interface version {version!r} is not 1 to {ai.VERSION}")
        self.aidl = device
        self.version = version
        self.feature_level = FeatureLevel.of_aidl(version)
        self.name = getattr(device, "name", None)

    def _get(self, fn: Callable[[], Any], check: Callable[[Any], Any]) -> tuple[C.ErrorStatus, Any]:
        status, value = _call(fn)
        if status != _NONE:
            return status, None
        return _answer(lambda: check(value))

    def get_capabilities(self) -> tuple[C.ErrorStatus, C.Capabilities | None]:
        return self._get(self.aidl.get_capabilities,
                         lambda v: cv.is_a(v, C.Capabilities, "capabilities"))

    def get_type(self) -> tuple[C.ErrorStatus, C.DeviceType]:
        status, kind = self._get(self.aidl.get_type,
                                 lambda v: C.DeviceType(cv.int32(v, "type", 1)))
        return status, kind if status == _NONE else C.DeviceType.OTHER

    def get_version_string(self) -> tuple[C.ErrorStatus, str]:
        status, text = self._get(self.aidl.get_version_string,
                                 lambda v: cv.is_a(v, str, "version string"))
        return status, text or ""

    def get_supported_extensions(self) -> tuple[C.ErrorStatus, list[C.Extension]]:
        status, ext = self._get(self.aidl.get_supported_extensions, lambda v: cv.list_of(
            v, "extensions", lambda e, w: cv.is_a(e, C.Extension, w)))
        return status, ext or []

    def get_number_of_cache_files_needed(self) -> tuple[C.ErrorStatus, int, int]:
        def check(v: Any) -> tuple[int, int]:
            n = cv.is_a(v, A.NumberOfCacheFiles, "NumberOfCacheFiles")
            top = C.MAX_NUMBER_OF_CACHE_FILES
            return (cv.int32(n.num_model_cache, "numModelCache", 0, top),
                    cv.int32(n.num_data_cache, "numDataCache", 0, top))
        status, n = self._get(self.aidl.get_number_of_cache_files_needed, check)
        return (status, *n) if status == _NONE else (status, 0, 0)

    def get_supported_operations(self, model: C.Model) -> tuple[C.ErrorStatus, list[bool]]:
        try:
            m = cv.model_to_aidl(model)
        except ServiceSpecificError as e:
            return e.status, []
        count = len(m.main.operations)

        def check(v: Any) -> list[bool]:
            flags = cv.list_of(v, "supported", lambda b, w: cv.is_a(b, bool, w))
            if len(flags) != count:
                raise cv.invalid(f"{len(flags)} flags for {count} operations")
            return flags
        status, flags = self._get(lambda: self.aidl.get_supported_operations(m), check)
        return status, flags or []

    def _prepare(self, callback: ci.IPreparedModelCallback, call: Callable[[Any], Any],
                 convert: Callable[[], tuple[Any, ...]]) -> C.ErrorStatus:
        if not isinstance(callback, ci.IPreparedModelCallback):
            return C.ErrorStatus.INVALID_ARGUMENT
        try:
            args = convert()
        except ServiceSpecificError as e:
            callback.notify(e.status, None)
            return e.status
        cb = _PreparedModelCallback(callback, self.version)
        status, _ = _call(call, *args, cb)
        if status != _NONE:
            cb.notify(status, None)
        return status

    def prepare_model(self, model: C.Model, preference: C.ExecutionPreference,
                      priority: C.Priority, deadline: int | None,
                      model_cache: Sequence[Any], data_cache: Sequence[Any], token: bytes,
                      callback: ci.IPreparedModelCallback) -> C.ErrorStatus:
        return self._prepare(callback, self.aidl.prepare_model, lambda: (
            cv.model_to_aidl(model), cv.int32(preference, "preference"),
            cv.int32(priority, "priority"), cv.deadline_to_aidl(deadline),
            cv.cache_files(model_cache, "model cache"), cv.cache_files(data_cache, "data cache"),
            cv.token(token)))

    def prepare_model_with_config(self, model: C.Model, config: C.PrepareModelConfig,
                                  callback: ci.IPreparedModelCallback) -> C.ErrorStatus:
        if self.version < 4:
            return super().prepare_model_with_config(model, config, callback)
        return self._prepare(callback, self.aidl.prepare_model_with_config, lambda: (
            cv.model_to_aidl(model), cv.prepare_config_to_aidl(config)))

    def prepare_model_from_cache(self, deadline: int | None, model_cache: Sequence[Any],
                                 data_cache: Sequence[Any], token: bytes,
                                 callback: ci.IPreparedModelCallback) -> C.ErrorStatus:
        return self._prepare(callback, self.aidl.prepare_model_from_cache, lambda: (
            cv.deadline_to_aidl(deadline), cv.cache_files(model_cache, "model cache"),
            cv.cache_files(data_cache, "data cache"), cv.token(token)))

    def allocate(self, desc: C.BufferDesc, prepared_models: Sequence[ci.IPreparedModel],
                 input_roles: Sequence[C.BufferRole], output_roles: Sequence[C.BufferRole]
                 ) -> tuple[C.ErrorStatus, ci.IBuffer | None, int]:
        try:
            args = (cv.buffer_desc(desc), cv.list_of(
                prepared_models, "prepared models",
                lambda p, w: A.IPreparedModelParcel(cv.is_a(p, _PreparedModel, w).aidl)),
                cv.roles(input_roles, "input roles"), cv.roles(output_roles, "output roles"))
        except ServiceSpecificError as e:
            return e.status, None, 0
        status, db = _call(self.aidl.allocate, *args)
        if status != _NONE:
            return status, None, 0
        if not isinstance(db, A.DeviceBuffer) or not isinstance(db.buffer, ai.IBuffer) or \
                not isinstance(db.token, int) or not 0 < db.token <= cv.INT32_MAX:
            return _FAILED, None, 0
        return _NONE, _Buffer(db.buffer), db.token

    def close(self) -> None:
        close = getattr(self.aidl, "close", None)
        if callable(close):
            close()


def from_aidl(device: ai.IDevice) -> ci.IDevice:
    """An AIDL driver as a canonical device, at feature level AIDL v1-v4 as its interface
    version says (an :class:`AidlDevice` too is adapted, not unwrapped: every call crosses)."""
    return _Device(device)


def through_aidl(device: ci.IDevice) -> ci.IDevice:
    """``device`` with every call crossing the AIDL face both ways."""
    return from_aidl(AidlDevice(device))
