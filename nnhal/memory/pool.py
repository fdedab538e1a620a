"""Shared-memory pools of the kinds the HAL memory guide names.

``ashmem`` and ``hardware_buffer_blob`` are anonymous shared memory (``memfd`` on Linux);
``mmap_fd`` maps a caller's file descriptor at an offset. Each pool is mapped once, lazily, and
read and written through numpy views without copies. Every access is bounds-checked, so a bad
location in a model or request is an error status, never an out-of-range read or write.

**A client may shrink its memory** (``os.ftruncate``) after the driver mapped it; touching a
mapped page beyond the new end of the file then kills the process with SIGBUS, which Python
cannot catch. So the driver checks that the file still covers the region before it touches a
mapping: :meth:`SharedMemory.array` checks on every call (every driver path but executions
uses it), and an execution checks all its request memories at once, right before it runs,
with :func:`shrunk_memory` (it maps them with the unchecked :meth:`SharedMemory.mapped`). The
check is one ``pread`` of the region's last byte (empty past the end of the file): it neither
moves the file offset the client may share nor costs a ``stat`` (about half the time here).
A shrink *during* the very execution that touches the memory still faults: only sealing the
memory closes that window. A memory whose file was sealed against shrinking
(``F_SEAL_SHRINK``, e.g. by the client that created it) before it was mapped is never checked:
its size cannot go below the one verified when mapping. Anonymous memories are created with
``MFD_ALLOW_SEALING`` so that their creator may seal them.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

ASHMEM = "ashmem"
MMAP_FD = "mmap_fd"
HARDWARE_BUFFER_BLOB = "hardware_buffer_blob"
#: Memory names a driver must be able to map (the memory guide: ashmem, mmap_fd, and since
#: 1.3 hardware_buffer_blob).
SUPPORTED_NAMES = (ASHMEM, MMAP_FD, HARDWARE_BUFFER_BLOB)


#: The largest file size (off_t): ``ftruncate`` past it raises OverflowError, not OSError.
MAX_FILE_BYTES = (1 << 63) - 1


class MemoryError_(Exception):
    """A memory could not be mapped, or an access fell outside it."""


class SharedMemory:
    """``hidl_memory``: a named, sized region backed by a file descriptor.

    The descriptor is owned by this object (closed by :meth:`close`); ``offset`` is where the
    region starts in the file, which need not be page-aligned.
    """

    def __init__(self, name: str, fd: int, size: int, offset: int = 0, *, owns_fd: bool = True):
        self.name = name
        self._fd = fd
        self.size = int(size)
        self.offset = int(offset)
        self._owns_fd = owns_fd
        self._lock = threading.Lock()
        self._mmap: mmap.mmap | None = None
        self._array: np.ndarray | None = None
        self._closed = False
        #: The file offset of the region's last byte: the file must reach it.
        self._last = self.offset + self.size - 1
        #: The file was sealed against shrinking before it was mapped: no check needed.
        self._fixed = False
        #: The file was sealed against writing and shrinking before it was mapped: its bytes
        #: can never change (mapped read-only; see :attr:`immutable`).
        self._frozen = False
        #: (frame, region offset): the region's bytes from that offset are also a frame's
        #: file bytes in this process (nnhal.memory.frame), which a driver's export may build
        #: around instead of copying. Never sent anywhere; None for any other memory.
        self.frame: tuple[Any, int] | None = None

    @property
    def fd(self) -> int:
        """The file descriptor (a subclass may make it on first use: FramedMemory)."""
        return self._fd

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def ashmem(cls, size: int, name: str = ASHMEM, *, sealed: bool = False) -> SharedMemory:
        """Anonymous shared memory of ``size`` bytes (zero-filled). ``sealed``: sealed against
        shrinking at once (``F_SEAL_SHRINK``; growing stays allowed), so that no one can ever
        shrink it and executions skip their size check of it (one syscall per memory and
        execution): for creators that never shrink their memories."""
        if size < 0:
            raise MemoryError_("negative size")
        if size > MAX_FILE_BYTES:
            raise MemoryError_(f"size {size} is past what a file can hold ({MAX_FILE_BYTES})")
        fd = os.memfd_create(f"nnhal-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            if sealed:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        except OSError:
            os.close(fd)
            raise
        return cls(name, fd, size)

    @classmethod
    def hardware_buffer_blob(cls, size: int) -> SharedMemory:
        """An AHardwareBuffer of format BLOB: on a Linux host, shared memory of that name."""
        return cls.ashmem(size, HARDWARE_BUFFER_BLOB)

    @classmethod
    def mmap_fd(cls, fd: int, size: int, offset: int = 0, *, dup: bool = True) -> SharedMemory:
        """Map ``size`` bytes of an open file from ``offset``; the fd is duplicated by default."""
        if size < 0 or offset < 0:
            raise MemoryError_("negative size or offset")
        return cls(MMAP_FD, os.dup(fd) if dup else fd, size, offset)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, name: str = ASHMEM) -> SharedMemory:
        return cls.from_parts(len(data), [(0, data)] if len(data) else [], name)

    @classmethod
    def from_parts(cls, size: int, parts: Sequence[tuple[int, Any]], name: str = ASHMEM, *,
                   seal: bool = False) -> SharedMemory:
        """Anonymous shared memory of ``size`` bytes holding each ``(offset, data)`` part
        (bytes-like, or a C-contiguous array), zeros elsewhere. Written with ``pwrite``,
        unmapped: the kernel fills its pages directly, where copying through a fresh mapping
        takes a page fault per page in this process (several times the copy itself for
        megabytes of weights). ``seal``: then sealed against writing, shrinking and growing,
        by anyone, for good (:attr:`immutable`; a model's constants, which every reader may
        then view instead of copying)."""
        mem = cls.ashmem(size, name)
        try:
            _write_parts(mem.fd, parts, size)
            if seal:
                _seal_all(mem.fd)
        except BaseException:
            mem.close()
            raise
        return mem

    # ---- mapping -----------------------------------------------------------------------
    def array(self) -> np.ndarray:
        """The whole region as a writable uint8 array (mapped on first use).

        Raises MemoryError_ when the memory is closed, cannot be mapped, or its file no longer
        covers the region (it was shrunk after being mapped: touching it would fault).
        """
        arr = self._array
        if arr is None:
            arr = self.mapped()
        elif self._mmap is not None:
            self.check_size()
        return arr

    def mapped(self) -> np.ndarray:
        """As :meth:`array`, without checking the file's size once mapped: for callers that
        call :meth:`check_size` (or :func:`shrunk_memory`) right before touching the bytes."""
        arr = self._array
        if arr is not None:
            return arr
        with self._lock:
            if self._closed:
                raise MemoryError_("memory is closed")
            if self._array is None:
                self._array = self._map()
            return self._array

    def check_size(self) -> None:
        """Raise MemoryError_ if the file no longer covers the mapped region."""
        why = self._shrunk()
        if why is not None:
            raise MemoryError_(why)

    def _shrunk(self) -> str | None:
        if self._mmap is None or self._closed or self._fixed:
            # Not mapped: nothing to fault (mapping checks the size). Closed: the descriptor
            # may already name another file; the mapping keeps its own reference. Fixed: its
            # file cannot shrink.
            return None
        try:
            if os.pread(self._fd, 1, self._last):
                return None
            size = os.fstat(self._fd).st_size
        except OSError as e:
            return f"{self!r}: cannot check its size: {e}"
        return (f"{self!r} was shrunk: its file now ends at {size}, the region at "
                f"{self._last + 1}")

    def _map(self) -> np.ndarray:
        if self.name not in SUPPORTED_NAMES:
            raise MemoryError_(f"unsupported memory name {self.name!r}")
        if self.size == 0:
            return np.zeros(0, dtype=np.uint8)
        seals = _seals(self._fd)  # first: a size read after the seal is final
        fixed = bool(seals & _SEAL_SHRINK)
        frozen = fixed and bool(seals & _SEAL_WRITE)
        try:
            file_size = os.fstat(self._fd).st_size
        except OSError as e:
            raise MemoryError_(f"bad file descriptor: {e}") from e
        if self.offset + self.size > file_size:
            raise MemoryError_(
                f"region [{self.offset}, {self.offset + self.size}) beyond file size {file_size}")
        start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        skip = self.offset - start
        try:
            if frozen:
                # A write-sealed file cannot be mapped writable (and need not be). Its pages
                # are mapped as they are first read, not populated at once: a reader of
                # every page pays about the same either way (the kernel maps the pages
                # around each fault; 14 MB: 0.7-1.2 ms of faults against 0.9-1.6 ms to
                # populate, 52 MB: 4.0-4.3 against 5.4-6.0), and a model whose weights an
                # engine takes from the file's frame (nnhal.memory.frame) reads only its
                # small constants here.
                mm = mmap.mmap(self._fd, skip + self.size, offset=start, prot=mmap.PROT_READ,
                               flags=mmap.MAP_SHARED)
            else:
                mm = mmap.mmap(self._fd, skip + self.size, offset=start)
        except (OSError, ValueError) as e:
            raise MemoryError_(f"cannot map memory: {e}") from e
        self._mmap = mm
        self._fixed = fixed
        self._frozen = frozen
        return np.frombuffer(mm, dtype=np.uint8, count=self.size, offset=skip)

    @property
    def immutable(self) -> bool:
        """Whether the bytes can never change: the file was sealed against writing and
        shrinking (:meth:`from_parts` with ``seal``) before it was mapped, and is mapped
        read-only. A reader may then keep views of it instead of copies. False until mapped."""
        return self._frozen

    def view(self, offset: int, length: int) -> np.ndarray:
        """Bytes ``[offset, offset + length)`` as a uint8 view, bounds-checked."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise MemoryError_(
                f"access [{offset}, {offset + length}) outside memory of size {self.size}")
        return self.array()[offset:offset + length]

    def read(self, offset: int, length: int) -> bytes:
        return self.view(offset, length).tobytes()

    def write(self, offset: int, data: bytes | np.ndarray) -> None:
        buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) \
            else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.view(offset, buf.size)[:] = buf

    def close(self) -> None:
        """Release the mapping and the descriptor. Views still held keep the pages alive."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._array = None
            mm, self._mmap = self._mmap, None
            if mm is not None:
                try:
                    mm.close()
                except BufferError:
                    pass  # numpy views still reference it; it is freed with them
            if self._owns_fd:
                try:
                    os.close(self._fd)
                except OSError:
                    pass

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> SharedMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"SharedMemory({self.name!r}, size={self.size}, offset={self.offset})"


def _part_view(offset: int, data: Any, size: int | None) -> memoryview:
    """``data`` (bytes-like, or a C-contiguous array) as bytes, checked to fit at ``offset``."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    view = memoryview(data).cast("B")
    if offset < 0 or (size is not None and offset + len(view) > size):
        raise MemoryError_(f"part [{offset}, {offset + len(view)}) outside memory of size "
                           f"{size}")
    return view


