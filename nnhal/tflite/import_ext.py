"""TFLite operators and tensor types through vendor extensions (:mod:`nnhal.ops.extensions`).

An installed extension claims TFLite operators by listing them in an operation's ``tflite``
(a builtin code from :data:`nnhal.tflite.schema.BUILTIN_CODES`, or a custom operator's
name), and TFLite tensor types the HAL lacks by an operand type's ``tflite`` (a TensorType
code, e.g. 8 for COMPLEX64). The importer turns such an operator into the extension's
operation when the HAL has no conversion of it (a HAL form, when one exists, runs on more
devices), calling the operation's ``tflite_convert(call)`` with a :class:`TfliteCall`; the
converter returns the operation's (inputs, outputs) as operand indexes, made with the call's
helpers. Without a converter the operator's inputs and outputs are taken in order.

The model's extension table (``extensionNameToPrefix``) is built as extensions are used,
prefixes 1, 2, ... in order of first use: prefixes are per model, as the HAL requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.hal.types import ExtensionNameAndPrefix, OperandType
from nnhal.ops import extensions as registry
from nnhal.ops.extensions import ExtensionDef, ExtensionOperation, OperandTypeDef
from nnhal.tflite.import_ctx import EXTENSION_TYPES as CURRENT
from nnhal.tflite.import_ctx import Context, Unimportable
from nnhal.tflite.import_read import OpInfo, TfliteTensor

#: Upstream's rule: the low 16 bits of an extension type are its code within the extension.
_LOW_BITS = 16


class ExtensionTable:
    """One model's extensions: the prefix of each used extension, assigned on first use."""

    def __init__(self) -> None:
        self.prefixes: dict[str, int] = {}

    def prefix(self, ext: ExtensionDef) -> int:
        if ext.name not in self.prefixes:
            self.prefixes[ext.name] = len(self.prefixes) + 1
        return self.prefixes[ext.name]

    def raw(self, ext: ExtensionDef, code: int) -> int:
        """The model's value of an extension operand or operation type."""
        return self.prefix(ext) << _LOW_BITS | int(code)

    def hal(self) -> list[ExtensionNameAndPrefix]:
        return [ExtensionNameAndPrefix(n, p) for n, p in self.prefixes.items()]

    def tensor_type(self, t: TfliteTensor) -> int | None:
        """The extension operand type (model value) of a tensor of a type the HAL lacks."""
        found = registry.for_tflite_type(int(t.ttype))
        if found is None:
            return None
        ext, tdef = found
        if not tdef.is_tensor:
            return None
        return self.raw(ext, tdef.code)

    def dtype(self, raw: int) -> np.dtype | None:
        """The numpy type of an extension operand type of this model, or None."""
        prefix, code = raw >> _LOW_BITS, raw & ((1 << _LOW_BITS) - 1)
        for name, p in self.prefixes.items():
            if p == prefix:
                ext = registry.lookup(name)
                tdef = ext.operand_type(code) if ext is not None else None
                return None if tdef is None else tdef.dtype
        return None


def claim(op: OpInfo) -> tuple[ExtensionDef, ExtensionOperation] | None:
    """The installed extension operation that stands for this operator, or None."""
    if op.custom:
        return registry.for_tflite(op.name)
    return registry.for_tflite(int(op.code))


def claim_name(key: int | str) -> str | None:
    """"extension (NAME:OP)" when an installed extension claims a builtin code or custom name."""
    found = registry.for_tflite(key)
    return None if found is None else f"extension ({found[1].id.name})"


