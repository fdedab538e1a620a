"""The LiteRT driver's flatbuffer as a sealed in-memory file the interpreter maps, written
in two parts at once: the weights on a thread of their own (copied from the model's pools by
the kernel where they are views of one: no page of them passes through Python), the tables
on the caller's, each to its place in the file (:func:`nnhal.tflite.export_fb.outside_plan`).

Against one ``bytes`` object joined from the tables and the weights, the caller no longer
copies the weights itself (a 14 MB model: its largest single cost of an export in a fresh
process, the copy's page faults included) and the interpreter maps the file instead of
holding a copy of its own. Small models, or a system without memfd, get the bytes.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.drivers.common.private_store import StoredFile
from nnhal.memory import MemoryError_, SharedMemory
from nnhal.tflite.export_fb import ModelDef, outside_plan, serialise, serialise_tables

#: Below this much constant data the flatbuffer is one bytes object (a file costs more).
MIN_FILE_BYTES = 1 << 20


def flatbuffer_of(converted: ModelDef, pools: Sequence[Any]) -> bytes | StoredFile:
    """``converted`` written with its data after the flatbuffer: a sealed memfd holding it
    (the weights copied from ``pools`` where they are views of a mapped one), or its bytes
    for a small model or when no such file can be made."""
    data_at, pieces, size = outside_plan(converted)
    if size - data_at < MIN_FILE_BYTES or not hasattr(os, "memfd_create"):
        return serialise(converted, data_outside=True)
    try:
        fd = os.memfd_create("nnhal-litert-model", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return serialise(converted, data_outside=True)
    failed: list[BaseException] = []
    sources = _mapped(pools)

    def weights() -> None:
        try:
            for offset, data in pieces:
                _write(fd, offset, data, sources)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            failed.append(e)

    writer = threading.Thread(target=weights, name="nnhal-litert-weights", daemon=True)
    try:
        writer.start()
    except RuntimeError:  # no thread now (the interpreter is exiting)
        weights()
    try:
        tables = serialise_tables(converted, data_at)
    except ValueError:  # tables past the planned room: the one-piece way
        writer.join()
        os.close(fd)
        return serialise(converted, data_outside=True)
    except BaseException:
        writer.join()
        os.close(fd)
        raise
    try:
        _pwrite_all(fd, memoryview(tables), 0)
        writer.join()
        if failed:
            raise failed[0]
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except OSError:
        writer.join()
        os.close(fd)
        return serialise(converted, data_outside=True)
    return StoredFile(fd, size)


def _mapped(pools: Sequence[Any]) -> list[tuple[int, int, int, int]]:
    """(address, size, descriptor, file offset) of each pool already mapped here and sealed
    against writing (what the analysis keeps views of): the weights' possible sources."""
    found = []
    for pool in pools:
        if type(pool) is SharedMemory and pool.immutable and pool.size:
            try:
                arr = pool.array()  # mapped already (immutable says so): the same mapping
            except MemoryError_:
                continue
            found.append((arr.ctypes.data, pool.size, pool.fd, pool.offset))
    return found


def _write(fd: int, offset: int, data: bytes | np.ndarray,
           sources: list[tuple[int, int, int, int]]) -> None:
    """``data`` at ``offset`` of ``fd``: copied file to file by the kernel when it is a view
    of a source, else written."""
    if isinstance(data, np.ndarray):
        n = data.nbytes
        if data.flags.c_contiguous and n:
            addr = data.ctypes.data
            for base, size, src, at in sources:
                if base <= addr and addr + n <= base + size:
                    try:
                        _copy_all(src, at + addr - base, fd, offset, n)
                        return
                    except OSError:
                        break  # no such copy here (an old kernel, another file system)
        view = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    else:
        view = memoryview(data)
    _pwrite_all(fd, view, offset)


def _copy_all(src: int, src_at: int, dst: int, dst_at: int, n: int) -> None:
    done = 0
    while done < n:
        k = os.copy_file_range(src, dst, n - done, src_at + done, dst_at + done)
        if k <= 0:
            raise OSError("copy_file_range copied nothing")
        done += k


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        k = os.pwrite(fd, view, offset)
        view, offset = view[k:], offset + k
