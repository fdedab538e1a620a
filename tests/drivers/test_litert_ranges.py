"""RSQRT on the LiteRT driver: XNNPACK's rsqrt(+-0) is NaN where the HAL's is +-inf, so RSQRT
is refused there, except where its input cannot be zero: a non-negative value plus a
positive constant (a normalisation's variance + epsilon, as every LayerNorm writes it), so a
float transformer-style model runs whole on LiteRT instead of split around each LayerNorm."""

from __future__ import annotations

import numpy as np
import pytest

from nnhal.analysis import analyse
from nnhal.drivers.litert import support, unavailable
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import Model
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.session import Session

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"LiteRT driver unavailable: {unavailable()}")
F32 = T.TENSOR_FLOAT32


def _norm(square: str = "self", eps: float = 1e-5, fuse: int = 0) -> Model:
    """x [2, 8] -> (x - mean) squared -> mean -> + eps -> rsqrt; ``square``: "self" (MUL of
    the difference by itself), "other" (by x: not provably non-negative), "relu" (RELU of
    the difference: non-negative)."""
    b = ModelBuilder()
    x = b.input(F32, [2, 8])
    axis = b.constant(T.TENSOR_INT32, np.array([1], np.int32), [1])
    keep = b.scalar(T.INT32, 1)
    mean = b.operand(F32, [2, 1])
    b.operation(O.MEAN, [x, axis, keep], [mean])
    d = b.operand(F32, [2, 8])
    b.operation(O.SUB, [x, mean, b.scalar(T.INT32, 0)], [d])
    sq = b.operand(F32, [2, 8])
    if square == "relu":
        b.operation(O.RELU, [d], [sq])
    else:
        b.operation(O.MUL, [d, d if square == "self" else x, b.scalar(T.INT32, 0)], [sq])
    var = b.operand(F32, [2, 1])
    b.operation(O.MEAN, [sq, axis, keep], [var])
    shifted = b.operand(F32, [2, 1])
    b.operation(O.ADD, [var, b.constant(F32, np.array([eps], np.float32), [1]),
                        b.scalar(T.INT32, fuse)], [shifted])
    out = b.output(F32, [2, 1])
    b.operation(O.RSQRT, [shifted], [out])
    # a dense layer beside it: XNNPACK stays on (a model of light operations alone would run
    # with it off, where rsqrt(0) is right anyway)
    w = b.constant(F32, np.ones((4, 8), np.float32), [4, 8])
    bias = b.constant(F32, np.zeros(4, np.float32), [4])
    b.operation(O.FULLY_CONNECTED, [x, w, bias, b.scalar(T.INT32, 0)],
                [b.output(F32, [2, 4])])
    return b.build()


@pytest.mark.parametrize("square, eps, fuse, claimed", [
    ("self", 1e-5, 0, True), ("relu", 1e-3, 0, True),
    ("other", 1e-5, 0, False),  # x times the difference may be below zero
    ("self", 0.0, 0, False),  # no epsilon: a constant row's variance is 0
    ("self", -1e-5, 0, False),
    ("self", 1e-5, 1, False)])  # (RELU after the ADD: 0 again possible... and not ADD's form)
def test_rsqrt_is_claimed_only_where_its_input_cannot_be_zero(square, eps, fuse, claimed):
    graph = analyse(_norm(square, eps, fuse), own_constants=False)
    assert not support.builtin_kernels(graph)
    assert support.supported_operations(graph)[-2] is claimed


def test_a_layer_norm_runs_whole_on_litert_and_agrees() -> None:
    s = Session(_norm(), device=None)
    assert [p["device"] for p in s.plan] == ["litert"]
    x = np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)
    x[1] = 3.0  # a constant row: variance 0, rsqrt(eps)
    got = list(s.run({s.inputs[0].name: x}).values())[0]
    d = x - x.mean(axis=1, keepdims=True)
    want = 1 / np.sqrt((d * d).mean(axis=1, keepdims=True) + np.float32(1e-5))
    np.testing.assert_allclose(got, want, rtol=1e-5)
