"""Invalid models: mutants of a valid model, after the families of the upstream model-validation
suite (VTS ``ValidateModel``: operand type, rank, scale, zero point, lifetime, input/output role,
number of consumers, extra writer, operation operand type, operation type, operand indexes,
removed write, removed operand/operation/input/output, added input/output, execution
preference and priority) plus families the upstream suite leaves as TODO or does not cover
(operand locations, lifetime/location consistency, subgraph input/output lists, an operand
nobody writes, subgraph references and reference cycles, undeclared extension types).

Each mutant carries ``reason``: the HAL rule it breaks. Mutations that could leave the model
valid are skipped with the same reasoning as upstream (its per-operation exception lists) plus
a few exceptions of our own, each explained where it is applied. :func:`check_model_mutant`
checks that a device rejects one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from nnhal.conformance.mutations.common import (
    ACCEPTED,
    CALLBACK_TIMEOUT_S,
    CRASH,
    HANG,
    QUANT_TYPES,
    REJECTED,
    SCALAR_TYPES,
    WRONG_STATUS,
    addition_may_be_valid,
    byte_size,
    input_is_required,
    removal_may_be_valid,
)
from nnhal.hal.interfaces import IDevice, PreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    OperationType,
    Priority,
    Subgraph,
    SymmPerChannelQuantParams,
    make_extension_type,
)

L = OperandLifeTime
T = OperandType
Op = OperationType


#: Never grow operandValues beyond this when turning an operand into CONSTANT_COPY.
MAX_CONSTANT_COPY = 1 << 20

# ==== copying ===============================================================================


def copy_operand(o: Operand) -> Operand:
    extra = o.extra_params
    if isinstance(extra, SymmPerChannelQuantParams):
        extra = SymmPerChannelQuantParams(list(extra.scales), extra.channel_dim)
    return Operand(type=o.type, dimensions=list(o.dimensions),
                   number_of_consumers=o.number_of_consumers, scale=o.scale,
                   zero_point=o.zero_point, lifetime=o.lifetime, location=o.location,
                   extra_params=extra)


def copy_subgraph(sg: Subgraph) -> Subgraph:
    return Subgraph([copy_operand(o) for o in sg.operands],
                    [Operation(op.type, list(op.inputs), list(op.outputs))
                     for op in sg.operations],
                    list(sg.input_indexes), list(sg.output_indexes))


def copy_model(model: Model) -> Model:
    """A deep copy of the graph; pools (file descriptors) and operandValues are shared."""
    return Model(main=copy_subgraph(model.main),
                 referenced=[copy_subgraph(sg) for sg in model.referenced],
                 operand_values=model.operand_values, pools=list(model.pools),
                 relax_computation_float32_to_float16=model.relax_computation_float32_to_float16,
                 extension_name_to_prefix=list(model.extension_name_to_prefix))


# ==== model mutants =========================================================================


@dataclass
class ModelMutant:
    """One invalid (model, preference, priority) and why it is invalid."""

    kind: str
    detail: str
    reason: str
    model: Model
    preference: int = ExecutionPreference.FAST_SINGLE_ANSWER
    priority: int = Priority.MEDIUM

    @property
    def call_args_valid(self) -> bool:
        """Upstream only calls getSupportedOperations when preference and priority are valid."""
        return self.preference in tuple(ExecutionPreference) and \
            self.priority in tuple(Priority)


Mutator = Callable[[Model, Subgraph], None]


#: Operand type values outside every defined range (upstream's list: one below the fundamental
#: range, one above it, one below and one above the OEM range).
INVALID_OPERAND_TYPES = (0xFFFFFFFF, 16, 9999, 10002)
#: Operation type values outside every defined range: one above the last fundamental operation
#: (AIDL v3's REVERSE; 102 was HAL 1.3's, but AIDL v2 defines it), one below and one above OEM.
INVALID_OPERATION_TYPES = (max(t for t in OperationType if t != OperationType.OEM_OPERATION) + 1,
                           9999, 10001)
#: A type with an extension prefix no model declares.
UNDECLARED_EXTENSION_TYPE = make_extension_type(0x7ABC, 1)


def _invalid_scale(t: int) -> float | None:
    """A scale the operand type forbids: non-zero where the type has none, zero where it needs
    a positive one, negative for TENSOR_INT32 (whose scale is free but never negative)."""
    if t in (*SCALAR_TYPES, T.TENSOR_BOOL8, T.TENSOR_FLOAT16, T.TENSOR_FLOAT32,
             T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.SUBGRAPH):
        return 1.0
    if t == T.TENSOR_INT32:
        return -1.0
    if t in (*QUANT_TYPES, T.TENSOR_QUANT8_ASYMM_SIGNED):
        return 0.0
    return None


def _invalid_zero_points(t: int) -> tuple[int, ...]:
    """Zero points outside the type's range (0 only, for the symmetric and unquantized ones)."""
    if t in (*SCALAR_TYPES, T.TENSOR_BOOL8, T.TENSOR_FLOAT16, T.TENSOR_FLOAT32, T.TENSOR_INT32,
             T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.SUBGRAPH):
        return (1,)
    return {T.TENSOR_QUANT8_ASYMM: (-1, 256), T.TENSOR_QUANT8_SYMM: (-129, -1, 1, 128),
            T.TENSOR_QUANT16_ASYMM: (-1, 65536), T.TENSOR_QUANT16_SYMM: (-32769, -1, 1, 32768),
            T.TENSOR_QUANT8_ASYMM_SIGNED: (-129, 128)}.get(t, ())


