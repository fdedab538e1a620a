"""ANeuralNetworksModel: a model built call by call, validated at finish, then turned into a
HAL :class:`nnhal.hal.types.Model` (with every model it references as a subgraph) for the
drivers.

Values of at most 128 bytes are copied when set; larger ones are references to the caller's
buffer, read when the model is finished (the caller must not change them before), and placed
with memory-backed values in the HAL model's pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nnhal.hal.types import (
    DataLocation,
    Operand,
    OperandLifeTime,
    Operation,
    OperationType,
    Subgraph,
    SymmPerChannelQuantParams,
    extension_prefix,
    is_extension_type,
    operand_nbytes,
)
from nnhal.hal.types import (
    Model as HalModel,
)
from nnhal.hal.types import (
    OperandType as T,
)
from nnhal.memory import SharedMemory
from nnhal.ops.catalog import signature
from nnhal.ops.signature import SignatureError, check
from nnhal.runtime import extensions
from nnhal.runtime.codes import (
    MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES,
    ResultCode,
    as_bytes,
    fail,
)
from nnhal.runtime.memory import Memory

L = OperandLifeTime
_UINT32_MAX = 0xFFFF_FFFF
_VALID_TYPES = frozenset(int(t) for t in T if t not in (T.OEM, T.TENSOR_OEM_BYTE))
_VALID_OPERATIONS = frozenset(int(o) for o in OperationType if o.name != "OEM_OPERATION")


@dataclass(frozen=True)
class _TypeOnly:
    """An operand as addOperation sees it for the signature: its type (no lifetime yet)."""

    type: T
    lifetime: None = None


@dataclass
class ANeuralNetworksOperandType:
    """The NDK's operand type struct: type code, dimensions (0 = unknown), scale, zero point."""

    type: int
    dimensions: Sequence[int] = field(default_factory=list)
    scale: float = 0.0
    zeroPoint: int = 0


def check_operand_type(ot: Any, where: str) -> Operand:
    """The HAL operand of an NDK operand type struct; BAD_DATA when the runtime refuses it."""
    try:
        t = int(ot.type)
        dims = [int(d) for d in ot.dimensions]
        scale, zp = float(ot.scale), int(ot.zeroPoint)
    except (AttributeError, TypeError, ValueError) as e:
        raise fail(ResultCode.BAD_DATA, f"{where}: not an operand type: {e}") from None
    if 0 <= t <= _UINT32_MAX and is_extension_type(t):
        return _extension_operand(t, dims, scale, zp, where)
    if t not in _VALID_TYPES:
        raise fail(ResultCode.BAD_DATA, f"{where}: invalid operand type {t}")
    tt = T(t)
    if (tt.is_scalar or tt == T.SUBGRAPH) and dims:
        raise fail(ResultCode.BAD_DATA, f"{where}: scalar {tt.name} with dimensions {dims}")
    if any(d < 0 or d > _UINT32_MAX for d in dims):
        raise fail(ResultCode.BAD_DATA, f"{where}: invalid dimensions {dims}")
    op = Operand(type=t, dimensions=dims, scale=scale, zero_point=zp)
    from nnhal.validation.model import ValidationError, validate_operand

    try:
        if tt == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:  # its scales come later
            op.extra_params = SymmPerChannelQuantParams([1.0] * max(1, dims[0] if dims
                                                                     else 1), 0)
            if scale != 0 or zp != 0:
                raise ValidationError("per-channel operands have scale 0 and zeroPoint 0")
        else:
            validate_operand(op, where, set())
    except ValidationError as e:
        raise fail(ResultCode.BAD_DATA, str(e)) from None
    op.extra_params = None
    n = operand_nbytes(op)
    if n is not None and n > _UINT32_MAX:
        raise fail(ResultCode.BAD_DATA, f"{where}: operand of {n} bytes is too large")
    return op


