"""A model file read into a frame (nnhal.memory.frame): its bytes read once, and LiteRT's
flatbuffer built around them in place, so the weights are never copied for the export. What
could go wrong: a frame written where a view of the file lies, an export claiming a frame
twice, an engine given the frame running anything but the file's model."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.memory import frame as fr
from nnhal.memory.frame import HEAD, MIN_FRAMED, Frame
from nnhal.tflite import read_tflite, write_tflite

X = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    """A .tflite past MIN_FRAMED, mostly float32 weights stored as the HAL takes them."""
    rng = np.random.default_rng(7)
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2, 512])
    h = b.operand(T.TENSOR_FLOAT32, [2, 640])
    w1 = rng.standard_normal((640, 512)).astype(np.float32)
    b.operation(O.FULLY_CONNECTED, [x, b.constant(T.TENSOR_FLOAT32, w1),
                                    b.constant(T.TENSOR_FLOAT32, rng.standard_normal(640)
                                               .astype(np.float32)),
                                    b.scalar(T.INT32, 1)], [h])
    y = b.output(T.TENSOR_FLOAT32, [2, 10])
    w2 = rng.standard_normal((10, 640)).astype(np.float32)
    b.operation(O.FULLY_CONNECTED, [h, b.constant(T.TENSOR_FLOAT32, w2),
                                    b.constant(T.TENSOR_FLOAT32, np.ones(10, np.float32)),
                                    b.scalar(T.INT32, 0)], [y])
    path = tmp_path_factory.mktemp("frame") / "weights.tflite"
    path.write_bytes(write_tflite(b.build()))
    assert path.stat().st_size > MIN_FRAMED
    return path


def _run_litert(**where) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(**where, num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], X)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"]).copy()


def test_a_large_file_is_framed_and_a_small_one_is_not(weights_file, tmp_path):
    framed = Frame.read(weights_file)
    assert isinstance(framed, Frame)
    data = weights_file.read_bytes()
    assert framed.content == data and framed.content.readonly
    assert framed.buffer[:HEAD] == bytes(HEAD) and framed.room >= fr.tail_room(len(data))
    small = tmp_path / "small.tflite"
    small.write_bytes(data[:1000])
    assert Frame.read(small) == data[:1000]


def test_a_frame_is_written_once_and_never_over_the_file(weights_file):
    frame = Frame.read(weights_file)
    with pytest.raises(ValueError):
        frame.write(0, b"TFL3")  # not claimed yet
    assert frame.claim() and not frame.claim()
    for at in (-2, HEAD - 2, HEAD, HEAD + frame.size - 1, len(frame.buffer) - 3):
        with pytest.raises(ValueError):
            frame.write(at, b"abcd")  # over the file's bytes, or past the end
    frame.write(4, b"TFL3")
    frame.write(frame.tail, b"tables")
    assert frame.buffer[4:8] == b"TFL3" and frame.buffer[frame.tail:frame.tail + 6] == b"tables"
    view = frame.content
    with pytest.raises(ValueError):
        frame.trim(frame.tail - 1)  # into the file's bytes
    frame.trim(frame.tail + 8)
    assert len(frame.buffer) == frame.tail + 8 and frame.buffer.endswith(b"tables\0\0")
    assert view == frame.content == weights_file.read_bytes()
    with pytest.raises(ValueError):
        frame.write(frame.tail + 8, b"x")  # past the length now


def test_a_file_changing_size_while_read_is_read_plain(weights_file, monkeypatch):
    real = os.fstat

    class Shorter:
        def __init__(self, st):
            self.st_mode = st.st_mode
            self.st_size = st.st_size - 100  # the file "grew" by 100 bytes after the stat

    monkeypatch.setattr(fr.os, "fstat", lambda fd: Shorter(real(fd)))
    monkeypatch.setattr(fr.fill, "start", lambda *a: None)  # the plain way (a fill: test_fill)
    assert Frame.read(weights_file) == weights_file.read_bytes()


def test_litert_export_is_built_around_the_weights(weights_file):
    pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert not installed")
    imported = read_tflite(weights_file)
    (pool,) = imported.model.pools
    frame = pool.frame[0]
    out = write_tflite(imported, data_outside=True, in_frame=True)
    assert out is frame.buffer  # the weights where the file put them: nothing copied
    assert frame.tail < len(out) < frame.tail + fr.tail_room(frame.size)  # the room cut off
    assert out[:4] != bytes(4) and out[4:8] == b"TFL3"
    assert frame.content == weights_file.read_bytes()  # the file's bytes untouched
    peer = _run_litert(model_path=str(weights_file))
    np.testing.assert_array_equal(_run_litert(model_content=out), peer)
    again = write_tflite(imported, data_outside=True, in_frame=True)
    assert again is not frame.buffer  # claimed once: the second export copies
    np.testing.assert_array_equal(_run_litert(model_content=again), peer)


def test_no_room_means_a_copy(weights_file, monkeypatch):
    pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert not installed")
    monkeypatch.setattr(fr, "tail_room", lambda size: 64)
    imported = read_tflite(weights_file)
    frame = imported.model.pools[0].frame[0]
    out = write_tflite(imported, data_outside=True, in_frame=True)
    assert out is not frame.buffer and frame.claim()  # not claimed by the export
    np.testing.assert_array_equal(_run_litert(model_content=out),
                                  _run_litert(model_path=str(weights_file)))


def test_session_runs_the_framed_export(weights_file, tmp_path, monkeypatch):
    from nnhal.drivers.litert import unavailable

    if unavailable() is not None:
        pytest.skip(f"LiteRT driver unavailable: {unavailable()}")
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path / "cache"))
    from nnhal import Session

    with Session(weights_file, device="litert") as s:
        (pool,) = s.model.pools
        assert not pool.frame[0].claim()  # the driver's export claimed it
        got = s.run({s.inputs[0].name: X})
    np.testing.assert_array_equal(next(iter(got.values())),
                                  _run_litert(model_path=str(weights_file)))


def test_no_memory_for_the_frame_is_a_read_error(weights_file, monkeypatch):
    from nnhal.errors import ModelFileError

    monkeypatch.setattr(fr, "tail_room", lambda size: 1 << 60)
    with pytest.raises(OSError, match="not enough memory"):
        Frame.read(weights_file)
    with pytest.raises(ModelFileError, match="cannot read: not enough memory"):
        read_tflite(weights_file)


def test_only_a_regular_file_is_read(tmp_path):
    from nnhal.errors import ModelFileError

    fifo = tmp_path / "model.tflite"
    os.mkfifo(fifo)  # no writer: an open that blocked would wait for ever
    with pytest.raises(ModelFileError, match="cannot read: not a regular file"):
        read_tflite(fifo)
    with pytest.raises(ModelFileError, match="cannot read: not a regular file"):
        read_tflite("/dev/zero")  # a read that never ends
    with pytest.raises(ModelFileError, match="is a directory"):
        read_tflite(tmp_path)
    with pytest.raises(ModelFileError, match="no such file"):
        read_tflite(tmp_path / "absent.tflite")


def _memfd_bytes(fd: int, size: int) -> bytes:
    import mmap

    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
        return bytes(m)


def test_the_pool_of_a_framed_model_is_the_frame(weights_file):
    import fcntl

    from nnhal.memory.frame import FramedMemory

    imported = read_tflite(weights_file)
    (pool,) = imported.model.pools
    assert isinstance(pool, FramedMemory) and pool.frame[1] == 0
    frame = pool.frame[0]
    arr = pool.array()
    data = weights_file.read_bytes()
    assert arr[:frame.size].tobytes() == data and pool.size >= frame.size
    assert pool.immutable and not arr.flags.writeable  # the file's bytes are never written
    assert arr.ctypes.data == np.frombuffer(frame.buffer, np.uint8).ctypes.data + HEAD
    assert pool._fd == -1  # no copy until a descriptor is asked for
    fd = pool.fd
    assert fd >= 0 and pool.fd == fd  # made once
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SHRINK
    assert _memfd_bytes(fd, pool.size) == arr.tobytes()
    pool.close()
    assert pool.closed and pool.fd == -1
    with pytest.raises(Exception, match="closed"):
        pool.array()


def _builder_on(frame: Frame, own: np.ndarray) -> tuple[ModelBuilder, int]:
    """x + (a weight of the file) + ``own`` (a constant of the builder's own)."""
    b = ModelBuilder()
    b.use_source(frame)
    weight = np.frombuffer(frame.buffer, np.float32, own.size, HEAD + 1024)
    x = b.input(T.TENSOR_FLOAT32, list(own.shape))
    h = b.operand(T.TENSOR_FLOAT32, list(own.shape))
    y = b.output(T.TENSOR_FLOAT32, list(own.shape))
    w = b.constant(T.TENSOR_FLOAT32, weight.reshape(own.shape))
    c = b.constant(T.TENSOR_FLOAT32, own)
    b.operation(O.ADD, [x, w, b.scalar(T.INT32, 0)], [h])
    b.operation(O.ADD, [h, c, b.scalar(T.INT32, 0)], [y])
    return b, c


def test_a_models_own_constants_lie_after_the_file(weights_file):
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.memory.frame import FramedMemory
    from nnhal.session import Session

    frame = Frame.read(weights_file)
    own = np.arange(4096, dtype=np.float32)
    b, c = _builder_on(frame, own)
    model = b.build()
    (pool,) = model.pools
    assert isinstance(pool, FramedMemory)
    loc = model.main.operands[c].location
    assert loc.offset >= frame.size and frame.tail >= HEAD + loc.offset + own.nbytes
    assert pool.array()[loc.offset:loc.offset + own.nbytes].tobytes() == own.tobytes()
    assert frame.content.tobytes() == weights_file.read_bytes()  # the file's bytes as read
    x = np.ones(own.size, np.float32)
    with Session(model, ReferenceDevice()) as s:
        got = next(iter(s.run({s.inputs[0].name: x}).values()))
    weight = np.frombuffer(frame.buffer, np.float32, own.size, HEAD + 1024)
    np.testing.assert_array_equal(got, x + weight + own)


def test_own_constants_past_the_room_make_the_pool_a_memfd(weights_file, monkeypatch):
    from nnhal.memory.frame import FramedMemory

    frame = Frame.read(weights_file)
    own = np.arange(fr.tail_room(frame.size) // 8 + 16, dtype=np.float32)  # over half
    b, c = _builder_on(frame, own)
    model = b.build()
    (pool,) = model.pools
    assert not isinstance(pool, FramedMemory) and pool.fd >= 0
    assert pool.frame == (frame, 0)  # still known, for an export built around the file
    loc = model.main.operands[c].location
    got = _memfd_bytes(pool.fd, pool.size)
    assert got[:frame.size] == weights_file.read_bytes()
    assert got[loc.offset:loc.offset + own.nbytes] == own.tobytes()
    assert frame.tail == -(-(HEAD + frame.size) // 64) * 64  # nothing was put after the file


def test_a_second_model_on_one_frame_never_writes_the_firsts_pool(weights_file):
    frame = Frame.read(weights_file)
    first, c1 = _builder_on(frame, np.full(256, 1, np.float32))
    m1 = first.build()
    before = m1.pools[0].array().tobytes()
    second, c2 = _builder_on(frame, np.full(256, 2, np.float32))
    m2 = second.build()
    assert m1.pools[0].array().tobytes() == before
    loc = m2.main.operands[c2].location
    assert np.frombuffer(m2.pools[0].read(loc.offset, loc.length), np.float32).tolist() == \
        [2.0] * 256
