"""Execution plans: kernels bound once to an analysed model, so executions stay lean.

A :class:`ModelPlan` is built from a :class:`~nnhal.analysis.ModelGraph` (the one analysis has
already validated, decoded and inferred everything) by binding one kernel per operation.
Running a subgraph is a loop over those kernels with a slot list of arrays. IF and WHILE are
run by the executor itself on an explicit stack of frames, so control flow nested to any
depth needs no Python recursion.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from nnhal.analysis import MAX_TENSOR_BYTES, ModelGraph, SubgraphGraph
from nnhal.hal.types import (
    LOOP_TIMEOUT_DEFAULT_NS,
    ErrorStatus,
    OperandLifeTime,
    OperandType,
    OperationType,
)
from nnhal.ops.catalog import lookup
from nnhal.ops.registry import Kernel, OpContext, OperandInfo, OpError

_IF, _WHILE = int(OperationType.IF), int(OperationType.WHILE)
_CONST = OperandLifeTime.CONSTANT_COPY


class ExecutionError(Exception):
    """An execution failed with a HAL status (deadline, bad runtime values, kernel failure)."""

    def __init__(self, status: ErrorStatus, message: str):
        super().__init__(message)
        self.status = status


class RunState:
    """Per-execution context handed to kernels: deadline and loop timeout (steady clock, ns)."""

    __slots__ = ("deadline_ns", "loop_timeout_ns")

    def __init__(self, deadline_ns: int | None = None,
                 loop_timeout_ns: int = LOOP_TIMEOUT_DEFAULT_NS):
        self.deadline_ns = deadline_ns
        self.loop_timeout_ns = loop_timeout_ns

    def check_deadline(self) -> None:
        if self.deadline_ns is not None and time.monotonic_ns() > self.deadline_ns:
            raise ExecutionError(ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                                 "execution deadline passed")


OutCheck = tuple[int, np.dtype, tuple[int, ...] | None]


class Step:
    """One operation bound for execution; ``kernel`` is None for IF and WHILE, which the
    executor runs itself (``callees`` are then the subgraph indexes they reference)."""

    __slots__ = ("op_type", "kernel", "inputs", "outputs", "out_checks", "callees", "sizer")

    def __init__(self, op_type: OperationType, kernel: Kernel | None, inputs: tuple[int, ...],
                 outputs: tuple[int, ...], out_checks: tuple[OutCheck, ...],
                 callees: tuple[int, ...] = ()):
        self.op_type = op_type
        self.kernel = kernel
        self.inputs = inputs
        self.outputs = outputs
        self.out_checks = out_checks
        self.callees = callees
        #: For an operation whose output size is only known at run time: checks it before the
        #: kernel allocates (see _Sizer).
        self.sizer: _Sizer | None = None


class _Sizer:
    """Infers a step's output shapes from the run-time inputs and refuses outputs over the
    device's limit, so a TILE or FILL to 10**11 elements fails cleanly instead of allocating."""

    __slots__ = ("definition", "ctx", "limit")

    def __init__(self, definition: object, ctx: OpContext, limit: int):
        self.definition = definition
        self.ctx = ctx
        self.limit = limit

    def check(self, ins: Sequence[object]) -> None:
        ctx = self.ctx
        infos = [info if arr is None else replace(
                     info, shape=np.shape(arr), value=arr, lifetime=_CONST)
                 for info, arr in zip(ctx.inputs, ins)]
        try:
            shapes = self.definition.prepare(replace(ctx, inputs=infos))  # type: ignore
        except Exception:  # noqa: BLE001 - the kernel reports bad values itself
            return
        for out, shape in zip(ctx.outputs, shapes or ()):
            if shape is None or not out.type.is_tensor:
                continue
            nbytes = math.prod(int(d) for d in shape) * out.type.byte_size
            if nbytes > self.limit:
                raise ExecutionError(
                    ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
                    f"{ctx.op_type.name}: an output of shape {list(shape)} needs {nbytes} "
                    f"bytes, more than the {self.limit} this device allows")


