"""Division on the LiteRT driver: the HAL's int32 DIV floors and gives 0 for a zero divisor,
where TFLite's FLOOR_DIV (its export) fails the invocation. The driver runs the plain form
and makes a run that fails again on the guarded form (write_tflite guard_division), on every
way a run takes: by request, bound (native and Python), restored from the cache. The importer's
exact float32 FLOOR_DIV (thirty HAL operations) goes back to one FLOOR_DIV, and an operation
the importer made twice is written once, so the converter's floor_div_mod.tflite exports as
the four operators of its three (FLOOR_MOD stays FLOOR_DIV, MUL, SUB: TFLite's int32
FLOOR_MOD kills the process with SIGFPE on INT_MIN % -1)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import operator_names
from test_caching import prepare, restore

from nnhal.analysis import analyse
from nnhal.drivers.litert import support, unavailable
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.types import ErrorStatus, Model
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.session import Session
from nnhal.tflite import read_tflite, write_tflite

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"LiteRT driver unavailable: {unavailable()}")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tflite"))

DATA = Path(__file__).resolve().parents[1] / "tflite" / "data"
I32_MIN = -2**31
X = np.array([[7, -9, 10, -22], [I32_MIN, 5, -5, 2**31 - 1]], np.int32)
Y_ZERO = np.array([1, 0, -3, 0], np.int32)
Y_NONZERO = np.array([-1, 2, -3, 7], np.int32)


def _div_model(divisor: np.ndarray | None = None) -> Model:
    """x [2, 4] // y [4] (int32, the HAL's flooring DIV); y a model input, or constant."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_INT32, [2, 4])
    y = b.input(T.TENSOR_INT32, [4]) if divisor is None else \
        b.constant(T.TENSOR_INT32, divisor, [4])
    b.operation(O.DIV, [x, y, b.scalar(T.INT32, 0)], [b.output(T.TENSOR_INT32, [2, 4])])
    return b.build()


def _want(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.where(y == 0, 0, np.floor_divide(x, np.where(y == 0, 1, y))).astype(np.int32)


def _litert_raw(data: bytes, feeds: list[np.ndarray]) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    for d, a in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], a)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def test_plain_form_fails_on_zero_and_the_guarded_form_gives_the_hals_zero() -> None:
    plain, guarded = write_tflite(_div_model()), write_tflite(_div_model(), guard_division=True)
    np.testing.assert_array_equal(_litert_raw(plain, [X, Y_NONZERO]), _want(X, Y_NONZERO))
    with pytest.raises(RuntimeError, match="Division by 0"):
        _litert_raw(plain, [X, Y_ZERO])
    np.testing.assert_array_equal(_litert_raw(guarded, [X, Y_ZERO]), _want(X, Y_ZERO))
    # a constant divisor without zeros needs no guard
    assert len(read_tflite(write_tflite(_div_model(Y_NONZERO), guard_division=True))
               .model.main.operations) == 1


@pytest.mark.parametrize("divisor, divides", [(None, True), (Y_ZERO, True),
                                              (Y_NONZERO, False)],
                         ids=["input", "constant with 0", "constant"])
def test_int32_division_is_claimed_and_marked(divisor, divides) -> None:
    g = analyse(_div_model(divisor))
    assert support.supported_operations(g) == [True]
    assert support.divides(g) is divides


def test_bound_runs_give_the_hals_zero(fast_way) -> None:
    with Session(_div_model(), device="litert") as s, \
            Session(_div_model(), device="reference") as ref:
        for y in (Y_NONZERO, Y_ZERO, Y_NONZERO, Y_ZERO, Y_ZERO):
            got = list(s.run([X, y]).values())[0]
            np.testing.assert_array_equal(got, _want(X, y))
            np.testing.assert_array_equal(got, list(ref.run([X, y]).values())[0])
        assert s._bound is not None and s._bound.runner is not None  # still bound


