"""The one analysis of a HAL Model: structure rules, every operation's signature and rules,
constants decoded, shapes inferred, support decided — once, into a :class:`ModelGraph`.

Subgraphs are analysed callees first (referenced subgraphs form a DAG, checked by the
structure rules), each exactly once however many IF or WHILE operations reference it, and
without recursion, so neither depth nor sharing of control flow costs more than its size.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from nnhal.analysis import kept
from nnhal.analysis.graph import ModelGraph, OperationTuple, SubgraphGraph
from nnhal.core.version import FeatureLevel
from nnhal.hal.checks import InvalidArgument, check_model_fields
from nnhal.hal.types import (
    LIFETIMES,
    NO_DIMENSION_TYPES,
    OPERATION_TYPES,
    ChannelScales,
    ExtensionOperandType,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    OperationType,
    Subgraph,
    SymmPerChannelQuantParams,
    is_extension_type,
    operand_type,
    value_nbytes,
)
from nnhal.memory import MemoryError_, SharedMemory
from nnhal.ops import extensions
from nnhal.ops.catalog import check_and_prepare, lookup, signature
from nnhal.ops.common import MAX_RANK, rank_refusal
from nnhal.ops.resolver import OpContext, OperandInfo, OpError, Shape, visits
from nnhal.ops.signature import check, input_slots, omittable_positions
from nnhal.validation import ValidationError, validate_model

L = OperandLifeTime
log = logging.getLogger("nnhal.analysis")
#: The scalar operand types (a constant of one is a few bytes, often repeated).
_SCALARS = NO_DIMENSION_TYPES - {OperandType.SUBGRAPH}
#: Members read on every operand, as module names: an enum's attribute costs ten times a
#: global's.
_COPY, _REFERENCE, _SUBGRAPH_LIFETIME = L.CONSTANT_COPY, L.CONSTANT_REFERENCE, L.SUBGRAPH
_SUBGRAPH_TYPE = OperandType.SUBGRAPH
_BOOLS = (OperandType.BOOL, OperandType.TENSOR_BOOL8)
#: prefix -> (extension name, its definition or None): a model's table as this process reads it.
Exts = Mapping[int, tuple[str, Any]]

#: Default bound on one tensor's bytes: a temporary whose known size exceeds it is refused at
#: prepare (RESOURCE_EXHAUSTED_PERSISTENT) rather than failing an allocation at execution.
MAX_TENSOR_BYTES = 1 << 32
#: Default bound on one execution's work (:meth:`~nnhal.ops.resolver.OperationDef.work`:
#: roughly multiply-adds or element visits, summed over every operation of every subgraph
#: once): a model estimated beyond it is refused at prepare (RESOURCE_EXHAUSTED_PERSISTENT)
#: rather than computing for minutes. MobileNetV2 224 is about 3e8; published counts of heavy
#: real models: ResNet-152 1.2e10 multiply-adds, VGG-16 1.5e10, EfficientNet-B7 3.7e10, all
#: under it; the reference's vectorised kernels do about 1e10 a second here.
MAX_WORK = 10**11


def max_work_default() -> int:
    """``$NNHAL_MAX_WORK`` (a positive number, ``1e12`` spellings too) or :data:`MAX_WORK`;
    an unreadable value is logged once and ignored."""
    raw = os.environ.get("NNHAL_MAX_WORK", "").strip()
    if not raw:
        return MAX_WORK
    try:
        value = int(float(raw))
        if value > 0:
            return value
    except (ValueError, OverflowError):
        pass
    if raw not in _BAD_LOGGED:
        _BAD_LOGGED.add(raw)
        log.warning("NNHAL_MAX_WORK=%r is not a positive number; using %d", raw, MAX_WORK)
    return MAX_WORK


_BAD_LOGGED: set[str] = set()


def operand_shape(op: Operand) -> tuple[int, ...] | None:
    """Model dimensions as an inference shape: ``None`` for a tensor of unknown rank."""
    return _shape(operand_type(op.type), op.dimensions)


def _shape(t: Any, dimensions: Sequence[int]) -> tuple[int, ...] | None:
    if t in NO_DIMENSION_TYPES:
        return ()
    if not dimensions:
        return None
    return tuple(map(int, dimensions))


def decode_constant(op: Operand, raw: np.ndarray, *, copy: bool = True,
                    t: Any = None) -> np.ndarray:
    """Bytes of a constant operand -> a read-only array of its type and shape.

    ``copy=False`` gives a view for a caller that holds the model while it reads it; ``t``
    is the operand's type as :func:`~nnhal.hal.types.operand_type` gives it, when the caller
    has it.
    """
    if t is None:
        t = operand_type(op.type)
    if t in _BOOLS:
        arr = raw != 0
    else:
        arr = raw.view(t.dtype)
        if copy:
            arr = arr.copy()
    arr = arr.reshape(() if t.is_scalar else tuple(op.dimensions))
    arr.flags.writeable = False
    return arr


def operand_info(op: Operand, value: object = None, t: Any = None) -> OperandInfo:
    """What operations see of ``op`` (``t``: its :func:`~nnhal.hal.types.operand_type`,
    when the caller has it)."""
    if t is None:
        t = operand_type(op.type)
    extra = op.extra_params
    if extra is None:  # most operands: neither channel quantization nor extension data
        if type(t) is OperandType:  # the shape without _shape's calls
            dims = op.dimensions
            shape = () if t in NO_DIMENSION_TYPES else tuple(map(int, dims)) if dims else None
        else:
            shape = _shape(t, op.dimensions)
        lifetime = LIFETIMES.get(op.lifetime)
        return OperandInfo(t, shape, float(op.scale), int(op.zero_point), None, 0,
                           lifetime if lifetime is not None else OperandLifeTime(op.lifetime),
                           value)
    cq = extra if isinstance(extra, SymmPerChannelQuantParams) else None
    ext = extra if isinstance(extra, (bytes, bytearray)) else None
    return OperandInfo(
        type=t, shape=_shape(t, op.dimensions), scale=float(op.scale),
        zero_point=int(op.zero_point),
        channel_scales=None if cq is None else _channel_scales(cq.scales),
        channel_dim=0 if cq is None else int(cq.channel_dim),
        lifetime=_lifetime(op.lifetime), value=value,
        extension_params=None if ext is None else bytes(ext))


def _channel_scales(scales: Sequence[float]) -> np.ndarray:
    if type(scales) is ChannelScales:  # its array, made once
        return scales.array.astype(np.float32)
    return np.asarray(scales, dtype=np.float32)


def _lifetime(value: int) -> OperandLifeTime:
    found = LIFETIMES.get(value)
    return found if found is not None else OperandLifeTime(value)


def map_pools(model: Model) -> list[np.ndarray]:
    """The model's constant pools as byte arrays (ValidationError when one cannot be mapped);
    read-only exactly for the pools whose bytes can never change
    (:attr:`~nnhal.memory.SharedMemory.immutable`)."""
    arrays = []
    for i, pool in enumerate(model.pools):
        if not isinstance(pool, SharedMemory):
            raise ValidationError(f"model pool {i} is not a shared memory")
        try:
            arrays.append(pool.array())
        except MemoryError_ as e:
            raise ValidationError(f"model pool {i}: {e}") from e
    return arrays


def io_signature(main: Subgraph, infos: Sequence[OperandInfo | None] = ()) -> Subgraph:
    """The main subgraph's inputs then outputs, copied: what requests and memory-domain roles
    are checked against, immune to a client editing its Model after preparing it. An
    extension operand's type is its resolved one (``infos``), so requests size it."""
    io = [*main.input_indexes, *main.output_indexes]
    n_in = len(main.input_indexes)
    ops = [_copy_operand(main.operands[i]) for i in io]
    for op, i in zip(ops, io):
        info = infos[i] if i < len(infos) else None
        if info is not None and isinstance(info.type, ExtensionOperandType):
            op.type = info.type
    return Subgraph(ops, [], list(range(n_in)), list(range(n_in, len(io))))