class SubgraphPlan:
    """A subgraph's bound steps over its analysed graph."""

    def __init__(self, graph: SubgraphGraph):
        self.graph = graph
        self.index = graph.index
        self.input_indexes = graph.inputs
        self.output_indexes = graph.outputs
        self.slots_template: list[object] = [
            info.value if info is not None and info.is_const else None
            for info in graph.operands]
        self.steps: list[Step] = []
        self.has_control_flow = False

    # The graph's data under the names the compilation cache reads.
    @property
    def infos(self) -> tuple[OperandInfo, ...]:
        return self.graph.operands

    @property
    def inferred(self) -> tuple[tuple[int, ...] | None, ...]:
        return self.graph.shapes

    @property
    def operations(self) -> tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]:
        return self.graph.operations

    @property
    def input_infos(self) -> list[OperandInfo]:
        return self.graph.input_infos

    @property
    def output_infos(self) -> list[OperandInfo]:
        return self.graph.output_infos

    def run(self, inputs: Sequence[np.ndarray | None], rt: RunState,
            plans: Sequence[SubgraphPlan] = ()) -> list[np.ndarray]:
        """Outputs of this subgraph; ``plans`` are the referenced subgraphs' plans."""
        slots = list(self.slots_template)
        for idx, arr in zip(self.input_indexes, inputs):
            slots[idx] = arr
        if self.has_control_flow:
            return _run_frames(self, slots, rt, plans)
        timed = rt.deadline_ns is not None  # no deadline: no clock reads between operations
        for step in self.steps:
            if timed:
                rt.check_deadline()
            ins = [slots[i] for i in step.inputs]
            if step.sizer is not None:
                step.sizer.check(ins)
            _store(step, _call(step, ins, rt), slots)
        return [slots[i] for i in self.output_indexes]


def _call(step: Step, ins: list[object], rt: RunState) -> list[np.ndarray]:
    try:
        return step.kernel(ins, rt)  # type: ignore[misc]
    except (ExecutionError, OpError):
        raise
    except MemoryError as e:
        raise ExecutionError(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
                             f"{step.op_type.name}: out of memory: {e}") from e
    except Exception as e:  # a kernel bug or a value it cannot handle
        raise ExecutionError(ErrorStatus.GENERAL_FAILURE,
                             f"{step.op_type.name} failed: {type(e).__name__}: {e}") from e


def _store(step: Step, outs: Sequence[object], slots: list[object]) -> None:
    """Check each produced array against its operand, then put it in its slot."""
    if len(outs) != len(step.outputs):
        raise ExecutionError(ErrorStatus.GENERAL_FAILURE,
                             f"{step.op_type.name} produced {len(outs)} outputs")
    for (idx, dtype, declared), out in zip(step.out_checks, outs):
        out = np.asarray(out)
        if out.dtype != dtype:
            out = out.astype(dtype)
        if declared is not None and not _fits(out.shape, declared):
            raise ExecutionError(
                ErrorStatus.GENERAL_FAILURE,
                f"{step.op_type.name}: output operand {idx} has shape {out.shape}, "
                f"model declares {declared}")
        slots[idx] = out