def _become_constant_copy(model: Model, o: Operand) -> None:
    """Give ``o`` a CONSTANT_COPY location at the start of operandValues (grown if needed)."""
    size = byte_size(o)
    o.location = DataLocation(0, 0, size)
    if len(model.operand_values) < size:
        model.operand_values = bytes(model.operand_values) + \
            b"\0" * (size - len(model.operand_values))


def _to_type(o: Operand, t: int) -> None:
    """Change an operand's type, adjusting the other fields so that only the type is wrong."""
    o.type = t
    dims = list(o.dimensions) if o.dimensions else [1]
    if t in SCALAR_TYPES:
        o.dimensions, o.scale, o.zero_point = [], 0.0, 0
    elif t in (T.TENSOR_BOOL8, T.TENSOR_FLOAT16, T.TENSOR_FLOAT32):
        o.dimensions, o.scale, o.zero_point = dims, 0.0, 0
    elif t == T.TENSOR_INT32:
        o.dimensions, o.zero_point = dims, 0
    elif t in QUANT_TYPES:
        o.dimensions, o.scale = dims, (o.scale if o.scale != 0 else 1.0)
    elif t == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        o.dimensions, o.scale, o.zero_point = dims, 0.0, 0
        n = int(o.dimensions[0]) if o.dimensions else 0
        o.extra_params = SymmPerChannelQuantParams([1.0] * n, 0)
        return
    # Any other type keeps the original channel parameters, as upstream does.