def _extension_operand(t: int, dims: list[int], scale: float, zp: int, where: str) -> Operand:
    """An extension operand as addOperand takes it: a type its extension declares (the
    extension known here or reported by a device), no dimensions for a scalar, no
    quantization parameters (its extension data carries whatever it needs)."""
    et = extensions.operand_type_of(t, where)
    if et.is_scalar and dims:
        raise fail(ResultCode.BAD_DATA, f"{where}: scalar {et.name} with dimensions {dims}")
    if any(d < 0 or d > _UINT32_MAX for d in dims):
        raise fail(ResultCode.BAD_DATA, f"{where}: invalid dimensions {dims}")
    if scale != 0 or zp != 0:
        raise fail(ResultCode.BAD_DATA, f"{where}: {et.name} takes no scale or zeroPoint")
    op = Operand(type=et, dimensions=dims)
    n = operand_nbytes(op)
    if n is not None and n > _UINT32_MAX:
        raise fail(ResultCode.BAD_DATA, f"{where}: operand of {n} bytes is too large")
    return op


class NdkModel:
    """ANeuralNetworksModel. Methods raise :class:`nnhal.NdkError` with the NDK's code."""

    def __init__(self) -> None:
        self.operands: list[Operand] = []
        #: Per operand: None, ("copy", bytes), ("ref", memoryview), ("memory", Memory, offset,
        #: length), ("model", NdkModel) or ("none",).
        self.values: list[tuple | None] = []
        self.operations: list[Operation] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.relaxed = False
        self.finished = False
        self.invalid = False
        self.identified = False
        self.hal: HalModel | None = None
        #: Large values read at finish, by operand.
        self._large: dict[int, bytes] = {}

    @classmethod
    def from_hal(cls, hal: HalModel) -> NdkModel:
        """A finished model over a HAL Model built elsewhere (the importer, a Session); BAD_DATA
        when it breaks a rule."""
        from nnhal.analysis import analyse

        try:
            # Kept for this object: the devices' support queries and prepares in this
            # process read this graph instead of analysing the model again.
            analyse(hal, keep=True)
        except Exception as e:  # noqa: BLE001 - any rule broken is BAD_DATA
            raise fail(ResultCode.BAD_DATA, f"finish: invalid model: {e}") from None
        m = cls()
        m.operands = list(hal.main.operands)
        m.operations = list(hal.main.operations)
        m.inputs, m.outputs = list(hal.main.input_indexes), list(hal.main.output_indexes)
        m.relaxed = bool(hal.relax_computation_float32_to_float16)
        m.identified = m.finished = True
        m.hal = hal
        return m

    # ---- building -----------------------------------------------------------------------
    def _check_open(self, what: str) -> None:
        if self.finished:
            raise fail(ResultCode.BAD_STATE, f"{what}: the model is finished")
        if self.invalid:
            raise fail(ResultCode.BAD_STATE, f"{what}: the model is invalid")

    def _operand(self, index: Any, what: str) -> Operand:
        if not isinstance(index, (int, np.integer)) or not 0 <= int(index) < len(self.operands):
            raise fail(ResultCode.BAD_DATA, f"{what}: operand index {index} out of range "
                       f"[0, {len(self.operands)})")
        return self.operands[int(index)]

    def add_operand(self, type: Any) -> int:
        """ANeuralNetworksModel_addOperand: the new operand's index."""
        self._check_open("addOperand")
        if type is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "addOperand: type is NULL")
        op = check_operand_type(type, f"addOperand (operand {len(self.operands)})")
        if len(self.operands) >= _UINT32_MAX:
            raise fail(ResultCode.BAD_DATA, "addOperand: too many operands")
        self.operands.append(op)
        self.values.append(None)
        return len(self.operands) - 1

    def set_operand_value(self, index: int, buffer: Any, length: int | None = None) -> None:
        """ANeuralNetworksModel_setOperandValue; ``buffer`` None with length 0 omits the
        operand."""
        self._check_open("setOperandValue")
        op = self._operand(index, "setOperandValue")
        if buffer is None:
            if length not in (None, 0):
                raise fail(ResultCode.BAD_DATA, "setOperandValue: NULL buffer with length "
                           f"{length}")
            self.values[index] = ("none",)
            return
        try:
            view = as_bytes(buffer)
        except TypeError as e:
            raise fail(ResultCode.BAD_DATA, f"setOperandValue: not a buffer: {e}") from None
        length = view.nbytes if length is None else length
        if not isinstance(length, int) or length < 0 or length > _UINT32_MAX or \
                length > view.nbytes:
            raise fail(ResultCode.BAD_DATA, f"setOperandValue: invalid length {length}")
        if int(op.type) == T.SUBGRAPH:
            raise fail(ResultCode.BAD_DATA, "setOperandValue: a model operand takes "
                       "setOperandValueFromModel")
        need = operand_nbytes(op)
        if need is None:
            raise fail(ResultCode.BAD_DATA, f"setOperandValue: operand {index} has unknown "
                       f"dimensions")
        if length != need:
            raise fail(ResultCode.BAD_DATA, f"setOperandValue: length {length} for operand "
                       f"{index} of {need} bytes")
        if length <= MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES:
            self.values[index] = ("copy", bytes(view[:length]))
        else:
            self.values[index] = ("ref", view[:length])

    def set_operand_value_from_memory(self, index: int, memory: Memory, offset: int,
                                      length: int) -> None:
        """ANeuralNetworksModel_setOperandValueFromMemory."""
        self._check_open("setOperandValueFromMemory")
        if memory is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "setOperandValueFromMemory: memory is NULL")
        op = self._operand(index, "setOperandValueFromMemory")
        if memory.desc is not None:
            raise fail(ResultCode.BAD_DATA, "setOperandValueFromMemory: a memory from a "
                       "descriptor cannot hold operand values")
        need = operand_nbytes(op)
        if need is None or int(op.type) == T.SUBGRAPH:
            raise fail(ResultCode.BAD_DATA, f"setOperandValueFromMemory: operand {index} has "
                       f"no fixed size")
        if not isinstance(length, int) or length != need:
            raise fail(ResultCode.BAD_DATA, f"setOperandValueFromMemory: length {length} for "
                       f"operand {index} of {need} bytes")
        if not isinstance(offset, int) or offset < 0 or offset + length > memory.size:
            raise fail(ResultCode.BAD_DATA, f"setOperandValueFromMemory: [{offset}, "
                       f"{offset}+{length}) outside the memory of {memory.size} bytes")
        self.values[index] = ("memory", memory, offset, length)

    def set_operand_value_from_model(self, index: int, value: NdkModel) -> None:
        """ANeuralNetworksModel_setOperandValueFromModel."""
        self._check_open("setOperandValueFromModel")
        if value is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "setOperandValueFromModel: model is NULL")
        op = self._operand(index, "setOperandValueFromModel")
        if int(op.type) != T.SUBGRAPH:
            raise fail(ResultCode.BAD_DATA, f"setOperandValueFromModel: operand {index} is not "
                       f"of type MODEL")
        if not value.finished or value.invalid:
            # Upstream (ModelBuilder::setOperandValueFromModel) answers BAD_STATE for both.
            raise fail(ResultCode.BAD_STATE, "setOperandValueFromModel: the value model is not "
                       "finished" if not value.finished else "setOperandValueFromModel: the "
                       "value model is invalid")
        self.values[index] = ("model", value)

    def set_operand_symm_per_channel_quant_params(self, index: int, scales: Sequence[float],
                                                  channel_dim: int) -> None:
        """ANeuralNetworksModel_setOperandSymmPerChannelQuantParams."""
        self._check_open("setOperandSymmPerChannelQuantParams")
        if scales is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "setOperandSymmPerChannelQuantParams: "
                       "scales are NULL")
        op = self._operand(index, "setOperandSymmPerChannelQuantParams")
        if int(op.type) != T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            raise fail(ResultCode.BAD_DATA, f"setOperandSymmPerChannelQuantParams: operand "
                       f"{index} is not TENSOR_QUANT8_SYMM_PER_CHANNEL")
        scales = [float(s) for s in scales]
        if not isinstance(channel_dim, int) or not 0 <= channel_dim < len(op.dimensions):
            raise fail(ResultCode.BAD_DATA, f"setOperandSymmPerChannelQuantParams: channelDim "
                       f"{channel_dim} outside the rank {len(op.dimensions)}")
        if op.dimensions[channel_dim] and len(scales) != op.dimensions[channel_dim]:
            raise fail(ResultCode.BAD_DATA, f"setOperandSymmPerChannelQuantParams: "
                       f"{len(scales)} scales for a channel dimension of "
                       f"{op.dimensions[channel_dim]}")
        if not all(np.isfinite(s) and s > 0 for s in scales):
            raise fail(ResultCode.BAD_DATA, "setOperandSymmPerChannelQuantParams: scales must "
                       "be positive")
        op.extra_params = SymmPerChannelQuantParams(scales, channel_dim)

    def add_operation(self, type: int, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        """ANeuralNetworksModel_addOperation: the operand counts and types are checked against
        the operation's signature at once, as upstream does (values, which may be set later,
        at finish)."""
        self._check_open("addOperation")
        if inputs is None or outputs is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "addOperation: inputs or outputs are NULL")
        ext = isinstance(type, (int, np.integer)) and 0 <= int(type) <= _UINT32_MAX and \
            is_extension_type(int(type))
        if ext and not extensions.is_operation_of_known_prefix(int(type)):
            raise fail(ResultCode.BAD_DATA, f"addOperation: extension operation type "
                       f"{int(type):#x} has a prefix no extension was given")
        if not ext and (not isinstance(type, (int, np.integer)) or
                        int(type) not in _VALID_OPERATIONS):
            raise fail(ResultCode.BAD_DATA, f"addOperation: invalid operation type {type}")
        for i in (*inputs, *outputs):
            self._operand(i, "addOperation")
        ins = [int(i) for i in inputs]
        outs = [int(i) for i in outputs]
        for i in outs:
            if self.values[i] is not None:
                raise fail(ResultCode.BAD_DATA, f"addOperation: output operand {i} has a "
                           f"value")
            if any(i in o.outputs for o in self.operations):
                raise fail(ResultCode.BAD_DATA, f"addOperation: operand {i} is already the "
                           f"output of an operation")
        if not ext:  # as upstream: an extension operation is its drivers' to validate
            self._check_signature(int(type), ins, outs)
        self.operations.append(Operation(type=int(type), inputs=ins, outputs=outs))

    def _check_signature(self, op_type: int, ins: list[int], outs: list[int]) -> None:
        sig = signature(op_type)
        if sig is None:
            return
        try:
            infos = [[_TypeOnly(T(int(self.operands[i].type))) for i in lst]
                     for lst in (ins, outs)]
        except ValueError:  # an extension operand type: the finish-time checks apply
            return
        try:
            check(sig, infos[0], infos[1], presence=False)
        except SignatureError as e:
            raise fail(ResultCode.BAD_DATA, f"addOperation: {e}") from None

    def extension_type(self, name: Any, code: Any, devices: Sequence[Any], what: str) -> int:
        """ANeuralNetworksModel_getExtensionOperandType / OperationType: the value of code
        ``code`` of extension ``name`` (its prefix assigned once per process)."""
        if name is None:
            raise fail(ResultCode.UNEXPECTED_NULL, f"{what}: extensionName is NULL")
        return extensions.extension_type(name, code, devices, what)

    def set_operand_extension_data(self, index: int, data: Any, length: int | None) -> None:
        """ANeuralNetworksModel_setOperandExtensionData: ``data`` None with length 0 clears
        it; the bytes are the extension's to read (checked at finish when it is installed)."""
        what = "setOperandExtensionData"
        self._check_open(what)
        op = self._operand(index, what)
        if data is None:
            if length not in (None, 0):
                raise fail(ResultCode.BAD_DATA, f"{what}: NULL data with length {length}")
            blob = None
        else:
            try:
                view = as_bytes(data)
            except (TypeError, ValueError) as e:
                raise fail(ResultCode.BAD_DATA, f"{what}: not a buffer: {e}") from None
            length = view.nbytes if length is None else length
            if isinstance(length, bool) or not isinstance(length, int) or \
                    not 0 <= length <= view.nbytes or length > _UINT32_MAX:
                raise fail(ResultCode.BAD_DATA, f"{what}: invalid length {length}")
            if length == 0:
                raise fail(ResultCode.BAD_DATA, f"{what}: data with length 0")
            blob = bytes(view[:length])
        if not is_extension_type(int(op.type)):
            raise fail(ResultCode.BAD_DATA, f"{what}: operand {index} is of the base type "
                       f"{int(op.type)}")
        op.extra_params = blob

    def identify_inputs_and_outputs(self, inputs: Sequence[int],
                                    outputs: Sequence[int]) -> None:
        """ANeuralNetworksModel_identifyInputsAndOutputs."""
        self._check_open("identifyInputsAndOutputs")
        if inputs is None or outputs is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "identifyInputsAndOutputs: NULL list")
        for i in (*inputs, *outputs):
            self._operand(i, "identifyInputsAndOutputs")
        ins = [int(i) for i in inputs]
        outs = [int(i) for i in outputs]
        for what, lst in (("input", ins), ("output", outs)):
            for i in lst:
                self._operand(i, "identifyInputsAndOutputs")
                if self.values[i] is not None:
                    raise fail(ResultCode.BAD_DATA, f"identifyInputsAndOutputs: {what} "
                               f"operand {i} has a value")
            if len(set(lst)) != len(lst):
                raise fail(ResultCode.BAD_DATA, f"identifyInputsAndOutputs: an {what} is "
                           f"listed twice")
        if set(ins) & set(outs):
            raise fail(ResultCode.BAD_DATA, "identifyInputsAndOutputs: an operand is both an "
                       "input and an output")
        self.inputs, self.outputs, self.identified = ins, outs, True

    def relax_computation_float32_to_float16(self, allow: bool) -> None:
        """ANeuralNetworksModel_relaxComputationFloat32toFloat16."""
        self._check_open("relaxComputationFloat32toFloat16")
        self.relaxed = bool(allow)

    # ---- finishing ----------------------------------------------------------------------
    def finish(self) -> None:
        """ANeuralNetworksModel_finish: BAD_DATA (and the model invalid) when the model
        breaks a rule."""
        self._check_open("finish")
        try:
            if not self.operations:
                raise ValueError("the model has no operation")
            if not self.outputs:
                raise ValueError("the model's outputs are not identified")
            for i, v in enumerate(self.values):
                if v is not None and v[0] == "ref":
                    self._large[i] = bytes(v[1])
            hal = self._build_hal()
            from nnhal.analysis import analyse

            analyse(hal, keep=True)  # once: see from_hal
        except Exception as e:  # noqa: BLE001 - any rule broken is BAD_DATA
            self.invalid = True
            self._large.clear()
            raise fail(ResultCode.BAD_DATA, f"finish: invalid model: {e}") from None
        self.hal = hal
        self.finished = True

    def _subgraph_models(self) -> list[NdkModel]:
        """This model and every model it references, each once, breadth first."""
        order: list[NdkModel] = [self]
        k = 0
        while k < len(order):
            for v in order[k].values:
                if v is not None and v[0] == "model" and all(v[1] is not m for m in order):
                    order.append(v[1])
            k += 1
        return order

    def _build_hal(self) -> HalModel:
        models = self._subgraph_models()
        values = bytearray()
        large = bytearray()
        memories: list[Memory] = []

        def place(buf: bytearray, blob: bytes) -> int:
            buf.extend(b"\0" * (-len(buf) % 8))
            off = len(buf)
            buf.extend(blob)
            return off

        pending_large: list[tuple[Operand, int]] = []
        subgraphs = []
        for m in models:
            consumers = [0] * len(m.operands)
            for o in m.operations:
                for i in o.inputs:
                    consumers[i] += 1
            ops = []
            for i, src in enumerate(m.operands):
                op = Operand(type=src.type, dimensions=list(src.dimensions),
                             number_of_consumers=consumers[i], scale=src.scale,
                             zero_point=src.zero_point, extra_params=src.extra_params)
                v = m.values[i]
                if i in m.inputs:
                    op.lifetime = L.SUBGRAPH_INPUT
                elif i in m.outputs:
                    op.lifetime = L.SUBGRAPH_OUTPUT
                elif v is None:
                    op.lifetime = L.TEMPORARY_VARIABLE
                elif v[0] == "none":
                    op.lifetime = L.NO_VALUE
                elif v[0] == "copy":
                    op.lifetime = L.CONSTANT_COPY
                    op.location = DataLocation(0, place(values, v[1]), len(v[1]))
                elif v[0] == "ref":
                    blob = m._large[i]
                    op.lifetime = L.CONSTANT_REFERENCE
                    op.location = DataLocation(0, place(large, blob), len(blob))
                    pending_large.append((op, 0))
                elif v[0] == "memory":
                    mem = v[1]
                    k = next((j for j, x in enumerate(memories) if x is mem), None)
                    if k is None:
                        memories.append(mem)
                        k = len(memories) - 1
                    op.lifetime = L.CONSTANT_REFERENCE
                    op.location = DataLocation(k + 1, v[2], v[3])  # pool 0: large values
                elif v[0] == "model":
                    op.lifetime = L.SUBGRAPH
                    j = next(j for j, x in enumerate(models) if x is v[1])
                    op.location = DataLocation(0, j - 1, 0)
                ops.append(op)
            subgraphs.append(Subgraph(ops, [Operation(o.type, list(o.inputs), list(o.outputs))
                                            for o in m.operations],
                                      list(m.inputs), list(m.outputs)))
        # The runtime's own copy of the large values, sealed: drivers view it, never copy.
        pools = [SharedMemory.from_parts(len(large), [(0, large)] if large else [],
                                         seal=True)] + [m.shared for m in memories]
        used = [extension_prefix(x.type) for sg in subgraphs for x in (*sg.operands,
                                                                       *sg.operations)
                if is_extension_type(x.type)]
        return HalModel(main=subgraphs[0], referenced=subgraphs[1:],
                        operand_values=bytes(values), pools=pools,
                        relax_computation_float32_to_float16=self.relaxed,
                        extension_name_to_prefix=extensions.table_of(used))

    def supported_operations_for_devices(self, devices: Sequence[Any]) -> list[bool]:
        """ANeuralNetworksModel_getSupportedOperationsForDevices: per operation, whether one
        of ``devices`` supports it."""
        if not self.finished:
            raise fail(ResultCode.BAD_STATE, "getSupportedOperationsForDevices: the model is "
                       "not finished")
        if not devices:
            raise fail(ResultCode.BAD_DATA, "getSupportedOperationsForDevices: no device")
        assert self.hal is not None
        result = [False] * len(self.operations)
        from nnhal.hal.types import ErrorStatus

        for d in devices:
            status, supported = d.hal.get_supported_operations(self.hal)
            if status != ErrorStatus.NONE:
                dead = getattr(d, "dead", False)
                raise fail(ResultCode.DEAD_OBJECT if dead else ResultCode.OP_FAILED,
                           f"getSupportedOperationsForDevices: device {d.name}: "
                           f"{ErrorStatus(status).name}" + (" (the device is dead)" if dead
                                                            else ""))
            result = [a or bool(b) for a, b in zip(result, supported)]
        return result

    def free(self) -> None:
        """ANeuralNetworksModel_free."""
        self.hal = None