def _fits(shape: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    if len(shape) != len(declared):
        return False
    return all(d == 0 or d == s for s, d in zip(shape, declared))


def _is_true(value: object) -> bool:
    if value is None:  # an omitted condition (request input without a value)
        raise OpError("condition has no value")
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise OpError("condition must hold exactly one value")
    return bool(flat[0])


class _Frame:
    """One subgraph being run: its slots, the next step, and the state of the control-flow
    operation waiting for a callee (WHILE: loop values, phase and start time)."""

    __slots__ = ("plan", "slots", "pc", "values", "in_body", "started")

    def __init__(self, plan: SubgraphPlan, slots: list[object]):
        self.plan = plan
        self.slots = slots
        self.pc = 0
        self.values: list[object] = []
        self.in_body = False
        self.started = 0


def _enter(plan: SubgraphPlan, inputs: Sequence[object]) -> _Frame:
    slots = list(plan.slots_template)
    for idx, arr in zip(plan.input_indexes, inputs):
        slots[idx] = arr
    return _Frame(plan, slots)


def _run_frames(top: SubgraphPlan, slots: list[object], rt: RunState,
                plans: Sequence[SubgraphPlan]) -> list[np.ndarray]:
    """Run a subgraph containing IF/WHILE with an explicit stack instead of recursion."""
    stack = [_Frame(top, slots)]
    timed = rt.deadline_ns is not None
    returned: list[object] | None = None  # outputs of the callee frame that just finished
    while True:
        frame = stack[-1]
        steps = frame.plan.steps
        if returned is None and frame.pc == len(steps):
            outs = [frame.slots[i] for i in frame.plan.output_indexes]
            stack.pop()
            if not stack:
                return outs  # type: ignore[return-value]
            returned = outs
            continue
        step = steps[frame.pc]
        if returned is not None:  # resume the control-flow step that called a subgraph
            outs, returned = returned, None
            if step.op_type == OperationType.IF:
                _store(step, outs, frame.slots)
                frame.pc += 1
            elif frame.in_body:  # WHILE body done: new loop values, evaluate the condition
                frame.values[:len(outs)] = outs
                frame.in_body = False
                stack.append(_enter(plans[step.callees[0]], frame.values))
            elif _is_true(outs[0]):  # WHILE condition true: run the body
                if time.monotonic_ns() - frame.started > rt.loop_timeout_ns:
                    raise OpError("WHILE loop exceeded the loop timeout",
                                  ErrorStatus.MISSED_DEADLINE_TRANSIENT)
                rt.check_deadline()
                frame.in_body = True
                stack.append(_enter(plans[step.callees[1]], frame.values))
            else:  # WHILE condition false: the loop values are the outputs
                _store(step, frame.values[:len(step.outputs)], frame.slots)
                frame.pc += 1
            continue
        if timed:
            rt.check_deadline()
        ins = [frame.slots[i] for i in step.inputs]
        if step.kernel is not None:
            if step.sizer is not None:
                step.sizer.check(ins)
            _store(step, _call(step, ins, rt), frame.slots)
            frame.pc += 1
        elif step.op_type == OperationType.IF:
            branch = step.callees[0] if _is_true(ins[0]) else step.callees[1]
            stack.append(_enter(plans[branch], ins[3:]))
        else:
            frame.values = list(ins[2:])
            frame.in_body = False
            frame.started = time.monotonic_ns()
            stack.append(_enter(plans[step.callees[0]], frame.values))


class ModelPlan:
    """Bound kernels for the main subgraph and every referenced one of an analysed model.

    Nothing is validated or inferred here: ``graph`` (from the analysis, or decoded from a
    verified compilation cache) already carries every operand's checked description.
    """

    def __init__(self, graph: ModelGraph, max_tensor_bytes: int = MAX_TENSOR_BYTES):
        self.graph = graph
        self.max_tensor_bytes = max_tensor_bytes
        self.relaxed = graph.relaxed
        self.signature = graph.signature
        self.required_inputs = graph.required_inputs
        self.main = SubgraphPlan(graph.main)
        self.referenced = [SubgraphPlan(g) for g in graph.referenced]
        for plan in [*self.referenced, self.main]:
            self._bind(plan)

    def run(self, inputs: Sequence[np.ndarray | None], rt: RunState) -> list[np.ndarray]:
        return self.main.run(inputs, rt, self.referenced)

    def _bind(self, plan: SubgraphPlan) -> None:
        g = plan.graph
        infos, shapes = g.operands, g.shapes
        views: dict[int, OperandInfo] = {}  # operand index -> info with its inferred shape
        for type_code, in_idx, out_idx in g.operations:
            checks = tuple(_out_check(i, infos[i]) for i in out_idx)
            if type_code in (_IF, _WHILE):
                first = 1 if type_code == _IF else 0
                callees = (int(infos[in_idx[first]].value), int(infos[in_idx[first + 1]].value))
                plan.steps.append(Step(OperationType(type_code), None, in_idx, out_idx, checks,
                                       callees))
                plan.has_control_flow = True
                continue
            op_type, definition = _definition(type_code)
            ins = [views[i] if i in views else views.setdefault(i, g.shaped(i))
                   for i in in_idx]
            ctx = OpContext(op_type=op_type, inputs=ins, outputs=[infos[i] for i in out_idx],
                            relaxed=self.relaxed, subgraphs=self.referenced)
            step = Step(op_type, definition.kernel(ctx), in_idx, out_idx, checks)
            if any(infos[i].type.is_tensor and (shapes[i] is None or 0 in shapes[i])
                   for i in out_idx):
                step.sizer = _Sizer(definition, ctx, self.max_tensor_bytes)
            plan.steps.append(step)


def _definition(type_code: int) -> tuple[OperationType, object]:
    """The operation type and its registered definition; OpError if there is none."""
    found = _DEFINITIONS.get(type_code)
    if found is None:
        op_type = OperationType(type_code)
        definition = lookup(op_type)
        if definition is None:
            raise OpError(f"operation {op_type.name} is not supported")
        found = _DEFINITIONS[type_code] = (op_type, definition)
    return found  # type: ignore[return-value]


_DEFINITIONS: dict[int, tuple[OperationType, object]] = {}


def _out_check(index: int, info: OperandInfo) -> OutCheck:
    t: OperandType = info.type
    return index, t.dtype, (info.shape if t.is_tensor else ())
