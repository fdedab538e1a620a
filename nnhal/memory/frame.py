"""A model file read once into memory laid out so that one flatbuffer can later be built
around its bytes in place.

Why: a driver that hands an engine a flatbuffer (LiteRT: ai-edge-litert takes ``bytes``) would
otherwise copy every weight into a fresh buffer, and on this kind of machine a copy of fresh
memory costs what its page faults cost (8 ms for 14 MB, 30 ms for 52 MB), on the way of every
open. A :class:`Frame` is one ``bytes`` object: :data:`HEAD` bytes of room, the file's bytes,
then room for a tail. The first writer to :meth:`Frame.claim` it may write the head (the
flatbuffer's root offset and identifier) and the tail (its tables); the file's bytes are never
written, so every view of them (the reader's, a model's constants) stays what was read.

Writing into a ``bytes`` object after it was made is what this module exists to do, and only
it does: the object is new, never hashed, and the bytes written lie outside every view handed
out (:attr:`Frame.content`). A frame is an in-process optimisation: nothing about it crosses a
process boundary (a served driver gets the model's shared memory, as before).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading

import numpy as np

from nnhal.memory import fill
from nnhal.memory.pool import ASHMEM, SharedMemory, _part_view

#: Room before the file's bytes: a flatbuffer's root offset and file identifier (8 bytes),
#: with the file's bytes kept at the alignment a converter gives its buffers.
HEAD = 64
#: Files smaller than this are read as plain ``bytes``: their copy costs nothing worth a frame.
MIN_FRAMED = 1 << 20
#: Seconds :meth:`Frame.settle` waits for the copy of a file's bytes (a local file's takes
#: milliseconds; this bounds a stalled filesystem).
SETTLE_S = 120.0
_PAGE = 4096
#: Files past this are read as plain ``bytes``: a flatbuffer's offsets stop at 2 GiB.
MAX_FRAMED = (1 << 31) - (1 << 28)


def tail_room(size: int) -> int:
    """Room after a file of ``size`` bytes: a generous bound on a re-export's tables (a
    float model's take a fraction of a percent of its file, an 8-bit one's per-channel
    scales up to 7%). Room costs no memory until written (fresh pages are mapped on first
    write), and what is not used is cut off the object's length (:meth:`Frame.trim`)."""
    return (1 << 20) + size // 4