def _operation_operand_type_skip(sg: Subgraph, index: int, t: int) -> str | None:
    """Why changing operand ``index`` to type ``t`` may leave the model valid, or None.

    The per-operation list is upstream's (operations whose operand accepts several types);
    the last rule is ours: an operand no operation reads or writes has no type constraint.
    """
    o = sg.operands[index]
    if t == o.type or t in (T.OEM, T.TENSOR_OEM_BYTE):
        return "same type or OEM"
    float_types = (T.TENSOR_FLOAT16, T.TENSOR_FLOAT32)
    used = False
    for op in sg.operations:
        ins, outs = op.inputs, op.outputs
        if index in ins or index in outs:
            used = True
        kind = op.type
        if kind == Op.LSH_PROJECTION and len(ins) > 1 and index == ins[1]:
            return "LSH_PROJECTION input 1 takes any type"
        if kind in (Op.CAST, Op.ARGMAX, Op.ARGMIN) and t in (
                *float_types, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM,
                T.TENSOR_QUANT8_ASYMM_SIGNED):
            return f"{Op(kind).name} accepts several tensor types"
        if kind == Op.QUANTIZE:
            if ins and index == ins[0] and t in float_types:
                return "QUANTIZE input is float16 or float32"
            if outs and index == outs[0] and t in (T.TENSOR_QUANT8_ASYMM,
                                                   T.TENSOR_QUANT8_ASYMM_SIGNED):
                return "QUANTIZE output is either quant8 type"
        if kind == Op.RANDOM_MULTINOMIAL and ins and index == ins[0] and t in float_types:
            return "RANDOM_MULTINOMIAL input is float16 or float32"
        if kind == Op.DEQUANTIZE:
            if ins and index == ins[0] and t in (
                    T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM,
                    T.TENSOR_QUANT8_SYMM_PER_CHANNEL):
                return "DEQUANTIZE input is any quant8 type"
            if outs and index == outs[0] and t in float_types:
                return "DEQUANTIZE output is float16 or float32"
        if kind in (Op.CONV_2D, Op.DEPTHWISE_CONV_2D, Op.GROUPED_CONV_2D,
                    Op.TRANSPOSE_CONV_2D) and len(ins) > 1 and index == ins[1] and t in (
                T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_SYMM_PER_CHANNEL):
            return "convolution filter is per-tensor or per-channel quant8"
        if kind == Op.AXIS_ALIGNED_BBOX_TRANSFORM and len(ins) > 1 and index == ins[1] and \
                t in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED):
            return "AXIS_ALIGNED_BBOX_TRANSFORM deltas are either quant8 type"
        if kind == Op.RANK and ins and index == ins[0] and T(t).is_tensor:
            return "RANK input is any tensor"
    if not used:
        return "no operation uses the operand"
    return None


def _remove_operand_skip(sg: Subgraph, index: int) -> str | None:
    """Upstream's reasons to keep an operand, plus optional operation inputs (see below)."""
    if sg.operands[index].number_of_consumers == 0:
        return "unused operand"
    for op in sg.operations:
        if index in op.outputs and op.type in (
                Op.SPLIT, Op.UNIDIRECTIONAL_SEQUENCE_LSTM, Op.UNIDIRECTIONAL_SEQUENCE_RNN,
                Op.BIDIRECTIONAL_SEQUENCE_LSTM, Op.BIDIRECTIONAL_SEQUENCE_RNN):
            return "operation with a variable number of outputs"
        # Ours: upstream's removal keeps the later operand indexes unchanged (its decrement has
        # no effect), so its mutant is always broken; ours renumbers correctly, so removing an
        # optional trailing input (layout, axis, align flags, one of CONCATENATION's tensors)
        # leaves a valid model and is skipped like removeOperationInput does.
        for k, i in enumerate(op.inputs):
            if i == index and removal_may_be_valid(op, k, sg.operands):
                return "optional input of an operation"
    return None


def _new_operand(sg: Subgraph, lifetime: OperandLifeTime, consumers: int) -> int:
    sg.operands.append(Operand(type=T.INT32, number_of_consumers=consumers, lifetime=lifetime))
    return len(sg.operands) - 1


def _remove_operand(sg: Subgraph, index: int) -> None:
    def fix(vec: list[int]) -> list[int]:
        return [v - 1 if v > index else v for v in vec if v != index]

    del sg.operands[index]
    for op in sg.operations:
        op.inputs, op.outputs = fix(op.inputs), fix(op.outputs)
    sg.input_indexes, sg.output_indexes = fix(sg.input_indexes), fix(sg.output_indexes)


def _pool_sizes(model: Model) -> list[int]:
    return [int(getattr(p, "size", 0)) for p in model.pools]