class TfliteCall:
    """What an extension's ``tflite_convert`` reads and builds with: the operator (its name,
    builtin code, options, custom options, tensors) and helpers making the HAL operands."""

    def __init__(self, ctx: Context, op: OpInfo, table: ExtensionTable, ext: ExtensionDef,
                 operation: ExtensionOperation):
        self._ctx, self.op, self.table = ctx, op, table
        self.extension, self.operation = ext, operation

    # ---- the operator ----------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The builtin's name (e.g. "RFFT2D") or the custom operator's name."""
        return self.op.name

    @property
    def custom(self) -> bool:
        return self.op.custom

    @property
    def builtin_code(self) -> int | None:
        return None if self.op.custom else int(self.op.code)

    def options(self, table: str) -> Any:
        """The builtin's options as the schema table ``table`` (e.g. "CumsumOptions"; the
        ``tflite`` package's class), the schema's defaults when the file has none."""
        return self.op.options_as(table)

    @property
    def custom_options(self) -> bytes:
        """A custom operator's raw options (flexbuffers for MediaPipe's, as its kernel reads)."""
        return bytes(self.op.custom_options or b"")

    @property
    def n_inputs(self) -> int:
        return len(self.op.inputs)

    @property
    def n_outputs(self) -> int:
        return len(self.op.outputs)

    def tensor(self, k: int, output: bool = False) -> TfliteTensor | None:
        """Input (or output) ``k``'s tensor (shape, ``ttype``, constant ``value``); None for
        an omitted optional input (-1)."""
        i = (self.op.outputs if output else self.op.inputs)[k]
        return None if i < 0 else self._ctx.t(i)

    def value(self, k: int) -> np.ndarray | None:
        """Input ``k``'s constant value, or None when it is computed at run time."""
        i = self.op.inputs[k]
        return None if i < 0 else self._ctx.value(i)

    def reshape_target(self) -> list[int] | None:
        """A RESHAPE's output shape as TFLite's Prepare resolves it (from an int32 shape
        vector, else the options; the declared output shape is only its hint), refused as
        it refuses it; None when only known at run time."""
        from nnhal.tflite.import_ops import reshape_target

        return reshape_target(self._ctx, self.op)

    def expect(self, inputs: int, outputs: int = 1) -> None:
        """Refuse an operator of another input or output count than its kernel takes."""
        if (self.n_inputs, self.n_outputs) != (inputs, outputs):
            raise Unimportable(f"has {self.n_inputs} input(s) and {self.n_outputs} output(s), "
                               f"not {inputs} and {outputs}")

    def refuse(self, why: str) -> Unimportable:
        """The error to raise when the operator has no form the extension takes."""
        return Unimportable(why)

    # ---- operands --------------------------------------------------------------------------
    def input(self, k: int) -> int:
        """The operand holding input ``k`` (a constant becomes a constant operand)."""
        i = self.op.inputs[k]
        if i < 0:
            raise Unimportable(f"input {k} is omitted")
        return self._ctx.x(i)

    def output(self, k: int) -> int:
        """A new operand for output ``k`` (its type: the HAL's, or the extension type that
        stands for the TFLite type)."""
        return self._ctx.y(self.op.outputs[k])

    def scalar(self, type_: OperandType, value: Any) -> int:
        """A constant scalar operand (INT32, FLOAT32, BOOL, ...)."""
        return self._ctx.sb.scalar(type_, value)

    def constant(self, type_: OperandType, value: Any, dims: Sequence[int] | None = None
                 ) -> int:
        """A constant tensor operand of a HAL type."""
        arr = np.asarray(value)
        return self._ctx.sb.constant(type_, arr, list(arr.shape if dims is None else dims)
                                     or [1])

    def ext_type(self, tdef: OperandTypeDef) -> int:
        """The model value of one of the extension's operand types."""
        return self.table.raw(self.extension, tdef.code)


def convert(ctx: Context, op: OpInfo, table: ExtensionTable, ext: ExtensionDef,
            operation: ExtensionOperation) -> None:
    """Emit ``operation`` for ``op`` (raises Unimportable with the converter's reason)."""
    call = TfliteCall(ctx, op, table, ext, operation)
    if operation.tflite_convert is None:
        ins = [call.input(k) for k in range(call.n_inputs)]
        outs = [call.output(k) for k in range(call.n_outputs)]
    else:
        ins, outs = operation.tflite_convert(call)
    ctx.emit(table.raw(ext, operation.id.code), list(ins), list(outs))


__all__ = ["CURRENT", "ExtensionTable", "TfliteCall", "claim", "claim_name", "convert"]
