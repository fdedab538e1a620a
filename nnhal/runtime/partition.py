"""Partitioning: which device runs each operation, and the steps that follow from it.

For every operation of the main subgraph the runtime asks each device whether it supports it
(``getSupportedOperations``) and picks, among those that do, the one whose capabilities are
best for the operation's operand types under the compilation's preference (power usage for
LOW_POWER, execution time otherwise; ties keep the registration order, the reference first).
Operations are then ordered topologically so that runs on one device stay long, and each run
becomes a :class:`Step`: a HAL sub-model of its own whose inputs are the model inputs and
values of earlier steps it reads (constants stay constants) and whose outputs are the model
outputs and values later steps read. An IF or WHILE stays inside a step: a device that claims
it claims the subgraphs it references. When the best device for an IF/WHILE is the reference
driver (upstream's CPU device) and there are other devices, the runtime runs it itself and
partitions each body the same way, as upstream's control-flow interpreter does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.types import (
    OPERAND_TYPES,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    OperationType,
    Subgraph,
    extension_prefix,
    is_extension_type,
    operand_type,
)
from nnhal.runtime.codes import PreferenceCode

_CONTROL_FLOW = {int(OperationType.IF), int(OperationType.WHILE)}
_CONSTANTS = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE)
#: The "device" of an IF or WHILE that no device supports together with its bodies: the
#: runtime evaluates it, running each body's own (partitioned) plan.
RUNTIME = -2


@dataclass
class Step:
    """Consecutive operations on one device: ``operations`` index the main subgraph,
    ``inputs``/``outputs`` its operands, in the order of the step's sub-model."""

    device: Any  # nnhal.runtime.devices.Device; None: an IF/WHILE the runtime runs
    operations: list[int]
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    model: Model | None = None
    prepared: Any = None
    #: For a runtime IF/WHILE: referenced subgraph index -> the plan that runs it.
    branches: dict[int, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"device": self.device.name if self.device is not None else "runtime",
                "operations": list(self.operations),
                "inputs": list(self.inputs), "outputs": list(self.outputs)}


class NoDevice(Exception):
    """Some operations are supported by none of the devices (their indexes)."""

    def __init__(self, operations: list[int]):
        self.operations = operations
        super().__init__(f"operations {operations} are supported by no device")


def supported_by(model: Model, devices: Sequence[Any]) -> list[list[bool]]:
    """getSupportedOperations of each device (all False for a device that fails to answer)."""
    n = len(model.main.operations)
    out = []
    for d in devices:
        try:
            status, flags = d.hal.get_supported_operations(model)
        except Exception:  # noqa: BLE001 - a broken driver supports nothing
            status, flags = 1, []
        out.append([bool(f) for f in flags] if status == 0 and len(flags) == n
                   else [False] * n)
    return out


def _is_tensor(t: int) -> bool:
    try:
        return operand_type(t).is_tensor
    except ValueError:  # an extension type the runtime cannot read: treated as a tensor
        return True


def _judged_types(model: Model, k: int) -> tuple[int, ...]:
    """The tensor types operation ``k`` is judged by, in the order their costs are summed.
    Extension types are left out: no device reports a performance for them (a model's
    prefix is its own), so the operation is judged by its other tensors."""
    sg = model.main
    op = sg.operations[k]
    operands = sg.operands
    types = set()  # filled in operand order: the order the costs are summed in
    for i in (*op.inputs, *op.outputs):
        t = int(operands[i].type)
        # A HAL tensor type, or a value no type of the HAL's nor an extension's (_is_tensor)
        if t in _TENSOR_VALUES or (t not in OPERAND_TYPES and not t >> 16):
            types.add(t)
    return tuple(types or {int(OperandType.TENSOR_FLOAT32)})


#: The values of the HAL's tensor operand types.
_TENSOR_VALUES = frozenset(int(t) for t in OperandType if t.is_tensor)


