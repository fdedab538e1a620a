"""What ``nnhal info`` and ``nnhal view`` both say about a model: opening the file, the
analysis (inferred shapes, decoded constants) when the model is valid, and short texts for
types, shapes, quantization and operation inputs."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnhal.analysis import ModelGraph, analyse
from nnhal.hal.types import (
    ExtensionNameAndPrefix,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    OperationType,
    is_extension_type,
)
from nnhal.hal.types import Subgraph as HalSubgraph
from nnhal.ops.catalog import SIGNATURES
from nnhal.ops.extensions import operation_name as ext_operation_name
from nnhal.ops.resolver import OpError
from nnhal.ops.signature import Slot, input_slots
from nnhal.tflite.model import ImportedModel
from nnhal.validation.model import ValidationError

CONSTANT = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE)

#: Short spellings of operand types for labels (the full name is in tooltips and --json).
SHORT_TYPES: dict[OperandType, str] = {
    OperandType.FLOAT32: "f32", OperandType.INT32: "i32", OperandType.UINT32: "u32",
    OperandType.TENSOR_FLOAT32: "f32", OperandType.TENSOR_INT32: "i32",
    OperandType.TENSOR_QUANT8_ASYMM: "u8q", OperandType.BOOL: "bool",
    OperandType.TENSOR_QUANT16_SYMM: "i16q", OperandType.TENSOR_FLOAT16: "f16",
    OperandType.TENSOR_BOOL8: "bool", OperandType.FLOAT16: "f16",
    OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL: "i8pc", OperandType.TENSOR_QUANT16_ASYMM: "u16q",
    OperandType.TENSOR_QUANT8_SYMM: "i8s", OperandType.TENSOR_QUANT8_ASYMM_SIGNED: "i8q",
    OperandType.SUBGRAPH: "subgraph",
}


def open_model(path: str | os.PathLike[str]) -> ImportedModel:
    """A model file as an ImportedModel. The file is checked by the schema loader first, so a
    missing, foreign, truncated or wrong-version file is one ModelFileError whatever the
    state of the importer."""
    from nnhal.tflite.schema import load

    loaded = load(path)
    from nnhal.tflite import read_tflite  # type: ignore[attr-defined]

    source = loaded.frame if loaded.frame is not None else loaded.data  # (not copied)
    return read_tflite(source, name=loaded.name)


@dataclass(frozen=True)
class Analysed:
    """The model with, when it is valid, its analysis; else why it is not."""

    imported: ImportedModel
    graph: ModelGraph | None
    problem: str | None

    @property
    def model(self) -> Model:
        return self.imported.model

    def subgraph(self, k: int) -> HalSubgraph:
        return self.model.main if k < 0 else self.model.referenced[k]

    def shape(self, k: int, index: int) -> list[int] | None:
        """The operand's shape after inference when known, else as declared (None: unknown
        rank)."""
        if self.graph is not None:
            sg = self.graph.main if k < 0 else self.graph.referenced[k]
            s = sg.shapes[index]
            return None if s is None else list(s)
        return list(self.subgraph(k).operands[index].dimensions)

    def value(self, k: int, index: int) -> object:
        """A constant's decoded value, or None."""
        if self.graph is None:
            return None
        sg = self.graph.main if k < 0 else self.graph.referenced[k]
        return sg.operands[index].value


def analysed(imported: ImportedModel | Model) -> Analysed:
    """The model with its analysis (never raises: an invalid model is still described)."""
    if isinstance(imported, Model):
        imported = plain(imported)
    try:
        graph = analyse(imported.model, own_constants=False)
        return Analysed(imported, graph, None)
    except (ValidationError, OpError) as e:
        return Analysed(imported, None, str(e))


def plain(model: Model) -> ImportedModel:
    """A HAL Model with generic names, for commands given a model without names."""
    main = model.main
    return ImportedModel(model, [f"input{k}" for k in range(len(main.input_indexes))],
                         [f"output{k}" for k in range(len(main.output_indexes))], source="")