def _subgraph_mutations(model: Model, which: int) -> Iterator[tuple[str, str, str, Mutator]]:
    """(kind, detail, reason, mutator) for subgraph ``which`` (-1 main, else referenced)."""
    sg = model.main if which < 0 else model.referenced[which]
    name = "main" if which < 0 else f"subgraph {which}"
    ops = sg.operands
    n = len(ops)
    is_main = which < 0

    def on(mut: Callable[[Model, Subgraph], None]) -> Mutator:
        return mut

    # -- operand type out of range / undeclared extension ----------------------------------
    for i in range(n):
        for bad in INVALID_OPERAND_TYPES:
            yield ("operand_type", f"{name} operand {i} type {bad}",
                   "operand type outside every defined range",
                   on(lambda m, s, i=i, bad=bad: setattr(s.operands[i], "type", bad)))
        yield ("operand_type", f"{name} operand {i} undeclared extension type",
               "extension type whose prefix the model does not declare",
               on(lambda m, s, i=i: setattr(s.operands[i], "type", UNDECLARED_EXTENSION_TYPE)))

    # -- rank of scalars, scale, zero point --------------------------------------------------
    for i, o in enumerate(ops):
        if o.type in SCALAR_TYPES:
            yield ("operand_rank", f"{name} operand {i} scalar with rank 1",
                   "a scalar has no dimensions",
                   on(lambda m, s, i=i: setattr(s.operands[i], "dimensions", [0])))
        scale = _invalid_scale(o.type)
        if scale is not None and scale != o.scale:
            yield ("operand_scale", f"{name} operand {i} scale {scale}",
                   "scale not allowed for the operand type",
                   on(lambda m, s, i=i, v=scale: setattr(s.operands[i], "scale", v)))
        for zp in _invalid_zero_points(o.type):
            yield ("operand_zero_point", f"{name} operand {i} zeroPoint {zp}",
                   "zeroPoint outside the range of the operand type",
                   on(lambda m, s, i=i, v=zp: setattr(s.operands[i], "zero_point", v)))

    # -- lifetime (upstream: change whether the operand has a writer) ---------------------
    for i, o in enumerate(ops):
        if o.lifetime in (L.SUBGRAPH_OUTPUT, L.TEMPORARY_VARIABLE):
            targets = [L.SUBGRAPH_INPUT, L.CONSTANT_COPY]
        elif o.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE, L.SUBGRAPH_INPUT):
            targets = [L.TEMPORARY_VARIABLE, L.SUBGRAPH_OUTPUT]
        else:
            targets = []  # NO_VALUE, SUBGRAPH: not enough information (as upstream)
        size = byte_size(o)
        if not size or size > MAX_CONSTANT_COPY:
            targets = [t for t in targets if t != L.CONSTANT_COPY]
        for lt in targets:
            def mut(m: Model, s: Subgraph, i: int = i, lt: L = lt) -> None:
                o = s.operands[i]
                if o.lifetime == L.SUBGRAPH_INPUT:
                    s.input_indexes = [k for k in s.input_indexes if k != i]
                elif o.lifetime == L.SUBGRAPH_OUTPUT:
                    s.output_indexes = [k for k in s.output_indexes if k != i]
                o.lifetime, o.location = lt, DataLocation()
                if lt == L.CONSTANT_COPY:
                    _become_constant_copy(m, o)
                elif lt == L.SUBGRAPH_INPUT:
                    s.input_indexes.append(i)
                elif lt == L.SUBGRAPH_OUTPUT:
                    s.output_indexes.append(i)
            written = o.lifetime in (L.SUBGRAPH_OUTPUT, L.TEMPORARY_VARIABLE)
            yield ("operand_lifetime", f"{name} operand {i} {L(o.lifetime).name} -> {lt.name}",
                   "an operation writes an operand whose lifetime has a value already"
                   if written else "no operation writes an operand whose lifetime needs one",
                   mut)

    # -- input/output role (upstream: lifetime changes, the index lists do not) -----------
    for i, o in enumerate(ops):
        role = {L.CONSTANT_COPY: L.SUBGRAPH_INPUT, L.CONSTANT_REFERENCE: L.SUBGRAPH_INPUT,
                L.SUBGRAPH_OUTPUT: L.TEMPORARY_VARIABLE,
                L.TEMPORARY_VARIABLE: L.SUBGRAPH_OUTPUT}.get(o.lifetime)
        if o.lifetime == L.SUBGRAPH_INPUT and 0 < byte_size(o) <= MAX_CONSTANT_COPY:
            role = L.CONSTANT_COPY
        if role is None:
            continue

        def mut(m: Model, s: Subgraph, i: int = i, lt: L = role) -> None:
            o = s.operands[i]
            o.lifetime, o.location = lt, DataLocation()
            if lt == L.CONSTANT_COPY:
                _become_constant_copy(m, o)
        yield ("operand_input_output", f"{name} operand {i} {L(o.lifetime).name} -> "
               f"{role.name}", "lifetime disagrees with the subgraph's input/output lists", mut)

    # -- numberOfConsumers -----------------------------------------------------------------
    for i, o in enumerate(ops):
        for c in ((1,) if o.number_of_consumers == 0 else
                  (o.number_of_consumers - 1, o.number_of_consumers + 1)):
            yield ("operand_consumers", f"{name} operand {i} numberOfConsumers {c}",
                   "numberOfConsumers differs from the number of operation inputs reading it",
                   on(lambda m, s, i=i, c=c: setattr(s.operands[i], "number_of_consumers", c)))

    # -- an extra writer (a copy of the operation appended; one output shared) -------------
    for k, operation in enumerate(sg.operations):
        for j in range(len(operation.outputs)):
            def mut(m: Model, s: Subgraph, k: int = k, j: int = j) -> None:
                new = Operation(s.operations[k].type, list(s.operations[k].inputs),
                                list(s.operations[k].outputs))
                for i in new.inputs:
                    s.operands[i].number_of_consumers += 1
                for jj, out in enumerate(new.outputs):
                    if jj == j:
                        continue
                    o = copy_operand(s.operands[out])
                    o.number_of_consumers = 0
                    o.lifetime = L.TEMPORARY_VARIABLE
                    s.operands.append(o)
                    new.outputs[jj] = len(s.operands) - 1
                s.operations.append(new)
            yield ("operand_add_writer", f"{name} operation {k} output {j} written twice",
                   "an operand is written by two operations", mut)

    # -- operation operand type --------------------------------------------------------------
    for i in range(n):
        for t in T:
            if _operation_operand_type_skip(sg, i, t) is not None:
                continue
            yield ("operation_operand_type", f"{name} operand {i} -> {t.name}",
                   "an operation gets an operand of a type it does not accept",
                   on(lambda m, s, i=i, t=t: _to_type(s.operands[i], int(t))))

    # -- operation type, operand indexes -----------------------------------------------------
    for k, operation in enumerate(sg.operations):
        for bad in INVALID_OPERATION_TYPES:
            yield ("operation_type", f"{name} operation {k} type {bad}",
                   "operation type outside every defined range",
                   on(lambda m, s, k=k, bad=bad: setattr(s.operations[k], "type", bad)))
        for j in range(len(operation.inputs)):
            def mut(m: Model, s: Subgraph, k: int = k, j: int = j) -> None:
                s.operations[k].inputs[j] = len(s.operands)
            yield ("operation_input_index", f"{name} operation {k} input {j} -> {n}",
                   "operand index out of range", mut)
        for j in range(len(operation.outputs)):
            def mut(m: Model, s: Subgraph, k: int = k, j: int = j) -> None:
                s.operations[k].outputs[j] = len(s.operands)
            yield ("operation_output_index", f"{name} operation {k} output {j} -> {n}",
                   "operand index out of range", mut)

    # -- removed write (output redirected to a fresh operand; the old one keeps its readers) -
    for k, operation in enumerate(sg.operations):
        for j, out in enumerate(operation.outputs):
            if ops[out].number_of_consumers == 0:
                continue

            def mut(m: Model, s: Subgraph, k: int = k, j: int = j) -> None:
                o = copy_operand(s.operands[s.operations[k].outputs[j]])
                o.number_of_consumers = 0
                o.lifetime = L.TEMPORARY_VARIABLE
                s.operands.append(o)
                s.operations[k].outputs[j] = len(s.operands) - 1
            yield ("operation_remove_write", f"{name} operation {k} no longer writes {out}",
                   "an operand that is read is never written", mut)

    # -- execution order ---------------------------------------------------------------------
    for k, operation in enumerate(sg.operations):
        if any(ops[i].lifetime in (L.TEMPORARY_VARIABLE, L.SUBGRAPH_OUTPUT)
               for i in operation.inputs if 0 <= i < n):
            def mut(m: Model, s: Subgraph, k: int = k) -> None:
                s.operations.insert(0, s.operations.pop(k))
            yield ("operation_order", f"{name} reader operation {k} moved first",
                   "an operation reads an operand before it is written", mut)
        if any(ops[i].number_of_consumers > 0 for i in operation.outputs if 0 <= i < n):
            def mut(m: Model, s: Subgraph, k: int = k) -> None:
                s.operations.append(s.operations.pop(k))
            yield ("operation_order", f"{name} writer operation {k} moved last",
                   "an operand is read before the operation writing it runs", mut)

    # -- removals ------------------------------------------------------------------------------
    if is_main:
        for i in range(n):
            if _remove_operand_skip(sg, i) is None:
                yield ("remove_operand", f"{name} operand {i} removed",
                       "an operation loses an input or output it requires",
                       on(lambda m, s, i=i: _remove_operand(s, i)))
    for k in range(len(sg.operations)):
        def mut(m: Model, s: Subgraph, k: int = k) -> None:
            for i in s.operations[k].inputs:
                s.operands[i].number_of_consumers -= 1
            del s.operations[k]
        yield ("remove_operation", f"{name} operation {k} removed",
               "the operation's outputs are never written", mut)
    for k, operation in enumerate(sg.operations):
        for j in range(len(operation.inputs)):
            if removal_may_be_valid(operation, j, sg.operands):
                continue

            def mut(m: Model, s: Subgraph, k: int = k, j: int = j) -> None:
                s.operands[s.operations[k].inputs[j]].number_of_consumers -= 1
                del s.operations[k].inputs[j]
            yield ("remove_operation_input", f"{name} operation {k} input {j} removed",
                   "wrong number of inputs for the operation", mut)
        for j, i in enumerate(operation.inputs):
            if not input_is_required(operation, j) or ops[i].type == T.SUBGRAPH:
                continue

            def mut(m: Model, s: Subgraph, k: int = k, j: int = j) -> None:
                old = s.operands[s.operations[k].inputs[j]]
                old.number_of_consumers -= 1
                s.operands.append(Operand(type=old.type, dimensions=list(old.dimensions),
                                          number_of_consumers=1, scale=old.scale,
                                          zero_point=old.zero_point, lifetime=L.NO_VALUE,
                                          extra_params=old.extra_params))
                s.operations[k].inputs[j] = len(s.operands) - 1
            yield ("omit_operation_input", f"{name} operation {k} input {j} omitted",
                   "the operation's signature does not let this input be omitted", mut)
        for j in range(len(operation.outputs)):
            def mut(m: Model, s: Subgraph, k: int = k, j: int = j) -> None:
                del s.operations[k].outputs[j]
            yield ("remove_operation_output", f"{name} operation {k} output {j} removed",
                   "an output is never written and the operation has too few outputs", mut)

    # -- additions (main only: a referenced subgraph's signature is fixed by its callers) -
    if is_main:
        for k, operation in enumerate(sg.operations):
            extra = Operand(type=T.INT32, lifetime=L.SUBGRAPH_INPUT)
            if not addition_may_be_valid(operation, extra, sg.operands):
                def mut(m: Model, s: Subgraph, k: int = k) -> None:
                    i = _new_operand(s, L.SUBGRAPH_INPUT, 1)
                    s.operations[k].inputs.append(i)
                    s.input_indexes.append(i)
                yield ("add_operation_input", f"{name} operation {k} extra INT32 input",
                       "wrong number of inputs for the operation", mut)

            def mut(m: Model, s: Subgraph, k: int = k) -> None:
                i = _new_operand(s, L.SUBGRAPH_OUTPUT, 0)
                s.operations[k].outputs.append(i)
                s.output_indexes.append(i)
            yield ("add_operation_output", f"{name} operation {k} extra INT32 output",
                   "wrong number of outputs for the operation", mut)

    # -- ours: locations ---------------------------------------------------------------------
    sizes = _pool_sizes(model)
    npools = len(sizes)
    for i, o in enumerate(ops):
        loc = o.location
        if o.lifetime == L.CONSTANT_COPY and loc.length > 0:
            end = len(model.operand_values)
            yield ("operand_location", f"{name} operand {i} offset past operandValues",
                   "location beyond operandValues",
                   on(lambda m, s, i=i, e=end, n_=loc.length: setattr(
                       s.operands[i], "location", DataLocation(0, e - n_ + 1, n_))))
        if o.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
            yield ("operand_location", f"{name} operand {i} length + 1",
                   "location length differs from the operand's size",
                   on(lambda m, s, i=i: setattr(s.operands[i], "location", replace(
                       s.operands[i].location, length=s.operands[i].location.length + 1))))
        if o.lifetime == L.CONSTANT_REFERENCE:
            yield ("operand_location", f"{name} operand {i} pool index {len(sizes)}",
                   "pool index beyond the model's pools",
                   on(lambda m, s, i=i, p=npools: setattr(
                       s.operands[i], "location", replace(s.operands[i].location, pool_index=p))))
            if loc.pool_index < len(sizes) and loc.length > 0:
                yield ("operand_location", f"{name} operand {i} offset past pool end",
                       "location beyond the pool",
                       on(lambda m, s, i=i, e=sizes[loc.pool_index], n_=loc.length: setattr(
                           s.operands[i], "location",
                           replace(s.operands[i].location, offset=e - n_ + 1))))
        if o.lifetime in (L.TEMPORARY_VARIABLE, L.SUBGRAPH_INPUT, L.SUBGRAPH_OUTPUT,
                          L.NO_VALUE):
            yield ("operand_location", f"{name} operand {i} {L(o.lifetime).name} with a "
                   "location", "a non-constant operand must have an empty location",
                   on(lambda m, s, i=i: setattr(s.operands[i], "location",
                                                DataLocation(0, 0, 4))))
        for bad in (7, 99):
            yield ("operand_lifetime", f"{name} operand {i} lifetime {bad}",
                   "lifetime outside the enumeration",
                   on(lambda m, s, i=i, bad=bad: setattr(s.operands[i], "lifetime", bad)))

    # -- ours: subgraph input/output lists ----------------------------------------------------
    for kind, attr in (("input", "input_indexes"), ("output", "output_indexes")):
        for k, i in enumerate(getattr(sg, attr)):
            yield (f"subgraph_{kind}", f"{name} {kind} {k} (operand {i}) removed",
                   f"an operand with lifetime SUBGRAPH_{kind.upper()} is not listed",
                   on(lambda m, s, k=k, a=attr: getattr(s, a).pop(k)))
            yield (f"subgraph_{kind}", f"{name} {kind} {k} (operand {i}) listed twice",
                   f"a subgraph {kind} listed twice",
                   on(lambda m, s, i=i, a=attr: getattr(s, a).append(i)))
        yield (f"subgraph_{kind}", f"{name} {kind} index {n}",
               f"subgraph {kind} index out of range",
               on(lambda m, s, a=attr: getattr(s, a).append(len(s.operands))))
    yield ("operand_no_writer", f"{name} unwritten TEMPORARY_VARIABLE added",
           "a temporary operand that no operation writes",
           on(lambda m, s: s.operands.append(Operand(type=T.TENSOR_FLOAT32, dimensions=[1]))))

    # -- ours: subgraph references -------------------------------------------------------------
    for i, o in enumerate(ops):
        if o.lifetime != L.SUBGRAPH:
            continue
        yield ("subgraph_reference", f"{name} operand {i} references subgraph "
               f"{len(model.referenced)}", "subgraph reference out of range",
               on(lambda m, s, i=i: setattr(s.operands[i], "location",
                                            DataLocation(0, len(m.referenced), 0))))
        if not is_main:
            yield ("subgraph_cycle", f"{name} operand {i} references its own subgraph",
                   "subgraph references form a cycle",
                   on(lambda m, s, i=i, w=which: setattr(s.operands[i], "location",
                                                         DataLocation(0, w, 0))))
        elif model.referenced:
            # Make the callee call back into a subgraph that (transitively) calls it.
            target = int(o.location.offset)
            if 0 <= target < len(model.referenced):
                callee = model.referenced[target]
                inner = [j for j, x in enumerate(callee.operands) if x.lifetime == L.SUBGRAPH]
                if inner:
                    def mut(m: Model, s: Subgraph, t: int = target, j: int = inner[0]) -> None:
                        m.referenced[t].operands[j].location = DataLocation(0, t, 0)
                    yield ("subgraph_cycle", f"subgraph {target} references itself",
                           "subgraph references form a cycle", mut)
                else:
                    # The callee becomes a copy of the main graph, which calls the callee.
                    def mut(m: Model, s: Subgraph, t: int = target) -> None:
                        m.referenced[t] = copy_subgraph(m.main)
                    yield ("subgraph_cycle", f"subgraph {target} replaced by a copy of main",
                           "subgraph references form a cycle", mut)


