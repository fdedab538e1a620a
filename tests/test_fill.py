"""A large file's bytes copied into its frame on a native thread while the open goes on
(nnhal.memory.fill). What could go wrong: a page read before its turn reading as zeros, a
file that changes meanwhile passing for the file, a frame freed under the copy, two waiters
freeing the fill twice, a reader left waiting for ever."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from nnhal.memory import fill
from nnhal.memory.frame import Frame

SIZE = 24 << 20  # ~10 ms to copy here: time enough to touch and to change the file meanwhile


def _need_fill() -> None:
    if not fill.available():
        pytest.skip(f"native fill unavailable here: {fill.status()}")


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[Path, bytes]:
    data = np.random.default_rng(5).integers(0, 256, SIZE, np.uint8).tobytes()
    path = tmp_path_factory.mktemp("fill") / "big.bin"
    path.write_bytes(data)
    return path, data


def _filled(path: Path) -> Frame:
    frame = Frame.read(path)
    assert isinstance(frame, Frame)
    if frame._fill is None:
        pytest.skip(f"the frame was read the plain way: {fill.status() or 'memory in use'}")
    return frame


def test_pages_read_out_of_turn_hold_the_files_bytes(big):
    _need_fill()
    path, data = big
    frame = _filled(path)
    view = frame.content
    picks = [SIZE - 5, SIZE // 2, 7 << 20, SIZE - (1 << 20), 3 << 20, 123_457]
    for at in picks:  # (every one before the in-order copy can have got there)
        assert view[at] == data[at]
    frame.settle()
    err, got, served = frame._fill.wait(0)
    assert err == 0 and served >= 1  # some were filled out of turn, for the reads above
    assert frame.content == data


def test_a_file_cut_short_while_copied_is_an_error_not_zeros(big, tmp_path):
    _need_fill()
    path = tmp_path / "cut.bin"
    path.write_bytes(big[1])
    frame = _filled(path)
    os.truncate(path, SIZE // 3)  # long before the copy gets there
    with pytest.raises(OSError, match="changed while it was read"):
        frame.settle()


def test_a_file_grown_while_copied_is_an_error(big, tmp_path):
    _need_fill()
    path = tmp_path / "grown.bin"
    path.write_bytes(big[1])
    frame = _filled(path)
    with open(path, "ab") as f:
        f.write(b"more")
    with pytest.raises(OSError, match="changed while it was read"):
        frame.settle()


def test_a_tflite_cut_short_while_read_says_so(tmp_path):
    """The importer settles the frame before it reports: not 'corrupted', and never a model
    built from zeros."""
    _need_fill()
    from nnhal.errors import ModelFileError
    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import OperandType as T
    from nnhal.hal.types import OperationType as O
    from nnhal.tflite import read_tflite, write_tflite

    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 1024])
    y = b.output(T.TENSOR_FLOAT32, [1, 2048])
    w = np.random.default_rng(1).standard_normal((2048, 1024)).astype(np.float32)
    b.operation(O.FULLY_CONNECTED, [x, b.constant(T.TENSOR_FLOAT32, w),
                                    b.constant(T.TENSOR_FLOAT32, np.zeros(2048, np.float32)),
                                    b.scalar(T.INT32, 0)], [y])
    path = tmp_path / "cut.tflite"
    blob = write_tflite(b.build())
    path.write_bytes(blob)
    real = Frame.read.__func__

    def read_then_cut(cls, p):
        frame = real(cls, p)
        os.truncate(p, len(blob) // 2)
        return frame

    Frame.read = classmethod(read_then_cut)  # type: ignore[method-assign]
    try:
        with pytest.raises(ModelFileError, match="changed while it was read"):
            read_tflite(path)
    finally:
        Frame.read = classmethod(real)  # type: ignore[method-assign]


def test_waiters_on_many_threads_free_the_fill_once(big):
    _need_fill()
    path, data = big
    for _ in range(5):
        frame = _filled(path)
        errors: list[BaseException] = []

        def settle(f: Frame = frame, errors: list[BaseException] = errors) -> None:
            try:
                f.settle()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=settle) for _ in range(6)]
        for t in threads:
            t.start()
        frame.settle()
        for t in threads:
            t.join(30)
        assert not errors and frame.content == data


def test_a_frame_dropped_mid_copy_keeps_its_memory_until_done(big):
    _need_fill()
    path, data = big
    for _ in range(8):
        Frame.read(path)  # dropped at once: the copy into it goes on
        gc.collect()
    frame = _filled(path)
    frame.settle()
    assert frame.content == data
    fill._drain(30)
    gc.collect()
    with fill._lock:
        assert all(f._result is not None for f in fill._running)


def test_without_native_code_a_file_is_read_the_plain_way(big, monkeypatch):
    path, data = big
    monkeypatch.setattr(fill, "_state", {})
    monkeypatch.setenv("NNHAL_NATIVE", "0")
    frame = Frame.read(path)
    assert frame._fill is None and fill.status() == "disabled by NNHAL_NATIVE=0"
    frame.settle()  # nothing to wait for
    assert frame.content == data


def test_pages_wanted_are_copied_in_at_once_with_the_files_bytes(big):
    """Frame.want: the pages holding the offsets asked for are there before they are read,
    with the file's bytes, and reading them waits for no fault; offsets outside the file are
    ignored; once the fill is done, asking is nothing."""
    _need_fill()
    path, data = big
    frame = _filled(path)
    picks = np.array([SIZE - 5, SIZE // 2, 7 << 20, SIZE - (1 << 20), 3 << 20, 123_457,
                      -9, SIZE + 4096, 1 << 40], np.int64)
    frame.want(picks)
    view = frame.content
    for at in picks[:6]:
        assert view[int(at)] == data[int(at)]
    frame.settle()
    err, _, served = frame._fill.wait(0)
    assert err == 0 and served == 0  # no read above faulted: each page was there
    assert frame.content == data
    frame.want(picks)  # done: nothing to do, nothing to fail


def test_wanting_while_another_thread_waits_for_the_fill_is_left_to_the_faults(big):
    _need_fill()
    path, data = big
    frame = _filled(path)
    holding = frame._fill._waiting
    assert holding.acquire(blocking=False)  # as a waiter inside the library would hold it
    try:
        frame.want(np.array([SIZE // 2], np.int64))  # must neither block nor touch the fill
    finally:
        holding.release()
    assert frame.content[SIZE // 2] == data[SIZE // 2]
    frame.settle()


def test_the_buffer_tables_hint_reads_nothing_out_of_place():
    """schema._buffer_tables reads the file before it is verified: any bytes give an array of
    offsets inside the file (or none), never an exception."""
    from nnhal.tflite.schema import _buffer_tables

    rng = np.random.default_rng(0)
    for n in (0, 3, 8, 16, 64, 4096):
        for _ in range(50):
            data = rng.integers(0, 256, n, np.uint8).tobytes()
            found = _buffer_tables(data)
            assert found.dtype == np.int64 and np.all((found >= 0) & (found < max(n, 1)))
    real = (Path(__file__).parent / "tflite" / "data" / "xla_float.tflite").read_bytes()
    import tflite

    m = tflite.Model.GetRootAsModel(real, 0)
    want = sorted(m.Buffers(i)._tab.Pos for i in range(m.BuffersLength()))
    assert sorted(_buffer_tables(real).tolist()) == want
    assert _buffer_tables(real[:len(real) // 2]).size == 0 or \
        np.all(_buffer_tables(real[:len(real) // 2]) < len(real) // 2)


def test_the_buffer_tables_hint_is_bounded_by_what_the_verifier_takes():
    """A file that claims more Buffer tables than the verifier takes gives no hint (it is
    refused next): no array of a million offsets made for it."""
    import struct

    from nnhal.tflite.schema import _buffer_tables
    from nnhal.tflite.verify import MAX_TABLES

    data = bytearray(4 * MAX_TABLES + 4096)
    struct.pack_into("<I", data, 0, 8)          # root: the Model table at 8
    struct.pack_into("<i", data, 8, 8 - 200)    # its vtable at 200
    struct.pack_into("<HH", data, 200, 14, 16)  # vtable: 14 bytes, table of 16
    struct.pack_into("<H", data, 212, 4)        # field 4 (buffers) at table + 4
    struct.pack_into("<I", data, 12, 300)       # -> the vector at 312
    for count in (3, MAX_TABLES + 1):
        struct.pack_into("<I", data, 312, count)
        found = _buffer_tables(bytes(data))
        assert found.size == (3 if count == 3 else 0)