def _copy_operand(op: Operand) -> Operand:
    """What ``copy.deepcopy`` gives of an operand (a tenth of its time): its mutable fields
    copied; its type, numbers and (frozen) location are immutable, so shared."""
    extra = op.extra_params
    return replace(op, dimensions=copy.copy(op.dimensions),
                   extra_params=None if extra is None else copy.deepcopy(extra))


def callees_first(model: Model) -> list[int]:
    """Referenced subgraph indexes, each after every subgraph it references (iterative)."""
    refs = [sorted({int(op.location.offset) for op in sg.operands if op.lifetime == L.SUBGRAPH})
            for sg in model.referenced]
    order: list[int] = []
    done = [False] * len(refs)
    for root in range(len(refs)):
        if done[root]:
            continue
        stack = [(root, iter(refs[root]))]
        done[root] = True
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                order.append(node)
                stack.pop()
            elif not done[nxt]:
                done[nxt] = True
                stack.append((nxt, iter(refs[nxt])))
    return order


def analyse(model: Model, *, own_constants: bool = True,
            max_tensor_bytes: int = MAX_TENSOR_BYTES, max_work: int | None = None,
            keep: bool = False) -> ModelGraph:
    """Check ``model`` against every rule once; raise ValidationError or OpError if invalid.

    ``own_constants`` copies each constant once, so the graph keeps nothing of the client's
    memory (a prepared model); without it constants are views (getSupportedOperations).
    Constants in a sealed pool (:attr:`~nnhal.memory.SharedMemory.immutable`, as every
    ModelBuilder and importer model has) are views either way: nobody can change them.
    ``keep`` (constants owned) keeps the graph for this model object, and any later call for
    the same object, unedited, returns it instead of analysing again (:mod:`.kept`): the
    runtime and the importer keep the models they make, so each is analysed once.
    ``max_work`` (None: :func:`max_work_default`) bounds the estimated work of one execution
    (``ModelGraph.too_much_work``).
    """
    limits = (max_tensor_bytes, max_work_default() if max_work is None else int(max_work))
    graph = kept.lookup(model, limits)
    if graph is not None:
        return graph
    snap = kept.snapshot(model) if keep else None
    graph = _analyse(model, own_constants or keep, *limits)
    if keep:
        kept.keep(model, snap, limits, graph)
    return graph


