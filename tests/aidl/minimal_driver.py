"""A minimal NNAPI driver written against the AIDL interfaces alone.

It implements ``nnhal.aidl.IDevice`` and the interfaces behind it directly, from the AIDL text:
float32 ADD, MUL and SUB of two TENSOR_FLOAT32 operands with numpy broadcasting and a constant
fused activation of NONE or RELU; nothing else (``get_supported_operations`` says so). No
memory domains, no compilation caching. Nothing of nnhal's driver base and no ``nnhal.hal``:
only the AIDL face's names and numpy. Open it by name after :func:`register` (the registry
adapts it with ``nnhal.aidl.from_aidl``), or as ``tests.aidl.minimal_driver:MinimalDevice``.
"""

from __future__ import annotations

import time

import numpy as np

from nnhal import aidl as A

NAME = "aidl-minimal"
_KERNELS = {A.OperationType.ADD: np.add, A.OperationType.MUL: np.multiply,
            A.OperationType.SUB: np.subtract}
_F32 = A.OperandType.TENSOR_FLOAT32
_LT = A.OperandLifeTime
#: How long executeFenced waits for one fence.
FENCE_WAIT_S = 30.0


def _fail(status: A.ErrorStatus, message: str) -> A.ServiceSpecificError:
    return A.ServiceSpecificError(status, message)


def _invalid(message: str) -> A.ServiceSpecificError:
    return _fail(A.ErrorStatus.INVALID_ARGUMENT, message)


def _constant(model: A.Model, operand: A.Operand) -> bytes | None:
    loc = operand.location
    if operand.lifetime == _LT.CONSTANT_COPY:
        data = model.operand_values[loc.offset:loc.offset + loc.length]
    elif operand.lifetime == _LT.CONSTANT_REFERENCE and 0 <= loc.pool_index < len(model.pools):
        pool = model.pools[loc.pool_index]
        if loc.offset + loc.length > pool.size:
            return None
        data = pool.read(loc.offset, loc.length)
    else:
        return None
    return data if len(data) == loc.length else None


def _activation(model: A.Model, operand: A.Operand) -> int | None:
    if operand.type != A.OperandType.INT32 or operand.location.length != 4:
        return None
    data = _constant(model, operand)
    return None if data is None else int(np.frombuffer(data, np.int32)[0])


def _supported(model: A.Model, op: A.Operation) -> bool:
    ops = model.main.operands
    if op.type not in _KERNELS or len(op.inputs) != 3 or len(op.outputs) != 1 or \
            not all(0 <= i < len(ops) for i in [*op.inputs, *op.outputs]):
        return False
    a, b, act = (ops[i] for i in op.inputs)
    return a.type == _F32 and b.type == _F32 and ops[op.outputs[0]].type == _F32 and \
        _activation(model, act) in (0, 1)