def _write_part(fd: int, offset: int, data: Any, size: int | None = None) -> None:
    """``data`` (bytes-like, or a C-contiguous array) at ``offset`` of file ``fd``."""
    view = _part_view(offset, data, size)
    while len(view):
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


#: Buffers per ``pwritev`` (the system's IOV_MAX, at most 1024).
_IOV_MAX = max(2, min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16, 1024))
#: A gap this small between consecutive parts is written as zeros, keeping one ``pwritev``.
_MAX_GAP = 64
_ZEROS = bytes(_MAX_GAP)


def _write_parts(fd: int, parts: Sequence[tuple[int, Any]], size: int | None = None) -> None:
    """Each ``(offset, data)`` part at its offset of file ``fd``: runs of nearly adjacent
    parts (a model's aligned constants) in one ``pwritev`` each, so a hundred weights cost a
    few system calls and GIL hand-overs instead of a hundred (on a writer thread, each
    hand-over could stall the converting thread)."""
    if not hasattr(os, "pwritev"):
        for offset, data in parts:
            _write_part(fd, offset, data, size)
        return
    run: list[Any] = []
    start = end = 0
    for offset, data in parts:
        view = _part_view(offset, data, size)
        if not len(view):
            continue
        if run and (offset < end or offset - end > _MAX_GAP or len(run) >= _IOV_MAX - 1):
            _pwritev_all(fd, run, start)
            run = []
        if not run:
            start = end = offset
        if offset > end:
            run.append(_ZEROS[:offset - end])
        run.append(view)
        end = offset + len(view)
    if run:
        _pwritev_all(fd, run, start)


