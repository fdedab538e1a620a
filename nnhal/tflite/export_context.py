"""The exporter's state while it walks one HAL subgraph: HAL operands to TFLite tensors,
and the :class:`ExportOpContext` each operation's converter works through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import tflite
from tflite.TensorType import TensorType as TT

from nnhal.analysis import SubgraphGraph
from nnhal.hal.types import OPERATION_TYPE_NAMES, OperandType
from nnhal.ops.resolver import OperandInfo
from nnhal.tflite.export_fb import ModelDef, OperatorDef, SubgraphDef, TensorDef, channel_quant
from nnhal.tflite.kernel_rules import RuleOp, RuleTensor, kernel_refusal, rule_tensor
from nnhal.tflite.schema import ACTIVATIONS_BACK, builtin_name

#: The largest dimension TFLite's int32 shapes hold.
_INT32_MAX = 2**31 - 1

T = OperandType
BO = tflite.BuiltinOperator

#: HAL operand type -> TFLite tensor type inside the graph (float16 computes as float32).
TENSOR_TYPES: dict[OperandType, int] = {
    T.FLOAT32: TT.FLOAT32, T.TENSOR_FLOAT32: TT.FLOAT32, T.FLOAT16: TT.FLOAT32,
    T.TENSOR_FLOAT16: TT.FLOAT32, T.INT32: TT.INT32, T.TENSOR_INT32: TT.INT32,
    T.UINT32: TT.UINT32, T.BOOL: TT.BOOL, T.TENSOR_BOOL8: TT.BOOL,
    T.TENSOR_QUANT8_ASYMM: TT.UINT8, T.TENSOR_QUANT8_ASYMM_SIGNED: TT.INT8,
    T.TENSOR_QUANT8_SYMM: TT.INT8, T.TENSOR_QUANT8_SYMM_PER_CHANNEL: TT.INT8,
    T.TENSOR_QUANT16_SYMM: TT.INT16, T.TENSOR_QUANT16_ASYMM: TT.UINT16,
}
_QUANT = {T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM,
          T.TENSOR_QUANT16_SYMM, T.TENSOR_QUANT16_ASYMM}
_FLOAT16 = {T.TENSOR_FLOAT16, T.FLOAT16}
_NUMPY = {TT.FLOAT32: "<f4", TT.FLOAT16: "<f2", TT.INT32: "<i4", TT.UINT32: "<u4",
          TT.COMPLEX64: "<c8", TT.BOOL: "u1", TT.UINT8: "u1", TT.INT8: "i1", TT.INT16: "<i2",
          TT.UINT16: "<u2"}




class Unexportable(Exception):
    """An operation this exporter cannot express exactly; the message says why."""


#: Quantized HAL tensor types whose TFLite kernels read scale and zero point.
QUANTIZED = frozenset(_QUANT)


def fused_act(cx: ExportOpContext, j: int) -> int:
    """The TFLite fused activation of HAL FuseCode input ``j`` (NONE when absent)."""
    v = cx.scalar(j, 0)
    if v not in ACTIVATIONS_BACK:
        raise Unexportable(f"fused activation {v} is not a HAL FuseCode")
    return ACTIVATIONS_BACK[v]


Converter = Callable[["ExportOpContext"], None]


class ExportState(Protocol):
    """What a subgraph writer needs of the whole export (``exporter._Exporter``)."""

    model: ModelDef
    referenced: tuple[SubgraphGraph, ...]
    refused: list[str]
    converters: dict[str, Converter]
    exact_resize: bool
    guard_division: bool

    def fusions(self, g: SubgraphGraph) -> dict[int, Any]: ...

    def subgraph(self, ref: int, passthrough: int = 0) -> int: ...


class SubgraphWriter:
    """One HAL subgraph into one TFLite subgraph: tensors made as operations first need them,
    each operation through its converter, refusals collected rather than raised."""

    def __init__(self, ex: ExportState, sgg: SubgraphGraph, sg: SubgraphDef,
                 input_names: list[str] | None, output_names: list[str] | None,
                 passthrough: int) -> None:
        self.ex, self.g, self.sg = ex, sgg, sg
        self.is_main = sgg.index == -1
        self.input_names, self.output_names = input_names, output_names
        self.passthrough = passthrough
        #: The kernel rules' view of each tensor, with what it was made from (the tensor and
        #: its type, scales, zero points and name, held, so compared by identity): a tensor
        #: written by one operator and read by the next is converted once.
        self._rule_views: dict[int, tuple[Any, ...]] = {}
        self.tensors: dict[int, int] = {}
        #: When set, only these operations are converted (and the outputs are not): a probe
        #: of some operations on their own.
        self.only: set[int] | None = None

    # ---- tensors ---------------------------------------------------------------------------

    def shape(self, i: int) -> tuple[list[int], list[int] | None]:
        shape = self.g.shapes[i]
        if shape is None:
            raise Unexportable(f"operand #{i} has an unknown rank")
        dims = list(map(int, shape))
        if dims and max(dims) > _INT32_MAX:  # the HAL's are uint32
            raise Unexportable(f"operand #{i} has dimension {max(dims)}, past TFLite's int32")
        if 0 in dims:
            return [d or 1 for d in dims], [d or -1 for d in dims]
        return dims, None

    def new(self, name: str, shape: list[int], tt: int, like: OperandInfo | None = None,
            buffer: int = 0, signature: list[int] | None = None) -> int:
        t = TensorDef(name, list(shape), tt, buffer, shape_signature=signature)
        if like is not None:
            _set_quant(t, like)
        tensors = self.sg.tensors
        tensors.append(t)
        return len(tensors) - 1

    def tensor(self, i: int) -> int:
        """The TFLite tensor of HAL operand ``i`` (-1 when omitted), created on first use."""
        found = self.tensors.get(i)
        if found is not None:
            return found
        info = self.g.shaped(i)
        if info.omitted:
            return -1
        tt = TENSOR_TYPES.get(info.type)
        if tt is None:
            tt = _extension_tensor_type(info.type)
        if tt is None:
            raise Unexportable(f"operand #{i} of type {_type_name(info.type)} has no TFLite "
                               f"type")
        if info.is_const:
            self.tensors[i] = self.constant(info.value, info, f"c{i}", tt)
        else:
            shape, sig = self.shape(i)
            self.tensors[i] = self.new(f"t{i}", shape, tt, info, signature=sig)
        return self.tensors[i]

    def constant(self, value: Any, info: OperandInfo | None, name: str,
                 tt: int | None = None) -> int:
        """A constant tensor; float16 ones stored as float16 behind a DEQUANTIZE."""
        arr = np.asarray(value)
        if info is not None and info.type in _FLOAT16:
            buf = self.ex.model.add_buffer(_unshared(arr, "<f2"))
            t16 = self.new(name + "_f16", list(arr.shape), TT.FLOAT16, buffer=buf)
            t32 = self.new(name, list(arr.shape), TT.FLOAT32)
            self.emit(BO.DEQUANTIZE, [t16], [t32])
            return t32
        if tt is None:
            tt = TENSOR_TYPES[info.type] if info is not None else TT.INT32
        buf = self.ex.model.add_buffer(_unshared(arr, _NUMPY[tt]))
        return self.new(name, list(arr.shape), tt, info, buffer=buf)

    def emit(self, code: int, inputs: list[int], outputs: list[int],
             options_name: str | None = None, **options: Any) -> None:
        self.sg.operators.append(OperatorDef(code, list(inputs), list(outputs), options_name,
                                             options))

    # ---- the walk --------------------------------------------------------------------------

    def run(self) -> None:
        g = self.g
        try:
            self.sg.inputs = [self.edge_input(k, i) for k, i in enumerate(g.inputs)]
        except Unexportable as e:
            self.ex.refused.append(f"{self.where()}inputs: {e}")
            return
        refused = len(self.ex.refused)
        fusions = self.ex.fusions(g)
        written: set[int] = set()  # operations written as part of a chain before them
        only = self.only
        # Operations written, by type and run-time inputs (cheap, and nearly always unique),
        # then by :meth:`same_key` where two share those: an operation computing what one
        # before it computed is written as that one's tensor.
        written_by: dict[tuple[Any, ...], list[int]] = {}
        keys: dict[int, tuple[Any, ...] | None] = {}
        operands = g.operands
        outputs = set(g.outputs)
        for k, (t, ins, outs) in enumerate(g.operations):
            if k in written or (only is not None and k not in only):
                continue
            if k in fusions and not self.guarded(fusions[k]) and self.fuse(fusions[k]):
                written.update(fusions[k].ops)
                continue
            coarse = (t, *(i for i in ins if not operands[i].is_const))
            before_ops = written_by.get(coarse)
            if before_ops is not None and self.written_as(k, before_ops, keys, outputs):
                continue
            before = len(self.ex.refused)
            self.convert(k, t, ins, outs)
            if len(self.ex.refused) == before:
                written_by.setdefault(coarse, []).append(k)
        if len(self.ex.refused) > refused or only is not None:
            return  # outputs of refused (or skipped) operations were never made
        try:
            outputs = [self.edge_output(k, i) for k, i in enumerate(g.outputs)]
            outputs += self.sg.inputs[len(self.sg.inputs) - self.passthrough:] \
                if self.passthrough else []
            self.sg.outputs = outputs
        except Unexportable as e:
            self.ex.refused.append(f"{self.where()}outputs: {e}")

    def guarded(self, fusion: Any) -> bool:
        """Whether the guarded form (``guard_division``) writes this chain as it is: a float32
        FLOOR_DIV by a run-time divisor, which TFLite fails on a zero."""
        return fusion.name == "FLOOR_DIV" and self.ex.guard_division and \
            not self.g.operands[fusion.ins[1]].is_const

    def written_as(self, k: int, before: list[int], keys: dict[int, tuple[Any, ...] | None],
                   outputs: set[int]) -> bool:
        """Whether operation ``k`` computes what one of ``before`` (written) did: then its
        output is that one's tensor (one tensor is at most one subgraph output)."""
        ops = self.g.operations
        for j in (k, *before):
            if j not in keys:
                keys[j] = self.same_key(*ops[j])
        mine = keys[k]
        if mine is None:
            return False
        out = ops[k][2][0]
        for j in before:
            first = ops[j][2][0]
            if keys[j] == mine and first in self.tensors and \
                    (out not in outputs or first not in outputs):
                self.tensors[out] = self.tensors[first]
                if out in outputs:
                    outputs.add(first)
                return True
        return False

    def same_key(self, t: int, ins: Any, outs: Any) -> tuple[Any, ...] | None:
        """What makes two operations compute the same value: the type, the inputs (small constants
        by value) and the output's type, quantization and shape; None for an operation with
        several outputs or a subgraph operand. Every HAL operation is a function of its
        inputs (RANDOM_MULTINOMIAL, the one that is not, does not export), so the second of
        two such is written as the first's tensor: the importer makes some twice (a FLOOR_MOD
        and a FLOOR_DIV of one pair each divide it), where the file had one operator."""
        if len(outs) != 1:
            return None
        parts: list[Any] = [t]
        for i in ins:
            info = self.g.shaped(i)
            if info.type == T.SUBGRAPH:
                return None
            if info.is_const and np.size(info.value) <= 16:  # (weights: by operand)
                v = np.asarray(info.value)
                parts.append((int(info.type), v.dtype.str, v.shape, v.tobytes(), info.scale,
                              info.zero_point))
            elif info.omitted:
                parts.append(("omitted", int(info.type)))
            else:
                parts.append(i)
        o = self.g.shaped(outs[0])
        if o.channel_scales is not None:
            return None
        parts.append((int(o.type), o.scale, o.zero_point, o.shape))
        return tuple(parts)

    def convert(self, k: int, t: int, ins: Any, outs: Any) -> None:
        """HAL operation ``k`` through its converter; a refusal is collected."""
        name = OPERATION_TYPE_NAMES.get(t)
        if name is not None:
            conv = self.ex.converters.get(name)
        else:
            name, conv = _extension_converter(self.ex, t)
        first = len(self.sg.operators)
        try:
            if conv is None:
                raise Unexportable(_NO_EQUIVALENT.get(name, "no TFLite builtin equivalent"))
            conv(ExportOpContext(self, list(ins), list(outs)))
            self.check_kernels(first)
        except Unexportable as e:
            self.ex.refused.append(f"{self.where()}#{k} {name}: {e}")

    def fuse(self, fusion: Any) -> bool:
        """Writes a chain of HAL operations as the one TFLite operator it stands for
        (:mod:`nnhal.tflite.export_fuse`); False, having written nothing that is used, when
        that operator breaks a kernel rule (the chain is then written operation by
        operation)."""
        first, n_tensors = len(self.sg.operators), len(self.sg.tensors)
        try:
            fusion.convert(ExportOpContext(self, list(fusion.ins), list(fusion.outs)))
            self.check_kernels(first)
        except Unexportable:
            del self.sg.operators[first:], self.sg.tensors[n_tensors:]
            for i, t in list(self.tensors.items()):
                if t >= n_tensors:
                    del self.tensors[i]
            return False
        return True

    def check_kernels(self, first: int) -> None:
        """Refuse the operation when a TFLite operator written for it (from ``first`` on)
        breaks a kernel rule (:mod:`nnhal.tflite.kernel_rules`): TFLite would refuse it or
        abort the process that runs it."""
        tensors, cache = self.sg.tensors, self._rule_views

        def view(i: int) -> RuleTensor | None:
            if i < 0:
                return None
            t = tensors[i]
            sig = t.shape_signature
            hit = cache.get(i)
            if hit is not None and hit[0] is t and hit[1] is t.scales and \
                    hit[2] is t.zero_points and hit[3] == t.type and hit[4] == t.name and \
                    hit[5] == t.shape and hit[6] == sig:
                return hit[7]
            shape = t.shape if sig is None else tuple(
                0 if d < 0 else s for d, s in zip(sig, t.shape))  # -1: not known yet
            arrays = t.quant_arrays()
            scales, zero_points = arrays if arrays is not None else (t.scales, t.zero_points)
            rt = rule_tensor(t.type, scales, zero_points, f"tensor {i} '{t.name}'", shape)
            cache[i] = (t, t.scales, t.zero_points, t.type, t.name, list(t.shape),
                        None if sig is None else list(sig), rt)
            return rt

        for op in self.sg.operators[first:]:
            name = builtin_name(op.code)
            why = kernel_refusal(RuleOp(name, [view(i) for i in op.inputs],
                                     [view(i) for i in op.outputs],  # type: ignore[misc]
                                     op.options.get))
            if why is not None:
                raise Unexportable(f"TFLite's {name} kernel: {why}")

    def where(self) -> str:
        return "" if self.is_main else f"subgraph {self.g.index} "

    def edge_input(self, k: int, i: int) -> int:
        info = self.g.shaped(i)
        if self.is_main and info.type in _FLOAT16:
            shape, sig = self.shape(i)
            t16 = self.new(self.input_names[k], shape, TT.FLOAT16, signature=sig)
            t32 = self.tensor(i)
            self.emit(BO.DEQUANTIZE, [t16], [t32])
            return t16
        t = self.tensor(i)
        if self.is_main:
            self.sg.tensors[t].name = self.input_names[k]
        return t

    def edge_output(self, k: int, i: int) -> int:
        if i not in self.tensors or i in self.g.inputs:
            raise Unexportable(f"output operand #{i} is not computed by an operation")
        t = self.tensors[i]
        info = self.g.shaped(i)
        if self.is_main and info.type in _FLOAT16:
            shape, sig = self.shape(i)
            t16 = self.new(self.output_names[k], shape, TT.FLOAT16, signature=sig)
            self.emit(BO.CAST, [t], [t16])
            return t16
        if self.is_main:
            self.sg.tensors[t].name = self.output_names[k]
        return t