class Frame:
    """A file's bytes at :data:`HEAD` in one ``bytes`` object, with room after them."""

    __slots__ = ("buffer", "size", "tail", "_address", "_claimed", "_lock", "_end", "_view",
                 "_fill", "_ends_read", "_fill_at")

    def __init__(self, size: int) -> None:
        #: Where the tail's room starts (aligned for any flatbuffer scalar): after the file's
        #: bytes and what :meth:`put` placed after them.
        self.tail = -(-(HEAD + size) // 64) * 64
        #: Where the file's bytes and what was put after them end.
        self._end = HEAD + size
        #: The whole frame: ``bytes(n)`` is allocated zero-filled without touching its pages.
        self.buffer = bytes(self.tail + tail_room(size))
        self.size = size
        self._address = np.frombuffer(self.buffer, np.uint8).ctypes.data
        self._view: memoryview | None = None
        self._claimed = False
        self._lock = threading.Lock()
        #: The native fill of the file's bytes while it is under way (see :meth:`settle`).
        self._fill: fill.Filling | None = None
        self._fill_at = 0
        self._ends_read = True

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Frame | bytes:
        """The file's bytes, framed when the file is large enough to pay (else plain bytes).
        OSError as ``open`` / ``read`` raise it, and for anything but a regular file (a FIFO
        or a device: no read of it is bounded). Memory too short for the file is an OSError
        (ENOMEM), as for any other read that cannot be done.

        Where it can (:mod:`nnhal.memory.fill`), a frame is returned while most of the file is
        still being copied in: its bytes read as the file's all the same (a page read early
        waits for its own bytes), and :meth:`settle` says whether they are the file's (not
        when it changed size meanwhile). Read the plain way, a file that changes size while
        it is read is read again (as its new size), twice at most, then as plain bytes."""
        try:
            return cls._read(path)
        except MemoryError:
            raise OSError(errno.ENOMEM, "not enough memory to read the file") from None

    @classmethod
    def _read(cls, path: str | os.PathLike[str]) -> Frame | bytes:
        # Opened without blocking, and only a regular file read: a FIFO would wait for a
        # writer for ever, a device such as /dev/zero never end.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory")
            if not stat.S_ISREG(mode):
                raise OSError(errno.EINVAL, "not a regular file")
            f = open(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with f:
            for _ in range(3):
                size = os.fstat(fd).st_size
                if not MIN_FRAMED <= size <= MAX_FRAMED:
                    break
                frame = cls(size)
                if frame._fill_from(fd):
                    return frame
                if _fill(fd, frame._writable(HEAD, size), 0) and not os.pread(fd, 1, size):
                    return frame
            f.seek(0)
            return f.read()

    def _fill_from(self, fd: int) -> bool:
        """Start the native fill of the page-aligned middle of the file's bytes, the two
        ends read here; False when no fill could be started (nothing was read)."""
        first = HEAD + (-(self._address + HEAD) % _PAGE)
        last = HEAD + self.size - (self._address + HEAD + self.size) % _PAGE
        if last - first < fill.MIN_BYTES:
            return False
        started = fill.start(fd, first - HEAD, self._address + first, last - first, self.size,
                             self.buffer)
        if started is None:
            return False
        self._fill = started
        self._fill_at = first - HEAD  # the file offset the fill's range starts at
        # The ends, while the middle is copied: a short read of them is the fill's news too
        # (settle reads the file again).
        if not (_fill(fd, self._writable(HEAD, first - HEAD), 0) and
                _fill(fd, self._writable(last, HEAD + self.size - last), last - HEAD)):
            self._ends_read = False
        return True

    def settle(self, timeout: float = SETTLE_S) -> None:
        """Wait for the copy of the file's bytes into this frame (nothing to wait for when it
        was read the plain way). OSError when they are not the file's: the file changed size
        while it was read (ESTALE), could not be read (its errno), or the copy did not finish
        in ``timeout`` seconds (ETIMEDOUT)."""
        f = self._fill
        if f is None:
            return
        done = f.wait(timeout)
        if done is None:
            raise OSError(errno.ETIMEDOUT, f"reading the file did not finish in {timeout:.0f} s")
        if done[0] in (errno.ENODATA, errno.ESTALE) or not self._ends_read:
            raise OSError(errno.ESTALE, "the file changed while it was read")
        if done[0]:
            raise OSError(done[0], os.strerror(done[0]))

    def want(self, offsets: np.ndarray) -> None:
        """The file's bytes at these offsets are about to be read: the pages holding them that
        the copy has not reached are copied in now, in one call (reading them would wait for
        each in turn). A hint: offsets outside the file are ignored."""
        f = self._fill
        if f is not None:
            f.want(np.asarray(offsets, np.int64) - self._fill_at)

    def __del__(self) -> None:
        f = getattr(self, "_fill", None)
        if f is not None:
            f.park()  # the memory stays until the copy into it is done (it holds it)

    @property
    def content(self) -> memoryview:
        """The file's bytes (read-only)."""
        return memoryview(self.buffer)[HEAD:HEAD + self.size]

    @property
    def room(self) -> int:
        """Bytes of room in the tail."""
        return len(self.buffer) - self.tail

    def claim(self) -> bool:
        """True once, for the one writer of the head and the tail."""
        with self._lock:
            claimed, self._claimed = self._claimed, True
            return not claimed

    def put(self, at: int, data: bytes | np.ndarray) -> bool:
        """Place ``data`` at ``at`` bytes from the file's first byte, past the file and what
        was put before, while the frame is unclaimed and the room takes it without giving up
        more than half of itself; False (nothing written) otherwise. A model's own constants
        then lie beside the file's weights, one contiguous pool (:class:`FramedMemory`); the
        tail moves past them. What was put is never written again."""
        view = _part_view(at, data, None)  # as a pool takes its parts
        start = HEAD + at
        with self._lock:
            limit = len(self.buffer) - tail_room(self.size) // 2
            if self._claimed or start < self._end or start + len(view) > limit:
                return False
            self._writable(start, len(view))[:] = view
            self._end = start + len(view)
            self.tail = -(-self._end // 64) * 64
        return True

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write into the head or the tail (only the claimant does)."""
        n = len(data)
        if not self._claimed or not (0 <= offset and offset + n <= HEAD or
                                     self.tail <= offset <= len(self.buffer) - n):
            raise ValueError(f"frame write of {n} bytes at {offset} outside its head and tail")
        self._writable(offset, n)[:] = data

    def trim(self, length: int) -> None:
        """Cut the buffer's length to ``length`` (the claimant, once its flatbuffer ends
        there): an engine or a cache then sees the flatbuffer, not the room after it. The
        object's memory stays as allocated (freed whole later); every view of the file's
        bytes lies before ``length``; the byte at ``length`` is room never written, a zero, as
        a ``bytes`` object's terminator must be. Left as is where the object's length field
        is not where CPython keeps it."""
        if not self._claimed or not self.tail <= length <= len(self.buffer):
            raise ValueError(f"frame trim to {length} outside its tail")
        if length == len(self.buffer):
            return
        field = ctypes.c_ssize_t.from_address(id(self.buffer) + object.__basicsize__)
        if field.value == len(self.buffer) and self.buffer[length] == 0:
            field.value = length

    def _writable(self, offset: int, n: int) -> memoryview:
        # One view of the whole allocation, made once: a ctypes array type per length costs
        # about 10 us, and an export writes dozens of lengths.
        view = self._view
        if view is None:
            view = self._view = memoryview((ctypes.c_char * len(self.buffer)).from_address(
                self._address)).cast("B")
        return view[offset:offset + n]

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Frame({self.size} bytes, {self.room} of room)"


class FramedMemory(SharedMemory):
    """A model's constant pool that is a frame's bytes: the file's, then the constants the
    model added (:meth:`Frame.put`). Why: a pool is shared memory so that a driver in another
    process can map it, but an in-process driver reads it where it lies, and copying a 52 MB
    file into a memfd costs what its page faults cost (25 ms of a core here). So this process
    reads the frame in place (read-only: the bytes never change), and the file descriptor, a
    sealed copy, is made only when one is asked for (a served driver, the service)."""

    def __init__(self, frame: Frame, size: int):
        super().__init__(ASHMEM, -1, size)
        self.frame = (frame, 0)
        self._array = np.frombuffer(frame.buffer, np.uint8, size, HEAD)
        self._fixed = self._frozen = True

    @property
    def fd(self) -> int:
        """The sealed copy's descriptor, made on first use (-1 once closed; closing it is
        the base class's, as for any owned descriptor)."""
        with self._lock:
            if self._closed:
                return -1
            if self._fd < 0:
                self.frame[0].settle()  # the copy below is the kernel's: no page may wait
                made = SharedMemory.from_parts(self.size, [(0, self._array)], seal=True)
                self._fd, made._owns_fd = made.fd, False
                made.close()
            return self._fd


def file_bytes(read: Frame | bytes) -> bytes | memoryview:
    """What :meth:`Frame.read` read, as the file's bytes (a frame's are a view)."""
    return read.content if isinstance(read, Frame) else read


def _fill(fd: int, view: memoryview, offset: int) -> bool:
    """Fill ``view`` from ``offset`` of file ``fd`` (positioned reads: the file offset is not
    moved); False when the file ended first."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            return False
        got += n
    return True


__all__ = ["HEAD", "MAX_FRAMED", "MIN_FRAMED", "Frame", "FramedMemory", "file_bytes", "tail_room"]