def model_mutations(model: Model, *, referenced: bool = True) -> Iterator[ModelMutant]:
    """Every invalid variant of ``model`` (lazily; each a fresh copy sharing the pools)."""
    subgraphs = [-1] + (list(range(len(model.referenced))) if referenced else [])
    for which in subgraphs:
        for kind, detail, reason, mutate in _subgraph_mutations(model, which):
            m = copy_model(model)
            s = m.main if which < 0 else m.referenced[which]
            mutate(m, s)
            yield ModelMutant(kind, detail, reason, m)
    for bad in (-1, 3):
        yield ModelMutant("execution_preference", f"preference {bad}",
                          "preference outside the enumeration", model, preference=bad)
    for bad in (-1, 3):
        yield ModelMutant("priority", f"priority {bad}", "priority outside the enumeration",
                          model, priority=bad)


def relaxed_control(model: Model) -> Model:
    """The model with relaxComputationFloat32toFloat16 flipped: a *valid* control.

    Since HAL 1.1 the flag is legal on any model (only a 1.0 driver, whose Model has no such
    field, cannot take a relaxed model), so flipping it must never make a driver reject a
    model it accepted; it is not an invalid mutation.
    """
    m = copy_model(model)
    m.relax_computation_float32_to_float16 = not m.relax_computation_float32_to_float16
    return m