def _analyse(model: Model, own_constants: bool, max_tensor_bytes: int,
             max_work: int) -> ModelGraph:
    kept.counted()
    try:
        check_model_fields(model)  # Python types and ranges of every field, before any rule
    except InvalidArgument as e:
        raise ValidationError(str(e)) from None
    pools = map_pools(model)
    validate_model(model, [p.size for p in pools])
    values = np.frombuffer(model.operand_values, dtype=np.uint8)
    relaxed = bool(model.relax_computation_float32_to_float16)
    graphs: list[SubgraphGraph | None] = [None] * len(model.referenced)
    too_large: list[str] = []
    exts = extensions.resolve(model.extension_name_to_prefix)
    ext_ops: dict[int, tuple[Any, Any]] = {}
    reasons: dict[tuple[int, int], str] = {}
    work = _Work(max_work)
    for i in callees_first(model):
        graphs[i] = _analyse_subgraph(model.referenced[i], i, values, model.operand_values,
                                      pools, own_constants, relaxed, graphs, max_tensor_bytes,
                                      too_large, exts, ext_ops, reasons, work)
    main = _analyse_subgraph(model.main, -1, values, model.operand_values, pools,
                             own_constants, relaxed, graphs, max_tensor_bytes, too_large, exts,
                             ext_ops, reasons, work)
    levels = [g.min_level for g in (main, *graphs)]  # type: ignore[union-attr]
    if relaxed:
        levels.append(FeatureLevel.V1_1)  # relaxComputationFloat32toFloat16 came with 1.1
    if model.extension_name_to_prefix:
        levels.append(FeatureLevel.V1_2)  # vendor extensions came with 1.2
    return ModelGraph(main, tuple(graphs), relaxed,  # type: ignore[arg-type]
                      io_signature(model.main, main.operands), required_inputs(main, exts),
                      tuple(too_large), max(levels), ext_ops, reasons, work.total,
                      work.refusal())


