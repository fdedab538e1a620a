"""The runtime's own prepared models: a partitioned plan, and CPU fallback around a driver.

Both present the IPreparedModel calls an :class:`~nnhal.runtime.execution.Execution` makes
(synchronous, asynchronous, fenced, burst, reusable), so an execution does not care whether
one driver or the runtime runs it. Everything funnels into one synchronous run:

- :class:`PlanPrepared` runs the steps in order. Values crossing steps live in runtime shared
  memory (one input and one output pool per step run, reused across executions); a step
  output whose size is unknown before it runs is sized from the shapes the driver returns
  (OUTPUT_INSUFFICIENT_SIZE) and the step is run again with bigger memory.
- :class:`FallbackPrepared` runs a driver's prepared model and, when it fails with a general
  failure (not an output size, deadline or argument error), runs the whole model on the
  reference driver instead, as the NNAPI runtime's CPU fallback does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nnhal.executor import profile as _profile
from nnhal.hal.interfaces import IBurst, IExecution, IPreparedModel
from nnhal.hal.request_layout import ArgSlot, LayoutError, RequestLayout
from nnhal.hal.types import (
    ErrorStatus,
    MeasureTiming,
    MemoryPool,
    OperandLifeTime,
    OperationType,
    OutputShape,
    Request,
    Timing,
    value_nbytes,
)
from nnhal.memory import SharedMemory
from nnhal.runtime.codes import DEFAULT_LOOP_TIMEOUT_NS
from nnhal.runtime.partition import Step

Result = tuple[ErrorStatus, list[OutputShape], Timing]
_ZERO_SIZED: Any = object()
#: How many times a step is re-run with bigger memory for outputs of unknown size.
MAX_RESIZE = 6
_GUESS = 4096
#: Failures the runtime recovers from by running on the reference driver. A driver's
#: INVALID_ARGUMENT is among them: the runtime checked the arguments already (and built step
#: requests itself), so it means the driver cannot run this input (say, a zero-sized tensor);
#: the reference rejects a request that really is invalid just the same.
FALLBACK_STATUSES = (ErrorStatus.GENERAL_FAILURE, ErrorStatus.DEVICE_UNAVAILABLE,
                     ErrorStatus.INVALID_ARGUMENT)


class _Reusable(IExecution):
    def __init__(self, owner: _RuntimePrepared, request: Request, measure: MeasureTiming,
                 loop_timeout: int | None):
        self.owner, self.request, self.measure, self.loop = owner, request, measure, \
            loop_timeout

    def compute(self, deadline: int | None = None) -> Result:
        return self.owner.execute_synchronously(self.request, self.measure, deadline,
                                                self.loop)

    def compute_fenced(self, wait_for: Sequence[Any], deadline: int | None = None,
                       duration: int | None = None) -> Any:
        return ErrorStatus.GENERAL_FAILURE, None, None


class _Burst(IBurst):
    def __init__(self, owner: _RuntimePrepared):
        self.owner = owner

    def cache_memory(self, memory: Any) -> Any:
        return None

    def execute(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                deadline: int | None = None, loop_timeout: int | None = None) -> Result:
        return self.owner.execute_synchronously(request, measure, deadline, loop_timeout)

    def create_reusable_execution(self, request: Request,
                                  measure: MeasureTiming = MeasureTiming.NO,
                                  loop_timeout: int | None = None) -> Any:
        return ErrorStatus.NONE, _Reusable(self.owner, request, measure, loop_timeout)


class _RuntimePrepared(IPreparedModel):
    """Every execution path through :meth:`execute_synchronously`."""

    def validate_request(self, request: Request, measure: MeasureTiming,
                         deadline: int | None, loop_timeout: int | None) -> ErrorStatus:
        """NONE: the runtime built the request itself (its steps' drivers check theirs when
        they run), so HAL 1.3's callback call runs on a thread of its own, as it always did."""
        return ErrorStatus.NONE

    def execute_fenced(self, request: Request, wait_for: Sequence[Any],
                       measure: MeasureTiming, deadline: int | None,
                       loop_timeout: int | None, duration: int | None) -> Any:
        # No fenced path: the execution waits for its dependencies and computes.
        return ErrorStatus.GENERAL_FAILURE, None, None

    def configure_execution_burst(self) -> tuple[ErrorStatus, IBurst | None]:
        return ErrorStatus.NONE, _Burst(self)

    def create_reusable_execution(self, request: Request,
                                  measure: MeasureTiming = MeasureTiming.NO,
                                  loop_timeout: int | None = None) -> Any:
        return ErrorStatus.NONE, _Reusable(self, request, measure, loop_timeout)


