"""The reference driver limits BLAS threads around executions of models with GEMMs only,
restores the count afterwards, and leaves BLAS alone when told to."""

from __future__ import annotations

import numpy as np
import pytest

from nnhal import Session
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops import blas


def fc_model():
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 4])
    w = b.constant(T.TENSOR_FLOAT32, np.eye(4, dtype=np.float32))
    bias = b.constant(T.TENSOR_FLOAT32, np.zeros(4, np.float32))
    y = b.output(T.TENSOR_FLOAT32, [1, 4])
    b.operation(O.FULLY_CONNECTED, [x, w, bias, b.scalar(T.INT32, 0)], [y])
    return b.build()


def add_model():
    b = ModelBuilder()
    x, y = b.input(T.TENSOR_FLOAT32, [2]), b.input(T.TENSOR_FLOAT32, [2])
    out = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [out])
    return b.build()


@pytest.fixture
def seen(monkeypatch):
    calls: list[int] = []
    real = blas.limit_enter
    monkeypatch.setattr(blas, "limit_enter", lambda n: (calls.append(n), real(n))[1])
    return calls


def test_a_gemm_model_runs_under_the_limit_and_the_count_comes_back(seen):
    before = blas.get_threads()
    device = ReferenceDevice(blas_threads=1)
    with Session(fc_model(), device) as s:
        out = s.run([np.arange(4, dtype=np.float32).reshape(1, 4)])
    device.close()
    assert seen == [1]
    np.testing.assert_array_equal(out["output_0"], [[0, 1, 2, 3]])
    assert blas.get_threads() == before


def test_no_limit_without_gemms_or_when_disabled(seen):
    for model, threads in ((add_model(), 1), (fc_model(), 0)):
        device = ReferenceDevice(blas_threads=threads)
        with Session(model, device) as s:
            s.run([np.ones(2, np.float32)] * 2 if threads else [np.ones((1, 4), np.float32)])
        device.close()
    assert seen == []


def test_the_environment_sets_the_default(monkeypatch):
    for text, expected in (("0", 0), ("2", 2), ("junk", 1)):
        monkeypatch.setenv("NNHAL_BLAS_THREADS", text)
        device = ReferenceDevice()
        device.close()
        assert device.blas_threads == expected