class _Plan:
    """The model, checked once at prepare: constants read, operations bound."""

    def __init__(self, model: A.Model):
        g = model.main
        if not isinstance(model, A.Model) or model.referenced:
            raise _invalid("only a main graph of ADD / MUL / SUB")
        for k, op in enumerate(g.operations):
            if not _supported(model, op):
                raise _invalid(f"operation {k} is not a float32 ADD / MUL / SUB")
        n = len(g.operands)
        if not all(0 <= i < n for i in [*g.input_indexes, *g.output_indexes]):
            raise _invalid("a model input or output index is out of range")
        self.operands = g.operands
        self.inputs = list(g.input_indexes)
        self.outputs = list(g.output_indexes)
        self.constants: dict[int, np.ndarray] = {}
        for i, o in enumerate(g.operands):
            if o.lifetime in (_LT.CONSTANT_COPY, _LT.CONSTANT_REFERENCE) and o.type == _F32:
                data = _constant(model, o)
                if data is None or len(data) != 4 * int(np.prod(o.dimensions)):
                    raise _invalid(f"operand {i}: bad constant")
                self.constants[i] = np.frombuffer(data, np.float32).reshape(o.dimensions)
        self.steps = [(_KERNELS[A.OperationType(op.type)], op.inputs[0], op.inputs[1],
                       _activation(model, g.operands[op.inputs[2]]), op.outputs[0])
                      for op in g.operations]

    def run(self, request: A.Request) -> A.ExecutionResult:
        if not isinstance(request, A.Request) or len(request.inputs) != len(self.inputs) or \
                len(request.outputs) != len(self.outputs):
            raise _invalid("the request's inputs and outputs do not match the model")
        pools = []
        for p in request.pools:
            if not isinstance(p, A.RequestMemoryPool) or p.pool is None:
                raise _invalid("only shared-memory pools (no memory domains)")
            pools.append(p.pool.array())
        values = dict(self.constants)
        for arg, i in zip(request.inputs, self.inputs, strict=True):
            dims = list(arg.dimensions) or list(self.operands[i].dimensions)
            if arg.has_no_value or not dims or 0 in dims:
                raise _invalid(f"input {i}: no value or unknown shape")
            data = self._region(pools, arg, 4 * int(np.prod(dims)), exact=True)
            values[i] = data.view(np.float32).reshape(dims)
        for kernel, a, b, act, out in self.steps:
            try:
                r = kernel(values[a], values[b], dtype=np.float32)
            except (KeyError, ValueError) as e:
                raise _invalid(f"operand {out}: {e}") from None
            values[out] = np.maximum(r, 0, out=r) if act == 1 else r
        shapes, fits = [], True
        for arg, i in zip(request.outputs, self.outputs, strict=True):
            v = values[i]
            ok = not arg.has_no_value and arg.location.length >= v.nbytes
            shapes.append(A.OutputShape(list(v.shape), ok))
            fits &= ok
        if not fits:
            return A.ExecutionResult(False, shapes, A.NO_TIMING)
        for arg, i in zip(request.outputs, self.outputs, strict=True):
            v = values[i]
            self._region(pools, arg, v.nbytes)[:v.nbytes] = v.reshape(-1).view(np.uint8)
        return A.ExecutionResult(True, shapes, A.NO_TIMING)

    @staticmethod
    def _region(pools: list[np.ndarray], arg: A.RequestArgument, size: int,
                exact: bool = False) -> np.ndarray:
        loc = arg.location
        if not 0 <= loc.pool_index < len(pools) or loc.offset < 0 or \
                loc.offset + loc.length > pools[loc.pool_index].size or \
                (exact and loc.length != size):
            raise _invalid("a request argument's location is out of its pool or wrong size")
        return pools[loc.pool_index][loc.offset:loc.offset + loc.length]


def _check_time(ns: object, what: str) -> None:
    if not isinstance(ns, int) or isinstance(ns, bool) or ns < -1:
        raise _invalid(f"{what} must be -1 or a time in ns")


def _timed(plan: _Plan, request: A.Request, measure: bool) -> A.ExecutionResult:
    t0 = time.monotonic_ns()
    result = plan.run(request)
    if measure and result.output_sufficient_size:
        spent = time.monotonic_ns() - t0
        result.timing = A.Timing(spent, spent)
    return result


class _Info(A.IFencedExecutionCallback):
    def __init__(self, timing: A.Timing):
        self.timing = timing

    def get_execution_info(self) -> tuple[A.ErrorStatus, A.Timing, A.Timing]:
        return A.ErrorStatus.NONE, self.timing, self.timing


def _fenced(plan: _Plan, request: A.Request, wait_for: list, measure: bool
            ) -> A.FencedExecutionResult:
    for fence in wait_for:
        if not hasattr(fence, "wait") or fence.wait(FENCE_WAIT_S) != 1:  # 1: signalled
            raise _fail(A.ErrorStatus.GENERAL_FAILURE, "a fence to wait for did not signal")
    result = _timed(plan, request, measure)
    if not result.output_sufficient_size:
        raise _fail(A.ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "an output is too small")
    return A.FencedExecutionResult(_Info(result.timing), None)


class _Execution(A.IExecution):
    def __init__(self, plan: _Plan, request: A.Request, config: A.ExecutionConfig):
        self.plan, self.request, self.config = plan, request, config

    def execute_synchronously(self, deadline_ns: int) -> A.ExecutionResult:
        _check_time(deadline_ns, "deadlineNs")
        return _timed(self.plan, self.request, self.config.measure_timing)

    def execute_fenced(self, wait_for, deadline_ns, duration_ns):
        _check_time(deadline_ns, "deadlineNs")
        return _fenced(self.plan, self.request, wait_for, self.config.measure_timing)