def _pool_bytes(pool: Any) -> np.ndarray | None:
    if isinstance(pool, MemoryPool):
        pool = pool.hidl_memory
    if isinstance(pool, SharedMemory):
        return pool.mapped()
    return None  # a driver buffer (memory domain) is not readable by the runtime


def _status(value: Any) -> ErrorStatus:
    try:
        return ErrorStatus(value)
    except ValueError:
        return ErrorStatus.GENERAL_FAILURE


class PlanPrepared(_RuntimePrepared):
    """A model split in steps over several devices, run by the runtime."""

    def __init__(self, main: Any, steps: list[Step], fallback: Callable[[], Any] | None = None,
                 whole: Callable[[], Any] | None = None, model: Any = None):
        self.main = main  # the whole model's main subgraph
        #: The HAL model holding the constants (a runtime-run IF/WHILE may read them).
        self.model = model
        self.steps = steps
        self.fallback = fallback
        #: The whole model prepared on one of the compilation's devices that supports all of
        #: it, for a run whose values crossing steps are zero-sized: a HAL input cannot be
        #: (a 0 dimension means unknown), so such a run is not split.
        self.whole = whole
        #: Runs that had zero-sized values crossing steps and no device for the whole model
        #: (they fail: only plain create falls back, to the reference).
        self.zero_sized_unrunnable = 0
        self._lock = threading.Lock()
        self._free: list[SharedMemory] = []
        #: Bytes last needed by each step output of unknown size, to size the next run.
        self._sizes: dict[int, int] = {}
        #: Per step and argument layout, step requests of finished runs, for the next run
        #: alike: the driver recognises the very request it ran last (nothing checked or
        #: bound again) and no memory is taken per run.
        self._layouts: dict[tuple, list[RequestLayout]] = {}

    # runtime memory
    def _take(self, size: int) -> SharedMemory:
        with self._lock:
            for k, m in enumerate(self._free):
                if m.size >= size:
                    return self._free.pop(k)
        # Sealed against shrinking: the runtime never shrinks it, so drivers need not check.
        return SharedMemory.ashmem(max(size, 64), sealed=True)

    def _give(self, mem: SharedMemory) -> None:
        with self._lock:
            if len(self._free) < 4 * len(self.steps) + 4:
                self._free.append(mem)
                return
        mem.close()

    def execute_synchronously(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                              deadline: int | None = None, loop_timeout: int | None = None
                              ) -> Result:
        try:
            result = self._run(request, measure, deadline, loop_timeout)
        except Exception:  # noqa: BLE001 - a driver that raises is a general failure
            result = (ErrorStatus.GENERAL_FAILURE, [], Timing())
        if result is _ZERO_SIZED:
            whole = self.whole() if self.whole is not None else None
            if whole is not None:
                return whole.execute_synchronously(request, measure, deadline, loop_timeout)
            self.zero_sized_unrunnable += 1
            result = (ErrorStatus.GENERAL_FAILURE, [], Timing())
        if _status(result[0]) in FALLBACK_STATUSES and self.fallback is not None:
            ref = self.fallback()
            if ref is not None:
                return ref.execute_synchronously(request, measure, deadline, loop_timeout)
        return result

    def _run(self, request: Request, measure: MeasureTiming, deadline: int | None,
             loop_timeout: int | None) -> Result:
        sg = self.main
        pools = [_pool_bytes(p) for p in request.pools]
        env: dict[int, tuple[np.ndarray | None, list[int]]] = {}
        for k, idx in enumerate(sg.input_indexes):
            arg = request.inputs[k]
            dims = list(arg.dimensions) or list(sg.operands[idx].dimensions)
            if arg.has_no_value:
                env[idx] = (None, dims)
                continue
            loc = arg.location
            if not 0 <= loc.pool_index < len(pools) or pools[loc.pool_index] is None:
                return ErrorStatus.INVALID_ARGUMENT, [], Timing()
            env[idx] = (pools[loc.pool_index][loc.offset:loc.offset + loc.length], dims)
        status = self.run_env(env, deadline, loop_timeout)
        if status is _ZERO_SIZED or status != ErrorStatus.NONE:
            return status if status is _ZERO_SIZED else (status, [], Timing())
        shapes, ok = [], True
        writes = []
        for k, idx in enumerate(sg.output_indexes):
            data, dims = env[idx]
            arg = request.outputs[k]
            if arg.has_no_value:
                shapes.append(OutputShape(dims, True))
                continue
            loc = arg.location
            fits = data is not None and data.nbytes <= loc.length
            shapes.append(OutputShape(dims, fits))
            ok = ok and fits
            writes.append((loc, data))
        if not ok:
            return ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, shapes, Timing()
        for loc, data in writes:
            dst = pools[loc.pool_index]
            if dst is None:
                return ErrorStatus.INVALID_ARGUMENT, [], Timing()
            dst[loc.offset:loc.offset + data.nbytes] = data
        return ErrorStatus.NONE, shapes, Timing()

    def run_env(self, env: dict[int, Any], deadline: int | None,
                loop_timeout: int | None) -> Any:
        """Run every step over ``env`` (operand -> (bytes or None, dims)), which gains the
        values the steps produce; the status (or the zero-sized marker)."""
        if _profile.ACTIVE is not None:
            return self._run_env_profiled(_profile.ACTIVE, env, deadline, loop_timeout)
        for step in self.steps:
            if step.device is None:
                status = self._run_control(step, env, deadline, loop_timeout)
            else:
                if any(v[0] is not None and any(d == 0 for d in v[1])
                       for v in (self._value(env, i) for i in step.inputs)):
                    return _ZERO_SIZED
                status = self._run_step(step, env, deadline, loop_timeout)
            if status is _ZERO_SIZED or status != ErrorStatus.NONE:
                return status
        return ErrorStatus.NONE

    def _run_env_profiled(self, prof: _profile.Profile, env: dict[int, Any],
                          deadline: int | None, loop_timeout: int | None) -> Any:
        """:meth:`run_env` timing each step into the profile, with its device."""
        for k, step in enumerate(self.steps):
            entered = prof.enter_step(k, step.operations)
            started = time.perf_counter()
            try:
                if step.device is None:
                    status = self._run_control(step, env, deadline, loop_timeout)
                elif any(v[0] is not None and any(d == 0 for d in v[1])
                         for v in (self._value(env, i) for i in step.inputs)):
                    status = _ZERO_SIZED
                else:
                    status = self._run_step(step, env, deadline, loop_timeout)
            finally:
                prof.leave_step(entered, step.device.name if step.device is not None
                                else "runtime", time.perf_counter() - started)
            if status is _ZERO_SIZED or status != ErrorStatus.NONE:
                return status
        return ErrorStatus.NONE

    def _value(self, env: dict[int, Any], i: int) -> Any:
        """An operand's value: computed, or a constant of the model (an omitted one is None):
        a runtime-run IF/WHILE and a step fed a constant read it."""
        if i in env:
            return env[i]
        o = self.main.operands[i]
        dims = list(o.dimensions)
        loc = o.location
        if o.lifetime == OperandLifeTime.CONSTANT_COPY and self.model is not None:
            raw = np.frombuffer(self.model.operand_values, dtype=np.uint8)
        elif o.lifetime == OperandLifeTime.CONSTANT_REFERENCE and self.model is not None \
                and 0 <= loc.pool_index < len(self.model.pools):
            raw = _pool_bytes(self.model.pools[loc.pool_index])
        elif o.lifetime == OperandLifeTime.NO_VALUE:
            return None, dims
        else:
            raise KeyError(i)
        if raw is None or loc.offset + loc.length > raw.nbytes:
            raise KeyError(i)
        return raw[loc.offset:loc.offset + loc.length], dims

    def _run_control(self, step: Step, env: dict[int, Any], deadline: int | None,
                     loop_timeout: int | None) -> Any:
        """An IF or WHILE no device runs with its bodies: the runtime evaluates it."""
        sg = self.main
        op = sg.operations[step.operations[0]]

        def branch(i: int) -> PlanPrepared:
            return step.branches[int(sg.operands[i].location.offset)]

        def call(plan: PlanPrepared, values: list[Any]) -> Any:
            sub = {i: v for i, v in zip(plan.main.input_indexes, values)}
            status = plan.run_env(sub, deadline, loop_timeout)
            if status is _ZERO_SIZED or status != ErrorStatus.NONE:
                return status
            return [sub[o] for o in plan.main.output_indexes]

        def value(i: int) -> Any:
            return self._value(env, i)

        def truth(value: Any) -> bool | None:
            data = value[0]
            return None if data is None or data.nbytes < 1 else bool(data[0])

        if int(op.type) == int(OperationType.IF):
            cond = truth(value(op.inputs[0]))
            if cond is None:
                return ErrorStatus.INVALID_ARGUMENT
            outs = call(branch(op.inputs[1] if cond else op.inputs[2]),
                        [value(i) for i in op.inputs[3:]])
            if not isinstance(outs, list):
                return outs
        else:  # WHILE: condition, body, then the loop-carried, state and input-only values
            cond_plan, body = branch(op.inputs[0]), branch(op.inputs[1])
            values = [value(i) for i in op.inputs[2:]]
            limit = loop_timeout if loop_timeout is not None else DEFAULT_LOOP_TIMEOUT_NS
            started = time.monotonic_ns()
            while True:
                c = call(cond_plan, values)
                if not isinstance(c, list):
                    return c
                go = truth(c[0])
                if go is None:
                    return ErrorStatus.INVALID_ARGUMENT
                if not go:
                    break
                if time.monotonic_ns() - started > limit:
                    return ErrorStatus.MISSED_DEADLINE_TRANSIENT
                new = call(body, values)
                if not isinstance(new, list):
                    return new
                values[:len(new)] = new
            outs = values[:len(op.outputs)]
        for o, v in zip(op.outputs, outs):
            env[o] = v
        return ErrorStatus.NONE

    def _run_step(self, step: Step, env: dict[int, Any], deadline: int | None,
                  loop_timeout: int | None) -> ErrorStatus:
        sg = self.main
        values = [self._value(env, i) for i in step.inputs]
        ins = [ArgSlot(omitted=True) if data is None else ArgSlot(data.nbytes, tuple(dims))
               for data, dims in values]
        sizes = []
        for i in step.outputs:
            o = step.model.main.operands[step.model.main.output_indexes[len(sizes)]]
            n = value_nbytes(o.type, list(o.dimensions))
            sizes.append(n if n is not None else self._sizes.get(i, _GUESS))
        key = (id(step), tuple(ins), tuple(sizes))
        found = self._layouts.get(key)
        try:
            layout = found.pop() if found else None  # list.pop: atomic, one run takes it
        except IndexError:
            layout = None
        if layout is None:
            try:
                layout = RequestLayout(ins, [ArgSlot(n) for n in sizes], take=self._take,
                                       give=self._give)
            except LayoutError:
                return ErrorStatus.GENERAL_FAILURE
        kept = False
        try:
            for k, (data, _dims) in enumerate(values):
                if data is not None:
                    layout.input_view(k)[:] = data
            for _attempt in range(MAX_RESIZE):
                status, shapes, _t = step.prepared.execute_synchronously(
                    layout.request, MeasureTiming.NO, deadline, loop_timeout)
                status = _status(status)
                if status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE and shapes:
                    needs: list[int | None] = []
                    for j, s in enumerate(shapes[:len(sizes)]):
                        have = layout.out_sizes[j]
                        need = None if s.is_sufficient else value_nbytes(
                            sg.operands[step.outputs[j]].type, list(s.dimensions))
                        needs.append(None if s.is_sufficient else
                                     need if need is not None and need > have else have * 4)
                    try:
                        grown = layout.grow(needs)
                    except LayoutError:  # a driver's absurd size: an error, not an allocation
                        return ErrorStatus.GENERAL_FAILURE
                    for j, need in enumerate(needs):
                        if need is not None:
                            self._sizes[step.outputs[j]] = layout.out_sizes[j]
                    if grown:
                        continue
                    if any(n is not None for n in needs):
                        return ErrorStatus.GENERAL_FAILURE  # too small, and cannot grow
                if status != ErrorStatus.NONE:
                    return status
                for j, i in enumerate(step.outputs):
                    o = sg.operands[i]
                    dims = list(shapes[j].dimensions) if shapes and j < len(shapes) \
                        else list(step.model.main.operands[
                            step.model.main.output_indexes[j]].dimensions)
                    n = value_nbytes(o.type, dims, zero_is_known=True)
                    n = layout.out_sizes[j] if n is None else n
                    env[i] = (layout.output_view(j, n).copy(), dims)
                kept = layout.out_sizes == sizes and self._keep(key, layout)
                return ErrorStatus.NONE
            return ErrorStatus.GENERAL_FAILURE
        except LayoutError:  # a driver's answer larger than the buffer it was given
            return ErrorStatus.GENERAL_FAILURE
        finally:
            if not kept:
                layout.close()

    def _keep(self, key: tuple, layout: RequestLayout) -> bool:
        """Keep a step request that ran well for the next run alike (a few per layout, a
        bounded number of layouts); whether it was kept."""
        with self._lock:
            found = self._layouts.setdefault(key, [])
            if len(found) < 2 and len(self._layouts) <= 8 * len(self.steps) + 8:
                found.append(layout)
                return True
        return False