def _extension_tensor_type(t: Any) -> int | None:
    """The TFLite type an extension operand type stands for (its ``tflite``), or None."""
    definition = getattr(t, "definition", None)
    tt = getattr(definition, "tflite", None)
    return None if tt is None or not getattr(definition, "is_tensor", False) else int(tt)


def _type_name(t: Any) -> str:
    definition = getattr(t, "definition", None)
    return getattr(definition, "full_name", None) or getattr(t, "name", None) or str(int(t))


def _extension_converter(ex: Any, t: int) -> tuple[str, Converter | None]:
    """An extension operation's name and its ``tflite_export`` (None: it has none), from the
    analysis' table of the model's extension operations (``ex.extension_ops``)."""
    from nnhal.ops.extensions import lookup

    found = getattr(ex, "extension_ops", {}).get(int(t))
    if found is None:
        return f"extension operation {t:#x}", None
    op_id = found[0]
    ext = lookup(op_id.extension)
    operation = ext.operation(op_id.code) if ext is not None else None
    how = getattr(operation, "tflite_export", None)
    if isinstance(how, str):  # the export of the HAL operation of that name
        return op_id.name, ex.converters.get(how)
    if isinstance(how, int):  # that builtin of the operation's operands
        code = int(how)

        def builtin(cx: ExportOpContext) -> None:
            cx.emit(code, [cx.t(j) for j in range(cx.n)], [cx.o()])

        return op_id.name, builtin
    return op_id.name, how


