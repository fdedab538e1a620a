"""Execution plans: everything ``prepareModel`` can settle once, so executions stay lean.

A :class:`SubgraphPlan` holds the decoded constants, the operand descriptions, the statically
inferred shapes, and one bound kernel per operation in execution order. Running it is a loop over
those kernels with a slot list of arrays; no validation, decoding or lookup happens per run
beyond checking each produced array against its operand.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nnhal.hal.types import (
    LOOP_TIMEOUT_DEFAULT_NS,
    ErrorStatus,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    OperationType,
    Subgraph,
    SymmPerChannelQuantParams,
)
from nnhal.ops.catalog import check_operation, lookup
from nnhal.ops.registry import Kernel, OpContext, OperandInfo, OperationDef, OpError

L = OperandLifeTime


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


def operand_shape(op: Operand) -> tuple[int, ...] | None:
    """Model dimensions as an inference shape: ``None`` for a tensor of unknown rank."""
    t = OperandType(op.type)
    if t.is_scalar or t == OperandType.SUBGRAPH:
        return ()
    if not op.dimensions:
        return None
    return tuple(int(d) for d in op.dimensions)


def decode_constant(op: Operand, raw: np.ndarray, *, copy: bool = True) -> np.ndarray:
    """Bytes of a constant operand -> a read-only numpy array of its type and shape.

    A plan copies (the client's memory may change after prepareModel); a check that only reads
    the value while the model is in hand passes ``copy=False``.
    """
    t = OperandType(op.type)
    if t in (OperandType.BOOL, OperandType.TENSOR_BOOL8):
        arr = raw != 0
    else:
        arr = raw.view(t.dtype)
        if copy:
            arr = arr.copy()
    shape = () if t.is_scalar else tuple(op.dimensions)
    arr = arr.reshape(shape)
    arr.flags.writeable = False
    return arr


def operand_info(op: Operand, value: object = None) -> OperandInfo:
    t = OperandType(op.type)
    cq = op.extra_params if isinstance(op.extra_params, SymmPerChannelQuantParams) else None
    return OperandInfo(
        type=t, shape=operand_shape(op), scale=float(op.scale), zero_point=int(op.zero_point),
        channel_scales=None if cq is None else np.asarray(cq.scales, dtype=np.float32),
        channel_dim=0 if cq is None else int(cq.channel_dim),
        lifetime=OperandLifeTime(op.lifetime), value=value)


@dataclass(slots=True)
class Step:
    """One operation bound for execution."""

    op_type: OperationType
    kernel: Kernel
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    #: (operand index, numpy dtype, declared shape or None) per output, for the run-time check.
    out_checks: tuple[tuple[int, np.dtype, tuple[int, ...] | None], ...]


class SubgraphPlan:
    """A prepared subgraph; callable as ``plan.run(inputs, rt) -> outputs``.

    Built either from a validated :class:`Subgraph` or from a verified cache image; in both
    cases ``infos`` carry the declared operand descriptions (constants decoded) and
    ``inferred`` the shapes known after shape inference.
    """

    def __init__(self, index: int, infos: list[OperandInfo],
                 operations: Sequence[tuple[int, tuple[int, ...], tuple[int, ...]]],
                 input_indexes: Sequence[int], output_indexes: Sequence[int],
                 inferred: list[tuple[int, ...] | None] | None = None):
        self.index = index
        self.infos = infos
        #: (operation type, input operand indexes, output operand indexes) in execution order.
        self.operations = list(operations)
        self.slots_template: list[object] = [info.value if info.is_const else None
                                             for info in infos]
        self.steps: list[Step] = []
        self.input_indexes = tuple(input_indexes)
        self.output_indexes = tuple(output_indexes)
        #: Shapes after inference (declared shapes until prepare infers them).
        self.inferred: list[tuple[int, ...] | None] = (
            [info.shape for info in infos] if inferred is None else inferred)

    @property
    def input_infos(self) -> list[OperandInfo]:
        return [self.infos[i] for i in self.input_indexes]

    @property
    def output_infos(self) -> list[OperandInfo]:
        return [self.infos[i] for i in self.output_indexes]

    def run(self, inputs: Sequence[np.ndarray], rt: RunState) -> list[np.ndarray]:
        slots = list(self.slots_template)
        for idx, arr in zip(self.input_indexes, inputs):
            slots[idx] = arr
        timed = rt.deadline_ns is not None  # no deadline: no clock reads between operations
        for step in self.steps:
            if timed:
                rt.check_deadline()
            ins = [slots[i] for i in step.inputs]
            try:
                outs = step.kernel(ins, rt)
            except (ExecutionError, OpError):
                raise
            except Exception as e:  # a kernel bug or a value it cannot handle
                raise ExecutionError(ErrorStatus.GENERAL_FAILURE,
                                     f"{step.op_type.name} failed: {type(e).__name__}: {e}") from e
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
        return [slots[i] for i in self.output_indexes]


def _fits(shape: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    if len(shape) != len(declared):
        return False
    return all(d == 0 or d == s for s, d in zip(shape, declared))


def subgraph_infos(subgraph: Subgraph, values: np.ndarray,
                   pools: Sequence[np.ndarray]) -> list[OperandInfo]:
    """Operand descriptions of a validated subgraph, constants decoded (copied) once."""
    infos = []
    for op in subgraph.operands:
        lt = OperandLifeTime(op.lifetime)
        value: object = None
        loc = op.location
        if lt == L.CONSTANT_COPY:
            value = decode_constant(op, values[loc.offset:loc.offset + loc.length])
        elif lt == L.CONSTANT_REFERENCE:
            pool = pools[loc.pool_index]
            value = decode_constant(op, pool[loc.offset:loc.offset + loc.length])
        elif lt == L.SUBGRAPH:
            value = int(loc.offset)
        infos.append(operand_info(op, value))
    return infos


def io_signature(main: Subgraph) -> Subgraph:
    """The main subgraph's inputs then outputs, copied: what requests and memory-domain roles
    are checked against, immune to a client editing its Model after preparing it."""
    io = [*main.input_indexes, *main.output_indexes]
    n_in = len(main.input_indexes)
    return Subgraph([copy.deepcopy(main.operands[i]) for i in io], [], list(range(n_in)),
                    list(range(n_in, len(io))))


def _operations(subgraph: Subgraph) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    return [(int(o.type), tuple(o.inputs), tuple(o.outputs)) for o in subgraph.operations]


class ModelPlan:
    """Plans for the main subgraph (index -1 internally: ``main``) and every referenced one.

    ``signature`` is the main subgraph as requests and memory-domain roles see it (its input
    and output operands). Constants are owned by the plan (copies, or views of the restored
    data cache), so nothing of the client's model is kept.
    """

    def __init__(self, model: Model, pool_arrays: Sequence[np.ndarray], *,
                 validate: bool = True):
        # validate=False only for a model this driver already validated.
        values = np.frombuffer(model.operand_values, dtype=np.uint8)
        subgraphs = [model.main, *model.referenced]
        plans = [SubgraphPlan(i - 1, subgraph_infos(sg, values, pool_arrays), _operations(sg),
                              sg.input_indexes, sg.output_indexes)
                 for i, sg in enumerate(subgraphs)]
        self._setup(bool(model.relax_computation_float32_to_float16), plans,
                    io_signature(model.main))
        for plan in [*self.referenced, self.main]:
            self._bind(plan, validate=validate, infer=True)

    @classmethod
    def restore(cls, relaxed: bool, plans: list[SubgraphPlan], signature: Subgraph
                ) -> ModelPlan:
        """A plan from a verified cache image: ``plans`` (main first) already carry the
        inferred shapes this driver computed when it prepared the model, so neither
        validation nor shape inference runs again; only the kernels are bound."""
        self = cls.__new__(cls)
        self._setup(relaxed, plans, signature)
        for plan in [*self.referenced, self.main]:
            self._bind(plan, validate=False, infer=False)
        return self

    def _setup(self, relaxed: bool, plans: list[SubgraphPlan], signature: Subgraph) -> None:
        self.relaxed = relaxed
        self.main = plans[0]
        self.referenced = plans[1:]
        self.signature = signature
        #: Main inputs read where no operation allows an omitted value (see required_inputs).
        self.required_inputs = required_inputs(self.main)

    def _bind(self, plan: SubgraphPlan, *, validate: bool, infer: bool) -> None:
        infos, inferred = plan.infos, plan.inferred
        views: dict[int, OperandInfo] = {}  # operand index -> info with its inferred shape
        for type_code, in_idx, out_idx in plan.operations:
            op_type, definition = _definition(type_code)
            ins = []
            for i in in_idx:
                view = views.get(i)
                if view is None:
                    view = views[i] = _with_shape(infos[i], inferred[i])
                ins.append(view)
            outs = [infos[i] for i in out_idx]
            ctx = OpContext(op_type=op_type, inputs=ins, outputs=outs, relaxed=self.relaxed,
                            subgraphs=self.referenced)
            if validate:
                check_operation(definition, ctx)
            if infer:
                shapes = definition.prepare(ctx)
                if shapes:
                    for i, s in zip(out_idx, shapes):
                        _check_declared(op_type, i, infos[i].shape, s)
                        inferred[i] = _merge(inferred[i], s)
            kernel = definition.kernel(ctx)
            checks = tuple(_out_check(i, infos[i]) for i in out_idx)
            plan.steps.append(Step(op_type, kernel, in_idx, out_idx, checks))


def _definition(type_code: int) -> tuple[OperationType, OperationDef]:
    """The operation type and its registered definition; OpError if there is none."""
    found = _DEFINITIONS.get(type_code)
    if found is None:
        op_type = OperationType(type_code)
        definition = lookup(op_type)
        if definition is None:
            raise OpError(f"operation {op_type.name} is not supported",
                          ErrorStatus.INVALID_ARGUMENT)
        found = _DEFINITIONS[type_code] = (op_type, definition)
    return found


_DEFINITIONS: dict[int, tuple[OperationType, OperationDef]] = {}


def _out_check(index: int, info: OperandInfo) -> tuple[int, np.dtype, tuple[int, ...] | None]:
    t = info.type
    return index, t.dtype, (info.shape if t.is_tensor else ())


def _with_shape(info: OperandInfo, inferred: tuple[int, ...] | None) -> OperandInfo:
    if inferred == info.shape or inferred is None:
        return info
    from dataclasses import replace
    return replace(info, shape=inferred)


def _check_declared(op_type: OperationType, index: int, declared: tuple[int, ...] | None,
                    inferred: object) -> None:
    """A declared output shape that the inputs contradict makes the model invalid; caught at
    prepare instead of after computing a tensor of the wrong (perhaps enormous) size."""
    if declared is None or inferred is None:
        return
    inferred = tuple(int(d) for d in inferred)  # type: ignore[union-attr]
    if len(inferred) != len(declared) or any(
            d and s and d != s for d, s in zip(declared, inferred)):
        raise OpError(f"{op_type.name}: output operand {index} is declared {list(declared)} "
                      f"but its inputs give {list(inferred)}")


def _merge(declared: tuple[int, ...] | None, inferred: object) -> tuple[int, ...] | None:
    """Combine a declared shape with an inferred one, filling unknown dimensions."""
    if inferred is None:
        return declared
    inferred = tuple(int(d) for d in inferred)  # type: ignore[union-attr]
    if declared is None:
        return inferred
    if len(declared) != len(inferred):
        return declared
    return tuple(d if d else s for d, s in zip(declared, inferred))


#: Operations none of whose inputs may be omitted (the elementwise binary/ternary ones).
_NO_OPTIONAL_INPUTS = frozenset({
    OperationType.ADD, OperationType.MUL, OperationType.SUB, OperationType.DIV,
    OperationType.MAXIMUM, OperationType.MINIMUM, OperationType.POW, OperationType.EQUAL,
    OperationType.NOT_EQUAL, OperationType.GREATER, OperationType.GREATER_EQUAL,
    OperationType.LESS, OperationType.LESS_EQUAL, OperationType.LOGICAL_AND,
    OperationType.LOGICAL_OR, OperationType.PRELU, OperationType.SELECT})


def required_inputs(main: SubgraphPlan) -> frozenset[int]:
    """Operand indexes of main inputs that a request may not omit: those read as input 0 of
    any operation (its primary tensor, IF's condition) or by an operation without optional
    inputs. Kernels are not written to receive "no value" there."""
    inputs = set(main.input_indexes)
    return frozenset(i for op_type, ins, _ in main.operations for k, i in enumerate(ins)
                     if i in inputs and (k == 0 or op_type in _NO_OPTIONAL_INPUTS))
