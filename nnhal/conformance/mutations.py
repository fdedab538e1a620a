"""Hostile input for a driver: invalid models, invalid requests and random garbage.

Model mutations follow the families of the upstream model-validation suite (VTS
``ValidateModel``: operand type, rank, scale, zero point, lifetime, input/output role,
number of consumers, extra writer, operation operand type, operation type, operand indexes,
removed write, removed operand/operation/input/output, added input/output, execution
preference and priority) plus families the upstream suite leaves as TODO or does not cover
(operand locations, lifetime/location consistency, subgraph input/output lists, an operand
nobody writes, subgraph references and reference cycles, undeclared extension types).
Each mutant carries ``reason``: the HAL rule it breaks. Mutations that could leave the model
valid are skipped with the same reasoning as upstream (its per-operation exception lists)
plus a few exceptions of our own, each explained where it is applied.

Request mutations follow upstream ``ValidateRequest`` (removed input/output) plus pool
indexes, locations, dimensions, argument counts, omitted arguments and memory-domain tokens;
each is run through every execution path the prepared model offers (:func:`execution_paths`).

The random generators (:func:`random_model`, :func:`random_request`, :func:`mutate_bytes`)
take a :class:`random.Random`, so hypothesis (``st.randoms()``) can drive and shrink them
and a long run can drive them from a plain seed.

Usable as a library, and from the command line as ``nnhal mutations`` (see :func:`main`).
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from nnhal.hal.interfaces import (
    ExecutionCallback,
    IDevice,
    IPreparedModel,
    PreparedModelCallback,
)
from nnhal.hal.types import (
    LOOP_TIMEOUT_MAXIMUM_NS,
    NO_TIMING,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    MemoryPool,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    OperationType,
    Priority,
    Request,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
    Timing,
    make_extension_type,
)
from nnhal.memory import SharedMemory

L = OperandLifeTime
T = OperandType
Op = OperationType

#: How long any callback may take before the driver is called hung.
CALLBACK_TIMEOUT_S = 30.0
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

_SCALARS = (T.FLOAT16, T.FLOAT32, T.INT32, T.UINT32, T.BOOL)
_QUANT = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT16_ASYMM,
          T.TENSOR_QUANT16_SYMM)
#: Operand type values outside every defined range (upstream's list: one below the fundamental
#: range, one above it, one below and one above the OEM range).
INVALID_OPERAND_TYPES = (0xFFFFFFFF, 16, 9999, 10002)
#: Operation type values outside every defined range.
INVALID_OPERATION_TYPES = (102, 9999, 10001)
#: A type with an extension prefix no model declares.
UNDECLARED_EXTENSION_TYPE = make_extension_type(0x7ABC, 1)


def _invalid_scale(t: int) -> float | None:
    """A scale the operand type forbids: non-zero where the type has none, zero where it needs
    a positive one, negative for TENSOR_INT32 (whose scale is free but never negative)."""
    if t in (*_SCALARS, T.TENSOR_BOOL8, T.TENSOR_FLOAT16, T.TENSOR_FLOAT32,
             T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.SUBGRAPH):
        return 1.0
    if t == T.TENSOR_INT32:
        return -1.0
    if t in (*_QUANT, T.TENSOR_QUANT8_ASYMM_SIGNED):
        return 0.0
    return None


def _invalid_zero_points(t: int) -> tuple[int, ...]:
    """Zero points outside the type's range (0 only, for the symmetric and unquantized ones)."""
    if t in (*_SCALARS, T.TENSOR_BOOL8, T.TENSOR_FLOAT16, T.TENSOR_FLOAT32, T.TENSOR_INT32,
             T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.SUBGRAPH):
        return (1,)
    return {T.TENSOR_QUANT8_ASYMM: (-1, 256), T.TENSOR_QUANT8_SYMM: (-129, -1, 1, 128),
            T.TENSOR_QUANT16_ASYMM: (-1, 65536), T.TENSOR_QUANT16_SYMM: (-32769, -1, 1, 32768),
            T.TENSOR_QUANT8_ASYMM_SIGNED: (-129, 128)}.get(t, ())


def _byte_size(o: Operand) -> int:
    """Bytes of a fully specified non-extension operand; 0 when unknown."""
    try:
        t = T(o.type)
    except ValueError:
        return 0
    if t in (T.OEM, T.TENSOR_OEM_BYTE, T.SUBGRAPH):
        return 0
    if t.is_scalar:
        return t.byte_size
    if not o.dimensions or 0 in o.dimensions:
        return 0
    return int(np.prod(o.dimensions, dtype=np.int64)) * t.byte_size


def _become_constant_copy(model: Model, o: Operand) -> None:
    """Give ``o`` a CONSTANT_COPY location at the start of operandValues (grown if needed)."""
    size = _byte_size(o)
    o.location = DataLocation(0, 0, size)
    if len(model.operand_values) < size:
        model.operand_values = bytes(model.operand_values) + \
            b"\0" * (size - len(model.operand_values))


def _to_type(o: Operand, t: int) -> None:
    """Change an operand's type, adjusting the other fields so that only the type is wrong."""
    o.type = t
    dims = list(o.dimensions) if o.dimensions else [1]
    if t in _SCALARS:
        o.dimensions, o.scale, o.zero_point = [], 0.0, 0
    elif t in (T.TENSOR_BOOL8, T.TENSOR_FLOAT16, T.TENSOR_FLOAT32):
        o.dimensions, o.scale, o.zero_point = dims, 0.0, 0
    elif t == T.TENSOR_INT32:
        o.dimensions, o.zero_point = dims, 0
    elif t in _QUANT:
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
            if i == index and _remove_input_skip(op, k) is not None:
                return "optional input of an operation"
    return None