class _Work:
    """The work estimates of one analysis: their sum, the heaviest operation, and the bound
    they are held to (each operation alone, and the model as a whole)."""

    __slots__ = ("bound", "total", "heaviest", "heaviest_at", "over")

    def __init__(self, bound: int):
        self.bound = bound
        self.total = 0
        self.heaviest = -1
        #: (subgraph name, operation index, its type) of the heaviest: worded only when a
        #: message names it.
        self.heaviest_at: tuple[str, int, Any] = ("", 0, None)
        self.over: str | None = None  # the first operation beyond the bound on its own

    def add(self, name: str, k: int, op_type: Any, amount: int) -> str | None:
        """Count the estimate of operation ``k`` of subgraph ``name``; why not, when it alone
        exceeds the bound."""
        self.total += amount
        if amount > self.heaviest:
            self.heaviest, self.heaviest_at = amount, (name, k, op_type)
        if amount <= self.bound:
            return None
        why = (f"{_where(name, k, op_type)} needs about {about(amount)} {_UNITS}, more than the "
               f"{self.bound:.3g} this device allows ({_KNOB})")
        if self.over is None:
            self.over = why
        return why

    def refusal(self) -> str | None:
        if self.over is not None:
            return self.over
        if self.total > self.bound:
            return (f"one execution needs about {about(self.total)} {_UNITS} (the heaviest: "
                    f"{_where(*self.heaviest_at)}, {about(self.heaviest)}), more than the "
                    f"{self.bound:.3g} this device allows ({_KNOB})")
        return None


def about(n: int, digits: int = 3) -> str:
    """An estimate (a count of bytes or work) in ``digits`` significant digits: hostile shapes
    make integers past a float's range, which the ``g`` format refuses with OverflowError."""
    try:
        return f"{n:.{digits}g}"
    except OverflowError:
        return f"1e+{int(math.log10(n))}"


def _where(name: str, k: int, op_type: Any) -> str:
    return f"{name} operation {k} ({op_type.name})"


_UNITS = "multiply-adds or element visits"
_KNOB = "max_work, NNHAL_MAX_WORK"


def work_of(definition: Any, ctx: OpContext, outputs: Sequence[Shape]) -> int:
    """An operation's own estimate; the default one (every element once) when it declares
    none or its formula fails on what it was given (an estimate never refuses a model)."""
    estimate = getattr(definition, "work", None)
    if estimate is not None:
        try:
            return max(int(estimate(ctx, outputs)), 0)
        except Exception as e:  # noqa: BLE001 - an estimate is advice, never a verdict
            log.debug("%s: work estimate failed: %s", ctx.op_type, e)
    return visits(ctx, outputs)


def _extension_operand(op: Operand, where: str, exts: Exts) -> Operand | None:
    """``op`` with its extension type resolved and checked against its extension (a copy);
    None when the extension is unknown here (its operations are then unsupported)."""
    try:
        t = extensions.resolve_operand_type(int(op.type), exts)
    except extensions.ExtensionError as e:
        raise ValidationError(f"{where}: {e}") from None
    if t is None:
        return None
    tdef = t.definition
    if tdef.is_scalar and op.dimensions:  # type: ignore[attr-defined]
        raise ValidationError(f"{where}: scalar {t.name} must have no dimensions")
    extra = op.extra_params
    problem = tdef.params_problem(None if extra is None else bytes(extra))  # type: ignore
    if problem is not None:
        raise ValidationError(f"{where}: {problem}")
    if op.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
        size = value_nbytes(t, op.dimensions)
        if size is None:
            raise ValidationError(f"{where}: constant operand must have fully specified "
                                  f"dimensions")
        if op.location.length != size:
            raise ValidationError(f"{where}: location length {op.location.length} != operand "
                                  f"size {size}")
    return replace(op, type=t)


