"""The LiteRT driver runs a light model with XNNPACK off when it needs an operation that only
XNNPACK computes wrong (support.XNNPACK_EDGES): LOG of 3.4e38 is then 88.72, as the reference
gives, and the model runs whole on LiteRT instead of split around the LOG. A model with a
convolution, an operation the builtin kernels compute wrong, or much work keeps XNNPACK, and
the LOG is refused there. The choice survives the compilation cache."""

from __future__ import annotations

import numpy as np
import pytest
from test_caching import prepare, restore

from nnhal.analysis import analyse
from nnhal.drivers.litert import support, unavailable
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import ErrorStatus, Model
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.session import Session

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"LiteRT driver unavailable: {unavailable()}")

BIG = np.float32(3.4028235e38)


def _log_model(n: int = 4, extra: str | None = None) -> Model:
    """LOG of a float32 [n] input; ``extra``: another operation beside it ("conv": a 1x1
    CONV_2D, "qadd": a quantized ADD, "add": a float ADD)."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [n])
    b.operation(O.LOG, [x], [b.output(T.TENSOR_FLOAT32, [n])])
    if extra == "conv":
        img = b.input(T.TENSOR_FLOAT32, [1, 2, 2, 1])
        w = b.constant(T.TENSOR_FLOAT32, np.ones((1, 1, 1, 1), np.float32), [1, 1, 1, 1])
        bias = b.constant(T.TENSOR_FLOAT32, np.zeros(1, np.float32), [1])
        b.operation(O.CONV_2D, [img, w, bias, *(b.scalar(T.INT32, v) for v in (1, 1, 1, 0))],
                    [b.output(T.TENSOR_FLOAT32, [1, 2, 2, 1])])
    elif extra in ("qadd", "add"):
        t = T.TENSOR_QUANT8_ASYMM if extra == "qadd" else T.TENSOR_FLOAT32
        q = (0.5, 128) if extra == "qadd" else (0.0, 0)
        a, c = b.input(t, [3], *q), b.input(t, [3], *q)
        b.operation(O.ADD, [a, c, b.scalar(T.INT32, 0)], [b.output(t, [3], *q)])
    return b.build()


@pytest.mark.parametrize("extra, off", [(None, True), ("add", True), ("conv", False),
                                        ("qadd", False)])
def test_xnnpack_goes_off_only_where_nothing_needs_it(extra, off) -> None:
    g = analyse(_log_model(extra=extra))
    assert support.builtin_kernels(g) is off
    assert support.supported_operations(g)[0] is off  # the LOG
    assert all(support.supported_operations(g)[1:])  # the rest, either way


def test_a_heavy_model_keeps_xnnpack() -> None:
    g = analyse(_log_model(n=support.LIGHT_WORK + 1))
    assert g.work > support.LIGHT_WORK
    assert not support.builtin_kernels(g)
    assert "log(3.4e38) gives inf" in (support.operation_reasons(g)[0] or "")


def test_no_edge_operation_keeps_xnnpack() -> None:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [3])
    b.operation(O.ABS, [x], [b.output(T.TENSOR_FLOAT32, [3])])
    assert not support.builtin_kernels(analyse(b.build()))


def test_the_log_runs_right_on_litert_and_from_its_cache(tmp_path) -> None:
    from nnhal.drivers.litert import LiteRTDevice

    x = np.array([BIG, 1.0, 0.5, 1e20], np.float32)
    want = np.log(x.astype(np.float64)).astype(np.float32)
    files = [open(tmp_path / n, "w+b") for n in ("model", "data")]  # noqa: SIM115
    dev = LiteRTDevice(threads=1, store_dir=tmp_path / "store")
    try:
        pm = prepare(dev, _log_model(), files[:1], files[1:])
        assert pm.engines.xnnpack is False
        with Session(_log_model(), device=dev) as s:
            np.testing.assert_allclose(list(s.run([x]).values())[0], want, rtol=1e-6)
        dev._cache.forget_live_plans()
        status, restored = restore(dev, files[:1], files[1:])
        assert status == ErrorStatus.NONE
        assert restored.engines.xnnpack is False  # recorded in the model cache
    finally:
        dev.close()
        for f in files:
            f.close()


def test_a_converter_model_with_log_runs_whole_on_litert() -> None:
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tflite" / "data" / "rfft2d_spectrum.tflite"
    with Session(path) as s:
        assert [step["device"] for step in s.plan] == ["litert"]