def _remove_input_skip(op: Operation, k: int) -> str | None:
    """Upstream's list of trailing optional inputs (layout, axis, align flags, more tensors)."""
    n = len(op.inputs)
    optional = {
        Op.CONCATENATION: n > 2 and k != n - 1,
        Op.DEPTHWISE_CONV_2D: (n == 12 and k == 11) or (n == 9 and k == 8),
        Op.CONV_2D: (n == 11 and k == 10) or (n == 8 and k == 7),
        Op.AVERAGE_POOL_2D: (n == 11 and k == 10) or (n == 8 and k == 7),
        Op.MAX_POOL_2D: (n == 11 and k == 10) or (n == 8 and k == 7),
        Op.L2_POOL_2D: (n == 11 and k == 10) or (n == 8 and k == 7),
        Op.RESIZE_BILINEAR: n >= 4 and k >= 3,
        Op.RESIZE_NEAREST_NEIGHBOR: n >= 5 and k >= 3,
        Op.SPACE_TO_DEPTH: n == 3 and k == 2,
        Op.DEPTH_TO_SPACE: n == 3 and k == 2,
        Op.BATCH_TO_SPACE_ND: n == 3 and k == 2,
        Op.SPACE_TO_BATCH_ND: n == 4 and k == 3,
        Op.L2_NORMALIZATION: n == 2 and k == 1,
        Op.LOCAL_RESPONSE_NORMALIZATION: n == 6 and k == 5,
        Op.SOFTMAX: n == 3 and k == 2,
    }
    return "optional trailing input" if optional.get(op.type, False) else None


def _add_input_skip(op: Operation) -> str | None:
    """Upstream: operations that take one more optional INT32/BOOL scalar."""
    n = len(op.inputs)
    if (op.type == Op.L2_NORMALIZATION and n == 1) or \
            (op.type == Op.LOCAL_RESPONSE_NORMALIZATION and n == 5) or \
            (op.type == Op.SOFTMAX and n == 2) or \
            (op.type in (Op.RESIZE_BILINEAR, Op.RESIZE_NEAREST_NEIGHBOR) and n < 6):
        return "operation takes an optional extra scalar"
    # Ours: CONCATENATION's inputs before the axis are any number of tensors, but a new INT32
    # scalar is appended after the axis, so it stays invalid; nothing to skip.
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
        if o.type in _SCALARS:
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
        size = _byte_size(o)
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
        if o.lifetime == L.SUBGRAPH_INPUT and 0 < _byte_size(o) <= MAX_CONSTANT_COPY:
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
            if _remove_input_skip(operation, j) is not None:
                continue

            def mut(m: Model, s: Subgraph, k: int = k, j: int = j) -> None:
                s.operands[s.operations[k].inputs[j]].number_of_consumers -= 1
                del s.operations[k].inputs[j]
            yield ("remove_operation_input", f"{name} operation {k} input {j} removed",
                   "wrong number of inputs for the operation", mut)
        for j in range(len(operation.outputs)):
            def mut(m: Model, s: Subgraph, k: int = k, j: int = j) -> None:
                del s.operations[k].outputs[j]
            yield ("remove_operation_output", f"{name} operation {k} output {j} removed",
                   "an output is never written and the operation has too few outputs", mut)

    # -- additions (main only: a referenced subgraph's signature is fixed by its callers) -
    if is_main:
        for k, operation in enumerate(sg.operations):
            if _add_input_skip(operation) is None:
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


# ==== checking model mutants ================================================================

REJECTED, ACCEPTED, WRONG_STATUS, CRASH, HANG = "rejected", "accepted", "wrong_status", \
    "crash", "hang"


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


# ==== request mutants =======================================================================


@dataclass
class RequestMutant:
    kind: str
    detail: str
    reason: str
    request: Request
    measure: int = MeasureTiming.NO
    loop_timeout: int | None = None
    #: Statuses that count as a correct answer (INVALID_ARGUMENT unless stated otherwise).
    accept: tuple[ErrorStatus, ...] = (ErrorStatus.INVALID_ARGUMENT,)
    #: Must the failure be reported before the execution launches (upstream's rule)?
    at_launch: bool = True


def copy_request(r: Request) -> Request:
    return Request(inputs=[replace(a, dimensions=list(a.dimensions)) for a in r.inputs],
                   outputs=[replace(a, dimensions=list(a.dimensions)) for a in r.outputs],
                   pools=list(r.pools))


def _pool_size(pool: object) -> int | None:
    mem = pool.hidl_memory if isinstance(pool, MemoryPool) else pool
    return int(mem.size) if isinstance(mem, SharedMemory) else None


#: Operations whose every input is a required tensor (binary and ternary elementwise ops).
_ALL_REQUIRED = frozenset({
    Op.ADD, Op.MUL, Op.SUB, Op.DIV, Op.MAXIMUM, Op.MINIMUM, Op.POW, Op.EQUAL, Op.NOT_EQUAL,
    Op.GREATER, Op.GREATER_EQUAL, Op.LESS, Op.LESS_EQUAL, Op.LOGICAL_AND, Op.LOGICAL_OR,
    Op.PRELU, Op.SELECT})


def required_position(op: Operation, k: int) -> bool:
    """Is input ``k`` of ``op`` one the HAL never lets be omitted? Conservatively: input 0 of
    every operation (the primary tensor, or IF's condition) and every tensor input of the
    elementwise operations. Other positions may be optional (LSTM/RNN weights, auxiliary
    inputs, layout flags...), so an omitted value there may be valid and is not generated."""
    return k == 0 or op.type in _ALL_REQUIRED


def required_inputs(main: Subgraph) -> list[bool]:
    """Per request input: does some operation read it at a required position?"""
    return [any(i == idx and required_position(op, k)
                for op in main.operations for k, i in enumerate(op.inputs))
            for idx in main.input_indexes]