def _unshared(arr: np.ndarray, dtype: str) -> np.ndarray:
    """``arr`` as ``dtype`` for a buffer, copied only where needed: a read-only array (an
    analysed constant, which nobody changes) is kept as it is, so exporting a model copies
    its weights once, when serialised; a writable one may still change, so it is copied."""
    data = arr.astype(dtype, copy=False)
    if data is arr and arr.flags.writeable:
        data = arr.copy()
    return data


def _set_quant(t: TensorDef, info: OperandInfo) -> None:
    if info.channel_scales is not None:
        channel_quant(t, info.channel_scales, info.channel_dim)
    elif info.type in _QUANT or (info.type == T.TENSOR_INT32 and info.scale > 0):
        t.scales, t.zero_points = [float(info.scale)], [int(info.zero_point)]


#: Why each HAL-only operation has no TFLite builtin.
_NO_EQUIVALENT = {
    name: "no TFLite builtin equivalent (a HAL-only operation)" for name in (
        "ROI_ALIGN", "ROI_POOLING", "GENERATE_PROPOSALS", "BOX_WITH_NMS_LIMIT",
        "AXIS_ALIGNED_BBOX_TRANSFORM", "HEATMAP_MAX_KEYPOINT",
        "QUANTIZED_16BIT_LSTM", "QUANTIZED_LSTM")
}
_NO_EQUIVALENT["DETECTION_POSTPROCESSING"] = "TFLite has it only as a custom operator"
_NO_EQUIVALENT["RANDOM_MULTINOMIAL"] = ("TFLite's MULTINOMIAL draws other random numbers, so "
                                        "the results cannot agree")
