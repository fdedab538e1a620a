"""The hostile-input run's file: a PAD of a million columns feeding a MAX_POOL_2D 65,536 wide
(6.1e10 element visits; before the work bound the reference computed it for 5 s and LiteRT
prepared and ran it for four minutes). LiteRT does not take such a pool (the reference visits
ten times faster), and a wider window, past the work bound, is refused by every door at
prepare, in one line."""

from __future__ import annotations

import time

import numpy as np
import pytest
from tfl import Graph, build

from nnhal.errors import NnhalError
from nnhal.session import Session

F = np.float32


def _pad_then_pool(pad: int, window: int) -> bytes:
    g = Graph()
    x = g.input((1, 1, 16, 1), F, name="x")
    padded = g.tensor((1, 1, 16 + pad, 1), F, name="padded")
    g.op("PAD", [x, g.const(np.int32([[0, 0], [0, 0], [0, pad], [0, 0]]))], [padded])
    y = g.tensor((1, 1, 16 + pad - window + 1, 1), F, name="y")
    g.op("MAX_POOL_2D", [padded], [y], ("Pool2DOptions", dict(
        Padding=1, StrideW=1, StrideH=1, FilterWidth=window, FilterHeight=1,
        FusedActivationFunction=0)))
    g.output(y)
    return build(g)


@pytest.mark.parametrize("device", [None, "reference", "litert"])
def test_the_pad_and_pool_file_is_refused_at_once(tmp_path, device):
    if device == "litert":
        pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed")
    path = tmp_path / "pad_pool.tflite"
    path.write_bytes(_pad_then_pool(1_000_000, 200_000))
    t0 = time.perf_counter()
    with pytest.raises(NnhalError, match=r"too much work: main operation 1 \(MAX_POOL_2D\) "
                       r"needs about 1.6e\+11") as e:
        Session(path, device, cache=False)
    assert "\n" not in str(e.value)
    assert time.perf_counter() - t0 < 5.0  # reading, analysing, refusing: no execution


def test_litert_leaves_the_pool_of_the_hostile_file_to_the_reference(tmp_path):
    pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed")
    from nnhal.drivers.litert.device import LiteRTDevice
    from nnhal.tflite.importer import read_tflite

    model = read_tflite(_pad_then_pool(1_000_000, 65_536)).model
    dev = LiteRTDevice()
    try:
        status, ok = dev.get_supported_operations(model)
        assert int(status) == 0 and ok == [True, False]  # the PAD, not the pool
    finally:
        dev.close()
    path = tmp_path / "pad_pool.tflite"
    path.write_bytes(_pad_then_pool(1_000_000, 65_536))
    t0 = time.perf_counter()
    with pytest.raises(NnhalError, match=r"MAX_POOL_2D.*1e9 a second") as e:
        Session(path, "litert", cache=False)
    assert "\n" not in str(e.value)
    assert time.perf_counter() - t0 < 5.0


def test_a_modest_pad_and_pool_file_runs(tmp_path):
    path = tmp_path / "pad_pool_small.tflite"
    path.write_bytes(_pad_then_pool(1_000, 64))
    with Session(path, "reference", cache=False) as s:
        x = np.arange(16, dtype=F).reshape(1, 1, 16, 1)
        y = next(iter(s.run({"x": x}).values())).reshape(-1)
    padded = np.concatenate([x.reshape(-1), np.zeros(1_000, F)])
    np.testing.assert_array_equal(y, np.lib.stride_tricks.sliding_window_view(padded, 64)
                                  .max(axis=1))