def request_mutations(request: Request, main: Subgraph,
                      closed_memory: SharedMemory | None = None) -> Iterator[RequestMutant]:
    """Invalid variants of a valid request for the main subgraph ``main``."""
    def mutant(kind: str, detail: str, reason: str, fn: Callable[[Request], None],
               **kw: Any) -> RequestMutant:
        r = copy_request(request)
        fn(r)
        return RequestMutant(kind, detail, reason, r, **kw)

    npools = len(request.pools)
    for kind, args, indexes in (("input", request.inputs, main.input_indexes),
                                ("output", request.outputs, main.output_indexes)):
        attr = f"{kind}s"
        for k in range(len(args)):
            yield mutant(f"remove_{kind}", f"{kind} {k} removed",
                         f"fewer {kind}s than the model has",
                         lambda r, k=k, a=attr: getattr(r, a).pop(k))
        if args:
            yield mutant(f"extra_{kind}", f"{kind} {len(args)} added",
                         f"more {kind}s than the model has",
                         lambda r, a=attr: getattr(r, a).append(getattr(r, a)[-1]))
        for k, (arg, idx) in enumerate(zip(args, indexes)):
            if arg.has_no_value:
                continue
            loc = arg.location
            op = main.operands[idx]
            yield mutant("pool_index", f"{kind} {k} pool {npools}", "pool index out of range",
                         lambda r, k=k, a=attr: _set_loc(getattr(r, a), k, pool_index=npools))
            size = _pool_size(request.pools[loc.pool_index]) \
                if loc.pool_index < npools else None
            if size is not None:
                yield mutant("location", f"{kind} {k} offset at pool end + 1",
                             "location beyond the pool",
                             lambda r, k=k, a=attr, s=size: _set_loc(
                                 getattr(r, a), k, offset=s - getattr(r, a)[k].location.length
                                 + 1))
                yield mutant("location", f"{kind} {k} length past pool end",
                             "location beyond the pool",
                             lambda r, k=k, a=attr, s=size: _set_loc(
                                 getattr(r, a), k, length=s - getattr(r, a)[k].location.offset
                                 + 1))
                yield mutant("location", f"{kind} {k} offset 2**32", "location beyond the pool",
                             lambda r, k=k, a=attr: _set_loc(getattr(r, a), k, offset=1 << 32))
            if kind == "input" and loc.length > 0:
                yield mutant("location", f"input {k} one byte short",
                             "input location smaller than the input",
                             lambda r, k=k: _set_loc(r.inputs, k,
                                                     length=r.inputs[k].location.length - 1))
            try:
                t = T(op.type)
            except ValueError:
                continue
            if t.is_scalar:
                yield mutant("dimensions", f"{kind} {k} scalar given dimensions [1]",
                             "dimensions on a scalar",
                             lambda r, k=k, a=attr: setattr(getattr(r, a)[k], "dimensions", [1]))
                continue
            dims = list(arg.dimensions) or list(op.dimensions)
            if op.dimensions and all(op.dimensions):
                bad = list(op.dimensions)
                bad[0] += 1
                yield mutant("dimensions", f"{kind} {k} dimensions {bad}",
                             "dimensions disagree with the model's",
                             lambda r, k=k, a=attr, b=bad: setattr(getattr(r, a)[k],
                                                                  "dimensions", b))
            if op.dimensions:
                yield mutant("dimensions", f"{kind} {k} rank + 1",
                             "rank differs from the model's",
                             lambda r, k=k, a=attr, d=dims: setattr(getattr(r, a)[k],
                                                                   "dimensions",
                                                                   [*(d or [1]), 1]))
        for k in range(len(args)):
            yield mutant("no_value_with_location", f"{kind} {k} omitted with a location",
                         "an omitted argument must have an empty location",
                         lambda r, k=k, a=attr: _omit(getattr(r, a), k, DataLocation(0, 0, 4)))
    for k in range(len(request.outputs)):
        yield mutant("omitted_output", f"output {k} omitted", "an output cannot be omitted",
                     lambda r, k=k: _omit(r.outputs, k))
    for k, need in enumerate(required_inputs(main)):
        if need and not request.inputs[k].has_no_value:
            # An input an operation needs: rejecting it (INVALID_ARGUMENT) or failing the
            # execution (GENERAL_FAILURE) are both clean answers; success is not.
            yield mutant("omitted_required_input", f"input {k} omitted",
                         "an input an operation requires is omitted",
                         lambda r, k=k: _omit(r.inputs, k),
                         accept=(ErrorStatus.INVALID_ARGUMENT, ErrorStatus.GENERAL_FAILURE),
                         at_launch=False)
    for p in range(npools):
        yield mutant("pool_token", f"pool {p} an unknown memory-domain token",
                     "no buffer has that token",
                     lambda r, p=p: _set_pool(r, p, MemoryPool.of_token(0x7FFF_FFF1)))
        yield mutant("pool_object", f"pool {p} not a memory", "a pool must be a memory",
                     lambda r, p=p: _set_pool(r, p, None))
        if closed_memory is not None:
            yield mutant("pool_closed", f"pool {p} a closed memory", "the memory cannot be mapped",
                         lambda r, p=p: _set_pool(r, p, closed_memory))
    yield mutant("measure", "measure 2", "MeasureTiming outside the enumeration",
                 lambda r: None, measure=2)
    yield mutant("loop_timeout", "loop timeout above the maximum",
                 "loop timeout above LoopTimeoutDurationNs::MAXIMUM", lambda r: None,
                 loop_timeout=LOOP_TIMEOUT_MAXIMUM_NS + 1)


def _set_loc(args: list[RequestArgument], k: int, **kw: int) -> None:
    args[k] = replace(args[k], location=replace(args[k].location, **kw))


def _omit(args: list[RequestArgument], k: int, loc: DataLocation | None = None) -> None:
    args[k] = RequestArgument(True, loc or DataLocation(), [])


def _set_pool(r: Request, p: int, pool: object) -> None:
    r.pools[p] = pool


# ---- execution paths ------------------------------------------------------------------------

@dataclass
class PathResult:
    """What one execution path answered: the (first) status, shapes, timing, and any rule the
    path broke on its own (launch status disagreeing with the callback, callbacks twice...)."""

    status: ErrorStatus
    shapes: list[Any] = field(default_factory=list)
    timing: Timing = NO_TIMING
    launch: ErrorStatus | None = None
    problem: str = ""


PathFn = Callable[[IPreparedModel, Request, int, int | None], PathResult]


def _path_sync(pm: IPreparedModel, r: Request, measure: int, loop: int | None) -> PathResult:
    st, shapes, timing = pm.execute_synchronously(r, measure, None, loop)  # type: ignore[arg-type]
    return PathResult(ErrorStatus(st), list(shapes), timing)


def _path_async(pm: IPreparedModel, r: Request, measure: int, loop: int | None) -> PathResult:
    cb = ExecutionCallback()
    launch = pm.execute(r, measure, None, loop, cb)  # type: ignore[arg-type]
    st, shapes, timing = cb.wait(CALLBACK_TIMEOUT_S)
    problem = ""
    if cb.calls != 1:
        problem = f"callback called {cb.calls} times"
    elif launch != ErrorStatus.NONE and launch != st:
        problem = f"launch {ErrorStatus(launch).name} but callback {st.name}"
    return PathResult(st, shapes, timing, ErrorStatus(launch), problem)


def _path_burst(pm: IPreparedModel, r: Request, measure: int, loop: int | None) -> PathResult:
    st, burst = pm.configure_execution_burst()
    if st != ErrorStatus.NONE or burst is None:
        return PathResult(ErrorStatus.GENERAL_FAILURE, problem=f"no burst: {st}")
    st, shapes, timing = burst.execute(r, measure, None, loop)  # type: ignore[arg-type]
    return PathResult(ErrorStatus(st), list(shapes), timing)


