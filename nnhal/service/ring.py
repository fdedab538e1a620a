"""Single-producer / single-consumer message rings in shared memory, for burst FMQ packets.

A burst sends every execution as two packets (request, result); sending them through the
service socket would cost two syscalls and a wake-up of the service's event loop each way. A
:class:`Ring` instead keeps the packets in a sealed memfd that both processes map, and wakes a
sleeping reader through an eventfd only when the reader said it is going to sleep: a reader that
is still spinning gets the packet with no syscall on either side (a spinner yields its core
every few polls, so that two spinners on a busy machine do not wait out each other).

The byte layout, record format and wake-up rule are in docs/fmq.md (precise enough for a C or
Rust peer). In short: a 256-byte header (magic, version, capacity; the write index and a
"writer waiting" flag on a cache line only the producer writes; the read index and a "reader
waiting" flag on one only the consumer writes), then ``capacity`` bytes of ring. Indexes are
free-running byte counts (``index % capacity`` is the position). A record is a 16-byte header
(payload length, low 32 bits of the record's own index, CRC-32 of the payload seeded with
those two words XORed, zero) and the payload, padded to 8 bytes; a record may wrap around the
end.

Memory ordering. Python has no atomics or fences, so the protocol relies only on:

- every shared word is written by one side only, and each index is stored and loaded as one
  aligned 8-byte access (a ``memoryview`` cast to ``"Q"`` over the mapping: CPython copies
  the item with an 8-byte ``memcpy``, which gcc and clang compile to one ``mov``/``str``/
  ``ldr``: not a language guarantee, but single-copy atomic on x86-64 and aarch64 when it
  holds; were an index ever seen torn, the bounds, tag and CRC checks still catch it);
- the producer stores the record before the index that publishes it. On x86-64 (TSO) stores
  are seen in program order and loads are not reordered with loads, so a consumer that sees
  the new index sees the record. On aarch64 plain stores and loads may be reordered, so the
  consumer does not trust the order: the record header names its own index and carries a
  CRC-32 of the payload seeded with that index and the length, checked on the consumer's
  private copy. A record that does
  not check yet is re-read for a bounded grace period (a store in flight lands within
  microseconds); one still wrong after it is corruption: :class:`RingError`;
- a sleeping side is woken through the eventfd; ``write``/``read`` of an eventfd take a lock
  in the kernel (release on the writer's side, acquire on the reader's), so everything stored
  before the signal is visible after the wake-up, on both architectures.

The "waiting" handshake (the sleeper stores its flag, then re-checks the index; the other side
stores the index, then loads the flag) needs a store-load fence that Python cannot issue: both
sides may read stale values and the signal may be skipped. The sleeper therefore never sleeps
long before looking again: ``recheck`` (2 ms) at first, doubled while nothing comes, at most
``max_recheck`` (16 ms); a skipped signal costs at most that and is counted in
:attr:`Ring.late_wakeups`.

The other process is hostile: the consumer copies a record out before checking it, checks
every index and length against the capacity it read once at attach, never reads outside its
mapping (the memfd is sealed against shrinking, checked at attach, so the mapping cannot
fault), and bounds every loop by the caller's timeout.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import select
import stat
import struct
import time
import zlib
from collections.abc import Callable

__all__ = ["RingError", "RingTimeout", "RingClosed", "PacketTooLarge", "Ring", "ChannelPair",
           "MAGIC", "VERSION", "HEADER_SIZE", "RECORD_HEADER", "MIN_CAPACITY", "MAX_CAPACITY"]

#: ``b"NNRG"`` read as a little-endian uint32.
MAGIC = 0x47524E4E
VERSION = 1
#: Bytes before the ring data.
HEADER_SIZE = 256
#: Bytes of a record header (length, index tag, crc, zero).
RECORD_HEADER = 16
MIN_CAPACITY = 64
MAX_CAPACITY = 1 << 30

# Byte offsets in the header (docs/fmq.md).
_OFF_MAGIC, _OFF_VERSION, _OFF_CAPACITY = 0, 4, 8
_OFF_WRITE, _OFF_WRITER_WAITING = 64, 72      # producer's cache line
_OFF_READ, _OFF_READER_WAITING = 128, 136     # consumer's cache line
# ... as indexes of the uint64 view.
_Q_WRITE, _Q_WRITER_WAITING = _OFF_WRITE // 8, _OFF_WRITER_WAITING // 8
_Q_READ, _Q_READER_WAITING = _OFF_READ // 8, _OFF_READER_WAITING // 8

_HEAD = struct.Struct("<IIQ")   # magic, version, capacity
_REC = struct.Struct("<IIII")   # length, index tag, crc, zero
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_ALIVE_EVERY = 0.05             # seconds between two calls of ``alive`` while blocked
_GRACE = 0.002                  # seconds a record that does not check yet is re-read


class RingError(Exception):
    """The ring cannot be used: corrupt shared memory, a bad fd, or a closed ring."""


class RingTimeout(RingError, TimeoutError):
    """Nothing arrived (read) or no room was freed (write) within the timeout."""


class RingClosed(RingError):
    """The peer is gone (``alive()`` said so) or this ring was closed."""


class PacketTooLarge(RingError, ValueError):
    """The packet can never fit the ring."""


def _pad8(n: int) -> int:
    return (n + 7) & ~7


class Ring:
    """One direction of a channel: a producer calls :meth:`write`, a consumer :meth:`read`.

    Each process holds its own ``Ring`` on the shared memory; exactly one process writes and
    one reads, each from one thread at a time. :meth:`close` from another thread ends a
    blocked call with RingClosed within ``max_recheck``.

    ``spin``: polls of the index before sleeping (0: sleep at once), for at most ``spin_s``
    seconds (looked at when yielding: on a loaded machine every yield can give a whole time
    slice away, and 2000 polls took 3 s with ten busy processes on two cores, during which a
    dead peer went unnoticed); ``yield_every``: give the
    core away (``sched_yield``) every that many polls (a power of two; 0: never), so that two
    spinners sharing a core under load do not wait out each other's spin; ``recheck``: the
    first sleep between two looks at the index, doubled after each sleep that nothing ended,
    up to ``max_recheck`` (bounds the cost of a skipped wake-up: a ring just used looks again
    within 2 ms, an idle one wakes about 60 times a second instead of 500).
    """

    def __init__(self, mem_fd: int, event_fd: int, *, spin: int = 2000, spin_s: float = 0.001,
                 recheck: float = 0.002, max_recheck: float = 0.016, yield_every: int = 4,
                 _create: int = 0):
        self._mm: mmap.mmap | None = None
        self._q: memoryview | None = None
        self._mem_fd, self._event_fd = mem_fd, event_fd
        self.spin = spin
        self.spin_s = spin_s
        self.recheck = recheck
        self.max_recheck = max(recheck, max_recheck)
        #: Sleeps taken (a figure for tests and benchmarks).
        self.naps = 0
        #: Sleeps that ended by ``recheck`` with the awaited change already there: skipped
        #: wake-ups (see the module text). A figure for benchmarks, not an error.
        self.late_wakeups = 0
        try:
            if yield_every < 0 or yield_every & (yield_every - 1):
                raise RingError(f"yield_every {yield_every} is not 0 or a power of two")
            self._yield_mask = (yield_every - 1) if yield_every else -1  # -1: never
            size = _check_mem_fd(mem_fd)
            _check_event_fd(event_fd)
            if _create:
                if size != HEADER_SIZE + _create:
                    raise RingError(f"memfd of {size} bytes for capacity {_create}")
            try:
                self._mm = mmap.mmap(mem_fd, size, mmap.MAP_SHARED,
                                     mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as e:  # e.g. a memfd sealed against writing
                raise RingError(f"ring memory fd {mem_fd} cannot be mapped for writing: "
                                f"{e.strerror}") from None
            if _create:
                _HEAD.pack_into(self._mm, 0, MAGIC, VERSION, _create)
            magic, version, capacity = _HEAD.unpack_from(self._mm, 0)
            if magic != MAGIC:
                raise RingError(f"not a ring: magic {magic:#010x}")
            if version != VERSION:
                raise RingError(f"ring version {version}, expected {VERSION}")
            if not (MIN_CAPACITY <= capacity <= MAX_CAPACITY and capacity % 8 == 0) \
                    or size != HEADER_SIZE + capacity:
                raise RingError(f"ring capacity {capacity} does not match a memfd of {size} "
                                f"bytes (or is not a multiple of 8 in "
                                f"[{MIN_CAPACITY}, {MAX_CAPACITY}])")
            self.capacity: int = capacity
            #: The largest payload a record can carry.
            self.max_packet: int = capacity - RECORD_HEADER
            self._q = memoryview(self._mm).cast("B").cast("Q")
            # Our own copies of the indexes: the one we own is never read back, the other is
            # checked against it on every load.
            self._w = self._r = 0
            w, r = self._q[_Q_WRITE], self._q[_Q_READ]
            if not (r <= w <= r + capacity and w % 8 == 0 and r % 8 == 0):
                raise RingError(f"corrupt ring indexes at attach: read {r}, write {w}")
            self._w, self._r = w, r
            self._poll = select.poll()
            self._poll.register(event_fd, select.POLLIN)
        except BaseException:
            self._release()
            raise

    # ---- construction ------------------------------------------------------------------

    @classmethod
    def create(cls, capacity: int, **kw: object) -> Ring:
        """A new, empty ring of ``capacity`` data bytes (a multiple of 8) on a sealed memfd."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or \
                not (MIN_CAPACITY <= capacity <= MAX_CAPACITY) or capacity % 8:
            raise RingError(f"ring capacity {capacity!r} is not a multiple of 8 in "
                            f"[{MIN_CAPACITY}, {MAX_CAPACITY}]")
        mem_fd = os.memfd_create("nnhal-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(mem_fd, HEADER_SIZE + capacity)
            fcntl.fcntl(mem_fd, fcntl.F_ADD_SEALS, _SEALS)
            event_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except BaseException:
            os.close(mem_fd)
            raise
        # the ring owns both fds from here, and closes them if it fails
        return cls(mem_fd, event_fd, _create=capacity, **kw)  # type: ignore[arg-type]

    @classmethod
    def attach(cls, mem_fd: int, event_fd: int, **kw: object) -> Ring:
        """A ring on fds received from the peer; this ring owns (and closes) them.

        Raises RingError when the fds are not a sealed memfd holding a ring and an eventfd.
        """
        return cls(mem_fd, event_fd, **kw)  # type: ignore[arg-type]

    def fds(self) -> tuple[int, int]:
        """(memfd, eventfd): what to send the peer (SCM_RIGHTS) for :meth:`attach`."""
        if self._q is None:
            raise RingClosed("ring is closed")
        return self._mem_fd, self._event_fd

    # ---- producer ------------------------------------------------------------------------

    def write(self, packet: bytes | bytearray | memoryview, timeout: float | None = None,
              alive: Callable[[], bool] | None = None) -> None:
        """Append one packet, waiting up to ``timeout`` seconds (None: forever) for room.

        Raises PacketTooLarge, RingTimeout, RingClosed (``alive()`` false, or the ring closed)
        or RingError (the consumer corrupted the read index).
        """
        try:
            self._write(packet, timeout, alive)
        except RingError:
            raise
        except (TypeError, ValueError, OSError, BufferError):
            if self._q is None:  # closed by another thread during the call
                raise RingClosed("ring closed during write") from None
            raise

    def _write(self, packet: bytes | bytearray | memoryview, timeout: float | None,
               alive: Callable[[], bool] | None) -> None:
        q = self._q
        if q is None:
            raise RingClosed("ring is closed")
        if type(packet) is not bytes:
            try:
                packet = memoryview(packet).tobytes()
            except TypeError:
                raise RingError(f"a packet is bytes, not {type(packet).__name__}") from None
        n = len(packet)
        if n > self.max_packet:
            raise PacketTooLarge(f"packet of {n} bytes exceeds the ring's largest "
                                 f"{self.max_packet} (capacity {self.capacity})")
        need = RECORD_HEADER + ((n + 7) & ~7)
        w, cap = self._w, self.capacity
        r = q[_Q_READ]
        if not (w - cap <= r <= w and r % 8 == 0):
            raise RingError(f"corrupt ring: read index {r} with write index {w}")
        if cap - (w - r) < need:
            if not self._spin(lambda: cap - (w - q[_Q_READ]) >= need):
                self._wait(lambda: cap - (w - self._checked_read(w)) >= need,
                           _Q_WRITER_WAITING, timeout, alive)
            self._checked_read(w)
        tag = w & 0xFFFF_FFFF
        record = _REC.pack(n, tag, zlib.crc32(packet, tag ^ n), 0) + packet
        pos = w % cap
        if pos + need <= cap:
            self._mm[HEADER_SIZE + pos:HEADER_SIZE + pos + len(record)] = record  # type: ignore
        else:
            self._put(pos, record)
        w += need
        q[_Q_WRITE] = w                         # publish: after the record
        self._w = w
        if q[_Q_READER_WAITING]:
            self._signal()

    def _checked_read(self, w: int) -> int:
        r = self._q[_Q_READ]  # type: ignore[index]
        if not (w - self.capacity <= r <= w and r % 8 == 0):
            raise RingError(f"corrupt ring: read index {r} with write index {w}")
        return r

    def _put(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        mm, n = self._mm, len(data)
        start = HEADER_SIZE + pos
        first = self.capacity - pos
        if n <= first:
            mm[start:start + n] = data  # type: ignore[index]
        else:
            view = memoryview(data).cast("B")
            mm[start:start + first] = view[:first]  # type: ignore[index]
            mm[HEADER_SIZE:HEADER_SIZE + n - first] = view[first:]  # type: ignore[index]

    # ---- consumer ------------------------------------------------------------------------

    def read(self, timeout: float | None = None,
             alive: Callable[[], bool] | None = None) -> bytes:
        """The next packet, waiting up to ``timeout`` seconds (None: forever).

        ``alive`` is called about every 50 ms while blocked; when it returns False, RingClosed.
        Raises RingTimeout, RingClosed, or RingError when the producer wrote something that is
        not a record (the ring is then unusable).
        """
        try:
            return self._read(timeout, alive)
        except RingError:
            raise
        except (TypeError, ValueError, OSError, BufferError):
            if self._q is None:  # closed by another thread during the call
                raise RingClosed("ring closed during read") from None
            raise

    def _read(self, timeout: float | None, alive: Callable[[], bool] | None) -> bytes:
        q = self._q
        if q is None:
            raise RingClosed("ring is closed")
        r = self._r
        if q[_Q_WRITE] == r and not self._spin(lambda: q[_Q_WRITE] != r):
            self._wait(lambda: self._checked_write(r) != r, _Q_READER_WAITING, timeout,
                       alive)
        w = self._checked_write(r)
        got = self._record(r, w)
        if got is None:  # not consistent yet (weak ordering) or corrupt: bounded re-reads
            end = time.monotonic() + _GRACE
            while got is None and time.monotonic() < end:
                got = self._record(r, self._checked_write(r))
            if got is None:
                raise RingError(self._why(r, self._checked_write(r)))
        payload, need = got
        r += need
        q[_Q_READ] = r                          # release the space: after the copy
        self._r = r
        if q[_Q_WRITER_WAITING]:
            self._signal()
        return payload

    def _checked_write(self, r: int) -> int:
        w = self._q[_Q_WRITE]  # type: ignore[index]
        if not (r <= w <= r + self.capacity and w % 8 == 0):
            raise RingError(f"corrupt ring: write index {w} with read index {r}")
        return w

    def _get(self, pos: int, n: int) -> bytes:
        mm = self._mm
        start = HEADER_SIZE + pos
        first = self.capacity - pos
        if n <= first:
            return mm[start:start + n]  # type: ignore[index]
        return mm[start:start + first] + mm[HEADER_SIZE:HEADER_SIZE + n - first]  # type: ignore

    def _record(self, r: int, w: int) -> tuple[bytes, int] | None:
        """(payload, record bytes) of the record at ``r``, or None if it does not check."""
        avail = w - r
        if avail < RECORD_HEADER:
            return None
        cap = self.capacity
        pos = r % cap
        if pos + RECORD_HEADER <= cap:
            n, tag, crc, zero = _REC.unpack_from(self._mm, HEADER_SIZE + pos)  # type: ignore
        else:
            n, tag, crc, zero = _REC.unpack(self._get(pos, RECORD_HEADER))
        need = RECORD_HEADER + ((n + 7) & ~7)
        if zero or tag != r & 0xFFFF_FFFF or n > self.max_packet or need > avail:
            return None
        pos += RECORD_HEADER
        if pos + n <= cap:
            payload = self._mm[HEADER_SIZE + pos:HEADER_SIZE + pos + n]  # type: ignore[index]
        else:
            payload = self._get(pos % cap, n)
        if zlib.crc32(payload, tag ^ n) != crc:
            return None
        return payload, need

    def _why(self, r: int, w: int) -> str:
        avail = w - r
        if avail < RECORD_HEADER:
            return f"corrupt ring: {avail} bytes published, less than a record header"
        n, tag, _, zero = _REC.unpack(self._get(r % self.capacity, RECORD_HEADER))
        if zero or tag != r & 0xFFFF_FFFF:
            return f"corrupt ring: the record at index {r} has a bad header"
        if n > self.max_packet or RECORD_HEADER + _pad8(n) > avail:
            return (f"corrupt ring: record length {n} exceeds the {avail - RECORD_HEADER} "
                    f"bytes published")
        return f"corrupt ring: the record at index {r} fails its checksum"

    # ---- waiting -------------------------------------------------------------------------

    def _spin(self, ready: Callable[[], bool]) -> bool:
        """Poll ``ready()`` up to ``spin`` times and ``spin_s`` seconds, yielding the core every
        ``yield_every`` polls; whether it came true."""
        end = time.monotonic() + self.spin_s
        mask = self._yield_mask
        for i in range(self.spin):
            if ready():
                return True
            if i & mask == mask:
                os.sched_yield()
                if time.monotonic() > end:
                    return False
        return False

    def _wait(self, ready: Callable[[], bool], flag: int, timeout: float | None,
              alive: Callable[[], bool] | None) -> None:
        """Return once ``ready()`` (the caller has spun): sleep on the eventfd, ``flag`` up."""
        q = self._q
        now = time.monotonic()
        deadline = None if timeout is None else now + max(0.0, timeout)
        next_alive = now + _ALIVE_EVERY
        recheck = self.recheck
        try:
            while True:
                if self._q is None:  # closed by another thread
                    raise RingClosed("ring is closed")
                q[flag] = 1  # type: ignore[index]
                if ready():
                    return
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise RingTimeout(f"ring: nothing within {timeout} s" if flag ==
                                      _Q_READER_WAITING else f"ring full for {timeout} s")
                if alive is not None and now >= next_alive:
                    next_alive = now + _ALIVE_EVERY
                    if not alive():
                        raise RingClosed("ring: the peer is gone")
                nap = recheck
                recheck = min(recheck * 2, self.max_recheck)
                if deadline is not None:
                    nap = min(nap, deadline - now)
                if alive is not None:
                    nap = min(nap, next_alive - now)
                self.naps += 1
                if self._poll.poll(max(0.0, nap) * 1000.0):
                    self._drain()
                    recheck = self.recheck
                elif self._q is not None and ready():
                    self.late_wakeups += 1
                    return
        finally:
            if self._q is not None:
                q[flag] = 0  # type: ignore[index]

    def _signal(self) -> None:
        try:
            os.eventfd_write(self._event_fd, 1)
        except BlockingIOError:  # the counter is saturated: a wake-up is pending anyway
            pass

    def _drain(self) -> None:
        try:
            os.eventfd_read(self._event_fd)
        except BlockingIOError:  # the other party drained it first
            pass
        except OSError:
            if self._q is None:  # closed by another thread while we slept
                raise RingClosed("ring is closed") from None
            raise

    # ---- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap and close the fds; later calls raise RingClosed. Idempotent."""
        self._release()

    def _release(self) -> None:
        if self._q is not None:
            self._q.release()
            self._q = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        for fd in (self._mem_fd, self._event_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._mem_fd = self._event_fd = -1

    @property
    def closed(self) -> bool:
        return self._q is None

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self._release()


def _check_mem_fd(fd: int) -> int:
    """The size of ``fd`` if it is a memfd sealed against shrinking and growing."""
    try:
        st = os.fstat(fd)
    except (OSError, TypeError, ValueError) as e:
        raise RingError(f"ring memory fd {fd!r}: {e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise RingError(f"ring memory fd {fd} is not a memfd")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EBADF):
            raise RingError(f"ring memory fd {fd} is not a sealable memfd") from None
        raise RingError(f"ring memory fd {fd}: {e}") from None
    if seals & (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) != \
            fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW:
        raise RingError(f"ring memory fd {fd} is not sealed against shrinking and growing")
    if not HEADER_SIZE + MIN_CAPACITY <= st.st_size <= HEADER_SIZE + MAX_CAPACITY:
        raise RingError(f"ring memory fd {fd} has {st.st_size} bytes")
    return st.st_size


def _check_event_fd(fd: int) -> None:
    try:
        kind = os.readlink(f"/proc/self/fd/{fd}")
    except (OSError, TypeError, ValueError) as e:
        raise RingError(f"ring event fd {fd!r}: {e}") from None
    if kind != "anon_inode:[eventfd]":
        raise RingError(f"ring event fd {fd} is not an eventfd ({kind})")
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if not flags & os.O_NONBLOCK:  # ours are; a peer's blocking one would hang a drain
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)


class ChannelPair:
    """The two rings of a burst: requests (client -> server) and results (server -> client)."""

    def __init__(self, request: Ring, result: Ring):
        self.request = request
        self.result = result

    @classmethod
    def create(cls, capacity: int = 1 << 16, **kw: object) -> ChannelPair:
        request = Ring.create(capacity, **kw)
        try:
            return cls(request, Ring.create(capacity, **kw))
        except BaseException:
            request.close()
            raise

    def fds(self) -> list[int]:
        """[request memfd, request eventfd, result memfd, result eventfd], in this order."""
        return [*self.request.fds(), *self.result.fds()]

    @classmethod
    def attach(cls, fds: list[int] | tuple[int, ...], **kw: object) -> ChannelPair:
        """The pair on four received fds (see :meth:`fds`); closes them all on error."""
        fds = list(fds)
        if len(fds) != 4:
            for fd in fds:
                _close_quietly(fd)
            raise RingError(f"a channel pair needs 4 fds, got {len(fds)}")
        try:
            request = Ring.attach(fds[0], fds[1], **kw)
        except BaseException:
            for fd in fds[2:]:
                _close_quietly(fd)
            raise
        try:
            return cls(request, Ring.attach(fds[2], fds[3], **kw))
        except BaseException:
            request.close()
            raise

    def client_side(self) -> tuple[Ring, Ring]:
        """(ring to write requests to, ring to read results from)."""
        return self.request, self.result

    def server_side(self) -> tuple[Ring, Ring]:
        """(ring to read requests from, ring to write results to)."""
        return self.request, self.result

    def close(self) -> None:
        self.request.close()
        self.result.close()


def _close_quietly(fd: object) -> None:
    try:
        os.close(fd)  # type: ignore[arg-type]
    except (OSError, TypeError, ValueError):
        pass
