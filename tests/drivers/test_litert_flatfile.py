"""The LiteRT driver's flatbuffer as a sealed file (nnhal.drivers.litert.flatfile): the weights
copied from the model's pool by the kernel while the tables are built, the interpreter
mapping the file; the same results as the bytes it falls back to."""

from __future__ import annotations

import fcntl
import os

import numpy as np
import pytest

from nnhal.drivers.common.private_store import StoredFile
from nnhal.drivers.litert import flatfile, unavailable
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.session import Session
from nnhal.tflite import export_fb

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"LiteRT driver unavailable: {unavailable()}")

RNG = np.random.default_rng(11)
W1 = RNG.standard_normal((64, 32)).astype(np.float32)
W2 = RNG.standard_normal((16, 64)).astype(np.float32)
B1 = RNG.standard_normal(64).astype(np.float32)
X = RNG.standard_normal((2, 32)).astype(np.float32)


def mlp():
    """Two FULLY_CONNECTED layers (weights in the model's sealed pool)."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2, 32])
    h = b.operand(T.TENSOR_FLOAT32, [2, 64])
    b.operation(O.FULLY_CONNECTED, [x, b.constant(T.TENSOR_FLOAT32, W1),
                                    b.constant(T.TENSOR_FLOAT32, B1), b.scalar(T.INT32, 1)], [h])
    y = b.output(T.TENSOR_FLOAT32, [2, 16])
    b.operation(O.FULLY_CONNECTED, [h, b.constant(T.TENSOR_FLOAT32, W2),
                                    b.constant(T.TENSOR_FLOAT32, np.zeros(16, np.float32)),
                                    b.scalar(T.INT32, 0)], [y])
    return b.build()


def expected():
    return np.maximum(X @ W1.T + B1, 0) @ W2.T


def run(model):
    with Session(model, "litert") as s:
        source = s._prepared.plan.engines.source
        return next(iter(s.run([X]).values())), source


def test_a_large_model_runs_from_a_sealed_file_copied_by_the_kernel(monkeypatch):
    monkeypatch.setattr(flatfile, "MIN_FILE_BYTES", 1)
    copied, written = [], []
    copy_all, pwrite_all = flatfile._copy_all, flatfile._pwrite_all
    monkeypatch.setattr(flatfile, "_copy_all",
                        lambda *a: (copied.append(a[-1]), copy_all(*a))[1])
    monkeypatch.setattr(flatfile, "_pwrite_all",
                        lambda fd, v, off: (written.append(len(v)), pwrite_all(fd, v, off))[1])
    got, source = run(mlp())
    np.testing.assert_allclose(got, expected(), rtol=1e-4, atol=1e-4)
    assert isinstance(source, StoredFile)
    seals = fcntl.fcntl(source.fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SHRINK
    assert sum(copied) >= W1.nbytes + W2.nbytes  # the weights: from the pool, file to file
    data = source.read()
    assert data[4:8] == b"TFL3" and len(data) == os.fstat(source.fd).st_size


def test_small_models_and_tables_past_their_room_get_bytes(monkeypatch):
    got, source = run(mlp())  # below MIN_FILE_BYTES
    np.testing.assert_allclose(got, expected(), rtol=1e-4, atol=1e-4)
    assert isinstance(source, bytes)
    monkeypatch.setattr(flatfile, "MIN_FILE_BYTES", 1)

    def too_long(model, data_at):
        raise ValueError("tables past their room")

    monkeypatch.setattr(flatfile, "serialise_tables", too_long)
    got, source = run(mlp())
    np.testing.assert_allclose(got, expected(), rtol=1e-4, atol=1e-4)
    assert isinstance(source, bytes)


def test_a_failed_copy_falls_back_to_writing(monkeypatch):
    """A kernel that cannot copy between these files (EXDEV, ENOSYS...): the weights are
    written from the mapping instead."""
    monkeypatch.setattr(flatfile, "MIN_FILE_BYTES", 1)

    def no_copy(*a):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(flatfile, "_copy_all", no_copy)
    got, source = run(mlp())
    np.testing.assert_allclose(got, expected(), rtol=1e-4, atol=1e-4)
    assert isinstance(source, StoredFile)


def test_the_plan_places_data_past_the_tables():
    from nnhal.analysis import analyse
    from nnhal.tflite.exporter import convert_model

    converted, refused = convert_model(analyse(mlp(), own_constants=False), ["x"], ["y"])
    assert not refused
    data_at, pieces, size = export_fb.outside_plan(converted)
    tables = export_fb.serialise_tables(converted, data_at)
    assert len(tables) <= data_at and data_at % 4096 == 0
    assert [off for off, _ in pieces] == sorted(off for off, _ in pieces)
    assert all(off >= data_at and off % 16 == 0 for off, _ in pieces)
    assert size >= pieces[-1][0] + pieces[-1][1].nbytes
    with pytest.raises(ValueError):
        export_fb.serialise_tables(converted, 64)  # no room below 64 bytes