def _path_reusable(pm: IPreparedModel, r: Request, measure: int, loop: int | None
                   ) -> PathResult:
    st, execution = pm.create_reusable_execution(r, measure, loop)  # type: ignore[arg-type]
    if st != ErrorStatus.NONE:
        problem = "failed creation returned an execution" if execution is not None else ""
        return PathResult(ErrorStatus(st), launch=ErrorStatus(st), problem=problem)
    if execution is None:
        return PathResult(ErrorStatus.GENERAL_FAILURE, problem="NONE without an execution")
    st, shapes, timing = execution.compute(None)
    return PathResult(ErrorStatus(st), list(shapes), timing, ErrorStatus.NONE)


def _path_fenced(pm: IPreparedModel, r: Request, measure: int, loop: int | None) -> PathResult:
    st, fence, cb = pm.execute_fenced(r, [], measure, None, loop, None)  # type: ignore[arg-type]
    st = ErrorStatus(st)
    if st != ErrorStatus.NONE:
        problem = "" if fence is None and cb is None else "failed but returned a fence/callback"
        return PathResult(st, launch=st, problem=problem)
    if fence is not None and hasattr(fence, "wait"):
        try:
            fence.wait(CALLBACK_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001
            return PathResult(ErrorStatus.GENERAL_FAILURE, problem=f"fence wait: {e}")
    if cb is None:
        return PathResult(ErrorStatus.GENERAL_FAILURE, problem="NONE without a callback")
    est, _t1, t2 = cb.get_execution_info()
    return PathResult(ErrorStatus(est), [], t2, ErrorStatus.NONE)


#: Every execution path this module knows, in order; :func:`execution_paths` keeps those a
#: prepared model offers. Add new paths here.
ALL_PATHS: dict[str, PathFn] = {
    "sync": _path_sync,
    "async": _path_async,
    "burst": _path_burst,
    "reusable": _path_reusable,
    "fenced": _path_fenced,
}


def execution_paths(pm: IPreparedModel, valid: Request | None = None) -> dict[str, PathFn]:
    """The paths ``pm`` implements: sync and async always; burst, reusable and fenced when the
    driver overrides them and (given a valid request) they do not answer GENERAL_FAILURE."""
    from nnhal.hal.interfaces import IPreparedModel as Base

    paths = {"sync": _path_sync, "async": _path_async}
    for name, method in (("burst", "configure_execution_burst"),
                         ("reusable", "create_reusable_execution"),
                         ("fenced", "execute_fenced")):
        if getattr(type(pm), method, None) is getattr(Base, method):
            continue
        if valid is not None:
            try:
                res = ALL_PATHS[name](pm, valid, MeasureTiming.NO, None)
            except Exception:  # noqa: BLE001
                continue
            if res.status == ErrorStatus.GENERAL_FAILURE:
                continue
        paths[name] = ALL_PATHS[name]
    return paths


def check_request_mutant(pm: IPreparedModel, mutant: RequestMutant, path: PathFn,
                         guarded: Sequence[SharedMemory] = ()) -> tuple[str, str]:
    """(outcome, message) for one invalid request on one path; ``guarded`` memories must be
    left untouched (an invalid request writes nothing)."""
    before = [m.read(0, m.size) for m in guarded]
    try:
        res = call_with_timeout(lambda: path(pm, mutant.request, mutant.measure,
                                             mutant.loop_timeout), CALLBACK_TIMEOUT_S)
    except TimeoutError:
        return HANG, "no answer"
    except Exception as e:  # noqa: BLE001
        return CRASH, f"{type(e).__name__}: {e}"
    if res.problem:
        return WRONG_STATUS, res.problem
    if res.status == ErrorStatus.NONE:
        return ACCEPTED, "executed"
    if res.status not in mutant.accept:
        return WRONG_STATUS, res.status.name
    if mutant.at_launch and res.launch is not None and res.launch != res.status:
        return WRONG_STATUS, f"launch {res.launch.name}, then {res.status.name}"
    if res.shapes or res.timing.available:
        return WRONG_STATUS, "a failed execution reported shapes or timing"
    for m, b in zip(guarded, before):
        if m.read(0, m.size) != b:
            return WRONG_STATUS, "a failed execution wrote to a pool"
    return REJECTED, ""


def call_with_timeout(fn: Callable[[], Any], timeout: float) -> Any:
    """Run ``fn`` in a helper thread; TimeoutError if it does not return in time."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name="nnhal-timeout-call")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"no answer within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# ==== random models, requests and byte mutations (fuzzing) ==================================

#: Operations the random graph generator draws from, with (inputs, outputs) it usually uses.
_FUZZ_OPS: dict[int, tuple[int, int]] = {
    Op.ADD: (3, 1), Op.MUL: (3, 1), Op.SUB: (3, 1), Op.DIV: (3, 1), Op.RELU: (1, 1),
    Op.TANH: (1, 1), Op.LOGISTIC: (1, 1), Op.FLOOR: (1, 1), Op.SOFTMAX: (2, 1),
    Op.CONCATENATION: (3, 1), Op.RESHAPE: (2, 1), Op.TRANSPOSE: (2, 1), Op.MEAN: (3, 1),
    Op.PAD: (2, 1), Op.SQUEEZE: (2, 1), Op.CAST: (1, 1), Op.ABS: (1, 1), Op.ARGMAX: (2, 1),
    Op.MAXIMUM: (2, 1), Op.EXP: (1, 1), Op.GATHER: (3, 1), Op.SPLIT: (3, 2), Op.TILE: (2, 1),
    Op.FULLY_CONNECTED: (4, 1), Op.CONV_2D: (7, 1), Op.MAX_POOL_2D: (7, 1),
    Op.DEPTHWISE_CONV_2D: (8, 1), Op.RESIZE_BILINEAR: (3, 1), Op.SLICE: (3, 1),
    Op.STRIDED_SLICE: (7, 1), Op.REDUCE_SUM: (3, 1), Op.QUANTIZE: (1, 1),
    Op.DEQUANTIZE: (1, 1), Op.SELECT: (3, 1), Op.EQUAL: (2, 1), Op.BATCH_TO_SPACE_ND: (2, 1),
    Op.L2_NORMALIZATION: (1, 1), Op.TOPK_V2: (2, 2), Op.RANK: (1, 1), Op.FILL: (2, 1),
    Op.EXPAND_DIMS: (2, 1), Op.EMBEDDING_LOOKUP: (2, 1), Op.HASHTABLE_LOOKUP: (3, 2),
    Op.LSH_PROJECTION: (4, 1), Op.INSTANCE_NORMALIZATION: (5, 1), Op.PRELU: (2, 1),
    Op.LOG_SOFTMAX: (3, 1), Op.CHANNEL_SHUFFLE: (3, 1), Op.ROI_ALIGN: (10, 1),
    Op.HARD_SWISH: (1, 1), Op.ELU: (2, 1), Op.RESIZE_NEAREST_NEIGHBOR: (4, 1),
}
_FUZZ_TYPES = [t for t in T if t not in (T.OEM, T.TENSOR_OEM_BYTE)]


def _rand_dims(rng: random.Random, rank: int | None = None) -> list[int]:
    rank = rng.choice([0, 1, 1, 2, 2, 3, 4, 4]) if rank is None else rank
    return [rng.choice([0, 1, 1, 2, 2, 3, 4, 5]) for _ in range(rank)]


def _rand_values(rng: random.Random, t: T, count: int) -> bytes:
    """Plausible values most of the time (small ints, finite floats), garbage sometimes."""
    if rng.random() < 0.2:
        return rng.randbytes(count * t.byte_size)
    if t.dtype.kind == "f":
        arr = np.asarray([rng.uniform(-4, 4) for _ in range(count)], dtype=t.dtype)
    elif t.dtype.kind == "b":
        arr = np.asarray([rng.random() < 0.5 for _ in range(count)], dtype=np.uint8)
    else:
        info = np.iinfo(t.dtype)
        lo, hi = max(int(info.min), -3), min(int(info.max), 5)
        arr = np.asarray([rng.randint(lo, hi) for _ in range(count)], dtype=t.dtype)
    return arr.tobytes()


def random_model(rng: random.Random, *, max_operations: int = 4) -> Model:
    """A random graph of random operations over random operands; mostly invalid, sometimes
    valid. Built in operation order, so the structure is often plausible enough to reach the
    per-operation validation and, when it passes, execution."""
    values = bytearray()
    pool = bytearray()
    operands: list[Operand] = []
    operations: list[Operation] = []
    inputs: list[int] = []
    available: list[int] = []

    def add_operand(lifetime: L) -> int:
        t = rng.choice(_FUZZ_TYPES) if rng.random() < 0.5 else rng.choice(
            [T.TENSOR_FLOAT32, T.TENSOR_FLOAT32, T.INT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM,
             T.TENSOR_FLOAT16, T.BOOL, T.FLOAT32])
        dims = [] if (t.is_scalar or t == T.SUBGRAPH) else _rand_dims(rng)
        scale, zp = 0.0, 0
        if t in (*_QUANT, T.TENSOR_QUANT8_ASYMM_SIGNED):
            scale = rng.choice([0.5, 1.0, 0.25, 0.0])
            zp = rng.choice([0, 0, 1, 128, -1])
        extra = None
        if t == T.TENSOR_QUANT8_SYMM_PER_CHANNEL and dims:
            extra = SymmPerChannelQuantParams([1.0] * dims[0], 0)
        o = Operand(type=int(t), dimensions=dims, scale=scale, zero_point=zp, lifetime=lifetime,
                    extra_params=extra)
        if lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
            count = 1 if t.is_scalar else int(np.prod(dims or [0], dtype=np.int64))
            if t == T.SUBGRAPH or 0 in dims or not dims and not t.is_scalar:
                count = 0
            blob = _rand_values(rng, t, count) if t != T.SUBGRAPH else b""
            target = values if lifetime == L.CONSTANT_COPY else pool
            off = len(target)
            target.extend(blob)
            o.location = DataLocation(0, off, len(blob))
        operands.append(o)
        return len(operands) - 1

    for _ in range(rng.randint(1, 3)):
        i = add_operand(L.SUBGRAPH_INPUT)
        inputs.append(i)
        available.append(i)
    for _ in range(rng.randint(0, max_operations)):
        op_type = rng.choice(list(_FUZZ_OPS)) if rng.random() < 0.95 else rng.randint(0, 120)
        n_in, n_out = _FUZZ_OPS.get(op_type, (rng.randint(0, 4), rng.randint(0, 2)))
        if rng.random() < 0.15:
            n_in += rng.choice([-1, 1])
        ins = []
        for _k in range(max(n_in, 0)):
            r = rng.random()
            if r < 0.45 and available:
                ins.append(rng.choice(available))
            elif r < 0.9:
                ins.append(add_operand(rng.choice([L.CONSTANT_COPY, L.CONSTANT_COPY,
                                                   L.CONSTANT_REFERENCE])))
            elif r < 0.95:
                ins.append(add_operand(L.NO_VALUE))
            else:
                ins.append(rng.randint(0, len(operands) + 1))  # maybe out of range
        outs = [add_operand(L.TEMPORARY_VARIABLE) for _ in range(n_out)]
        operations.append(Operation(int(op_type), ins, outs))
        available.extend(outs)
    outputs = []
    for k, op in enumerate(operands):
        op.number_of_consumers = sum(o.inputs.count(k) for o in operations)
    for k in available:
        if k not in inputs and operands[k].number_of_consumers == 0 and rng.random() < 0.9:
            operands[k].lifetime = L.SUBGRAPH_OUTPUT
            outputs.append(k)
    if rng.random() < 0.1 and operands:
        operands[rng.randrange(len(operands))].number_of_consumers += rng.choice([-1, 1])
    pools = [SharedMemory.from_bytes(bytes(pool))] if pool else []
    return Model(main=Subgraph(operands, operations, inputs, outputs),
                 operand_values=bytes(values), pools=pools,
                 relax_computation_float32_to_float16=rng.random() < 0.2)


_UNARY = (Op.RELU, Op.RELU1, Op.RELU6, Op.TANH, Op.LOGISTIC, Op.ABS, Op.EXP, Op.FLOOR,
          Op.NEG, Op.SQRT, Op.RSQRT, Op.SIN, Op.LOG, Op.HARD_SWISH, Op.CAST)
_BINARY_ACT = (Op.ADD, Op.MUL, Op.SUB, Op.DIV)
_BINARY = (Op.MAXIMUM, Op.MINIMUM, Op.EQUAL, Op.LESS, Op.GREATER)


def random_typed_model(rng: random.Random, *, max_operations: int = 5) -> Model:
    """A random graph that is usually valid: each operation is drawn from a few families whose
    signatures are known (unary, binary with broadcasting, softmax, concatenation, reshape,
    transpose, reductions), wired to earlier tensors with the right types and shapes; now and
    then a shape, type or parameter is deliberately off."""
    b_ops: list[Operand] = []
    values = bytearray()
    operations: list[Operation] = []
    t = rng.choice([T.TENSOR_FLOAT32, T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM])
    q = (rng.choice([0.5, 0.25, 1.0]), rng.randint(0, 255)) if t == T.TENSOR_QUANT8_ASYMM \
        else (0.0, 0)

    def operand(tt: T, dims: Sequence[int], lt: L = L.TEMPORARY_VARIABLE,
                quant: tuple[float, int] | None = None) -> int:
        sc, zp = quant if quant is not None else \
            (q if tt == T.TENSOR_QUANT8_ASYMM else (0.0, 0))
        b_ops.append(Operand(int(tt), list(dims), 0, sc, zp, lt))
        return len(b_ops) - 1

    def const(tt: T, arr: Any) -> int:
        blob = np.asarray(arr, dtype=np.uint8 if tt.dtype.kind == "b" else tt.dtype).tobytes()
        i = operand(tt, [] if tt.is_scalar else list(np.shape(arr)), L.CONSTANT_COPY)
        off = (len(values) + 7) // 8 * 8
        values.extend(b"\0" * (off - len(values)) + blob)
        b_ops[i].location = DataLocation(0, off, len(blob))
        return i

    rank = rng.randint(1, 4)
    shape = [rng.randint(1, 4) for _ in range(rank)]
    inputs = [operand(t, shape, L.SUBGRAPH_INPUT)]
    avail: list[tuple[int, list[int]]] = [(inputs[0], shape)]
    for _ in range(rng.randint(1, max_operations)):
        x, xs = rng.choice(avail)
        xt = T(b_ops[x].type)
        fam = rng.random()
        off = rng.random() < 0.08  # a deliberate mistake somewhere in this operation
        if fam < 0.3:
            kind = rng.choice(_UNARY)
            out_t = rng.choice([T.TENSOR_FLOAT32, T.TENSOR_INT32, xt]) if kind == Op.CAST else xt
            ins = [x]
            out_s = list(xs)
        elif fam < 0.55:
            kind = rng.choice(_BINARY_ACT + _BINARY)
            ys = [d if rng.random() < 0.7 else 1 for d in xs][rng.randint(0, len(xs) - 1):]
            y = operand(xt, ys, L.SUBGRAPH_INPUT)
            inputs.append(y)
            ins = [x, y] + ([const(T.INT32, rng.choice([0, 0, 1, 3]))]
                            if kind in _BINARY_ACT else [])
            out_t = T.TENSOR_BOOL8 if kind in (Op.EQUAL, Op.LESS, Op.GREATER) else xt
            out_s = list(xs)
        elif fam < 0.65:
            kind = Op.SOFTMAX
            beta = const(T.FLOAT16 if xt == T.TENSOR_FLOAT16 else T.FLOAT32, 1.0)
            ins, out_t, out_s = [x, beta], xt, list(xs)
        elif fam < 0.75:
            kind = Op.CONCATENATION
            axis = rng.randrange(len(xs))
            ins = [x, x, const(T.INT32, axis)]
            out_t, out_s = xt, [d * 2 if k == axis else d for k, d in enumerate(xs)]
        elif fam < 0.85:
            kind = Op.RESHAPE
            n = int(np.prod(xs))
            ins, out_t, out_s = [x, const(T.TENSOR_INT32, [n])], xt, [n]
        elif fam < 0.93:
            kind = Op.TRANSPOSE
            perm = list(range(len(xs)))
            rng.shuffle(perm)
            ins, out_t = [x, const(T.TENSOR_INT32, perm)], xt
            out_s = [xs[p] for p in perm]
        else:
            kind = rng.choice([Op.MEAN, Op.REDUCE_SUM, Op.REDUCE_MAX])
            axis = rng.randrange(len(xs))
            if kind == Op.MEAN:
                ins = [x, const(T.TENSOR_INT32, [axis]), const(T.INT32, 1)]
            else:
                ins = [x, const(T.TENSOR_INT32, [axis]), const(T.BOOL, True)]
            out_t, out_s = xt, [1 if k == axis else d for k, d in enumerate(xs)]
        if off:
            what = rng.randrange(4)
            if what == 0:
                out_s = [d + 1 for d in out_s]
            elif what == 1:
                out_t = rng.choice(_FUZZ_TYPES)
            elif what == 2 and len(ins) > 1:
                ins.pop()
            else:
                ins.append(rng.choice(avail)[0])
        if rng.random() < 0.2:
            out_s = [0] * len(out_s)  # unknown at model time
        try:
            tt = T(out_t)
            odims: list[int] = [] if tt.is_scalar else out_s
        except ValueError:
            odims = out_s
        out = operand(out_t, odims, quant=(1.0, 0) if out_t == T.TENSOR_QUANT8_ASYMM and
                      kind in (Op.SOFTMAX, Op.LOGISTIC) else None)
        if out_t == T.TENSOR_QUANT8_ASYMM and kind == Op.SOFTMAX:
            b_ops[out].scale, b_ops[out].zero_point = 1.0 / 256, 0
        operations.append(Operation(int(kind), ins, [out]))
        if T(b_ops[out].type).is_tensor if b_ops[out].type in tuple(T) else False:
            avail.append((out, [d or 1 for d in out_s]))
    for k, o in enumerate(b_ops):
        o.number_of_consumers = sum(op.inputs.count(k) for op in operations)
    outputs = []
    for op in operations:
        for k in op.outputs:
            if b_ops[k].number_of_consumers == 0:
                b_ops[k].lifetime = L.SUBGRAPH_OUTPUT
                outputs.append(k)
    return Model(main=Subgraph(b_ops, operations, inputs, outputs),
                 operand_values=bytes(values),
                 relax_computation_float32_to_float16=rng.random() < 0.2)


#: Largest input (in elements) and output (in 4-byte words) a fuzzed request carries.
MAX_FUZZ_ELEMENTS = 1 << 16
#: Bytes written around every output region of a fuzzed request, checked afterwards.
GUARD = 64
GUARD_BYTE = 0xA5


@dataclass
class FuzzRequest:
    """A request with guard bytes around each output region (see :meth:`guards_intact`)."""

    request: Request
    input_memory: SharedMemory
    output_memory: SharedMemory
    regions: list[tuple[int, int]]

    def _writable(self, pool_index: int, size: int) -> np.ndarray:
        """Mask of the bytes of pool ``pool_index`` that the request's outputs (as they are
        now, after any corruption) may legitimately be written to."""
        mask = np.zeros(size, dtype=bool)
        for a in self.request.outputs:
            loc = a.location
            if not a.has_no_value and loc.pool_index == pool_index and 0 <= loc.offset < size:
                mask[loc.offset:max(loc.offset, min(size, loc.offset + max(0, loc.length)))] = \
                    True
        return mask

    def guards_intact(self) -> bool:
        """No byte of the output pool outside the outputs' regions changed."""
        raw = np.frombuffer(self.output_memory.read(0, self.output_memory.size), np.uint8)
        free = ~self._writable(1, raw.size)
        return bool(np.all(raw[free] == GUARD_BYTE))

    def inputs_intact(self, before: bytes) -> bool:
        """The input pool is unchanged, except where an output points into it."""
        now = np.frombuffer(self.input_memory.read(0, self.input_memory.size), np.uint8)
        old = np.frombuffer(before, np.uint8)
        free = ~self._writable(0, now.size)
        return bool(np.array_equal(now[free], old[free]))

    def close(self) -> None:
        self.input_memory.close()
        self.output_memory.close()


