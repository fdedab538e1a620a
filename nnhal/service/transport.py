"""Framed messages over a Unix stream socket, descriptors beside them (SCM_RIGHTS).

A sender writes a whole message with one ``sendmsg`` (the descriptors ride on its first byte);
a receiver reads exactly the header with ``recvmsg`` (collecting descriptors), then exactly
the body, so descriptors can never be attributed to the wrong message. Every descriptor
received is closed unless the caller takes it (the :class:`~nnhal.service.wire.Reader`).
"""

from __future__ import annotations

import array
import socket
from collections.abc import Sequence

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


class Closed(Exception):
    """The peer closed the connection (or it broke)."""


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


def recv_message(sock: socket.socket, max_body: int = MAX_BODY
                 ) -> tuple[Kind, int, memoryview, list[int]]:
    """(kind, call id, body, descriptors) of the next message.

    Raises Closed at the end of the stream and WireError for a message that breaks the framing
    (the connection cannot continue then); descriptors of a failed message are closed.
    """
    fds: list[int] = []
    header = bytearray()
    try:
        while len(header) < HEADER_SIZE:
            try:
                data, anc, flags, _ = sock.recvmsg(HEADER_SIZE - len(header), _ANC, _FLAGS)
            except OSError as e:
                raise Closed(str(e)) from None
            _fds_of(anc, flags, fds)
            if not data:
                raise Closed("end of stream")
            header += data
        kind, call_id, body_len, nfds = unpack_header(header, 0xFFFF_FFFF)
        if body_len > max_body:
            _drain(sock, body_len)
            raise TooLarge(kind, call_id, body_len, max_body)
        body = bytearray(body_len)
        view = memoryview(body)
        got = 0
        while got < body_len:
            try:
                n, anc, flags, _ = sock.recvmsg_into([view[got:]], _ANC, _FLAGS)
            except OSError as e:
                raise Closed(str(e)) from None
            _fds_of(anc, flags, fds)
            if n == 0:
                raise Closed("end of stream inside a message")
            got += n
        if len(fds) != nfds:
            raise WireError(f"header announces {nfds} descriptors, {len(fds)} arrived")
        return kind, call_id, view, fds
    except BaseException:
        close_fds(fds)
        raise


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
