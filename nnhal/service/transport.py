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
"""

from __future__ import annotations

import array
import os
import select
import socket
import time
from collections.abc import Callable, Sequence

from nnhal.service.wire import (
    HEADER_SIZE,
    MAX_BODY,
    MAX_FDS,
    Kind,
    WireError,
    close_fds,
    pack_header,
    unpack_header,
)

_ANC = socket.CMSG_SPACE(MAX_FDS * 4)
_FLAGS = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))
_CTRUNC = int(socket.MSG_CTRUNC)
_DONTWAIT = int(socket.MSG_DONTWAIT)


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


def send_message(sock: socket.socket, kind: int, call_id: int, body: bytes | bytearray,
                 fds: Sequence[int] = ()) -> None:
    """One message; raises Closed when the peer is gone."""
    data = pack_header(kind, call_id, len(body), len(fds)) + body
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


def look_until(poll: Callable[[float], list], end: float) -> bool:
    """Whether a message arrived before ``end`` (a ``time.perf_counter`` time), polling the
    socket (``poll``: a registered poll object's method) without sleeping and yielding the
    core between looks: the side that sends may be waiting for it. Both ends of a call use
    it to be awake when the other answers."""
    while not poll(0):
        if time.perf_counter() >= end:
            return False
        os.sched_yield()
    return True


#: The most a body grows by at each read: what is held is what arrived, plus at most this.
_GROW = 1 << 20


def _recv_into(sock: socket.socket, view: memoryview, end: float | None
               ) -> tuple[int, list, int]:
    """One ``recvmsg_into``; with an ``end``, waiting for data at most until then."""
    if end is None:
        try:
            n, anc, flags, _ = sock.recvmsg_into([view], _ANC, _FLAGS)
        except OSError as e:
            raise Closed(str(e)) from None
        return n, anc, flags
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


def _read_growing(sock: socket.socket, body: bytearray, size: int, end: float | None,
                  fds: list[int] | None) -> None:
    """Read until ``body`` holds ``size`` bytes, growing it only by what arrives.
    Descriptors arriving are added to ``fds``; None: none may arrive (WireError)."""
    scratch = bytearray(min(_GROW, size - len(body)))
    view = memoryview(scratch)
    while len(body) < size:
        n, anc, flags = _recv_into(sock, view[:size - len(body)], end)
        got: list[int] = []
        _fds_of(anc, flags, got)
        if got:
            if fds is None:
                close_fds(got)
                raise WireError("descriptors sent with a part of a message after its first")
            fds.extend(got)
        if n == 0:
            raise Closed("end of stream inside a message")
        body += view[:n]


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
        _read_growing(sock, header, HEADER_SIZE, end, fds)
        kind, call_id, body_len, nfds = unpack_header(header, 0xFFFF_FFFF)
        if body_len > max_body:
            _drain(sock, body_len)
            raise TooLarge(kind, call_id, body_len, max_body)
        body = bytearray()
        _read_growing(sock, body, body_len, end, fds)
        if len(fds) != nfds:
            raise WireError(f"header announces {nfds} descriptors, {len(fds)} arrived")
        return kind, call_id, memoryview(body), fds
    except BaseException:
        close_fds(fds)
        raise


class Receiver:
    """Messages of one socket, read a chunk at a time (see the module docstring).

    Only one thread reads at a time (the connection's reading role); ``next`` returns what
    :func:`recv_message` returns, each body a private copy."""

    CHUNK = 1 << 16

    def __init__(self, sock: socket.socket, chunk: int = CHUNK):
        self.sock = sock
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

    def next(self, max_body: int = MAX_BODY, end: float | None = None, drop_large: bool = True
             ) -> tuple[Kind, int, memoryview, list[int]]:
        """The next message; raises as :func:`recv_message` does. ``drop_large`` False: a
        body past ``max_body`` is not drained (TooLarge at once; the caller closes)."""
        try:
            return self._next(max_body, end, drop_large)
        except TooLarge:
            raise  # the connection goes on: later messages keep their descriptors
        except TimedOut:
            if self.pending():
                self.torn = True  # part of a message came, and then nothing
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the descriptors of messages not returned."""
        for _, _, fds in self.reads:
            close_fds(fds)
        self.reads = []

    def _fill(self, end: float | None = None) -> None:
        """One read into the free end of the buffer (unread bytes moved to its start first)."""
        if self.start:
            n = self.end - self.start
            self.buf[:n] = bytes(self.view[self.start:self.end])  # may overlap: copy first
            k = self.start
            self.reads = [(a - k, b - k, f) for a, b, f in self.reads]
            self.start, self.end = 0, n
        n, anc, flags = _recv_into(self.sock, self.view[self.end:], end)
        got: list[int] = []
        _fds_of(anc, flags, got)
        if n == 0:
            close_fds(got)
            raise Closed("end of stream" if self.end == self.start
                         else "end of stream inside a message")
        if got:
            self.reads.append((self.end, self.end + n, got))
        self.end += n

    def _next(self, max_body: int, end: float | None, drop_large: bool
              ) -> tuple[Kind, int, memoryview, list[int]]:
        if self.torn:
            raise WireError("the stream broke inside a message")
        while self.end - self.start < HEADER_SIZE:
            self._fill(end)
        s = self.start
        kind, call_id, body_len, nfds = unpack_header(self.view[s:s + HEADER_SIZE],
                                                      0xFFFF_FFFF)
        total = HEADER_SIZE + body_len
        if body_len > max_body:
            if drop_large:
                self._skip(s, total)
            else:
                self.torn = True
            raise TooLarge(kind, call_id, body_len, max_body)
        if total <= len(self.buf):
            while self.end - self.start < total:
                self._fill(end)  # moves the message to the buffer's start when it must
            s = self.start
            body = bytearray(self.view[s + HEADER_SIZE:s + total])
            self.start = s + total
        else:  # larger than a chunk: what is here, then the rest as it arrives
            body = bytearray(self.view[s + HEADER_SIZE:self.end])
            self.start = self.end
            self.torn = True  # until the whole body is in
            _read_growing(self.sock, body, body_len, end, None)
            self.torn = False
        fds = self._take_fds(s, total)
        if len(fds) != nfds:
            close_fds(fds)
            raise WireError(f"header announces {nfds} descriptors, {len(fds)} arrived")
        return kind, call_id, memoryview(body), fds

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
            _drain(self.sock, total - have)
        if self.reads and self.reads[0][1] <= s + total:
            close_fds(self.reads.pop(0)[2])


def _drain(sock: socket.socket, n: int) -> None:
    scratch = bytearray(1 << 16)
    while n > 0:
        try:
            got, anc, flags, _ = sock.recvmsg_into([memoryview(scratch)[:min(n, len(scratch))]],
                                                   _ANC, _FLAGS)
        except OSError as e:
            raise Closed(str(e)) from None
        extra: list[int] = []
        _fds_of(anc, flags, extra)
        close_fds(extra)
        if got == 0:
            raise Closed("end of stream inside a message")
        n -= got