def _decode_operands(sg: Subgraph, values: np.ndarray, data: object,
                     pools: Sequence[np.ndarray], own: bool, exts: Exts,
                     name: str, deep: dict[int, str]) -> list[OperandInfo | None]:
    """Operand infos with constants decoded; None for an operand of an extension this
    process does not know. ``data`` is the model's operand values as given (``values`` is
    their array). An operand of more than MAX_RANK dimensions goes into ``deep`` with why,
    its value undecoded (no array holds it)."""
    infos: list[OperandInfo | None] = []
    # Constant scalars (strides, paddings, activations: most operands of a convolutional
    # model) repeat a few values: equal ones share one info, decoded once, when their bytes
    # cannot change under a view (immutable ``data``). Validation made each scale +-0.0 and
    # zero point 0; a negative zero is left out, so every shared info is what it would be.
    scalars: dict[tuple[OperandType, bytes], OperandInfo] | None = \
        {} if type(data) is bytes else None
    for k, op in enumerate(sg.operands):
        if op.type >> 16:  # an extension type (is_extension_type)
            op = _extension_operand(op, f"{name} operand {k}", exts)  # type: ignore[assignment]
            if op is None:
                infos.append(None)
                continue
        t = operand_type(op.type)
        lt = op.lifetime
        value: object = None
        if len(op.dimensions) > MAX_RANK:
            deep[k] = rank_refusal(op.dimensions, f"operand {k}")  # type: ignore[assignment]
            infos.append(operand_info(op, None, t))
            continue
        if lt == _COPY:
            loc = op.location
            start, end = loc.offset, loc.offset + loc.length
            if scalars is not None and t in _SCALARS and op.extra_params is None and \
                    math.copysign(1.0, op.scale) > 0:
                key = (t, data[start:end])  # type: ignore[index]
                info = scalars.get(key)
                if info is None:
                    info = scalars[key] = operand_info(
                        op, decode_constant(op, values[start:end], copy=own, t=t), t)
                infos.append(info)
                continue
            value = decode_constant(op, values[start:end], copy=own, t=t)
        elif lt == _REFERENCE:
            loc = op.location
            pool = pools[loc.pool_index]
            raw = pool[loc.offset:loc.offset + loc.length]
            # A sealed pool (mapped read-only) never changes: a view owns as much as a copy
            # would, and a model's weights are not copied again.
            value = decode_constant(op, raw, copy=own and pool.flags.writeable, t=t)
        elif lt == _SUBGRAPH_LIFETIME:
            value = int(op.location.offset)
        infos.append(operand_info(op, value, t))
    return infos