def check_model_mutant(device: IDevice, mutant: ModelMutant,
                       timeout: float = CALLBACK_TIMEOUT_S) -> tuple[str, str]:
    """(outcome, message): getSupportedOperations and prepareModel must both answer
    INVALID_ARGUMENT, and the prepare callback must be called once, without a model."""
    try:
        if mutant.call_args_valid:
            status, flags = device.get_supported_operations(mutant.model)
            if status == ErrorStatus.NONE:
                return ACCEPTED, f"getSupportedOperations accepted it ({flags})"
            if status != ErrorStatus.INVALID_ARGUMENT:
                return WRONG_STATUS, f"getSupportedOperations: {ErrorStatus(status).name}"
        cb = PreparedModelCallback()
        launch = device.prepare_model(mutant.model, mutant.preference, mutant.priority,  # type: ignore[arg-type]
                                      None, [], [], b"", cb)
        try:
            status, prepared = cb.wait(timeout)
        except TimeoutError:
            return HANG, "prepare callback never called"
    except Exception as e:  # noqa: BLE001 - that is what we are looking for
        return CRASH, f"{type(e).__name__}: {e}"
    if launch == ErrorStatus.NONE and status == ErrorStatus.NONE:
        return ACCEPTED, "prepareModel accepted it"
    if launch != ErrorStatus.INVALID_ARGUMENT or status != ErrorStatus.INVALID_ARGUMENT:
        return WRONG_STATUS, (f"prepareModel launch {ErrorStatus(launch).name}, callback "
                              f"{ErrorStatus(status).name}")
    if prepared is not None:
        return WRONG_STATUS, "prepareModel failed but delivered a prepared model"
    if cb.calls != 1:
        return WRONG_STATUS, f"prepare callback called {cb.calls} times"
    return REJECTED, ""
