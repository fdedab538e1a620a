import os
import tempfile

import numpy as np
import pytest

from nnhal.memory import MemoryError_, SharedMemory


@pytest.mark.parametrize("make", [SharedMemory.ashmem, SharedMemory.hardware_buffer_blob])
def test_anonymous_pools_read_write(make):
    mem = make(64)
    assert mem.name in ("ashmem", "hardware_buffer_blob")
    mem.write(8, np.arange(4, dtype=np.float32))
    view = mem.view(8, 16).view(np.float32)
    assert view.tolist() == [0.0, 1.0, 2.0, 3.0]
    # Views alias the mapping: no copy.
    assert np.shares_memory(mem.view(0, 64), view)
    mem.close()
    assert mem.closed


def test_bounds_are_checked():
    mem = SharedMemory.ashmem(16)
    with pytest.raises(MemoryError_):
        mem.view(8, 9)
    with pytest.raises(MemoryError_):
        mem.view(-1, 2)
    with pytest.raises(MemoryError_):
        mem.write(15, b"ab")
    assert mem.view(16, 0).size == 0


def test_mmap_fd_with_unaligned_offset():
    with tempfile.TemporaryFile() as f:
        data = bytes(range(256)) * 40
        f.write(data)
        f.flush()
        mem = SharedMemory.mmap_fd(f.fileno(), size=100, offset=5000)
        assert mem.name == "mmap_fd"
        assert mem.read(0, 4) == data[5000:5004]
        mem.write(1, b"\xff")
        f.seek(5001)
        assert f.read(1) == b"\xff"
        mem.close()


def test_mmap_fd_beyond_file_is_an_error():
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * 10)
        f.flush()
        mem = SharedMemory.mmap_fd(f.fileno(), size=100, offset=0)
        with pytest.raises(MemoryError_):
            mem.array()
        mem.close()


def test_close_releases_descriptor():
    mem = SharedMemory.ashmem(8)
    fd = mem.fd
    mem.array()
    mem.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(MemoryError_):
        mem.array()