def type_name(t: int, extensions: Any = ()) -> str:
    """The operand type's name; an extension type's (``NAME:TYPE``) when ``extensions``,
    the model's extensionNameToPrefix, names its extension."""
    try:
        return OperandType(t).name
    except ValueError:
        pass
    from nnhal.ops import extensions as registry

    for e in extensions:
        if int(e.prefix) == int(t) >> 16:
            ext = registry.lookup(e.name)
            tdef = ext.operand_type(int(t) & 0xFFFF) if ext is not None else None
            return f"{e.name}:{tdef.name if tdef is not None else int(t) & 0xFFFF}"
    return f"type {t}"


def short_type(t: int) -> str:
    try:
        return SHORT_TYPES.get(OperandType(t), OperandType(t).name.lower())
    except ValueError:
        return f"t{t}"


def op_name(t: int, extensions: Sequence[ExtensionNameAndPrefix] = ()) -> str:
    """The HAL operation's name; an extension operation's ``NAME:OP`` through the model's
    ``extensions`` table (extensionNameToPrefix)."""
    if is_extension_type(t):
        return ext_operation_name(t, extensions)
    try:
        return OperationType(t).name
    except ValueError:
        return f"operation {t}"


def shape_text(shape: list[int] | None) -> str:
    """``1x96x96x3``; ``?`` for an unknown dimension, ``*`` for an unknown rank, ``scalar``."""
    if shape is None:
        return "*"
    if not shape:
        return "scalar"
    return "x".join(str(d) if d else "?" for d in shape)


def quant_text(o: Operand) -> str:
    """The quantization of an operand in a few words ('' when it has none)."""
    extra = o.extra_params
    if o.type == OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL and \
            extra is not None and not isinstance(extra, bytes):
        scales = list(extra.scales)
        lo, hi = (min(scales), max(scales)) if scales else (0.0, 0.0)
        return f"per-channel dim {extra.channel_dim}: {len(scales)} scales {lo:.3g}..{hi:.3g}"
    if o.scale:
        return f"scale {o.scale:.6g} zero point {o.zero_point}"
    return ""


def element_count(shape: list[int]) -> int:
    return math.prod(map(int, shape))  # exact (an int64 product wraps past 2^63)


def slot_names(op: int, types: list[int]) -> list[str]:
    """The signature's name of each input of an operation (``input 3`` when unknown): the
    first form whose concrete slot types fit the operand types, else the first that fits the
    count."""
    try:
        sig = SIGNATURES.get(OperationType(op))
    except ValueError:
        sig = None
    fallback = [f"input {k}" for k in range(len(types))]
    if sig is None:
        return fallback
    first: list[Slot] | None = None
    chosen: list[Slot] | None = None
    for form in sig.forms:
        slots = input_slots(dataclasses.replace(sig, forms=(form,)), len(types))
        if slots is None:
            continue
        first = first or slots
        if all(_fits(s, t) for s, t in zip(slots, types)):
            chosen = slots
            break
    chosen = chosen or first
    if chosen is None:
        return fallback
    names = [s.name for s in chosen]
    seen: dict[str, int] = {}
    for k, s in enumerate(chosen):  # a repeated slot (CONCATENATION's inputs) is numbered
        if s.repeated:
            seen[s.name] = seen.get(s.name, -1) + 1
            names[k] = f"{s.name}[{seen[s.name]}]"
    return names


def _fits(slot: Slot, t: int) -> bool:
    if isinstance(slot.type, OperandType):
        return slot.type == t
    if isinstance(slot.type, tuple):
        return t in slot.type
    return True  # a type variable or any type


def value_text(value: object, limit: int = 6) -> str:
    """A small constant's value as a person reads it (``[1 2 2 1]``, ``0.5``)."""
    arr = np.asarray(value)
    if arr.ndim == 0:
        v = arr.item()
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    flat = arr.reshape(-1)
    items = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat[:limit].tolist()]
    return "[" + " ".join(items) + (" ..." if flat.size > limit else "") + "]"