def random_request(rng: random.Random, main: Subgraph) -> FuzzRequest:
    """A request for ``main``: usually well-formed (sizes from the model, random values,
    unknown dimensions filled), sometimes with wrong sizes, dimensions or omitted inputs."""
    blobs: list[bytes] = []
    in_args: list[RequestArgument] = []
    off = 0
    for idx in main.input_indexes:
        o = main.operands[idx] if 0 <= idx < len(main.operands) else Operand(T.INT32)
        try:
            t = T(o.type)
        except ValueError:
            t = T.TENSOR_FLOAT32
        dims = [d or rng.randint(1, 3) for d in o.dimensions] if t.is_tensor else []
        if t.is_tensor and not dims:
            dims = _rand_dims(rng, rng.randint(1, 3))
            dims = [d or 1 for d in dims]
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if count > MAX_FUZZ_ELEMENTS:  # absurd model dimensions: send a short input instead
            count = rng.randint(0, 16)
        blob = _rand_values(rng, t, count) if t != T.SUBGRAPH else b""
        if rng.random() < 0.05:
            in_args.append(RequestArgument(True, DataLocation(), []))
            continue
        if rng.random() < 0.05:
            dims = [d + 1 for d in dims]
        if rng.random() < 0.05 and blob:
            blob = blob[:-1]
        off = (off + 7) // 8 * 8
        in_args.append(RequestArgument(False, DataLocation(0, off, len(blob)), dims))
        blobs.append(b"\0" * (off - sum(len(b) for b in blobs)) + blob)
        off += len(blob)
    in_mem = SharedMemory.from_bytes(b"".join(blobs))
    out_args: list[RequestArgument] = []
    regions: list[tuple[int, int]] = []
    off = GUARD
    for idx in main.output_indexes:
        o = main.operands[idx] if 0 <= idx < len(main.operands) else Operand(T.INT32)
        size = _byte_size(o) or rng.choice([0, 4, 16, 64, 256])
        size = min(size, MAX_FUZZ_ELEMENTS * 4)
        if rng.random() < 0.1:
            size = max(0, size + rng.choice([-4, -1, 1, 4]))
        out_args.append(RequestArgument(False, DataLocation(1, off, size), []))
        regions.append((off, size))
        off += size + GUARD
    out_mem = SharedMemory.ashmem(off)
    out_mem.array()[:] = GUARD_BYTE
    return FuzzRequest(Request(in_args, out_args, [in_mem, out_mem]), in_mem, out_mem, regions)


