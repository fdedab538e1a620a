"""Model validation: every structural rule of the HAL text, before any operation-level check.

Operation-level rules (counts, types, ranks and parameters per operation and version) live with
each operation in :mod:`nnhal.ops` and run when the plan is built; this module checks what is
common to all models: operand types and quantization parameters, dimensions, lifetimes and
locations, graph structure and order, subgraph references and cycles.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from nnhal.hal.types import (
    LIFETIMES,
    NO_DIMENSION_TYPES,
    OPERAND_TYPES,
    OPERATION_TYPES,
    ChannelScales,
    DataLocation,
    ExecutionPreference,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    OperationType,
    Priority,
    Subgraph,
    SymmPerChannelQuantParams,
    extension_prefix,
    value_nbytes,
)

L = OperandLifeTime
T = OperandType


class ValidationError(Exception):
    """The model or request breaks a HAL rule; reported as INVALID_ARGUMENT."""


def _fail(msg: str) -> ValidationError:
    return ValidationError(msg)


_EXTENSION_NAME = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")


def _valid_extension_name(name: object) -> bool:
    """Extension::name: lowercase letters, digits, periods and underscores, with a period."""
    return isinstance(name, str) and _EXTENSION_NAME.fullmatch(name) is not None


def _extension_prefixes(model: Model) -> set[int]:
    return {int(e.prefix) for e in model.extension_name_to_prefix}


#: The lifetimes of operands no operation writes (they have their values before any runs).
_WRITTEN_BEFORE = frozenset({L.SUBGRAPH_INPUT, L.CONSTANT_COPY, L.CONSTANT_REFERENCE,
                             L.NO_VALUE, L.SUBGRAPH})
#: The types with a positive scale.
_QUANT_TYPES = frozenset({T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED,
                          T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM})
#: The zero point range of each asymmetric quantized type (the others: 0).
_ZERO_POINTS = {T.TENSOR_QUANT8_ASYMM: (0, 255), T.TENSOR_QUANT8_ASYMM_SIGNED: (-128, 127),
                T.TENSOR_QUANT16_ASYMM: (0, 65535)}
#: Members read on every operand or operation, as module names: an enum's attribute costs
#: ten times a global's.
_COPY, _SUBGRAPH_LIFETIME, _SUBGRAPH_TYPE = L.CONSTANT_COPY, L.SUBGRAPH, T.SUBGRAPH
_OEM_OPERATION = OperationType.OEM_OPERATION
_CONSTANT_LIFETIMES = frozenset({L.CONSTANT_COPY, L.CONSTANT_REFERENCE})
#: The lifetimes of operands an operation writes.
_WRITTEN_BY_OPERATIONS = frozenset({L.TEMPORARY_VARIABLE, L.SUBGRAPH_OUTPUT})
#: The bytes of a scalar of each scalar type (value_nbytes' answer, without its call).
_SCALAR_BYTES = {t: t.byte_size for t in T if t.is_scalar}


def validate_operand(op: Operand, where: str, prefixes: set[int], *,
                     dims_checked: bool = False) -> OperandType | None:
    """Type, dimensions and quantization parameters of one operand; its type (None for an
    extension's). ``dims_checked``: its dimensions are known to be uint32 already
    (:func:`nnhal.hal.checks.check_model_fields` ran), so they are not checked again."""
    raw_type = int(op.type)
    if raw_type >> 16:  # an extension type (nnhal.hal.types.is_extension_type)
        # What the seed says of any extension operand; its extension's own rules (the code,
        # scalar or tensor, the extension data) are the analysis's (nnhal.ops.extensions).
        if extension_prefix(raw_type) not in prefixes:
            raise _fail(f"{where}: extension type {raw_type:#x} has no declared prefix")
        if any((not isinstance(d, (int, np.integer))) or d < 0 or d > 0xFFFFFFFF
               for d in op.dimensions):
            raise _fail(f"{where}: invalid dimensions {list(op.dimensions)}")
        if float(op.scale) != 0 or int(op.zero_point) != 0:
            raise _fail(f"{where}: extension operand of type {raw_type:#x} must have scale 0 "
                        f"and zeroPoint 0")
        if op.extra_params is not None and not isinstance(op.extra_params,
                                                          (bytes, bytearray)):
            raise _fail(f"{where}: extension operand of type {raw_type:#x} has extraParams "
                        f"that are not extension data")
        return None
    t = OPERAND_TYPES.get(raw_type)
    if t is None:
        raise _fail(f"{where}: invalid operand type {raw_type}")
    if t in (T.OEM, T.TENSOR_OEM_BYTE):
        raise _fail(f"{where}: OEM operand types are deprecated and not supported")
    for d in () if dims_checked else op.dimensions:  # a loop: cheaper than a generator
        if type(d) is int:
            if 0 <= d <= 0xFFFFFFFF:
                continue
        elif isinstance(d, (int, np.integer)) and 0 <= d <= 0xFFFFFFFF:
            continue
        raise _fail(f"{where}: invalid dimensions {list(op.dimensions)}")
    if op.dimensions and t in NO_DIMENSION_TYPES:
        raise _fail(f"{where}: scalar {t.name} must have no dimensions")
    scale, zp = float(op.scale), int(op.zero_point)
    if not math.isfinite(scale) or scale < 0:
        raise _fail(f"{where}: invalid scale {op.scale}")
    if t in _QUANT_TYPES:
        if scale <= 0:
            raise _fail(f"{where}: {t.name} needs a positive scale, got {op.scale}")
        lo, hi = _ZERO_POINTS.get(t, (0, 0))
        if not lo <= zp <= hi:
            raise _fail(f"{where}: {t.name} zeroPoint {zp} outside [{lo}, {hi}]")
    elif t == T.TENSOR_INT32:
        if zp != 0:
            raise _fail(f"{where}: TENSOR_INT32 zeroPoint must be 0")
    else:
        if scale != 0 or zp != 0:
            raise _fail(f"{where}: {t.name} must have scale 0 and zeroPoint 0")
    if t == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        cq = op.extra_params
        if not isinstance(cq, SymmPerChannelQuantParams):
            raise _fail(f"{where}: per-channel operand needs channel quantization parameters")
        rank = len(op.dimensions)
        if not 0 <= int(cq.channel_dim) < max(rank, 1) or rank == 0:
            raise _fail(f"{where}: channelDim {cq.channel_dim} invalid for rank {rank}")
        n = op.dimensions[cq.channel_dim]
        if n == 0:
            raise _fail(f"{where}: the channel dimension must be known")
        if len(cq.scales) != n:
            raise _fail(f"{where}: {len(cq.scales)} channel scales for {n} channels")
        if type(cq.scales) is ChannelScales:  # its bounds, computed once (NaN fails both)
            lo, hi = cq.scales.bounds
            ok = lo > 0 and hi < math.inf
        else:
            scales = np.asarray(cq.scales, dtype=np.float64)
            ok = bool(np.all(np.isfinite(scales) & (scales > 0)))
        if not ok:
            raise _fail(f"{where}: channel scales must be positive")
    elif op.extra_params is not None:
        raise _fail(f"{where}: {t.name} takes no extra parameters")
    return t


def _location_problem(op: Operand, model: Model, pool_sizes: Sequence[int],
                      t: OperandType | None) -> str | None:
    """What is wrong with the lifetime and location of one operand of type ``t`` (None: an
    extension's), or None; its fields are uint32 already (the analysis runs
    :func:`nnhal.hal.checks.check_model_fields` first, so nothing is negative). A message,
    not an exception: the caller names the operand only when there is something to say."""
    lt = op.lifetime
    loc = op.location
    if not isinstance(loc, DataLocation):
        return "invalid location"
    if lt in _CONSTANT_LIFETIMES:
        if t is not None:
            size = _SCALAR_BYTES.get(t)
            if size is None:
                size = value_nbytes(t, op.dimensions)
                if size is None:
                    return "constant operand must have fully specified dimensions"
            if loc.length != size:
                return f"location length {loc.length} != operand size {size}"
        if lt == _COPY:
            if loc.pool_index != 0:
                return "CONSTANT_COPY must have poolIndex 0"
            limit = len(model.operand_values)
        else:
            if loc.pool_index >= len(pool_sizes):
                return f"pool index {loc.pool_index} out of range"
            limit = pool_sizes[loc.pool_index]
        if loc.offset + loc.length > limit:
            return (f"location [{loc.offset}, {loc.offset + loc.length}) beyond "
                    f"{'operandValues' if lt == _COPY else 'pool'} of {limit} bytes")
    elif lt == _SUBGRAPH_LIFETIME:
        if t is not _SUBGRAPH_TYPE:
            return "lifetime SUBGRAPH needs type SUBGRAPH"
        if loc.pool_index != 0 or loc.length != 0:
            return "SUBGRAPH operand has an invalid location"
        if loc.offset >= len(model.referenced):
            return f"subgraph reference {loc.offset} out of range"
    # Not a constant nor a reference: an empty location (a DataLocation of another class is
    # never equal to one, as the dataclass compares).
    elif type(loc) is not DataLocation or loc.pool_index or loc.offset or loc.length:
        return f"lifetime {L(lt).name} must have an empty location"
    if t is _SUBGRAPH_TYPE and lt != _SUBGRAPH_LIFETIME:
        return "SUBGRAPH operand must have lifetime SUBGRAPH"
    return None


def validate_subgraph(sg: Subgraph, name: str, model: Model, pool_sizes: Sequence[int],
                      prefixes: set[int]) -> None:
    """Operands, operations, order and inputs/outputs of one subgraph (its fields' types
    and ranges checked already: :func:`nnhal.hal.checks.check_model_fields`)."""
    operands = sg.operands
    n = len(operands)
    written = [False] * n
    with_lifetime: dict[L, list[int]] = {L.SUBGRAPH_INPUT: [], L.SUBGRAPH_OUTPUT: []}
    # validate_operand's answers for operands without extra parameters, by all that it reads
    # of them then (type, whether there are dimensions, scale, zero point): a model repeats
    # a few such descriptions (every INT32 parameter, every float tensor), each checked once.
    checked: dict[tuple, OperandType] = {}
    for i, op in enumerate(operands):
        lt = LIFETIMES.get(op.lifetime)
        if lt is None:
            try:
                lt = L(op.lifetime)
            except ValueError:
                raise _fail(f"{name} operand {i}: invalid lifetime {op.lifetime}") from None
        op.lifetime = lt
        key = (op.type, not op.dimensions, op.scale, op.zero_point) \
            if op.extra_params is None else None
        t = None if key is None else checked.get(key)
        if t is None:
            t = validate_operand(op, f"{name} operand {i}", prefixes, dims_checked=True)
            if key is not None and t is not None:
                checked[key] = t
        problem = _location_problem(op, model, pool_sizes, t)
        if problem is not None:
            raise _fail(f"{name} operand {i}: {problem}")
        if lt in _WRITTEN_BEFORE:
            written[i] = True
        if lt in with_lifetime:
            with_lifetime[lt].append(i)

    consumers = [0] * n
    for k, operation in enumerate(sg.operations):
        t = operation.type
        if int(t) >> 16:  # an extension operation (is_extension_type)
            # A vendor extension operation: valid when its prefix is declared; whether a
            # driver supports it is getSupportedOperations' business.
            if extension_prefix(t) not in prefixes:
                raise _fail(f"{name} operation {k}: extension operation {int(t):#x} has no "
                            f"declared prefix")
        else:
            op_type = OPERATION_TYPES.get(t)  # a look-up: the enum's call costs a microsecond
            if op_type is None:
                raise _fail(f"{name} operation {k}: invalid operation type {t}")
            if op_type is _OEM_OPERATION:
                raise _fail(f"{name} operation {k}: OEM operations are not supported")
        for i in operation.inputs:
            if not 0 <= i < n:
                raise _fail(f"{_operation(name, k, t)}: input operand index {i} out of range")
            if not written[i]:
                raise _fail(f"{_operation(name, k, t)}: input operand {i} is read before it "
                            f"is written")
            consumers[i] += 1
        for i in operation.outputs:
            if not 0 <= i < n:
                raise _fail(f"{_operation(name, k, t)}: output operand index {i} out of range")
            if operands[i].lifetime not in _WRITTEN_BY_OPERATIONS:
                raise _fail(f"{_operation(name, k, t)}: output operand {i} has lifetime "
                            f"{L(operands[i].lifetime).name}")
            if written[i]:
                raise _fail(f"{_operation(name, k, t)}: output operand {i} is written twice")
            written[i] = True
    if consumers != [op.number_of_consumers for op in operands] or not all(written):
        for i, op in enumerate(operands):  # the first operand that is wrong, named
            if consumers[i] != op.number_of_consumers:
                raise _fail(f"{name} operand {i}: numberOfConsumers is "
                            f"{op.number_of_consumers}, actual {consumers[i]}")
            if not written[i]:
                raise _fail(f"{name} operand {i}: no operation writes it")

    for kind, indexes, lifetime in (("input", sg.input_indexes, L.SUBGRAPH_INPUT),
                                    ("output", sg.output_indexes, L.SUBGRAPH_OUTPUT)):
        seen: set[int] = set()
        for i in indexes:
            if not 0 <= i < n:
                raise _fail(f"{name}: {kind} index {i} out of range")
            if i in seen:
                raise _fail(f"{name}: operand {i} listed twice as an {kind}")
            seen.add(i)
            if sg.operands[i].lifetime != lifetime:
                raise _fail(f"{name}: {kind} operand {i} has lifetime "
                            f"{L(sg.operands[i].lifetime).name}")
        expected = set(with_lifetime[lifetime])
        if expected != seen:
            missing = sorted(expected - seen)
            raise _fail(f"{name}: operands {missing} have lifetime {lifetime.name} but are not "
                        f"listed as subgraph {kind}s")


def _operation(name: str, k: int, t: int) -> str:
    """How a message names operation ``k`` (of a valid type ``t``) of subgraph ``name``: worded
    only when there is something to say."""
    if int(t) >> 16:
        return f"{name} operation {k} (extension {int(t):#x})"
    return f"{name} operation {k} ({OPERATION_TYPES[t].name})"


def _check_no_cycles(model: Model) -> None:
    """Subgraph references must form a DAG (no recursion through IF/WHILE)."""
    refs: list[set[int]] = []
    for sg in model.referenced:
        refs.append({int(op.location.offset) for op in sg.operands if op.lifetime == L.SUBGRAPH})
    state = [0] * len(model.referenced)  # 0 new, 1 on stack, 2 done

    def visit(i: int) -> None:
        stack = [(i, iter(sorted(refs[i])))]
        state[i] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                continue
            if state[nxt] == 1:
                raise _fail(f"referenced subgraph {nxt} is part of a reference cycle")
            if state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(refs[nxt]))))

    for i in range(len(model.referenced)):
        if state[i] == 0:
            visit(i)


def validate_model(model: Model, pool_sizes: Sequence[int]) -> None:
    """Raise :class:`ValidationError` for the first structural rule the model breaks.

    The types and ranges of the model's fields are :func:`nnhal.hal.checks.check_model_fields`'
    (the analysis runs it first): what it checks (uint32 dimensions and locations) is not
    checked again here."""
    if not isinstance(model.operand_values, (bytes, bytearray, memoryview)):
        raise _fail("operandValues must be bytes")
    prefixes = _extension_prefixes(model)
    seen_names: set[str] = set()
    seen_prefixes: set[int] = set()
    for e in model.extension_name_to_prefix:
        if e.name in seen_names or not 0 <= int(e.prefix) <= 0xFFFF or int(e.prefix) == 0 \
                or int(e.prefix) in seen_prefixes or not _valid_extension_name(e.name):
            raise _fail(f"invalid extension name/prefix entry {e} (names and prefixes are "
                        f"one to one, prefixes 1-65535)")
        seen_names.add(e.name)
        seen_prefixes.add(int(e.prefix))
    if not model.main.input_indexes or not model.main.output_indexes:
        raise _fail("the main subgraph needs at least one input and one output")
    validate_subgraph(model.main, "main", model, pool_sizes, prefixes)
    for i, sg in enumerate(model.referenced):
        validate_subgraph(sg, f"subgraph {i}", model, pool_sizes, prefixes)
    _check_no_cycles(model)


def validate_preference(preference: int) -> None:
    try:
        ExecutionPreference(preference)
    except ValueError:
        raise _fail(f"invalid execution preference {preference}") from None


def validate_priority(priority: int) -> None:
    try:
        Priority(priority)
    except ValueError:
        raise _fail(f"invalid priority {priority}") from None