def _pwritev_all(fd: int, bufs: list[Any], offset: int) -> None:
    """``bufs`` back to back from ``offset``; what one ``pwritev`` leaves (a short write)
    written piece by piece."""
    written = os.pwritev(fd, bufs, offset)
    pos = 0
    for buf in bufs:
        n = len(buf)
        if pos + n > written:
            skip = max(written - pos, 0)
            _write_part(fd, offset + pos + skip, memoryview(buf)[skip:])
        pos += n


def _seal_all(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK
                | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)


class PartsWriter:
    """Anonymous shared memory written part by part on a background thread as the parts
    come (a model's weights while its builder converts the rest: ``pwrite`` releases the
    GIL), then :meth:`finish` as :meth:`SharedMemory.from_parts` would have made it. The
    parts must never change (bytes, or arrays that cannot). A writer dropped unfinished
    closes its file once its writes are done (each holds the writer)."""

    _pool: Any = None
    _pool_lock = threading.Lock()

    #: Parts are handed to the thread in batches of about this many bytes (one job, a few
    #: ``pwritev`` calls each), not one by one.
    BATCH_BYTES = 1 << 22

    def __init__(self, name: str = ASHMEM):
        self.name = name
        self.fd = os.memfd_create(f"nnhal-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._writes: list[Any] = []
        self._pending: list[tuple[int, Any]] = []
        self._pending_bytes = 0

    @classmethod
    def _executor(cls) -> Any:
        with cls._pool_lock:
            if cls._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                cls._pool = ThreadPoolExecutor(1, thread_name_prefix="nnhal-pool-writer")
            return cls._pool

    def write(self, offset: int, data: Any) -> None:
        """Queue ``data`` for ``offset``; written with the batch it completes (or at
        :meth:`finish`)."""
        self._pending.append((offset, data))
        self._pending_bytes += data.nbytes if isinstance(data, np.ndarray) else len(data)
        if self._pending_bytes >= self.BATCH_BYTES:
            self._flush()

    def flush(self) -> None:
        """Hand the parts queued so far to the writer thread now (not with a later batch)."""
        self._flush()

    def _flush(self) -> None:
        if self._pending:
            parts = self._pending
            self._pending, self._pending_bytes = [], 0
            try:
                self._writes.append(self._executor().submit(PartsWriter._run, self, parts))
            except RuntimeError:  # no thread (the interpreter is exiting): written here
                _write_parts(self.fd, parts)

    @staticmethod
    def _run(writer: PartsWriter, parts: list[tuple[int, Any]]) -> None:
        _write_parts(writer.fd, parts)

    def finish(self, size: int, *, seal: bool = False) -> SharedMemory:
        """The memory of ``size`` bytes holding every part written (zeros elsewhere);
        raises what a write raised."""
        try:
            self._flush()
        except BaseException:
            self._close()
            raise
        writes, self._writes = self._writes, []
        try:
            for w in writes:
                w.result()
            os.ftruncate(self.fd, size)
            if seal:
                _seal_all(self.fd)
        except BaseException:
            self._close()
            raise
        mem = SharedMemory(self.name, self.fd, size)
        self.fd = -1
        return mem

    def _close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        self._close()  # every write (each holds the writer) is done by now


_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0)
_SEAL_WRITE = getattr(fcntl, "F_SEAL_WRITE", 0)


