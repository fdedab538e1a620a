"""Two more of the importer's HAL forms written back as the converter's operator
(nnhal/tflite/export_fuse.py): SPLIT_V (one SLICE per output) and an 8-bit QUANTIZE that
requantizes (DEQUANTIZE, QUANTIZE). The wake-word models of the test extra have both; each
TFLite operator more costs their calls time (about 0.2 us each on this machine's 4 us call).
"""

from __future__ import annotations

import importlib.metadata
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from runner import Reference, max_error

from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandType, OperationType
from nnhal.tflite import ImportedModel, read_tflite, schema, write_tflite
from nnhal.tflite.import_read import read_model

T, O = OperandType, OperationType
I8 = T.TENSOR_QUANT8_ASYMM_SIGNED
_VARIABLES = {"CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"}


def _ops(data: bytes) -> Counter:
    return Counter(op.name for op in read_model(schema.load(data))[0].ops
                   if op.name not in _VARIABLES)


def _split(begins: list[int], sizes: list[int]) -> ImportedModel:
    """SLICEs of x [1, 6, 4] int8 along axis 1, one model output each."""
    b = ModelBuilder()
    x = b.input(I8, [1, 6, 4], 0.5, -3)
    outs = []
    for begin, size in zip(begins, sizes):
        y = b.output(I8, [1, size if size > 0 else 6 - begin, 4], 0.5, -3)
        b.operation(O.SLICE, [x, b.constant(T.TENSOR_INT32, [0, begin, 0]),
                              b.constant(T.TENSOR_INT32, [1, size, -1])], [y])
        outs.append(y)
    names = [f"output_{k}" for k in range(len(outs))]
    return ImportedModel(b.build(), ["input_0"], names)


def _reference(model: ImportedModel, xs: list[np.ndarray]) -> list[list[np.ndarray]]:
    ref = Reference(model)
    try:
        return [ref.run([x]) for x in xs]
    finally:
        ref.close()


def _litert(data: bytes, xs: list[np.ndarray]) -> list[list[np.ndarray]]:
    litert = pytest.importorskip("ai_edge_litert.interpreter",
                                 reason="ai-edge-litert is not installed")
    it = litert.Interpreter(model_content=data)
    it.allocate_tensors()
    i = it.get_input_details()[0]["index"]
    got = []
    for x in xs:
        it.set_tensor(i, x)
        it.invoke()
        got.append([it.get_tensor(d["index"]) for d in it.get_output_details()])
    return got


def test_slices_tiling_an_axis_are_one_split_v():
    model = _split([0, 2, 3], [2, 1, -1])
    data = write_tflite(model)
    assert _ops(data) == Counter(SPLIT_V=1)
    xs = [np.random.default_rng(k).integers(-128, 128, (1, 6, 4)).astype(np.int8)
          for k in range(3)]
    for got, want in zip(_litert(data, xs), _reference(model, xs)):
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("begins, sizes", [([0, 3], [2, -1]),  # a gap: row 2 is dropped
                                           ([0, 2], [3, -1]),  # an overlap
                                           ([0], [2])])        # one piece
def test_slices_that_do_not_tile_stay_slices(begins, sizes):
    assert _ops(write_tflite(_split(begins, sizes))) == Counter(SLICE=len(begins))


def _requantize(also_output: bool) -> ImportedModel:
    b = ModelBuilder()
    x = b.input(I8, [2, 5], 0.04, -10)
    real = b.output(T.TENSOR_FLOAT32, [2, 5]) if also_output else \
        b.operand(T.TENSOR_FLOAT32, [2, 5])
    y = b.output(T.TENSOR_QUANT8_ASYMM, [2, 5], 0.05, 7)
    b.operation(O.DEQUANTIZE, [x], [real])
    b.operation(O.QUANTIZE, [real], [y])
    return ImportedModel(b.build(), ["x"], ["real", "y"] if also_output else ["y"])


def test_dequantize_quantize_is_one_requantizing_quantize():
    model = _requantize(False)
    data = write_tflite(model)
    assert _ops(data) == Counter(QUANTIZE=1)
    xs = [np.arange(-128, 127, 25, dtype=np.int8)[:10].reshape(2, 5),
          np.random.default_rng(1).integers(-128, 128, (2, 5)).astype(np.int8)]
    got, want = _litert(data, xs), _reference(model, xs)
    assert max(max_error(g[0], w[0]) for g, w in zip(got, want)) <= 1
    # The float value read as an output too: both operations stay.
    assert _ops(write_tflite(_requantize(True))) == Counter(DEQUANTIZE=1, QUANTIZE=1)


def _wakeword(name: str) -> Path:
    try:
        files = importlib.metadata.files("pymicro-wakeword") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    found = [Path(f.locate()) for f in files if str(f).endswith(name)]
    if not found:
        pytest.skip("pymicro-wakeword is not installed (test extra)")
    return found[0]


def test_a_wakeword_model_keeps_its_operators():
    """okay_nabu's SPLIT_Vs and its int8 -> uint8 QUANTIZE come back as the file has them
    (its resource variables aside: the re-export carries the state as inputs and outputs)."""
    path = _wakeword("okay_nabu.tflite")
    data = path.read_bytes()
    again = write_tflite(read_tflite(data))
    assert _ops(again) == _ops(data)
    assert _ops(data)["SPLIT_V"] == 3 and _ops(data)["QUANTIZE"] == 1