def mutate_bytes(rng: random.Random, data: bytes, n: int | None = None) -> bytes:
    """Flip, set or clear a few random bytes (or bits) of ``data``."""
    if not data:
        return data
    buf = bytearray(data)
    for _ in range(n or rng.randint(1, 4)):
        i = rng.randrange(len(buf))
        r = rng.random()
        buf[i] = (buf[i] ^ (1 << rng.randrange(8))) if r < 0.5 else \
            (0xFF if r < 0.7 else (0x00 if r < 0.85 else rng.randrange(256)))
    return bytes(buf)


def mutate_model_bytes(rng: random.Random, model: Model) -> Model:
    """A copy of ``model`` with corrupted operandValues, pool contents or dimensions. The
    result may be valid (most byte flips in weights are) or not; either way the driver must
    answer without raising, crashing or hanging."""
    m = copy_model(model)
    what = rng.random()
    if what < 0.35 and m.operand_values:
        m.operand_values = mutate_bytes(rng, m.operand_values)
    elif what < 0.6 and m.pools:
        k = rng.randrange(len(m.pools))
        src = m.pools[k]
        m.pools[k] = SharedMemory.from_bytes(mutate_bytes(rng, src.read(0, src.size)))
    else:
        sgs = [m.main, *m.referenced]
        sg = rng.choice(sgs)
        if sg.operands:
            o = rng.choice(sg.operands)
            if o.dimensions:
                j = rng.randrange(len(o.dimensions))
                o.dimensions[j] = rng.choice([0, 1, 2, o.dimensions[j] + 1,
                                              max(0, o.dimensions[j] - 1), 1 << 20, 0xFFFFFFFF])
            else:
                o.dimensions = [rng.choice([0, 1, 3])]
    return m