def _types_cost(device: Any, types: tuple[int, ...], relaxed: bool, preference: int) -> float:
    perfs = [device.performance(t, relaxed) for t in types]
    if preference == PreferenceCode.LOW_POWER:
        return sum(p.power_usage for p in perfs)
    return sum(p.exec_time for p in perfs)


def assign(model: Model, devices: Sequence[Any], preference: int) -> list[int]:
    """The index into ``devices`` chosen for each operation; NoDevice when one has none."""
    support = supported_by(model, devices)
    relaxed = model.relax_computation_float32_to_float16
    # A device's cost of a set of types, found once: most operations share a few sets, and
    # each performance is a search of the device's capabilities.
    costs: dict[tuple[int, tuple[int, ...]], float] = {}

    def cost(j: int, types: tuple[int, ...]) -> float:
        found = costs.get((j, types))
        if found is None:
            found = costs[(j, types)] = _types_cost(devices[j], types, relaxed, preference)
        return found

    choice, missing = [], []
    for k in range(len(model.main.operations)):
        able = [j for j in range(len(devices)) if support[j][k]]
        if not able and int(model.main.operations[k].type) in _CONTROL_FLOW:
            choice.append(RUNTIME)
            continue
        if not able:
            missing.append(k)
            choice.append(-1)
            continue
        types = _judged_types(model, k)
        best = min(able, key=lambda j: cost(j, types))
        if (int(model.main.operations[k].type) in _CONTROL_FLOW and len(devices) > 1
                and isinstance(getattr(devices[best], "hal", None), ReferenceDevice)):
            # As upstream does with its CPU device: rather than run the whole IF/WHILE on
            # the fallback device, the runtime runs it so each body is partitioned too.
            choice.append(RUNTIME)
            continue
        choice.append(best)
    if missing:
        raise NoDevice(missing)
    return choice