def _by_request(pm, y: np.ndarray) -> np.ndarray:
    rb = RequestBuilder([X, y], [X.nbytes])
    try:
        status, _, _ = pm.execute_synchronously(rb.request)
        assert status == ErrorStatus.NONE
        return rb.output(0, np.int32, X.shape)
    finally:
        rb.close()


def test_runs_by_request_and_from_the_cache_give_the_hals_zero(tmp_path) -> None:
    from nnhal.drivers.litert import LiteRTDevice

    files = [open(tmp_path / n, "w+b") for n in ("model", "data")]  # noqa: SIM115
    dev = LiteRTDevice(threads=1, store_dir=tmp_path / "store")
    try:
        pm = prepare(dev, _div_model(), files[:1], files[1:])
        assert pm.engines.divides
        for y in (Y_ZERO, Y_NONZERO, Y_ZERO):
            np.testing.assert_array_equal(_by_request(pm, y), _want(X, y))
        dev._cache.forget_live_plans()
        status, restored = restore(dev, files[:1], files[1:])
        assert status == ErrorStatus.NONE and restored.engines.divides
        np.testing.assert_array_equal(_by_request(restored, Y_ZERO), _want(X, Y_ZERO))
    finally:
        dev.close()
        for f in files:
            f.close()


def test_a_failure_that_is_no_zero_divisor_still_fails() -> None:
    """The guarded form runs the same model: what fails for another cause fails there too."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_INT32, [4])
    y = b.input(T.TENSOR_INT32, [4])
    q = b.operand(T.TENSOR_INT32, [4])
    b.operation(O.DIV, [x, y, b.scalar(T.INT32, 0)], [q])
    params = b.input(T.TENSOR_FLOAT32, [3])
    b.operation(O.GATHER, [params, b.scalar(T.INT32, 0), q],
                [b.output(T.TENSOR_FLOAT32, [4])])
    model = b.build()
    p = np.arange(3, dtype=np.float32)
    with Session(model, device="litert") as s:
        got = list(s.run([np.array([4, 2, 0, 6], np.int32), np.array([2, 0, 1, 3], np.int32),
                          p]).values())[0]
        np.testing.assert_array_equal(got, [2, 0, 0, 2])  # p[[4 // 2, 2 // 0, 0 // 1, 6 // 3]]
        with pytest.raises(Exception, match="(?i)fail|index|bound"):
            s.run([np.array([40, 2, 0, 9], np.int32), np.array([2, 0, 1, 3], np.int32), p])


# ---- the converter's floor_div_mod.tflite ----------------------------------------------------

def test_floor_div_mod_exports_as_the_files_operators_and_agrees(fast_way) -> None:
    from nnhal.drivers.litert import LiteRTDevice

    path = DATA / "floor_div_mod.tflite"
    imported = read_tflite(path)
    assert len(imported.model.main.operations) == 34  # the importer's HAL forms
    written = LiteRTDevice(threads=1).compile_now(imported.model, analyse(imported.model))
    assert sorted(operator_names(bytes(written))) == ["FLOOR_DIV", "FLOOR_DIV", "MUL", "SUB"]
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((2, 5)) * 1e8).astype(np.float32)
    a[0, :4] = [np.inf, -0.0, np.nan, 3.4e38]
    b = np.array([0.0, -0.0, 1e-30, -7.5, np.inf], np.float32)
    i = np.array([[I32_MIN, 7, -7, 9, 0], [5, -6, 7, 8, 2**31 - 1]], np.int32)
    with Session(path) as s, Session(path, device="reference") as ref:
        assert [step["device"] for step in s.plan] == ["litert"]
        for j in ([[-1, 2, 0, -3, 0]], [[-1, 2, 3, -3, 4]], [[0, 0, 0, 0, 0]]):
            feeds = {"a": a, "b": b, "i": i, "j": np.array(j, np.int32)}
            got, want = s.run(feeds), ref.run(feeds)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("const", [False, True], ids=["divisor input", "divisor constant"])
def test_the_exact_float_floor_division_is_one_floor_div(const: bool) -> None:
    """The importer's chain (import_reach._exact_floor) found whole and written as FLOOR_DIV,
    which computes the same: bit for bit where |x / y| < 2^24 (the chain's claim), within a
    float32 rounding past it; the same infinities and NaN."""
    from tfl import Graph, build

    from nnhal.drivers.litert import LiteRTDevice

    rng = np.random.default_rng(5)
    n = 64
    b = (np.round(rng.uniform(0.1, 3, n), 1) * rng.choice([-1, 1], n)).astype(np.float32)
    b[:4] = [1e-30, -1e-30, 7.5, 0.6]
    a = np.round(rng.uniform(-10, 10, (2, n)), 1).astype(np.float32)
    a[1, :4] = [3.4e38, -3e37, 1e9, 7.8]
    if not const:
        b[4:8] = [0.0, -0.0, np.inf, np.nan]
        a[0, 4:8] = [5.0, -5.0, np.inf, 1.0]
    g = Graph()
    x = g.input((2, n), np.float32)
    y = g.const(b) if const else g.input((n,), np.float32)
    out = g.tensor((2, n), np.float32)
    g.op("FLOOR_DIV", [x, y], [out])
    g.output(out)
    imported = read_tflite(build(g))
    assert len(imported.model.main.operations) > 20
    written = LiteRTDevice(threads=1).compile_now(imported.model, analyse(imported.model))
    assert operator_names(bytes(written)) == ["FLOOR_DIV"]
    feeds = [a] if const else [a, b]
    with Session(imported, device="litert") as s, Session(imported, device="reference") as ref:
        got, want = list(s.run(feeds).values())[0], list(ref.run(feeds).values())[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        small = np.abs(a.astype(np.float64) / b) < 2 ** 24
    np.testing.assert_array_equal(got[small], want[small])
    np.testing.assert_allclose(got, want, rtol=2 ** -23, atol=0)  # also inf and NaN alike


def test_an_operation_made_twice_is_written_once() -> None:
    """Two ADDs of the same operands (constants by value) and output type: one operator;
    the second's output read from the first's tensor. Two that are both model outputs, or
    differ in their output's scale, stay two."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [3])
    one, one_again = (b.constant(T.TENSOR_FLOAT32, np.ones(1, np.float32), [1])
                      for _ in range(2))
    s1 = b.operand(T.TENSOR_FLOAT32, [3])
    b.operation(O.ADD, [x, one, b.scalar(T.INT32, 0)], [s1])
    out0 = b.output(T.TENSOR_FLOAT32, [3])
    b.operation(O.MUL, [s1, s1, b.scalar(T.INT32, 0)], [out0])
    out1 = b.output(T.TENSOR_FLOAT32, [3])
    b.operation(O.ADD, [x, one_again, b.scalar(T.INT32, 0)], [out1])
    out2 = b.output(T.TENSOR_FLOAT32, [3])
    b.operation(O.ADD, [x, one_again, b.scalar(T.INT32, 0)], [out2])
    model = b.build()
    assert operator_names(write_tflite(model)) == ["ADD", "MUL", "ADD"]  # out1 is s1; out2 kept
    xs = np.array([1.0, -2.0, 0.5], np.float32)
    with Session(model, device="litert") as s:
        got = list(s.run([xs]).values())
    np.testing.assert_array_equal(got[0], (xs + 1) ** 2)
    np.testing.assert_array_equal(got[1], xs + 1)
    np.testing.assert_array_equal(got[2], xs + 1)

    q = ModelBuilder()
    xq = q.input(T.TENSOR_QUANT8_ASYMM, [3], 0.5, 128)
    for scale in (0.5, 0.25):
        mid = q.operand(T.TENSOR_QUANT8_ASYMM, [3], scale, 128)
        q.operation(O.ADD, [xq, xq, q.scalar(T.INT32, 0)], [mid])
        q.operation(O.RELU, [mid], [q.output(T.TENSOR_QUANT8_ASYMM, [3], scale, 128)])
    assert operator_names(write_tflite(q.build())).count("ADD") == 2
