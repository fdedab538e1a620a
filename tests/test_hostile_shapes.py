"""Shapes past numpy's limits in a HAL model: more than 64 dimensions (no array holds them;
LiteRT's Python wrapper crashed the process on a rank-65 output) and sizes whose estimates
pass a float's range. Each is refused at prepare in one line, never a traceback or a crash."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from nnhal.analysis import about, analyse
from nnhal.errors import InvalidModelError
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import Model, OperandType, OperationType
from nnhal.session import Session

T = OperandType
O = OperationType
DEVICES = ["reference", pytest.param("litert", marks=pytest.mark.skipif(
    importlib.util.find_spec("ai_edge_litert") is None, reason="ai-edge-litert absent"))]


def gather(input_rank: int, indices_rank: int, constant_indices: bool = True) -> Model:
    """GATHER's output has rank input_rank - 1 + indices_rank, known only by inference."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1] * input_rank)
    if constant_indices:
        idx = b.constant(T.TENSOR_INT32, np.zeros(1, np.int32), [1] * indices_rank)
    else:
        idx = b.input(T.TENSOR_INT32, [1] * indices_rank)
    out = b.output(T.TENSOR_FLOAT32, [])
    b.operation(O.GATHER, [x, b.scalar(T.INT32, 0), idx], [out])
    return b.build()


@pytest.mark.parametrize("device", DEVICES)
def test_an_inferred_output_past_64_dimensions_is_refused_at_prepare(device: str) -> None:
    with pytest.raises(InvalidModelError, match="output operand 2 has rank 65, more than "
                                                "the 64 dimensions"):
        Session(gather(33, 33), device)


@pytest.mark.parametrize("device", DEVICES)
def test_64_dimensions_still_run(device: str) -> None:
    s = Session(gather(32, 33), device)
    (out,) = s.run([np.full([1] * 32, 7, np.float32)]).values()
    assert out.shape == (1,) * 64 and out.item() == 7


@pytest.mark.parametrize("constant", [True, False])
def test_a_declared_operand_past_64_dimensions_is_refused(constant: bool) -> None:
    """A constant of rank 65 was a ValueError from its decoding in the analysis."""
    graph = analyse(gather(1, 65, constant))
    assert graph.too_large == ("main operation 0: operand 1 has rank 65, more than the 64 "
                               "dimensions an array holds",)
    assert graph.main.supported == (False,)
    with pytest.raises(InvalidModelError, match="operand 1 has rank 65"):
        Session(gather(1, 65, constant), "reference")


def test_work_estimates_past_a_floats_range_are_worded() -> None:
    """TILE of 2^31-1 along 33 axes estimates ~1e306 visits; twice the input ~1e316, which
    the ``g`` format refused with OverflowError (a traceback from prepare)."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2] * 33)
    out = b.output(T.TENSOR_FLOAT32, [])
    mult = b.constant(T.TENSOR_INT32, np.full(33, 2**31 - 1, np.int32))
    b.operation(O.TILE, [x, mult], [out])
    graph = analyse(b.build())
    assert graph.too_much_work is not None and "needs about 1e+" in graph.too_much_work
    assert about(10**400) == "1e+400" and about(12345) == "1.23e+04"


def test_element_counts_past_2_to_the_63_are_exact() -> None:
    """An int64 product of [65536] * 4 wraps to 0: RESHAPE to [-1] inferred an empty output
    and the model was accepted. Exact, it is 2^64 elements: refused as too large."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [65536] * 4)
    out = b.output(T.TENSOR_FLOAT32, [])
    b.operation(O.RESHAPE, [x, b.constant(T.TENSOR_INT32, np.asarray([-1], np.int32))], [out])
    graph = analyse(b.build())
    assert graph.main.shapes[out] == (2**64,)
    assert len(graph.too_large) == 1 and "needs 73786976294838206464 bytes" in graph.too_large[0]


@pytest.mark.parametrize("dims", [[2**32 - 1], [2**31, 1]])
def test_dimensions_past_int32_are_unexportable(dims: list[int]) -> None:
    """The HAL's dimensions are uint32, TFLite's int32: the exporter wrote them into an int32
    vector, an OverflowError from write_tflite (and a bare INVALID_ARGUMENT from LiteRT)."""
    pytest.importorskip("tflite")
    from nnhal.errors import UnsupportedModelError
    from nnhal.tflite.exporter import write_tflite

    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, dims)
    out = b.output(T.TENSOR_FLOAT32, [])
    b.operation(O.ABS, [x], [out])
    with pytest.raises(UnsupportedModelError, match=f"operand #0 has dimension {max(dims)}, "
                                                    f"past TFLite's int32"):
        write_tflite(b.build())


def quantized_prelu(rank: int) -> tuple[Model, list[np.ndarray]]:
    """A quantized PRELU whose alpha broadcasts over the input's first dimension."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM, [2] + [1] * (rank - 1), 0.5, 128)
    alpha = b.input(T.TENSOR_QUANT8_ASYMM, [1] * rank, 0.25, 120)
    out = b.output(T.TENSOR_QUANT8_ASYMM, [], 0.5, 128)
    b.operation(O.PRELU, [x, alpha], [out])
    feeds = [np.asarray([100, 200], np.uint8).reshape([2] + [1] * (rank - 1)),
             np.full([1] * rank, 140, np.uint8)]
    return b.build(), feeds


@pytest.mark.parametrize("rank", [8, 33])
def test_quantized_prelu_broadcasts_at_any_rank_on_the_reference(rank: int) -> None:
    """np.broadcast_arrays takes 32 dimensions at most: rank 33 was GENERAL_FAILURE."""
    model, feeds = quantized_prelu(rank)
    (out,) = Session(model, "reference").run(feeds).values()
    assert out.shape == (2,) + (1,) * (rank - 1) and out.ravel().tolist() == [0, 200]


@pytest.mark.parametrize("device", DEVICES[1:])
def test_litert_does_not_claim_a_quantized_prelu_broadcasting_past_8_dimensions(
        device: str) -> None:
    """TFLite's quantized PRELU aborts the process broadcasting 9 dimensions or more."""
    with pytest.raises(InvalidModelError, match="PRELU broadcasting 9 dimensions"):
        Session(quantized_prelu(9)[0], device)
    model, feeds = quantized_prelu(8)
    (out,) = Session(model, device).run(feeds).values()
    assert out.ravel().tolist() == [0, 200]


@pytest.mark.parametrize("op", ["MAXIMUM", "LESS"])
def test_litert_does_not_claim_a_broadcast_past_8_dimensions(op: str) -> None:
    """TFLite's broadcasting binary kernels abort the process past 8 dimensions (MAXIMUM of
    [2]*9 and [1]*9 took the sweep down); the runtime runs them on the reference instead."""
    pytest.importorskip("ai_edge_litert")
    b = ModelBuilder()
    x, y = b.input(T.TENSOR_FLOAT32, [2] * 9), b.input(T.TENSOR_FLOAT32, [1] * 9)
    out = b.output(T.TENSOR_BOOL8 if op == "LESS" else T.TENSOR_FLOAT32, [])
    b.operation(getattr(O, op), [x, y], [out])
    with pytest.raises(InvalidModelError, match=f"{op} broadcasting 9 dimensions"):
        Session(b.build(), "litert")
    s = Session(b.build())
    (got,) = s.run([np.full([2] * 9, 3, np.float32), np.full([1] * 9, 5, np.float32)]).values()
    assert got.shape == (2,) * 9 and (got == (3 < 5 if op == "LESS" else 5)).all()