class FallbackPrepared(_RuntimePrepared):
    """A driver's prepared model of the whole model, with the reference as fallback."""

    def __init__(self, primary: IPreparedModel, fallback: Callable[[], Any]):
        self.primary = primary
        self.fallback = fallback

    def execute_synchronously(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                              deadline: int | None = None, loop_timeout: int | None = None
                              ) -> Result:
        try:
            result = self.primary.execute_synchronously(request, measure, deadline,
                                                        loop_timeout)
        except Exception:  # noqa: BLE001 - a driver that raises is a general failure
            result = (ErrorStatus.GENERAL_FAILURE, [], Timing())
        if _status(result[0]) in FALLBACK_STATUSES:
            ref = self.fallback()
            if ref is not None:
                return ref.execute_synchronously(request, measure, deadline, loop_timeout)
        return result

    def bind_arrays(self, shapes: Sequence[tuple[int, ...]]) -> Any:
        """The driver's own binding: a run it cannot do answers None, and the caller's run by
        request then falls back here."""
        bind = getattr(self.primary, "bind_arrays", None)
        return bind(shapes) if bind is not None else None

    def bind_arrays_with_state(self, shapes: Sequence[tuple[int, ...]],
                               state: Sequence[tuple[int, int]]) -> Any:
        """The driver's own stateful binding (a failed run hands its state back, and the
        caller's run by request then falls back here)."""
        bind = getattr(self.primary, "bind_arrays_with_state", None)
        return bind(shapes, state) if bind is not None else None
