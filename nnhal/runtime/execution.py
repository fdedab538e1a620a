"""ANeuralNetworksExecution, ANeuralNetworksEvent and ANeuralNetworksBurst.

An execution copies pointer arguments into runtime shared memory (one pool for inputs, one
for outputs) and passes memory arguments as pools of their own, builds a HAL Request, and runs
it through the prepared model: ``compute`` synchronously, ``start_compute`` asynchronously
(an Event), ``start_compute_with_dependencies`` fenced, ``burst_compute`` through an IBurst,
and a reusable execution through one IExecution created on its first computation. Outputs
are copied back to the caller's buffers after a successful run.
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnhal.errors import NdkError
from nnhal.hal.fence import FenceState, SyncFence, is_sync_fence_fd
from nnhal.hal.request_layout import ArgSlot, LayoutError, RequestLayout
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionConfig,
    MeasureTiming,
    OutputShape,
    Request,
    Timing,
    operand_type,
    value_nbytes,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.memory import SharedMemory
from nnhal.runtime.codes import (
    DEFAULT_LOOP_TIMEOUT_NS,
    MAXIMUM_LOOP_TIMEOUT_NS,
    NO_DURATION,
    DurationCode,
    ResultCode,
    code_of_status,
    fail,
)
from nnhal.runtime.compilation import Compilation
from nnhal.runtime.devices import devices
from nnhal.runtime.extensions import Attributes
from nnhal.runtime.memory import Memory, merge_dims
from nnhal.runtime.model import as_bytes, check_operand_type

#: How long the runtime waits for an execution callback or fence before failing it.
EXECUTION_TIMEOUT_S = 600.0
#: How long any wait on a sync fence from elsewhere (createFromSyncFenceFd) lasts at most:
#: ANeuralNetworksEvent_wait, or an execution waiting for it as a dependency. Upstream waits
#: without end; a fence that never signals must not hold a caller for minutes.
FOREIGN_FENCE_TIMEOUT_S = 10.0
PREPARATION, COMPUTATION, COMPLETED = "preparation", "computation", "completed"


@dataclass
class _Arg:
    kind: str  # "buffer", "memory" or "omitted"
    dims: list[int]
    view: np.ndarray | None = None  # the caller's bytes (uint8, a view when possible)
    memory: Memory | None = None
    offset: int = 0
    length: int = 0


def _byte_view(buffer: Any, writable: bool) -> np.ndarray:
    """The caller's buffer as uint8 bytes: a view of it (an input that is not contiguous is
    copied; an output must be a writable contiguous buffer)."""
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            if writable:
                raise ValueError("an output buffer must be contiguous")
            buffer = np.ascontiguousarray(buffer)
        if writable and not buffer.flags.writeable:
            raise ValueError("the buffer is read-only")
        return buffer.reshape(-1).view(np.uint8)
    arr = np.frombuffer(as_bytes(buffer), dtype=np.uint8)
    if writable and not arr.flags.writeable:
        raise ValueError("the buffer is read-only")
    return arr


def _until(deadline: int | None) -> float | None:
    """Seconds from now to a steady-clock ``deadline`` (ns) when it comes before the foreign
    fence timeout; None otherwise."""
    if deadline is None:
        return None
    left = max(0.0, (deadline - time.monotonic_ns()) / 1e9)
    return left if left < FOREIGN_FENCE_TIMEOUT_S else None


def _dead_answer(compilation: Compilation, status: Any) -> bool:
    """A DEVICE_UNAVAILABLE that comes from a dead device of the compilation (DEAD_OBJECT)."""
    return status == ErrorStatus.DEVICE_UNAVAILABLE and compilation.dead


class Burst:
    """ANeuralNetworksBurst: rapid executions of one compilation, one at a time."""

    def __init__(self, compilation: Compilation):
        if compilation is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "Burst_create: compilation is NULL")
        if not compilation.finished or compilation.failed:
            raise fail(ResultCode.BAD_STATE, "Burst_create: the compilation is not finished")
        self.compilation = compilation
        self.lock = threading.Lock()
        self._hal: Any = None
        self._holds: dict[int, Any] = {}

    def hal(self) -> Any:
        if self._hal is None:
            status, burst = self.compilation.prepared.configure_execution_burst()
            if status != ErrorStatus.NONE or burst is None:
                raise fail(code_of_status(status, _dead_answer(self.compilation, status)),
                           "burstCompute: the driver has no burst")
            self._hal = burst
        return self._hal

    def hold(self, mem: SharedMemory) -> None:
        if id(mem) not in self._holds:
            self._holds[id(mem)] = (mem, self.hal().cache_memory(mem))

    def free(self) -> None:
        self._holds.clear()
        self._hal = None


class Event:
    """ANeuralNetworksEvent: the end of an execution started by startCompute(WithDependencies)
    or a sync fence from elsewhere."""

    def __init__(self, waiter: Callable[[], None] | None = None,
                 fence: SyncFence | None = None, fd: int | None = None):
        self._waiter = waiter
        self.fence = fence
        self._fd = fd
        self._lock = threading.Lock()
        self._result: BaseException | None | bool = False  # False: not waited yet

    @classmethod
    def from_sync_fence_fd(cls, fd: int) -> Event:
        """ANeuralNetworksEvent_createFromSyncFenceFd: the fd is duplicated. As upstream, fd 0
        is refused; so is any descriptor that is not a sync fence (``is_sync_fence_fd``)."""
        if isinstance(fd, bool) or not isinstance(fd, int) or fd <= 0:
            raise fail(ResultCode.BAD_DATA, f"createFromSyncFenceFd: invalid fd {fd}")
        if not is_sync_fence_fd(fd):
            raise fail(ResultCode.BAD_DATA, f"createFromSyncFenceFd: fd {fd} is not a sync "
                       f"fence")
        try:
            return cls(fd=os.dup(fd))
        except OSError as e:
            raise fail(ResultCode.BAD_DATA, f"createFromSyncFenceFd: {e}") from None

    def sync_fence_fd(self) -> int:
        """ANeuralNetworksEvent_getSyncFenceFd: a duplicate the caller closes."""
        fd = self._fd if self._fd is not None else (
            self.fence.fileno() if self.fence is not None and not self.fence.closed else None)
        if fd is None or fd < 0:
            raise fail(ResultCode.BAD_DATA, "getSyncFenceFd: the event has no sync fence")
        return os.dup(fd)

    def wait(self, timeout_s: float | None = None) -> None:
        """ANeuralNetworksEvent_wait: raises NdkError with the execution's code. A foreign
        fence is waited for at most ``timeout_s`` (default FOREIGN_FENCE_TIMEOUT_S), an
        execution at most EXECUTION_TIMEOUT_S."""
        with self._lock:
            if self._result is False:
                try:
                    if self._waiter is not None:
                        self._waiter()
                    elif self._fd is not None:
                        self._wait_fd(FOREIGN_FENCE_TIMEOUT_S if timeout_s is None
                                      else timeout_s)
                    elif self.fence is not None:
                        if self.fence.wait(EXECUTION_TIMEOUT_S) != FenceState.SIGNALED:
                            raise fail(ResultCode.OP_FAILED, "wait: the fence signalled an "
                                       "error")
                    self._result = None
                except BaseException as e:  # noqa: BLE001 - replayed to every waiter
                    if getattr(e, "code", None) == ResultCode.MISSED_DEADLINE_TRANSIENT:
                        raise  # a caller's deadline, shorter: not the fence's own answer
                    self._result = e
            if self._result is not None:
                raise self._result

    def _wait_fd(self, timeout_s: float) -> None:
        assert self._fd is not None
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        if not poller.poll(max(0, int(timeout_s * 1000))):
            if timeout_s < FOREIGN_FENCE_TIMEOUT_S:
                raise fail(ResultCode.MISSED_DEADLINE_TRANSIENT,
                           "the sync fence did not signal before the deadline")
            raise fail(ResultCode.OP_FAILED, f"wait: the sync fence did not signal within "
                       f"{timeout_s:g} s")

    def free(self) -> None:
        """ANeuralNetworksEvent_free: waits for the execution first, as the runtime does (its
        outputs are the caller's buffers); a foreign fence has nothing behind it, so its free
        closes the descriptor without waiting."""
        if self._fd is not None:
            with self._lock:  # not under a concurrent wait's poll (itself bounded)
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
            return
        try:
            self.wait()
        except Exception:  # noqa: BLE001
            pass


class Execution:
    """ANeuralNetworksExecution. Methods raise :class:`nnhal.NdkError`."""

    def __init__(self, compilation: Compilation):
        if compilation is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "Execution_create: compilation is NULL")
        if not compilation.finished or compilation.failed:
            raise fail(ResultCode.BAD_STATE, "Execution_create: the compilation is not "
                       "finished")
        self.compilation = compilation
        self.model = compilation.model
        self.inputs: list[_Arg | None] = [None] * len(self.model.inputs)
        self.outputs: list[_Arg | None] = [None] * len(self.model.outputs)
        self.state = PREPARATION
        self.reusable = False
        self.measure = False
        self.timeout_ns = 0
        self.loop_timeout_ns = DEFAULT_LOOP_TIMEOUT_NS
        self.code: ResultCode | None = None
        self.shapes: list[OutputShape] = []
        self.timing = (Timing(), Timing())  # (launched, fenced)
        self._lock = threading.Lock()
        self._bound: RequestLayout | None = None
        self._hal_execution: Any = None
        self._key: tuple | None = None
        #: enableInputAndOutputPadding: buffers may be longer than their operands.
        self.padding = False
        self._any_set = False
        #: addExtensionAttribute: the driver's execution hints.
        self.attributes = Attributes()
        self._config: ExecutionConfig | None = None

    # ---- arguments ----------------------------------------------------------------------
    def _check_preparation(self, what: str) -> None:
        if self.state != PREPARATION:
            raise fail(ResultCode.BAD_STATE, f"{what}: the execution has started")

    def _operand_and_dims(self, index: int, is_output: bool, type: Any, what: str
                          ) -> tuple[Any, list[int]]:
        ios = self.model.outputs if is_output else self.model.inputs
        if not isinstance(index, (int, np.integer)) or not 0 <= int(index) < len(ios):
            raise fail(ResultCode.BAD_DATA, f"{what}: index {index} out of range "
                       f"[0, {len(ios)})")
        op = self.model.operands[ios[int(index)]]
        dims = list(op.dimensions)
        if type is not None:
            given = check_operand_type(type, what)
            if given.type != op.type or given.scale != op.scale or \
                    given.zero_point != op.zero_point:
                raise fail(ResultCode.BAD_DATA, f"{what}: the type differs from the operand's")
            if operand_type(op.type).is_scalar:
                if given.dimensions:
                    raise fail(ResultCode.BAD_DATA, f"{what}: a scalar has no dimensions")
            else:
                merged = merge_dims(dims, list(given.dimensions))
                if merged is None or (dims and not given.dimensions and 0 in dims):
                    raise fail(ResultCode.BAD_DATA, f"{what}: dimensions "
                               f"{list(given.dimensions)} conflict with the operand's {dims}")
                dims = merged
        return op, dims

    def _set(self, index: int, is_output: bool, arg: _Arg) -> None:
        (self.outputs if is_output else self.inputs)[int(index)] = arg
        self._any_set = True

    def _operand_length(self, op: Any, dims: list[int], length: int, index: int,
                        is_output: bool, what: str) -> int:
        """The length the driver is given: the operand's size, which the client's length
        must equal, or at least reach with padding enabled (the bytes past it are the
        client's padding); the client's length for an output of unknown size."""
        need = value_nbytes(op.type, dims)
        if need is None:
            if not is_output:
                raise fail(ResultCode.BAD_DATA, f"{what}: input {index} has unknown "
                           f"dimensions {dims}")
            return length
        if length < need or (length != need and not self.padding):
            raise fail(ResultCode.BAD_DATA, f"{what}: length {length} for an operand of "
                       f"{need} bytes")
        return need

    def enable_input_and_output_padding(self, enable: bool) -> None:
        """ANeuralNetworksExecution_enableInputAndOutputPadding: before any input or output
        is set."""
        self._check_preparation("enableInputAndOutputPadding")
        if self._any_set:
            raise fail(ResultCode.BAD_STATE, "enableInputAndOutputPadding: an input or output "
                       "is already set")
        self.padding = bool(enable)

    def set_input(self, index: int, type: Any, buffer: Any, length: int | None = None) -> None:
        """ANeuralNetworksExecution_setInput; ``buffer`` None with length 0 omits the input."""
        self._set_pointer(index, False, type, buffer, length, "setInput")

    def set_output(self, index: int, type: Any, buffer: Any, length: int | None = None
                   ) -> None:
        """ANeuralNetworksExecution_setOutput; the buffer must be writable."""
        self._set_pointer(index, True, type, buffer, length, "setOutput")

    def _set_pointer(self, index: int, is_output: bool, type: Any, buffer: Any,
                     length: int | None, what: str) -> None:
        self._check_preparation(what)
        op, dims = self._operand_and_dims(index, is_output, type, what)
        if buffer is None:
            if length not in (None, 0):
                raise fail(ResultCode.BAD_DATA, f"{what}: NULL buffer with length {length}")
            self._set(index, is_output, _Arg("omitted", dims))
            return
        try:
            view = _byte_view(buffer, is_output)
        except (TypeError, ValueError) as e:
            raise fail(ResultCode.BAD_DATA, f"{what}: not a usable buffer: {e}") from None
        length = view.nbytes if length is None else length
        if not isinstance(length, int) or length < 0 or length > view.nbytes or \
                length > 0xFFFF_FFFF:
            raise fail(ResultCode.BAD_DATA, f"{what}: invalid length {length}")
        length = self._operand_length(op, dims, length, index, is_output, what)
        self._set(index, is_output, _Arg("buffer", dims, view=view[:length], length=length))

    def set_input_from_memory(self, index: int, type: Any, memory: Memory, offset: int,
                              length: int) -> None:
        """ANeuralNetworksExecution_setInputFromMemory."""
        self._set_memory(index, False, type, memory, offset, length, "setInputFromMemory")

    def set_output_from_memory(self, index: int, type: Any, memory: Memory, offset: int,
                               length: int) -> None:
        """ANeuralNetworksExecution_setOutputFromMemory."""
        self._set_memory(index, True, type, memory, offset, length, "setOutputFromMemory")

    def _set_memory(self, index: int, is_output: bool, type: Any, memory: Memory, offset: int,
                    length: int, what: str) -> None:
        if memory is None:
            raise fail(ResultCode.UNEXPECTED_NULL, f"{what}: memory is NULL")
        self._check_preparation(what)
        op, dims = self._operand_and_dims(index, is_output, type, what)
        if memory.desc is not None:
            if not memory.has_role(self.compilation, int(index), is_output):
                raise fail(ResultCode.BAD_DATA, f"{what}: the memory has no such role")
            if offset != 0 or length != 0:
                raise fail(ResultCode.BAD_DATA, f"{what}: offset and length must be 0 for a "
                           f"memory from a descriptor")
            merged = merge_dims(dims, memory.desc.dimensions)
            if merged is None:
                raise fail(ResultCode.BAD_DATA, f"{what}: dimensions conflict with the "
                           f"memory's")
            # A driver buffer is named by its token alone (offset and length 0 in the HAL).
            self._set(index, is_output, _Arg("memory", merged, memory=memory, offset=0,
                                             length=0 if memory.buffer is not None
                                             else memory.size))
            return
        if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or \
                length < 0 or offset + length > memory.size:
            raise fail(ResultCode.BAD_DATA, f"{what}: [{offset}, {offset}+{length}) outside "
                       f"the memory of {memory.size} bytes")
        length = self._operand_length(op, dims, length, index, is_output, what)
        self._set(index, is_output, _Arg("memory", dims, memory=memory, offset=offset,
                                         length=length))

    # ---- settings -----------------------------------------------------------------------
    def set_measure_timing(self, measure: bool) -> None:
        self._check_preparation("setMeasureTiming")
        if not self.compilation.single_device:
            raise fail(ResultCode.BAD_DATA, "setMeasureTiming: only for a compilation created "
                       "by createForDevices with one device")
        self.measure = bool(measure)

    def set_timeout(self, duration_ns: int) -> None:
        self._check_preparation("setTimeout")
        if not self.compilation.single_device:
            raise fail(ResultCode.BAD_DATA, "setTimeout: only for a compilation created by "
                       "createForDevices with one device")
        if not isinstance(duration_ns, int) or duration_ns < 0:
            raise fail(ResultCode.BAD_DATA, f"setTimeout: invalid duration {duration_ns}")
        self.timeout_ns = duration_ns

    def set_loop_timeout(self, duration_ns: int) -> None:
        self._check_preparation("setLoopTimeout")
        if not isinstance(duration_ns, int) or duration_ns < 0:
            raise fail(ResultCode.BAD_DATA, f"setLoopTimeout: invalid duration {duration_ns}")
        self.loop_timeout_ns = min(duration_ns, MAXIMUM_LOOP_TIMEOUT_NS)

    def set_reusable(self, reusable: bool) -> None:
        self._check_preparation("setReusable")
        self.reusable = bool(reusable)

    def add_extension_attribute(self, extension_name: str, code: int, data: Any,
                                length: int | None = None) -> None:
        """ANeuralNetworksExecution_addExtensionAttribute (feature level 8): a hint for the
        driver of a createForDevices compilation with one device, given with every
        computation; an attribute may be set once per execution, before it starts."""
        what = "addExtensionAttribute"
        Attributes.check_null(extension_name, data, length, what)
        self._check_preparation(what)
        if not self.compilation.single_device:
            raise fail(ResultCode.BAD_DATA, f"{what}: only for a compilation created by "
                       "createForDevices with one device")
        self.attributes.add([*(self.compilation.devices or []), *devices()], extension_name,
                            code, data, length, what)

    # ---- running ------------------------------------------------------------------------
    def _begin(self, what: str) -> None:
        with self._lock:
            if self.state == COMPUTATION:
                raise fail(ResultCode.BAD_STATE, f"{what}: the execution is running")
            if self.state == COMPLETED and not self.reusable:
                raise fail(ResultCode.BAD_STATE, f"{what}: the execution has already run")
            missing = [f"input {k}" for k, a in enumerate(self.inputs) if a is None] + \
                [f"output {k}" for k, a in enumerate(self.outputs) if a is None]
            if missing:
                raise fail(ResultCode.BAD_DATA, f"{what}: {', '.join(missing)} not set")
            for k, a in enumerate(self.inputs):
                if a.kind == "memory" and not a.memory.initialized:
                    raise fail(ResultCode.BAD_DATA, f"{what}: input {k}'s memory is not "
                               f"initialized")
            self.state = COMPUTATION
            self.code = None

    def _request(self) -> Request:
        """The HAL request, with the pointer arguments' bytes copied in (bound once for a
        reusable execution; the input bytes are copied again at each computation)."""
        if self._bound is None:
            key = self._layout_key()
            if key is not None:
                self._bound = self.compilation.take_layout(key)
                self._key = key
        if self._bound is None:
            pools: dict[int, Any] = {}

            def slot(a: _Arg) -> ArgSlot:
                if a.kind == "omitted":
                    return ArgSlot(omitted=True)
                if a.kind == "buffer":
                    return ArgSlot(a.length, tuple(a.dims))
                mem = a.memory
                pool = pools.setdefault(id(mem), mem.pool())
                return ArgSlot(a.length, tuple(a.dims), pool=pool, offset=a.offset)

            try:
                self._bound = RequestLayout(
                    [slot(a) for a in self.inputs], [slot(a) for a in self.outputs],
                    max_output_bytes=sys.maxsize, take=self.compilation.take_memory,
                    give=self.compilation.give_memory)
            except LayoutError as e:
                raise fail(ResultCode.OUT_OF_MEMORY, f"compute: {e}") from None
        layout = self._bound
        for k, a in enumerate(self.inputs):
            if a.kind == "buffer":
                layout.input_view(k)[:] = a.view
        return layout.request

    def _layout_key(self) -> tuple | None:
        """What fixes the request of an execution whose arguments are all buffers or omitted
        (its pools are then runtime memory only, reusable by the next such execution)."""
        key = []
        for a in (*self.inputs, *self.outputs):
            if a.kind == "memory":
                return None
            key.append((a.kind, a.length, tuple(a.dims)))
        return tuple(key)

    def _unbind(self) -> None:
        if self._bound is not None and not self.reusable:
            if self._key is not None:
                self.compilation.give_layout(self._key, self._bound)
            else:
                self._bound.close()
            self._bound = None
            self._key = None

    def _deadline(self) -> int | None:
        return time.monotonic_ns() + self.timeout_ns if self.timeout_ns else None

    def _finish(self, status: Any, shapes: Sequence[OutputShape], timing: Timing,
                fenced: Timing | None = None) -> None:
        """Record the outcome, copy outputs back, and raise NdkError on failure."""
        code = code_of_status(status, _dead_answer(self.compilation, status))
        try:
            if code == ResultCode.NO_ERROR and self._bound is not None:
                layout = self._bound
                for k, a in enumerate(self.outputs):
                    if a.kind == "buffer":
                        n = a.length
                        if shapes and k < len(shapes) and shapes[k].dimensions != a.dims:
                            got = value_nbytes(self.model.operands[self.model.outputs[k]].type,
                                          list(shapes[k].dimensions))
                            n = min(n, got if got is not None else n)
                        a.view[:n] = layout.output_view(k, n)
                    elif a.kind == "memory" and a.memory.desc is not None:
                        a.memory.initialized = True
                        if shapes and k < len(shapes):
                            a.memory.dimensions = list(shapes[k].dimensions)
        except Exception as e:  # noqa: BLE001 - a buffer that cannot take the bytes
            code = ResultCode.OP_FAILED
            status = f"copying outputs: {e}"
        self.shapes = [OutputShape(list(s.dimensions), bool(s.is_sufficient))
                       for s in shapes or []]
        if not self.shapes and code == ResultCode.NO_ERROR:
            self.shapes = [OutputShape(list(a.dims), True) for a in self.outputs]
        self.timing = (timing if isinstance(timing, Timing) else Timing(),
                       fenced if isinstance(fenced, Timing) else
                       (timing if isinstance(timing, Timing) else Timing()))
        self.code = code
        self._unbind()
        with self._lock:
            self.state = COMPLETED
        if code != ResultCode.NO_ERROR:
            name = status.name if isinstance(status, ErrorStatus) else str(status)
            raise fail(code, f"compute: the execution failed: {name}")

    def _fail_launch(self, e: BaseException) -> None:
        self.code = getattr(e, "code", ResultCode.OP_FAILED)
        self._unbind()
        with self._lock:
            self.state = COMPLETED

    def _measure(self) -> MeasureTiming:
        return MeasureTiming.YES if self.measure else MeasureTiming.NO

    def config(self) -> ExecutionConfig:
        """What every computation gives the driver besides the request: made at the first,
        as nothing in it can change once the execution has started."""
        if self._config is None:
            self._config = ExecutionConfig(self._measure(), self.loop_timeout_ns,
                                           tuple(self.attributes.hints),
                                           self.attributes.table())
        return self._config

    def compute(self) -> None:
        """ANeuralNetworksExecution_compute: runs synchronously."""
        self._begin("compute")
        try:
            req = self._request()
            if self.reusable:
                if self._hal_execution is None:
                    status, ex = self.compilation.prepared.create_reusable_execution_with_config(
                        req, self.config())
                    if status != ErrorStatus.NONE or ex is None:
                        self._finish(status, [], Timing())
                        return
                    self._hal_execution = ex
                status, shapes, timing = self._hal_execution.compute(self._deadline())
            else:
                status, shapes, timing = \
                    self.compilation.prepared.execute_synchronously_with_config(
                        req, self.config(), self._deadline())
        except Exception as e:  # noqa: BLE001 - a driver that raises is a dead object
            if isinstance(e, NdkError) and self.state != COMPUTATION:
                raise
            self._fail_launch(e)
            raise fail(getattr(e, "code", ResultCode.DEAD_OBJECT),
                       f"compute: {type(e).__name__}: {e}") from None
        self._finish(status, shapes, timing)

    def start_compute(self) -> Event:
        """ANeuralNetworksExecution_startCompute: an Event that ends with the execution."""
        self._begin("startCompute")
        try:
            req = self._request()
            cb = ExecutionCallback()
            if self.attributes.hints:
                launch = self._launch_with_config(req, cb)
            else:
                # HAL 1.3's callback call (a served driver's wire carries it; for any other
                # prepared model the HIDL face runs the synchronous one on its worker pool).
                launch = execute_1_3(self.compilation.prepared, req, self._measure(),
                                     self._deadline(), self.loop_timeout_ns, cb)
        except Exception as e:  # noqa: BLE001
            self._fail_launch(e)
            raise fail(ResultCode.DEAD_OBJECT, f"startCompute: {e}") from None
        if launch != ErrorStatus.NONE:
            self._finish(launch, [], Timing())

        def waiter() -> None:
            try:
                status, shapes, timing = cb.wait(EXECUTION_TIMEOUT_S)
            except TimeoutError:
                status, shapes, timing = ErrorStatus.GENERAL_FAILURE, [], Timing()
            self._finish(status, shapes, timing)

        return Event(waiter)

    def _launch_with_config(self, req: Request, cb: ExecutionCallback) -> ErrorStatus:
        """An asynchronous computation with hints: the callback form has no config (AIDL has
        no asynchronous execute), so the synchronous form runs on a thread of its own, as
        upstream's runtime runs an AIDL driver."""
        prepared, config, deadline = self.compilation.prepared, self.config(), self._deadline()

        def run() -> None:
            try:
                cb.notify(*prepared.execute_synchronously_with_config(req, config, deadline))
            except Exception:  # noqa: BLE001 - a driver that raises failed the execution
                cb.notify(ErrorStatus.GENERAL_FAILURE, [], Timing())

        threading.Thread(target=run, name="nnhal-startCompute", daemon=True).start()
        return ErrorStatus.NONE

    def start_compute_with_dependencies(self, dependencies: Sequence[Event],
                                        duration_ns: int = 0) -> Event:
        """ANeuralNetworksExecution_startComputeWithDependencies: fenced when the driver can,
        else the runtime waits for the dependencies and computes."""
        if dependencies is None or any(d is None for d in dependencies):
            raise fail(ResultCode.UNEXPECTED_NULL, "startComputeWithDependencies: NULL event")
        if duration_ns and not self.compilation.single_device:
            raise fail(ResultCode.BAD_DATA, "startComputeWithDependencies: a duration needs a "
                       "compilation created by createForDevices with one device")
        for k, a in enumerate(self.outputs):
            if a is not None and a.kind != "omitted" and \
                    value_nbytes(self.model.operands[self.model.outputs[k]].type, a.dims) is None:
                raise fail(ResultCode.BAD_DATA, f"startComputeWithDependencies: output {k} "
                           f"has unknown dimensions")
        self._begin("startComputeWithDependencies")
        fences = []
        try:
            deadline = self._deadline()
            for d in dependencies:
                if d.fence is not None:
                    fences.append(d.fence)
                else:
                    d.wait(_until(deadline))
            req = self._request()
            status, fence, info = self.compilation.prepared.execute_fenced_with_config(
                req, fences, self.config(), deadline, duration_ns or None)
        except Exception as e:  # noqa: BLE001
            self._fail_launch(e)
            raise fail(getattr(e, "code", ResultCode.OP_FAILED),
                       f"startComputeWithDependencies: {e}") from None
        if status != ErrorStatus.NONE:
            if status == ErrorStatus.GENERAL_FAILURE and info is None and fence is None:
                # No fenced path in the driver: the runtime waits and computes.
                try:
                    for f in fences:
                        if f.wait(EXECUTION_TIMEOUT_S) != FenceState.SIGNALED:
                            raise fail(ResultCode.OP_FAILED, "a dependency failed")
                    st, shapes, timing = \
                        self.compilation.prepared.execute_synchronously_with_config(
                            req, self.config(), deadline)
                except Exception as e:  # noqa: BLE001
                    self._fail_launch(e)
                    raise fail(ResultCode.OP_FAILED, f"startComputeWithDependencies: {e}") \
                        from None
                self._finish(st, shapes, timing)
                return Event(fence=SyncFence.signaled())
            self._finish(status, [], Timing())

        def waiter() -> None:
            state = fence.wait(EXECUTION_TIMEOUT_S) if fence is not None else \
                FenceState.SIGNALED
            st, launched, fenced = (info.get_execution_info() if info is not None
                                    else (ErrorStatus.NONE, Timing(), Timing()))
            if state != FenceState.SIGNALED and st == ErrorStatus.NONE:
                st = ErrorStatus.GENERAL_FAILURE
            self._finish(st, [], launched, fenced)

        return Event(waiter, fence=fence)

    def burst_compute(self, burst: Burst) -> None:
        """ANeuralNetworksExecution_burstCompute."""
        if burst is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "burstCompute: burst is NULL")
        if burst.compilation is not self.compilation:
            raise fail(ResultCode.BAD_DATA, "burstCompute: the burst belongs to another "
                       "compilation")
        if not burst.lock.acquire(blocking=False):
            raise fail(ResultCode.BAD_STATE, "burstCompute: the burst is in use")
        try:
            self._begin("burstCompute")
            try:
                req = self._request()
                hal = burst.hal()
                for p in req.pools:
                    if isinstance(p, SharedMemory):
                        burst.hold(p)
                status, shapes, timing = hal.execute_with_config(req, self.config(),
                                                                 self._deadline())
            except Exception as e:  # noqa: BLE001
                self._fail_launch(e)
                raise fail(getattr(e, "code", ResultCode.OP_FAILED), f"burstCompute: {e}") \
                    from None
            self._finish(status, shapes, timing)
        finally:
            burst.lock.release()

    # ---- results ------------------------------------------------------------------------
    def _check_results(self, what: str, index: int) -> OutputShape:
        if self.state != COMPLETED:
            raise fail(ResultCode.BAD_STATE, f"{what}: the execution has not completed")
        if self.code not in (ResultCode.NO_ERROR, ResultCode.OUTPUT_INSUFFICIENT_SIZE):
            raise fail(ResultCode.BAD_STATE, f"{what}: the execution failed")
        if not isinstance(index, (int, np.integer)) or not 0 <= int(index) < len(self.outputs):
            raise fail(ResultCode.BAD_DATA, f"{what}: index {index} out of range")
        if int(index) >= len(self.shapes):
            raise fail(ResultCode.BAD_STATE, f"{what}: no shape was reported")
        return self.shapes[int(index)]

    def output_operand_rank(self, index: int) -> int:
        """ANeuralNetworksExecution_getOutputOperandRank."""
        return len(self._check_results("getOutputOperandRank", index).dimensions)

    def output_operand_dimensions(self, index: int) -> list[int]:
        """ANeuralNetworksExecution_getOutputOperandDimensions (BAD_DATA for a scalar)."""
        dims = list(self._check_results("getOutputOperandDimensions", index).dimensions)
        if not dims:
            raise fail(ResultCode.BAD_DATA, "getOutputOperandDimensions: the output is a "
                       "scalar")
        return dims

    def duration(self, code: int) -> int:
        """ANeuralNetworksExecution_getDuration in nanoseconds (UINT64_MAX: not available)."""
        if code not in {int(c) for c in DurationCode}:
            raise fail(ResultCode.BAD_DATA, f"getDuration: invalid duration code {code}")
        if self.state != COMPLETED:
            raise fail(ResultCode.BAD_STATE, "getDuration: the execution has not completed")
        if not self.measure or self.code != ResultCode.NO_ERROR:
            return NO_DURATION
        timing = self.timing[1] if code >= DurationCode.FENCED_ON_HARDWARE else self.timing[0]
        us = timing.time_on_device if code in (DurationCode.ON_HARDWARE,
                                               DurationCode.FENCED_ON_HARDWARE) \
            else timing.time_in_driver
        return NO_DURATION if us == NO_DURATION else int(us) * 1000

    def free(self) -> None:
        """ANeuralNetworksExecution_free."""
        self.reusable = False
        if self.state != COMPUTATION:
            self._unbind()
        self._hal_execution = None