def _analyse_subgraph(sg: Subgraph, index: int, values: np.ndarray, data: object,
                      pools: Sequence[np.ndarray], own: bool, relaxed: bool,
                      callees: Sequence[SubgraphGraph | None], max_bytes: int,
                      too_large: list[str], exts: Exts, ext_ops: dict[int, tuple[Any, Any]],
                      reasons: dict[tuple[int, int], str], work: _Work) -> SubgraphGraph:
    name = "main" if index < 0 else f"subgraph {index}"
    deep: dict[int, str] = {}  # operand -> why its rank is more than this device holds
    infos = _decode_operands(sg, values, data, pools, own, exts, name, deep)
    shapes: list[Shape] = [None if info is None else info.shape for info in infos]
    shaped: dict[int, OperandInfo] = {}  # operand -> info carrying its inferred shape
    operations: list[OperationTuple] = []
    supported: list[bool] = []
    works: list[int] = []
    level = FeatureLevel.V1_0
    unknown = any(info is None for info in infos)  # operands of an extension not known here
    refs = any(info is not None and info.type == _SUBGRAPH_TYPE for info in infos)
    for k, operation in enumerate(sg.operations):
        ins_idx, outs_idx = tuple(operation.inputs), tuple(operation.outputs)
        t = int(operation.type)
        operations.append((t, ins_idx, outs_idx))
        ext_op = None
        if t >> 16:  # an extension operation (is_extension_type)
            ext_op = extensions.resolve_operation(t, exts)
            definition = None if ext_op is None else ext_op.definition
            if ext_op is None:  # the prefix is in the table: the structure rules say so
                ext_name, ext = exts[t >> 16]
                reasons[(index, k)] = (f"extension {ext_name} is not installed here"
                                       if ext is None else f"extension {ext_name} has no "
                                       f"operation {t & 0xFFFF}")
        else:
            definition = lookup(t)
        if definition is None or (unknown and any(infos[i] is None
                                                  for i in (*ins_idx, *outs_idx))):
            supported.append(False)  # valid, but not something this nnhal can run
            works.append(0)
            continue
        if deep and not deep.keys().isdisjoint((*ins_idx, *outs_idx)):
            # Not validated: an operation's rules would build arrays of its operands' shapes.
            why = next(deep[i] for i in (*ins_idx, *outs_idx) if i in deep)
            too_large.append(f"{name} operation {k}: {why}")
            reasons[(index, k)] = too_large[-1]
            supported.append(False)
            works.append(0)
            continue
        ins = []
        for i in ins_idx:
            view = shaped.get(i)
            if view is None:
                info = infos[i]
                view = info if shapes[i] == info.shape else replace(info, shape=shapes[i])
                shaped[i] = view
            ins.append(view)
        ctx = OpContext(op_type=OPERATION_TYPES[t] if ext_op is None else ext_op.id,
                        inputs=ins, outputs=[infos[i] for i in outs_idx], relaxed=relaxed,
                        subgraphs=callees)
        if ext_op is not None:
            # Upstream's runtime cannot validate an extension operation, so a model with one
            # that fits none of its declaration is valid and the operation supported by none.
            try:
                op_level = check(ext_op.signature, ctx.inputs, ctx.outputs)
                definition.validate(ctx)
                inferred = definition.prepare(ctx)
                for i, s in zip(outs_idx, inferred or ()):
                    _check_declared(ctx.op_type, name, k, i, infos[i].shape, s)
            except Exception as e:  # noqa: BLE001 - any refusal: unsupported, with why
                reasons[(index, k)] = str(e) or type(e).__name__
                log.debug("%s operation %d: %s", name, k, reasons[(index, k)])
                supported.append(False)
                works.append(0)
                continue
            ext_ops[t] = (ext_op.id, definition)
        else:
            try:
                op_level, inferred = check_and_prepare(definition, ctx)
            except OpError as e:
                raise OpError(f"{name} operation {k}: {e}", e.status) from None
        if op_level is not level and op_level > level:  # most are of the level found so far
            level = op_level
        ok = True
        if refs:
            for i in ins_idx:
                if infos[i].type == _SUBGRAPH_TYPE:
                    ok &= callees[int(infos[i].value)].all_supported  # type: ignore
        if inferred:
            for i, s in zip(outs_idx, inferred):
                declared = infos[i].shape
                if type(s) is tuple and s == declared and shapes[i] == declared:
                    continue  # inferred as declared: nothing to check or fill
                _check_declared(ctx.op_type, name, k, i, declared, s)
                shapes[i] = _merge(shapes[i], s)
        for i in outs_idx:
            if shapes[i] is not None and len(shapes[i]) > MAX_RANK:  # type: ignore[arg-type]
                deep[i] = rank_refusal(shapes[i], f"output operand {i}")  # type: ignore
                too_large.append(f"{name} operation {k} ({ctx.op_type.name}): {deep[i]}")
                reasons[(index, k)] = too_large[-1]
                ok = False
                continue
            nbytes = _tensor_nbytes(infos[i].type, shapes[i])
            if nbytes is not None and nbytes > max_bytes:
                too_large.append(f"{name} operation {k} ({ctx.op_type.name}): output operand "
                                 f"{i} of shape {list(shapes[i] or ())} needs {nbytes} bytes, "
                                 f"more than the {max_bytes} this device allows")
                reasons[(index, k)] = too_large[-1]
                ok = False
        amount = work_of(definition, ctx, [shapes[i] for i in outs_idx])
        works.append(amount)
        why = work.add(name, k, ctx.op_type, amount)
        if why is not None:
            reasons.setdefault((index, k), why)  # a too-large temporary says it first
            ok = False
        supported.append(ok)
    return SubgraphGraph(index, tuple(infos), tuple(shapes), tuple(operations),  # type: ignore
                         tuple(sg.input_indexes), tuple(sg.output_indexes), tuple(supported),
                         level, tuple(works))


