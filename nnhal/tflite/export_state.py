"""A flatbuffer's state pairs as TFLite resource variables, so that the interpreter keeps a
streaming model's state itself between invocations (as the converter's own files do).

The HAL keeps nothing between executions, so the importer turns each resource variable into
one more main input (its value before the run) and one more main output (its value after);
the exporter writes that form. A caller that runs one stream in one interpreter (the LiteRT
driver's bound runs, for a :class:`~nnhal.session.Session`) pays a copy in and a copy out per
state tensor and per call for it. :func:`state_as_variables` gives the same flatbuffer with
each (input, output) pair as a variable instead: subgraph 0 reads the variable into the
input's tensor first (VAR_HANDLE + READ_VARIABLE) and assigns the output's tensor to it last
(ASSIGN_VARIABLE), neither being a subgraph input or output any more. Two small subgraphs are
added: one that assigns every variable from its inputs (the initial values, or any state
handed over), one that reads every variable into its outputs. There is no CALL_ONCE: the
caller sets the state before the first run, and again to reset a stream.

The flatbuffer is extended, not rewritten: its bytes are kept whole at the end of the result,
and only the new tables (the model, subgraph 0, the operator codes, the buffer list and what
is added) are written before them, referring into the old bytes where they reuse a tensor,
an operator, a subgraph or a buffer. Constant data is copied once (the bytes) and nothing of
the model is decoded, so any flatbuffer TFLite reads is taken, whatever operators or options
it holds. A buffer whose data lies past the flatbuffer (``offset`` / ``size``, counted from
the file's start) gets a new Buffer table with the offset moved by what is put in front.
"""

from __future__ import annotations

import importlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import flatbuffers
import numpy as np
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions
from tflite.TensorType import TensorType

from nnhal.tflite.schema import FILE_IDENTIFIER

#: Builtin codes above this go in the 32-bit field; the 8-bit one holds this placeholder.
_PLACEHOLDER_FOR_GREATER_OP_CODES = 127
_ALIGN = 16
#: Any value above 1 (TFLite's sign of data outside the flatbuffer) holds an offset's place.
_PLACEHOLDER_OFFSET = 1 << 40
_U64 = struct.Struct("<Q")
_CODES = (BuiltinOperator.VAR_HANDLE, BuiltinOperator.READ_VARIABLE,
          BuiltinOperator.ASSIGN_VARIABLE)


class StateFormError(ValueError):
    """The flatbuffer or the pairs cannot take the variable form (the caller keeps the
    state as inputs and outputs)."""


@dataclass(frozen=True)
class StateForm:
    """The flatbuffer with its state as variables, and where its state goes in and out."""

    flatbuffer: bytes
    #: The subgraph that assigns every variable from its inputs, in the pairs' order.
    set_subgraph: int
    #: Its input tensors (in that subgraph), in the pairs' order.
    set_inputs: tuple[int, ...]
    #: The subgraph that reads every variable into its outputs, in the pairs' order.
    get_subgraph: int
    #: Its output tensors (in that subgraph), in the pairs' order.
    get_outputs: tuple[int, ...]


@cache
def _fn(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"tflite.{module}"), f"{module}{name}")


def _reader(module: str) -> Any:
    return getattr(importlib.import_module(f"tflite.{module}"), module)


class _Writer:
    """A builder whose last bytes are the old flatbuffer, padded to the alignment, so that
    an object of it at position ``p`` is at builder offset ``len(old) - p``."""

    def __init__(self, old: bytes, extra: int):
        n = len(old) + (-len(old)) % _ALIGN
        self.n = n
        b = flatbuffers.Builder(n + extra)
        b.head -= n
        b.Bytes[b.head:b.head + len(old)] = old
        b.Prep(_ALIGN, 0)  # the old bytes keep their alignment in the result
        self.b = b

    def old(self, position: int) -> int:
        """The builder offset of the old object at ``position``."""
        return self.n - position

    def ints(self, values: Sequence[int]) -> int:
        return self.b.CreateNumpyVector(np.asarray(values, dtype="<i4").reshape(-1))

    def offsets(self, module: str, vec: str, items: Sequence[int]) -> int:
        _fn(module, f"Start{vec}Vector")(self.b, len(items))
        for off in reversed(items):
            self.b.PrependUOffsetTRelative(off)
        return self.b.EndVector()

    def table(self, module: str, fields: dict[str, Any]) -> int:
        _fn(module, "Start")(self.b)
        for key, value in fields.items():
            if value is not None:
                _fn(module, f"Add{key}")(self.b, value)
        return _fn(module, "End")(self.b)


