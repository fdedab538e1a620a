"""HAL 1.3 Model -> .tflite (schema version 3), for ai-edge-litert and any TFLite runtime.

The model is analysed first (so an invalid model fails with the validation message and every
temporary has its inferred shape), then each operation becomes one or more TFLite builtin
operators (see :mod:`nnhal.tflite.export_ops`). Every operation that cannot be expressed
exactly is collected, and the export fails once naming each of them.

Float16 (``TENSOR_FLOAT16``) is kept at the edges: constants are stored as float16 buffers
behind DEQUANTIZE (as converters store float16 weights) and float16 model inputs and outputs
stay float16 (DEQUANTIZE in, CAST out), but TFLite kernels compute in float32, so the inside
of the graph is float32. A model relaxed to float16 (``relax_computation_float32_to_float16``)
exports as float32: TFLite has no such flag, and float32 is what relaxation allows anyway.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from nnhal.analysis import ModelGraph, SubgraphGraph, analyse
from nnhal.errors import InvalidModelError, NnhalError, UnsupportedModelError
from nnhal.hal.types import ErrorStatus, Model
from nnhal.memory.frame import HEAD, Frame
from nnhal.ops.resolver import OpError
from nnhal.ops.signature import SignatureError
from nnhal.tflite.export_context import SubgraphWriter
from nnhal.tflite.export_fb import ModelDef, SubgraphDef, serialise
from nnhal.tflite.export_fuse import find_fusions
from nnhal.tflite.export_ops import CONVERTERS
from nnhal.tflite.model import ImportedModel
from nnhal.validation.model import ValidationError


def write_tflite(model: Model | ImportedModel, input_names: list[str] | None = None,
                 output_names: list[str] | None = None, *,
                 graph: ModelGraph | None = None, data_outside: bool = False,
                 exact_resize: bool = False, in_frame: bool = False,
                 guard_division: bool = False) -> bytes:
    """The .tflite bytes of ``model``, with a "serving_default" signature.

    Raises InvalidModelError (the validation message) for an invalid model, and
    UnsupportedModelError naming each operation ("#index TYPE: reason") without an exact
    TFLite equivalent. Names default to the ImportedModel's, else input_0... / output_0...
    ``graph`` is the model's analysis when the caller (a driver's prepare) has it already.
    ``data_outside``: constant data after the flatbuffer (Buffer ``offset`` / ``size``, read
    by TFLite 2.14 and later), which writes large models faster (see
    :func:`~nnhal.tflite.export_fb.serialise`); by default inside, as every reader takes it.
    ``exact_resize``: float32 RESIZE_BILINEAR on half the input, doubled after, so that
    XNNPACK's a + (b - a) t cannot overflow where the exact result is finite (the LiteRT
    driver's form; two elementwise operators more).
    ``guard_division``: an int32 DIV by a divisor that may be 0 at run time gives the HAL's 0
    there (EQUAL, SELECT_V2 around TFLite's FLOOR_DIV, which fails the invocation on a zero;
    the LiteRT driver's form for a run that failed so).
    ``in_frame`` (with ``data_outside``): when the model's weights lie in a file's frame
    (nnhal.memory.frame: a .tflite read in this process), the result may be that frame's
    buffer, the flatbuffer built around them (no copy of them; for an engine in this process:
    the bytes also hold the file read, and room).
    """
    if isinstance(model, ImportedModel):
        input_names = input_names or model.input_names
        output_names = output_names or model.output_names
        model = model.model
    try:
        if graph is None:
            graph = analyse(model, own_constants=False)
    except (ValidationError, OpError, SignatureError) as e:
        raise InvalidModelError(f"invalid model: {e}", ErrorStatus.INVALID_ARGUMENT) from None
    main = graph.main
    input_names = _names(input_names, len(main.inputs), "input")
    output_names = _names(output_names, len(main.outputs), "output")
    with _converted_lock:
        done = _converted.pop(graph, None)
    if done is not None and done[0] == (exact_resize, input_names, output_names) and \
            not guard_division:
        converted, refused = done[1], []  # converted already, by the support probe
    else:
        converted, refused = convert_model(graph, input_names, output_names,
                                           exact_resize=exact_resize,
                                           guard_division=guard_division)
    if refused:
        raise UnsupportedModelError("cannot export to TFLite", refused)
    located = _frame_locator(model) if in_frame and data_outside else None
    return serialise(converted, data_outside=data_outside, frame=located)


def _frame_locator(model: Model) -> tuple[Frame, Callable[[Any], int | None]] | None:
    """The frame that the model's pool views (:attr:`SharedMemory.frame`) and where a
    constant lies in it: an array that is a contiguous view of the framed bytes of the pool
    (the bytes there are the frame's, byte for byte), else None."""
    for pool in model.pools:
        framed = getattr(pool, "frame", None)
        if framed is None or pool.closed:
            continue
        frame, base = framed
        start = pool.mapped().ctypes.data + base

        def locate(data: Any, start: int = start, size: int = frame.size) -> int | None:
            if not isinstance(data, np.ndarray) or not data.flags.c_contiguous:
                return None
            at = data.ctypes.data - start
            return HEAD + at if 0 <= at and at + data.nbytes <= size else None
        return frame, locate
    return None


def convert_model(graph: ModelGraph, input_names: list[str], output_names: list[str], *,
                  exact_resize: bool = False, guard_division: bool = False
                  ) -> tuple[ModelDef, list[str]]:
    """The analysed model converted to TFLite operators (not serialised yet), with the
    signature when nothing was refused, and every refusal ("#index TYPE: reason")."""
    ex = _Exporter(graph.referenced)
    ex.exact_resize = exact_resize
    ex.guard_division = guard_division
    ex.extension_ops = graph.extension_ops
    ex.convert(graph.main, "main", input_names, output_names)
    if not ex.refused:
        sg = ex.model.subgraphs[0]
        ex.model.signature = ("serving_default", list(zip(input_names, sg.inputs)),
                              list(zip(output_names, sg.outputs)))
    return ex.model, ex.refused


#: Conversions done ahead of write_tflite for an analysed graph (graphs are immutable), with
#: the settings they were made with; write_tflite takes one (once) instead of converting
#: again: the LiteRT driver's support probe converts what its prepare then writes.
_converted: weakref.WeakKeyDictionary[ModelGraph, tuple[tuple[bool, list[str], list[str]],
                                                        ModelDef]] = weakref.WeakKeyDictionary()
_converted_lock = threading.Lock()


def keep_converted(graph: ModelGraph, converted: ModelDef, *, exact_resize: bool) -> None:
    """Keep ``converted`` (made by :func:`convert_model` with the default names) for the next
    write_tflite of ``graph`` with those settings."""
    main = graph.main
    key = (exact_resize, _names(None, len(main.inputs), "input"),
           _names(None, len(main.outputs), "output"))
    with _converted_lock:
        _converted[graph] = (key, converted)


def _names(names: list[str] | None, n: int, prefix: str) -> list[str]:
    if names is None:
        return [f"{prefix}_{k}" for k in range(n)]
    names = [str(x) for x in names]
    if len(names) != n:
        raise NnhalError(f"{len(names)} {prefix} names given for {n} model {prefix}s")
    if len(set(names)) != n:
        raise NnhalError(f"{prefix} names are not unique: {names}")
    return names


class _Exporter:
    """The whole model: main subgraph first, referenced ones as IF / WHILE need them."""

    def __init__(self, referenced: tuple[SubgraphGraph, ...]) -> None:
        self.model = ModelDef()
        self.referenced = referenced
        self.refused: list[str] = []
        self.converters = CONVERTERS
        self.fusions = find_fusions
        #: float32 RESIZE_BILINEAR as MUL 0.5, RESIZE_BILINEAR, MUL 2 (see export_nn._resize)
        self.exact_resize = False
        #: int32 DIV by a run-time divisor guarded against 0 (see write_tflite)
        self.guard_division = False
        #: The model's extension operations (the analysis' table): those with a
        #: ``tflite_export`` are written through it.
        self.extension_ops: Mapping[int, Any] = {}
        self._cache: dict[tuple[int, int], int] = {}

    def convert(self, sgg: SubgraphGraph, name: str, input_names: list[str] | None = None,
                output_names: list[str] | None = None, passthrough: int = 0) -> int:
        """Adds one subgraph; ``passthrough`` appends its last so many inputs as outputs
        (a WHILE body must give back what TFLite carries but the HAL only reads)."""
        sg = SubgraphDef(name)
        self.model.subgraphs.append(sg)
        index = len(self.model.subgraphs) - 1
        SubgraphWriter(self, sgg, sg, input_names, output_names, passthrough).run()
        return index

    def subgraph(self, ref: int, passthrough: int = 0) -> int:
        key = (ref, passthrough)
        if key not in self._cache:
            self._cache[key] = -1  # a recursive reference is refused by validation already
            self._cache[key] = self.convert(self.referenced[ref], f"subgraph_{ref}",
                                            passthrough=passthrough)
        return self._cache[key]