# ==== whole-suite runs ======================================================================

@dataclass
class Totals:
    """Counts of a mutation run, by outcome and by kind, and the first failures of each kind."""

    outcomes: Counter = field(default_factory=Counter)
    by_kind: dict[str, Counter] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    cases: int = 0
    relaxed_controls: Counter = field(default_factory=Counter)

    def add(self, kind: str, outcome: str, message: str, where: str) -> None:
        self.outcomes[outcome] += 1
        self.by_kind.setdefault(kind, Counter())[outcome] += 1
        if outcome != REJECTED and len(self.failures) < 200:
            self.failures.append(f"[{outcome}] {kind} {where}: {message}")

    @property
    def generated(self) -> int:
        return sum(self.outcomes.values())

    def summary(self, title: str) -> str:
        lines = [f"{title}: {self.cases} cases, {self.generated} mutants generated, "
                 f"{self.outcomes[REJECTED]} rejected, {self.outcomes[ACCEPTED]} accepted, "
                 f"{self.outcomes[WRONG_STATUS]} wrong status, {self.outcomes[CRASH]} crashes, "
                 f"{self.outcomes[HANG]} hangs"]
        for kind, c in sorted(self.by_kind.items()):
            bad = sum(v for k, v in c.items() if k != REJECTED)
            lines.append(f"  {kind:<28} {sum(c.values()):7d} generated {c[REJECTED]:7d} "
                         f"rejected {bad:5d} not")
        if self.relaxed_controls:
            lines.append(f"  relaxed-flag controls (valid): {dict(self.relaxed_controls)}")
        return "\n".join(lines)