_NO_EQUIVALENT["OEM_OPERATION"] = "a vendor operation"


class ExportOpContext:
    """What a converter sees of one operation: its operands, and ways to add tensors and
    operators to the subgraph."""

    def __init__(self, w: SubgraphWriter, ins: list[int], outs: list[int]) -> None:
        self.w, self.ins, self.outs = w, ins, outs
        self.n = len(ins)
        self._shaped = w.g.shaped

    def info(self, j: int) -> OperandInfo:
        return self._shaped(self.ins[j])

    def out_info(self, j: int = 0) -> OperandInfo:
        return self.w.g.shaped(self.outs[j])

    def present(self, j: int) -> bool:
        return j < self.n and not self.info(j).omitted

    def scalar(self, j: int, default: Any = None) -> Any:
        """The constant value of input ``j`` as a Python scalar (``default`` when absent)."""
        if j >= self.n:
            return default
        info = self._shaped(self.ins[j])
        if not info.is_const:  # (an omitted operand is no constant)
            if info.omitted:
                return default
            raise Unexportable(f"input {j} (operand #{self.ins[j]}) is not a constant; TFLite "
                               f"takes it as an operator option")
        v = info.value
        if type(v) is not np.ndarray:
            v = np.asarray(v)
        return v.item() if v.ndim == 0 else v.reshape(-1).tolist()

    def const(self, j: int) -> np.ndarray:
        info = self.info(j)
        if not info.is_const:
            raise Unexportable(f"input {j} (operand #{self.ins[j]}) is not a constant")
        return np.asarray(info.value)

    def t(self, j: int) -> int:
        return self.w.tensor(self.ins[j])

    def o(self, j: int = 0) -> int:
        return self.w.tensor(self.outs[j])

    def shape(self, j: int) -> list[int]:
        return self.w.shape(self.ins[j])[0]

    def out_shape(self, j: int = 0) -> list[int]:
        return self.w.shape(self.outs[j])[0]

    def ints(self, values: Any, name: str = "p") -> int:
        try:
            values = np.asarray(values, dtype=np.int32)
        except OverflowError:  # a shape or multiple past TFLite's int32
            raise Unexportable(f"values {np.asarray(values).tolist()} do not fit TFLite's "
                               f"int32") from None
        return self.w.constant(values, None,
                               f"{name}{len(self.w.sg.tensors)}", TT.INT32)

    def temp(self, shape: list[int], like_tensor: int) -> int:
        """A new tensor shaped ``shape`` with the type and quantization of ``like_tensor``."""
        src = self.w.sg.tensors[like_tensor]
        t = TensorDef(f"x{len(self.w.sg.tensors)}", list(shape), src.type, 0,
                      src.scales, src.zero_points, src.quantized_dimension)
        return self.w.sg.add_tensor(t)

    def emit(self, code: int, inputs: list[int], outputs: list[int],
             options_name: str | None = None, **options: Any) -> None:
        self.w.emit(code, inputs, outputs, options_name, **options)

    def subgraph(self, j: int, passthrough: int = 0) -> int:
        """The exported TFLite subgraph index of the HAL subgraph operand at input ``j``."""
        return self.w.ex.subgraph(int(np.asarray(self.info(j).value).reshape(-1)[0]),
                                  passthrough)