class _Burst(A.IBurst):
    def __init__(self, plan: _Plan):
        self.plan = plan

    def execute_synchronously(self, request, memory_identifier_tokens, measure_timing,
                              deadline_ns, loop_timeout_duration_ns):
        if len(memory_identifier_tokens) != len(request.pools):
            raise _invalid("one memory identifier token per pool")
        _check_time(deadline_ns, "deadlineNs")
        return _timed(self.plan, request, measure_timing)

    def release_memory_resource(self, memory_identifier_token: int) -> None:
        if memory_identifier_token < 0:
            raise _invalid("a memory identifier token is not negative")

    def execute_synchronously_with_config(self, request, memory_identifier_tokens, config,
                                          deadline_ns):
        return self.execute_synchronously(request, memory_identifier_tokens,
                                          config.measure_timing, deadline_ns, -1)


class _PreparedModel(A.IPreparedModel):
    def __init__(self, plan: _Plan):
        self.plan = plan

    def execute_synchronously(self, request, measure_timing, deadline_ns,
                              loop_timeout_duration_ns):
        _check_time(deadline_ns, "deadlineNs")
        _check_time(loop_timeout_duration_ns, "loopTimeoutDurationNs")
        return _timed(self.plan, request, measure_timing)

    def execute_fenced(self, request, wait_for, measure_timing, deadline_ns,
                       loop_timeout_duration_ns, duration_ns):
        _check_time(deadline_ns, "deadlineNs")
        return _fenced(self.plan, request, wait_for, measure_timing)

    def configure_execution_burst(self) -> A.IBurst:
        return _Burst(self.plan)

    def create_reusable_execution(self, request, config):
        if not isinstance(request, A.Request):
            raise _invalid("request")
        return _Execution(self.plan, request, config)

    def execute_synchronously_with_config(self, request, config, deadline_ns):
        return self.execute_synchronously(request, config.measure_timing, deadline_ns, -1)

    def execute_fenced_with_config(self, request, wait_for, config, deadline_ns, duration_ns):
        return self.execute_fenced(request, wait_for, config.measure_timing, deadline_ns, -1,
                                   duration_ns)


_PERF = A.PerformanceInfo(2.0, 2.0)


class MinimalDevice(A.IDevice):
    """The whole driver: an AIDL v4 IDevice."""

    name = NAME

    def allocate(self, desc, prepared_models, input_roles, output_roles):
        raise _fail(A.ErrorStatus.GENERAL_FAILURE, "this driver has no memory domains")

    def get_capabilities(self) -> A.Capabilities:
        return A.Capabilities(_PERF, _PERF, [A.OperandPerformance(A.OperandType.INT32, _PERF),
                                             A.OperandPerformance(_F32, _PERF)], _PERF, _PERF)

    def get_number_of_cache_files_needed(self) -> A.NumberOfCacheFiles:
        return A.NumberOfCacheFiles(0, 0)

    def get_supported_extensions(self) -> list:
        return []

    def get_supported_operations(self, model: A.Model) -> list[bool]:
        if not isinstance(model, A.Model):
            raise _invalid("model")
        return [_supported(model, op) for op in model.main.operations]

    def get_type(self) -> A.DeviceType:
        return A.DeviceType.CPU

    def get_version_string(self) -> str:
        return "aidl-minimal 1"

    def prepare_model(self, model, preference, priority, deadline_ns, model_cache, data_cache,
                      token, callback) -> None:
        try:
            _check_time(deadline_ns, "deadlineNs")
            plan = _Plan(model)
        except A.ServiceSpecificError as e:
            callback.notify(e.status, None)
            raise
        callback.notify(A.ErrorStatus.NONE, _PreparedModel(plan))

    def prepare_model_from_cache(self, deadline_ns, model_cache, data_cache, token,
                                 callback) -> None:
        callback.notify(A.ErrorStatus.GENERAL_FAILURE, None)
        raise _fail(A.ErrorStatus.GENERAL_FAILURE, "this driver caches nothing")

    def prepare_model_with_config(self, model, config, callback) -> None:
        self.prepare_model(model, config.preference, config.priority, config.deadline_ns,
                           config.model_cache, config.data_cache, config.cache_token, callback)


def register() -> None:
    """Make the driver openable as ``aidl-minimal`` (the runtime, the service, the C library)."""
    from nnhal.drivers import registry

    registry.register(NAME, MinimalDevice)
