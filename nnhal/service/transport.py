"""Framed messages over a Unix stream socket, descriptors beside them (SCM_RIGHTS).

A sender writes a whole message with one ``sendmsg`` (the descriptors ride on its first byte).
:func:`recv_message` reads exactly the header with ``recvmsg`` (collecting descriptors), then
exactly the body. A :class:`Receiver` (one per connection, for its steady traffic) reads
whatever has arrived, up to a chunk, with one ``recvmsg`` and cuts messages out of it: a small
message then costs one system call instead of two. Descriptors still go to the right message:
Linux hands a stream socket's descriptors over with the first byte they were sent with, and
ends a read right after the segment that carried them, so the descriptors of one read belong
to the message that holds the read's last byte, which must also start inside that read (else
the sender broke the rule above: WireError). Every descriptor received is closed unless the
caller takes it (the :class:`~nnhal.service.wire.Reader`).

A body is held only as far as it has arrived: a header announcing a large body allocates
nothing until its bytes come (a peer announcing 255 MiB and sending nothing costs nothing).
Every read may be given an end (a ``time.monotonic`` time): past it, :class:`TimedOut`.
A service's receivers also keep a :class:`Pace` (a peer that stops inside a message cannot
hold its connection and reading thread for ever; between messages it may idle) and share a
:class:`Budget` (the bytes of large bodies held at once over all connections).
"""

from __future__ import annotations

import array
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nnhal.service.wire import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_BODY,
    MAX_FDS,
    VERSION,
    Kind,
    WireError,
    close_fds,
    unpack_header,
)

_ANC = socket.CMSG_SPACE(MAX_FDS * 4)
_FLAGS = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))
_CTRUNC = int(socket.MSG_CTRUNC)
_DONTWAIT = int(socket.MSG_DONTWAIT)
_HEADER_PACK = HEADER.pack  # pack_header's work, one call less on every send


class Closed(Exception):
    """The peer closed the connection (or it broke)."""


class TimedOut(Exception):
    """Nothing (or not the whole message) arrived before the end the reader gave."""


class TooLarge(WireError):
    """A well-framed message past the size bound: its body was read and dropped, so the
    connection goes on and the call gets an error reply."""

    def __init__(self, kind: Kind, call_id: int, size: int, bound: int):
        super().__init__(f"message of {size} bytes exceeds the bound of {bound}")
        self.kind, self.call_id = kind, call_id


class OverBudget(Exception):
    """A body that would take the bytes held past the shared :class:`Budget`: what came of
    it was dropped and the rest read and dropped, so the connection goes on."""

    def __init__(self, kind: Kind, call_id: int, size: int, limit: int):
        super().__init__(f"a body of {size} bytes would pass the {limit} bytes that all "
                         f"connections may hold in incomplete messages")
        self.kind, self.call_id = kind, call_id


@dataclass(frozen=True)
class Pace:
    """How long a message may take once its first byte has come. A wait for more of it ends
    ``partial_s`` after the last bytes came, and the whole of it must come within
    ``partial_s`` plus ``min_rate`` seconds per byte received so far: a slow but steady
    sender of a large body goes on, one that stops or trickles is cut. Between messages
    there is no bound (a client keeps its connection for the life of its process)."""

    partial_s: float = 30.0
    min_rate: float = 64 << 10  # bytes per second

    def end(self, first: float, got: int) -> float:
        """When the wait for a message's next bytes ends (``first``: its first byte's time;
        ``got``: its bytes so far)."""
        return min(time.monotonic() + self.partial_s,
                   first + self.partial_s + got / self.min_rate)