def _field(obj: Any, slot: int) -> int | None:
    """The absolute position of what offset field ``slot`` of ``obj``'s table points to."""
    tab = obj._tab
    o = tab.Offset(4 + 2 * slot)
    return tab.Indirect(tab.Pos + o) if o else None


def _tables(buf: bytes, obj: Any, slot: int) -> list[int]:
    """The absolute positions of the tables of the vector in offset field ``slot`` of
    ``obj``'s table, read at once (each element is an offset from where it sits)."""
    at = _field(obj, slot)
    if at is None:
        return []
    n = int(np.frombuffer(buf, "<u4", 1, at)[0])
    where = at + 4 + 4 * np.arange(n, dtype=np.int64)
    return (where + np.frombuffer(buf, "<u4", n, at + 4)).tolist()


def state_as_variables(flatbuffer: bytes, pairs: Sequence[tuple[int, int]]) -> StateForm:
    """``flatbuffer`` with each pair (main input position, main output position) kept as a
    resource variable (see the module's docstring); StateFormError when a pair does not fit
    (positions out of range or repeated, an input and output of different types or sizes)."""
    model_cls = _reader("Model")
    if len(flatbuffer) < 8 or flatbuffer[4:8] != FILE_IDENTIFIER:
        raise StateFormError("not a TFLite flatbuffer")
    model = model_cls.GetRootAs(flatbuffer, 0)
    if model.SubgraphsLength() < 1:
        raise StateFormError("the model has no subgraph")
    main = model.Subgraphs(0)
    inputs = [int(i) for i in main.InputsAsNumpy()] if main.InputsLength() else []
    outputs = [int(i) for i in main.OutputsAsNumpy()] if main.OutputsLength() else []
    pairs = [(int(i), int(o)) for i, o in pairs]
    if not pairs:
        raise StateFormError("no state pairs")
    if len({i for i, _ in pairs}) != len(pairs) or len({o for _, o in pairs}) != len(pairs):
        raise StateFormError("a state input or output appears in two pairs")
    if any(not (0 <= i < len(inputs) and 0 <= o < len(outputs)) for i, o in pairs):
        raise StateFormError("a state pair names an input or output out of range")
    state_in = [inputs[i] for i, _ in pairs]
    state_out = [outputs[o] for _, o in pairs]
    if len(set(state_in)) != len(state_in):
        raise StateFormError("one tensor is two state inputs")
    for ti, to in zip(state_in, state_out):
        a, b = main.Tensors(ti), main.Tensors(to)
        shape_a = a.ShapeAsNumpy().tolist() if a.ShapeLength() else []
        shape_b = b.ShapeAsNumpy().tolist() if b.ShapeLength() else []
        if a.Type() != b.Type() or math.prod(shape_a) != math.prod(shape_b) or \
                any(d < 0 for d in shape_a):
            raise StateFormError(f"state tensors {ti} and {to} differ in type or size")
    kept_in = [t for j, t in enumerate(inputs) if j not in {i for i, _ in pairs}]
    if any(t in kept_in for t in state_in):
        raise StateFormError("a state input's tensor is also another input")
    k = len(pairs)
    n_tensors = main.TensorsLength()
    n_codes = model.OperatorCodesLength()
    n_buffers = model.BuffersLength()
    n_subgraphs = model.SubgraphsLength()
    w = _Writer(flatbuffer, 4096 + 1024 * k + 8 * (n_tensors + main.OperatorsLength()
                                                    + n_buffers + n_codes + n_subgraphs))
    b = w.b
    empty = n_buffers  # a new empty buffer for the handles
    var_code, read_code, assign_code = n_codes, n_codes + 1, n_codes + 2
    names = [b.CreateString(f"nnhal.state.{j}") for j in range(k)]

    def handle_tensor() -> int:
        return w.table("Tensor", {"Shape": w.ints([]), "Type": TensorType.RESOURCE,
                                  "Buffer": empty})

    def var_handle(j: int, out: int) -> int:
        opts = w.table("VarHandleOptions", {"SharedName": names[j]})
        return w.table("Operator", {"OpcodeIndex": var_code, "Inputs": w.ints([]),
                                    "Outputs": w.ints([out]),
                                    "BuiltinOptionsType": BuiltinOptions.VarHandleOptions,
                                    "BuiltinOptions": opts})

    def op(code: int, ins: list[int], outs: list[int]) -> int:
        return w.table("Operator", {"OpcodeIndex": code, "Inputs": w.ints(ins),
                                    "Outputs": w.ints(outs)})

    # Subgraph 0: handles after the old tensors; the reads first, the assignments last.
    handles = [n_tensors + j for j in range(k)]
    old_tensors = _tables(flatbuffer, main, 0)
    tensors = [w.old(p) for p in old_tensors]
    tensors += [handle_tensor() for _ in range(k)]
    ops = [var_handle(j, handles[j]) for j in range(k)]
    ops += [op(read_code, [handles[j]], [state_in[j]]) for j in range(k)]
    ops += [w.old(p) for p in _tables(flatbuffer, main, 3)]
    ops += [op(assign_code, [handles[j], state_out[j]], []) for j in range(k)]
    dropped_in = {i for i, _ in pairs}
    dropped_out = {o for _, o in pairs}
    name = _field(main, 4)
    new_main = w.table("SubGraph", {
        "Tensors": w.offsets("SubGraph", "Tensors", tensors),
        "Inputs": w.ints([t for j, t in enumerate(inputs) if j not in dropped_in]),
        "Outputs": w.ints([t for j, t in enumerate(outputs) if j not in dropped_out]),
        "Operators": w.offsets("SubGraph", "Operators", ops),
        "Name": None if name is None else w.old(name)})

    # The setter and the getter: handles 0..k-1, values k..2k-1 (the state inputs' tables).
    values = [w.old(old_tensors[t]) for t in state_in]

    def side(name: str, setter: bool) -> int:
        ts = [handle_tensor() for _ in range(k)] + values
        body = [var_handle(j, j) for j in range(k)]
        body += [op(assign_code, [j, k + j], []) if setter else op(read_code, [j], [k + j])
                 for j in range(k)]
        ends = w.ints(list(range(k, 2 * k)))
        return w.table("SubGraph", {
            "Tensors": w.offsets("SubGraph", "Tensors", ts),
            "Inputs": ends if setter else w.ints([]),
            "Outputs": w.ints([]) if setter else ends,
            "Operators": w.offsets("SubGraph", "Operators", body),
            "Name": b.CreateString(name)})

    setter = side("nnhal_set_state", True)
    getter = side("nnhal_get_state", False)
    subgraphs = [new_main] + [w.old(p) for p in _tables(flatbuffer, model, 2)[1:]] + \
        [setter, getter]

    codes = [w.old(p) for p in _tables(flatbuffer, model, 1)]
    codes += [w.table("OperatorCode", {
        "DeprecatedBuiltinCode": min(int(c), _PLACEHOLDER_FOR_GREATER_OP_CODES),
        "BuiltinCode": int(c), "Version": 1}) for c in _CODES]

    buffers, moved = [], []  # moved: (where its offset field sits, the old offset)
    buffer_cls = _reader("Buffer")
    for pos in _tables(flatbuffer, model, 4):
        buf = buffer_cls()
        buf.Init(flatbuffer, pos)
        offset = int(buf.Offset())
        if offset > 1:
            _fn("Buffer", "Start")(b)
            _fn("Buffer", "AddOffset")(b, _PLACEHOLDER_OFFSET)
            at = b.Offset()
            _fn("Buffer", "AddSize")(b, int(buf.Size()))
            buffers.append(_fn("Buffer", "End")(b))
            moved.append((at, offset))
        else:
            buffers.append(w.old(pos))
    buffers.append(w.table("Buffer", {}))

    description = _field(model, 3)
    metadata_buffer = _field(model, 5)
    metadata = _field(model, 6)
    root = w.table("Model", {
        "Version": int(model.Version()),
        "OperatorCodes": w.offsets("Model", "OperatorCodes", codes),
        "Subgraphs": w.offsets("Model", "Subgraphs", subgraphs),
        "Description": None if description is None else w.old(description),
        "Buffers": w.offsets("Model", "Buffers", buffers),
        "MetadataBuffer": None if metadata_buffer is None else w.old(metadata_buffer),
        "Metadata": None if metadata is None else w.old(metadata)})
    b.Finish(root, file_identifier=FILE_IDENTIFIER)
    out = b.Output()
    if moved:
        out = bytearray(out)
        shift = len(out) - w.n  # where the old bytes start now
        for at, offset in moved:
            _U64.pack_into(out, len(out) - at, offset + shift)
    ends = tuple(range(k, 2 * k))
    return StateForm(bytes(out), n_subgraphs, ends, n_subgraphs + 1, ends)