def run_model_mutations(device: IDevice, cases: Sequence[Any], *,
                        limit_per_case: int | None = None, seed: int = 0,
                        relaxed_control_check: bool = True) -> Totals:
    """Generate and check model mutants for each conformance case (``Case`` objects);
    ``limit_per_case`` samples that many mutants per case (deterministically by ``seed``)."""
    from nnhal.conformance.cases import build_model

    totals = Totals()
    rng = random.Random(seed)
    for case in cases:
        if case.expect_failure:
            continue
        model = build_model(case.data["model"])
        try:
            status, flags = device.get_supported_operations(model)
            if status != ErrorStatus.NONE or not all(flags):
                continue  # not a valid, supported base model: nothing to mutate
            totals.cases += 1
            mutants: Iterator[ModelMutant] | list[ModelMutant] = model_mutations(model)
            if limit_per_case is not None:
                mutants = list(mutants)
                if len(mutants) > limit_per_case:
                    mutants = rng.sample(mutants, limit_per_case)
            for mutant in mutants:
                outcome, message = check_model_mutant(device, mutant)
                totals.add(mutant.kind, outcome, message, f"{case.name}: {mutant.detail}")
            if relaxed_control_check:
                st, _ = device.get_supported_operations(relaxed_control(model))
                totals.relaxed_controls[ErrorStatus(st).name] += 1
        finally:
            for p in model.pools:
                p.close()
    return totals


def _prepare(device: IDevice, model: Model) -> IPreparedModel | None:
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, pm = cb.wait(CALLBACK_TIMEOUT_S)
    return pm if status == ErrorStatus.NONE else None


def run_request_mutations(device: IDevice, cases: Sequence[Any], *,
                          limit_per_case: int | None = None, seed: int = 0,
                          paths: Sequence[str] | None = None) -> dict[str, Totals]:
    """Request mutants of each case through every execution path; totals per path."""
    from nnhal.conformance.cases import build_model, build_request

    per_path: dict[str, Totals] = {}
    rng = random.Random(seed)
    closed = SharedMemory.ashmem(16)
    closed.close()
    for case in cases:
        if case.expect_failure:
            continue
        model = build_model(case.data["model"])
        built = None
        try:
            pm = _prepare(device, model)
            if pm is None:
                continue
            built = build_request(case.data["model"])
            for mem in built.pools:
                arr = mem.array()
                if mem is built.output_memory:
                    arr[:] = GUARD_BYTE
            available = execution_paths(pm, built.request)
            if paths is not None:
                available = {k: v for k, v in available.items() if k in paths}
            mutants = list(request_mutations(built.request, model.main, closed))
            if limit_per_case is not None and len(mutants) > limit_per_case:
                mutants = rng.sample(mutants, limit_per_case)
            for name, fn in available.items():
                totals = per_path.setdefault(name, Totals())
                totals.cases += 1
                for mutant in mutants:
                    outcome, message = check_request_mutant(pm, mutant, fn, built.pools)
                    totals.add(mutant.kind, outcome, message, f"{case.name}: {mutant.detail}")
        finally:
            if built is not None:
                built.close()
            for p in model.pools:
                p.close()
    return per_path


def main(argv: Sequence[str] | None = None) -> int:
    """``nnhal mutations``: model and request mutations over the conformance suite."""
    p = argparse.ArgumentParser(prog="nnhal mutations", description=main.__doc__)
    add_arguments(p)
    return run_cli(p.parse_args(argv))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--specs", help="conformance folder (default: $NNHAL_CONFORMANCE or "
                                   "../shared/conformance)")
    p.add_argument("--filter", help="fnmatch pattern on case names")
    p.add_argument("--what", choices=("model", "request", "both"), default="both")
    p.add_argument("--limit", type=int, help="mutants sampled per case (default: all)")
    p.add_argument("--every", type=int, default=1, help="take every N-th case")
    p.add_argument("--shard", default="0/1", metavar="K/N",
                   help="run the K-th of N interleaved shards of the cases (default 0/1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show-failures", type=int, default=20, metavar="N",
                   help="print the first N failures of each run (default 20)")


def run_cli(args: argparse.Namespace) -> int:
    from nnhal.conformance.cases import default_specs_dir, iter_cases
    from nnhal.drivers.reference import ReferenceDevice

    specs = Path(args.specs) if args.specs else default_specs_dir()
    if not specs.exists():
        print(f"conformance data not found at {specs}: nothing to mutate")
        return 0
    k, n = (int(x) for x in args.shard.split("/"))
    cases = list(iter_cases(specs, args.filter))[::max(1, args.every)][k::n]
    device = ReferenceDevice()
    bad = 0
    try:
        if args.what in ("model", "both"):
            t0 = time.monotonic()
            totals = run_model_mutations(device, cases, limit_per_case=args.limit,
                                         seed=args.seed)
            print(totals.summary(f"model mutations ({time.monotonic() - t0:.0f} s)"))
            for line in totals.failures[:args.show_failures]:
                print("  " + line)
            bad += totals.generated - totals.outcomes[REJECTED]
        if args.what in ("request", "both"):
            t0 = time.monotonic()
            per_path = run_request_mutations(device, cases, limit_per_case=args.limit,
                                             seed=args.seed)
            print(f"request mutations ({time.monotonic() - t0:.0f} s)")
            for name, totals in per_path.items():
                print(totals.summary(f"path {name}"))
                for line in totals.failures[:args.show_failures]:
                    print("  " + line)
                bad += totals.generated - totals.outcomes[REJECTED]
    finally:
        device.close()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
