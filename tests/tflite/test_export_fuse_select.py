"""SELECT_V2 with broadcasting written back as the converter's one operator
(nnhal/tflite/export_fuse.py): the importer widens each operand exactly first (a bool OR-ed
with false, a float plus -0.0, an int32 plus 0, a quantized one RESHAPEd and TILEd), and the
exporter finds that form again, so ai-edge-litert runs one operator instead of three or four
(the converter's select_v2_broadcast file: 1.07-1.10x ai-edge-litert's call, written back as
LOGICAL_OR, ADD, SELECT). Every answer must be the file's own, bit for bit."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from runner import Reference

from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandType, OperationType
from nnhal.tflite import ImportedModel, read_tflite, schema, write_tflite
from nnhal.tflite.import_read import read_model

T, O = OperandType, OperationType
DATA = Path(__file__).parent / "data"
_WIDENING = {"LOGICAL_OR", "ADD", "TILE", "RESHAPE"}


def _ops(data: bytes) -> Counter:
    return Counter(op.name for op in read_model(schema.load(data))[0].ops)


def _litert():
    return pytest.importorskip("ai_edge_litert.interpreter",
                               reason="ai-edge-litert is not installed").Interpreter


def _run(interp_cls, data: bytes, feeds: list[np.ndarray]) -> list[np.ndarray]:
    it = interp_cls(model_content=data)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _special(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    values = np.array([0.0, -0.0, 1.5, -2.5, np.nan, np.inf, -np.inf, 3.4e38, 1e-30],
                      np.float32)
    return rng.choice(values, shape).astype(np.float32)


@pytest.mark.parametrize("name", ["select_v2_broadcast.tflite",
                                  "select_v2_broadcast_int8.tflite"])
def test_the_converters_select_v2_comes_back_whole_with_its_answers(name):
    interp = _litert()
    original = (DATA / name).read_bytes()
    again = write_tflite(read_tflite(original))
    ops = _ops(again)
    assert ops["SELECT_V2"] == 1 and not (_WIDENING & set(ops)) and "SELECT" not in ops
    it = interp(model_content=original)
    it.allocate_tensors()
    details = it.get_input_details()
    rng = np.random.default_rng(7)
    for _ in range(5):
        feeds = []
        for d in details:
            if d["dtype"] == np.float32:
                feeds.append(_special(tuple(d["shape"]), rng))
            else:
                info = np.iinfo(d["dtype"])
                feeds.append(rng.integers(info.min, info.max + 1, d["shape"]).astype(d["dtype"]))
        want, got = _run(interp, original, feeds), _run(interp, again, feeds)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert np.array_equal(g.view(np.uint8), w.view(np.uint8))  # bit for bit


def _select(widen_with: float, late: bool = False) -> ImportedModel:
    """SELECT(cond [2, 3], x [3] + c [2, 1], y [2, 3]) as the importer writes SELECT_V2 of x
    [3]; ``late``: y made after the ADD (by NEG, twice), so SELECT_V2 could not go where the
    ADD is."""
    b = ModelBuilder()
    cond = b.input(T.TENSOR_BOOL8, [2, 3])
    x = b.input(T.TENSOR_FLOAT32, [3])
    y_in = b.input(T.TENSOR_FLOAT32, [2, 3])
    out = b.output(T.TENSOR_FLOAT32, [2, 3])
    wide = b.operand(T.TENSOR_FLOAT32, [2, 3])
    c = b.constant(T.TENSOR_FLOAT32, np.full((2, 1), widen_with, np.float32), [2, 1])
    b.operation(O.ADD, [x, c, b.scalar(T.INT32, 0)], [wide])
    y = y_in
    if late:
        y1 = b.operand(T.TENSOR_FLOAT32, [2, 3])
        y = b.operand(T.TENSOR_FLOAT32, [2, 3])
        b.operation(O.NEG, [y_in], [y1])
        b.operation(O.NEG, [y1], [y])
    b.operation(O.SELECT, [cond, wide, y], [out])
    return ImportedModel(b.build(), ["cond", "x", "y"], ["out"])


@pytest.mark.parametrize("widen_with, late, fused", [(-0.0, False, True), (0.0, False, False),
                                                     (-0.0, True, False)])
def test_only_an_exact_widening_in_place_is_written_as_select_v2(widen_with, late, fused):
    """x + 0.0 is not x (-0.0 + 0.0 is 0.0), and an operand made after the widening cannot
    be read where it is: both stay as they are; the answers are the reference's either way."""
    interp = _litert()
    model = _select(widen_with, late)
    data = write_tflite(model)
    assert ("SELECT_V2" in _ops(data)) == fused
    rng = np.random.default_rng(3)
    ref = Reference(model)
    try:
        for _ in range(4):
            feeds = [rng.random((2, 3)) > 0.5, _special((3,), rng), _special((2, 3), rng)]
            want = ref.run(feeds)
            got = _run(interp, data, feeds)
            if late:  # (ai-edge-litert's NEG makes 0.0 of -0.0: values, not bits)
                assert np.array_equal(got[0], want[0], equal_nan=True)
            else:
                assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
    finally:
        ref.close()


def test_a_reshape_of_bools_comes_back_as_one_reshape():
    """The importer's RESHAPE of bools (SELECT of 1.0 / 0.0, float RESHAPE, NOT_EQUAL 0: the
    HAL's RESHAPE takes no bools) is the file's RESHAPE again, and ai-edge-litert's answers
    on the re-export are the file's."""
    interp = _litert()
    original = (DATA / "bool_reshape_if.tflite").read_bytes()
    again = write_tflite(read_tflite(original))
    assert _ops(again) == _ops(original)
    rng = np.random.default_rng(11)
    for _ in range(6):
        x = (rng.standard_normal((1, 6)) * rng.choice([0.0, 1.0, 3.0])).astype(np.float32)
        want, got = _run(interp, original, [x]), _run(interp, again, [x])
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