def _seals(fd: int) -> int:
    """The file's seals (a memfd's F_SEAL_*; 0 for any other file): seals are final."""
    try:
        return int(fcntl.fcntl(fd, fcntl.F_GET_SEALS))
    except (OSError, AttributeError, ValueError):  # not a memfd, or no seals on this system
        return 0



def shrunk_memory(pools: list[object] | tuple[object, ...]) -> str | None:
    """Why one of a request's pools (shared memories, bare or in a MemoryPool; tokens and
    anything else are skipped) may not be touched: its file was shrunk below its mapped region;
    None when all may. One ``pread`` per mapped memory."""
    for pool in pools:
        mem = pool if type(pool) is SharedMemory else getattr(pool, "hidl_memory", None)
        if isinstance(mem, SharedMemory) and mem._mmap is not None and not mem._fixed:
            try:
                if os.pread(mem._fd, 1, mem._last):
                    continue
            except OSError:
                pass
            why = mem._shrunk()
            if why is not None:
                return why
    return None


#: What :func:`shrunk_watched` checks: (descriptor, file offset of the region's last byte,
#: memory) per memory.
Watch = tuple[tuple[int, int, SharedMemory], ...]


def watch_of(memories: list[object] | tuple[object, ...]) -> Watch:
    """The memories among ``memories`` (shared memories, bare or in a MemoryPool) that are
    mapped and may shrink, for :func:`shrunk_watched`: a request bound once and run many times
    decides this once (a memory sealed against shrinking before it was mapped never needs a
    check; one not mapped yet is checked when mapped)."""
    found = []
    for pool in memories:
        mem = pool if type(pool) is SharedMemory else getattr(pool, "hidl_memory", None)
        if isinstance(mem, SharedMemory) and mem._mmap is not None and not mem._fixed:
            found.append((mem._fd, mem._last, mem))
    return tuple(found)


def shrunk_watched(watch: Watch, _pread: object = os.pread) -> str | None:
    """As :func:`shrunk_memory`, for a :func:`watch_of` list: one ``pread`` per memory."""
    for fd, last, mem in watch:
        try:
            if _pread(fd, 1, last):  # type: ignore[operator]
                continue
        except OSError:
            pass
        why = mem._shrunk()  # closed meanwhile (nothing to check) or shrunk
        if why is not None:
            return why
    return None