def group(model: Model, choice: list[int]) -> list[tuple[int, list[int]]]:
    """(device index, operations) runs in a topological order that keeps runs long: the next
    operation is a ready one on the current device when there is one."""
    sg = model.main
    producer = {o: k for k, op in enumerate(sg.operations) for o in op.outputs}
    deps = [{producer[i] for i in op.inputs if i in producer} for op in sg.operations]
    users: dict[int, list[int]] = {}
    for k, d in enumerate(deps):
        for p in d:
            users.setdefault(p, []).append(k)
    waiting = [len(d) for d in deps]
    ready = sorted(k for k, w in enumerate(waiting) if w == 0)
    runs: list[tuple[int, list[int]]] = []
    current = -1
    while ready:
        here = [k for k in ready if choice[k] == current]
        if not here:
            current = choice[ready[0]]
            runs.append((current, []))
            here = [k for k in ready if choice[k] == current]
        k = here[0]
        ready.remove(k)
        runs[-1][1].append(k)
        if current == RUNTIME:
            current = -1  # each runtime IF/WHILE is a step of its own
        for u in users.get(k, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
        ready.sort()
    return runs


def _known(shape: Any) -> list[int] | None:
    if shape is None or any(d == 0 for d in shape):
        return None
    return [int(d) for d in shape]


def build_steps(model: Model, devices: Sequence[Any], runs: list[tuple[int, list[int]]],
                shapes: Sequence[Any] | None = None) -> list[Step]:
    """Each run as a Step with its sub-model (``shapes``: inferred main shapes, used to fill
    dimensions the model leaves unknown at step boundaries)."""
    sg = model.main
    step_of = {k: s for s, (_d, ops) in enumerate(runs) for k in ops}
    main_in, main_out = set(sg.input_indexes), set(sg.output_indexes)
    readers: dict[int, set[int]] = {}
    for k, op in enumerate(sg.operations):
        for i in op.inputs:
            readers.setdefault(i, set()).add(step_of[k])
    steps = []
    for s, (d, ops) in enumerate(runs):
        produced = [o for k in ops for o in sg.operations[k].outputs]
        read = []
        for k in ops:
            for i in sg.operations[k].inputs:
                if i not in read:
                    read.append(i)
        own = set(produced)
        inputs = [i for i in read if i not in own and
                  (i in main_in or sg.operands[i].lifetime ==
                   OperandLifeTime.TEMPORARY_VARIABLE or
                   sg.operands[i].lifetime == OperandLifeTime.SUBGRAPH_OUTPUT)]
        if not inputs and d != RUNTIME:
            # A HAL model needs an input: a step reading only constants gets its first one
            # as an input, which the runtime feeds from the model's value.
            inputs = [i for i in read if sg.operands[i].lifetime in _CONSTANTS][:1]
        outputs = [o for o in dict.fromkeys(produced)
                   if o in main_out or readers.get(o, set()) - {s}]
        if not outputs and produced:
            outputs = [produced[-1]]
        if d == RUNTIME:
            steps.append(Step(None, list(ops), inputs, outputs))
            continue
        step = Step(devices[d], list(ops), inputs, outputs)
        step.model = sub_model(model, step, shapes)
        steps.append(step)
    return steps


def sub_model(model: Model, step: Step, shapes: Sequence[Any] | None = None) -> Model:
    """The HAL model of one step: its operations over its own operands."""
    sg = model.main
    index: dict[int, int] = {}
    operands: list[Operand] = []
    ins, outs = set(step.inputs), set(step.outputs)

    def add(i: int) -> int:
        if i in index:
            return index[i]
        o = sg.operands[i]
        dims = list(o.dimensions)
        if shapes is not None and (not dims or 0 in dims) and \
                _is_tensor(o.type) and (i in ins or i in outs):
            known = _known(shapes[i])
            if known is not None:
                dims = known
        if i in ins:
            o = replace(o, dimensions=dims, lifetime=OperandLifeTime.SUBGRAPH_INPUT,
                        location=type(o.location)(), number_of_consumers=0)
        elif i in outs:
            o = replace(o, dimensions=dims, lifetime=OperandLifeTime.SUBGRAPH_OUTPUT,
                        location=type(o.location)(), number_of_consumers=0)
        elif o.lifetime in (OperandLifeTime.SUBGRAPH_INPUT, OperandLifeTime.SUBGRAPH_OUTPUT):
            o = replace(o, lifetime=OperandLifeTime.TEMPORARY_VARIABLE,
                        location=type(o.location)(), number_of_consumers=0)
        else:
            o = replace(o, number_of_consumers=0)
        index[i] = len(operands)
        operands.append(o)
        return index[i]

    for i in step.inputs:
        add(i)
    operations = []
    for k in step.operations:
        op = sg.operations[k]
        new_in = [add(i) for i in op.inputs]
        new_out = [add(i) for i in op.outputs]
        for j in new_in:
            operands[j].number_of_consumers += 1
        operations.append(type(op)(op.type, new_in, new_out))
    for i in step.outputs:
        add(i)
    cf = any(sg.operations[k].type in _CONTROL_FLOW for k in step.operations)
    main = Subgraph(operands, operations, [index[i] for i in step.inputs],
                    [index[i] for i in step.outputs])
    referenced = list(model.referenced) if cf else []
    return Model(main, referenced, model.operand_values,
                 list(model.pools), model.relax_computation_float32_to_float16,
                 _table_for([main, *referenced], model.extension_name_to_prefix))


def _table_for(subgraphs: Sequence[Subgraph], table: Sequence[Any]) -> list[Any]:
    """The entries of ``table`` whose prefixes the subgraphs use: a step's model names only
    the extensions it has (a driver may expect just its own, as upstream's sample does)."""
    used = {extension_prefix(x.type) for sg in subgraphs for x in (*sg.operands,
                                                                  *sg.operations)
            if is_extension_type(x.type)}
    return [e for e in table if int(e.prefix) in used]


def subgraph_model(model: Model, k: int) -> Model:
    """Referenced subgraph ``k`` as the main subgraph of a model of its own (same constants
    and referenced subgraphs), for partitioning a body the runtime runs."""
    return Model(model.referenced[k], list(model.referenced), model.operand_values,
                 list(model.pools), model.relax_computation_float32_to_float16,
                 list(model.extension_name_to_prefix))