class Budget:
    """Bytes held in incomplete message bodies over all the connections that share it
    (bodies past a receiver's chunk; smaller ones live in its fixed buffer)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


def send_message(sock: socket.socket, kind: int, call_id: int, body: bytes | bytearray,
                 fds: Sequence[int] = ()) -> None:
    """One message; raises Closed when the peer is gone."""
    data = _HEADER_PACK(MAGIC, VERSION, kind, call_id, len(body), len(fds), 0) + body
    try:
        if fds:
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
            n = sock.sendmsg([data], anc)
            if n < len(data):
                sock.sendall(memoryview(data)[n:])
        else:
            sock.sendall(data)
    except OSError as e:
        raise Closed(str(e)) from None


#: A yield that kept the core away this long gave it to another task's time slice (one that
#: runs while nothing else waits returns in a microsecond or two; one that lets the peer's
#: own threads finish a piece of their work, e.g. a BLAS worker's share of a matrix
#: product, in tens to hundreds of microseconds, and the look goes on through those).
YIELD_GAVE_S = 1e-3
#: Looks not made after a look that a yield ended, or after MISSED_LOOKS looks in a row
#: ended by their window without the message (see Looker).
SKIP_LOOKS = 16
MISSED_LOOKS = 8
#: How often a Looker reads the load average (seconds), and the cores this process may use.
LOAD_CHECK_S = 0.5
#: The share of time (percent, over the last 10 s) in which some task waited for a core
#: (Linux's CPU pressure, /proc/pressure/cpu) from which no look is made. On this project's
#: 2-core VM a served MobileNet loop, looking, raised it to 1-5% on its own (its load
#: average towards 2: the driver's BLAS workers spin between matrix products), and other
#: work running there to 30-98%.
PRESSURE_BUSY = 10.0
_PRESSURE = "/proc/pressure/cpu"
#: ``NNHAL_SERVICE_LOOK=0`` in a process's environment: its Lookers never look (every wait
#: blocks in the kernel at once: no core spent polling, each message costs a wake-up).
LOOK_ENV = "NNHAL_SERVICE_LOOK"
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
    (os.cpu_count() or 1)


def cpu_pressure() -> float | None:
    """The share of the last 10 s (percent) in which some task waited for a core; None where
    the kernel does not say (no PSI)."""
    try:
        with open(_PRESSURE, "rb") as f:
            line = f.readline()
        return float(line.split(b"avg10=", 1)[1].split(None, 1)[0])
    except (OSError, IndexError, ValueError):
        return None


class Looker:
    """Looks for a message without sleeping, for one reading thread at a time, and stops
    looking while it does not pay.

    :meth:`until` polls the socket (``poll``: called with 0, true when something is there: a
    registered poll object's method, or :meth:`Receiver.ready`, which also reads it) and
    yields the core between polls: the side that sends may be waiting for it. Both ends of a
    call use it to be awake when the other answers: a thread blocked in the kernel is woken
    by the message, and on a virtual machine waking a sleeping core costs tens of
    microseconds each way.

    Looking takes a core, which pays only while the machine has one to spare: while the CPU
    pressure (read every LOAD_CHECK_S) says tasks waited for a core PRESSURE_BUSY of the
    time or more, or, where the kernel gives no pressure, while the load average is at least
    the cores this process may use, no look is made (:meth:`wanted`; the load average also
    counts the served work's own threads, a driver's BLAS workers spinning between matrix
    products among them, which alone bring a 2-core machine's to 2, and follows a change of
    load over a minute, the pressure over seconds); ``NNHAL_SERVICE_LOOK=0`` turns looking
    off. A thread that looks on a loaded machine crowds the other side (the driver's thread)
    and the other tasks onto the cores left, and waits out their time slices when it yields;
    one that blocks is woken by the message and, having slept, is given a core first (on
    this project's 2-core VM at load 2.2-3.8, looking on both sides made the served
    MobileNet's round trip 224 us beyond the driver, blocking 180 us; with both sides forced
    to look at load 4-8, a yield often lost the core for a whole tick: milliseconds). And a
    yield that keeps the core away for YIELD_GAVE_S says other tasks want this very core
    now: the look ends there and, unless the message came meanwhile (the core went to the
    peer's own work), the next SKIP_LOOKS looks are not made. So are they after MISSED_LOOKS
    looks in a row whose window ended without the message (a window that does not fit the
    peer only burns the core)."""

    __slots__ = ("skip", "checked", "busy", "enabled", "missed")

    def __init__(self) -> None:
        self.skip = 0
        self.missed = 0  # looks in a row that their window ended without the message
        self.checked = -LOAD_CHECK_S
        self.busy = False
        #: False: never look (LOOK_ENV set to 0 when this Looker was made).
        self.enabled = os.environ.get(LOOK_ENV, "").strip() != "0"

    def wanted(self) -> bool:
        """Whether to look this time (else the caller blocks at once, and sleeps towards
        nothing either)."""
        if not self.enabled:
            return False
        t = time.perf_counter()
        if t - self.checked >= LOAD_CHECK_S:
            self.checked = t
            pressure = cpu_pressure()
            if pressure is not None:
                self.busy = pressure >= PRESSURE_BUSY
            else:  # no pressure here: the load average, which also counts the served work
                try:
                    self.busy = os.getloadavg()[0] >= _CORES
                except OSError:  # no load average either: look
                    self.busy = False
        if self.skip:
            self.skip -= 1
            return False
        return not self.busy

    def until(self, poll: Callable[[float], object], end: float) -> bool:
        """Whether a message arrived before ``end`` (a ``time.perf_counter`` time); ask
        :meth:`wanted` first."""
        now = time.perf_counter
        while not poll(0):
            t = now()
            if t >= end:
                self.missed += 1
                if self.missed >= MISSED_LOOKS:  # the window does not fit the peer: rest
                    self.missed = 0
                    self.skip = SKIP_LOOKS
                return False
            os.sched_yield()
            if now() - t > YIELD_GAVE_S:
                if poll(0):  # the core went to the peer's work, most likely: it paid
                    self.missed = 0
                    return True
                self.skip = SKIP_LOOKS
                return False
        self.missed = 0
        return True


#: Where a header holds the call id (wire.HEADER: magic u32, version u16, kind u16, call id
#: u64, ...), for Receiver.take.
_CALL_AT, _CALL_END = 8, 16
_CALL_ID = struct.Struct("<Q")


#: The most a body grows by at each read: what is held is what arrived, plus at most this.
_GROW = 1 << 20


def _recv_into(sock: socket.socket, view: memoryview, end: float | None, tick: float = 0.0
               ) -> tuple[int, list, int]:
    """One ``recvmsg_into``; with an ``end``, waiting for data at most until then.

    ``tick``: the socket's SO_RCVTIMEO (set by its :class:`Receiver`), which ends a blocking
    read after about that long (the kernel rounds it up to its clock tick). A wait whose end
    is further away than two ticks is then one blocking ``recvmsg`` (woken by the data
    itself), not a non-blocking try, a ``poll`` and the read again: a bounded reply costs one
    system call, as an unbounded one does. The last two ticks before the end are waited for
    with ``poll``, so the end is kept exactly."""
    while end is None or (tick and end - time.monotonic() > 2 * tick):
        try:
            n, anc, flags, _ = sock.recvmsg_into([view], _ANC, _FLAGS)
            return n, anc, flags
        except BlockingIOError:
            if not tick:
                raise Closed("the socket does not block") from None
            # a tick passed without data: look at the end again
        except OSError as e:
            raise Closed(str(e)) from None
    while True:
        try:
            n, anc, flags, _ = sock.recvmsg_into([view], _ANC, _FLAGS | _DONTWAIT)
            return n, anc, flags
        except BlockingIOError:
            pass
        except OSError as e:
            raise Closed(str(e)) from None
        left = end - time.monotonic()
        if left <= 0:
            raise TimedOut("no reply within the bound")
        p = select.poll()
        p.register(sock, select.POLLIN)
        try:
            p.poll(max(1, int(left * 1000 + 1)))
        except (OSError, ValueError) as e:
            raise Closed(str(e)) from None


EndOf = Callable[[int], "float | None"]


def _read_growing(sock: socket.socket, body: bytearray, size: int, end: EndOf,
                  fds: list[int] | None, charge: Callable[[int], bool] | None = None,
                  tick: float = 0.0) -> int:
    """Read until ``body`` holds ``size`` bytes, growing it only by what arrives; ``end``
    gives each wait's end from the bytes of ``body`` so far. Descriptors arriving are added
    to ``fds``; None: none may arrive (WireError). ``charge(n)`` False: the ``n`` bytes that
    came are not kept and ``n`` is returned (the rest is not read); 0 when whole."""
    scratch = bytearray(min(_GROW, size - len(body)))
    view = memoryview(scratch)
    while len(body) < size:
        n, anc, flags = _recv_into(sock, view[:size - len(body)], end(len(body)), tick)
        got: list[int] = []
        _fds_of(anc, flags, got)
        if got:
            if fds is None:
                close_fds(got)
                raise WireError("descriptors sent with a part of a message after its first")
            fds.extend(got)
        if n == 0:
            raise Closed("end of stream inside a message")
        if charge is not None and not charge(n):
            return n
        body += view[:n]
    return 0


def _fds_of(ancdata: list, flags: int, fds: list[int]) -> None:
    if not ancdata and not flags & _CTRUNC:
        return
    for level, typ, data in ancdata:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[:len(data) - len(data) % a.itemsize])
            fds.extend(a)
    if flags & _CTRUNC:
        close_fds(fds)
        raise WireError("descriptors truncated (more than the bound)")


def recv_message(sock: socket.socket, max_body: int = MAX_BODY, end: float | None = None
                 ) -> tuple[Kind, int, memoryview, list[int]]:
    """(kind, call id, body, descriptors) of the next message.

    Raises Closed at the end of the stream, WireError for a message that breaks the framing
    (the connection cannot continue then) and TimedOut past ``end``; descriptors of a failed
    message are closed.
    """
    fds: list[int] = []
    header = bytearray()
    try:
        _read_growing(sock, header, HEADER_SIZE, lambda _: end, fds)
        kind, call_id, body_len, nfds = unpack_header(header, 0xFFFF_FFFF)
        if body_len > max_body:
            _drain(sock, body_len)
            raise TooLarge(kind, call_id, body_len, max_body)
        body = bytearray()
        _read_growing(sock, body, body_len, lambda _: end, fds)
        if len(fds) != nfds:
            raise WireError(f"header announces {nfds} descriptors, {len(fds)} arrived")
        return kind, call_id, memoryview(body), fds
    except BaseException:
        close_fds(fds)
        raise


class Receiver:
    """Messages of one socket, read a chunk at a time (see the module docstring).

    Only one thread reads at a time (the connection's reading role); ``next`` returns what
    :func:`recv_message` returns, each body a private copy. With a ``pace``, a message
    whose first byte has come must come whole by its bounds (TimedOut, the stream torn);
    with a ``budget``, a body past the chunk is charged to it as it arrives and given back
    when the next message is asked for (OverBudget when it has no room)."""

    CHUNK = 1 << 16

    def __init__(self, sock: socket.socket, chunk: int = CHUNK, pace: Pace | None = None,
                 budget: Budget | None = None, tick: float = 0.0):
        self.sock = sock
        #: Seconds of the socket's SO_RCVTIMEO, set here when given (see _recv_into): reads
        #: with an end then block in the kernel instead of polling first.
        self.tick = tick
        if tick:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                            struct.pack("ll", int(tick), int(tick % 1 * 1e6)))
        self.pace, self.budget = pace, budget
        self.charged = 0  # bytes of the last large body charged to the budget
        self._charge_lock = threading.Lock()
        #: When the message being read began to arrive (None: nothing of it yet), and the
        #: fixed end the caller gave.
        self.first: float | None = None
        self.deadline: float | None = None
        self.buf = bytearray(chunk)
        self.view = memoryview(self.buf)
        self.start = 0  # unread bytes: buf[start:end]
        self.end = 0
        #: (start, end, descriptors) of each read that brought descriptors and whose
        #: message has not been cut out yet, in buffer positions, oldest first.
        self.reads: list[tuple[int, int, list[int]]] = []

        #: A read stopped inside a message (TimedOut): the stream cannot be resumed.
        self.torn = False

    def pending(self) -> bool:
        """Bytes read and not yet returned as a message."""
        return self.end > self.start

    def ready(self, _timeout: float = 0) -> bool:
        """For a look (``Looker.until(rx.ready, end)``, in place of a poll of the socket): whether
        bytes of a message are here, reading what has arrived without waiting. The look's
        one system call then also reads the message, which the ``next`` that follows need
        not read again. The end of the stream or a broken one is True too: ``next`` says
        which."""
        if self.end > self.start:
            return True
        try:
            self._fill(nowait=True)
        except BlockingIOError:
            return False
        except Closed:
            return True  # next() reads the end (or the error) again and raises it
        except WireError:
            self.torn = True  # next() raises it
            return True
        return True

    def next(self, max_body: int = MAX_BODY, end: float | None = None, drop_large: bool = True
             ) -> tuple[Kind, int, memoryview, list[int]]:
        """The next message; raises as :func:`recv_message` does. ``drop_large`` False: a
        body past ``max_body`` is not drained (TooLarge at once; the caller closes)."""
        if self.charged:
            self._uncharge()  # the last body has been handled by now
        self.deadline = end
        self.first = time.monotonic() if self.end > self.start else None
        try:
            return self._next(max_body, end, drop_large)
        except (TooLarge, OverBudget):
            raise  # the connection goes on: later messages keep their descriptors
        except TimedOut:
            self._uncharge()
            if self.pending():
                self.torn = True  # part of a message came, and then nothing
            if self.first is not None and self.pace is not None and \
                    (end is None or time.monotonic() < end):
                raise TimedOut(f"a message began to arrive {time.monotonic() - self.first:.1f}"
                               f" s ago and has not come whole (bounds: {self.pace.partial_s:g}"
                               f" s without a byte, {self.pace.min_rate:g} bytes/s after "
                               f"that)") from None
            raise
        except BaseException:
            self.close()
            raise

    def take(self, expected: bytes, tail: int = 0, end: float | None = None,
             any_call: bool = False) -> tuple[int, bytes] | None:
        """(call id, its last ``tail`` bytes) of the next message when that message is
        ``expected`` (its header included: kind, lengths, no descriptors; the call id too
        unless ``any_call``) followed by ``tail`` bytes, consumed; else None, with nothing
        consumed (``next`` reads it). Why: a repeated execution's messages repeat bytes that
        decoded before (the request, the reply bar its timing), and one comparison of them
        costs less than cutting the message out and decoding it (each step runs with cold
        caches after the driver's work). Waits as ``next`` does, and raises as it does."""
        if self.charged:
            self._uncharge()
        self.deadline = end
        self.first = time.monotonic() if self.end > self.start else None
        need = len(expected) + tail
        if self.torn or need > len(self.buf) or len(expected) < HEADER_SIZE:
            return None
        buf = self.buf
        head = expected[:_CALL_AT] if any_call else expected[:HEADER_SIZE]
        try:
            while self.end - self.start < need:
                s = self.start
                if self.end - s >= HEADER_SIZE and not (
                        buf.startswith(head, s) and (not any_call or buf.startswith(
                            expected[_CALL_END:HEADER_SIZE], s + _CALL_END))):
                    return None  # another message: its length may be less than ``need``
                self._fill()
            s = self.start
            if self.reads or not (buf.startswith(expected[_CALL_END:], s + _CALL_END)
                                  if any_call else buf.startswith(expected, s)) or \
                    (any_call and not buf.startswith(head, s)):
                return None
            self.start = s + need
            return (_CALL_ID.unpack_from(buf, s + _CALL_AT)[0],
                    bytes(self.view[s + len(expected):s + need]))
        except TimedOut:
            if self.pending():
                self.torn = True  # part of a message came, and then nothing
            raise
        except WireError:
            self.torn = True  # what was read is lost with it: next() says the stream broke
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the descriptors of messages not returned; give back the budget."""
        for _, _, fds in self.reads:
            close_fds(fds)
        self.reads = []
        self._uncharge()

    def _end(self, got: int) -> float | None:
        """The end of the next wait: the caller's, and the pace's once the message began."""
        if self.pace is None or self.first is None:
            return self.deadline
        mine = self.pace.end(self.first, got)
        return mine if self.deadline is None else min(mine, self.deadline)

    def _charge(self, n: int) -> bool:
        with self._charge_lock:
            if not self.budget.take(n):  # type: ignore[union-attr]
                return False
            self.charged += n
            return True

    def _uncharge(self) -> None:
        with self._charge_lock:
            n, self.charged = self.charged, 0
        if n:
            self.budget.give(n)  # type: ignore[union-attr]

    def _fill(self, nowait: bool = False) -> None:
        """One read into the free end of the buffer (unread bytes moved to its start first);
        ``nowait``: BlockingIOError when nothing has arrived."""
        if self.start == self.end and not self.reads:
            self.start = self.end = 0  # all read: nothing to move
        elif self.start:
            n = self.end - self.start
            self.buf[:n] = bytes(self.view[self.start:self.end])  # may overlap: copy first
            k = self.start
            self.reads = [(a - k, b - k, f) for a, b, f in self.reads]
            self.start, self.end = 0, n
        if nowait:
            try:
                n, anc, flags, _ = self.sock.recvmsg_into([self.view[self.end:]], _ANC,
                                                          _FLAGS | _DONTWAIT)
            except BlockingIOError:
                raise
            except OSError as e:
                raise Closed(str(e)) from None
        else:
            end = self.deadline if self.pace is None or self.first is None else \
                self._end(self.end - self.start)
            tick = self.tick
            if end is None or (tick and end - time.monotonic() > 2 * tick):
                # _recv_into's blocking read, here: every message's read (two calls less)
                try:
                    n, anc, flags, _ = self.sock.recvmsg_into([self.view[self.end:]], _ANC,
                                                              _FLAGS)
                except BlockingIOError:  # a tick without data: _recv_into goes on waiting
                    n, anc, flags = _recv_into(self.sock, self.view[self.end:], end, tick)
                except OSError as e:
                    raise Closed(str(e)) from None
            else:
                n, anc, flags = _recv_into(self.sock, self.view[self.end:], end, tick)
        if self.first is None:
            self.first = time.monotonic()
        if anc or flags & _CTRUNC:
            got: list[int] = []
            _fds_of(anc, flags, got)
            if n == 0:
                close_fds(got)
            elif got:
                self.reads.append((self.end, self.end + n, got))
        if n == 0:
            raise Closed("end of stream" if self.end == self.start
                         else "end of stream inside a message")
        self.end += n

    def _next(self, max_body: int, end: float | None, drop_large: bool
              ) -> tuple[Kind, int, memoryview, list[int]]:
        if self.torn:
            raise WireError("the stream broke inside a message")
        while self.end - self.start < HEADER_SIZE:
            self._fill()
        s = self.start
        kind, call_id, body_len, nfds = unpack_header(self.buf, 0xFFFF_FFFF, s)
        total = HEADER_SIZE + body_len
        if body_len > max_body:
            if drop_large:
                self._skip(s, total)
            else:
                self.torn = True
            raise TooLarge(kind, call_id, body_len, max_body)
        if total <= len(self.buf):
            while self.end - self.start < total:
                self._fill()  # moves the message to the buffer's start when it must
            s = self.start
            body = bytearray(self.view[s + HEADER_SIZE:s + total])
            self.start = s + total
        else:  # larger than a chunk: what is here, then the rest as it arrives
            body = bytearray(self.view[s + HEADER_SIZE:self.end])
            self.start = self.end
            self.torn = True  # until the whole body is in
            charge = None if self.budget is None else self._charge
            if charge is not None and not charge(len(body)):
                have = len(body)  # what came with the header, and nothing more read
            else:
                dropped = _read_growing(self.sock, body, body_len,
                                        lambda got: self._end(HEADER_SIZE + got), None, charge,
                                        self.tick)
                have = len(body) + dropped if dropped else 0
            if have:
                body.clear()  # held no longer than it was charged
                self._refuse(have, s, total, body_len)
                raise OverBudget(kind, call_id, body_len, self.budget.limit)  # type: ignore
            self.torn = False
        fds = self._take_fds(s, total) if self.reads else []
        if len(fds) != nfds:
            close_fds(fds)
            raise WireError(f"header announces {nfds} descriptors, {len(fds)} arrived")
        return kind, call_id, memoryview(body), fds

    def _refuse(self, have: int, s: int, total: int, body_len: int) -> None:
        """Drop a body the budget has no room for (``have`` bytes of it read): the rest as it
        comes (paced as the message), and its descriptors."""
        self._uncharge()
        _drain(self.sock, body_len - have, lambda got: self._end(HEADER_SIZE + have + got),
               self.tick)
        close_fds(self._take_fds(s, total))
        self.torn = False

    def _take_fds(self, s: int, total: int) -> list[int]:
        """The descriptors of the message at buffer position ``s`` (``total`` bytes): those
        of the read that ended inside it, which must have started no later than it."""
        if not self.reads:
            return []
        a, b, fds = self.reads[0]
        if b > s + total:
            return []  # a later message's
        del self.reads[0]
        if not (a <= s < b):
            close_fds(fds)
            raise WireError("descriptors sent without the first byte of their message")
        return fds

    def _skip(self, s: int, total: int) -> None:
        """Drop a too-large message: what is buffered, the rest from the socket, and its
        descriptors."""
        have = self.end - s
        if total <= have:
            self.start = s + total
        else:
            self.start = self.end
            _drain(self.sock, total - have, tick=self.tick)
        if self.reads and self.reads[0][1] <= s + total:
            close_fds(self.reads.pop(0)[2])


def _drain(sock: socket.socket, n: int, end: EndOf = lambda _: None, tick: float = 0.0
           ) -> None:
    """Read ``n`` bytes and drop them (and any descriptors), each wait ending at ``end`` of
    the bytes dropped so far."""
    view = memoryview(bytearray(min(n, 1 << 16)))
    done = 0
    while done < n:
        got, anc, flags = _recv_into(sock, view[:min(n - done, len(view))], end(done), tick)
        extra: list[int] = []
        _fds_of(anc, flags, extra)
        close_fds(extra)
        if got == 0:
            raise Closed("end of stream inside a message")
        done += got
