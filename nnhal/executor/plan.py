"""Execution plans: kernels bound once to an analysed model, so executions stay lean.

A :class:`ModelPlan` is built from a :class:`~nnhal.analysis.ModelGraph` (the one analysis has
already validated, decoded and inferred everything) by binding one kernel per operation.
Running a subgraph is a loop over those kernels with a slot list of arrays. IF and WHILE are
run by the executor itself on an explicit stack of frames, so control flow nested to any
depth needs no Python recursion.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from nnhal.analysis import (
    MAX_TENSOR_BYTES,
    ModelGraph,
    SubgraphGraph,
    about,
    max_work_default,
    work_of,
)
from nnhal.executor import profile as _profile
from nnhal.executor.arena import Arena, ArenaLayout, ArenaPool, plan_offsets
from nnhal.hal.types import (
    LOOP_TIMEOUT_DEFAULT_NS,
    ErrorStatus,
    OperandLifeTime,
    OperandType,
    OperationType,
    is_extension_type,
)
from nnhal.ops.catalog import lookup
from nnhal.ops.resolver import IntoKernel, Kernel, OpContext, OperandInfo, OpError

_IF, _WHILE = int(OperationType.IF), int(OperationType.WHILE)
#: Operations whose kernels run GEMMs through numpy's BLAS.
_BLAS_OPS = frozenset({OperationType.CONV_2D, OperationType.GROUPED_CONV_2D,
                       OperationType.FULLY_CONNECTED, OperationType.TRANSPOSE_CONV_2D,
                       OperationType.LSTM, OperationType.UNIDIRECTIONAL_SEQUENCE_LSTM,
                       OperationType.BIDIRECTIONAL_SEQUENCE_LSTM, OperationType.RNN,
                       OperationType.UNIDIRECTIONAL_SEQUENCE_RNN,
                       OperationType.BIDIRECTIONAL_SEQUENCE_RNN, OperationType.SVDF})
_CONST = OperandLifeTime.CONSTANT_COPY
_TEMP = OperandLifeTime.TEMPORARY_VARIABLE


class RunError(Exception):
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
            raise RunError(ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                                 "execution deadline passed")


OutCheck = tuple[int, np.dtype, tuple[int, ...] | None]


class BoundOp:
    """One operation bound for execution; ``kernel`` is None for IF and WHILE, which the
    executor runs itself (``callees`` are then the subgraph indexes they reference).

    A step whose operation has a kernel writing into given memory (``into``, every output of
    fully known shape) has no ``kernel``: it is called with its output arrays, arena views for
    planned temporaries, the request's pool views for model outputs where a request plan
    gives them, fresh arrays otherwise (``out_specs``: dtype and shape of each output).
    """

    __slots__ = ("op_type", "kernel", "inputs", "outputs", "out_checks", "callees", "sizer",
                 "into", "out_specs")

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
        self.into: IntoKernel | None = None
        self.out_specs: tuple[tuple[np.dtype, tuple[int, ...]], ...] = ()

    def fresh_outs(self, views: dict[int, np.ndarray] | None,
                   given: dict[int, np.ndarray] | None) -> list[np.ndarray]:
        """Output arrays for an ``into`` call: arena views, given views, else new arrays."""
        outs = []
        for idx, (dtype, shape) in zip(self.outputs, self.out_specs):
            arr = views.get(idx) if views else None
            if arr is None and given:
                arr = given.get(idx)
            outs.append(np.empty(shape, dtype) if arr is None else arr)
        return outs


class _Sizer:
    """Infers a step's output shapes from the run-time inputs and refuses outputs over the
    device's limit, so a TILE or FILL to 10**11 elements fails cleanly instead of allocating,
    and a step whose work estimate from those shapes exceeds the device's bound (a PAD given
    its size at run time feeding a wide pool) fails instead of computing for minutes."""

    __slots__ = ("definition", "ctx", "limit", "max_work")

    def __init__(self, definition: object, ctx: OpContext, limit: int, max_work: int):
        self.definition = definition
        self.ctx = ctx
        self.limit = limit
        self.max_work = max_work

    def check(self, ins: Sequence[object]) -> None:
        ctx = self.ctx
        infos = [info if arr is None else replace(
                     info, shape=np.shape(arr), value=arr, lifetime=_CONST)
                 for info, arr in zip(ctx.inputs, ins)]
        now = replace(ctx, inputs=infos)
        try:
            shapes = self.definition.prepare(now)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - the kernel reports bad values itself
            return
        outs = list(shapes) if shapes else [None] * len(ctx.outputs)
        work = work_of(self.definition, now, [o.shape if s is None else s
                                              for s, o in zip(outs, ctx.outputs)])
        if work > self.max_work:
            raise RunError(
                ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
                f"{ctx.op_type.name}: these inputs need about {about(work)} multiply-adds or "
                f"element visits, more than the {self.max_work:.3g} this device allows")
        for out, shape in zip(ctx.outputs, shapes or ()):
            if shape is None or not out.type.is_tensor:
                continue
            nbytes = math.prod(int(d) for d in shape) * out.type.byte_size
            if nbytes > self.limit:
                raise RunError(
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
        self.steps: list[BoundOp] = []
        self.has_control_flow = False
        #: Arenas of this subgraph's planned temporaries (None: nothing planned).
        self.arena_pool: ArenaPool | None = None
        #: Per step: no prebuilt output arrays (the run without an arena).
        self.no_outs: list[list[np.ndarray] | None] = []
        #: Output positions whose array may refer to arena memory: copied at the end of a run.
        self.copy_out: tuple[int, ...] = ()
        #: Output operands an ``into`` step writes: a run may be given arrays for them.
        self.direct_outputs: frozenset[int] = frozenset()

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
            plans: Sequence[SubgraphPlan] = (),
            given: dict[int, np.ndarray] | None = None,
            given_outs: Sequence[list[np.ndarray] | None] | None = None) -> list[np.ndarray]:
        """Outputs of this subgraph; ``plans`` are the referenced subgraphs' plans. ``given``
        maps output operands (in :attr:`direct_outputs`) to arrays their producing step
        writes into (the request's pool views); the run returns those very arrays.
        ``given_outs`` is :meth:`outs_given` of the same ``given``, when the caller keeps it."""
        slots = self.slots_template.copy()
        for idx, arr in zip(self.input_indexes, inputs):
            slots[idx] = arr
        if self.has_control_flow:
            prof = _profile.ACTIVE
            if prof is None:
                return _run_frames(self, slots, rt, plans)
            started = time.perf_counter()  # IF/WHILE run on a stack: timed as a whole
            try:
                return _run_frames(self, slots, rt, plans)
            finally:
                prof.whole_run(time.perf_counter() - started)
        # Chosen once per run: the timed loop only while a profile is collected.
        run_steps = self._run_steps if _profile.ACTIVE is None else self._run_steps_profiled
        pool = self.arena_pool
        if pool is None:
            return run_steps(slots, rt, None, given, given_outs)
        arena = pool.take()
        try:
            return run_steps(slots, rt, arena, given, given_outs)
        finally:
            pool.give(arena)

    def outs_given(self, given: dict[int, np.ndarray] | None
                   ) -> list[list[np.ndarray] | None] | None:
        """Per step: its output arrays when ``given`` has every one of them (an ``into``
        step writing model outputs straight into the request's memory), else None."""
        if not given:
            return None
        return [[given[i] for i in step.outputs]
                if step.into is not None and all(i in given for i in step.outputs) else None
                for step in self.steps]

    def fixed_steps(self, inputs: Sequence[np.ndarray | None],
                    given: dict[int, np.ndarray] | None) -> list[FixedStep] | None:
        """The whole run with these very input arrays and ``given`` output arrays, decided
        once, when it can be: every step writes into given arrays (so no temporary, no arena)
        and reads only constants, inputs and given arrays; no control flow. Then a run is
        :func:`run_fixed` of it, which fills ``given``. None otherwise."""
        outs_given = self.outs_given(given)
        if self.has_control_flow or outs_given is None or self.arena_pool is not None or \
                self.copy_out:
            return None
        made = {i for step in self.steps for i in step.outputs}
        src = self.slots_template.copy()
        for idx, arr in zip(self.input_indexes, inputs):
            src[idx] = arr
        fixed: list[FixedStep] = []
        for step, outs in zip(self.steps, outs_given):
            if step.into is None or outs is None or \
                    any(i in made and i not in given for i in step.inputs):  # type: ignore
                return None
            fixed.append((step, step.into, [src[i] for i in step.inputs], outs))
            for idx, out in zip(step.outputs, outs):
                src[idx] = out
        if any(i not in given for i in self.output_indexes):  # type: ignore[operator]
            return None
        return fixed

    def _run_steps(self, slots: list[object], rt: RunState, arena: Arena | None,
                   given: dict[int, np.ndarray] | None,
                   given_outs: Sequence[list[np.ndarray] | None] | None = None
                   ) -> list[np.ndarray]:
        timed = rt.deadline_ns is not None  # no deadline: no clock reads between operations
        if arena is not None:
            views, step_outs = arena.views, arena.step_outs
        else:
            views, step_outs = None, self.no_outs
        if given_outs is None:
            given_outs = self.no_outs
        for step, outs, mine in zip(self.steps, step_outs, given_outs):
            if timed:
                rt.check_deadline()
            ins = [slots[i] for i in step.inputs]
            into = step.into
            if into is not None:
                if outs is None:
                    outs = mine if mine is not None else step.fresh_outs(views, given)
                try:
                    into(ins, outs, rt)
                except Exception as e:
                    err = _failure(step, e)
                    if err is e:
                        raise
                    raise err from e
                for idx, out in zip(step.outputs, outs):
                    slots[idx] = out
                continue
            if step.sizer is not None:
                step.sizer.check(ins)
            _store(step, _call(step, ins, rt), slots)
        results = [slots[i] for i in self.output_indexes]
        for k in self.copy_out:  # may refer to arena memory the next run will reuse
            results[k] = np.array(results[k], copy=True)
        return results  # type: ignore[return-value]

    def _run_steps_profiled(self, slots: list[object], rt: RunState, arena: Arena | None,
                            given: dict[int, np.ndarray] | None,
                            given_outs: Sequence[list[np.ndarray] | None] | None = None
                            ) -> list[np.ndarray]:
        """:meth:`_run_steps` timing each operation into the active profile (a loop of its
        own, so that the lean one never tests whether to time)."""
        prof = _profile.ACTIVE
        clock = time.perf_counter
        if arena is not None:
            views, step_outs = arena.views, arena.step_outs
        else:
            views, step_outs = None, self.no_outs
        if given_outs is None:
            given_outs = self.no_outs
        for k, (step, outs, mine) in enumerate(zip(self.steps, step_outs, given_outs)):
            rt.check_deadline()
            started = clock()
            ins = [slots[i] for i in step.inputs]
            into = step.into
            if into is not None:
                if outs is None:
                    outs = mine if mine is not None else step.fresh_outs(views, given)
                _call_into(step, ins, outs, rt)
                for idx, out in zip(step.outputs, outs):
                    slots[idx] = out
            else:
                if step.sizer is not None:
                    step.sizer.check(ins)
                _store(step, _call(step, ins, rt), slots)
            if prof is not None:
                prof.operation(k, _type_name(step.op_type), clock() - started)
        results = [slots[i] for i in self.output_indexes]
        for k in self.copy_out:
            results[k] = np.array(results[k], copy=True)
        return results  # type: ignore[return-value]


#: A step of a run decided once: (step, its kernel, its input arrays, its output arrays).
FixedStep = tuple[BoundOp, IntoKernel, list[object], list[np.ndarray]]


def run_fixed(fixed: Sequence[FixedStep], rt: RunState) -> None:
    """Run :meth:`SubgraphPlan.fixed_steps` (no deadline checks between steps: for runs
    without a deadline)."""
    if _profile.ACTIVE is not None:
        _run_fixed_profiled(fixed, rt, _profile.ACTIVE)
        return
    for step, into, ins, outs in fixed:
        try:
            into(ins.copy(), outs, rt)  # a copy: the kernel may do what it likes with its list
        except Exception as e:
            err = _failure(step, e)
            if err is e:
                raise
            raise err from e


def _run_fixed_profiled(fixed: Sequence[FixedStep], rt: RunState,
                        prof: _profile.Profile) -> None:
    clock = time.perf_counter
    for k, (step, _into, ins, outs) in enumerate(fixed):
        started = clock()
        _call_into(step, ins.copy(), outs, rt)
        prof.operation(k, _type_name(step.op_type), clock() - started)


def _type_name(op_type: object) -> str:
    return getattr(op_type, "name", None) or str(op_type)


def _failure(step: BoundOp, e: Exception) -> Exception:
    """The error a kernel's exception becomes: HAL errors as they are, running out of memory
    RESOURCE_EXHAUSTED_TRANSIENT, anything else (a kernel bug, a value it cannot handle)
    GENERAL_FAILURE."""
    if isinstance(e, (RunError, OpError)):
        return e
    if isinstance(e, MemoryError):
        return RunError(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
                              f"{step.op_type.name}: out of memory: {e}")
    return RunError(ErrorStatus.GENERAL_FAILURE,
                          f"{step.op_type.name} failed: {type(e).__name__}: {e}")


def _call_into(step: BoundOp, ins: list[object], outs: list[np.ndarray], rt: RunState) -> None:
    try:
        step.into(ins, outs, rt)  # type: ignore[misc]
    except Exception as e:
        err = _failure(step, e)
        if err is e:
            raise
        raise err from e


def _call(step: BoundOp, ins: list[object], rt: RunState) -> list[np.ndarray]:
    try:
        return step.kernel(ins, rt)  # type: ignore[misc]
    except Exception as e:
        err = _failure(step, e)
        if err is e:
            raise
        raise err from e


def _store(step: BoundOp, outs: Sequence[object], slots: list[object]) -> None:
    """Check each produced array against its operand, then put it in its slot."""
    if len(outs) != len(step.outputs):
        raise RunError(ErrorStatus.GENERAL_FAILURE,
                             f"{step.op_type.name} produced {len(outs)} outputs")
    for (idx, dtype, declared), out in zip(step.out_checks, outs):
        out = np.asarray(out)
        if out.dtype != dtype:
            out = out.astype(dtype)
        if declared is not None and out.shape != declared and not _fits(out.shape, declared):
            raise RunError(
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
        if step.into is not None:  # no arena under control flow: fresh outputs
            outs = step.fresh_outs(None, None)
            _call_into(step, ins, outs, rt)
            for idx, out in zip(step.outputs, outs):
                frame.slots[idx] = out
            frame.pc += 1
        elif step.kernel is not None:
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

    def __init__(self, graph: ModelGraph, max_tensor_bytes: int = MAX_TENSOR_BYTES,
                 max_work: int | None = None):
        self.graph = graph
        self.max_tensor_bytes = max_tensor_bytes
        #: The device's work bound, held at run time by the steps whose shapes were not all
        #: known at prepare (the analysis held the others to it).
        self.max_work = max_work_default() if max_work is None else max_work
        self.relaxed = graph.relaxed
        self.signature = graph.signature
        self.required_inputs = graph.required_inputs
        self.main = SubgraphPlan(graph.main)
        self.referenced = [SubgraphPlan(g) for g in graph.referenced]
        #: A graph decoded from a compilation cache (no min_level: it was not analysed here)
        #: is held to this device's work bound while its kernels are bound; the cache may have
        #: been written under a looser one (another process's NNHAL_MAX_WORK, one key file).
        self._work: int | None = 0 if graph.min_level is None else None
        for plan in [*self.referenced, self.main]:
            self._bind(plan)
        if self._work is not None and self._work > self.max_work:
            raise OpError(f"one execution needs about {about(self._work)} multiply-adds or "
                          f"element visits, more than the {self.max_work:.3g} this device "
                          f"allows", ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT)
        #: Whether a step multiplies matrices through BLAS (a driver may then limit BLAS's
        #: threads around executions: see nnhal.ops.blas).
        self.uses_blas = any(step.op_type in _BLAS_OPS
                             for plan in [*self.referenced, self.main] for step in plan.steps)

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
                plan.steps.append(BoundOp(OperationType(type_code), None, in_idx, out_idx, checks,
                                       callees))
                plan.has_control_flow = True
                continue
            if is_extension_type(type_code):
                found = self.graph.extension_ops.get(type_code)
                if found is None:
                    raise OpError(f"extension operation {type_code:#x} is not supported")
                op_type, definition = found
            else:
                op_type, definition = _definition(type_code)
            ins = [views[i] if i in views else views.setdefault(i, g.shaped(i))
                   for i in in_idx]
            ctx = OpContext(op_type=op_type, inputs=ins, outputs=[infos[i] for i in out_idx],
                            relaxed=self.relaxed, subgraphs=self.referenced)
            if self._work is not None:
                self._work += work_of(definition, ctx, [shapes[i] for i in out_idx])
            into = None
            if all(_known(infos[i], shapes[i]) for i in out_idx):
                into = definition.kernel_into(ctx)  # type: ignore[attr-defined]
            step = BoundOp(op_type, None if into is not None else definition.kernel(ctx),
                        in_idx, out_idx, checks)
            if into is not None:
                step.into = into
                step.out_specs = tuple((infos[i].type.dtype, tuple(shapes[i])) for i in out_idx)
            elif any(infos[i].type.is_tensor and (shapes[i] is None or 0 in shapes[i])
                     for i in out_idx):
                step.sizer = _Sizer(definition, ctx, self.max_tensor_bytes, self.max_work)
            plan.steps.append(step)
        plan.no_outs = [None] * len(plan.steps)
        if not plan.has_control_flow:
            _plan_arena(plan, arena=not arena_disabled())


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


def _known(info: OperandInfo, shape: tuple[int, ...] | None) -> bool:
    """A tensor whose every dimension is known (and non-zero) at prepare time."""
    return info.type.is_tensor and shape is not None and len(shape) > 0 and \
        all(d > 0 for d in shape)


#: Set to 1 to prepare models without an arena (for measuring what the arena is worth): every
#: temporary is then a new array at each run, as before the arena. Read at each preparation.
NO_ARENA_ENV = "NNHAL_NO_ARENA"


def arena_disabled() -> bool:
    """Whether :data:`NO_ARENA_ENV` asks for plans without an arena."""
    return os.environ.get(NO_ARENA_ENV, "") not in ("", "0")


def _plan_arena(plan: SubgraphPlan, arena: bool = True) -> None:
    """Place the subgraph's planned temporaries (outputs of ``into`` steps that are
    TEMPORARY_VARIABLEs) in one arena layout; set the plan's arena pool, copy-out positions
    and direct outputs.

    A step without ``into`` may return views of its inputs, so an operand it produces may refer
    to the memory of any planned operand its inputs refer to: a planned operand's lifetime
    extends to the last use of every operand that may refer to it, and to the end of the run
    (then copied out) when one of those is an output of the subgraph. With ``arena`` False
    only the direct outputs are set: every temporary is then a new array at each run.
    """
    g = plan.graph
    infos, steps = g.operands, plan.steps
    end = len(steps)
    last_use: dict[int, int] = {}
    for pos, step in enumerate(steps):
        for i in step.inputs:
            last_use[i] = pos
    outputs = set(g.outputs)
    planned: dict[int, int] = {}  # operand -> producing step
    refers: dict[int, frozenset[int]] = {}  # operand -> planned operands it may refer to
    for pos, step in enumerate(steps):
        if step.into is not None:
            for idx in step.outputs:
                if infos[idx].lifetime == _TEMP and idx not in outputs:
                    planned[idx] = pos
                    refers[idx] = frozenset((idx,))
            continue
        via = frozenset().union(*(refers.get(i, frozenset()) for i in step.inputs))
        for idx in step.outputs:
            if via:
                refers[idx] = via
    plan.direct_outputs = frozenset(
        idx for step in steps if step.into is not None for idx in step.outputs
        if idx in outputs and list(g.outputs).count(idx) == 1 and idx not in g.inputs)
    if not planned or not arena:
        return
    lifetimes = {idx: [pos, pos] for idx, pos in planned.items()}
    for idx, roots in refers.items():
        last = end if idx in outputs else last_use.get(idx, 0)
        for root in roots:
            span = lifetimes[root]
            span[1] = max(span[1], last)
    plan.copy_out = tuple(k for k, idx in enumerate(g.outputs) if refers.get(idx))
    order = list(planned)
    sizes = [infos[i].type.dtype.itemsize * math.prod(g.shapes[i]) for i in order]
    offsets, total = plan_offsets(sizes, [tuple(lifetimes[i]) for i in order])
    slots = [(idx, off, infos[idx].type.dtype, tuple(g.shapes[idx]))
             for idx, off in zip(order, offsets)]
    full = [tuple(step.outputs) if step.into is not None and
            all(i in planned for i in step.outputs) else None for step in steps]
    plan.arena_pool = ArenaPool(ArenaLayout(slots, total, full))


def _out_check(index: int, info: OperandInfo) -> OutCheck:
    t: OperandType = info.type
    return index, t.dtype, (info.shape if t.is_tensor else ())