def _tensor_nbytes(t: Any, shape: Shape) -> int | None:
    """:func:`value_nbytes` of a tensor (None for a scalar or when unknown), a HAL tensor's
    without its call: the analysis sizes every operation's outputs."""
    size = _TENSOR_BYTES.get(t)
    if size is None:  # not a HAL tensor type: a scalar, a subgraph reference, an extension's
        return value_nbytes(t, shape) if t.is_tensor else None
    return size * math.prod(shape) if shape and 0 not in shape else None


#: The element size of each HAL tensor type.
_TENSOR_BYTES = {t: t.byte_size for t in OperandType if t.is_tensor}


def _check_declared(op_type: OperationType, name: str, k: int, index: int,
                    declared: Shape, inferred: object) -> None:
    """A declared output shape that the inputs contradict makes the model invalid; caught at
    prepare instead of after computing a tensor of the wrong (perhaps enormous) size."""
    if declared is None or inferred is None:
        return
    inferred = tuple(int(d) for d in inferred)  # type: ignore[union-attr]
    if len(inferred) != len(declared) or any(
            d and s and d != s for d, s in zip(declared, inferred)):
        raise OpError(f"{name} operation {k}: {op_type.name}: output operand {index} is "
                      f"declared {list(declared)} but its inputs give {list(inferred)}")


def _merge(declared: Shape, inferred: object) -> Shape:
    """Combine a declared shape with an inferred one, filling unknown dimensions."""
    if inferred is None:
        return declared
    inferred = tuple(int(d) for d in inferred)  # type: ignore[union-attr]
    if declared is None:
        return inferred
    if len(declared) != len(inferred):
        return declared
    return tuple(d if d else s for d, s in zip(declared, inferred))


def required_inputs(main: SubgraphGraph,
                    exts: Mapping[int, tuple[str, Any]] | None = None) -> frozenset[int]:
    """Main inputs a request may not omit: those some operation reads at a slot its signature
    (an extension operation's own, found through ``exts``) does not let be omitted (input 0
    of an operation without a signature)."""
    inputs = set(main.inputs)
    required: set[int] = set()
    for op_type, ins, _ in main.operations:
        if not inputs.intersection(ins):
            continue
        if is_extension_type(op_type):
            ext_op = extensions.resolve_operation(op_type, exts) if exts else None
            sig = None if ext_op is None else ext_op.signature
        else:
            sig = signature(op_type)
        fits = sig is not None and input_slots(sig, len(ins)) is not None
        omittable = omittable_positions(sig, len(ins)) if fits else frozenset()  # type: ignore
        for k, i in enumerate(ins):
            if i in inputs and (k not in omittable if fits else k == 0):
                required.add(i)
    return frozenset(required)
